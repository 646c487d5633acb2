"""The pytest-xdist GPU pinning of fa4verify.run.gpus (CPU: fake worker ids)."""
import os
import subprocess
import sys

import pytest

from fa4verify.run import gpus


def test_worker_index_parses_xdist_ids_and_rejects_garbage():
    assert gpus.worker_index({}) is None
    assert gpus.worker_index({"PYTEST_XDIST_WORKER": "gw0"}) == 0
    assert gpus.worker_index({"PYTEST_XDIST_WORKER": "gw13"}) == 13
    with pytest.raises(ValueError):
        gpus.worker_index({"PYTEST_XDIST_WORKER": "worker3"})


@pytest.mark.parametrize("parent,worker,want", [("0,1,2,3,4,5,6,7", "gw3", "3"), ("4,6", "gw3", "6"),
                                                (None, "gw0", "0"), ("GPU-a,GPU-b", "gw2", "GPU-a")])
def test_pin_maps_worker_to_one_visible_device(parent, worker, want):
    env = {"PYTEST_XDIST_WORKER": worker}
    if parent is not None:
        env["CUDA_VISIBLE_DEVICES"] = parent
    assert gpus.pin_worker_gpu(env) == want
    assert env["CUDA_VISIBLE_DEVICES"] == want
    assert gpus.pin_worker_gpu(env) == want          # idempotent: stays on its device


def test_pin_uses_ngpus_and_can_be_turned_off():
    env = {"PYTEST_XDIST_WORKER": "gw5", "FA4VERIFY_NGPUS": "4"}
    assert gpus.pin_worker_gpu(env) == "1"
    off = {"PYTEST_XDIST_WORKER": "gw5", "FA4VERIFY_PIN_GPU": "0", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert gpus.pin_worker_gpu(off) is None and off["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert gpus.pin_worker_gpu({}) is None            # not an xdist worker: untouched


def test_workers_of_a_node_get_distinct_gpus():
    got = {gpus.pin_worker_gpu({"PYTEST_XDIST_WORKER": f"gw{i}", "FA4VERIFY_NGPUS": "8"}) for i in range(8)}
    assert got == {str(i) for i in range(8)}


def test_a_stale_parent_record_does_not_override_a_new_device_list():
    env = {"PYTEST_XDIST_WORKER": "gw1", "CUDA_VISIBLE_DEVICES": "5,7",
           "FA4VERIFY_PARENT_CUDA_VISIBLE_DEVICES": "0"}
    assert gpus.pin_worker_gpu(env) == "7"
    assert env["FA4VERIFY_PARENT_CUDA_VISIBLE_DEVICES"] == "5,7"
    assert gpus.pin_worker_gpu(env) == "7"          # idempotent after pinning


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
