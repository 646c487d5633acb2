"""The audit spread over a node's GPUs: ``fa4verify audit --gpus all|N|I,J``.

Work units
----------
The selected check instances (after profile, ``-k`` and arch expansion) become *work units*
(:func:`plan_units`): an unsharded check is one unit; a sharded check (``@check(shards=)``) is
``k`` units ``(check, shard s of k)``, ``k = shard_count(spec, profile, W x G, --shards)`` for the
whole node, where ``W`` is the workers per GPU process (``--workers``; 1 for a check that runs
in-process) and ``G`` the GPU count. :func:`assign_units` puts the units on the GPUs longest
first (a check's ``@check(cost=)`` split evenly over its shards; ties in selection, then shard,
order), each onto the GPU with the least assigned cost so far (ties: the lower index):
deterministic, so a rerun puts every unit on the same GPU. One process per GPU is started through
:func:`fa4verify.multigpu.run_per_gpu` (torch.multiprocessing spawn, pinned through
``CUDA_VISIBLE_DEVICES`` before CUDA starts; why that engine: :mod:`fa4verify.multigpu`). Each
process runs exactly its units with :func:`fa4verify.audit.units.run_units` -- ``ctx.shard =
(s, k)``, its own worker pool and the shared kernel cache, as in a one-GPU audit -- and appends
each unit's raw part (result, notes, seconds, timing) to a JSON-lines file the moment it is done.

The merge
---------
The parent merges the parts of each check with :func:`fa4verify.audit.shards.merge_shards` (the
check's own ``merge`` over the union of its shards' raw results, so the verdict and metrics are
those of the one-GPU audit) into ONE record per check in selection order; the JSON / JUnit / HTML
reports and the exit code are those of the single-GPU audit. Every shard must arrive exactly once,
from the GPU it was assigned to:

* a GPU process that died (signal, exception, timeout) makes every check with an unfinished unit
  on it ``error`` ("GPU 1 (...) process died before this check finished: killed by SIGABRT"); the
  parts it finished before dying are kept (they were complete: as a worker that dies costs only
  the check it was running);
* a part missing from a process that ended well, a part reported twice or by a GPU it was not
  assigned to: that check's ``error`` naming the GPU(s), never a pass.

Each record notes where it ran (``ran on GPU i (<name>, <uuid>)``; a sharded check spread over
several GPUs gets one note per GPU with its shards); its ``timing`` keeps one entry per unit,
each with ``gpu`` (the GPU index); ``environments`` holds one environment per GPU process.

Possible issues
---------------
* Parts reach the parent when the GPU processes end, so the terminal shows every record at the end.
* A check whose cost estimate is far off still lands deterministically, just not balanced.
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import threading
import time
from typing import Any, Mapping, Sequence

from fa4verify._options import AuditConfig
from fa4verify.audit.registry import CheckResult
from fa4verify.audit.runner import (AuditRun, CheckRecord, Selected, _context, load_specs,
                                    module_label, select, start_selection)
from fa4verify.audit.units import UnitPart, WorkUnit, is_isolated, run_units
from fa4verify.multigpu import ENV_FAKE_CRASH, Gpu, fake_crash_after, fake_set, run_per_gpu

__all__ = ["assign", "plan_units", "assign_units", "merge_parts", "gpu_child", "run_audit_on_gpus"]


def _lpt(costs: Sequence[float], n: int) -> list[list[int]]:
    """Longest processing time first onto the least-loaded of ``n`` bins (ties: the lower bin);
    each bin's indices in increasing order."""
    if n < 1:
        raise ValueError(f"{n} GPUs: expected >= 1")
    load = [0.0] * n
    parts: list[list[int]] = [[] for _ in range(n)]
    for i in sorted(range(len(costs)), key=lambda j: (-costs[j], j)):
        g = min(range(n), key=lambda k: (load[k], k))
        load[g] += max(costs[i], 1e-3)
        parts[g].append(i)
    return [sorted(p) for p in parts]


def assign(selected: Sequence[Selected], n: int) -> list[list[int]]:
    """Indices of ``selected`` per GPU (``n`` lists, each in selection order), whole instances:
    longest processing time first onto the least-loaded GPU (ties: the lower GPU index)."""
    return _lpt([s.spec.cost for s in selected], n)


def plan_units(selected: Sequence[Selected], config: AuditConfig, n_gpus: int) -> list[WorkUnit]:
    """The work units of ``selected`` on a node of ``n_gpus`` GPUs, in selection then shard order
    (module docstring). A shard count the check cannot give (ValueError) is 1, as in run_audit."""
    from fa4verify.audit.shards import shard_count

    out: list[WorkUnit] = []
    for sel in selected:
        per_gpu = config.workers if is_isolated(config, sel) else 1
        try:
            k = shard_count(sel.spec, config.profile, per_gpu * max(1, n_gpus), config.check_shards)
        except ValueError:
            k = 1
        out += [WorkUnit(sel.id, s, k, sel.spec.cost / k) for s in range(k)]
    return out


