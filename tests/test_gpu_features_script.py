"""scripts/gpu_features.py runs every section end to end on the CPU stand-in (small sizes), so
the first H200 run does not die of a typo; and the shell driver parses."""
from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("gpu_features", ROOT / "scripts" / "gpu_features.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("section", ["paged", "combine", "sparse_fwd", "sparse", "seqused_bwd"])
def test_section_runs_on_cpu_stand_in(section, tmp_path):
    out = tmp_path / f"{section}.json"
    rc = _script().main(["--section", section, "--json", str(out), "--device", "cpu"])
    d = json.loads(out.read_text())
    assert rc == 0, d.get("traceback")
    assert d["where"].startswith("CPU stand-in")
    r = d["result"]
    if section == "paged":
        assert r["permutation_bitwise"] is True and r["all_within_budget"] is True
        assert {row["layout"] for row in r["rows"]} == {"contiguous+seqused_k", "paged-identity", "paged-permuted"}
        assert 0 < r["max_tightness"] < 1
    elif section == "combine":
        assert r["all_within_budget"] is True and len(r["rows"]) == 2
        assert all(row["twin_bitwise_share_out"] == 1.0 for row in r["rows"])   # the stand-in *is* the twin
        assert r["num_splits_2"].startswith("AssertionError")
    elif section == "sparse_fwd":
        assert r["all_within_budget"] is True and 0 < r["max_tightness"] < 1 and r["blocks_kept"] > 0
        assert r["fully_masked_rows"] > 0
        eq = r["checkerboard_vs_mask_mod"]
        assert eq["bitwise_equal"] == {"out": True, "lse": True}        # stand-in: the same computation
        assert eq["mask_mod"]["out"]["status"] == eq["block_sparse"]["out"]["status"] == "pass"
    elif section == "seqused_bwd":
        assert r["all_within_budget"] is True and 0 < r["max_tightness"] < 1 and r["errors"] == []
        assert [row["causal"] for row in r["rows"]] == [False, True]
        assert all(row["unused_rows_max_abs"] == {"dk": 0.0, "dv": 0.0} for row in r["rows"])
    else:
        assert r["verdict"] == "refuted"        # the stand-in's float32 gradients are right
        assert all(row["dq_rel_err"] < 0.01 for row in r["rows"])


def test_judge_in_script_catches_a_wrong_paged_kernel(tmp_path, monkeypatch):
    """The paged section's verdicts can fail: a stand-in that reads the pages in the wrong order
    (identity table instead of the permutation) is out of budget and not bitwise."""
    mod = _script()
    K = mod.CpuStandIn()
    real = K.forward

    def wrong(q, k, v, page_table=None, **kw):
        if page_table is not None:
            import torch
            page_table = torch.arange(page_table.numel(), dtype=torch.int32).reshape(page_table.shape)
        return real(q, k, v, page_table=page_table, **kw)
    K.forward = wrong
    r = mod.section_paged(K, small=True)
    permuted = [row for row in r["rows"] if row["layout"] == "paged-permuted"]
    assert permuted and all(row["out"]["status"] == "fail" for row in permuted)
    assert r["all_within_budget"] is False and r["permutation_bitwise"] is False


def test_shell_driver_parses_and_rejects_bad_section(tmp_path):
    sh = ROOT / "scripts" / "gpu" / "features.sh"
    assert subprocess.run(["bash", "-n", str(sh)]).returncode == 0
    r = subprocess.run(["bash", str(sh), "bogus"], env={"OUT": str(tmp_path), "PATH": "/usr/bin:/bin"},
                       capture_output=True, text=True)
    assert r.returncode == 2 and "usage" in r.stderr


@pytest.mark.slow
def test_sparse_section_records_a_process_abort(tmp_path, monkeypatch):
    """FA4's DSL aborts the process on the hd 200-240 block-sparse layouts (compile-only); the
    driver runs each head dim in its own process and records the abort as a result."""
    monkeypatch.setenv("GPU_FEATURES_STANDIN_ABORT_HD", "208")
    mod = _script()
    r = mod.section_sparse(mod.CpuStandIn(), small=True, device="cpu")
    by_hd = {row["head_dim"]: row for row in r["rows"]}
    assert by_hd[208].get("aborted") is True and "exit status" in by_hd[208]["error"]
    assert not by_hd[64].get("wrong") and "error" not in by_hd[64]
    assert r["predicted_hds_not_running"] == [208] and r["controls_right"] == [64]
    assert r["verdict"] == "does not run (compile abort or error)"


@pytest.mark.slow
def test_shell_driver_end_to_end_on_cpu_stand_in(tmp_path):
    import os
    import sys
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").write_text(f"#!/bin/bash\nexec {sys.executable} \"$@\"\n")
    (bindir / "python3").chmod(0o755)
    env = dict(os.environ, OUT=str(tmp_path), FEATURES_DEVICE="cpu", SPARSE_HDS="64",
               PATH=f"{bindir}:{os.environ['PATH']}")
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu" / "features.sh")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    for s in ("paged", "combine", "sparse_fwd", "sparse"):
        d = json.loads((tmp_path / f"features_{s}.json").read_text())
        assert "result" in d and d["where"].startswith("CPU stand-in")
        assert f"[{s}] CPU stand-in" in r.stdout
    assert [row["head_dim"] for row in json.loads((tmp_path / "features_sparse.json").read_text())["result"]["rows"]] == [64]


def test_sparse_forward_that_ignores_the_block_mask_fails():
    mod = _script()
    K = mod.CpuStandIn()
    real = K.sparse_forward
    K.sparse_forward = lambda q, k, v, bm, bs: real(q, k, v, np.ones_like(bm), bs)
    r = mod.section_sparse_fwd(K, small=True)
    assert r["out"]["status"] == "fail" and r["all_within_budget"] is False


def test_judge_in_script_catches_a_backward_that_ignores_seqused_k(tmp_path):
    """The seqused_bwd verdicts can fail: a stand-in backward that attends to every key (as if
    seqused_k were not passed) is out of the composed backward budget."""
    mod = _script()
    K = mod.CpuStandIn()
    real = K.seqused_backward

    def wrong(q, k, v, o, do, lse, seqused_k, causal):
        import torch
        return real(q, k, v, o, do, lse, torch.full_like(seqused_k, k.shape[1]), causal)
    K.seqused_backward = wrong
    r = mod.section_seqused_bwd(K, small=True)
    assert r["all_within_budget"] is False
    assert any(row["dq"]["status"] == "fail" for row in r["rows"])
