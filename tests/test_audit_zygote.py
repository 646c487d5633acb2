"""Workers forked from a zygote (fa4verify.run.zygote): the imports are paid once, each worker
is its own process with its own session, a killed worker is an error and is replaced by another
fork, a dead zygote makes the pool spawn workers instead, and the zygote never forks once CUDA
is initialised in it. CPU only (fixture checks; the zygote imports torch and, where installed,
FA4)."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

from fa4verify.run.pool import WorkerPool
from fa4verify.audit.registry import CheckContext, CheckResult, discover

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "audit_checks_pool.py")


@pytest.fixture(scope="module")
def specs():
    return {s.id: s for s in discover(modules=[FIX], include_package=False)}


def _ctx(spec):
    return CheckContext(dtype="bf16", arch="sm90", device="cpu", profile="quick", seed=0, check_id=spec.id)


def _run(pool, spec):
    """(result, notes, timing) of ``spec`` run whole in ``pool``; a dead worker or a closed pool
    as the engine reports it (an error naming why)."""
    from fa4verify.run.pool import PoolClosed, TaskDied
    try:
        payload, timing = pool.run(spec, _ctx(spec))
    except (TaskDied, PoolClosed) as e:
        return CheckResult(status="error", summary=str(e)), [], {}
    (_j, kind, result), = payload["outcomes"]
    assert kind == "result"
    return result, payload["notes"], timing


def test_forked_workers_are_separate_sessions_started_by_the_zygote(specs):
    sp = specs["fixture.pool.pid_a"]
    with WorkerPool(2, preload="cpu", start="fork") as pool:
        pool.prestart()
        got = [_run(pool, sp) for _ in range(2)]
        zpid = pool._zygote.proc.pid
        pids = {r.metrics["pid"] for r, _, _ in got}
        for r, _, t in got:
            assert r.status == "pass"
        firsts = [t for _, _, t in got if "worker_start" in t]
        assert firsts and all(t["worker_start"] == "fork" for t in firsts)
        assert zpid not in pids and os.getpid() not in pids
        for pid in pids:                       # each worker leads its own session (killpg-able)
            assert os.getsid(pid) == pid
        assert pool._zygote.ready and pool._zygote.ready["pid"] == zpid


def test_a_killed_forked_worker_is_an_error_and_the_next_check_gets_a_new_fork(specs):
    crash, ok = specs["fixture.pool.crash"], specs["fixture.pool.pid_a"]
    with WorkerPool(1, preload="cpu", start="fork") as pool:
        r0, _, _ = _run(pool, ok)
        r1, _, _ = _run(pool, crash)
        r2, _, t2 = _run(pool, ok)
        assert r0.status == "pass" and r2.status == "pass"
        assert r1.status == "error" and "SIGKILL" in r1.summary, r1.summary
        assert r2.metrics["pid"] != r0.metrics["pid"] and t2["worker_start"] == "fork"
        assert pool.started == 2


def test_a_dead_zygote_makes_the_pool_spawn_workers(specs):
    crash, ok = specs["fixture.pool.crash"], specs["fixture.pool.pid_a"]
    with WorkerPool(1, preload="cpu", start="fork") as pool:
        r0, _, t0 = _run(pool, ok)
        assert t0["worker_start"] == "fork"
        os.killpg(pool._zygote.proc.pid, signal.SIGKILL)
        pool._zygote.proc.wait()
        deadline = time.monotonic() + 10
        while pool._zygote.usable and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pool._zygote.usable
        r1, _, _ = _run(pool, crash)      # the forked worker dies now
        assert r1.status == "error"
        r2, _, t2 = _run(pool, ok)
        assert r2.status == "pass" and t2["worker_start"] == "spawned: zygote unusable"


def test_start_modes_and_the_environment_switch(monkeypatch):
    monkeypatch.delenv("FA4VERIFY_WORKER_START", raising=False)
    assert WorkerPool(1, preload="cuda").start == "fork"
    assert WorkerPool(1, preload="none").start == "spawn"
    monkeypatch.setenv("FA4VERIFY_WORKER_START", "spawn")
    assert WorkerPool(1, preload="cuda").start == "spawn"
    with pytest.raises(ValueError, match="start"):
        WorkerPool(1, start="thread")


def test_the_zygote_refuses_to_fork_with_cuda_initialised(monkeypatch):
    """The guard the zygote runs before every fork (a CUDA context does not survive fork)."""
    from fa4verify.run.worker import cuda_initialised

    class FakeCuda:
        @staticmethod
        def is_initialized():
            return True

    class FakeTorch:
        cuda = FakeCuda()

    monkeypatch.setitem(__import__("sys").modules, "torch", FakeTorch())
    assert cuda_initialised() is True
    monkeypatch.setitem(__import__("sys").modules, "torch", None)
    assert cuda_initialised() is False


def test_a_forked_worker_without_cuda_is_replaced_by_a_spawned_one(specs):
    """On this CPU box a worker that must preload CUDA has none: forked, that is a failed start
    (the zygote cannot give working GPU workers), so the pool spawns one and runs the check
    there; the check never sees the failure."""
    sp = specs["fixture.pool.pid_a"]
    with WorkerPool(1, preload="cuda", start="fork") as pool:
        r, _, t = _run(pool, sp)
        assert r.status == "pass", r.summary
        assert pool.start == "spawn" and "no CUDA device" in (pool.fork_failure or "")
        assert "no CUDA device" in t["fork_failed"] and t["worker_start"] == "spawn"


def test_the_zygote_environment_switches_and_their_restore(monkeypatch):
    """Note [Zygote environment]: the zygote gets QUACK_ARCH and the kernel cache's arch (from
    nvidia-smi) and the NVML availability check; a forked worker sees the parent's values again."""
    from fa4verify.run import pool as P
    monkeypatch.setattr(P, "_visible_compute_cap", lambda env: "90")
    z = P.zygote_env({"A": "1"})
    assert z["QUACK_ARCH"] == "90" and z["PYTORCH_NVML_BASED_CUDA_CHECK"] == "1" and z["A"] == "1"
    assert json.loads(z["FA4VERIFY_ZYGOTE_RESTORE"]) == {"QUACK_ARCH": None, "PYTORCH_NVML_BASED_CUDA_CHECK": None,
                                                         "FA4VERIFY_CACHE_ARCH": None}
    z2 = P.zygote_env({"QUACK_ARCH": "100", "PYTORCH_NVML_BASED_CUDA_CHECK": "0", "FA4VERIFY_CACHE_ARCH": "sm100"})
    assert z2["QUACK_ARCH"] == "100" and z2["PYTORCH_NVML_BASED_CUDA_CHECK"] == "0"
    assert json.loads(z2["FA4VERIFY_ZYGOTE_RESTORE"]) == {}
    monkeypatch.setattr(P, "_visible_compute_cap", lambda env: None)
    assert "QUACK_ARCH" not in P.zygote_env({})

    env_fix = os.path.join(os.path.dirname(__file__), "fixtures", "audit_checks_env.py")
    sp = {s.id: s for s in discover(modules=[env_fix], include_package=False)}["fixture.env.view"]
    monkeypatch.setattr(P, "_visible_compute_cap", lambda env: "90")
    monkeypatch.delenv("QUACK_ARCH", raising=False)
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    with WorkerPool(1, preload="cpu", start="fork") as pool:
        r, _, t = _run(pool, sp)
    assert t["worker_start"] == "fork"
    assert r.details["env"] == {"QUACK_ARCH": None, "PYTORCH_NVML_BASED_CUDA_CHECK": None,
                                "FA4VERIFY_ZYGOTE_RESTORE": None, "FA4VERIFY_FORKED": "1"}


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_closing_a_pool_whose_workers_are_still_starting_does_not_wait_for_them(start):
    """The CLI starts a GPU audit's workers before it knows whether any check needs one; a pool
    closed while they (or the zygote) are still importing must not wait for the imports."""
    pool = WorkerPool(2, preload="cpu", start=start)
    pool.prestart()
    time.sleep(0.2)
    t0 = time.monotonic()
    pool.close()
    assert time.monotonic() - t0 < 3.0


