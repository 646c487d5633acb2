"""The engine: plan the checks' cases into tasks, run them (here or in the pool), merge.

Note [One engine]: a check is whole (``func(ctx) -> CheckResult``) or a map / reduce over its
cases (``@check(cases=, summarise=)``: :mod:`fa4verify.audit.registry`). :func:`run_jobs` runs
the audit's checks (``--gpus``: workers pinned one per GPU), :func:`run_calls` the processes of
``fa4verify determinism`` and the source mutants:

1. **plans**: ``cases(ctx)`` runs here, once (a fuzz campaign's draw included), the isolated
   checks' at once in planning threads, costliest first, each queued as soon as its plan is
   there (Note [Plans in parallel]: one slow plan held back every worker); the cases are
   grouped by the FA4 compile key the subject owns (:func:`fa4verify.kernels.adapter.compile_key`),
   one task per group, so one worker compiles a kernel for every case that needs it; tasks are
   queued longest first (the check's ``cost`` split over its groups by their cases' weights --
   :func:`case_weight`, 1 unless a case says more -- a compile weighed as one case), equal costs
   in selection order (:func:`plan`);
2. **runs**: isolated tasks in the :class:`~fa4verify.run.pool.WorkerPool` (whole checks before
   any plan; past its :func:`task_deadline` a task is killed with its worker), the others here;
3. **merges** each check once its tasks are back (:func:`merge`): ``summarise(ctx, [(case,
   value), ...])`` in case order, so the verdict is that of one loop over the cases whatever the
   grouping and the workers. A case that errors, crashes or hangs makes the check ``error``
   naming the case (``fail`` when the finished cases already prove a violation), never ``pass``;
   skipped cases beside others make a ``pass`` ``undecided``; every case skipped is a skip.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import queue as queue_
import threading
import time
import traceback
from typing import Any, Callable, NamedTuple, Sequence

from fa4verify.audit.registry import CheckContext, CheckResult, CheckSpec, SkipCheck
from fa4verify.run.worker import run_task
from fa4verify.coverage.source import tracing

__all__ = ["Job", "Task", "plan", "merge", "run_jobs", "run_here", "run_calls", "CallOutcome", "task_deadline",
           "case_key", "case_weight", "describe_case", "MIN_DEADLINE_S", "DEADLINE_FACTOR"]

#: Note [Default deadline]: on a GPU an isolated task gets max(MIN_DEADLINE_S, DEADLINE_FACTOR x
#: the check's ``cost``) seconds (``--timeout`` overrides, 0 = none): a hung kernel becomes that
#: check's error instead of an audit without a report. The cost is the check's measured warm
#: seconds on the H200; a task is at most the whole check, and a cold start (compiles, the
#: worker's start-up) stays well inside the floor (a cold default audit: ~60 s in all).
MIN_DEADLINE_S = 300.0
DEADLINE_FACTOR = 5.0


def task_deadline(timeout: float | None, device: str, cost: float) -> float:
    """Seconds a task of a check of ``cost`` may run (0: no limit): Note [Default deadline]."""
    if timeout is not None:
        return float(timeout)
    return max(MIN_DEADLINE_S, DEADLINE_FACTOR * float(cost)) if device == "cuda" else 0.0


def case_key(case: Any) -> Any:
    """The FA4 compile key of a case (an AttentionProblem, or a case with a ``problem``) or None."""
    p = getattr(case, "problem", case)
    if not hasattr(p, "features") or not hasattr(p, "window_size"):
        return None
    from fa4verify.kernels.adapter import compile_key
    return compile_key(p)


def case_weight(case: Any) -> float:
    """A case's share of its check's work, in units of a plain case (its ``queue_weight``, else 1): a
    planned varlen row of 257 sequences costs several plain rows (more kernels, a judge per
    sequence), and queued as one it started last and set the audit's wall (measured on the H200:
    16 s from 83 s of a cold audit)."""
    return max(float(getattr(case, "queue_weight", 1.0)), 0.0)


def describe_case(case: Any) -> str:
    d = getattr(case, "describe", None)
    text = d() if callable(d) else repr(case)
    return text if len(text) <= 200 else text[:197] + "..."


@dataclasses.dataclass
class Job:
    """One check to run, ``isolated`` (in a worker) or here; ``cases``: None for a whole check."""
    spec: CheckSpec
    ctx: CheckContext
    isolated: bool = False
    cases: list | None = None
    #: filled while it runs: index -> (kind, value) (:func:`fa4verify.run.worker.run_task`)
    outcomes: dict = dataclasses.field(default_factory=dict)
    notes: list = dataclasses.field(default_factory=list)
    timing: list = dataclasses.field(default_factory=list)
    pending: int = 0
    t0: float | None = None
    t1: float | None = None


class Task(NamedTuple):
    """Cases ``cases`` (None: the whole check) of job ``job``; ``cost``: its share of the check's."""
    job: int
    cases: tuple[int, ...] | None
    cost: float