def assign_units(units: Sequence[WorkUnit], n: int) -> list[list[int]]:
    """Indices of ``units`` per GPU: longest first onto the least-loaded GPU (:func:`_lpt`)."""
    return _lpt([u.cost for u in units], n)


class _PartFile:
    """Appends each finished part to a JSON-lines file (what a child that dies leaves)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()

    def __call__(self, part: UnitPart) -> None:
        line = json.dumps({"part": part.to_dict()}, default=str) + "\n"
        with self._lock, open(self.path, "a") as f:
            f.write(line)
            f.flush()


def gpu_child(payload: Mapping[str, Any]) -> None:
    """Body of one pinned GPU process: re-select (so ``--checks-module`` files load here too),
    run exactly the assigned units, write each part and the environment."""
    from fa4verify.audit import environment
    config: AuditConfig = payload["config"]
    gpu = Gpu.from_json(payload["gpu"])
    units = [WorkUnit.from_json(u) for u in payload["units"]]
    specs = load_specs(config)
    by_id = {s.id: s for s in select(specs, config)}
    lost = sorted({u.id for u in units} - set(by_id))
    if lost:
        raise RuntimeError(f"{gpu.label()}: checks {lost[:5]} not selected in this process "
                           "(the check modules differ from the parent's)")
    with open(payload["env_out"], "w") as f:
        json.dump({"environment": environment.collect(config.device), "gpu": gpu.to_json()}, f,
                  default=str)
    items = [(by_id[u.id], u) for u in units]
    crash = gpu.fake and gpu.index in fake_set(ENV_FAKE_CRASH)
    if crash:
        items = items[:fake_crash_after()]
    run_units(config, items, sink=_PartFile(payload["out"]), origin=payload.get("origin"),
              tag={"gpu": gpu.index})
    if crash:
        os.abort()     # the planted crash (CPU test mode): after the first unit(s)


def _read_parts(path: str) -> list[UnitPart]:
    out: list[UnitPart] = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(UnitPart.from_dict(json.loads(line)["part"]))
                except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                    continue        # a torn last line of a dying process
    except OSError:
        pass
    return out


def _base_record(config: AuditConfig, sel: Selected, result: CheckResult, *,
                 isolated: bool) -> CheckRecord:
    return CheckRecord(id=sel.id, check_id=sel.spec.id, title=sel.spec.title,
                       module=module_label(sel.spec.module), arch=sel.arch,
                       needs=sorted(sel.spec.needs), result=result, isolated=isolated)


def _where_notes(owners: Sequence[Gpu], k: int) -> list[str]:
    """``ran on GPU i (...)``; for shards over several GPUs one note per GPU with its shards."""
    gpus = list(dict.fromkeys(owners))
    if len(gpus) == 1:
        return [f"ran on {gpus[0].label()}"]
    notes = []
    for g in gpus:
        mine = [str(s + 1) for s, o in enumerate(owners) if o == g]
        notes.append(f"ran on {g.label()}: shard{'s' if len(mine) > 1 else ''} "
                     f"{', '.join(mine)} of {k}")
    return notes


def merge_parts(config: AuditConfig, sel: Selected, units: Sequence[WorkUnit],
                owners: Sequence[Gpu], got: Sequence[Sequence[tuple[Gpu, UnitPart]]],
                dead: Mapping[int, str]) -> CheckRecord:
    """ONE record of check ``sel`` from its ``k`` units (shard order), ``owners[s]`` the GPU unit
    ``s`` was assigned to, ``got[s]`` every ``(GPU, part)`` that arrived for it and ``dead`` the
    error of each GPU whose process did not end well (module docstring: "The merge")."""
    from fa4verify.audit.shards import merge_shards

    k = len(units)
    ok: list[UnitPart | None] = [None] * k
    doubled: list[str] = []
    missing: list[str] = []
    for s in range(k):
        owner = owners[s]
        arrived = list(got[s])
        what = "this check" if k == 1 else f"shard {s + 1}/{k}"
        stray = any(g.index != owner.index or p.unit.count != k for g, p in arrived)
        if len(arrived) > 1 or stray:
            names = ", ".join(f"GPU {g.index} (as {p.unit.label()})" for g, p in arrived)
            doubled.append(f"{what} arrived {len(arrived)} time(s), from {names}, but was "
                           f"assigned once, to {owner.label()}: every shard must arrive exactly once")
        elif not arrived:
            if owner.index in dead:
                missing.append(f"{owner.label()} process died before this check finished: "
                               f"{dead[owner.index]} ({what} never arrived)")
            else:
                missing.append(f"{owner.label()} process exited without a result for {what}")
        else:
            ok[s] = arrived[0][1]
    present = [p for p in ok if p is not None]
    isolated = any(p.isolated for p in present)
    problems = doubled + missing
    if problems:
        more = f" (+{len(problems) - 1} more: {'; '.join(problems[1:])})" if len(problems) > 1 else ""
        why = problems[0] + more
        res = CheckResult(status="error", summary=why[:1000])
        if k > 1:
            base = merge_shards(sel.spec, _context(config, sel),
                                [p.result if p is not None else None for p in ok],
                                [p.seconds if p is not None else None for p in ok])
            if base.status == "fail" and not doubled:
                # a proven violation stands (merge_shards' rule): fail, incomplete
                res = dataclasses.replace(base, summary=f"{base.summary.split(' (check incomplete')[0]}"
                                          f" (check incomplete: {why})"[:1000])
            res.details = {**res.details, **base.details}
        rec = _base_record(config, sel, res, isolated=True)
        rec.notes = list(dict.fromkeys(n for p in present for n in p.notes))
    elif all(p.skipped for p in present):
        rec = _base_record(config, sel, present[0].result, isolated=False)   # as run_audit skips
    elif k == 1:
        rec = _base_record(config, sel, present[0].result, isolated=present[0].isolated)
        rec.notes = list(present[0].notes)
    else:
        res = merge_shards(sel.spec, _context(config, sel), [p.result for p in present],
                           [p.seconds for p in present])
        rec = _base_record(config, sel, res, isolated=isolated)
        rec.notes = list(dict.fromkeys(n for p in present for n in p.notes))
    if present:
        t0 = min(p.timing.get("start_s", 0.0) for p in present)
        t1 = max(p.timing.get("end_s", 0.0) for p in present)
        rec.duration_s = max(0.0, t1 - t0) if k > 1 else present[0].seconds
    rec.timing = [p.timing for p in present]
    rec.notes += _where_notes(owners, k)
    return rec


def run_audit_on_gpus(config: AuditConfig, gpus: Sequence[Gpu], *, specs=None,
                      selected: Sequence[Selected] | None = None, reporter=None,
                      timeout_s: float | None = None) -> tuple[AuditRun, list[dict]]:
    """Run the audit with its work units spread over ``gpus`` (module docstring). Returns the
    merged :class:`AuditRun` (one record per check, in selection order) and one environment per
    GPU process."""
    started = time.time()
    specs, selected = start_selection(config, specs, selected, reporter)
    units = plan_units(selected, config, len(gpus))
    parts = assign_units(units, len(gpus))
    owner: dict[tuple[str, int], Gpu] = {}
    for g, p in zip(gpus, parts):
        for j in p:
            owner[(units[j].id, units[j].shard)] = g
    cfg = dataclasses.replace(config, shard=None)
    envs: list[dict] = []
    got: dict[tuple[str, int], list[tuple[Gpu, UnitPart]]] = {}
    dead: dict[int, str] = {}
    with tempfile.TemporaryDirectory(prefix="fa4verify-gpus-") as td:
        active = [(g, p) for g, p in zip(gpus, parts) if p]
        # each GPU runs its units longest first (then in selection / shard order)
        payloads = [{"config": cfg, "gpu": g.to_json(), "origin": started,
                     "units": [units[j].to_json() for j in sorted(p, key=lambda j: (-units[j].cost, j))],
                     "out": os.path.join(td, f"gpu{g.index}.jsonl"),
                     "env_out": os.path.join(td, f"gpu{g.index}.env.json")} for g, p in active]
        outcomes = run_per_gpu("fa4verify.audit.gpus:gpu_child", payloads,
                               [g for g, _ in active], timeout_s=timeout_s) if active else []
        for (g, _), pl, oc in zip(active, payloads, outcomes):
            if not oc.ok:
                dead[g.index] = oc.error or f"exited with status {oc.exitcode}"
            for part in _read_parts(pl["out"]):
                got.setdefault((part.unit.id, part.unit.shard), []).append((g, part))
            try:
                with open(pl["env_out"]) as f:
                    e = json.load(f)
                envs.append(dict(e["environment"], gpu=e["gpu"]))
            except (OSError, json.JSONDecodeError, KeyError, TypeError):
                envs.append({"gpu": g.to_json(), "error": oc.error or "no environment written"})
    by_check: dict[str, list[WorkUnit]] = {}
    for u in units:
        by_check.setdefault(u.id, []).append(u)
    records: list[CheckRecord] = []
    for sel in selected:
        us = by_check[sel.id]
        rec = merge_parts(config, sel, us, [owner[(u.id, u.shard)] for u in us],
                          [got.get((u.id, u.shard), []) for u in us], dead)
        records.append(rec)
        if reporter is not None:
            reporter.check_started(sel)
            reporter.check_finished(rec)
    run = AuditRun(config=config, records=records, started=started, finished=time.time(),
                   discovered=len(specs))
    if reporter is not None:
        reporter.finish(run)
    return run, envs
