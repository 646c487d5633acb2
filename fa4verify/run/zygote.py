"""A zygote for audit workers: import torch, the CuTe DSL and FA4 once, then fork each worker.

Measured on the H200: twelve workers spawned together spend 15-17 s each on imports (torch ~4-5 s,
``flash_attn.cute.interface`` ~9-10 s: quack, torch._dynamo, tvm_ffi, ml_dtypes). The zygote does
them once, with the workers' exact environment (FA4 reads its kernel-cache switches at import),
never touching CUDA; a forked child only creates its own CUDA context.

Protocol (``python -m fa4verify.run.zygote --control-fd N``, N one end of an AF_UNIX
SOCK_SEQPACKET pair): the zygote sends ``{"ready": seconds, "pid": ...}`` after its imports;
``{"op": "fork", "id": K, "env": {...}}`` with three descriptors attached (the read end of the
worker's tasks, the write end of its replies, its log) forks a child that starts a new session,
puts the log on 1 and 2 and serves :func:`fa4verify.run.worker.serve` on the other two; the
answer is ``{"forked": K, "pid": P}`` or ``{"forked": K, "error": "..."}``. Every child that exits
is reported as ``{"exit": P, "rc": R}`` (R as ``subprocess.Popen.returncode``). The zygote exits
when the parent closes its end and never runs a check, so a worker's fault cannot reach it.
Forking is safe: the zygote is single-threaded and has no CUDA context (checked before each fork:
with CUDA initialised it refuses, and the pool spawns workers instead).
"""
from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
import time

from fa4verify.run import worker

#: Note [Idle imports]: seconds without a message before the zygote imports (forks come in bursts)
QUIET_S = 0.5

__all__ = ["main", "RESTORE_ENV"]

#: JSON {name: null}: what a forked worker unsets (Note [Zygote environment], fa4verify.run.pool)
RESTORE_ENV = "FA4VERIFY_ZYGOTE_RESTORE"


def _send(ctl: socket.socket, msg: dict) -> None:
    ctl.send(json.dumps(msg).encode())


def _child(ctl: socket.socket, fds: list[int], env: dict) -> None:
    """In the forked child: become a worker (never returns)."""
    code = 1
    try:
        tasks_r, reply_w, log_fd = fds
        ctl.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        worker.die_with_parent()             # Note [Worker isolation]: with the zygote, hence the audit
        os.environ.update({str(k): str(v) for k, v in env.items()})   # e.g. its GPU (--gpus)
        for k in json.loads(os.environ.pop(RESTORE_ENV, "{}")):
            os.environ.pop(k, None)
        os.environ["FA4VERIFY_FORKED"] = "1"
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)                 # > 2: the zygote's 0, 1 and 2 are open
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        code = worker.serve(reply_w, tasks_r)
    except BaseException:  # noqa: BLE001 - the parent sees the exit code and the log
        import traceback
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _reap(ctl: socket.socket) -> None:
    """Report every child that exited (``rc`` as ``subprocess.Popen.returncode``)."""
    with contextlib.suppress(ChildProcessError):          # no child left
        while (got := os.waitpid(-1, os.WNOHANG))[0]:
            _send(ctl, {"exit": got[0], "rc": os.waitstatus_to_exitcode(got[1])})


def serve(ctl: socket.socket) -> int:
    t0 = time.perf_counter()
    steps = worker.preload("zygote")          # torch, FA4's interface, the judge: never CUDA
    _send(ctl, {"ready": round(time.perf_counter() - t0, 3), "steps": steps, "pid": os.getpid(),
                "cuda_initialised": worker.cuda_initialised()})
    from fa4verify.run import bytecode
    pending = bytecode.missing()              # Note [Bytecode cache]: written while idle
    # Note [Idle imports]: where the cache is on, the workers' other imports too, once the burst
    # of fork requests is over (an import is seconds, and a fork asked for during one waits for
    # it: a replacement worker may start up to one import late)
    lazy = list(worker.IDLE_IMPORTS) if bytecode.active() else []
    last = time.monotonic()
    while True:
        quiet = time.monotonic() - last > QUIET_S
        ready, _, _ = select.select([ctl], [], [], 0.0 if pending or (lazy and quiet) else 0.1)
        _reap(ctl)
        if not ready:
            if lazy and quiet:
                worker.import_idle(lambda: False, [lazy.pop(0)])
                if worker.cuda_initialised():  # never expected: no more imports here
                    lazy.clear()
                pending = bytecode.missing()
            else:
                bytecode.fill_some(pending, 10)
            continue
        last = time.monotonic()
        try:
            data, fds, _, _ = socket.recv_fds(ctl, 65536, 3)
        except OSError:
            data = b""
        if not data:
            return 0                       # the parent closed its end: exit (children go on)
        msg = json.loads(data)
        why = (f"{len(fds)} file descriptors, expected 3" if len(fds) != 3
               else "CUDA is initialised in the zygote" if worker.cuda_initialised() else None)
        if msg.get("op") == "fork" and why is None:
            pid = os.fork()
            if pid == 0:
                _child(ctl, fds, dict(msg.get("env") or {}))
        for fd in fds:
            os.close(fd)
        if msg.get("op") == "fork":
            _send(ctl, {"forked": msg.get("id"), **({"pid": pid} if why is None else {"error": why})})


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] != "--control-fd":
        print("usage: python -m fa4verify.run.zygote --control-fd N", file=sys.stderr)
        return 2
    worker.die_with_parent()                 # Note [Worker isolation]
    ctl = socket.socket(fileno=int(argv[1]))
    code = serve(ctl)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)          # no teardown of torch and the DSL (seconds): nothing is pending


if __name__ == "__main__":
    sys.exit(main())
