"""The exp2 oracle is correctly rounded (vs MPFR's correctly rounded exp2) in fp32, bf16, fp16, and
its float64 filter's error assumption holds (vs mpmath)."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify.oracles import exp2 as ox

gmpy2 = pytest.importorskip("gmpy2")
mpmath = pytest.importorskip("mpmath")


def _ctx(fmt: str):
    if fmt == "f32":
        c = gmpy2.ieee(32)
    elif fmt == "f16":
        c = gmpy2.ieee(16)
    else:  # bf16: 8-bit precision, fp32's exponent range (MPFR exponents: 0.1b x 2^e)
        c = gmpy2.context(precision=8, emin=-132, emax=128, subnormalize=True)
    c.round = gmpy2.RoundToNearest
    return c


def mpfr_exp2(x: np.ndarray, fmt: str) -> np.ndarray:
    """MPFR's correctly rounded 2^x in the target format (an independent reference)."""
    c = _ctx(fmt)
    return np.array([float(c.exp2(gmpy2.mpfr(float(v)))) for v in x], dtype=np.float64)


def sample_inputs(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    parts = [rng.uniform(-160, 130, n // 4), rng.uniform(-1, 1, n // 4),
             rng.uniform(-30, -10, n // 8),                           # fp16 subnormal results
             rng.integers(0, 2**32, n // 4, dtype=np.uint64).astype(np.uint32).view(np.float32),
             np.arange(-160, 131, dtype=np.float64)]                  # integers: exact powers
    x = np.concatenate([np.asarray(p, dtype=np.float64) for p in parts]).astype(np.float32)
    special = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, -149, -150, -150.5, 128, 127.99999,
                          -24, -25, -25.000002, -24.999998, 15.999999, 16, 2.0**-149, -2.0**-149])
    return np.concatenate([x, special])


@pytest.mark.parametrize("fmt", ["f32", "bf16", "f16"])
def test_exp2_cr_equals_mpfr_correctly_rounded(fmt):
    x = sample_inputs(60_000, seed=hash(fmt) % 1000)
    got = ox.exp2_cr(x, fmt).astype(np.float64)
    ref = mpfr_exp2(x, fmt)
    same = (got == ref) | (np.isnan(got) & np.isnan(ref))
    bad = np.flatnonzero(~same)
    assert bad.size == 0, f"{fmt}: {bad.size} mismatches, e.g. " + "; ".join(
        f"x={x[i]!r} oracle={got[i]!r} mpfr={ref[i]!r}" for i in bad[:5])


@pytest.mark.parametrize("fmt", ["f32", "bf16", "f16"])
def test_mpmath_fallback_is_correct_when_the_filter_cannot_decide(fmt, monkeypatch):
    """Widen the filter's assumed error to 2^-12 so that many inputs go to the interval fallback
    (genuinely undecided inputs occur at a rate of ~2^-26 for fp32, too rare to sample)."""
    monkeypatch.setattr(ox, "FILTER_REL_BOUND", 2.0**-12)
    x = sample_inputs(3_000, seed=5)
    before = ox.oracle_stats()["fallbacks"]
    got = ox.exp2_cr(x, fmt).astype(np.float64)
    assert ox.oracle_stats()["fallbacks"] - before > 100
    ref = mpfr_exp2(x, fmt)
    assert np.all((got == ref) | (np.isnan(got) & np.isnan(ref)))


def test_float64_exp2_error_within_filter_assumption():
    """numpy.exp2 (float64) is within 1 ulp (2^-52 relative) of 2^x on a sample; the filter
    assumes 2^-50. Measured maximum printed for the record."""
    rng = np.random.default_rng(11)
    x = np.concatenate([rng.uniform(-150, 128, 20_000), rng.uniform(-1, 1, 20_000)]).astype(np.float32)
    y = np.exp2(x.astype(np.float64))
    mp = mpmath.mp
    worst = 0.0
    with mp.workprec(120):
        for xi, yi in zip(x.tolist(), y.tolist()):
            exact = mp.power(2, mp.mpf(xi))
            worst = max(worst, float(abs(mp.mpf(yi) / exact - 1)))
    print(f"max relative error of numpy.exp2 (float64) on the sample: {worst:.3e} = 2^{np.log2(worst):.2f}")
    assert worst <= 2.0**-52 < ox.FILTER_REL_BOUND


def test_round_f64_fast_paths_equal_the_scaling_reference():
    rng = np.random.default_rng(3)
    v = rng.standard_normal(400_000) * np.exp2(rng.uniform(-160, 135, 400_000))
    v = np.concatenate([v, [0.0, -0.0, np.inf, -np.inf, np.nan, 3.3961e38, -3.3961e38, 65519.9, 65520.0,
                            2.0**-150, 2.0**-134, 2.0**-25, 2.0**-25 * (1 + 2.0**-40)]])
    for fmt in ("f32", "bf16", "f16"):
        a, b = ox.round_f64(v, fmt), ox.round_f64_reference(v, fmt)
        same = ((a == b) & (np.signbit(a) == np.signbit(b))) | (np.isnan(a) & np.isnan(b))
        assert same.all(), (fmt, v[~same][:5], a[~same][:5], b[~same][:5])


def test_round_f64_equals_numpy_casts_for_fp16_and_fp32():
    rng = np.random.default_rng(3)
    v = rng.standard_normal(200_000) * np.exp2(rng.uniform(-30, 20, 200_000))
    assert np.array_equal(ox.round_f64_reference(v, "f16"), v.astype(np.float16).astype(np.float64))
    assert np.array_equal(ox.round_f64_reference(v, "f32"), v.astype(np.float32).astype(np.float64))
    # bf16: ml_dtypes rounds float64 -> bf16 through float32 (double rounding), so compare with
    # MPFR, and with ml_dtypes only on float32-exact values
    c = gmpy2.context(precision=8, emin=-132, emax=128, subnormalize=True)
    ref = np.array([float(c.add(gmpy2.mpfr(float(a)), 0)) for a in v[:50_000]])
    assert np.array_equal(ox.round_f64(v[:50_000], "bf16"), ref)
    ml_dtypes = pytest.importorskip("ml_dtypes")
    v32 = v.astype(np.float32).astype(np.float64)
    assert np.array_equal(ox.round_f64(v32, "bf16"), v32.astype(ml_dtypes.bfloat16).astype(np.float64))


def test_round_mpf_matches_round_f64():
    rng = np.random.default_rng(4)
    v = rng.standard_normal(3000) * np.exp2(rng.uniform(-140, 120, 3000))
    for fmt in ("f32", "bf16", "f16"):
        r = ox.round_f64(v, fmt)
        assert [ox.round_mpf(mpmath.mpf(float(a)), fmt) for a in v] == r.tolist()


@pytest.mark.parametrize("m", [1 + 2.0**-8, 1 - 2.0**-9, 1.5, 0.75 + 2.0**-10, 1 + 2.0**-24, 3.0 * 2.0**-20])
def test_first_x_above_is_the_rounding_boundary(m):
    x = ox.first_x_above(m)
    prev = np.nextafter(x, np.float32(-np.inf))
    c = gmpy2.context(precision=200)
    assert c.exp2(gmpy2.mpfr(float(x))) > m
    assert c.exp2(gmpy2.mpfr(float(prev))) < m


def test_bad_format_and_dtype_are_rejected():
    with pytest.raises(ValueError):
        ox.exp2_cr(np.float32([1.0]), "f8")
    with pytest.raises(TypeError):
        ox.exp2_cr(np.float64([1.0]))
