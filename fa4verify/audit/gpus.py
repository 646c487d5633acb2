"""The audit sharded over a node's GPUs: ``fa4verify audit --gpus all|N|I,J``.

The selected check instances (after profile, ``-k`` and arch expansion) are assigned to the GPUs
by :func:`assign`, longest first (``@check(cost=)``,
ties in selection order), each to the GPU with the least assigned cost so far: deterministic, so
a rerun puts every check on the same GPU. One process per GPU is started through
:func:`fa4verify.multigpu.run_per_gpu` (torch.multiprocessing spawn, pinned through
``CUDA_VISIBLE_DEVICES`` before CUDA starts; why that engine: :mod:`fa4verify.multigpu`). Each
process runs :func:`fa4verify.audit.runner.run_audit` on its instances -- the same runner, worker
pool and kernel cache as a one-GPU audit -- and appends each finished record to a JSON-lines file.

The parent merges the records back into selection order: ONE run whose records (and so the JSON /
JUnit / HTML reports and the exit code) are those of the single-GPU audit, each record carrying
the note ``ran on GPU i (<name>, <uuid>)``. A check whose GPU process died before finishing it is
that check's ``error`` ("GPU 1 (...) process died before this check finished: killed by
SIGSEGV"), never a pass and never silently missing. ``environments`` holds one environment per
GPU process.

Possible issues
---------------
* A check split into shards inside the runner (``@check(shards=)``) runs on one GPU, its shards
  over that GPU process's worker pool; spreading one check's shards over GPUs needs ``(check,
  shard)`` units here and the shard merge in the parent (``docs/multigpu.md``).
* Records reach the parent when a GPU process ends, so the terminal shows them all at the end.
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from typing import Any, Mapping, Sequence

from fa4verify._options import AuditConfig
from fa4verify.audit.registry import CheckResult
from fa4verify.audit.runner import AuditRun, CheckRecord, Selected, load_specs, run_audit, select, start_selection
from fa4verify.multigpu import ENV_FAKE_CRASH, Gpu, fake_set, run_per_gpu

__all__ = ["assign", "gpu_child", "run_audit_on_gpus"]


def assign(selected: Sequence[Selected], n: int) -> list[list[int]]:
    """Indices of ``selected`` per GPU (``n`` lists, each in selection order): longest processing
    time first onto the least-loaded GPU (ties: the lower GPU index)."""
    if n < 1:
        raise ValueError(f"{n} GPUs: expected >= 1")
    load = [0.0] * n
    parts: list[list[int]] = [[] for _ in range(n)]
    for i in sorted(range(len(selected)), key=lambda j: (-selected[j].spec.cost, j)):
        g = min(range(n), key=lambda k: (load[k], k))
        load[g] += max(selected[i].spec.cost, 1e-3)
        parts[g].append(i)
    return [sorted(p) for p in parts]


class _FileReporter:
    """Appends each finished record to a JSON-lines file (what a child that dies leaves)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def start(self, selected, config) -> None:
        pass

    def check_started(self, sel) -> None:
        pass

    def progress_factory(self, sel) -> Any:
        return None

    def check_finished(self, rec: CheckRecord) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"record": rec.to_dict()}, default=str) + "\n")
            f.flush()

    def finish(self, run) -> None:
        pass


def gpu_child(payload: Mapping[str, Any]) -> None:
    """Body of one pinned GPU process: re-select (so ``--checks-module`` files load here too),
    run the assigned instances, write records and the environment."""
    from fa4verify.audit import environment

    config: AuditConfig = payload["config"]
    gpu = Gpu.from_json(payload["gpu"])
    specs = load_specs(config)
    mine = set(payload["ids"])
    sel = [s for s in select(specs, config) if s.id in mine]
    got = {s.id for s in sel}
    if got != mine:
        raise RuntimeError(f"{gpu.label()}: checks {sorted(mine - got)[:5]} not selected in this "
                           "process (the check modules differ from the parent's)")
    with open(payload["env_out"], "w") as f:
        json.dump({"environment": environment.collect(config.device), "gpu": gpu.to_json()}, f,
                  default=str)
    crash = gpu.fake and gpu.index in fake_set(ENV_FAKE_CRASH)
    if crash:
        sel = sel[:1]
    run_audit(config, specs=specs, selected=sel, reporter=_FileReporter(payload["out"]))
    if crash:
        os.abort()     # the planted crash (CPU test mode): after the first check


def _read_records(path: str) -> dict[str, dict]:
    out: dict[str, dict] = {}
    try:
        with open(path) as f:
            for line in f:
                try:
                    d = json.loads(line)["record"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue        # a torn last line of a dying process
                out[d["id"]] = d
    except OSError:
        pass
    return out


def run_audit_on_gpus(config: AuditConfig, gpus: Sequence[Gpu], *, specs=None,
                      selected: Sequence[Selected] | None = None, reporter=None,
                      timeout_s: float | None = None) -> tuple[AuditRun, list[dict]]:
    """Run the audit with its instances spread over ``gpus`` (module docstring). Returns the
    merged :class:`AuditRun` (records in selection order) and one environment per GPU process."""
    started = time.time()
    specs, selected = start_selection(config, specs, selected, reporter)
    parts = assign(selected, len(gpus))
    cfg = dataclasses.replace(config, shard=None)
    envs: list[dict] = []
    by_id: dict[str, dict] = {}
    where: dict[str, tuple[Gpu, str | None]] = {}
    with tempfile.TemporaryDirectory(prefix="fa4verify-gpus-") as td:
        active = [(g, p) for g, p in zip(gpus, parts) if p]
        payloads = [{"config": cfg, "gpu": g.to_json(), "ids": [selected[i].id for i in p],
                     "out": os.path.join(td, f"gpu{g.index}.jsonl"),
                     "env_out": os.path.join(td, f"gpu{g.index}.env.json")} for g, p in active]
        outcomes = run_per_gpu("fa4verify.audit.gpus:gpu_child", payloads,
                               [g for g, _ in active], timeout_s=timeout_s) if active else []
        for (g, p), pl, oc in zip(active, payloads, outcomes):
            recs = _read_records(pl["out"])
            by_id.update(recs)
            for i in p:
                where[selected[i].id] = (g, None if oc.ok else oc.error)
            try:
                with open(pl["env_out"]) as f:
                    e = json.load(f)
                envs.append(dict(e["environment"], gpu=e["gpu"]))
            except (OSError, json.JSONDecodeError, KeyError, TypeError):
                envs.append({"gpu": g.to_json(), "error": oc.error or "no environment written"})
    records: list[CheckRecord] = []
    for sel in selected:
        g, err = where[sel.id]
        d = by_id.get(sel.id)
        if d is not None:
            rec = CheckRecord.from_dict(d)
        else:
            why = err or "exited without a result for this check"
            rec = CheckRecord(id=sel.id, check_id=sel.spec.id, title=sel.spec.title,
                              module=sel.spec.module, arch=sel.arch, needs=sorted(sel.spec.needs),
                              result=CheckResult(status="error", summary=(
                                  f"{g.label()} process died before this check finished: {why}")),
                              isolated=True)
        rec.notes.append(f"ran on {g.label()}")
        records.append(rec)
        if reporter is not None:
            reporter.check_started(sel)
            reporter.check_finished(rec)
    run = AuditRun(config=config, records=records, started=started, finished=time.time(),
                   discovered=len(specs))
    if reporter is not None:
        reporter.finish(run)
    return run, envs
