"""The worker process of the engine, and the one place a check's code is called (:func:`run_task`).

``python -P -m fa4verify.run.worker --serve --reply-fd N`` reads one JSON line per task on stdin
(``{"request": PATH, "result": PATH, "seq": K}``; the request is a pickle written by the pool:
:func:`build_request`, or a call ``{"call": "module:function", "payload": ...}``), runs it, writes
the result pickle atomically and then ``{"done": K}`` on descriptor N; before each case it writes
``{"case": j}``, so the parent can name the case a worker past its deadline was running. Its
imports (:func:`preload`, then ``{"ready": ...}``), CUDA context and FA4's in-memory kernels are
paid once per audit. A worker that dies leaves no result: the pool reports the task's cases.

Note [Worker isolation]: a worker dies with its parent (``PR_SET_PDEATHSIG`` = SIGKILL, first
thing: :func:`die_with_parent`; a kill -9 of the audit leaves no worker on the GPU), and imports
only the installed package: started with ``python -P`` and a ``PYTHONPATH`` without the working
directory, so a shadow ``fa4verify/`` or ``numpy.py`` in the cwd is never imported; a
``--checks-module`` goes by its file path. Each result carries ``timing``: the task's seconds and,
from :mod:`fa4verify.audit.kernel_timing`, FA4's kernel compiles and disk-cache loads during it.
"""
from __future__ import annotations

import json
import os
import pickle
import sys
import time
import traceback
from typing import Any, Sequence

__all__ = ["build_request", "run_task", "serve", "main", "preload", "die_with_parent",
           "context_to_dict", "context_from_dict", "PRELOAD_ENV", "PROFILE_ENV"]

#: what a serving worker imports before its first task: cuda, cpu or none
PRELOAD_ENV = "FA4VERIFY_WORKER_PRELOAD"
#: Note [Task profiles]: every task under cProfile, written to ``<dir>/<check>-<pid>-<ns>.prof``
PROFILE_ENV = "FA4VERIFY_PROFILE_DIR"


