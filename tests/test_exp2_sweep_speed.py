"""The fused per-input kernels and the task schedule of the exhaustive exp2 sweep (issue 17 item 4)
change no figure: the statistics of ``sweep(..., impl="fused")`` equal those of
``impl="reference"`` (the kernels before session 5) bit for bit -- every field, float weights
included, and the mpmath fallback count -- on sub-ranges covering each special region, and each
exact trick equals the general rounding it replaces (Note [Horner without round-to-odd],
Note [One oracle filter], Note [Sweep schedule] in ``fa4verify.exp2.cert``).
"""
from __future__ import annotations

import functools
import json

import numpy as np
import pytest

from fa4verify.exp2 import cert as ec
from fa4verify.oracles.exp2 import exp2_cr_from_f64, oracle_stats


def _same(a: ec.SweepResult, b: ec.SweepResult) -> None:
    da, db = ec.asdict(a.stats), ec.asdict(b.stats)
    diff = {k: (da[k], db[k]) for k in da if repr(da[k]) != repr(db[k])}
    assert not diff, f"fused != reference on [{a.lo}, {a.hi}] deg {a.degree} {a.method}: {diff}"
    assert a.pieces == b.pieces and a.fallbacks == b.fallbacks


# (degree, lo, hi, method): each region where an exact trick or a special case applies
REGIONS = [
    (3, -(2.0**-25) * (1 + 2.0**-8), -(2.0**-25) * (1 - 2.0**-8), "fast"),   # tiny negatives: floor = -1 (add.rm)
    (3, -(2.0**-25) * (1 + 2.0**-12), -(2.0**-25) * (1 - 2.0**-12), "direct"),
    (3, 0.0, 2.0**-128, "fast"),                                       # +0, subnormal and tiny positive x
    (3, 0.0, 2.0**-140, "direct"),
    (3, -2.0000005, -1.9999995, "direct"),                             # around an integer
    (5, 2.9999995, 3.0000005, "direct"),
    (3, -3.0, -1.9999999, "fast"),                                     # full unit interval: the grid
    (3, -127.0, -125.9, "fast"),                                       # [-127, -126] clipped, grid + direct
    (3, -126.0, -125.99, "direct"),                                    # smallest normal results
    (3, 7.99, 8.0, "fast"),                                            # the top of the range, x = 8
    (3, -20.0, -19.99, "direct"),                                      # fp16 subnormal results
    (5, -15.01, -14.99, "direct"),                                     # fp16 normal/subnormal edge
    (3, -0.5, -0.49, "fast"),                                          # (R2) buckets
    (5, -0.26, -0.24, "fast"),
    (3, 0.031, 0.0313, "fast"),                                        # (R3) runs and direct
    (3, 0.4999, 0.5001, "direct"),
]


@pytest.mark.parametrize("degree,lo,hi,method", REGIONS)
def test_fused_sweep_statistics_equal_the_reference_kernels_bit_for_bit(degree, lo, hi, method):
    _same(ec.sweep(degree, lo, hi, method=method, impl="fused"),
          ec.sweep(degree, lo, hi, method=method, impl="reference"))


def test_the_schedule_does_not_change_the_statistics(monkeypatch):
    """Direct pieces cut into many small tasks, run on 2 processes in any order, give the Stats of
    one task per piece (weights included: Note [Sweep schedule])."""
    lo, hi = 0.2499, 0.2505                          # a direct piece across the 1/4 binade edge
    whole = ec.sweep(3, lo, hi, jobs=1)
    monkeypatch.setattr(ec, "DIRECT_TASK", 1 << 12)
    cut = ec.sweep(3, lo, hi, jobs=1)
    cut2 = ec.sweep(3, lo, hi, jobs=2)
    assert whole.stats.n > 4 * (1 << 12)
    _same(cut, whole)
    _same(cut2, whole)


def test_fast_horner_step_equals_round_to_odd_fma_and_catches_double_rounding():
    cs = ec._coeffs(3)
    rng = np.random.default_rng(7)
    f = np.concatenate([rng.uniform(0, 1, 300_000), np.exp2(rng.uniform(-149, 0, 100_000))]).astype(np.float32)
    for d in (1, 2, 3, 4, 5):
        a, b = ec._horner(f, ec._coeffs(d)), ec._horner_reference(f, ec._coeffs(d))
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), d
    # planted: q*f = 2^-24 (1 - 2^-46) and c = 1 + 2^-23, so RN64(q*f + c) is the fp32 midpoint
    # 1 + 3*2^-24 while the exact sum lies below it: a plain float64 -> float32 cast rounds up
    # (ties to even), the fused FMA must round down
    q = np.float32([0.5 * (1 + 2.0**-23)])
    f64 = np.float64([float(np.float32(2.0**-23 * (1 - 2.0**-23)))])
    c = float(np.float32(1 + 2.0**-23))
    naive = (q.astype(np.float64) * f64 + c).astype(np.float32)
    assert naive[0] == np.float32(1 + 2.0**-22)                       # the double rounding happens
    assert ec._fma_pos_fast(q, f64, c)[0] == np.float32(1 + 2.0**-23) == ec._fma_pos(q, f64, c)[0]
    del cs


