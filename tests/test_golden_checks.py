"""Audit checks over the stored H200 golden vectors (fa4verify/checks/production.py): they pass on
the recorded data and fail when the data (or the model) is wrong."""
from __future__ import annotations


import numpy as np
import pytest

from fa4verify.audit.registry import CheckContext


@pytest.fixture()
def ctx():
    return CheckContext(profile="default", check_id="test")


def _have_golden():
    from fa4verify.kernels import golden
    return (golden.golden_dir() / "probe_outputs.npz").exists()


pytestmark = pytest.mark.skipif(not _have_golden(), reason="golden vectors not recorded yet")


def test_golden_twin_check_passes_on_recorded_bits(ctx):
    from fa4verify.checks import production
    r = production.twin_ex2(ctx)
    assert r.status == "pass", r.summary
    assert r.where == "recorded on NVIDIA H200 (sm_90)"
    assert r.metrics["mismatches_deg3"] == 0 and r.metrics["mismatches_deg5"] == 0
    assert r.metrics["inputs"] > 1_000_000


def test_golden_twin_check_fails_on_a_corrupted_vector(ctx, tmp_path, monkeypatch):
    from fa4verify.checks import production
    from fa4verify.kernels import golden
    g = golden.load(golden.golden_dir() / "probe_outputs.npz")
    arrays = dict(g.arrays)
    y = arrays["ex2_emulation_deg3"].copy()
    i = np.flatnonzero(np.isfinite(y.view(np.float32)) & (y.view(np.float32) > 0))[12345]
    y[i] ^= np.uint32(1)          # one ulp in one output
    arrays["ex2_emulation_deg3"] = y
    golden.save(tmp_path / "probe_outputs", arrays, g.provenance, delta=tuple(arrays))
    monkeypatch.setattr(golden, "golden_dir", lambda: tmp_path)
    r = production.twin_ex2(ctx)
    assert r.status == "fail" and r.metrics["mismatches_deg3"] == 1


def test_golden_binary32_check_passes_and_detects_unfused_model(ctx):
    from fa4verify.checks import production
    r = production.binary32_vs_gpu(ctx)
    assert r.status == "pass", r.summary
    assert r.metrics["unfused_model_differs_on_higher_is_better"] > 0


def test_production_figures_check_reports_recorded_h200_figures(ctx):
    from fa4verify.checks import production
    r = production.figures(ctx)
    assert r.status == "pass", r.summary
    assert r.metrics["fwd_max_abs_err_noncausal"] < r.metrics["pt_bf16_max_abs_err_noncausal"]
    assert r.metrics["det_bwd_identical_noncausal"] == 1
    assert r.metrics["fa4_tflops_noncausal_higher_is_better"] > 0


def test_production_figures_check_fails_when_fa4_error_exceeds_rule(ctx, tmp_path, monkeypatch):
    import json
    from fa4verify.checks import production
    from fa4verify.kernels import golden
    d = json.loads((golden.golden_dir() / "production_figures.json").read_text())
    d["forward_accuracy"][0]["fa4_max_abs_err"] = 3 * d["forward_accuracy"][0]["pytorch_bf16_max_abs_err"]
    (tmp_path / "production_figures.json").write_text(json.dumps(d))
    monkeypatch.setattr(golden, "golden_dir", lambda: tmp_path)
    assert production.figures(ctx).status == "fail"