def die_with_parent() -> None:
    """Note [Worker isolation]: SIGKILL this process when its parent dies (Linux prctl
    PR_SET_PDEATHSIG; elsewhere a no-op: the pool's process group is then the only cleanup)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)          # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:        # the parent died before the prctl: follow it now
        os._exit(1)


def context_to_dict(ctx: Any) -> dict[str, Any]:
    """The JSON form of a check context (what a worker needs to rebuild it)."""
    return {"dtype": ctx.dtype, "arch": ctx.arch, "device": ctx.device, "profile": ctx.profile,
            "seed": ctx.seed, "check_id": ctx.check_id, "archs": list(ctx.archs),
            "options": dict(ctx.options), "deployment": ctx.deployment}


def context_from_dict(c: dict[str, Any]) -> Any:
    from fa4verify.audit.registry import CheckContext
    return CheckContext(dtype=c["dtype"], arch=c["arch"], device=c["device"], profile=c["profile"],
                        seed=int(c["seed"]), check_id=c["check_id"], archs=tuple(c["archs"]),
                        options=dict(c.get("options", {})), deployment=c.get("deployment"))


def build_request(spec: Any, ctx: Any, cases: Sequence[tuple[int, Any]] | None) -> dict[str, Any]:
    """A task: the check (module to import, id), its context and ``cases`` ((index, case)
    pairs; None: the whole check, ``spec.func(ctx)``)."""
    mod = sys.modules.get(spec.module)
    entry = spec.module
    if not spec.module.startswith("fa4verify.") and mod is not None:   # Note [Worker isolation]
        entry = getattr(mod, "__file__", None) or spec.module
    return {"check_id": spec.id, "module": entry, "ctx": context_to_dict(ctx),
            "cases": None if cases is None else list(cases)}


def _error(e: BaseException) -> tuple[str, Any]:
    return "error", (f"{type(e).__name__}: {e}".strip()[:500], traceback.format_exc()[-6000:])


def run_task(spec: Any, ctx: Any, cases: Sequence[tuple[int, Any]] | None,
             on_case: Any = None) -> list[tuple[int, str, Any]]:
    """Run a task here: one ``(index, kind, value)`` per case, ``kind`` one of ``value`` (what
    ``run_case`` returned), ``skip`` (the reason), ``error`` ((summary, traceback)); for a whole
    check (``cases`` None) ``(0, "result", CheckResult)``, its exceptions and skips as results."""
    from fa4verify.audit.registry import CheckResult, SkipCheck
    if cases is None:
        if on_case is not None:
            on_case(0)
        try:
            res = spec.func(ctx)
        except SkipCheck as e:
            res = CheckResult(status="skip", summary=str(e) or "skipped by the check")
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - SystemExit from a check is an error too
            summary, tb = _error(e)[1]
            res = CheckResult(status="error", summary=summary, details={"traceback": tb})
        if not isinstance(res, CheckResult):
            res = CheckResult(status="error", summary=f"check returned {type(res).__name__}, not CheckResult")
        return [(0, "result", res)]
    out: list[tuple[int, str, Any]] = []
    for j, case in cases:
        if on_case is not None:
            on_case(j)
        try:
            out.append((j, "value", spec.func(ctx, case)))
        except SkipCheck as e:
            out.append((j, "skip", str(e) or "skipped by the check"))
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001
            out.append((j, *_error(e)))
    return out


def _run_call(req: dict[str, Any]) -> dict[str, Any]:
    """A call task: ``function(payload)`` of ``"module:function"`` (determinism's processes, the
    source mutants' patched copies); its return value, or its exception as an error."""
    import importlib
    try:
        mod, _, fn = req["call"].partition(":")
        value = getattr(importlib.import_module(mod), fn)(req["payload"])
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - the caller decides what a failed call means
        return {"outcomes": [(0, *_error(e))], "notes": []}
    return {"outcomes": [(0, "value", value)], "notes": []}


def _run_request(req: dict[str, Any], reply: Any) -> dict[str, Any]:
    """Load the check's module, run the task, return the result payload."""
    from fa4verify.audit import kernel_timing
    from fa4verify.audit.registry import load_module, registered
    if "call" in req:
        return _run_call(req)
    ctx = context_from_dict(req["ctx"])
    cases = req.get("cases")
    try:
        load_module(req["module"])
        spec = registered().get(req["check_id"])
        if spec is None:
            raise LookupError(f"check {req['check_id']!r} not registered by {req['module']}")
        from fa4verify.compile.production import audit_spec
        spec = audit_spec(spec)                    # Note [Fake device audit]: as the runner's
    except Exception as e:  # noqa: BLE001 - import problems are the task's error, reported normally
        kind, (summary, tb) = _error(e)
        summary = f"worker could not load the check: {summary}"
        return {"outcomes": [(j, kind, (summary, tb)) for j, _ in (cases or [(0, None)])], "notes": []}
    kernel_timing.install(import_fa4=False)       # counted from the first task after FA4's import
    before = kernel_timing.snapshot()
    t0 = time.perf_counter()

    def on_case(j: int) -> None:
        reply.write(json.dumps({"case": j}) + "\n")
        reply.flush()
    prof_dir = os.environ.get(PROFILE_ENV)       # Note [Task profiles]
    prof = __import__("cProfile").Profile() if prof_dir else None
    outcomes = prof.runcall(run_task, spec, ctx, cases, on_case) if prof else run_task(spec, ctx, cases, on_case)
    if prof:
        os.makedirs(prof_dir, exist_ok=True)
        prof.dump_stats(os.path.join(prof_dir, f"{req['check_id']}-{os.getpid()}-{time.time_ns()}.prof"))
    kernel_timing.release_compile_locks()          # a compile the check abandoned holds none
    timing = dict(kernel_timing.delta(before), exec_s=round(time.perf_counter() - t0, 3),
                  pid=os.getpid(), kernels=kernel_timing.events_since(before),
                  used=[d for _c, d in kernel_timing.keys_used_since(before)])
    if os.environ.get("FA4VERIFY_GPU_INDEX"):       # pinned by the pool (--gpus)
        timing["gpu"] = os.environ["FA4VERIFY_GPU_INDEX"]
    return {"outcomes": outcomes, "notes": list(ctx._notes), "timing": timing}


def preload(what: str, errors: dict[str, str] | None = None) -> dict[str, float]:
    """Import what the checks of a worker need before the first task (``cuda``: torch, the CUDA
    context, FA4's interface, the judge; ``cpu``: torch and the judge; ``zygote``: ``cuda``
    without the CUDA context; ``none``); returns seconds per step. A failing step is left to the
    check that needs it; ``errors`` receives each failed step's exception (the pool reads
    ``cuda_context``'s: a forked worker without a CUDA context is replaced by a spawned one)."""
    def _cuda() -> None:
        import torch
        if torch.cuda.is_available():
            torch.cuda.init()
            torch.empty(1, device="cuda")          # the context, not just the driver
        elif os.environ.get("FA4VERIFY_FORKED") == "1":
            raise RuntimeError("no CUDA device in a worker forked from the zygote")

    def _fa4() -> None:
        from fa4verify.audit import kernel_timing
        from fa4verify.kernels.adapter import interface_module
        interface_module()                    # FA4's interface; imports the CuTe DSL too
        kernel_timing.install()

    def _imports(*mods: str):
        import importlib
        return lambda: [importlib.import_module(m) for m in mods]

    plan = [("torch", _imports("torch"))]
    plan += [("cuda_context", _cuda)] if what == "cuda" else []
    plan += [("fa4", _fa4)] if what in ("cuda", "zygote") else []
    plan += [("judge", _imports("fa4verify.judge", "fa4verify.kernels.adapter", "fa4verify.oracles"))]
    steps: dict[str, float] = {}
    for name, fn in (plan if what in ("cuda", "cpu", "zygote") else []):
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - the check that needs it reports the failure
            if errors is not None:
                errors[name] = f"{type(e).__name__}: {e}"[:300]
        steps[name] = round(time.perf_counter() - t0, 3)
    return steps


def serve(reply_fd: int) -> int:
    """The serving loop on stdin and ``reply_fd`` (see the module docstring)."""
    from fa4verify.audit.atomic import atomic_write_bytes
    reply = os.fdopen(reply_fd, "w", buffering=1)
    t0 = time.perf_counter()
    errors: dict[str, str] = {}
    steps = preload(os.environ.get(PRELOAD_ENV, "none").strip().lower(), errors)
    reply.write(json.dumps({"ready": round(time.perf_counter() - t0, 3), "steps": steps,
                            "errors": errors, "pid": os.getpid(), "wall": time.time()}) + "\n")
    reply.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        if msg.get("op") == "exit":
            # every result is written and FA4's kernel exports are done (inside a task): skip
            # the interpreter's teardown of torch, CUDA and the DSL (seconds per worker)
            sys.stdout.flush()
            sys.stderr.flush()
            reply.close()
            os._exit(0)
        with open(msg["request"], "rb") as f:
            req = pickle.load(f)
        print(f"--- fa4verify worker: {req.get('check_id') or req.get('call', '?')}", file=sys.stderr, flush=True)
        payload = _run_request(req, reply)
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            data = pickle.dumps(payload)
        except Exception as e:  # noqa: BLE001 - an unpicklable value is the task's error
            kind, err = _error(e)
            data = pickle.dumps(dict(payload, outcomes=[(j, kind, err) for j, _k, _v in payload["outcomes"]]))
        atomic_write_bytes(msg["result"], data)
        reply.write(json.dumps({"done": msg.get("seq")}) + "\n")
        reply.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3 or argv[:2] != ["--serve", "--reply-fd"]:
        print("usage: python -m fa4verify.run.worker --serve --reply-fd N", file=sys.stderr)
        return 2
    return serve(int(argv[2]))


if __name__ == "__main__":
    die_with_parent()
    sys.exit(main())
