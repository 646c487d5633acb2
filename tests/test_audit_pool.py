"""The audit's worker pool (fa4verify.run.pool): persistent workers reused across checks,
side-by-side execution, a dead worker replaced, FA4's kernel cache handed to workers, reports in
selection order, and the option errors (one line, exit 2). CPU only: fixture checks, isolated
with ``--isolate always``."""
from __future__ import annotations

import ast
import json
import os
import pathlib

import pytest

from fa4verify.cli import main

FIX = os.path.join(os.path.dirname(__file__), "fixtures")
POOL = os.path.join(FIX, "audit_checks_pool.py")
ROOT = pathlib.Path(__file__).resolve().parents[1]


def audit(tmp_path, *args: str) -> tuple[int, dict]:
    j = tmp_path / "a.json"
    code = main(["audit", "--no-default-checks", "--no-live", "--checks-module", POOL,
                 "--isolate", "always", "--json", str(j), *args])
    with open(j) as f:
        rep = json.load(f)
    return code, rep


def by_id(rep: dict) -> dict:
    return {r["id"]: r for r in rep["results"]}


def test_one_persistent_worker_runs_every_check(tmp_path):
    code, rep = audit(tmp_path, "-k", "pid", "--workers", "1")
    r = by_id(rep)
    assert code == 0
    assert r["fixture.pool.pid_a"]["metrics"]["pid"] == r["fixture.pool.pid_b"]["metrics"]["pid"]
    assert r["fixture.pool.pid_a"]["isolated"] and r["fixture.pool.pid_b"]["isolated"]


def test_fresh_workers_start_one_process_per_check(tmp_path):
    code, rep = audit(tmp_path, "-k", "pid", "--workers", "1", "--fresh-workers")
    r = by_id(rep)
    assert code == 0
    assert r["fixture.pool.pid_a"]["metrics"]["pid"] != r["fixture.pool.pid_b"]["metrics"]["pid"]


def test_two_workers_run_checks_side_by_side(tmp_path):
    meet = tmp_path / "meet"
    meet.mkdir()
    code, rep = audit(tmp_path, "-k", "meet", "--workers", "2", "--opt", f"meet={meet}")
    r = by_id(rep)
    assert r["fixture.pool.meet_a"]["status"] == "pass", r["fixture.pool.meet_a"]["summary"]
    assert r["fixture.pool.meet_b"]["status"] == "pass"
    assert code == 0


def test_one_worker_runs_them_one_after_another_so_they_never_meet(tmp_path):
    """The same rendezvous fails with one worker (so the test above can fail)."""
    meet = tmp_path / "meet"
    meet.mkdir()
    code, rep = audit(tmp_path, "-k", "meet", "--workers", "1", "--opt", f"meet={meet}",
                      "--opt", "meet_timeout=1")
    statuses = sorted(r["status"] for r in rep["results"])
    assert statuses == ["fail", "pass"] and code == 1


def test_a_killed_worker_is_an_error_and_a_new_worker_runs_the_rest(tmp_path):
    code, rep = audit(tmp_path, "-k", "crash or zlast or pid_a", "--workers", "1")
    r = by_id(rep)
    assert r["fixture.pool.crash"]["status"] == "error"
    assert "SIGKILL" in r["fixture.pool.crash"]["summary"]
    assert r["fixture.pool.zlast"]["status"] == "pass"
    assert r["fixture.pool.pid_a"]["status"] == "pass"
    # cost order: crash (3) runs before pid_a (1) and zlast (0); both after it in a new process
    assert r["fixture.pool.zlast"]["metrics"]["pid"] == r["fixture.pool.pid_a"]["metrics"]["pid"]
    assert code == 3


def test_reports_keep_selection_order_whatever_order_checks_finished(tmp_path):
    code, rep = audit(tmp_path, "-k", "pid or zlast or crash", "--workers", "1")
    ids = [x["id"] for x in rep["results"]]
    assert ids == sorted(ids, key=["fixture.pool.pid_a", "fixture.pool.pid_b",
                                   "fixture.pool.crash", "fixture.pool.zlast"].index)


def test_workers_get_fa4s_kernel_cache_unless_off(tmp_path, monkeypatch):
    for k in ("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"):
        monkeypatch.delenv(k, raising=False)
    cache = tmp_path / "kc"
    code, rep = audit(tmp_path, "-k", "pid_a", "--kernel-cache", str(cache))
    env = by_id(rep)["fixture.pool.pid_a"]["details"]["env"]
    assert env == {"FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "1",
                   "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": str(cache)}
    assert cache.is_dir()
    code, rep = audit(tmp_path, "-k", "pid_a", "--kernel-cache", "off")
    env = by_id(rep)["fixture.pool.pid_a"]["details"]["env"]
    assert env == {"FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": None,
                   "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": None}


