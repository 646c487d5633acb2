"""The worker process of the engine, and the one place a check's code is called (:func:`run_task`).

``python -P -m fa4verify.run.worker --serve --reply-fd N`` takes ``multiprocessing.connection``
messages on stdin (a task: :func:`build_request` or ``{"call": "module:function", "payload": ...}``;
None: exit) and sends on N ``{"ready": ...}`` after its imports (:func:`preload`), ``{"case": j}``
before each case (the parent names the case a worker past its deadline was running) and ``{"done":
payload}``. Its imports, CUDA context and FA4's in-memory kernels are paid once per audit.

Note [Worker isolation]: a worker dies with its parent (``PR_SET_PDEATHSIG`` = SIGKILL, first
thing: :func:`die_with_parent`; a kill -9 of the audit leaves no worker on the GPU), and imports
only the installed package: started with ``python -P`` and a ``PYTHONPATH`` without the working
directory, so a shadow ``fa4verify/`` or ``numpy.py`` in the cwd is never imported; a
``--checks-module`` goes by its file path.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import time
import traceback
from typing import Any, Callable, Sequence

__all__ = ["build_request", "run_task", "serve", "main", "preload", "die_with_parent", "cuda_initialised",
           "PRELOAD_ENV", "PROFILE_ENV", "profiled", "IDLE_IMPORTS", "import_idle"]

#: what a serving worker imports before its first task: cuda, cpu or none
PRELOAD_ENV = "FA4VERIFY_WORKER_PRELOAD"
#: Note [Task profiles]: every task under cProfile, written to ``<dir>/<check>-<pid>-<ns>.prof``
PROFILE_ENV = "FA4VERIFY_PROFILE_DIR"
#: Note [Source coverage] (fa4verify.coverage.source): every task's FA4 lines written to this directory
SOURCE_TRACE_ENV = "FA4VERIFY_SOURCE_TRACE_DIR"

#: Note [Idle imports]: what the checks' tasks import beyond :func:`preload`, the heaviest first
#: in effect (measured on the CPU after the zygote's preload: 670 modules, 490 of them scipy's
#: through ``scipy.stats``, 77 hypothesis'): a serving worker imports them while it waits for its
#: first task (the audit's parent is still drawing the plans), and the zygote, once idle, so the
#: bytecode cache holds them (Note [Bytecode cache]). Never CUDA.
IDLE_IMPORTS = ("fa4verify.fuzz.drawn", "fa4verify.fuzz.properties", "fa4verify.judge.statistical",
                "hypothesis.strategies", "scipy.stats")


def import_idle(busy: Callable[[], bool], modules: Sequence[str] = IDLE_IMPORTS) -> list[str]:
    """Import ``modules`` in order until ``busy()`` (a task is waiting); the ones imported. A
    module that fails to import is left to the task that needs it (which reports the error)."""
    done = []
    for m in modules:
        if busy():
            break
        try:
            importlib.import_module(m)
        except Exception:  # noqa: BLE001 - the task that imports it reports it
            continue
        done.append(m)
    return done


def profiled(label: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """``fn(*args, **kw)``, under cProfile when ``$FA4VERIFY_PROFILE_DIR`` is set (Note [Task
    profiles]: the profile written to ``<dir>/<label>-<pid>-<ns>.prof``)."""
    prof_dir = os.environ.get(PROFILE_ENV)
    if not prof_dir:
        return fn(*args, **kw)
    import cProfile
    prof = cProfile.Profile()
    try:
        return prof.runcall(fn, *args, **kw)
    finally:
        os.makedirs(prof_dir, exist_ok=True)
        prof.dump_stats(os.path.join(prof_dir, f"{label}-{os.getpid()}-{time.time_ns()}.prof"))


def die_with_parent() -> None:
    """Note [Worker isolation]: SIGKILL this process when its parent dies (Linux prctl
    PR_SET_PDEATHSIG; elsewhere a no-op: the pool's process group is then the only cleanup)."""
    import ctypes
    import signal
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)          # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError, TypeError):
        return
    if os.getppid() == 1:        # the parent died before the prctl: follow it now
        os._exit(1)


