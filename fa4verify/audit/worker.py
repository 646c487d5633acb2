"""Worker subprocess for isolated checks.

Two modes, one request format (:func:`build_request`: which module to import, which check, the
context):

* one-shot: ``python -m fa4verify.audit.worker REQUEST.json RESULT.json`` runs one check and
  writes ``{"result": ..., "notes": [...]}`` to RESULT atomically;
* serving: ``python -m fa4verify.audit.worker --serve --reply-fd N`` reads one JSON line per
  request on stdin (``{"request": ..., "result_path": ...}``), runs it, writes the result file
  atomically and then one line on file descriptor N. The process stays alive between checks, so
  its imports (torch, CUDA context, the CuTe DSL) and FA4's in-memory kernel cache are paid once
  per audit instead of once per check. :mod:`fa4verify.audit.pool` drives it.

If the process dies instead (abort, CUDA illegal address, OOM kill), no result appears and the
parent records an ``error`` with the signal and the last stderr line, then starts a new worker.
This module imports :mod:`fa4verify.audit.execute`, never the runner.

Start-up (serving mode): before its first request the worker does the imports every check pays
for (:func:`preload`, chosen by ``FA4VERIFY_WORKER_PRELOAD``: ``cuda`` -- torch, the CUDA context,
the CuTe DSL and FA4's interface, fa4verify's judge and oracles; ``cpu`` -- the same without CUDA;
``none``) and then writes one line ``{"ready": seconds, "pid": ...}`` on the reply descriptor, so
the pool can start its workers while the parent runs its own checks and report what the start
cost. Each result carries ``timing``: the check's seconds in the worker and, from
:mod:`fa4verify.audit.kernel_timing`, FA4's kernel compiles and disk-cache loads during it.
``FA4VERIFY_WORKER_PROFILE=DIR`` also writes a cProfile of each request to DIR (for benchmarks).
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from fa4verify.audit.execute import context_from_dict, context_to_dict, execute
from fa4verify.audit.registry import CheckContext, CheckResult, CheckSpec

REQUEST_VERSION = 1

__all__ = ["build_request", "run_request", "main", "serve", "REQUEST_VERSION", "preload", "PRELOAD_ENV"]

#: what a serving worker imports before its first request: cuda, cpu or none
PRELOAD_ENV = "FA4VERIFY_WORKER_PRELOAD"
#: a directory for one cProfile dump per request (benchmarks), unset: no profiling
PROFILE_ENV = "FA4VERIFY_WORKER_PROFILE"


def build_request(spec: CheckSpec, ctx: CheckContext) -> dict[str, Any]:
    mod = sys.modules.get(spec.module)
    entry = spec.module
    if spec.module.startswith("_fa4verify_ext.") and mod is not None:
        entry = getattr(mod, "__file__", None) or spec.module
    return {"version": REQUEST_VERSION, "check_id": spec.id, "module": entry,
            "ctx": context_to_dict(ctx)}


def run_request(req: dict[str, Any]) -> dict[str, Any]:
    """Load the check's module, run the check, return the JSON payload."""
    from fa4verify.audit.registry import load_module, registered

    ctx = context_from_dict(req["ctx"])
    try:
        if int(req.get("version", 0)) != REQUEST_VERSION:
            raise ValueError(f"request version {req.get('version')!r}, expected {REQUEST_VERSION}")
        load_module(req["module"])
        spec = registered().get(req["check_id"])
        if spec is None:
            raise LookupError(f"check {req['check_id']!r} not registered by {req['module']}")
    except Exception as e:  # import problems are the check's error, reported normally
        result = CheckResult(status="error", summary=f"worker could not load the check: "
                                                     f"{type(e).__name__}: {e}")
        notes: list[str] = []
    else:
        from fa4verify.audit import kernel_timing
        # counted from the first check after FA4 is imported (a GPU worker imports it at start-up)
        kernel_timing.install(import_fa4=False)
        before = kernel_timing.snapshot()
        t0 = time.perf_counter()
        prof_dir = os.environ.get(PROFILE_ENV, "").strip()
        if prof_dir:
            import cProfile
            prof = cProfile.Profile()
            result = prof.runcall(execute, spec, ctx)
            sh = ctx.shard
            os.makedirs(prof_dir, exist_ok=True)
            prof.dump_stats(os.path.join(prof_dir, f"{ctx.check_id}-{sh[0] + 1}of{sh[1]}-{os.getpid()}.pstats"))
        else:
            result = execute(spec, ctx)
        kernel_timing.release_compile_locks()    # a compile the check abandoned holds none
        notes = list(ctx._notes)
        timing = dict(kernel_timing.delta(before), exec_s=round(time.perf_counter() - t0, 3),
                      pid=os.getpid(), kernels=kernel_timing.events_since(before),
                      used=[d for _c, d in kernel_timing.keys_used_since(before)])
        kernel_timing.install(import_fa4=False)
        return {"result": result.to_dict(), "notes": notes, "timing": timing}
    return {"result": result.to_dict(), "notes": notes}


