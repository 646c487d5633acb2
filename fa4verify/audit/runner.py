"""Select and run audit checks: profile, ``-k`` expression, ``--shard``, needs, isolation.

:func:`run_audit` is what ``fa4verify audit`` and the pytest plugin call: it selects the check
instances and hands them to the engine (:mod:`fa4verify.run`, Note [One engine]). Checks that
need "cuda" (or all, with ``isolate="always"``) run in the engine's worker pool, the others in
this process. A fault that kills a worker (CUDA illegal address, abort) or a task past its
deadline becomes that check's ``error`` result, the worker is replaced and the audit goes on.
Reports list the checks in selection order whatever order they finished in.
"""
from __future__ import annotations

import dataclasses
import os
import re
import sys
import time
from typing import Any, Callable, Iterable, Protocol, Sequence

from fa4verify._options import AuditConfig
from fa4verify.audit.registry import (CheckContext, CheckResult, CheckSpec, cuda_available,
                                      discover, unmet_need)
from fa4verify.errors import KeywordError

__all__ = ["CheckRecord", "Selected", "AuditRun", "select", "run_audit", "is_isolated", "compile_keyword", "exit_code_for"]


# --------------------------------------------------------------------------------- -k expressions
_TOKEN = re.compile(r"\s*(\(|\)|[^\s()]+)")


def compile_keyword(expr: str | None) -> Callable[[str], bool]:
    """A pytest-like ``-k`` matcher over ``"<id> <title>"``: words match as case-insensitive
    substrings (``*`` and ``?`` as wildcards), combined with ``and``, ``or``, ``not`` and
    parentheses.  ``None``/"" selects everything."""
    if not expr or not expr.strip():
        return lambda text: True
    tokens = _TOKEN.findall(expr)
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        tok = tokens[pos]
        pos += 1
        return tok

    def word_matcher(w: str) -> Callable[[str], bool]:
        w = w.lower()
        if "*" in w or "?" in w:
            rx = re.compile(".*".join(re.escape(p) for p in w.split("*")).replace(r"\?", "."))
            return lambda t: rx.search(t.lower()) is not None
        return lambda t: w in t.lower()

    def parse_or() -> Callable[[str], bool]:
        left = parse_and()
        while peek() == "or":
            take()
            right = parse_and()
            left = (lambda a, b: lambda t: a(t) or b(t))(left, right)
        return left

    def parse_and() -> Callable[[str], bool]:
        left = parse_not()
        while peek() == "and":
            take()
            right = parse_not()
            left = (lambda a, b: lambda t: a(t) and b(t))(left, right)
        return left

    def parse_not() -> Callable[[str], bool]:
        if peek() == "not":
            take()
            inner = parse_not()
            return lambda t: not inner(t)
        return parse_atom()

    def parse_atom() -> Callable[[str], bool]:
        tok = peek()
        if tok is None:
            raise KeywordError(f"-k {expr!r}: unexpected end of expression")
        if tok == "(":
            take()
            inner = parse_or()
            if peek() != ")":
                raise KeywordError(f"-k {expr!r}: missing ')'")
            take()
            return inner
        if tok in (")", "and", "or"):
            raise KeywordError(f"-k {expr!r}: unexpected {tok!r}")
        return word_matcher(take())

    matcher = parse_or()
    if pos != len(tokens):
        raise KeywordError(f"-k {expr!r}: unexpected {tokens[pos]!r}")
    return matcher


# --------------------------------------------------------------------------------- records
@dataclasses.dataclass
class CheckRecord:
    """One executed (or skipped) check instance, as reported."""

    id: str                 #: result id ("<check id>" or "<check id>[<arch>]")
    check_id: str           #: the registered id
    title: str
    module: str
    arch: str
    needs: list[str]
    result: CheckResult
    duration_s: float = 0.0  #: wall seconds, including the worker start when isolated
    isolated: bool = False
    notes: list[str] = dataclasses.field(default_factory=list)
    #: one entry per task (a group of cases, or the whole check): ``start_s``/``end_s`` from the
    #: audit's start, ``cases`` and, for isolated tasks, the worker's figures (``exec_s``, FA4 kernel
    #: ``compiles``/``compile_s``, disk-cache ``loads``/``load_s``, a first item's
    #: ``worker_start_s`` and ``worker_wait_s``): what the speed benchmark's timeline reads
    timing: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def status(self) -> str:
        return self.result.status

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in dataclasses.asdict(self).items() if k != "result"}
        d.update(self.result.to_dict())
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CheckRecord":
        return cls(id=d["id"], check_id=d.get("check_id", d["id"]), title=d.get("title", ""),
                   module=d.get("module", ""), arch=d.get("arch", ""),
                   needs=list(d.get("needs", [])), result=CheckResult.from_dict(d),
                   duration_s=float(d.get("duration_s", 0.0)), isolated=bool(d.get("isolated")),
                   notes=list(d.get("notes", [])), timing=list(d.get("timing", [])))