def test_two_lines_that_arrive_together_are_both_seen(specs, monkeypatch):
    """Review finding: a worker's start-up line and its first result can reach the pipe before
    the parent reads; a buffered readline took both and select then waited for a line already
    read (the check "timed out", or hung without a timeout). The parent is held back here until
    both messages (its "case" and its result) are in the pipe."""
    import multiprocessing.connection as mpc
    real = mpc.wait
    calls = []

    def late(objects, timeout=None):
        if len(calls) == 1:           # the wait after the start-up: the task has been sent
            time.sleep(4.0)           # the worker sends "case" and then its result meanwhile
        calls.append(1)
        return real(objects, timeout)

    sp = specs["fixture.pool.pid_a"]
    with WorkerPool(1, preload="none", start="spawn", timeout=20) as pool:
        pool.prestart()
        time.sleep(1.0)
        monkeypatch.setattr(mpc, "wait", late)
        t0 = time.monotonic()
        r, _, t = _run(pool, sp)
        assert r.status == "pass", r.summary
        assert time.monotonic() - t0 < 15 and len(calls) >= 2


def test_a_closed_pool_starts_no_worker(specs):
    sp = specs["fixture.pool.pid_a"]
    pool = WorkerPool(1, preload="none", start="spawn")
    pool.close()
    r, _, _ = _run(pool, sp)
    assert r.status == "error" and "closed" in r.summary and pool.started == 0