def cuda_initialised() -> bool:
    """Whether torch initialised CUDA in this process (never imports torch)."""
    t = sys.modules.get("torch")
    try:
        return bool(t is not None and t.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - torch without its cuda module
        return False


def build_request(spec: Any, ctx: Any, cases: Sequence[tuple[int, Any]] | None) -> dict[str, Any]:
    """A task: the check (module, id), its context, ``cases`` ((index, case); None: the whole check)."""
    mod = None if spec.module.startswith("fa4verify.") else sys.modules.get(spec.module)
    return {"check_id": spec.id, "module": getattr(mod, "__file__", None) or spec.module,  # Note [Worker isolation]
            "ctx": dataclasses.replace(ctx, _progress_factory=None, _notes=[]),
            "cases": None if cases is None else list(cases)}


def _error(e: BaseException) -> tuple[str, Any]:
    return "error", (f"{type(e).__name__}: {e}".strip()[:500], traceback.format_exc()[-6000:])


def run_task(spec: Any, ctx: Any, cases: Sequence[tuple[int, Any]] | None,
             on_case: Any = None) -> list[tuple[int, str, Any]]:
    """Run a task here: one ``(index, kind, value)`` per case, ``kind`` one of ``value`` (what
    ``run_case`` returned), ``skip`` (the reason), ``error`` ((summary, traceback)); for a whole
    check (``cases`` None) ``(0, "result", CheckResult)``, its exceptions and skips as results."""
    from fa4verify.audit.registry import CheckResult, SkipCheck
    out: list[tuple[int, str, Any]] = []
    for j, case in ([(0, None)] if cases is None else cases):
        if on_case is not None:
            on_case(j)
        try:
            out.append((j, "value", spec.func(ctx) if cases is None else spec.func(ctx, case)))
        except SkipCheck as e:
            out.append((j, "skip", str(e) or "skipped by the check"))
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - SystemExit from a check is an error too
            out.append((j, *_error(e)))
    if cases is not None:
        return out
    (_j, kind, v), = out
    if kind == "skip":
        v = CheckResult(status="skip", summary=v)
    elif kind == "error":
        v = CheckResult(status="error", summary=v[0], details={"traceback": v[1]})
    elif not isinstance(v, CheckResult):
        v = CheckResult(status="error", summary=f"check returned {type(v).__name__}, not CheckResult")
    return [(0, "result", v)]


def _run_request(req: dict[str, Any], reply: Any) -> dict[str, Any]:
    """Run a task (a call, or a check's cases after loading its module): the result payload, its
    ``timing`` the task's seconds and FA4's compiles and cache loads (:mod:`~fa4verify.audit.kernel_timing`)."""
    from fa4verify.audit import kernel_timing
    from fa4verify.audit.registry import load_module, registered
    if "call" in req:          # determinism's processes, the source mutants' patched copies
        try:
            mod, _, fn = req["call"].partition(":")
            out = [(0, "value", getattr(importlib.import_module(mod), fn)(req["payload"]))]
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - the caller decides what a failed call means
            out = [(0, *_error(e))]
        return {"outcomes": out, "notes": []}
    ctx, cases = req["ctx"], req.get("cases")
    try:
        load_module(req["module"])
        spec = registered().get(req["check_id"])
        if spec is None:
            raise LookupError(f"check {req['check_id']!r} not registered by {req['module']}")
        from fa4verify.compile.production import audit_spec
        spec = audit_spec(spec)                    # Note [Fake device audit]: as the runner's
    except Exception as e:  # noqa: BLE001 - import problems are the task's error, reported normally
        summary, tb = _error(e)[1]
        err = (f"worker could not load the check: {summary}", tb)
        return {"outcomes": [(j, "error", err) for j, _ in (cases or [(0, None)])], "notes": []}
    kernel_timing.install(import_fa4=False)       # counted from the first task after FA4's import
    before = kernel_timing.snapshot()
    t0 = time.perf_counter()

    def on_case(j: int) -> None:
        reply.send({"case": j})
    if os.environ.get(SOURCE_TRACE_ENV):           # Note [Source coverage]
        from fa4verify.coverage.source import traced
        outcomes = profiled(req["check_id"], traced, req["check_id"], run_task, spec, ctx, cases, on_case)
    else:
        outcomes = profiled(req["check_id"], run_task, spec, ctx, cases, on_case)
    kernel_timing.release_compile_locks()          # a compile the check abandoned holds none
    timing = dict(kernel_timing.delta(before), exec_s=round(time.perf_counter() - t0, 3),
                  pid=os.getpid(), kernels=kernel_timing.events_since(before),
                  used=[d for _c, d in kernel_timing.keys_used_since(before)])
    if os.environ.get("FA4VERIFY_GPU_INDEX"):       # pinned by the pool (--gpus)
        timing["gpu"] = os.environ["FA4VERIFY_GPU_INDEX"]
    return {"outcomes": outcomes, "notes": list(ctx._notes), "timing": timing}


def preload(what: str, errors: dict[str, str] | None = None) -> dict[str, float]:
    """Import what a worker's checks need (``cuda``: torch, the CUDA context, FA4's interface, the
    judge; ``cpu``: torch and the judge; ``zygote``: ``cuda`` without the context; ``none``):
    seconds per step. A failing step is left to the check that needs it; ``errors`` gets its
    exception (a forked worker whose ``cuda_context`` failed is replaced by a spawned one)."""
    def _cuda() -> None:
        import torch
        if torch.cuda.is_available():
            torch.cuda.init()
            torch.empty(1, device="cuda")          # the context, not just the driver
        elif os.environ.get("FA4VERIFY_FORKED") == "1":
            raise RuntimeError("no CUDA device in a worker forked from the zygote")

    def _fa4() -> None:
        from fa4verify.audit import kernel_timing
        from fa4verify.kernels.adapter import interface_module, read_compile_key_names
        interface_module()                    # FA4's interface; imports the CuTe DSL too
        kernel_timing.install()
        read_compile_key_names()              # once here, not on each worker's first call

    plan = [("torch", lambda: importlib.import_module("torch"))]
    plan += [("cuda_context", _cuda)] if what == "cuda" else []
    plan += [("fa4", _fa4)] if what in ("cuda", "zygote") else []
    plan += [("judge", lambda: [importlib.import_module(m) for m in
                                ("fa4verify.judge", "fa4verify.kernels.adapter", "fa4verify.oracles")])]
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


def serve(reply_fd: int, tasks_fd: int = 0) -> int:
    """The serving loop: tasks from ``tasks_fd``, replies on ``reply_fd`` (the module docstring)."""
    from multiprocessing.connection import Connection
    tasks, reply = Connection(tasks_fd, writable=False), Connection(reply_fd, readable=False)
    t0 = time.perf_counter()
    errors: dict[str, str] = {}
    kind = os.environ.get(PRELOAD_ENV, "none").strip().lower()
    steps = preload(kind, errors)
    reply.send({"ready": round(time.perf_counter() - t0, 3), "steps": steps, "errors": errors,
                "pid": os.getpid(), "wall": time.time()})
    if kind in ("cuda", "cpu"):
        import_idle(tasks.poll)              # Note [Idle imports]
    while True:
        try:
            req = tasks.recv()
        except EOFError:
            return 0
        if req is None:
            # every result is sent and FA4's kernel exports are done (inside a task): skip
            # the interpreter's teardown of torch, CUDA and the DSL (seconds per worker)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        print(f"--- fa4verify worker: {req.get('check_id') or req.get('call', '?')}", file=sys.stderr, flush=True)
        payload = _run_request(req, reply)
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            reply.send({"done": payload})
        except Exception as e:  # noqa: BLE001 - an unpicklable value is the task's error
            kind, err = _error(e)
            reply.send({"done": dict(payload, outcomes=[(j, kind, err) for j, _k, _v in payload["outcomes"]])})
        release_freed_memory()


def release_freed_memory() -> bool:
    """Note [Freed memory stays] (fa4verify/run/pool.py): between tasks, what a task freed goes
    back to the system (glibc's ``malloc_trim``; a worker's heap keeps it only within a task).
    False where the C library has no ``malloc_trim``."""
    try:
        import ctypes
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3 or argv[:2] != ["--serve", "--reply-fd"]:
        print("usage: python -m fa4verify.run.worker --serve --reply-fd N", file=sys.stderr)
        return 2
    return serve(int(argv[2]))


if __name__ == "__main__":
    die_with_parent()
    sys.exit(main())