@dataclasses.dataclass(frozen=True)
class Selected:
    spec: CheckSpec
    id: str
    arch: str


@dataclasses.dataclass
class AuditRun:
    config: AuditConfig
    records: list[CheckRecord]
    started: float
    finished: float
    discovered: int          #: check specs discovered (before profile/-k/shard selection)
    #: seconds of the runner's own phases (``select``, ``pool_close``, ``merge``): the speed
    #: benchmark's account of what is not a check
    phases: dict = dataclasses.field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        return self.finished - self.started


def exit_code_for(records: Sequence[CheckRecord], *, regressions: int = 0) -> int:
    """The gate: 1 on any fail (or baseline regression), 3 on any error (a check could not
    complete: exception, crash, import error), 10 on any undecided, 5 when nothing passed or
    failed (all skipped / none selected), else 0."""
    statuses = [r.status for r in records]
    if "fail" in statuses or regressions:
        return 1
    if "error" in statuses:
        return 3
    if "undecided" in statuses:
        return 10
    if "pass" not in statuses:
        return 5
    return 0


# --------------------------------------------------------------------------------- selection
def select(specs: Iterable[CheckSpec], config: AuditConfig) -> list[Selected]:
    """Checks of ``config.profile``, expanded per arch, filtered by ``-k``, then sharded.

    The shard partition is deterministic: the selected instance ids are sorted and instance
    number j (0-based) goes to shard ``j % n + 1``, so shards 1..n of one configuration are
    disjoint and cover every instance."""
    match = compile_keyword(config.keyword)
    out: list[Selected] = []
    for spec in specs:
        if config.profile not in spec.profiles:
            continue
        instances = spec.instances(config.archs)
        if not instances and spec.archs is not None:
            # an arch-specific check none of whose archs is selected: report it as a skip
            instances = [(f"{spec.id}[{a}]", a) for a in sorted(spec.archs)]
        for rid, arch in instances:
            if match(f"{rid} {spec.title} {spec.module}"):
                out.append(Selected(spec, rid, arch))
    if config.shard is not None:
        i, n = config.shard
        order = sorted(range(len(out)), key=lambda j: out[j].id)
        keep = {order[j] for j in range(len(order)) if j % n == i - 1}
        out = [s for j, s in enumerate(out) if j in keep]
    return out


class Reporter(Protocol):  # pragma: no cover - interface
    def start(self, selected: Sequence[Selected], config: AuditConfig) -> None: ...
    def check_started(self, sel: Selected) -> None: ...
    def progress_factory(self, sel: Selected) -> Any: ...
    def check_finished(self, rec: CheckRecord) -> None: ...
    def finish(self, run: AuditRun) -> None: ...


def module_label(module: str) -> str:
    """A check module's dotted name, or the relative path of a --checks-module .py file."""
    if module.startswith("_fa4verify_ext."):
        f = getattr(sys.modules.get(module), "__file__", None)
        if f:
            try:
                return os.path.relpath(f)
            except ValueError:  # pragma: no cover - other drive on Windows
                return f
    return module


def load_specs(config: AuditConfig) -> list[CheckSpec]:
    return discover(modules=config.checks_modules, include_package=not config.no_default_checks)


def _context(config: AuditConfig, sel: Selected) -> CheckContext:
    return CheckContext(dtype=config.dtype, arch=sel.arch, device=config.device,
                        profile=config.profile, seed=config.seed, check_id=sel.id,
                        archs=tuple(config.archs), options=dict(config.opts),
                        deployment=config.deployment_dict, kernel_cache=config.kernel_cache)


def start_selection(config: AuditConfig, specs: Sequence[CheckSpec] | None,
                    selected: Sequence[Selected] | None, reporter: Reporter | None
                    ) -> tuple[Sequence[CheckSpec], Sequence[Selected]]:
    """The specs (discovered unless given) and the selected instances (selected unless given),
    announced to ``reporter``: the start of every audit run, on one GPU or spread over several."""
    if specs is None:
        specs = load_specs(config)
    if selected is None:
        selected = select(specs, config)
    if reporter is not None:
        reporter.start(selected, config)
    return specs, selected


