"""Note [One compile per key per audit] (fa4verify.audit.kernel_timing): two workers of one audit
that miss the same FA4 key compile it once; the other waits and loads the export. CPU test: a fake
persistent cache (files in a directory, a "compile" that sleeps) in two real processes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from fa4verify.audit import kernel_timing as kt

_SCRIPT = textwrap.dedent('''
    import json, os, sys, time
    from fa4verify.audit import kernel_timing as kt

    class Persistent:                      # FA4's JITPersistentCache, as far as the proxy sees it
        def __init__(self, d):
            self.d, self.mem = d, {}
        def _try_load_from_storage(self, key):
            return os.path.exists(os.path.join(self.d, key))
        def __contains__(self, key):
            if key in self.mem:
                return True
            if self._try_load_from_storage(key):
                time.sleep(0.01)
                self.mem[key] = "loaded"
                return True
            return False
        def __getitem__(self, key):
            return self.mem[key]
        def __setitem__(self, key, fn):
            self.mem[key] = fn
            with open(os.path.join(self.d, key), "w") as f:
                f.write(fn)

    c = kt.TimedCache(Persistent(sys.argv[1]), "fake")
    open(sys.argv[2] + "." + str(os.getpid()), "w").close()     # ready: everything imported
    while not os.path.exists(sys.argv[2]):    # start together
        time.sleep(0.01)
    before = kt.snapshot()
    if "K" not in c:
        time.sleep(1.0)                        # the compile
        c["K"] = "compiled"
    print(json.dumps(dict(kt.delta(before), value=c["K"], events=[e[0] for e in kt.events_since(before)])))
''')


def _run_two(tmp_path, run_dir: str | None) -> list[dict]:
    store = tmp_path / "store"
    store.mkdir()
    go = tmp_path / "go"
    env = dict(os.environ)
    env.pop(kt.RUN_DIR_ENV, None)
    if run_dir is not None:
        env[kt.RUN_DIR_ENV] = run_dir
    procs = [subprocess.Popen([sys.executable, "-c", _SCRIPT, str(store), str(go)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    import time
    t0 = time.monotonic()
    while len(list(tmp_path.glob("go.*"))) < 2 and time.monotonic() - t0 < 60:   # both imported
        time.sleep(0.01)
    go.write_text("")
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


def test_two_workers_that_miss_one_key_compile_it_once(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    outs = _run_two(tmp_path, str(run))
    assert sorted(o["compiles"] for o in outs) == [0, 1]
    waiter = next(o for o in outs if o["compiles"] == 0)
    assert waiter["waits"] == 1 and waiter["loads"] == 1 and waiter["value"] == "loaded"
    assert 0.5 < waiter["wait_s"] < 30 and waiter["events"] == ["wait", "load"]


def test_without_a_run_directory_both_compile_as_before(tmp_path):
    outs = _run_two(tmp_path, None)
    assert [o["compiles"] for o in outs] == [1, 1] and all(o["waits"] == 0 for o in outs)


def test_an_in_memory_cache_takes_no_lock_and_locks_are_released(tmp_path, monkeypatch):
    monkeypatch.setenv(kt.RUN_DIR_ENV, str(tmp_path))

    class Mem(dict):
        pass
    c = kt.TimedCache(Mem(), "mem")
    assert "k" not in c and not kt._held             # no persistence: nothing to wait for
    assert not (tmp_path / "compile-locks").exists()

    class Persistent(dict):
        def _try_load_from_storage(self, key):
            return False
    p = kt.TimedCache(Persistent(), "per")
    assert "k" not in p and len(kt._held) == 1        # held from the miss ...
    p["k"] = "fn"
    assert not kt._held                               # ... to the store
    assert "j" not in p and len(kt._held) == 1
    kt.release_compile_locks()                        # a compile FA4 gave up on: the item's end
    assert not kt._held


def test_a_lock_of_a_dead_compiler_is_free(tmp_path):
    """The lock is an flock: a worker that dies mid-compile releases it with its descriptors."""
    pytest.importorskip("fcntl")
    run = tmp_path / "run"
    (run / "compile-locks").mkdir(parents=True)
    path = run / "compile-locks" / f"fake-{kt.key_digest('K')}.lock"
    p = subprocess.run([sys.executable, "-c", f"import fcntl, os; fd = os.open({str(path)!r}, os.O_CREAT | os.O_RDWR); "
                        "fcntl.flock(fd, fcntl.LOCK_EX); os._exit(0)"], timeout=30)
    assert p.returncode == 0
    import fcntl
    fd = os.open(path, os.O_RDWR)
    try:
        assert kt._try_flock(fd, fcntl)
    finally:
        os.close(fd)


def test_a_filesystem_without_flock_compiles_at_once(tmp_path, monkeypatch):
    """flock failing for another reason than a held lock (ENOLCK) is no lock to wait for."""
    import errno
    import fcntl
    import time
    monkeypatch.setenv(kt.RUN_DIR_ENV, str(tmp_path))

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "no locks available")
    monkeypatch.setattr(fcntl, "flock", no_locks)

    class Persistent(dict):
        def _try_load_from_storage(self, key):
            return False
    c = kt.TimedCache(Persistent(), "per")
    before = kt.snapshot()
    t0 = time.perf_counter()
    assert "k" not in c
    assert time.perf_counter() - t0 < 1.0 and not kt._held and kt.delta(before)["waits"] == 0


def test_a_lookup_that_raises_under_the_lock_releases_it(tmp_path, monkeypatch):
    monkeypatch.setenv(kt.RUN_DIR_ENV, str(tmp_path))

    class Flaky(dict):
        calls = 0

        def _try_load_from_storage(self, key):
            return False

        def __contains__(self, key):
            Flaky.calls += 1
            if Flaky.calls == 2:             # the re-check under the lock: FA4's own lock timed out
                raise RuntimeError("FileLock timeout")
            return False
    c = kt.TimedCache(Flaky(), "flaky")
    with pytest.raises(RuntimeError, match="FileLock"):
        "k" in c
    assert not kt._held
    import fcntl
    path = tmp_path / "compile-locks" / f"flaky-{kt.key_digest('k')}.lock"
    fd = os.open(path, os.O_RDWR)
    try:
        assert kt._try_flock(fd, fcntl)      # free for the next worker
    finally:
        os.close(fd)
