"""Pre-assigned work units of an audit: what one GPU process of ``fa4verify audit --gpus`` runs.

A *work unit* is ``(check instance, shard s of k)``: an unsharded check is the unit ``(id, 0, 1)``;
a sharded check (``@check(shards=)``) is ``k`` units, ``k`` chosen for the whole node by the
caller (:func:`fa4verify.audit.gpus.plan_units`). :func:`run_units` runs exactly the units it is
given, each with ``ctx.shard = (s, k)`` (``(0, 1)`` for a whole check), the isolated ones over
this process's :class:`~fa4verify.audit.pool.WorkerPool` (longest first, a check's cost split
over its shards, as :func:`fa4verify.audit.runner.run_audit` schedules its work items) and the
others one after another in this process. It does **not** merge: every unit gives one raw
:class:`UnitPart` (result, notes, seconds, timing), handed to ``sink`` the moment it is done (so a
process that dies later leaves its finished parts behind) and returned. The caller merges the parts
of each check with :func:`fa4verify.audit.shards.merge_shards`.

The skip rules are those of ``run_audit``: an unmet need (``unmet_need``) or an arch that is not
selected makes the unit a ``skip`` part with ``skipped=True`` and the reason, without running it.

Possible issues
---------------
* The worker pool of each GPU process has its own run directory, so a drawn fuzz campaign is drawn
  once per GPU process (Note [One draw per audit]), not once per node: deterministic, so every
  process draws the same list, at the cost of one draw (~4 s on the H200) per GPU.
* No reporter: the parent shows the merged records when the GPU processes end.

Nothing here imports numpy, torch or flash_attn.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import threading
import time
from typing import Any, Callable, Sequence

from fa4verify._options import AuditConfig
from fa4verify.audit.execute import execute
from fa4verify.audit.registry import CheckResult, cuda_available, unmet_need
from fa4verify.audit.runner import Selected, _context

__all__ = ["WorkUnit", "UnitPart", "run_units", "is_isolated"]


@dataclasses.dataclass(frozen=True)
class WorkUnit:
    """Shard ``shard`` (0-based) of ``count`` of the check instance ``id``; ``cost``: its share of
    the check's ``@check(cost=)`` (seconds, for the longest-first order)."""
    id: str
    shard: int = 0
    count: int = 1
    cost: float = 1.0

    def label(self) -> str:
        return self.id if self.count == 1 else f"{self.id}[{self.shard + 1}/{self.count}]"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "WorkUnit":
        return cls(id=str(d["id"]), shard=int(d["shard"]), count=int(d["count"]),
                   cost=float(d.get("cost", 1.0)))


@dataclasses.dataclass
class UnitPart:
    """The raw outcome of one :class:`WorkUnit`: the check's result for that shard (not merged),
    its notes, wall ``seconds`` (worker start included when isolated), one ``timing`` entry
    (``start_s``/``end_s`` from ``origin``, ``shard`` when k > 1, the caller's ``tag`` such as
    ``gpu``, and the worker's figures), ``isolated`` (ran in a worker), ``skipped`` (not run: an
    unmet need or an unselected arch, the reason in the result) and ``pid`` of the process that
    ran :func:`run_units`."""
    unit: WorkUnit
    result: CheckResult
    notes: list[str]
    seconds: float
    timing: dict[str, Any]
    isolated: bool = False
    skipped: bool = False
    pid: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"unit": self.unit.to_json(), "result": self.result.to_dict(), "notes": self.notes,
                "seconds": self.seconds, "timing": self.timing, "isolated": self.isolated,
                "skipped": self.skipped, "pid": self.pid}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "UnitPart":
        return cls(unit=WorkUnit.from_json(d["unit"]), result=CheckResult.from_dict(d["result"]),
                   notes=list(d.get("notes") or []), seconds=float(d.get("seconds", 0.0)),
                   timing=dict(d.get("timing") or {}), isolated=bool(d.get("isolated")),
                   skipped=bool(d.get("skipped")), pid=int(d.get("pid", 0)))


def is_isolated(config: AuditConfig, sel: Selected) -> bool:
    """Whether ``run_audit`` runs ``sel`` in a worker process (``--isolate`` and its needs)."""
    return config.isolate == "always" or (config.isolate == "auto" and "cuda" in sel.spec.needs)