def is_isolated(config: AuditConfig, spec: CheckSpec) -> bool:
    """Whether the audit runs ``spec``'s tasks in worker processes (``--isolate`` and its needs)."""
    return config.isolate == "always" or (config.isolate == "auto" and "cuda" in spec.needs)


def run_audit(config: AuditConfig, *, specs: Sequence[CheckSpec] | None = None,
              reporter: Reporter | None = None,
              selected: Sequence[Selected] | None = None, pool: Any = None,
              gpus: Sequence[str] | None = None) -> AuditRun:
    """Discover (unless ``specs``/``selected`` are given), select and run the checks on the
    engine (:mod:`fa4verify.run`).

    ``pool``: a :class:`~fa4verify.run.pool.WorkerPool` owned by the caller, used for the
    isolated checks instead of a new one and left open (the pytest plugin passes one per pytest
    process, so consecutive items share a worker, its imports and FA4's in-memory kernels).
    ``gpus``: ``CUDA_VISIBLE_DEVICES`` entries to spread a new pool's workers over (``--gpus``)."""
    from fa4verify.compile.production import audit_spec
    from fa4verify.run.engine import Job, run_jobs, task_deadline
    from fa4verify.run.pool import WorkerPool

    started = time.time()
    t_audit = time.perf_counter()
    phases: dict[str, float] = {"merge": 0.0}
    specs, selected = start_selection(config, specs, selected, reporter)
    phases["select"] = time.perf_counter() - t_audit
    have_cuda = cuda_available() if any("cuda" in s.spec.needs for s in selected) else False

    records: dict[int, CheckRecord] = {}
    unreported: list[int] = []            # skipped checks, announced in their selection turn
    jobs: list[Job] = []
    where: list[int] = []                 # job -> selection index
    for i, sel in enumerate(selected):
        reason = unmet_need(sel.spec, config.device, cuda=have_cuda)
        if reason is None and sel.arch not in config.archs:
            reason = f"arch {sel.arch} not selected (--arch {','.join(config.archs)})"
        if reason is not None:
            records[i] = CheckRecord(id=sel.id, check_id=sel.spec.id, title=sel.spec.title,
                                     module=module_label(sel.spec.module), arch=sel.arch,
                                     needs=sorted(sel.spec.needs),
                                     result=CheckResult(status="skip", summary=reason))
            unreported.append(i)
            continue
        # Note [Fake device audit]: on a fake device a "cuda" check is its FA4 calls, compiled
        jobs.append(Job(spec=audit_spec(sel.spec), ctx=_context(config, sel),
                        isolated=is_isolated(config, sel.spec)))
        where.append(i)

    def on_done(k: int, result: CheckResult) -> None:
        i, job, sel = where[k], jobs[k], selected[where[k]]
        t0 = job.t0 if job.t0 is not None else time.perf_counter()
        rec = CheckRecord(id=sel.id, check_id=sel.spec.id, title=sel.spec.title,
                          module=module_label(sel.spec.module), arch=sel.arch,
                          needs=sorted(sel.spec.needs), result=result,
                          duration_s=(job.t1 or t0) - t0, isolated=job.isolated,
                          notes=list(job.notes), timing=sorted(job.timing, key=lambda d: d["start_s"]))
        records[i] = rec
        announce(i)

    def announce(upto: int | None) -> None:
        if reporter is None:
            return
        while unreported and (upto is None or unreported[0] < upto):
            j = unreported.pop(0)
            reporter.check_started(selected[j])
            reporter.check_finished(records[j])
        if upto is not None:
            reporter.check_started(selected[upto])
            reporter.check_finished(records[upto])

    def new_pool(n: int) -> Any:
        return WorkerPool.for_audit(config, min(n, config.workers), gpus=list(gpus) if gpus else None)

    progress = None
    if reporter is not None:
        by_job = {id(job.ctx): selected[where[k]] for k, job in enumerate(jobs)}
        progress = lambda job: reporter.progress_factory(by_job[id(job.ctx)])   # noqa: E731
    run_jobs(jobs, pool=pool, new_pool=new_pool, on_done=on_done, progress=progress, origin=t_audit,
             deadline=lambda job: task_deadline(config.timeout, config.device, job.spec.cost),
             phases=phases)
    announce(None)
    run = AuditRun(config=config, records=[records[i] for i in range(len(selected))],
                   started=started, finished=time.time(),
                   discovered=len(specs) if specs is not None else len(selected),
                   phases={k: round(v, 3) for k, v in phases.items()})
    if reporter is not None:
        reporter.finish(run)
    return run
