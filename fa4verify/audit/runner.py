"""Select and run audit checks: profile, ``-k`` expression, shard, needs, worker isolation.

:func:`run_audit` is what ``fa4verify audit`` and the pytest plugin call. Checks that need
"cuda" (or all, with ``isolate="always"``) run in worker subprocesses of a
:class:`~fa4verify.audit.pool.WorkerPool`: ``config.workers`` persistent workers side by side,
the most expensive checks first (``@check(cost=...)``), while the other checks run one after
another in this process. A shardable check (``@check(shards=)``) becomes several work items,
scheduled like checks (the costliest first, a check's cost split over its shards), and its
shards' results are merged into one record (:mod:`fa4verify.audit.shards`). A fault that kills a worker (CUDA illegal address, abort) becomes that
check's ``error`` result, the worker is replaced and the audit goes on. Reports list the checks
in selection order whatever order they finished in.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import re
import sys
import time
from typing import Any, Callable, Iterable, Protocol, Sequence

from fa4verify._options import AuditConfig
from fa4verify.audit.execute import execute
from fa4verify.audit.registry import (CheckContext, CheckResult, CheckSpec, cuda_available,
                                      discover, unmet_need)

__all__ = ["CheckRecord", "Selected", "AuditRun", "select", "run_audit", "execute",
           "KeywordError", "compile_keyword", "exit_code_for"]


class KeywordError(ValueError):
    """A malformed ``-k`` expression."""


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
    #: one entry per work item (a shard, or the whole check): ``start_s``/``end_s`` from the
    #: audit's start and, for isolated items, the worker's figures (``exec_s``, FA4 kernel
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
                        deployment=config.deployment_dict)


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


def run_audit(config: AuditConfig, *, specs: Sequence[CheckSpec] | None = None,
              reporter: Reporter | None = None,
              selected: Sequence[Selected] | None = None, pool: Any = None) -> AuditRun:
    """Discover (unless ``specs``/``selected`` are given), select and run the checks.

    ``pool``: a :class:`~fa4verify.audit.pool.WorkerPool` owned by the caller, used for the
    isolated checks instead of a new one and left open (the pytest plugin passes one per pytest
    process, so consecutive items share a worker, its imports and FA4's in-memory kernels)."""
    from fa4verify.audit.pool import WorkerPool

    started = time.time()
    t_audit = time.perf_counter()
    phases: dict[str, float] = {"merge": 0.0}
    specs, selected = start_selection(config, specs, selected, reporter)
    phases["select"] = time.perf_counter() - t_audit
    have_cuda = cuda_available() if any("cuda" in s.spec.needs for s in selected) else False

    def record(sel: Selected, result: CheckResult, t0: float, isolated: bool,
               notes: list[str]) -> CheckRecord:
        return CheckRecord(id=sel.id, check_id=sel.spec.id, title=sel.spec.title,
                           module=module_label(sel.spec.module), arch=sel.arch,
                           needs=sorted(sel.spec.needs), result=result,
                           duration_s=time.perf_counter() - t0, isolated=isolated, notes=notes)

    def report(rec: CheckRecord, sel: Selected, announce: bool) -> None:
        if reporter is not None:
            if announce:
                reporter.check_started(sel)
            reporter.check_finished(rec)

    records: dict[int, CheckRecord] = {}
    skipped: dict[int, str] = {}
    isolated: list[int] = []
    for i, sel in enumerate(selected):
        reason = unmet_need(sel.spec, config.device, cuda=have_cuda)
        if reason is None and sel.arch not in config.archs:
            reason = f"arch {sel.arch} not selected (--arch {','.join(config.archs)})"
        if reason is not None:
            skipped[i] = reason
        elif config.isolate == "always" or (config.isolate == "auto" and "cuda" in sel.spec.needs):
            isolated.append(i)

    from fa4verify.audit.shards import merge_shards, shard_count

    def n_shards(i: int) -> int:
        sel = selected[i]
        try:
            return shard_count(sel.spec, config.profile, config.workers if i in isolated_set else 1,
                               config.check_shards)
        except ValueError:
            return 1
    isolated_set = set(isolated)
    shards = {i: n_shards(i) for i in range(len(selected)) if i not in skipped}
    # shard results per sharded check: parts[i][s] = (result, notes, seconds, t_start, t_end, timing)
    parts: dict[int, list] = {i: [None] * k for i, k in shards.items() if k > 1}

    def item_timing(t0: float, t1: float, extra: dict | None = None, shard: int | None = None
                    ) -> dict[str, Any]:
        d: dict[str, Any] = {"start_s": round(t0 - t_audit, 3), "end_s": round(t1 - t_audit, 3)}
        if shard is not None:
            d["shard"] = shard
        d.update(extra or {})
        return d

    def shard_ctx(sel: Selected, s: int, k: int) -> CheckContext:
        ctx = _context(config, sel)
        if k > 1:
            ctx.shard = (s, k)
        return ctx

    def merged(i: int) -> CheckRecord:
        sel = selected[i]
        got = parts[i]
        ctx = _context(config, sel)
        res = merge_shards(sel.spec, ctx, [g[0] if g else None for g in got],
                           [g[2] if g else None for g in got])
        notes = [n for g in got if g for n in g[1]]
        t0 = min((g[3] for g in got if g), default=time.perf_counter())
        t1 = max((g[4] for g in got if g), default=t0)
        rec = record(sel, res, t0, i in isolated_set, list(dict.fromkeys(notes)))
        rec.duration_s = t1 - t0
        rec.timing = [g[5] for g in got if g and len(g) > 5]
        return rec

    own_pool = pool is None
    executor = None
    futures: dict[concurrent.futures.Future, tuple[int, int]] = {}
    if isolated:
        jobs = [(i, s) for i in isolated for s in range(shards[i])]
        n = max(1, min(config.workers if own_pool else pool.size, len(jobs)))
        if own_pool:
            pool = WorkerPool.for_audit(config, n)
        executor = concurrent.futures.ThreadPoolExecutor(max_workers=n,
                                                         thread_name_prefix="fa4verify-worker")

        def run_one(i: int, s: int):
            sel = selected[i]
            k = shards[i]
            t0 = time.perf_counter()
            timing: dict = {}
            try:
                if hasattr(pool, "run_timed"):
                    result, notes, timing = pool.run_timed(sel.spec, shard_ctx(sel, s, k))
                else:
                    result, notes = pool.run(sel.spec, shard_ctx(sel, s, k))
            except Exception as e:  # noqa: BLE001 - the pool itself broke: this item's error
                result, notes = CheckResult(status="error", summary=f"worker pool: {type(e).__name__}: {e}"), []
            t1 = time.perf_counter()
            if k == 1:
                rec = record(sel, result, t0, True, notes)
                rec.timing = [item_timing(t0, t1, timing)]
                return rec
            return (result, notes, t1 - t0, t0, t1, item_timing(t0, t1, timing, shard=s))

        # the most expensive work items first (a check's cost split over its shards; stable:
        # equal costs keep the selection order, then the shard order)
        for i, s in sorted(jobs, key=lambda js: -selected[js[0]].spec.cost / shards[js[0]]):
            futures[executor.submit(run_one, i, s)] = (i, s)

    def drain(block: bool) -> None:
        done = [f for f in futures if f.done()] if not block else \
            list(concurrent.futures.as_completed(list(futures)))
        for f in done:
            i, s = futures.pop(f)
            if shards[i] == 1:
                records[i] = f.result()
                report(records[i], selected[i], True)
                continue
            parts[i][s] = f.result()
            if all(g is not None for g in parts[i]):
                tm = time.perf_counter()
                records[i] = merged(i)
                phases["merge"] += time.perf_counter() - tm
                report(records[i], selected[i], True)

    try:
        for i, sel in enumerate(selected):
            if i in skipped:
                records[i] = record(sel, CheckResult(status="skip", summary=skipped[i]),
                                    time.perf_counter(), False, [])
                report(records[i], sel, True)
                continue
            if i in isolated_set:
                continue
            if reporter is not None:
                reporter.check_started(sel)
            k = shards[i]
            for s in range(k):
                t0 = time.perf_counter()
                ctx = shard_ctx(sel, s, k)
                if reporter is not None:
                    ctx._progress_factory = reporter.progress_factory(sel)
                result = execute(sel.spec, ctx)
                t1 = time.perf_counter()
                if k == 1:
                    records[i] = record(sel, result, t0, False, list(ctx._notes))
                    records[i].timing = [item_timing(t0, t1)]
                else:
                    parts[i][s] = (result, list(ctx._notes), t1 - t0, t0, t1,
                                   item_timing(t0, t1, shard=s))
            if k > 1:
                records[i] = merged(i)
            report(records[i], sel, False)
            drain(block=False)
        drain(block=True)
    finally:
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
        if pool is not None and own_pool:
            tc = time.perf_counter()
            pool.close()
            phases["pool_close"] = time.perf_counter() - tc
    for i in parts:       # an interrupted audit: a sharded check with missing shards is an error
        if i not in records:
            records[i] = merged(i)
    run = AuditRun(config=config, records=[records[i] for i in range(len(selected))],
                   started=started, finished=time.time(),
                   discovered=len(specs) if specs is not None else len(selected),
                   phases={k: round(v, 3) for k, v in phases.items()})
    if reporter is not None:
        reporter.finish(run)
    return run