def test_bit_trick_roundings_equal_numpy_casts_on_every_kind_of_fp32():
    b = np.arange(1, 0x7F800000, 89, dtype=np.uint32)                # positive subnormals .. max finite
    v = b.view(np.float32)
    with np.errstate(over="ignore"):
        ref16 = v.astype(np.float16).astype(np.float32)
    from fa4verify.oracles import binary32 as b32
    assert np.array_equal(ec._f16_rne(v).view(np.uint32), ref16.view(np.uint32))
    assert np.array_equal(ec._bf16_rne(v).view(np.uint32), b32.to_bf16(v).view(np.uint32))


def test_fp16_filter_without_numpy_cast_equals_the_oracle_with_the_same_fallbacks():
    rng = np.random.default_rng(11)
    x = np.sort(rng.uniform(-40, -10, 400_000).astype(np.float32))
    x = x[x != np.floor(x)]
    y = np.exp2(x.astype(np.float64))
    f0 = oracle_stats()["fallbacks"]
    a = exp2_cr_from_f64(x, y, "f16")
    f1 = oracle_stats()["fallbacks"]
    b = ec._cr_f16(x, y)
    assert np.array_equal(a, b) and oracle_stats()["fallbacks"] - f1 == f1 - f0


def test_fused_metrics_equal_reference_metrics_including_midpoint_results():
    """Random inputs over the main domain, with the inputs whose RN32(2^x) is a bf16 or fp16
    midpoint (where Note [One oracle filter] must use the format's own filter) present."""
    rng = np.random.default_rng(2)
    x = np.sort(np.concatenate([rng.uniform(-126, 127.99, 600_000), rng.uniform(-1, 1, 600_000),
                                rng.uniform(-26, -13, 200_000), np.arange(-126, 128)]).astype(np.float32))
    cr32 = exp2_cr_from_f64(x, np.exp2(x.astype(np.float64)), "f32").astype(np.float32).view(np.int32)
    assert np.count_nonzero((cr32 & 0xFFFF) == 0x8000) >= 5                   # bf16 midpoints met
    assert np.count_nonzero((cr32 & 0x1FFF) == 0x1000) >= 50                  # fp16 midpoints met
    for d in (3, 5):
        emu = ec.emu_direct(x, ec._coeffs(d))
        m1, m0 = ec.metrics(x, emu), ec.metrics_reference(x, emu)
        assert m1.keys() == m0.keys()
        for k in m0:
            assert np.array_equal(m1[k], m0[k]), (d, k)
        assert ec.aggregate(x, emu, m1) == ec.aggregate(x, emu, m0)


def test_fused_metrics_hand_mutant_values_to_the_reference():
    """Emulated values a mutant may produce (0, negative, inf, NaN) are scored by the reference."""
    x = np.float32([0.1, 0.2, 0.3, 0.4])
    emu = np.float32([1.07, 0.0, -1.0, np.nan])
    m1, m0 = ec.metrics(x, emu), ec.metrics_reference(x, emu)
    for k in m0:
        assert np.array_equal(m1[k], m0[k], equal_nan=True), k


def test_fast_method_refuses_a_polynomial_with_a_negative_coefficient(monkeypatch):
    """(R3)'s monotonicity rests on positive coefficients: a planted negative one is refused."""
    cs = list(ec._coeffs(3))
    cs[1] = np.float32(-cs[1])
    monkeypatch.setattr(ec, "_coeffs", lambda degree: tuple(cs))
    with pytest.raises(ValueError, match="positive coefficients"):
        ec.sweep(3, 2.0**-20, 1.25 * 2.0**-20, method="fast")


@pytest.mark.slow
def test_cli_report_is_the_same_with_the_reference_kernels(monkeypatch):
    """The whole ``fa4verify exp2`` report (timings aside) on a range with every reduction and
    the edge domain."""
    from fa4verify.cli.exp2 import run_exp2

    def report():
        r = run_exp2([3], -0.0005, 0.0005, sample=None, direct=False, jobs=1, seed=0, progress=False)
        for e in r["degrees"].values():
            e.pop("seconds")
        return json.dumps(r, sort_keys=True, default=repr)

    fused = report()
    monkeypatch.setattr(ec, "sweep", functools.partial(ec.sweep, impl="reference"))
    monkeypatch.setattr(ec, "_IMPL", "reference")            # grid_mean_rel's Horner too
    assert report() == fused