def plan(jobs: Sequence[Job], only: Sequence[int] | None = None) -> list[Task]:
    """The tasks of ``jobs`` (those numbered ``only``), longest first: Note [One engine], step 1."""
    tasks: list[Task] = []
    for i in (range(len(jobs)) if only is None else only):
        job = jobs[i]
        if job.cases is None:
            tasks.append(Task(i, None, float(job.spec.cost)))
            continue
        groups: dict[Any, list[int]] = {}
        for j, c in enumerate(job.cases):
            k = case_key(c)
            groups.setdefault(("case", j) if k is None else ("key", k), []).append(j)
        work = {k: sum(case_weight(job.cases[j]) for j in g) + 1 for k, g in groups.items()}
        weight = sum(work.values()) or 1
        for k, g in groups.items():
            tasks.append(Task(i, tuple(g), float(job.spec.cost) * work[k] / weight))
    return sorted(tasks, key=lambda t: -t.cost)


def _error(v: Any) -> tuple[str, dict]:
    """An error outcome's text and details: a worker's (summary, traceback), or a plain reason."""
    return (v[0], {"traceback": v[1]}) if isinstance(v, tuple) else (str(v), {})


def _stopped(e: Exception, step: str) -> CheckResult:
    """The result of a check whose ``step`` (its plan, its summary) raised ``e``."""
    if isinstance(e, SkipCheck):
        return CheckResult(status="skip", summary=str(e) or "skipped by the check")
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return CheckResult(status="error", summary=f"{step}: {type(e).__name__}: {e}"[:500],
                       details={"traceback": tb[-6000:]})


def merge(job: Job) -> CheckResult:
    """ONE result of a job whose tasks are back (Note [One engine], step 3)."""
    if job.cases is None:
        kind, v = job.outcomes.get(0, ("error", "the check never ran"))
        if kind == "result":
            return v
        text, details = _error(v)
        return CheckResult(status="error", summary=text[:500], details=details)
    n = len(job.cases)
    got = [job.outcomes.get(j, ("error", "never ran (the audit was interrupted)")) for j in range(n)]
    ok = [(job.cases[j], v) for j, (k, v) in enumerate(got) if k == "value"]
    skips = [(j, v) for j, (k, v) in enumerate(got) if k == "skip"]
    bad = [(j, v) for j, (k, v) in enumerate(got) if k == "error"]
    if n and len(skips) == n:
        return CheckResult(status="skip", summary=skips[0][1])
    try:
        out = job.spec.summarise(job.ctx, ok) if (ok or not n) else None
        if out is not None and not isinstance(out, CheckResult):
            raise TypeError(f"summarise returned {type(out).__name__}, not CheckResult")
    except Exception as e:  # noqa: BLE001 - a broken summary is the check's error, never a pass
        out = _stopped(e, "summarise")
        if out.status == "error" and not bad:
            return out
    if bad:
        bad.sort(key=lambda jv: _error(jv[1])[0].startswith("lost with its worker"))
        j, (text, details) = bad[0][0], _error(bad[0][1])
        first = f"case {j + 1}/{n} ({describe_case(job.cases[j])}): {text}"
        if out is not None and out.status == "fail":     # a proven violation stands
            out.summary = f"{out.summary} (check incomplete: {len(bad)}/{n} case(s) did not finish: {first})"[:2000]
            return out
        return CheckResult(status="error", summary=f"{len(bad)}/{n} case(s) did not finish: {first}"[:2000],
                           where=out.where if out is not None else "", details=details)
    assert out is not None
    if skips and out.status == "pass":
        out.status = "undecided"
        out.summary = f"{len(skips)}/{n} case(s) skipped: {skips[0][1]}; {out.summary}"
    return out


