"""Proof by comparison: the fast exhaustive sweep (reductions R1-R3 of Note [Fast exhaustive sweep]
in ``fa4verify.exp2.cert``) gives exactly the statistics of direct evaluation of every input.

Each range below exercises one reduction; the direct method evaluates every fp32 input of it.
Counts and maxima must agree exactly; an argmax may differ only between inputs that tie (checked
by re-evaluating the metric at the fast path's argmax); value weights are float sums in different
orders (agree to 1e-12 relative).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from fa4verify.exp2 import cert as ec

EXACT = ["n", "max_rel", "max_ulp32", "max_ulp_bf16", "max_ulp_f16", "wrong_bf16", "wrong_f16",
         "mono_violations", "worst_wrong_bf16_ulp", "worst_wrong_f16_ulp"]
ARGMAX = {"argmax_rel": "rel", "argmax_ulp32": "d32", "argmax_ulp_bf16": "u_bf16", "argmax_ulp_f16": "u_f16"}
WEIGHTS = ["weight", "weight_wrong_bf16", "weight_wrong_f16"]


def _metric_at(x: float, degree: int, key: str) -> float:
    xs = np.float32([x])
    m = ec.metrics(xs, ec.emu_direct(xs, ec._coeffs(degree)))
    v = m[key][0]
    return abs(float(v)) if key == "rel" else float(v)


def _compare(degree: int, lo: float, hi: float, expect_kinds: set[str]) -> None:
    fast = ec.sweep(degree, lo, hi, method="fast")
    direct = ec.sweep(degree, lo, hi, method="direct")
    used = {k for k, v in fast.pieces.items() if v}
    assert expect_kinds <= used, f"[{lo}, {hi}] did not exercise {expect_kinds - used} (used {used})"
    a, b = fast.stats, direct.stats
    for k in EXACT:
        assert getattr(a, k) == getattr(b, k), f"deg {degree} [{lo}, {hi}] {k}: fast {getattr(a, k)} direct {getattr(b, k)}"
    for k, mk in ARGMAX.items():
        xa = getattr(a, k)
        maxk = {"rel": "max_rel", "d32": "max_ulp32", "u_bf16": "max_ulp_bf16", "u_f16": "max_ulp_f16"}[mk]
        assert _metric_at(xa, degree, mk) == getattr(b, maxk), f"{k}: metric at fast argmax {xa} is not the max"
    for k in WEIGHTS:
        assert math.isclose(getattr(a, k), getattr(b, k), rel_tol=1e-12, abs_tol=1e-300), (k, getattr(a, k), getattr(b, k))
    for k in ("worst_wrong_bf16", "worst_wrong_f16"):
        xa, xb = getattr(a, k), getattr(b, k)
        assert math.isnan(xa) == math.isnan(xb)


CASES = [
    # (R2) rounded fraction, buckets of x in (-1/2, 0)
    (3, -0.5, -0.49, {"bucket"}),
    (3, -0.26, -0.24, {"bucket"}),                                         # crosses a binade of x
    (3, -(2.0**-25) * (1 + 2.0**-10), -(2.0**-25) * (1 - 2.0**-10), {"bucket"}),   # the tiny-negative bucket edge
    (3, -1.0e-30, -0.999e-30, {"bucket"}),
    (5, -0.3, -0.29, {"bucket"}),
    # (R3) monotone runs on [0, 2^-5)
    (3, 0.0, 2.0**-130, {"runs"}),                                         # zero and subnormals
    (3, 2.0**-20, 1.25 * 2.0**-20, {"runs"}),
    (3, 0.031, 0.0313, {"runs", "direct"}),                                # across 2^-5 into direct
    (5, 2.0**-9, 1.1 * 2.0**-9, {"runs"}),
    # (R1) exact fraction, grid classes (full unit intervals and the half pieces)
    (3, -3.0, -1.9999999, {"grid"}),
    (3, 6.0, 7.0, {"grid"}),
    (3, -126.0, -124.5, {"grid", "direct"}),
    (3, -14.0, -12.0, {"grid"}),                                           # fp16 normal boundary
    (3, -27.0, -26.0, {"grid"}),                                           # fp16 zero region (analytic)
    (3, -16.0, -15.0, {"direct"}),                                         # fp16 subnormal: direct by plan
    (5, -31.0, -29.5, {"grid"}),
]


@pytest.mark.parametrize("degree,lo,hi,kinds", CASES)
def test_fast_sweep_equals_direct_evaluation(degree, lo, hi, kinds):
    _compare(degree, lo, hi, kinds)


@pytest.mark.slow(extended="the large fast-vs-direct sweep ranges")
@pytest.mark.parametrize("degree,lo,hi,kinds", [
    (3, -1.0, -0.5, {"grid"}), (3, 0.5, 1.0, {"grid"}), (3, 1.0, 2.0, {"grid"}), (3, -0.5, -0.25, {"bucket"}),
    (5, -1.0, -0.5, {"grid"}), (3, -1.2, 0.7, {"bucket", "runs", "grid", "direct"}),
])
def test_fast_sweep_equals_direct_evaluation_large(degree, lo, hi, kinds):
    _compare(degree, lo, hi, kinds)


def test_direct_path_emulation_is_the_twin_bit_for_bit():
    from fa4verify.kernels.twin import ex2_emulation
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-126, 127.99, 400_000), rng.uniform(-1, 1, 200_000),
                        -np.exp2(rng.uniform(-149, -1, 100_000)), np.exp2(rng.uniform(-149, -1, 100_000))]).astype(np.float32)
    for d in (1, 2, 3, 4, 5):
        assert np.array_equal(ec.emu_direct(x, ec._coeffs(d)).view(np.uint32), ex2_emulation(x, d).view(np.uint32))


def test_direct_metrics_equal_a_plain_per_input_computation():
    """metrics() against a straightforward computation with the oracle and binary32 kit."""
    from fa4verify.oracles import binary32 as b32
    from fa4verify.kernels.twin import ex2_emulation
    from fa4verify.oracles.exp2 import exp2_cr
    rng = np.random.default_rng(1)
    x = np.sort(np.concatenate([rng.uniform(-126, 8, 50_000), rng.uniform(-1, 1, 50_000)]).astype(np.float32))
    emu = ex2_emulation(x, 3)
    m = ec.metrics(x, emu)
    assert np.array_equal(m["d32"], b32.ulp_distance(emu, exp2_cr(x, "f32")))
    assert np.array_equal(m["w_bf16"], b32.to_bf16(emu) != exp2_cr(x, "bf16"))
    assert np.array_equal(m["w_f16"], b32.to_fp16(emu) != exp2_cr(x, "f16"))
    assert np.array_equal(m["w"], b32.ulp(x))
    y = np.exp2(x.astype(np.float64))
    y32 = y.astype(np.float32)
    ok = np.frexp(y32)[0] != 0.5                  # binade of 2^x is that of float32(y)
    ref = np.abs(b32.to_bf16(emu).astype(np.float64) - y) / b32.ulp(y32, "bf16")
    assert ok.mean() > 0.99 and np.allclose(m["u_bf16"][ok], ref[ok], rtol=1e-12, atol=0)


def test_monotone_runs_cover_the_range_without_gaps():
    r = ec.runs_monotone(3, int(np.float32(2.0**-12).view(np.uint32)), int(np.float32(2.0**-11).view(np.uint32)))
    assert r.oa[0] == np.float32(2.0**-12).view(np.uint32) and r.ob[-1] == np.float32(2.0**-11).view(np.uint32)
    assert np.all(r.oa[1:] == r.ob[:-1] + 1) and np.all(r.ob >= r.oa)
    assert np.all(np.diff(r.v) > 0)                        # maximal runs: strictly increasing values
    x = ec._ordered_to_f32(np.arange(r.oa[0], r.ob[-1] + 1))
    emu = ec.emu_direct(x, ec._coeffs(3))
    rep = np.repeat(r.v, r.ob - r.oa + 1)
    assert np.array_equal(emu, rep)


def test_stats_merge_is_order_independent_and_counts_seams():
    x = np.float32([0.1, 0.2, 0.3, 0.4])
    e = np.float32([1.0, 2.0, 1.5, 3.0])
    m = ec.metrics(x, e)
    parts = [ec.aggregate(x[i:i + 1], e[i:i + 1], {k: v[i:i + 1] for k, v in m.items()}) for i in range(4)]
    whole = ec.aggregate(x, e, m)
    merged = ec.merge_all(parts[::-1])
    assert whole.mono_violations == merged.mono_violations == 1
    assert merged.n == 4 and merged.max_rel == whole.max_rel


def test_parse_range():
    assert ec.parse_range("neg") == (-127.0, 0.0) and ec.parse_range("all") == (-127.0, 8.0)
    assert ec.parse_range("-1.5:2") == (-1.5, 2.0)
    for bad in ("1:", "a:b", "2:1", "1:2:3", "nan:1", "x"):
        with pytest.raises(ValueError):
            ec.parse_range(bad)


def test_grid_piece_reports_its_own_first_and_last_input():
    """Regression: the [1/2, 1) piece once reported x = 0 as its first input, which mis-ordered
    pieces and counted a spurious monotonicity violation at the seam with [0, 2^-126)."""
    s = ec.Stats(n=3, first=(0.5, 1.4142), last=(0.99999994, 1.9998))
    r = ec._scale_grid_stats(s, 0, 2.0**-24, 3)
    assert r.first == (0.5, 1.4142) and r.last[0] == np.float32(0.99999994)
    r2 = ec._scale_grid_stats(ec.Stats(n=2, first=(0.0, 1.0), last=(0.5, 1.4)), -1, 2.0**-24, 2)
    assert r2.first == (-1.0, 0.5) and r2.last == (-0.5, 0.7)
    assert r.weight == 3 * 2.0**-24                     # 0.5 and its neighbours are spaced 2^-24
    assert r2.weight == 2.0**-24 + 2.0**-23             # x = -1 has spacing 2^-23
    z = ec.Stats(n=1, first=(0.0, 1.0), last=(1e-39, 1.0))
    merged = ec.merge_all([r, z])
    assert merged.mono_violations == 0 and merged.first[0] == 0.0


def test_grid_mean_matches_a_random_uniform_sample_of_the_twin():
    """The 2^-24-grid mean of |emu(f)/2^f - 1| on [0, 1) agrees with a Monte-Carlo mean over 2^20
    uniform fp32 samples evaluated by the twin (standard error ~ 3e-8 for degree 3)."""
    from fa4verify.kernels.twin import ex2_emulation
    g = ec.grid_mean_rel(3)
    f = np.random.default_rng(5).uniform(0, 1, 1 << 20).astype(np.float32)
    rel = np.abs(ex2_emulation(f, 3).astype(np.float64) / np.exp2(f.astype(np.float64)) - 1)
    se = rel.std() / np.sqrt(rel.size)
    assert abs(g["mean_abs_rel_error"] - rel.mean()) < 5 * se
    assert g["points"] == 1 << 24
