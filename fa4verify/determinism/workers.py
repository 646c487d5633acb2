"""Fresh processes: the worker spec, what one worker process runs, and several of them run in the
engine's fresh workers (:func:`fa4verify.run.engine.run_calls`)."""
from __future__ import annotations

import datetime as _dt
import json
import os
import time
from typing import Any, Mapping, Sequence

from fa4verify.determinism.backends import load_backend
from fa4verify.determinism.bitwise import _torch
from fa4verify.determinism.configs import DeterminismConfig
from fa4verify.determinism.runner import _first_line, run_config, time_backward
from fa4verify.determinism.schema import SCHEMA_WORKER

def resolve_devices(spec: str, backend_name: str) -> list[str]:
    """``--devices``: ``all``, ``0``, ``0,1`` or ``cpu``. For the fa4 backend indices become
    ``cuda:N``; ``all`` means every visible CUDA device. Raises ValueError on bad input."""
    spec = (spec or "").strip()
    if backend_name != "fa4":
        if spec in ("", "cpu", "all"):
            return ["cpu"]
        raise ValueError(f"--devices {spec!r}: the {backend_name} backend runs on the CPU only")
    torch = _torch()
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if spec in ("", "all"):
        if n == 0:
            raise ValueError("--devices all: no CUDA device visible")
        return [f"cuda:{i}" for i in range(n)] if spec == "all" else ["cuda:0"]
    out = []
    for tok in spec.split(","):
        tok = tok.strip().removeprefix("cuda:")
        if not tok.isdigit():
            raise ValueError(f"--devices {spec!r}: expected 'all' or comma-separated indices")
        if int(tok) >= n:
            raise ValueError(f"--devices {spec!r}: device {tok} does not exist ({n} visible)")
        out.append(f"cuda:{int(tok)}")
    return out


def worker_spec(backend: str, configs: Sequence[DeterminismConfig], devices: Sequence[str], *,
                runs: int, default_runs: int, guard_bytes: int | None = None,
                time_budget_s: float | None = None, timing: bool = False,
                timing_configs: Sequence[DeterminismConfig] = (), timing_reps: int = 20) -> dict:
    return {"schema": SCHEMA_WORKER, "backend": backend,
            "configs": [c.to_json() for c in configs], "devices": list(devices), "runs": runs,
            "default_runs": default_runs, "guard_bytes": guard_bytes, "time_budget_s": time_budget_s,
            "timing": timing, "timing_configs": [c.to_json() for c in timing_configs],
            "timing_reps": timing_reps}


def run_worker_spec(spec: Mapping[str, Any], out_path: str | None = None) -> dict:
    """Body of a worker process (also callable in-process): run every configuration on every
    device; write the JSON record to ``out_path`` after each configuration (so a killed worker
    leaves what it finished)."""
    t_start = time.monotonic()
    deadline = (t_start + float(spec["time_budget_s"])) if spec.get("time_budget_s") else None
    rec: dict[str, Any] = {"schema": SCHEMA_WORKER, "pid": os.getpid(), "results": [],
                           "timing": [], "started": _now()}

    def flush():
        if out_path:
            tmp = out_path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(rec, f)
            os.replace(tmp, out_path)

    try:
        backend = load_backend(spec["backend"])
    except Exception as ex:  # noqa: BLE001
        rec["fatal"] = _first_line(ex)
        rec["fatal_kind"] = "environment" if isinstance(ex, EnvironmentError) else "error"
        flush()
        return rec
    rec["where"] = backend.where
    rec["arch"] = backend.arch
    rec["environment"] = {d: backend.environment(d) for d in spec["devices"]}
    flush()
    configs = [DeterminismConfig.from_json(c) for c in spec["configs"]]
    for cfg in configs:
        for dev in spec["devices"]:
            rec["results"].append(run_config(backend, cfg, dev, runs=int(spec["runs"]),
                                             default_runs=int(spec.get("default_runs", 0)),
                                             guard_bytes=spec.get("guard_bytes"),
                                             deadline=deadline))
            flush()
    if spec.get("timing"):
        for cfg in (DeterminismConfig.from_json(c) for c in spec.get("timing_configs", [])):
            for dev in spec["devices"]:
                rec["timing"].append(time_backward(backend, cfg, dev,
                                                   reps=int(spec.get("timing_reps", 20))))
                flush()
    rec["finished"] = _now()
    rec["seconds"] = round(time.monotonic() - t_start, 3)
    flush()
    return rec


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def _worker_call(payload: Mapping[str, Any]) -> dict:
    """The body of one fresh determinism process (the engine's call target)."""
    return run_worker_spec(payload["spec"], payload["out"])


def spawn_workers(spec: Mapping[str, Any], processes: int, workdir: str, *,
                  parallel: bool = True, timeout_s: float | None = None,
                  env: Mapping[str, str] | None = None) -> list[dict]:
    """Run ``spec`` in ``processes`` fresh processes (the engine's workers, concurrently when
    ``parallel``, none sharing FA4's kernel cache: every process compiles afresh) and return their
    records (a process that died leaves ``fatal`` plus whatever it had flushed)."""
    from fa4verify.run.engine import run_calls
    os.makedirs(workdir, exist_ok=True)
    penv: dict[str, str | None] = {k: v for k, v in (env or {}).items()}
    penv["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] = None     # every process compiles afresh
    penv.setdefault("PYTHONUNBUFFERED", "1")
    outs = [os.path.join(workdir, f"worker{i}.json") for i in range(processes)]
    got = run_calls("fa4verify.determinism.workers:_worker_call",
                    [{"spec": dict(spec), "out": o} for o in outs], envs=[penv] * processes,
                    timeout_s=timeout_s, parallel=parallel)
    records = []
    for i, oc in enumerate(got):
        try:
            with open(outs[i]) as f:
                r = json.load(f)
        except (OSError, json.JSONDecodeError):
            r = {"schema": SCHEMA_WORKER, "results": [], "timing": []}
        r["process_index"] = i
        r["returncode"] = 0 if oc.ok else (oc.rc if oc.rc is not None else 1)
        if not oc.ok and "fatal" not in r:
            r["fatal"] = f"worker failed: {oc.error}"
            r["fatal_kind"] = "error"
        records.append(r)
    return records