def test_a_users_own_fa4_cache_setting_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "0")
    monkeypatch.delenv("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", raising=False)
    code, rep = audit(tmp_path, "-k", "pid_a", "--kernel-cache", str(tmp_path / "kc"))
    env = by_id(rep)["fixture.pool.pid_a"]["details"]["env"]
    assert env["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] == "0"
    assert env["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"] is None


@pytest.mark.parametrize("args, msg", [
    (["--workers", "0"], "--workers '0': expected 1..64 or auto"),
    (["--workers", "two"], "--workers 'two': expected a positive integer or auto"),
    (["--kernel-cache", ""], "--kernel-cache '': expected a directory, auto or off"),
])
def test_bad_pool_options_are_one_line_usage_errors(tmp_path, capsys, args, msg):
    code = main(["audit", "--no-default-checks", "--no-live", "--checks-module", POOL, *args])
    err = capsys.readouterr().err
    assert code == 2
    assert msg in err and "Traceback" not in err


def test_a_kernel_cache_that_is_a_file_is_a_usage_error(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    code = main(["audit", "--no-default-checks", "--no-live", "--checks-module", POOL,
                 "--kernel-cache", str(f)])
    assert code == 2 and "exists and is not a directory" in capsys.readouterr().err
    assert f.read_text() == "x"


def test_auto_workers_rule():
    from fa4verify._options import auto_workers
    assert auto_workers("cpu", 64) == 2      # the 2-core development box: 2
    assert auto_workers("cpu", 1) == 1
    assert auto_workers("cuda", 1) == 1
    assert auto_workers("cuda", 2) == 1
    assert auto_workers("cuda", 8) == 7
    assert auto_workers("cuda", 16) == 15    # the 16-core H200 box
    assert auto_workers("cuda", 128) == 15


def _imports(path: pathlib.Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_the_engine_never_imports_the_audit_runner():
    """The engine (fa4verify/run) is below the audit: the runner calls it, never the reverse."""
    run_dir = ROOT / "fa4verify" / "run"
    for f in run_dir.glob("*.py"):
        assert "fa4verify.audit.runner" not in _imports(f), f
    assert "fa4verify.run.worker" not in _imports(ROOT / "fa4verify" / "audit" / "runner.py")


_HEAP_PROBE = r"""
import numpy as np
a = np.ones(8 << 20)                       # 64 MiB: past glibc's largest mmap threshold
addr = a.ctypes.data
for line in open("/proc/self/maps"):
    lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
    if lo <= addr < hi:
        print("heap" if line.rstrip().endswith("[heap]") else "mapping")
"""


@pytest.mark.skipif(not (os.path.exists("/proc/self/maps") and __import__("platform").libc_ver()[0] == "glibc"),
                    reason="needs Linux with glibc (the variables are glibc malloc's)")
def test_workers_keep_freed_memory_on_the_heap(monkeypatch):
    """Note [Freed memory stays]: a worker's large arrays come from the heap (reused once freed),
    not from a fresh mapping each; a caller's own setting wins."""
    import subprocess
    import sys
    from fa4verify.run.pool import HEAP_ENV, worker_env
    for k in HEAP_ENV:
        monkeypatch.delenv(k, raising=False)
    env = worker_env(kernel_cache=None, workers=2)
    assert all(env[k] == v for k, v in HEAP_ENV.items())
    run = lambda e: subprocess.run([sys.executable, "-c", _HEAP_PROBE], env=e, capture_output=True,  # noqa: E731
                                   text=True, check=True).stdout.strip()
    assert run(env) == "heap"
    assert run({k: v for k, v in env.items() if k not in HEAP_ENV}) == "mapping"
    monkeypatch.setenv("MALLOC_MMAP_MAX_", "7")
    assert worker_env(kernel_cache=None, workers=2)["MALLOC_MMAP_MAX_"] == "7"


@pytest.mark.skipif(not (os.path.exists("/proc/self/status") and __import__("platform").libc_ver()[0] == "glibc"),
                    reason="needs Linux with glibc (malloc_trim is glibc's)")
def test_a_worker_hands_back_what_a_task_freed(monkeypatch):
    """Note [Freed memory stays]: with the heap kept, a freed 256 MiB stays resident until the
    worker's between-task trim returns it."""
    import subprocess
    import sys
    from fa4verify.run.pool import HEAP_ENV, worker_env
    for k in HEAP_ENV:
        monkeypatch.delenv(k, raising=False)
    code = (
        "import numpy as np\n"
        "from fa4verify.run.worker import release_freed_memory\n"
        "def rss():\n"
        "    return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1]) // 1024\n"
        "a = np.ones(32 << 20); del a\n"
        "kept = rss()\n"
        "assert release_freed_memory()\n"
        "print(kept, rss())\n")
    out = subprocess.run([sys.executable, "-c", code], env=worker_env(kernel_cache=None, workers=2),
                         capture_output=True, text=True, check=True).stdout.split()
    kept, after = int(out[0]), int(out[1])
    assert kept - after > 200, (kept, after)       # MiB
