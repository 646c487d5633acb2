"""The engine's worker pool: isolated, persistent worker processes, forked from a zygote on the GPU.

:class:`WorkerPool` runs each task in an idle one of its long-lived workers (thread-safe: the engine
drives one thread per worker). A worker that dies, runs past the task's deadline (killed with its
process group) or returns an error is replaced, so a CUDA fault in one check never leaks into
another. A GPU worker's imports and CUDA context dominate its start, so every worker starts at once
(:meth:`WorkerPool.prestart`), forked on a GPU from a zygote that did the imports once
(:mod:`fa4verify.run.zygote`, Note [Zygote environment]); a pool that spawns instead says why in
the task's timing. Note [Worker isolation]: ``PR_SET_PDEATHSIG`` fires when the *thread* that
started the process ends, so one spawner thread that lives as long as the pool starts them all.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from fa4verify.audit.kernel_timing import RUN_DIR_ENV
from fa4verify.run.gpus import nvidia_smi
from fa4verify.run.worker import PRELOAD_ENV, build_request
from fa4verify.run.zygote import RESTORE_ENV

__all__ = ["WorkerPool", "worker_env", "KERNEL_CACHE_ENV", "TaskDied", "PoolClosed"]

#: FA4's own switches for its persistent (AOT) kernel cache (flash_attn/cute/cache_utils.py).
KERNEL_CACHE_ENV = ("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR")
#: the exit code of a forked worker whose zygote died before it could report the status
EXIT_UNKNOWN = -1000


def worker_env(*, kernel_cache: str | None, workers: int) -> dict[str, str]:
    """The environment of a worker process: this one's, without the working directory on
    ``PYTHONPATH`` (Note [Worker isolation]), FA4's persistent kernel cache on in ``kernel_cache``
    unless the caller set it (FA4 loads a cache entry under a shared ``flock`` and exports under
    the exclusive one: cache_utils.py), ``OMP_NUM_THREADS`` split between the workers."""
    env = dict(os.environ)
    cwd = os.path.realpath(os.getcwd())
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.realpath(p) != cwd]
    if path:
        env["PYTHONPATH"] = os.pathsep.join(path)
    else:
        env.pop("PYTHONPATH", None)
    if kernel_cache and not any(k in env for k in KERNEL_CACHE_ENV):
        os.makedirs(kernel_cache, exist_ok=True)
        env.update(zip(KERNEL_CACHE_ENV, ("1", kernel_cache)))
    if workers > 1 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // (workers + 1)))
    for k, v in HEAP_ENV.items():       # Note [Freed memory stays]
        env.setdefault(k, v)
    return env


#: Note [Freed memory stays]
#: ------------------------
#: The judge's arrays on the audit's long rows are 100 MB each (a 34k-key dK in float64), and it
#: makes dozens of temporaries per comparison and budget. glibc's malloc serves every block over
#: 32 MB with a fresh ``mmap`` and unmaps it on free, so each temporary is first touched page by
#: page (a fault and a zeroed page per 4 KiB): on the CPU, ``np.abs`` of such an array took 79 ms
#: against 3 ms for an in-place pass, and one comparison 0.53 s against 0.08 s with the heap kept
#: (``MALLOC_MMAP_MAX_=0``: every block from the heap, reused once freed;
#: ``MALLOC_TRIM_THRESHOLD_``: the heap's top returned to the system only past 2 GiB free), and
#: between tasks the worker hands back what the task freed (``worker.release_freed_memory``,
#: ``malloc_trim``): within a task its resident size is its peak, across tasks it is not. A
#: caller's own values win; other allocators ignore the variables.
HEAP_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2 ** 31 - 1)}


class TaskDied(Exception):
    """A task whose worker died or ran past its deadline: ``reason`` (one line), ``case`` (the
    index of the case it was running, None before the first), ``tail`` (its log), ``rc``."""

    def __init__(self, reason: str, case: int | None, tail: str, rc: int | None) -> None:
        super().__init__(reason)
        self.reason, self.case, self.tail, self.rc = reason, case, tail, rc


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
    return TaskDied(why, case, stderr_tail, rc)


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
    """The compute capability ("90") of the first GPU visible under ``env`` (its first
    ``CUDA_VISIBLE_DEVICES`` entry, passed to nvidia-smi as ``-i``), or None."""
    first = (env.get("CUDA_VISIBLE_DEVICES") or "").split(",")[0].strip()
    if "CUDA_VISIBLE_DEVICES" in env and (not first or first.startswith("-")):
        return None                       # "" or "-1": CUDA sees no GPU, whatever nvidia-smi lists
    rows = nvidia_smi("compute_cap", *(["-i", first] if first else []))
    m = re.fullmatch(r"(\d+)\.(\d+)", rows[0][0] if rows and rows[0] else "")
    return f"{int(m[1])}{int(m[2])}" if m else None


def zygote_env(env: dict[str, str]) -> dict[str, str]:
    """Note [Zygote environment]: the zygote runs with the workers' environment plus three switches
    that keep its imports off CUDA, which a forked child could not use again. ``import quack``
    (FA4's interface imports it) calls ``torch.cuda.is_available()`` and the device capability
    at import (quack/rmsnorm_config.py) unless ``QUACK_ARCH`` names the arch: it is set to the
    compute capability nvidia-smi reports for the first visible GPU (the value quack would have
    read from the device; FA4's own dispatch never reads it). The kernel cache names its arch
    directory from ``FA4VERIFY_CACHE_ARCH`` (``sm`` + that capability) instead of asking the device
    (measured on the H200: ``get_device_capability`` initialised CUDA in the zygote, which then
    refused every fork). ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` makes torch's availability check use
    NVML instead of initialising the driver. A switch is set only where the parent has none, so a
    forked worker unsets it first thing (``RESTORE_ENV``), and a worker whose CUDA context fails
    anyway is replaced by a spawned one."""
    from fa4verify.kernels.kernel_cache import ARCH_ENV
    z, cap = dict(env), _visible_compute_cap(env)
    if cap:
        z.setdefault("QUACK_ARCH", cap)
        z.setdefault(ARCH_ENV, f"sm{cap}")
    z.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    z[RESTORE_ENV] = json.dumps({k: None for k in ("QUACK_ARCH", ARCH_ENV, "PYTORCH_NVML_BASED_CUDA_CHECK")
                                 if k in z and k not in env})
    return z


class _Zygote:
    """The parent's end of a :mod:`fa4verify.run.zygote` process. ``usable`` is False once it died
    or refused to fork; the pool then spawns workers instead."""

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
        self.spawned, self.usable = time.time(), True
        self.ready: dict[str, Any] | None = None           #: {"ready": imports s, "start_s": spawn to ready}
        self._cond, self._send_lock = threading.Condition(), threading.Lock()
        self._forked: dict[int, dict[str, Any]] = {}       # fork request id -> {"pid"} or {"error"}
        self._exits: dict[int, int] = {}                   # pid -> exit code
        self._next = 0
        threading.Thread(target=self._read, name="fa4verify-zygote", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = self._ctl.recv(65536)
            except OSError:
                data = b""
            msg = json.loads(data) if data else {}
            with self._cond:
                self.usable = self.usable and bool(data) and "error" not in msg     # gone, or refused to fork
                if "ready" in msg:
                    self.ready = dict(msg, start_s=round(time.time() - self.spawned, 3))
                elif "forked" in msg:
                    self._forked[int(msg["forked"])] = msg
                elif "exit" in msg:
                    self._exits[int(msg["exit"])] = int(msg["rc"])
                self._cond.notify_all()
            if not data:
                return

    def fork(self, fds: tuple[int, int, int], env: dict[str, str]) -> int:
        """Ask for a worker on ``fds`` (its tasks, its replies, its log) with ``env`` set: the
        request id (the pid comes later: :meth:`pid`); OSError when the zygote is gone."""
        with self._send_lock:
            self._next += 1
            socket.send_fds(self._ctl, [json.dumps({"op": "fork", "id": self._next, "env": env}).encode()], list(fds))
            return self._next

    def pid(self, k: int, timeout: float | None = None) -> int:
        """The pid of fork request ``k``, waiting at most ``timeout`` s (the zygote's imports):
        TimeoutError when not forked yet, ProcessLookupError when it will not be."""
        with self._cond:
            if not self._cond.wait_for(lambda: k in self._forked or not self.usable, timeout):
                raise TimeoutError("the zygote has not forked this worker yet")
            got = self._forked.get(k, {})
        if "pid" not in got:
            raise ProcessLookupError(f"the zygote did not fork this worker: {self.why()}")
        return int(got["pid"])

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
        rc = self.proc.poll()
        try:
            with open(self.log_path, "rb") as f:
                tail = f.read()[-300:].decode("utf-8", "replace").strip().replace("\n", " | ")
        except OSError:
            tail = ""
        return err or f"zygote {'alive' if rc is None else f'exited rc={rc}'}" + (f"; log: {tail}" if tail else "")

    def close(self) -> None:
        """Stop the zygote at once (after its workers: they die with it)."""
        with contextlib.suppress(OSError):
            self._ctl.shutdown(socket.SHUT_RDWR)
        self._ctl.close()
        _kill(self.proc)
        self._log.close()


class _ForkedProc:
    """A worker forked by the zygote, with the part of ``subprocess.Popen``'s interface that
    :class:`_Worker` uses; its pid comes once the zygote has done its imports."""

    def __init__(self, zygote: _Zygote, k: int) -> None:
        self._z, self._k = zygote, k
        self.returncode: int | None = None

    def pid(self, timeout: float | None) -> int:
        return self._z.pid(self._k, timeout)

    def kill_now(self) -> None:
        """SIGKILL the worker, without waiting for a fork still pending in the zygote."""
        try:
            pid = self.pid(0.0)
        except (TimeoutError, ProcessLookupError):
            self.returncode = -signal.SIGKILL
            return
        # the process group first, then the pid itself: a child forked a moment ago may not
        # have called setsid() yet (its group does not exist)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
        rc = self._z.exit_code(pid, 2.0)
        self.returncode = -signal.SIGKILL if rc is None else rc

    def poll(self) -> int | None:
        try:
            return self.wait(0.0)
        except subprocess.TimeoutExpired:
            return None                                  # alive, or still to be forked

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                rc = self._z.exit_code(self.pid(timeout), timeout)
            except TimeoutError:
                rc = None
            except ProcessLookupError:
                rc = EXIT_UNKNOWN                        # never forked
            if rc is None:
                raise subprocess.TimeoutExpired("fa4verify worker", timeout)
            self.returncode = rc
        return self.returncode


class _Worker:
    """One serving worker process (spawned, or forked by the pool's zygote)."""

    def __init__(self, env: dict[str, str], tmp: str, n: int, zygote: _Zygote | None, pin: dict[str, str]) -> None:
        self.spawned = time.time()
        self.ready: dict[str, Any] | None = None     #: {"ready": preload s, "steps", "start_s": spawn to ready}
        self.log_path = os.path.join(tmp, f"worker{n}.log")
        self._log = open(self.log_path, "ab")
        self.forked, self.fork_error, self.seq = False, None, 0
        self.gpu = pin.get("CUDA_VISIBLE_DEVICES")      #: the GPU ``pin`` puts it on (``WorkerPool(gpus=)``)
        (r, w), (sr, sw) = os.pipe(), os.pipe()        # its replies; its tasks (its stdin if spawned)
        self._replies, self._tasks = Connection(r, writable=False), Connection(sw, readable=False)
        try:
            if zygote is not None:
                try:
                    self.proc: Any = _ForkedProc(zygote, zygote.fork((sr, w, self._log.fileno()), pin))
                    self.forked = True
                except OSError as e:          # spawned instead; the reason goes in its timing
                    self.fork_error = f"the zygote could not be asked: {e!r}"
            if not self.forked:
                self.proc = subprocess.Popen(
                    [sys.executable, "-P", "-m", "fa4verify.run.worker", "--serve", "--reply-fd", str(w)],
                    stdin=sr, stdout=self._log, stderr=self._log, env=env, pass_fds=(w,), start_new_session=True)
        finally:
            os.close(w)
            os.close(sr)

    def kill(self) -> None:
        """SIGKILL the worker; its tasks pipe is closed too (a fork still pending reads EOF, exits)."""
        self._tasks.close()
        _kill(self.proc)

    def _stop(self, wait: float) -> int | None:
        """The worker's exit code, killed if it has not exited within ``wait`` s."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=wait)
        if self.proc.returncode is None:
            self.kill()
        return self.proc.returncode

    def run(self, req: dict[str, Any], timeout: float) -> tuple[dict[str, Any], dict[str, Any]]:
        """The worker's ``({"outcomes", "notes", "timing"}, timing)`` for one task; :class:`TaskDied`
        (gone, or killed past ``timeout``), :class:`_ForkFailed` (a forked worker did not start)."""
        self.seq += 1
        offset = os.path.getsize(self.log_path)
        first, t_asked, case = self.ready is None, time.time(), None
        # one deadline for the whole task, the worker's start-up included
        deadline = time.monotonic() + timeout if timeout and timeout > 0 else None

        def died(timed_out: bool, wait: float = 0.0) -> TaskDied:
            if timed_out:
                self.kill()
            rc = self._stop(wait)
            with open(self.log_path, "rb") as f:         # its stderr during the task
                f.seek(offset)
                return _died(rc, timed_out, timeout, f.read()[-4000:].decode("utf-8", "replace"), case)

        def read() -> dict[str, Any]:
            """The worker's next message (its start-up recorded)."""
            try:
                ok = self._replies.poll(None if deadline is None else max(0.0, deadline - time.monotonic()))
                msg = self._replies.recv() if ok else None
            except (EOFError, OSError):
                msg = {}
            if msg == {} and self.forked and self.ready is None:    # refused by the zygote, or died starting
                try:
                    self.proc.pid(2.0)           # its answer may trail the closed pipe
                except (TimeoutError, ProcessLookupError) as e:
                    raise _ForkFailed(str(e)) from None
                raise _ForkFailed("the forked worker exited before it was ready")
            if not msg:        # None: past the deadline; {}: the worker is gone
                raise died(msg is None, 10)
            if "ready" in msg:
                self.ready = dict(msg, start_s=round(float(msg.pop("wall", time.time())) - self.spawned, 3))
            return msg
        if first:               # its start-up, before the task is sent
            errs = read().get("errors") or {}
            if self.forked and "cuda_context" in errs:
                raise _ForkFailed(f"no CUDA context in the forked worker: {errs['cuda_context']}")
        try:
            self._tasks.send(req)
        except (OSError, ValueError):
            raise died(False, 5) from None
        while "done" not in (msg := read()):
            if "case" in msg:
                case = int(msg["case"])
        payload, timing = msg["done"], dict(msg["done"].get("timing") or {})
        if first:               # worker_wait_s: how long the task waited for the start-up
            start_s = self.ready["start_s"]
            timing.update(worker_start_s=start_s, worker_wait_s=round(max(0.0, self.spawned + start_s - t_asked), 3),
                          preload=self.ready.get("steps", {}),
                          worker_start="fork" if self.forked else (self.fork_error or "spawn"))
            if self.forked and self.proc._z.ready:
                timing["zygote_ready_s"] = self.proc._z.ready.get("start_s")
        return payload, timing

    def ask_exit(self) -> None:
        """Tell an idle worker to exit (it does at once: no interpreter teardown)."""
        if self.proc.poll() is None and not self._tasks.closed:
            with contextlib.suppress(OSError, ValueError):
                self._tasks.send(None)
            self._tasks.close()

    def close(self, wait: float = 10.0) -> None:
        self.ask_exit()
        self._stop(wait)
        self._tasks.close()
        self._replies.close()
        self._log.close()


class WorkerPool:
    """Up to ``size`` workers shared by the isolated tasks of one audit (``fresh``: a new one for
    every task). ``gpus`` (``--gpus``): ``CUDA_VISIBLE_DEVICES`` entries, each new worker on the
    one with the fewest live workers. ``start``: "fork" (from a zygote), "spawn", or "auto": fork
    when the workers preload CUDA, unless ``FA4VERIFY_WORKER_START`` says otherwise."""

    def __init__(self, size: int = 1, *, timeout: float = 0.0, fresh: bool = False,
                 kernel_cache: str | None = None, preload: str = "none",
                 start: str = "auto", gpus: list[str] | None = None) -> None:
        if size < 1:
            raise ValueError(f"WorkerPool size {size} < 1")
        for name, v, ok in (("preload", preload, ("cuda", "cpu", "none")), ("start", start, ("auto", "fork", "spawn"))):
            if v not in ok:
                raise ValueError(f"WorkerPool {name} {v!r}: expected one of {', '.join(ok)}")
        env_start = os.environ.get("FA4VERIFY_WORKER_START", "").strip().lower()
        if start == "auto":
            start = env_start if env_start in ("fork", "spawn") else ("fork" if preload == "cuda" else "spawn")
        self.start = start
        self._zygote: _Zygote | None = None
        #: why forked workers were given up for spawned ones (None while forking works)
        self.fork_failure: str | None = None
        self._closed = False
        self.size, self.timeout, self.fresh, self.kernel_cache = size, timeout, fresh, kernel_cache
        self.gpus = list(gpus) if gpus else None
        self.created = time.time()        #: wall clock of the pool's creation (report phases)
        self.env = worker_env(kernel_cache=kernel_cache, workers=size)
        self.env.setdefault(PRELOAD_ENV, preload)
        self._tmp = tempfile.TemporaryDirectory(prefix="fa4verify-workers-")
        # what the workers of this pool share (compile locks: fa4verify.audit.kernel_timing)
        self.env[RUN_DIR_ENV] = os.path.join(self._tmp.name, "shared")
        os.makedirs(self.env[RUN_DIR_ENV])
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
            z, pin = None, {}
            if self.gpus:
                live = [w.gpu for w in self._all if w.proc.poll() is None]
                gpu = min(self.gpus, key=lambda g: (live.count(g), self.gpus.index(g)))
                pin = {"CUDA_VISIBLE_DEVICES": gpu, "FA4VERIFY_GPU_INDEX": str(self.gpus.index(gpu))}
            env = {**self.env, **pin}
            if own_env is not None:        # a task with its own environment: a spawned worker
                env = {k: v for k, v in {**env, **own_env}.items() if v is not None}
            elif self.start == "fork":
                if self._zygote is None:
                    try:
                        self._zygote = _Zygote(self.env, self._tmp.name)
                    except OSError:
                        self.start = "spawn"
                z = self._zygote if self.start == "fork" and self._zygote.usable else None
            w = _Worker(env, self._tmp.name, self.started, z, pin)
            if own_env is None and self.start == "fork" and z is None:   # why a forking pool spawned
                w.fork_error = w.fork_error or "spawned: zygote unusable"
            self._all.add(w)
        return w

    @classmethod
    def for_audit(cls, config: Any, size: int | None = None, gpus: list[str] | None = None) -> "WorkerPool":
        """The pool of an audit (``config``: :class:`~fa4verify._options.AuditConfig`), preloading
        CUDA on a GPU, every worker started now (:meth:`prestart`)."""
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
        """When (s after ``t0``, wall clock) the pool was made and its zygote ready: report phases."""
        out = {"pool_created": round(self.created - t0, 3)}
        z = self._zygote
        if z is not None and z.ready is not None:
            out["zygote_ready"] = round(z.spawned + float(z.ready["start_s"]) - t0, 3)
        return out

    def _take_idle(self) -> list[_Worker | None]:
        """Every slot now idle, taken out of the queue."""
        slots = []
        with contextlib.suppress(queue.Empty):
            while True:
                slots.append(self._idle.get_nowait())
        return slots

    def prestart(self) -> int:
        """Start every idle slot's worker now, start-ups overlapping each other and the caller: how many."""
        slots, new = self._take_idle(), 0
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
        """``(payload, timing)`` of one task (``cases`` of ``spec``, or the whole check) within
        ``timeout`` s (default: the pool's; 0: none); :class:`TaskDied`, :class:`PoolClosed`."""
        return self._run(build_request(spec, ctx, cases), timeout, None)

    def call(self, target: str, payload: Any, *, env: dict[str, str | None] | None = None,
             timeout: float | None = None) -> Any:
        """``function(payload)`` of ``target`` ("module:function") as :meth:`run`, its exception
        a ``RuntimeError``; with ``env`` (None: unset) in a fresh worker of its own."""
        out, _ = self._run({"call": target, "payload": payload}, timeout, env)
        (_j, kind, v), = out["outcomes"]
        if kind == "error":
            raise RuntimeError(f"{v[0]}\n{v[1]}")
        return v

    def _run(self, req: dict[str, Any], timeout: float | None, env: dict | None
             ) -> tuple[dict[str, Any], dict[str, Any]]:
        """One task in an idle worker (one of its own with ``env``), kept unless it died or erred."""
        timeout = self.timeout if timeout is None else timeout
        if self._closed:
            raise PoolClosed("the worker pool is closed (the audit was interrupted)")
        w = self._new(env) if env is not None else self._idle.get()
        keep = False
        try:
            if env is None and w is not None and w.proc.poll() is not None:
                self._discard(w)            # it died while idle
                w = None
            w = w or self._new()
            try:
                payload, timing = w.run(req, timeout)
            except _ForkFailed as e:
                # the zygote cannot give working workers here: spawn them from now on (the
                # check itself never sees this) -- unless the pool was closed meanwhile
                with contextlib.suppress(Exception):
                    w.kill()
                self._discard(w)
                w = None
                if self._closed:
                    raise PoolClosed("the worker pool was closed before this task ran") from None
                self.fork_failure, self.start = str(e), "spawn"
                w = self._new()
                payload, timing = w.run(req, timeout)
                timing["fork_failed"] = str(e)
            # a fault may have left the CUDA context unusable: that worker goes
            keep = env is None and not self.fresh and not any(
                k == "error" or (k == "result" and v.status == "error") for _j, k, v in payload["outcomes"])
            return payload, timing
        finally:
            if w is not None and not keep:
                self._discard(w)
            if env is None:
                self._idle.put(w if keep else None)

    def _discard(self, w: _Worker) -> None:
        w.close()
        with self._lock:
            self._all.discard(w)

    def close(self) -> None:
        """Stop every worker: idle ones cleanly, busy ones (an interrupted audit) killed. No
        worker starts after this (a task that reaches the pool then gets :class:`PoolClosed`)."""
        with self._lock:
            self._closed = True
            idle = {id(w) for w in self._take_idle() if w is not None}
            workers, self._all = list(self._all), set()
        for w in workers:          # every worker at once: their exits overlap
            if id(w) not in idle or w.seq == 0:
                # busy (an interrupted audit), or never given a task (it may still be in its
                # start-up, which would not read an exit request for seconds)
                w.kill()
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
