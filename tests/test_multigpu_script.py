"""scripts/gpu/multigpu.sh end to end on the CPU (2 fake GPUs, the twin, CPU audit items), so the
first H200 or node run does not die of a typo: every step runs, the summary JSON is written and
says what each step found."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu" / "multigpu.sh"


def test_script_parses():
    r = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.slow   # three steps, each in fresh processes (about 80 s on the 2-core box)
def test_script_runs_every_step_on_two_fake_gpus(tmp_path):
    pytest.importorskip("torch")
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=sys.executable, FA4VERIFY_FAKE_GPUS="2",
               MG_BACKEND="twin", MG_CONFIGS="mha-hd64-full", MG_RUNS="2", MG_DEVICE="cpu",
               MG_SMOKE_K="budgets.files or golden.binary32", MG_AUDIT_K="budgets.files",
               MG_SMOKE_TIMEOUT="200", MG_DET_TIMEOUT="200", MG_AUDIT_TIMEOUT="200")
    for k in ("FA4VERIFY_FAKE_GPU_FAULT", "FA4VERIFY_FAKE_GPU_CRASH", "CUDA_VISIBLE_DEVICES"):
        env.pop(k, None)
    r = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads((tmp_path / "multigpu_summary.json").read_text())
    assert s["gpus"] == 2
    assert s["smoke"]["rc"] == 0 and s["smoke"]["items"] == {"budgets.files": "pass",
                                                             "golden.binary32": "pass"}
    assert s["determinism"]["rc"] == 0 and s["determinism"]["cross_gpu"] == "pass"
    assert s["determinism"]["counts"] == {"reproducible": 1}
    assert s["audit"]["rc"] == 0 and s["audit"]["counts"]["pass"] == 1
    # one CPU check: it runs in the auditing process (no worker, so no GPU in its timing)
    assert s["audit"]["gpu_end_s"] == {} and s["audit"]["spread_checks"] == {}
    man = json.loads((tmp_path / "det_manifest.json").read_text())
    assert [g["name"] for g in man["gpus"]] == ["Fake GPU 0", "Fake GPU 1"]
    assert "cross-GPU: pass" in (tmp_path / "determinism.log").read_text()