def test_the_zygote_names_the_kernel_cache_arch_without_asking_the_device(monkeypatch):
    """The kernel cache's arch directory (kernel_cache.arch_tag) asked torch for the device's
    capability, which initialised CUDA in the zygote: it then refused every fork and the H200
    audits spawned their workers. The zygote's environment names it (restored in the workers),
    and arch_tag reads it before it would touch the device."""
    import torch

    from fa4verify.kernels import kernel_cache
    from fa4verify.run import pool
    monkeypatch.setattr(pool, "_visible_compute_cap", lambda env: "90")
    assert pool.zygote_env({"PATH": "/bin"})[kernel_cache.ARCH_ENV] == "sm90"

    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: asked.append(a) or (10, 0))
    monkeypatch.delenv("CUTE_DSL_ARCH", raising=False)
    monkeypatch.setenv(kernel_cache.ARCH_ENV, "sm90")
    assert kernel_cache.arch_tag() == "sm90" and not asked
    monkeypatch.delenv(kernel_cache.ARCH_ENV)
    assert kernel_cache.arch_tag() == "sm100" and asked        # (the device is asked without it)


def test_the_zygote_writes_checked_hash_bytecode_under_the_prefix_while_idle(specs, tmp_path, monkeypatch):
    """Note [Bytecode cache]: with a prefix in effect, the idle zygote writes checked-hash
    bytecode for the modules it imported, under the prefix only."""
    import importlib.util
    prefix = tmp_path / "pycache"
    from fa4verify.run import bytecode
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(prefix))
    monkeypatch.setenv(bytecode.OURS, str(prefix))          # as bytecode.enable() leaves it
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    with WorkerPool(1, preload="cpu", start="fork") as pool:
        pool.prestart()
        _run(pool, specs["fixture.pool.pid_a"])
        src = importlib.util.find_spec("fa4verify.run.worker").origin
        rel = os.path.splitdrive(os.path.abspath(src))[1].lstrip(os.sep)
        want = prefix / os.path.dirname(rel)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not list(want.glob("worker.*.pyc")):
            time.sleep(0.2)
        pycs = list(want.glob("worker.*.pyc"))
    assert pycs, f"no bytecode under {want}"
    flags = int.from_bytes(pycs[0].read_bytes()[4:8], "little")
    assert flags == 0b11                 # PEP 552: hash-based (bit 0), checked (bit 1)


def test_the_idle_zygote_imports_what_workers_import_and_writes_its_bytecode(specs, tmp_path, monkeypatch):
    """Note [Idle imports]: with the bytecode cache on, the zygote, once no fork is asked for,
    imports the workers' other imports (scipy.stats, which no preload imports) and writes their
    checked-hash bytecode, so the next audit's workers read it."""
    import importlib.util
    import subprocess
    import sys
    from fa4verify.run import bytecode, worker
    assert "scipy.stats" in worker.IDLE_IMPORTS
    probe = subprocess.run([sys.executable, "-c", "import sys; from fa4verify.run import worker; "
                            "worker.preload('zygote'); print('scipy.stats' in sys.modules)"],
                           capture_output=True, text=True, timeout=300)
    assert probe.stdout.strip().splitlines()[-1] == "False", probe.stderr[-2000:]   # not preloaded
    prefix = tmp_path / "pycache"
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(prefix))
    monkeypatch.setenv(bytecode.OURS, str(prefix))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    src = importlib.util.find_spec("scipy.stats").origin
    rel = os.path.splitdrive(os.path.abspath(src))[1].lstrip(os.sep)
    want = prefix / os.path.dirname(rel)
    with WorkerPool(1, preload="cpu", start="fork") as pool:
        pool.prestart()
        _run(pool, specs["fixture.pool.pid_a"])
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not list(want.glob("__init__.*.pyc")):
            time.sleep(0.5)
        pycs = list(want.glob("__init__.*.pyc"))
    assert pycs, f"no bytecode for scipy.stats under {want}"
    assert int.from_bytes(pycs[0].read_bytes()[4:8], "little") == 0b11


def test_a_worker_imports_while_idle_and_stops_when_a_task_waits():
    """Note [Idle imports]: in order, until a task is waiting; a failing module is skipped."""
    import sys
    from fa4verify.run.worker import import_idle
    for m in ("colorsys", "wave"):
        sys.modules.pop(m, None)
    assert import_idle(lambda: True, ["colorsys", "wave"]) == []
    assert "colorsys" not in sys.modules
    assert import_idle(lambda: False, ["colorsys", "no_such_module_fa4v", "wave"]) == ["colorsys", "wave"]
    calls = iter([False, True])
    sys.modules.pop("colorsys", None)
    assert import_idle(lambda: next(calls), ["colorsys", "wave"]) == ["colorsys"]
