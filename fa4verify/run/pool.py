"""The engine's worker pool: isolated, persistent worker processes, forked from a zygote on the GPU.

:class:`WorkerPool` owns up to ``size`` long-lived ``python -P -m fa4verify.run.worker --serve``
processes (protocol: :mod:`fa4verify.run.worker`). :meth:`WorkerPool.run` runs one task in an
idle worker, thread-safe (the engine drives one thread per worker). A worker that dies, runs past
the task's deadline (killed with its process group) or returns an error is replaced, so a CUDA
fault in one check never leaks into another; ``fresh=True`` replaces every worker after one task.
A GPU worker's imports and CUDA context dominate its start, so the pool starts every worker at
once (:meth:`WorkerPool.prestart`) and on a GPU forks them from a zygote that did the imports once
(:mod:`fa4verify.run.zygote`, Note [Zygote environment]; ``FA4VERIFY_WORKER_START=spawn`` turns
it off; a zygote that cannot give working workers falls back to spawning).

Note [Worker isolation] (:mod:`fa4verify.run.worker`): workers and the zygote die with the parent
(``PR_SET_PDEATHSIG`` fires when the *thread* that started the process ends, so one spawner thread
that lives as long as the pool starts every process) and never have the cwd on their path.
Environment: the parent's, FA4's persistent kernel cache (``..._CACHE_ENABLED=1``,
``..._CACHE_DIR``) unless the caller set it, ``OMP_NUM_THREADS`` split between the workers; FA4
loads a cache entry under a shared ``flock`` and exports under the exclusive one (cache_utils.py).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import pickle
import queue
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from fa4verify.audit.kernel_timing import RUN_DIR_ENV
from fa4verify.run.worker import PRELOAD_ENV, build_request
from fa4verify.run.zygote import RESTORE_ENV

__all__ = ["WorkerPool", "worker_env", "KERNEL_CACHE_ENV", "TaskDied", "PoolClosed"]

#: FA4's own switches for its persistent (AOT) kernel cache (flash_attn/cute/cache_utils.py).
KERNEL_CACHE_ENV = ("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR")


def worker_env(*, kernel_cache: str | None, workers: int, base: dict[str, str] | None = None
               ) -> dict[str, str]:
    """The environment of a worker process (see the module docstring)."""
    env = dict(os.environ if base is None else base)
    cwd = os.path.realpath(os.getcwd())
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
            if p and os.path.realpath(p) != cwd]          # Note [Worker isolation]
    if path:
        env["PYTHONPATH"] = os.pathsep.join(path)
    else:
        env.pop("PYTHONPATH", None)
    if kernel_cache and not any(k in env for k in KERNEL_CACHE_ENV):
        os.makedirs(kernel_cache, exist_ok=True)
        env[KERNEL_CACHE_ENV[0]] = "1"
        env[KERNEL_CACHE_ENV[1]] = kernel_cache
    if workers > 1 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // (workers + 1)))
    return env


#: the exit code of a forked worker whose zygote died before it could report the status
EXIT_UNKNOWN = -1000


class TaskDied(Exception):
    """A task whose worker died or ran past its deadline: ``reason`` (one line), ``case`` (the
    index of the case it was running, None before the first), ``timed_out``, ``tail`` (its log)."""

    def __init__(self, reason: str, case: int | None, timed_out: bool, tail: str, rc: int | None) -> None:
        super().__init__(reason)
        self.reason, self.case, self.timed_out, self.tail, self.rc = reason, case, timed_out, tail, rc


def _died(rc: int | None, timed_out: bool, timeout: float, stderr_tail: str, case: int | None) -> TaskDied:
    if timed_out:
        why = f"did not finish in {timeout:g} s (killed with its worker)"
    elif rc == EXIT_UNKNOWN:
        why = "worker process died (exit status unknown: the zygote that forked it is gone)"
    elif rc is not None and rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.valid_signals() else f"signal {-rc}"
        why = f"worker process died: killed by {name} (exit {rc})"
    else:
        why = f"worker process exited with status {rc} without a result"
    last = [ln for ln in stderr_tail.strip().splitlines() if ln.strip()]
    if last and not timed_out:
        why += f"; last stderr line: {last[-1].strip()[:300]}"
    return TaskDied(why, case, timed_out, stderr_tail, rc)


def _kill(proc: Any) -> None:
    if isinstance(proc, _ForkedProc):
        proc.kill_now()
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


class PoolClosed(RuntimeError):
    """A check reached the pool after :meth:`WorkerPool.close` (an interrupted audit)."""


class _ForkFailed(Exception):
    """A worker the zygote was asked for did not start (refused, or no CUDA context in it)."""


def _visible_compute_cap(env: dict[str, str]) -> str | None:
    """The compute capability ("90") of the first GPU visible under ``env`` by nvidia-smi
    (which does not read ``CUDA_VISIBLE_DEVICES``: its first entry is passed as ``-i``), or
    None. Never touches CUDA in this process."""
    first = (env.get("CUDA_VISIBLE_DEVICES") or "").split(",")[0].strip()
    if "CUDA_VISIBLE_DEVICES" in env and (not first or first.startswith("-")):
        return None                       # "" or "-1": CUDA sees no GPU, whatever nvidia-smi lists
    cmd = ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"] + (["-i", first] if first else [])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    if not out or not out[0].replace(".", "").isdigit() or "." not in out[0]:
        return None
    major, minor = out[0].split(".", 1)
    return f"{int(major)}{int(minor)}"


def zygote_env(env: dict[str, str]) -> dict[str, str]:
    """Note [Zygote environment]: the zygote runs with the workers' environment plus three switches
    that keep its imports off CUDA, which a forked child could not use again. The kernel cache
    names its arch directory from ``FA4VERIFY_CACHE_ARCH`` (``sm`` + the compute capability
    nvidia-smi reports) instead of asking the device. ``import quack``
    (FA4's interface imports it) calls ``torch.cuda.is_available()`` and the device capability
    at import (quack/rmsnorm_config.py) unless ``QUACK_ARCH`` names the arch: it is set to the
    compute capability nvidia-smi reports for the first visible GPU (the value quack would have
    read from the device; FA4's own dispatch never reads it). ``PYTORCH_NVML_BASED_CUDA_CHECK=1``
    makes torch's availability check use NVML instead of initialising the driver. A forked
    worker restores them to the parent's values first thing (``FA4VERIFY_ZYGOTE_RESTORE``), and
    a worker whose CUDA context fails anyway is replaced by a spawned one."""
    z = dict(env)
    restore: dict[str, str | None] = {}
    cap = _visible_compute_cap(env)
    if "QUACK_ARCH" not in env and cap:
        z["QUACK_ARCH"] = cap
        restore["QUACK_ARCH"] = None
    from fa4verify.kernels.kernel_cache import ARCH_ENV
    if ARCH_ENV not in env and cap:
        # the kernel cache's arch directory (kernel_cache.arch_tag) without asking the device:
        # get_device_capability initialised CUDA in the zygote, which then refused every fork
        # (measured on the H200: the audit's workers spawned, 16.5 s of imports each)
        z[ARCH_ENV] = f"sm{cap}"
        restore[ARCH_ENV] = None
    if "PYTORCH_NVML_BASED_CUDA_CHECK" not in env:
        z["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
        restore["PYTORCH_NVML_BASED_CUDA_CHECK"] = None
    z[RESTORE_ENV] = json.dumps(restore)
    return z


class _Zygote:
    """The parent's end of a :mod:`fa4verify.run.zygote` process: forks workers on request
    and reports their exits. ``usable`` is False once it died or refused to fork; the pool then
    spawns workers instead."""

    def __init__(self, env: dict[str, str], tmp: str) -> None:
        self._ctl, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.log_path = os.path.join(tmp, "zygote.log")
        self._log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-P", "-m", "fa4verify.run.zygote", "--control-fd", str(child.fileno())],
                stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log, env=zygote_env(env),
                pass_fds=(child.fileno(),), start_new_session=True)
        finally:
            child.close()
        self.spawned = time.time()
        self.ready: dict[str, Any] | None = None
        self.usable = True
        self._cond = threading.Condition()
        self._forked: dict[int, dict[str, Any]] = {}
        self._exits: dict[int, int] = {}
        self._next = 0
        self._send_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="fa4verify-zygote", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = self._ctl.recv(65536)
            except OSError:
                data = b""
            with self._cond:
                if not data:                     # the zygote is gone
                    self.usable = False
                    self._cond.notify_all()
                    return
                msg = json.loads(data)
                if "ready" in msg:
                    self.ready = dict(msg, start_s=round(time.time() - self.spawned, 3))
                elif "forked" in msg:
                    self._forked[int(msg["forked"])] = msg
                    if "error" in msg:
                        self.usable = False
                elif "exit" in msg:
                    self._exits[int(msg["exit"])] = int(msg["rc"])
                self._cond.notify_all()

    def fork(self, fds: tuple[int, int, int], env: dict[str, str] | None = None) -> int:
        """Ask for a worker on ``fds`` (stdin read end, reply write end, log); returns the request
        id (the pid arrives later: :meth:`pid`). OSError when the zygote is gone."""
        with self._send_lock:
            self._next += 1
            k = self._next
            socket.send_fds(self._ctl, [json.dumps({"op": "fork", "id": k, "env": env or {}}).encode()], list(fds))
        return k

    def pid(self, k: int, timeout: float | None = None) -> int | None:
        """The pid of fork request ``k`` (waits for the zygote's imports); None if it failed."""
        with self._cond:
            self._cond.wait_for(lambda: k in self._forked or not self.usable, timeout)
            got = self._forked.get(k)
        return int(got["pid"]) if got and "pid" in got else None

    def exit_code(self, pid: int, timeout: float | None = 0.0) -> int | None:
        """The exit code of worker ``pid`` once it exited, else None (alive after ``timeout``).
        Once the zygote is gone it cannot report: a worker no longer alive (``kill(pid, 0)``)
        is then :data:`EXIT_UNKNOWN`. A reported code is handed out once (pids are reused)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exits or not self.usable, timeout)
            if pid in self._exits:
                return self._exits.pop(pid)
        while True:                       # the zygote is gone: ask the kernel
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return EXIT_UNKNOWN
            except PermissionError:
                pass
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def why(self) -> str:
        """Why the zygote forks no more (its refusal, or its exit and log tail)."""
        err = next((m["error"] for m in self._forked.values() if "error" in m), None)
        if err:
            return err
        rc = self.proc.poll()
        try:
            with open(self.log_path, "rb") as f:
                tail = f.read()[-300:].decode("utf-8", "replace").strip().replace("\n", " | ")
        except OSError:
            tail = ""
        return f"zygote {'alive' if rc is None else f'exited rc={rc}'}" + (f"; log: {tail}" if tail else "")

    def close(self) -> None:
        """Stop the zygote at once (after its workers: they die with it)."""
        with contextlib.suppress(OSError):
            self._ctl.shutdown(socket.SHUT_RDWR)
        self._ctl.close()
        _kill(self.proc)
        self._log.close()


class _ForkedProc:
    """A worker forked by the zygote, with the part of ``subprocess.Popen``'s interface that
    :class:`_Worker` and :func:`_kill` use (``pid``, ``stdin``, ``poll``, ``wait``,
    ``returncode``)."""

    def __init__(self, zygote: _Zygote, k: int, stdin_w: int) -> None:
        self._z = zygote
        self._k = k
        self._pid: int | None = None
        self.stdin = os.fdopen(stdin_w, "wb")
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        return self.pid_within(None)

    def pid_within(self, timeout: float | None) -> int:
        """The worker's pid, waiting at most ``timeout`` s for the zygote (None: as long as it
        takes). ProcessLookupError when it was not forked, TimeoutError when not yet."""
        if self._pid is None:
            pid = self._z.pid(self._k, timeout=timeout)
            if pid is None:
                if self._z.usable and (self._k not in self._z._forked):
                    raise TimeoutError("the zygote has not forked this worker yet")
                raise ProcessLookupError(f"the zygote did not fork this worker: {self._z.why()}")
            self._pid = pid
        return self._pid

    def kill_now(self) -> None:
        """SIGKILL the worker, without waiting for a fork still pending in the zygote (its
        stdin is closed instead: a worker forked later reads EOF and exits)."""
        with contextlib.suppress(OSError, ValueError):
            self.stdin.close()
        pid = self._pid if self._pid is not None else self._z.pid(self._k, 0.0)
        if pid is None:
            self.returncode = -signal.SIGKILL
            return
        self._pid = pid
        # the process group first, then the pid itself: a child forked a moment ago may not
        # have called setsid() yet (its group does not exist)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
        rc = self._z.exit_code(pid, 2.0)
        self.returncode = -signal.SIGKILL if rc is None else rc

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid = self.pid_within(0.0)
            except TimeoutError:
                return None                              # still to be forked: alive
            except ProcessLookupError:
                self.returncode = EXIT_UNKNOWN           # never forked
                return self.returncode
            self.returncode = self._z.exit_code(pid, 0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                pid = self.pid_within(timeout)
            except TimeoutError:
                raise subprocess.TimeoutExpired("fa4verify worker", timeout) from None
            except ProcessLookupError:
                self.returncode = EXIT_UNKNOWN
                return self.returncode
            rc = self._z.exit_code(pid, timeout)
            if rc is None:
                raise subprocess.TimeoutExpired("fa4verify worker", timeout)
            self.returncode = rc
        return self.returncode


class _Worker:
    """One serving worker process (spawned, or forked by the pool's zygote)."""

    def __init__(self, env: dict[str, str], tmp: str, n: int, zygote: "_Zygote | None" = None,
                 fork_env: dict[str, str] | None = None) -> None:
        self.spawned = time.time()
        #: the worker's start-up: {"ready": preload s, "steps": {...}, "start_s": spawn to ready}
        self.ready: dict[str, Any] | None = None
        self.log_path = os.path.join(tmp, f"worker{n}.log")
        self._log = open(self.log_path, "ab")
        self.forked, self.fork_error = False, None
        r, w = os.pipe()
        try:
            if zygote is not None and zygote.usable:
                sr, sw = os.pipe()
                try:
                    k = zygote.fork((sr, w, self._log.fileno()), fork_env)
                except OSError as e:          # spawned instead; the reason goes in its timing
                    os.close(sw)
                    zygote, self.fork_error = None, f"the zygote could not be asked: {e!r}"
                else:
                    self.proc: Any = _ForkedProc(zygote, k, sw)
                    self.forked = True
                finally:
                    os.close(sr)
            if not self.forked:
                self.proc = subprocess.Popen(
                    [sys.executable, "-P", "-m", "fa4verify.run.worker", "--serve", "--reply-fd", str(w)],
                    stdin=subprocess.PIPE, stdout=self._log, stderr=self._log, env=env,
                    pass_fds=(w,), start_new_session=True)
        finally:
            os.close(w)
        self._reply_fd = r
        self._buf = b""
        self.seq = 0
        self.tmp = tmp
        self.n = n
        self.gpu: str | None = None       #: the GPU it was pinned to (``WorkerPool(gpus=)``)

    def _exit_code(self, wait: float) -> int | None:
        """The exit code of a worker that stopped answering, waiting at most ``wait`` s for it
        to exit before killing it."""
        try:
            return self.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            _kill(self.proc)
            return self.proc.returncode

    def _readline(self, deadline: float | None) -> str | None:
        """The next line from the worker's reply descriptor: "" at EOF (the worker is gone),
        None when ``deadline`` (time.monotonic) passed first. Reads the raw descriptor into this
        object's buffer, so a second line that arrived with the first is never hidden from
        ``select`` (a buffered reader's readline would hold it where select cannot see it)."""
        while b"\n" not in self._buf:
            if self._reply_fd < 0:
                return ""
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._reply_fd], [], [], wait)
            if not ready:
                return None
            try:
                chunk = os.read(self._reply_fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                self._buf = b""
                return ""
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode("utf-8", "replace") + "\n"

    def _stderr_since(self, offset: int) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return f.read()[-4000:].decode("utf-8", "replace")

    def run(self, req: dict[str, Any], timeout: float) -> tuple[dict[str, Any], dict[str, Any]]:
        """(payload, timing) of one task: the worker's ``{"outcomes", "notes", "timing"}``;
        :class:`TaskDied` when the process is gone or ran past ``timeout`` (killed)."""
        self.seq += 1
        req_path = os.path.join(self.tmp, f"request{self.n}-{self.seq}.pickle")
        res_path = os.path.join(self.tmp, f"result{self.n}-{self.seq}.pickle")
        with open(req_path, "wb") as f:
            pickle.dump(req, f)
        offset = os.path.getsize(self.log_path)
        first = self.ready is None
        t_asked = time.time()
        case: int | None = None
        # one deadline for the whole task, a forked worker's start-up included (as a spawned
        # worker's start-up is: it reads the request only after its imports)
        deadline = time.monotonic() + timeout if timeout and timeout > 0 else None
        if self.forked and first:
            if not self._await_forked_start(deadline):        # the deadline passed first
                _kill(self.proc)
                raise _died(self.proc.returncode, True, timeout, self._stderr_since(offset), case)
        try:
            self.proc.stdin.write((json.dumps({"request": req_path, "result": res_path,
                                               "seq": self.seq}) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise _died(self._exit_code(5), False, timeout, self._stderr_since(offset), case) from None
        while True:
            line = self._readline(deadline)
            if line is None:   # past the deadline
                _kill(self.proc)
                raise _died(self.proc.returncode, True, timeout, self._stderr_since(offset), case)
            if not line:    # EOF: the worker died
                raise _died(self._exit_code(10), False, timeout, self._stderr_since(offset), case)
            msg = json.loads(line)
            if "ready" in msg:          # the start-up line, before the first result
                self.ready = dict(msg, start_s=round(float(msg.pop("wall", time.time())) - self.spawned, 3))
            elif "case" in msg:
                case = int(msg["case"])
            elif "done" in msg:
                break
        with open(res_path, "rb") as f:
            payload = pickle.load(f)
        os.unlink(res_path)
        os.unlink(req_path)
        timing = dict(payload.get("timing") or {})
        if first and self.ready is not None:
            # the task waited for the worker's start-up this long (0 when it was ready already)
            timing["worker_start_s"] = self.ready["start_s"]
            timing["worker_wait_s"] = round(max(0.0, self.spawned + self.ready["start_s"] - t_asked), 3)
            timing["preload"] = self.ready.get("steps", {})
            timing["worker_start"] = "fork" if self.forked else (self.fork_error or "spawn")
            zr = self.proc._z.ready if self.forked else None
            if zr:
                timing["zygote_ready_s"] = zr.get("start_s")
        return payload, timing

    def ask_exit(self) -> None:
        """Tell an idle worker to exit (it does at once: no interpreter teardown)."""
        if self.proc.poll() is None and not self.proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError, OSError, ValueError):
                self.proc.stdin.write(b'{"op": "exit"}\n')
                self.proc.stdin.close()

    def _await_forked_start(self, deadline: float | None) -> bool:
        """A forked worker's start-up, before its first request, within the item's
        ``deadline``: False when the deadline passed first; :class:`_ForkFailed` when the
        zygote did not fork it or its CUDA context failed (the pool then spawns a worker)."""
        try:
            self.proc.pid_within(None if deadline is None else max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            return False
        except ProcessLookupError as e:
            raise _ForkFailed(str(e)) from None
        line = self._readline(deadline)
        if line is None:
            return False
        if not line:
            raise _ForkFailed("the forked worker exited before it was ready")
        msg = json.loads(line)
        errs = msg.get("errors") or {}
        if "cuda_context" in errs:
            raise _ForkFailed(f"no CUDA context in the forked worker: {errs['cuda_context']}")
        self.ready = dict(msg, start_s=round(float(msg.pop("wall", time.time())) - self.spawned, 3))
        return True

    def close(self, wait: float = 10.0) -> None:
        self.ask_exit()
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                _kill(self.proc)
        fd, self._reply_fd = self._reply_fd, -1
        if fd >= 0:                      # once: the number may be reused after the close
            with contextlib.suppress(OSError):
                os.close(fd)
        self._log.close()


class WorkerPool:
    """Up to ``size`` worker processes shared by the isolated tasks of one audit. ``gpus``: the
    GPUs (``CUDA_VISIBLE_DEVICES`` entries) the workers are spread over, one per worker, each
    new worker on the GPU with the fewest live workers (``--gpus``); None: the parent's."""

    def __init__(self, size: int = 1, *, timeout: float = 0.0, fresh: bool = False,
                 kernel_cache: str | None = None, preload: str = "none",
                 start: str = "auto", gpus: list[str] | None = None) -> None:
        if size < 1:
            raise ValueError(f"WorkerPool size {size} < 1")
        if preload not in ("cuda", "cpu", "none"):
            raise ValueError(f"WorkerPool preload {preload!r}: expected cuda, cpu or none")
        if start not in ("auto", "fork", "spawn"):
            raise ValueError(f"WorkerPool start {start!r}: expected auto, fork or spawn")
        #: how workers start: "fork" from a zygote that imported torch and FA4 once
        #: (:mod:`fa4verify.run.zygote`), or "spawn" (a fresh interpreter each); "auto" forks
        #: when the workers preload CUDA (the GPU audit, where imports dominate a worker's start)
        #: unless ``FA4VERIFY_WORKER_START=spawn``
        env_start = os.environ.get("FA4VERIFY_WORKER_START", "").strip().lower()
        if start == "auto":
            start = env_start if env_start in ("fork", "spawn") else ("fork" if preload == "cuda" else "spawn")
        self.start = start
        self._zygote: _Zygote | None = None
        #: why forked workers were given up for spawned ones (None while forking works)
        self.fork_failure: str | None = None
        self._closed = False
        self.size = size
        self.timeout = timeout
        self.fresh = fresh
        self.gpus = list(gpus) if gpus else None
        self.kernel_cache = kernel_cache
        self.created = time.time()        #: wall clock of the pool's creation (report phases)
        self.env = worker_env(kernel_cache=kernel_cache, workers=size)
        self.env.setdefault(PRELOAD_ENV, preload)
        self._tmp = tempfile.TemporaryDirectory(prefix="fa4verify-workers-")
        # what the workers of this pool share (compile locks: fa4verify.audit.kernel_timing)
        self.run_dir = os.path.join(self._tmp.name, "shared")
        os.makedirs(self.run_dir)
        self.env[RUN_DIR_ENV] = self.run_dir
        self._idle: "queue.Queue[_Worker | None]" = queue.Queue()
        for _ in range(size):
            self._idle.put(None)          # a slot; its worker starts on first use
        self._lock = threading.Lock()
        self.started = 0                  #: worker processes started (for reports and tests)
        self._all: set[_Worker] = set()
        # Note [Worker isolation]: one long-lived thread starts every process
        self._spawner = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fa4verify-spawner")

    def _new(self, env: dict[str, str | None] | None = None) -> _Worker:
        return self._spawner.submit(self._start_worker, env).result()

    def _start_worker(self, own_env: dict[str, str | None] | None = None) -> _Worker:
        with self._lock:
            if self._closed:
                raise PoolClosed("the worker pool is closed (the audit was interrupted)")
            self.started += 1
            n = self.started
            env = self.env
            if self.gpus:
                live = [w.gpu for w in self._all if w.proc.poll() is None]
                gpu = min(self.gpus, key=lambda g: (live.count(g), self.gpus.index(g)))
                env = dict(env, CUDA_VISIBLE_DEVICES=gpu, FA4VERIFY_GPU_INDEX=str(self.gpus.index(gpu)))
            if own_env is not None:        # a task with its own environment: a spawned worker
                env = {k: v for k, v in {**env, **own_env}.items() if v is not None}
                w = _Worker(env, self._tmp.name, n)
                self._all.add(w)
                return w
            if self.start == "fork" and self._zygote is None:
                try:
                    self._zygote = _Zygote(self.env, self._tmp.name)
                except OSError:
                    self.start = "spawn"
            z = self._zygote if self.start == "fork" and self._zygote and self._zygote.usable else None
            w = _Worker(env, self._tmp.name, n, zygote=z,
                        fork_env={k: env[k] for k in ("CUDA_VISIBLE_DEVICES", "FA4VERIFY_GPU_INDEX") if k in env}
                        if self.gpus else None)
            w.gpu = env.get("CUDA_VISIBLE_DEVICES") if self.gpus else None
            if self.start == "fork" and z is None:      # why a forking pool spawned (its timing says)
                w.fork_error = w.fork_error or f"spawned: zygote {'missing' if self._zygote is None else 'unusable'}"
            self._all.add(w)
        return w

    @classmethod
    def for_audit(cls, config: Any, size: int | None = None, gpus: list[str] | None = None) -> "WorkerPool":
        """The pool of an audit run (``config``: an :class:`~fa4verify._options.AuditConfig`),
        ``size`` workers (default ``config.workers``), preloading CUDA on a GPU audit, every
        worker started now (:meth:`prestart`): their imports and CUDA contexts overlap whatever
        the caller does next (the CLI's discovery, the in-process checks) and each other."""
        from fa4verify.kernels.device import fake_device
        # Note [Fake device audit]: no CUDA context to make (FA4 is imported by the first compile)
        preload = ("none" if config.device != "cuda" else "cpu" if fake_device() else "cuda")
        pool = cls(size if size is not None else config.workers, timeout=config.timeout,
                   fresh=config.fresh_workers, kernel_cache=config.kernel_cache,
                   preload=preload, gpus=gpus)
        try:
            pool.prestart()
        except BaseException:          # a half-started pool (Ctrl-C, a failed spawn) is closed
            pool.close()
            raise
        return pool

    def start_times(self, t0: float) -> dict[str, float]:
        """When, in seconds after ``t0`` (wall clock), this pool was created and its zygote (if
        any) finished its imports: for the audit's report phases."""
        out = {"pool_created": round(self.created - t0, 3)}
        z = self._zygote
        if z is not None and z.ready is not None:
            out["zygote_ready"] = round(z.spawned + float(z.ready["start_s"]) - t0, 3)
        return out

    def prestart(self) -> int:
        """Start every idle slot's worker now, so their start-up (imports, CUDA context:
        :func:`fa4verify.run.worker.preload`) overlaps whatever the caller does next; returns
        how many were started."""
        slots = []
        while True:
            try:
                slots.append(self._idle.get_nowait())
            except queue.Empty:
                break
        new = 0
        try:
            for j, w in enumerate(slots):
                if w is None:
                    slots[j], new = self._new(), new + 1
        finally:
            for w in slots:
                self._idle.put(w)
        return new

    def run(self, spec: Any, ctx: Any, cases: list[tuple[int, Any]] | None = None,
            timeout: float | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Run one task (``cases`` of ``spec``, or the whole check) in a worker within
        ``timeout`` seconds (default: the pool's; 0: none): ``(payload, timing)`` as
        :meth:`_Worker.run`. :class:`TaskDied` when the worker died or was killed at the
        deadline, :class:`PoolClosed` when the pool was closed (an interrupted audit)."""
        return self._run(build_request(spec, ctx, cases), timeout, None)

    def call(self, target: str, payload: Any, *, env: dict[str, str | None] | None = None,
             timeout: float | None = None) -> Any:
        """``function(payload)`` of ``target`` ("module:function") in a worker: the value it
        returned; :class:`TaskDied` as :meth:`run`; the call's exception as ``RuntimeError``
        (with its traceback text). ``env``: variables set (None: unset) for this call, which then
        runs in a fresh worker of its own (a GPU it is pinned to, a patched FA4 on its path)."""
        out, _ = self._run({"call": target, "payload": payload}, timeout, env)
        (_j, kind, v), = out["outcomes"]
        if kind == "error":
            raise RuntimeError(f"{v[0]}\n{v[1]}")
        return v

    def _run(self, req: dict[str, Any], timeout: float | None, env: dict | None
             ) -> tuple[dict[str, Any], dict[str, Any]]:
        timeout = self.timeout if timeout is None else timeout
        if self._closed:
            raise PoolClosed("the worker pool is closed (the audit was interrupted)")
        w = self._new(env) if env is not None else self._idle.get()
        try:
            if env is None and (w is None or w.proc.poll() is not None):
                if w is not None:
                    self._discard(w)
                    w = None
                w = self._new()
            try:
                payload, timing = w.run(req, timeout)
            except _ForkFailed as e:
                # the zygote cannot give working workers here: spawn them from now on (the
                # check itself never sees this) -- unless the pool was closed meanwhile
                with contextlib.suppress(Exception):
                    _kill(w.proc)
                self._discard(w)
                w = None
                if self._closed:
                    raise PoolClosed("the worker pool was closed before this task ran") from None
                self.fork_failure = str(e)
                self.start = "spawn"
                w = self._new()
                payload, timing = w.run(req, timeout)
                timing["fork_failed"] = str(e)
            if env is not None or self.fresh or any(
                    k == "error" or (k == "result" and v.status == "error") for _j, k, v in payload["outcomes"]):
                self._discard(w)        # a fault may have left the CUDA context unusable
                w = None
            return payload, timing
        except TaskDied:
            if w is not None:
                self._discard(w)
            w = None
            raise
        finally:
            if env is None:
                self._idle.put(w)
            elif w is not None:
                self._discard(w)

    def _discard(self, w: _Worker) -> None:
        w.close()
        with self._lock:
            self._all.discard(w)

    def close(self) -> None:
        """Stop every worker: idle ones cleanly, busy ones (an interrupted audit) killed. No
        worker starts after this (a task that reaches the pool then gets :class:`PoolClosed`)."""
        with self._lock:
            self._closed = True
        idle: set[int] = set()
        while True:
            try:
                w = self._idle.get_nowait()
            except queue.Empty:
                break
            if w is not None:
                idle.add(id(w))
        with self._lock:
            workers, self._all = list(self._all), set()
        for w in workers:          # every worker at once: their exits overlap
            if id(w) not in idle or w.seq == 0:
                # busy (an interrupted audit), or never given a task (it may still be in its
                # start-up, which would not read an exit request for seconds)
                _kill(w.proc)
            else:
                w.ask_exit()
        deadline = time.monotonic() + 10.0
        for w in workers:
            w.close(wait=max(0.1, deadline - time.monotonic()))
        for _ in range(self.size):       # wake any thread still waiting for a slot: its
            self._idle.put(None)         # _new() then refuses (the pool is closed)
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None
        self._spawner.shutdown(wait=False)
        self._tmp.cleanup()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