def run_units(config: AuditConfig, items: Sequence[tuple[Selected, WorkUnit]], *,
              sink: Callable[[UnitPart], None] | None = None, origin: float | None = None,
              tag: dict[str, Any] | None = None, pool: Any = None) -> list[UnitPart]:
    """Run exactly ``items`` (each a selected instance and its unit) and return their parts in
    ``items`` order (module docstring). ``origin``: the wall-clock time (``time.time()``) the
    timing entries count from (the parent audit's start; default: now). ``tag``: merged into
    every timing entry (``{"gpu": 1}``). ``pool``: a caller's WorkerPool (left open) instead of
    a new one."""
    from fa4verify.audit.pool import WorkerPool

    wall0, perf0 = time.time(), time.perf_counter()
    origin = wall0 if origin is None else float(origin)
    tag = dict(tag or {})
    pid = os.getpid()
    have_cuda = cuda_available() if any("cuda" in s.spec.needs for s, _ in items) else False
    lock = threading.Lock()
    out: list[UnitPart | None] = [None] * len(items)

    def rel(t: float) -> float:
        return round(t - perf0 + wall0 - origin, 3)

    def finish(j: int, result: CheckResult, notes: list[str], t0: float, t1: float,
               isolated: bool, extra: dict | None = None, skipped: bool = False) -> None:
        u = items[j][1]
        timing: dict[str, Any] = {"start_s": rel(t0), "end_s": rel(t1)}
        if u.count > 1:
            timing["shard"] = u.shard
        timing.update(tag)
        timing.update(extra or {})
        part = UnitPart(unit=u, result=result, notes=list(notes), seconds=t1 - t0, timing=timing,
                        isolated=isolated, skipped=skipped, pid=pid)
        with lock:
            out[j] = part
            if sink is not None:
                sink(part)

    def ctx_for(sel: Selected, u: WorkUnit):
        ctx = _context(config, sel)
        if u.count > 1:
            ctx.shard = (u.shard, u.count)
        return ctx

    inproc: list[int] = []
    jobs: list[int] = []
    for j, (sel, u) in enumerate(items):
        reason = unmet_need(sel.spec, config.device, cuda=have_cuda)
        if reason is None and sel.arch not in config.archs:
            reason = f"arch {sel.arch} not selected (--arch {','.join(config.archs)})"
        if reason is not None:
            t = time.perf_counter()
            finish(j, CheckResult(status="skip", summary=reason), [], t, t, False, skipped=True)
        elif is_isolated(config, sel):
            jobs.append(j)
        else:
            inproc.append(j)

    own_pool = pool is None
    executor = None
    futures: list[concurrent.futures.Future] = []
    try:
        if jobs:
            n = max(1, min(config.workers if own_pool else pool.size, len(jobs)))
            if own_pool:
                pool = WorkerPool.for_audit(config, n)
            executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=n, thread_name_prefix="fa4verify-unit")

            def run_one(j: int) -> None:
                sel, u = items[j]
                t0 = time.perf_counter()
                timing: dict = {}
                try:
                    if hasattr(pool, "run_timed"):
                        result, notes, timing = pool.run_timed(sel.spec, ctx_for(sel, u))
                    else:
                        result, notes = pool.run(sel.spec, ctx_for(sel, u))
                except Exception as e:  # noqa: BLE001 - the pool broke: this unit's error
                    result, notes = CheckResult(status="error", summary=(
                        f"worker pool: {type(e).__name__}: {e}")), []
                finish(j, result, notes, t0, time.perf_counter(), True, timing)

            # the most expensive units first (stable: equal costs keep the given order)
            for j in sorted(jobs, key=lambda j: -items[j][1].cost):
                futures.append(executor.submit(run_one, j))
        for j in inproc:
            sel, u = items[j]
            t0 = time.perf_counter()
            ctx = ctx_for(sel, u)
            result = execute(sel.spec, ctx)
            finish(j, result, list(ctx._notes), t0, time.perf_counter(), False)
        for f in concurrent.futures.as_completed(futures):
            f.result()
    finally:
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
        if pool is not None and own_pool:
            pool.close()
    return [p for p in out if p is not None]