def run_jobs(jobs: Sequence[Job], *, pool: Any = None, new_pool: Callable[[int], Any] | None = None,
             deadline: Callable[[Job], float] = lambda job: 0.0,
             on_done: Callable[[int, CheckResult], None] | None = None,
             progress: Callable[[Job], Any] | None = None, origin: float | None = None,
             phases: dict | None = None) -> list[CheckResult]:
    """One result per job, in order (Note [One engine]). ``pool``: a caller's (left open), else
    ``new_pool(n)`` makes one (closed here); ``on_done(i, result)``: in this thread as each job
    finishes; ``progress(job)``: a progress-bar factory for a job run here; ``origin``: the
    ``time.perf_counter()`` the timing entries count from."""
    origin, phases = (time.perf_counter() if origin is None else origin), ({} if phases is None else phases)
    results: dict[int, CheckResult] = {}
    lock, finished = threading.Lock(), []

    def finish(i: int, res: CheckResult | None = None) -> None:
        tm = time.perf_counter()
        res = merge(jobs[i]) if res is None else res
        phases["merge"] = phases.get("merge", 0.0) + time.perf_counter() - tm
        results[i] = res
        if on_done is not None:
            on_done(i, res)

    def drain() -> None:
        with lock:
            done, finished[:] = list(finished), []
        for i in done:
            finish(i)

    def draw(i: int) -> tuple[list | None, Exception | None, float]:
        """Job ``i``'s cases (thread-safe: only the check's own ``cases``), its exception, seconds."""
        tp = time.perf_counter()
        try:
            return list(jobs[i].spec.cases(jobs[i].ctx)), None, time.perf_counter() - tp
        except Exception as e:  # noqa: BLE001 - a skip, or the check's error
            return None, e, time.perf_counter() - tp

    def prepare(i: int, drawn: tuple | None = None) -> bool:
        """Step 1 for job ``i``, here, once (``drawn``: :func:`draw`'s result, when it ran in a
        planning thread): its cases; False when that ended it."""
        job = jobs[i]
        if job.spec.cases is None:
            return True
        cases, exc, dt = drawn if drawn is not None else draw(i)
        job.cases, res = (cases, None) if exc is None else ([], _stopped(exc, "cases"))
        phases["prepare"] = phases.get("prepare", 0.0) + dt    # the planning time, in the report
        if dt >= 0.5:
            phases[f"prepare {job.spec.id}"] = dt
        if job.cases:
            return True
        finish(i, res)                      # no case: the summary of nothing
        return False

    # the isolated jobs first (their whole checks before any draw or plan), the others here meanwhile
    iso = [i for i, job in enumerate(jobs) if job.isolated]
    stages = [[i for i in iso if jobs[i].spec.cases is None], [i for i in iso if jobs[i].spec.cases]]

    def record(t: Task, outcomes: list, notes: list, t0: float, t1: float, timing: dict) -> None:
        job = jobs[t.job]
        with lock:
            job.outcomes.update((j, (kind, v)) for j, kind, v in outcomes)
            job.notes.extend(n for n in notes if n not in job.notes)
            job.timing.append(dict({"start_s": round(t0 - origin, 3), "end_s": round(t1 - origin, 3),
                                    "cases": None if t.cases is None else len(t.cases)}, **timing))
            job.t0 = t0 if job.t0 is None else min(job.t0, t0)
            job.t1 = t1 if job.t1 is None else max(job.t1, t1)
            job.pending -= 1
            if job.pending == 0:
                finished.append(t.job)

    def cases_of(t: Task) -> list | None:
        return None if t.cases is None else [(j, jobs[t.job].cases[j]) for j in t.cases]

    def run_remote(t: Task) -> None:
        from fa4verify.run.pool import PoolClosed, TaskDied
        job, idx, t0 = jobs[t.job], [0] if t.cases is None else list(t.cases), time.perf_counter()
        try:
            payload, timing = pool.run(job.spec, job.ctx, cases_of(t), timeout=deadline(job))
            outcomes, notes = payload["outcomes"], payload.get("notes", [])
        except TaskDied as d:
            timing, notes = {"worker_exit": d.rc}, []
            running = d.case if d.case in idx else idx[0]
            # the case it was running gets the reason; the others of its task went with the worker
            outcomes = [(j, "error", (d.reason if j == running else f"lost with its worker ({d.reason})",
                                      d.tail[-4000:])) for j in idx]
        except Exception as e:  # noqa: BLE001 - the pool was closed, or broke: this task's error
            why = str(e) if isinstance(e, PoolClosed) else f"worker pool: {type(e).__name__}: {e}"
            timing, notes, outcomes = {}, [], [(j, "error", why) for j in idx]
        record(t, outcomes, notes, t0, time.perf_counter(), timing)

    own, executor, futures, todo = pool is None, None, [], []
    try:
        if iso:
            if own:        # a worker per whole check; a check of cases may use them all
                pool = new_pool(len(stages[0]) + 64 * len(stages[1]))
            executor = concurrent.futures.ThreadPoolExecutor(max_workers=pool.size,
                                                             thread_name_prefix="fa4verify-task")
        def queue(remote: list[Task]) -> None:
            for t in remote:
                jobs[t.job].pending += 1
            futures.extend(executor.submit(run_remote, t) for t in remote)

        queue(plan(jobs, [i for i in stages[0] if prepare(i)]))
        # Note [Plans in parallel]: the isolated jobs' plans are drawn at once in planning threads
        # (a campaign's draw is a fresh process, a covering plan is seconds of Python), costliest
        # first, each job's tasks queued as soon as its plan is there; the plans alone decide the
        # verdicts. A local job's plan is drawn at its turn, as its check may count time from it.
        ahead = sorted(stages[1], key=lambda i: -float(jobs[i].spec.cost))
        drawn: queue_.Queue = queue_.Queue()
        todo = list(ahead)

        def planning() -> None:          # daemon threads: an interrupted audit does not wait for them
            while True:
                with lock:
                    if not todo:
                        return
                    i = todo.pop(0)
                try:
                    got = draw(i)
                except BaseException as e:  # noqa: BLE001 - e.g. a SystemExit in a plan: its error
                    got = (None, RuntimeError(f"{type(e).__name__}: {e}"), 0.0)
                drawn.put((i, got))

        for n in range(min(4, len(ahead))):
            threading.Thread(target=planning, name=f"fa4verify-plan-{n}", daemon=True).start()
        for _ in ahead:
            i, got = drawn.get()
            if isinstance(got[1], ImportError):
                # two planning threads importing one module for the first time can see it half
                # initialised (a circular import across threads): drawn again here, alone
                got = draw(i)
            if prepare(i, got):
                queue(plan(jobs, [i]))
        phases["planned_at"] = time.perf_counter() - origin     # every isolated task queued
        for i, job in enumerate(jobs):      # step 2, here: in selection order
            if job.isolated:
                continue
            if progress is not None:
                job.ctx._progress_factory = progress(job)
            local = sorted(plan(jobs, [i]), key=lambda t: t.cases or ()) if prepare(i) else []
            job.pending = len(local)
            for t in local:
                cases, t0 = cases_of(t), time.perf_counter()
                if cases is None:
                    with tracing(job.spec.id):             # Note [Source coverage]
                        outcomes = run_task(job.spec, job.ctx, None)
                else:
                    with job.ctx.progress(len(cases), job.spec.title) as bar, tracing(job.spec.id):
                        outcomes = run_task(job.spec, job.ctx, cases)
                        bar.advance(len(cases))
                record(t, outcomes, list(job.ctx._notes), t0, time.perf_counter(), {})
            drain()
        for f in concurrent.futures.as_completed(futures):
            f.result()
            drain()
    finally:
        with lock:                      # interrupted: no plan is started after this
            todo.clear()
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
        if own and pool is not None:
            tc = time.perf_counter()
            pool.close()
            phases["pool_close"] = time.perf_counter() - tc
    for i in set(range(len(jobs))) - set(results):      # interrupted: what never came back
        finish(i)
    return [results[i] for i in range(len(jobs))]