def preload(what: str, errors: dict[str, str] | None = None) -> dict[str, float]:
    """Import what the checks of a worker need before the first request (see the module
    docstring); returns seconds per step. A failing step is left to the check that needs it
    (the check reports it as its error), so preloading never fails; ``errors`` (if given)
    receives each failed step's exception (the pool reads ``cuda_context``'s: a worker forked
    from a zygote that cannot create a CUDA context is replaced by a spawned one)."""
    steps: dict[str, float] = {}
    if what not in ("cuda", "cpu"):
        return steps

    def step(name: str, fn) -> None:
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - the check that needs it reports the failure
            if errors is not None:
                errors[name] = f"{type(e).__name__}: {e}"[:300]
        steps[name] = round(time.perf_counter() - t0, 3)

    def _torch() -> None:
        import torch  # noqa: F401

    def _cuda() -> None:
        import torch
        if torch.cuda.is_available():
            torch.cuda.init()
            torch.empty(1, device="cuda")          # the context, not just the driver
        elif os.environ.get("FA4VERIFY_FORKED") == "1":
            raise RuntimeError("no CUDA device in a worker forked from the zygote")

    def _fa4() -> None:
        from fa4verify.kernels.adapter import interface_module
        interface_module()                    # FA4's interface; imports the CuTe DSL too
        from fa4verify.audit import kernel_timing
        kernel_timing.install()

    def _judge() -> None:
        import fa4verify.judge  # noqa: F401
        import fa4verify.kernels.adapter  # noqa: F401
        import fa4verify.oracles  # noqa: F401

    step("torch", _torch)
    if what == "cuda":
        step("cuda_context", _cuda)
        step("fa4", _fa4)
    step("judge", _judge)
    return steps


def _write(path: str, payload: dict[str, Any]) -> None:
    from fa4verify.audit.atomic import atomic_write_text
    sys.stdout.flush()
    sys.stderr.flush()
    atomic_write_text(path, json.dumps(payload, default=str))


def serve(reply_fd: int) -> int:
    """The serving loop on stdin and ``reply_fd`` (see the module docstring)."""
    reply = os.fdopen(reply_fd, "w", buffering=1)
    t0 = time.perf_counter()
    errors: dict[str, str] = {}
    steps = preload(os.environ.get(PRELOAD_ENV, "none").strip().lower(), errors)
    reply.write(json.dumps({"ready": round(time.perf_counter() - t0, 3), "steps": steps,
                            "errors": errors, "pid": os.getpid(), "wall": time.time()}) + "\n")
    reply.flush()
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        msg = json.loads(line)
        if msg.get("op") == "exit":
            # every result is written and FA4's kernel exports are done (they happen inside a
            # request): skip the interpreter's teardown of torch, CUDA and the DSL (seconds per
            # worker, measured on the H200) -- the parent waits for this exit
            sys.stdout.flush()
            sys.stderr.flush()
            reply.close()
            os._exit(0)
        sh = (msg["request"].get("ctx") or {}).get("shard") or [0, 1]
        label = msg["request"].get("check_id", "?") + (f"[{sh[0] + 1}/{sh[1]}]" if sh[1] > 1 else "")
        print(f"--- fa4verify worker: {label}", file=sys.stderr, flush=True)
        _write(msg["result_path"], run_request(msg["request"]))
        reply.write(json.dumps({"done": msg.get("seq")}) + "\n")
        reply.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 3 and argv[0] == "--serve" and argv[1] == "--reply-fd":
        return serve(int(argv[2]))
    if len(argv) != 2 or argv[0].startswith("--"):
        print("usage: python -m fa4verify.audit.worker REQUEST.json RESULT.json\n"
              "       python -m fa4verify.audit.worker --serve --reply-fd N", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        req = json.load(f)
    _write(argv[1], run_request(req))
    return 0


if __name__ == "__main__":
    sys.exit(main())
