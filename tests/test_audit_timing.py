"""Where the audit's seconds go (issue #17): FA4's compile caches counted by a forwarding proxy
(fa4verify.audit.kernel_timing), workers that start before their first item and say what the
start cost, and per work item timing in the report (``CheckRecord.timing``) that the speed
benchmark reads. CPU only: a fake compile cache and fixture checks."""
from __future__ import annotations

import json
import os
import time

import pytest

from fa4verify.audit import kernel_timing as kt
from fa4verify.cli import main

FIX = os.path.join(os.path.dirname(__file__), "fixtures")
POOL = os.path.join(FIX, "audit_checks_pool.py")


class FakeCache:
    """FA4's JITPersistentCache in miniature: ``in`` loads a key from 'disk' (slowly)."""

    def __init__(self, disk=()):
        self.mem, self.disk, self.cleared = {}, set(disk), 0

    def __contains__(self, key):
        if key in self.mem:
            return True
        if key in self.disk:
            time.sleep(0.01)
            self.mem[key] = f"loaded {key}"
            return True
        return False

    def __getitem__(self, key):
        return self.mem[key]

    def __setitem__(self, key, fn):
        self.mem[key] = fn

    def clear(self):
        self.cleared += 1
        self.mem.clear()


def _use(cache, key, compile_s=0.02):
    """What FA4's interface does with its cache for one call."""
    if key not in cache:
        time.sleep(compile_s)
        cache[key] = f"compiled {key}"
    return cache[key]


def test_proxy_counts_compiles_loads_and_hits_and_forwards_everything():
    inner = FakeCache(disk={"b"})
    c = kt.TimedCache(inner, "fake")
    before = kt.snapshot()
    assert _use(c, "a") == "compiled a"          # a miss: compiled
    assert _use(c, "a") == "compiled a"          # in memory: a hit
    assert _use(c, "b") == "loaded b"            # from disk: a load
    assert _use(c, "b") == "loaded b"            # then a hit
    d = kt.delta(before)
    assert (d["compiles"], d["loads"], d["hits"]) == (1, 1, 2)
    assert 0.015 < d["compile_s"] < 1.0 and 0.005 < d["load_s"] < 1.0
    ev = kt.events_since(before)                 # Note [Compile keys in the timeline]
    assert [(e[0], e[1], e[2]) for e in ev] == [("compile", "fake", kt.key_digest("a")),
                                                ("load", "fake", kt.key_digest("b"))]
    assert ev[0][4] == "'a'" and ev[1][4] == "" and ev[0][3] >= 0.015
    assert kt.key_digest(("x", 1)) == kt.key_digest(("x", 1)) != kt.key_digest(("x", 2))
    assert kt.keys_used_since(before) == [["fake", kt.key_digest("a")], ["fake", kt.key_digest("b")]]
    c.clear()                                    # other attributes reach the real cache
    assert inner.cleared == 1 and "a" not in inner.mem


@pytest.mark.fa4
def test_install_wraps_fa4s_caches_without_changing_their_entries():
    from fa4verify.kernels.adapter import interface_module
    fa = interface_module()
    names = kt.install()
    assert "_flash_attn_fwd" in names and "_flash_attn_bwd" in names
    assert isinstance(fa._flash_attn_fwd.compile_cache, kt.TimedCache)
    assert kt.install() == names                 # idempotent: never a proxy of a proxy
    assert not isinstance(fa._flash_attn_fwd.compile_cache._inner, kt.TimedCache)


def test_workers_start_before_their_first_item_and_every_item_is_timed(tmp_path):
    j = tmp_path / "a.json"
    code = main(["audit", "--no-default-checks", "--no-live", "--checks-module", POOL,
                 "--isolate", "always", "--workers", "2", "-k", "pid", "--json", str(j)])
    rep = json.loads(j.read_text())
    assert code == 0
    timings = [t for r in rep["results"] for t in r["timing"]]
    assert len(timings) == len(rep["results"]) == 2
    for t in timings:
        assert 0.0 <= t["start_s"] <= t["end_s"]
        assert t["exec_s"] >= 0.0 and t["compiles"] == 0 and isinstance(t["pid"], int)
    firsts = [t for t in timings if "worker_start_s" in t]
    assert firsts, "a worker's first item carries its start-up"
    assert all(t["worker_start_s"] > 0 and t["worker_wait_s"] >= 0 for t in firsts)


def test_prestart_starts_every_slot_once():
    from fa4verify.run.pool import WorkerPool
    t0 = time.time()
    with WorkerPool(2) as pool:
        assert pool.prestart() == 2 and pool.started == 2
        assert pool.prestart() == 0 and pool.started == 2
        st = pool.start_times(t0)        # spawned workers: no zygote to report
        assert set(st) == {"pool_created"} and 0.0 <= st["pool_created"] < 5.0
    with WorkerPool(2, fresh=True) as pool:      # fresh workers start early too (one task each)
        assert pool.prestart() == 2 and pool.started == 2
    with pytest.raises(ValueError, match="preload"):
        WorkerPool(1, preload="gpu")


def test_preload_reports_its_steps():
    from fa4verify.run.worker import preload
    assert preload("none") == {}
    steps = preload("cpu")
    assert set(steps) == {"torch", "judge"} and all(v >= 0 for v in steps.values())