def run_here(spec: CheckSpec, ctx: CheckContext) -> CheckResult:
    """One check run here, its cases one after another: the pool's verdict (Note [One engine])."""
    return run_jobs([Job(spec=spec, ctx=ctx)])[0]


@dataclasses.dataclass
class CallOutcome:
    """A :func:`run_calls` payload's ``value`` when ``ok``, else ``error`` (one line) and ``rc``."""
    index: int
    ok: bool
    value: Any = None
    error: str | None = None
    rc: int | None = None


def run_calls(target: str, payloads: Sequence[Any], *, envs: Sequence[dict | None],
              timeout_s: float | None = None, parallel: bool | int = True) -> list[CallOutcome]:
    """``function(payload)`` of ``target`` ("module:function") for every payload, each in a fresh
    worker of the engine's pool, all at once when ``parallel`` (an int: at most that many at
    once); ``envs[i]``: the variables of call i's process (None values unset: e.g. its GPU, or no
    kernel cache). Never raises for a call's failure: it is in that call's :class:`CallOutcome`."""
    from fa4verify.run.pool import TaskDied, WorkerPool

    def one(i: int) -> CallOutcome:
        try:
            v = pool.call(target, payloads[i], env=dict(envs[i] or {}), timeout=timeout_s or 0)
            return CallOutcome(i, True, v)
        except TaskDied as d:
            return CallOutcome(i, False, error=d.reason, rc=d.rc)
        except RuntimeError as e:          # the call raised (its summary first), or the pool was closed
            return CallOutcome(i, False, error=f"raised {str(e).strip().splitlines()[0][:300]}", rc=1)

    n = min(len(payloads), len(payloads) if parallel is True else max(1, int(parallel)))
    with WorkerPool(max(1, len(payloads)), fresh=True) as pool:
        if n > 1:
            with concurrent.futures.ThreadPoolExecutor(n) as ex:
                return list(ex.map(one, range(len(payloads))))
        return [one(i) for i in range(len(payloads))]
