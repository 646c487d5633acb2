"""scripts/gpu/fuzz_features.sh and scripts/gpu_fuzz_features.py run on CPU (the twin stands in for
FA4), so the first H200 run does not die of a typo. Output here is "CPU twin", not evidence."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))


def test_entry_point_runs_every_call_form_on_the_cpu_twin(tmp_path):
    import gpu_fuzz_features as g
    js = tmp_path / "keep.json"
    rc = g.main(["--device", "cpu", "--examples", "8", "--time-limit", "120", "--head-dims", "64",
                 "--features", "paged_kv,seqused_k,block_sparse,mask_mod_fn", "--json", str(js)])
    d = json.loads(js.read_text())
    assert rc == 0, d.get("crash") or d["summary"]["failure"]
    assert d["where"] == "CPU twin" and d["summary"]["examples"] >= 4
    assert set(d["call_forms"]) == {"paged_kv", "seqused_k", "block_sparse", "mask_mod_fn", "hostile_nan"}
    assert d["campaign"]["format"] == "fa4verify-fuzz-campaign/1"


def test_entry_point_rejects_an_unknown_feature(tmp_path, capsys):
    import gpu_fuzz_features as g
    assert g.main(["--device", "cpu", "--features", "paged", "--json", str(tmp_path / "x.json")]) == 2
    assert "unknown call feature" in capsys.readouterr().err


def test_shell_script_usage_and_cpu_step(tmp_path):
    sh = ROOT / "scripts" / "gpu" / "fuzz_features.sh"
    r = subprocess.run(["bash", str(sh), "bogus"], env={"OUT": str(tmp_path), "PATH": "/usr/bin:/bin"},
                       capture_output=True, text=True)
    assert r.returncode == 2 and "usage" in r.stderr
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").write_text(f"#!/bin/bash\nexec {sys.executable} \"$@\"\n")
    (bindir / "python3").chmod(0o755)
    env = dict(os.environ, OUT=str(tmp_path), FUZZFEAT_DEVICE="cpu", PATH=f"{bindir}:{os.environ['PATH']}")
    r = subprocess.run(["bash", str(sh), "keep"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr + (tmp_path / "fuzzfeat_keep.log").read_text()
    assert "[fuzz_features] CPU twin" in r.stdout
    assert json.loads((tmp_path / "fuzzfeat_keep.json").read_text())["summary"]["violation"] is False


@pytest.mark.slow
def test_audit_step_parses_its_report(tmp_path):
    """The audit step's summary snippet reads the audit's JSON schema (results[].id/status/details):
    a CPU audit of fuzz.twin with the decode-paged profile stands in for the GPU check."""
    js = tmp_path / "a.json"
    r = subprocess.run([sys.executable, "-m", "fa4verify", "audit", "--device", "cpu", "-k", "fuzz.twin",
                        "--arch", "sm90", "--deployment", "decode-paged", "--opt", "fuzz_examples=4",
                        "--opt", "fuzz_time_limit_s=60", "--json", str(js)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    rep = json.loads(js.read_text())
    res = [x for x in rep["results"] if x["id"].startswith("fuzz.twin")]
    assert res and res[0]["status"] == "pass", (r.stdout[-2000:], r.stderr[-2000:])
    assert "call forms" in res[0]["summary"] and "known_issues" in res[0]["details"]