def test_benchmark_timeline_reads_the_timing(tmp_path):
    """benchmarks/gpu_audit_time.py's timeline: start-ups, compiles and the critical item."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "gat", os.path.join(os.path.dirname(__file__), "..", "benchmarks", "gpu_audit_time.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    rep = {"results": [
        {"id": "a", "isolated": True, "details": {}, "timing": [
            {"start_s": 1.0, "end_s": 9.0, "exec_s": 6.0, "compiles": 2, "compile_s": 4.0, "loads": 0,
             "load_s": 0.0, "pid": 11, "worker_start_s": 3.0, "worker_wait_s": 2.0,
             "preload": {"torch": 1.0}}]},
        {"id": "b", "isolated": True, "details": {"shards": [{}, {}]}, "timing": [
            {"start_s": 1.0, "end_s": 4.0, "exec_s": 1.0, "compiles": 0, "compile_s": 0.0, "loads": 3,
             "load_s": 0.6, "pid": 12, "shard": 0},
            {"start_s": 4.0, "end_s": 12.0, "exec_s": 8.0, "compiles": 1, "compile_s": 5.0, "loads": 0,
             "load_s": 0.0, "pid": 12, "shard": 1}]},
        {"id": "c", "isolated": False, "details": {}, "timing": [{"start_s": 0.5, "end_s": 2.0}]}]}
    lines, info = m.timeline(rep, 14.0)
    assert info["compiles"] == 3 and info["compile_s"] == 9.0 and info["loads"] == 3
    assert info["critical_item"]["id"] == "b[2/2]" and info["critical_item"]["end_s"] == 12.0
    assert info["busy_s"] == {"11": 8.0, "12": 11.0, "parent": 1.5}
    # spread evenly: (6 + 1 + 8) s of worker execution over 2 workers after the slowest start-up (3 s)
    assert info["spread_evenly_s"] == 10.5
    assert any("spread evenly: 15 s of worker execution / 2 workers" in ln and "= 10.5 s" in ln for ln in lines)
    assert any("3 compiled in 9.0 s" in ln for ln in lines)
    assert "kernel_keys" not in info or info["kernel_keys"] == {}   # no key log: no key lines
    # Note [Compile keys in the timeline]: the same key compiled by two items is counted once as
    # distinct and once as repeated; a load of a key compiled in the run is a reuse
    t = rep["results"]
    t[0]["timing"][0]["kernels"] = [["compile", "fwd", "k1", 2.0, "(1,)"], ["compile", "bwd", "k2", 2.0, "(2,)"]]
    t[1]["timing"][0]["kernels"] = [["load", "fwd", "k1", 0.2, ""], ["load", "fwd", "k9", 0.2, ""]]
    t[1]["timing"][1]["kernels"] = [["compile", "bwd", "k2", 5.0, "(2,)"]]
    lines, info = m.timeline(rep, 14.0)
    k = info["kernel_keys"]
    assert (k["distinct_compiled"], k["compiles"], k["twice"], k["reuse_loads"]) == (2, 3, 1, 1)
    assert k["by_cache"] == {"bwd": 1, "fwd": 1}
    assert info["compile_s_per_kernel"] == {"fwd": 2.0, "bwd": 3.5}
    assert any("compile seconds per kernel: bwd 2 x 3.50 s, fwd 1 x 2.00 s" in ln for ln in lines)
    assert k["keys"]["k2"]["compiled_by"] == ["a", "b[2/2]"] and k["keys"]["k2"]["compile_s"] == 7.0
    assert any("2 distinct compiled (3 compiles; 1 repeated" in ln for ln in lines)
    assert any("a 2 keys (2 shared)" in ln and "b 3 keys (2 shared)" in ln for ln in lines)
    png = tmp_path / "t.png"
    pytest.importorskip("matplotlib", reason="matplotlib not installed")
    assert m.plot_timeline(rep, str(png), "t") and png.stat().st_size > 1000


def test_benchmark_timeline_splits_examples_between_target_and_judge():
    """The campaign checks' per-example seconds (details.example_seconds): the target's share
    and the judge's, the slowest named by plan row (#i) or by constructed edge."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "gat", os.path.join(os.path.dirname(__file__), "..", "benchmarks", "gpu_audit_time.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    rep = {"results": [{"id": "coverage.production", "isolated": True, "timing": [
        {"start_s": 0.0, "end_s": 30.0, "exec_s": 30.0, "pid": 1}],
        "details": {"plan": {"rows": 2}, "plan_coverage": {"edge_cases": {"chunks": "ran"}},
                    "example_seconds": {"0": [2.0, 1.5], "1": [1.0, 0.25], "2": [20.0, 4.0]}}}]}
    lines, info = m.timeline(rep, 31.0)
    ex = info["examples"]
    assert (ex["examples"], ex["seconds"], ex["target_s"]) == (3, 23.0, 5.75)
    assert [s["example"] for s in ex["slowest"]] == ["coverage.production[chunks]", "coverage.production[#0]",
                                                     "coverage.production[#1]"]
    assert any("3 in 23.0 s, 5.8 s of it in the target's calls, 17.2 s in the judge" in ln for ln in lines)


def test_a_drawn_example_records_its_seconds_and_the_targets_share():
    from fa4verify.fuzz import drawn
    from fa4verify.problem import AttentionProblem
    from fa4verify.targets import TwinTarget
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=8, seqlen_k=8, nheads=1, nheads_kv=1,
                         head_dim=16, head_dim_v=16)
    o = drawn.run_drawn([p], [0], target=TwinTarget())["outcomes"][0]
    sec = o["seconds"]
    assert o["status"] == "ran" and 0.0 < sec["target"] <= sec["total"]


def test_clearing_through_the_proxy_counts_the_next_lookup_again():
    inner = FakeCache()
    c = kt.TimedCache(inner, "fake")
    _use(c, "a")
    c.clear()
    before = kt.snapshot()
    assert _use(c, "a", compile_s=0.0) == "compiled a"
    assert kt.delta(before)["compiles"] == 1 and inner.cleared == 1
