"""The determinism matrix on every GPU of a node: one spawned process per GPU (and per
``--processes`` round), each pinned to its GPU, and the comparison across GPUs.

:func:`run_on_gpus` starts ``len(gpus) x processes`` fresh processes, each pinned to its GPU
(``CUDA_VISIBLE_DEVICES`` set before it starts), through the engine
(:func:`fa4verify.run.engine.run_calls`). Each runs :func:`gpu_child`: the whole matrix, ``runs`` times, on
its one GPU (``cuda:0`` after pinning), writing its worker record after every configuration. The
parent relabels each result's device as the GPU's index in the parent's numbering
(``cuda:<i>``, ``fake:<i>`` in the CPU test mode) and records the GPU's name and UUID as the child
saw them, so :func:`fa4verify.determinism.aggregate` compares runs, processes *and* GPUs.

:func:`cross_gpu` then decides the cross-GPU claim, per configuration and overall:

* ``fail``: two GPUs agree within themselves but give different digests; the reason names both
  GPUs (index, name, UUID), the configuration and the tensors;
* ``error``: a GPU process died, timed out, or produced no result for a configuration that the
  others ran (such a configuration is never ``reproducible``: its status becomes ``error``);
* ``not-tested``: one GPU only ("1 GPU: cross-GPU agreement not tested"); the per-GPU
  reproducibility is still judged, the cross-GPU claim is not;
* ``undecided``: nothing could be compared (every configuration unsupported or not run), or a
  configuration was not run on every GPU because ``--time-budget`` ran out (that configuration
  is ``not-run``, never ``reproducible``);
* ``pass``: at least two GPUs, every process on every GPU finished, and every configuration
  that ran gave one digest per tensor across GPUs, processes and runs.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Mapping, Sequence

from fa4verify.determinism.schema import SCHEMA_WORKER
from fa4verify.run.gpus import ENV_FAKE_CRASH, ENV_FAKE_FAULT, Gpu, child_env, fake_set, read_json

__all__ = ["FAULT_MUTATION", "device_label", "gpu_child", "run_on_gpus", "cross_gpu",
           "manifest_extra"]

#: what a planted fake-GPU fault runs: the twin with D from the fp32 O (reproducible, different)
FAULT_MUTATION = "d_from_fp32_o"
_PASSING = ("reproducible", "xpass", "xfail")


def device_label(gpu: Gpu) -> str:
    return f"{'fake' if gpu.fake else 'cuda'}:{gpu.index}"


def _same_gpu(a: str, b: str) -> bool | None:
    """Whether two ``GPU-<uuid>`` strings name the same GPU (case and dashes ignored); None when
    they cannot be compared (a MIG instance, an unknown form)."""
    if not (a.upper().startswith("GPU-") and b.upper().startswith("GPU-")):
        return None
    norm = [x[4:].replace("-", "").lower() for x in (a, b)]
    if not all(len(x) == 32 and all(c in "0123456789abcdef" for c in x) for x in norm):
        return None
    return norm[0] == norm[1]


def _gpu_identity(gpu: Gpu) -> dict[str, Any]:
    """The GPU as this (pinned) child sees it: torch's name and UUID on a real GPU."""
    d = gpu.to_json()
    if gpu.fake:
        return d
    try:
        import torch
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            d["name"] = props.name
            u = str(getattr(props, "uuid", "") or "")
            if u:
                u = u if u.startswith(("GPU-", "MIG-")) else f"GPU-{u}"
                d["torch_uuid"] = u
                if gpu.uuid == "unknown":
                    d["uuid"] = u
                elif _same_gpu(u, gpu.uuid) is False:   # the pinning did not take
                    d["pin_mismatch"] = (f"pinned to {gpu.uuid} (CUDA_VISIBLE_DEVICES="
                                         f"{gpu.visible}) but CUDA device 0 is {u}")
            d["compute_capability"] = f"{props.major}.{props.minor}"
    except Exception as ex:  # noqa: BLE001 - identity is informative; the record says why
        d["identity_error"] = f"{type(ex).__name__}: {ex}"[:200]
    return d


