"""The exp2 audit checks: pass on FA4's emulation, fail on a broken one, skip what they don't cover."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify.audit.registry import CheckContext, discover

import fa4verify.checks.exp2 as cx


def _ctx(**kw) -> CheckContext:
    kw.setdefault("check_id", "exp2.deg3")
    return CheckContext(**kw)


def test_checks_are_discovered():
    ids = {s.id for s in discover()}
    assert {"exp2.deg3", "exp2.deg5", "exp2.twin_assumptions", "exp2.emulated_share", "exp2.mufu"} <= ids


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_deg3_quick_passes_and_reports_labelled_metrics(dtype):
    r = cx.deg3(_ctx(dtype=dtype, profile="quick"))
    assert r.status == "pass", r.summary
    assert r.where == "CPU twin"
    m = r.metrics
    assert 8.7e-5 < m["max_rel_error"] <= m["apriori_bound"] and m["n_inputs"] > 1_000_000
    assert f"max_ulp_{dtype}_after_rounding" in m and f"wrong_rate_{dtype}_uniform_in_value" in m
    assert 0 < r.tightness <= 1


def test_fp8_is_skipped_with_a_reason():
    r = cx.deg3(_ctx(dtype="fp8", profile="quick"))
    assert r.status == "skip" and "fp8" in r.summary


def test_a_less_accurate_emulation_fails(monkeypatch):
    from fa4verify.exp2 import cert as ec
    real = ec.emu_direct

    def worse(x, cs):     # one extra 2^-12 relative error on a few inputs
        e = real(x, cs)
        bad = (x > 0.3) & (x < 0.31)
        return np.where(bad, e * np.float32(1 + 2.0**-12), e).astype(np.float32)
    monkeypatch.setattr(ec, "emu_direct", worse)
    r = cx.deg3(_ctx(dtype="bf16", profile="quick"))
    assert r.status == "fail" and "max_rel_error > bound" in r.summary


def test_apriori_bound_adds_horner_and_fraction_rounding():
    E = 8.76297e-5
    B = cx.apriori_bound(E, 3)
    assert E + 3 * 2.0**-24 < B < E + 3 * 2.0**-24 + 2.2e-8     # gamma_3 + fraction rounding (ln2 2^-25)
    assert cx.apriori_bound(E, 5) > B


def test_stratified_sample_is_sorted_distinct_and_in_range():
    x = cx.stratified_sample(np.random.default_rng(0), 1 << 14, -126.0, 8.0)
    assert np.all(np.diff(x.astype(np.float64)) > 0) and x.min() >= -126 and x.max() <= 8
    assert np.sum((x > -0.5) & (x < 0)) >= (1 << 12) * 0.9


def test_emulated_share_table_and_twin_assumptions():
    r = cx.emulated_share(_ctx())
    assert r.status == "pass" and r.metrics["max_emulated_share"] == 0.25
    r = cx.twin_assumptions(_ctx())
    assert r.status in ("pass", "skip")


@pytest.mark.slow(extended="the exhaustive exp2 sweep (all 2.2e9 inputs)")
def test_deg3_exhaustive_profile_runs_the_full_sweep():
    r = cx.deg3(_ctx(dtype="bf16", profile="exhaustive"))
    assert r.status == "pass", r.summary
    assert r.metrics["n_inputs"] == 2_214_330_369 and r.metrics["monotonicity_violations"] == 0
