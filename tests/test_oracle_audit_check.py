"""The audit check ``oracles.fast_vs_arbiter`` registers, runs in the quick profile and passes."""
from __future__ import annotations

import importlib


def test_oracle_audit_check_passes_in_quick_profile_and_reports_metrics():
    reg = importlib.import_module("fa4verify.audit.registry")
    from fa4verify.checks import oracles as chk

    ctx = reg.CheckContext(profile="quick", dtype="bf16", seed=3, check_id="oracles.fast_vs_arbiter")
    r = chk.fast_vs_arbiter(ctx)
    assert r.status == "pass", r.summary
    assert r.where == "CPU"
    assert r.metrics["violations"] == 0
    assert 0.0 < r.metrics["bound_tightness"] <= 1.0
    assert r.metrics["log2_out_bound_rel"] <= -40.0
    fp8 = chk.fast_vs_arbiter(reg.CheckContext(profile="quick", dtype="fp8", check_id="oracles.fast_vs_arbiter"))
    assert fp8.status == "pass", fp8.summary


def test_compare_counts_a_violation_when_the_bound_is_wrong(monkeypatch):
    """The comparison can fail: shrink the fast reference's bounds to zero and it must count."""
    import numpy as np

    from fa4verify.checks import oracles as chk
    from fa4verify.oracles import reference

    monkeypatch.setattr(reference, "SAFETY", 0.0)   # every fast bound becomes 0
    prob = chk.random_problem(np.random.default_rng(0), "bf16")
    prob.update(causal=False, window_size=(None, None))
    r = chk.compare_fast_arbiter(prob)
    assert r["violations"] > 0
