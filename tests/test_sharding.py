"""The GPU pinning and seed sharding of fa4verify.sharding (CPU: fake worker ids)."""
import os
import subprocess
import sys

import numpy as np
import pytest

from fa4verify import sharding
from fa4verify.judge.verdict import compare


def test_worker_index_parses_xdist_ids_and_rejects_garbage():
    assert sharding.worker_index({}) is None
    assert sharding.worker_index({"PYTEST_XDIST_WORKER": "gw0"}) == 0
    assert sharding.worker_index({"PYTEST_XDIST_WORKER": "gw13"}) == 13
    with pytest.raises(ValueError):
        sharding.worker_index({"PYTEST_XDIST_WORKER": "worker3"})


@pytest.mark.parametrize("parent,worker,want", [("0,1,2,3,4,5,6,7", "gw3", "3"), ("4,6", "gw3", "6"),
                                                (None, "gw0", "0"), ("GPU-a,GPU-b", "gw2", "GPU-a")])
def test_pin_maps_worker_to_one_visible_device(parent, worker, want):
    env = {"PYTEST_XDIST_WORKER": worker}
    if parent is not None:
        env["CUDA_VISIBLE_DEVICES"] = parent
    assert sharding.pin_worker_gpu(env) == want
    assert env["CUDA_VISIBLE_DEVICES"] == want
    assert sharding.pin_worker_gpu(env) == want          # idempotent: stays on its device


def test_pin_uses_ngpus_and_can_be_turned_off():
    env = {"PYTEST_XDIST_WORKER": "gw5", "FA4VERIFY_NGPUS": "4"}
    assert sharding.pin_worker_gpu(env) == "1"
    off = {"PYTEST_XDIST_WORKER": "gw5", "FA4VERIFY_PIN_GPU": "0", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert sharding.pin_worker_gpu(off) is None and off["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert sharding.pin_worker_gpu({}) is None            # not an xdist worker: untouched


def test_workers_of_a_node_get_distinct_gpus():
    got = {sharding.pin_worker_gpu({"PYTEST_XDIST_WORKER": f"gw{i}", "FA4VERIFY_NGPUS": "8"}) for i in range(8)}
    assert got == {str(i) for i in range(8)}


def _campaign(seeds):
    """A stand-in fuzz campaign: each seed draws a case and the judge decides it."""
    out = {}
    for s in seeds:
        rng = np.random.default_rng(s)
        ref = rng.standard_normal(64)
        act = ref + rng.standard_normal(64) * (1e-3 if s % 7 else 1e-1)
        bud = np.full(64, 5e-3)
        if s % 11 == 0:
            bud[3] = np.nan                           # an undecided case
        out[s] = compare("x", act, ref, budget=bud).status
    return out


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_split_covers_every_seed_once_and_merges_to_the_one_way_verdicts(workers):
    one = _campaign(sharding.seed_range(100, 40, 0, 1))
    parts = [_campaign(sharding.seed_range(100, 40, i, workers)) for i in range(workers)]
    seen = [s for p in parts for s in p]
    assert sorted(seen) == list(range(100, 140)) and len(seen) == len(set(seen))
    merged = sharding.merge(parts, expected=range(100, 140))
    assert merged == one
    assert sharding.merged_status(merged.values()) == sharding.merged_status(one.values()) == "fail"
    assert {"pass", "fail", "undecided"} <= set(one.values())


def test_merge_refuses_duplicates_and_gaps():
    with pytest.raises(ValueError, match="two workers"):
        sharding.merge([{1: "pass"}, {1: "pass"}])
    with pytest.raises(ValueError, match="missing"):
        sharding.merge([{1: "pass"}], expected=[1, 2])
    assert sharding.merged_status([]) == "undecided"


def test_shard_strides_like_seed_range():
    items = list("abcdefg")
    assert sharding.shard(items, 1, 3) == ["b", "e"]
    with pytest.raises(ValueError):
        sharding.shard(items, 3, 3)


def test_a_stale_parent_record_does_not_override_a_new_device_list():
    env = {"PYTEST_XDIST_WORKER": "gw1", "CUDA_VISIBLE_DEVICES": "5,7",
           "FA4VERIFY_PARENT_CUDA_VISIBLE_DEVICES": "0"}
    assert sharding.pin_worker_gpu(env) == "7"
    assert env["FA4VERIFY_PARENT_CUDA_VISIBLE_DEVICES"] == "5,7"
    assert sharding.pin_worker_gpu(env) == "7"          # idempotent after pinning


@pytest.mark.slow
def test_pytest_worker_is_pinned_before_cuda(tmp_path):
    """A real pytest-xdist run (2 workers, --fa4verify): each worker's CUDA_VISIBLE_DEVICES is its own."""
    t = tmp_path / "test_pin_probe.py"
    t.write_text("import os\n"
                 "def test_probe(worker_id):\n"
                 "    open(os.path.join(os.environ['PROBE_DIR'], worker_id), 'w').write(os.environ.get('CUDA_VISIBLE_DEVICES', ''))\n"
                 "def test_probe2(worker_id):\n"
                 "    test_probe(worker_id)\n")
    env = {**os.environ, "PROBE_DIR": str(tmp_path), "CUDA_VISIBLE_DEVICES": "5,7"}
    env.pop("PYTEST_XDIST_WORKER", None)
    env["FA4VERIFY_PARENT_CUDA_VISIBLE_DEVICES"] = "0"   # stale, as a nested run inherits it
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--fa4verify=quick",
                        "-k", "probe", str(t)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    files = {p.name: p.read_text() for p in tmp_path.iterdir() if p.name.startswith("gw")}
    assert files, r.stdout + r.stderr
    want = {"gw0": "5", "gw1": "7"}
    assert all(files[w] == want[w] for w in files), files