def gpu_child(payload: Mapping[str, Any]) -> None:
    """Body of one pinned process: run the worker spec on this process's GPU and write the worker
    record (plus ``gpu``: index, name, UUID) to ``payload["out"]``."""
    from fa4verify.determinism.workers import run_worker_spec

    gpu = Gpu.from_json(payload["gpu"])
    spec = dict(payload["spec"])
    spec["devices"] = ["cpu"] if gpu.fake else ["cuda:0"]
    if gpu.fake and gpu.index in fake_set(ENV_FAKE_FAULT):
        if not str(spec["backend"]).startswith("twin"):
            raise ValueError(f"{ENV_FAKE_FAULT}: a planted fault needs the twin backend, not "
                             f"{spec['backend']!r}")
        spec["backend"] = f"{spec['backend']}+{FAULT_MUTATION}"
    crash = gpu.fake and gpu.index in fake_set(ENV_FAKE_CRASH)
    if crash:
        spec["configs"] = spec["configs"][:1]
    rec = run_worker_spec(spec, payload["out"])
    rec["gpu"] = _gpu_identity(gpu)
    tmp = payload["out"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(rec, f)
    os.replace(tmp, payload["out"])
    if crash:
        sys.stderr.flush()
        os.abort()          # the planted crash: SIGABRT after the first configuration


def run_on_gpus(spec: Mapping[str, Any], gpus: Sequence[Gpu], processes: int, workdir: str, *,
                timeout_s: float | None = None) -> list[dict]:
    """Run ``spec`` in ``processes`` fresh processes on each GPU (all at once); return one worker
    record per process, with ``gpu``, ``gpu_process``, ``process_index`` and, for a process that
    did not end well, ``fatal`` naming the GPU. Devices in the results are :func:`device_label`."""
    if processes < 1:
        raise ValueError(f"processes {processes} < 1")
    os.makedirs(workdir, exist_ok=True)
    slots = [(g, p) for g in gpus for p in range(processes)]
    payloads = [{"spec": dict(spec), "gpu": g.to_json(),
                 "out": os.path.join(workdir, f"gpu{g.index}-proc{p}.json")} for g, p in slots]
    from fa4verify.run.engine import run_calls
    # as spawn_workers: every process compiles afresh (a shared cache would hide nothing)
    envs = [dict(child_env(g), FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=None) for g, _ in slots]
    outcomes = run_calls("fa4verify.determinism.multi:gpu_child", payloads, envs=envs, timeout_s=timeout_s)
    records = []
    for (g, p), pl, oc in zip(slots, payloads, outcomes):
        rec = read_json(pl["out"]) or {"schema": SCHEMA_WORKER, "results": [], "timing": []}
        rec.setdefault("results", [])
        rec["process_index"] = oc.index
        rec["gpu_process"] = p
        ident = rec.get("gpu") or g.to_json()
        rec["gpu"] = {**ident, "index": g.index}
        lab = device_label(g)
        for x in rec["results"]:
            x["device"] = lab
        if isinstance(rec.get("environment"), dict):
            envs = list(rec["environment"].values())
            rec["environment"] = {lab: dict(envs[0], gpu_uuid=ident.get("uuid", "unknown"))
                                  if envs else {}}
        who = f"{Gpu.from_json(rec['gpu']).label()} process {p}"
        if ident.get("pin_mismatch"):
            rec["fatal"] = f"{who}: {ident['pin_mismatch']}"
            rec["fatal_kind"] = "pin"
            rec["results"] = []      # its results belong to another GPU: not counted
        elif rec.get("fatal"):
            rec["fatal"] = f"{who}: {rec['fatal']}"
        elif not oc.ok:
            rec["fatal"] = f"{who} {oc.error}"
            rec["fatal_kind"] = "died"
        rec["exitcode"] = 0 if oc.ok else oc.rc
        records.append(rec)
    return records


def _combo(x: Mapping[str, Any]) -> str | None:
    """The one digest per tensor of a result, as JSON, or None when its runs disagreed."""
    d = {}
    for t, v in x["det"]["digests"].items():
        if len(v) != 1:
            return None
        d[t] = next(iter(v))
    return json.dumps(d, sort_keys=True)


def cross_gpu(report: dict, records: Sequence[Mapping[str, Any]], gpus: Sequence[Gpu],
              processes: int) -> dict:
    """Decide the cross-GPU claim (module docstring); updates ``report["configs"]`` in place
    (``per_gpu_digests``, ``cross_gpu``; a configuration missing on some GPU becomes ``error``,
    one whose GPUs disagree ``not-reproducible``) and returns the summary ``{"status",
    "evidence": [...], "gpus": [...], "mismatches": [...], "errors": [...]}``."""
    ident = {g.index: g for g in gpus}
    for r in records:
        if r.get("gpu"):
            ident[int(r["gpu"]["index"])] = Gpu.from_json(r["gpu"])
    expected = {(g.index, p) for g in gpus for p in range(processes)}
    by_cfg: dict[str, dict[tuple[int, int], Mapping]] = {}
    for r in records:
        gi, p = int(r["gpu"]["index"]), int(r["gpu_process"])
        for x in r.get("results", []):
            by_cfg.setdefault(x["config"], {})[(gi, p)] = x
    died = [r["fatal"] for r in records if r.get("fatal")]
    mismatches: list[str] = []
    errors: list[str] = list(died)
    not_run: list[str] = []
    compared = 0
    for c in report["configs"]:
        got = by_cfg.get(c["key"], {})
        done = {k for k, x in got.items() if x["status"] in ("ok", "unsupported")}
        skipped = sorted(k for k, x in got.items() if x["status"] == "not-run")
        missing = sorted(expected - done - set(skipped))
        per: dict[int, set] = {}
        for (gi, _p), x in got.items():
            if x["status"] == "ok":
                per.setdefault(gi, set()).add(_combo(x))
        table: dict[str, Any] = {}
        agreed: dict[int, str] = {}
        for gi in sorted(per):
            s = per[gi]
            if len(s) == 1 and None not in s:
                agreed[gi] = next(iter(s))
                table[str(gi)] = json.loads(agreed[gi])
            else:
                table[str(gi)] = "runs or processes on this GPU disagree"
        c["per_gpu_digests"] = table
        status = "not-tested"
        if missing and c["status"] not in ("unsupported",):
            why = "; ".join(f"{ident[gi].label()} process {p}" for gi, p in missing[:4])
            msg = f"{c['name']}: no result from {why} (process died, timed out or ran out of time)"
            errors.append(msg)
            status = "error"
            if c["status"] in _PASSING or c["status"] == "not-run":
                c["status"] = "error"
                c["reason"] = msg
        elif skipped and c["status"] not in ("unsupported",):
            why = "; ".join(f"{ident[gi].label()} process {p}" for gi, p in skipped[:4])
            msg = f"{c['name']}: not run on {why} (--time-budget ran out)"
            not_run.append(msg)
            status = "undecided"
            if c["status"] in _PASSING:
                c["status"] = "not-run"
                c["reason"] = msg
        if len(set(agreed.values())) > 1:
            ref = min(agreed)
            diff = []
            for gi in sorted(agreed):
                if agreed[gi] != agreed[ref]:
                    a, b = json.loads(agreed[ref]), json.loads(agreed[gi])
                    ts = sorted(t for t in set(a) | set(b) if a.get(t) != b.get(t))
                    diff.append(f"{ident[gi].label()} differs from {ident[ref].label()} in "
                                f"{', '.join(ts)}")
            msg = f"{c['name']} ({c['key']}): digests differ across GPUs: " + "; ".join(diff)
            mismatches.append(msg)
            status = "fail"
            c["reason"] = msg
            if c["status"] in _PASSING:
                c["status"] = "not-reproducible"
        elif status != "error" and len(agreed) >= 2 and len(agreed) == len(gpus):
            status = "pass"
            compared += 1
        c["cross_gpu"] = status
    names = sorted({ident[g.index].name for g in gpus})
    ev: list[str] = []
    if mismatches:
        st = "fail"
        ev += mismatches
    elif errors:
        st = "error"
    elif len(gpus) == 1:
        st = "not-tested"
        ev.append("1 GPU: cross-GPU agreement not tested")
    elif compared == 0:
        st = "undecided"
        ev.append(f"{len(gpus)} GPUs: no configuration ran on every GPU, nothing compared")
    elif not_run:
        st = "undecided"
        ev.append(f"{len(gpus)} GPUs: {compared} configuration(s) bitwise identical across GPUs, "
                  f"{len(not_run)} not run on every GPU (time budget): the claim is not decided")
    else:
        st = "pass"
        ev.append(f"{len(gpus)} GPUs ({', '.join(names)}): {compared} configuration(s) bitwise "
                  f"identical across GPUs, {processes} process(es) per GPU and every run")
    if errors:
        ev += [f"error: {e}" for e in errors[:10]]
    ev += [f"not run: {m}" for m in not_run[:10]]
    if len(gpus) == 1 and st != "not-tested":
        ev.append("1 GPU: cross-GPU agreement not tested")
    for g in gpus:
        gg = ident[g.index]
        ev.append(f"GPU {gg.index}: {gg.name} {gg.uuid}")
    return {"status": st, "evidence": ev, "gpus": [ident[g.index].to_json() for g in gpus],
            "processes_per_gpu": processes, "mismatches": mismatches, "errors": errors,
            "not_run": not_run, "configs_compared": compared}


def manifest_extra(report: Mapping[str, Any], summary: Mapping[str, Any],
                   records: Sequence[Mapping[str, Any]]) -> dict:
    """What a multi-GPU manifest adds: the GPUs (index, name, UUID, as each pinned process saw
    it), the per-GPU environment (driver, versions), per-GPU digests and the cross-GPU verdict."""
    envs = {}
    for r in records:
        for lab, e in (r.get("environment") or {}).items():
            envs.setdefault(lab, e)
    return {"gpus": summary["gpus"], "gpu_environments": envs,
            "per_gpu_digests": {c["key"]: c.get("per_gpu_digests", {}) for c in report["configs"]},
            "cross_gpu": {k: summary[k] for k in ("status", "evidence", "processes_per_gpu",
                                                  "configs_compared")}}
