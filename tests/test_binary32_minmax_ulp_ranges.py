"""fmax/fmin NaN and signed-zero semantics, FTZ, ulp helpers and f32 range iteration."""
from __future__ import annotations

import math

import numpy as np
import pytest

from fa4verify.oracles import binary32 as b32

NAN = np.float32(np.nan)


def _ref_max(a: float, b: float, nan: bool) -> float:
    if math.isnan(a) or math.isnan(b):
        if nan or (math.isnan(a) and math.isnan(b)):
            return float("nan")
        return b if math.isnan(a) else a
    if a == b == 0:
        return a if not math.copysign(1, a) < 0 else b
    return max(a, b)


def _ref_min(a: float, b: float, nan: bool) -> float:
    if math.isnan(a) or math.isnan(b):
        if nan or (math.isnan(a) and math.isnan(b)):
            return float("nan")
        return b if math.isnan(a) else a
    if a == b == 0:
        return a if math.copysign(1, a) < 0 else b
    return min(a, b)


@pytest.mark.parametrize("nan", [False, True])
def test_fmax_fmin_follow_ptx_semantics(nan):
    vals = np.float32([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 2.0**-149, -2.0**-149, 3e38])
    a, b = np.meshgrid(vals, vals)
    a, b = a.ravel(), b.ravel()
    for fn, ref in ((b32.fmax, _ref_max), (b32.fmin, _ref_min)):
        got = fn(a, b, nan=nan)
        for i in range(a.size):
            r = ref(float(a[i]), float(b[i]), nan)
            if math.isnan(r):
                assert np.isnan(got[i]) and got[i:i+1].view(np.uint32)[0] == b32.CANONICAL_NAN_BITS
            else:
                assert float(got[i]) == r and np.signbit(got[i]) == (math.copysign(1, r) < 0), (fn, a[i], b[i])


def test_fmax_clamp_used_by_exp2_ignores_nan():
    assert b32.fmax(NAN, np.float32(-127.0)) == -127.0
    assert np.isnan(b32.fmax(NAN, np.float32(-127.0), nan=True))


def test_fmax_flush_treats_subnormals_as_signed_zero():
    assert b32.fmax(np.float32(2.0**-140), np.float32(-0.0), flush=True) == 0
    r = b32.fmin(np.float32(-2.0**-140), np.float32(0.0), flush=True)
    assert r == 0 and np.signbit(r)


def test_ulp_at_zero_subnormal_edge_max_finite_and_inf():
    f = b32.ulp
    assert f(np.float32(0.0)) == 2.0**-149 and f(np.float32(-0.0)) == 2.0**-149
    assert f(np.float32(2.0**-126)) == 2.0**-149
    assert f(np.float32(2.0**-126) - np.float32(2.0**-149)) == 2.0**-149
    assert f(np.float32(1.0)) == 2.0**-23 and f(np.float32(-1.5)) == 2.0**-23
    assert f(np.float32(2.0**-149)) == 2.0**-149
    assert f(b32.FLT_MAX) == 2.0**104
    assert np.isnan(f(np.float32(np.inf))) and np.isnan(f(np.float32(-np.inf))) and np.isnan(f(NAN))
    assert f(np.float32(1.0), "bf16") == 2.0**-7 and f(np.float32(0.0), "bf16") == 2.0**-133
    assert f(np.float32(1.0), "f16") == 2.0**-10 and f(np.float32(2.0**-20), "f16") == 2.0**-24
    assert f(np.float32(65504.0), "f16") == 32.0
    # against numpy.spacing for fp32 and fp16 on random finite values
    rng = np.random.default_rng(0)
    x = rng.integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = x[np.isfinite(x)]
    assert np.array_equal(f(x), np.spacing(np.abs(x)).astype(np.float64))
    h = x[np.abs(x) < 65504].astype(np.float16)      # max-finite checked above (spacing says inf)
    h = h[np.abs(h) < 65504]
    h = h[np.isfinite(h)]
    assert np.array_equal(f(h.astype(np.float32), "f16"), np.spacing(np.abs(h)).astype(np.float64))


def test_ulp_distance_properties():
    d = b32.ulp_distance
    assert d(np.float32(0.0), np.float32(-0.0)) == 0
    assert d(np.float32(2.0**-149), np.float32(-2.0**-149)) == 2
    assert d(b32.FLT_MAX, np.float32(np.inf)) == 1
    assert d(np.float32(1.0), np.float32(2.0)) == 2**23
    assert d(np.float32(1.0), NAN) == -1
    rng = np.random.default_rng(1)
    a = rng.uniform(-10, 10, 1000).astype(np.float32)
    assert np.all(d(a, np.nextafter(a, np.float32(np.inf))) == 1)
    assert np.all(b32.ordered(np.nextafter(a, np.float32(np.inf))) - b32.ordered(a) == 1)


def test_iter_and_count_f32_range():
    assert b32.count_f32_range(0.0, 1.0) == 0x3F800000 + 1
    assert b32.count_f32_range(-1.0, 1.0) == 2 * 0x3F800000 + 1
    assert b32.count_f32_range(1.0, 2.0) == 2**23 + 1
    assert b32.count_f32_range(0.1, 0.1) == 0          # 0.1 is not a float32
    assert b32.count_f32_range(2.0, 1.0) == 0
    lo, hi = -2.0**-130, 2.0**-128 * 1.2345
    chunks = list(b32.iter_f32_range(lo, hi, chunk=1 << 20))
    allv = np.concatenate(chunks)
    assert allv.size == b32.count_f32_range(lo, hi) and max(c.size for c in chunks) <= 1 << 20
    assert np.all(np.diff(allv.astype(np.float64)) > 0)
    assert allv[0] == np.float32(lo)
    assert np.nextafter(allv[-1], np.float32(1)) > hi
    assert np.all((allv >= lo) & (allv <= hi))
    assert np.sum(allv == 0) == 1
    v = np.concatenate(list(b32.iter_f32_range(0.1, 0.1000001)))
    assert np.all(v >= 0.1) and np.all(v <= 0.1000001) and v.size == b32.count_f32_range(0.1, 0.1000001)
    assert np.nextafter(v[0], np.float32(0)) < 0.1 and np.nextafter(v[-1], np.float32(1)) > 0.1000001
    inf = np.concatenate(list(b32.iter_f32_range(3e38, np.inf)))
    assert inf[-1] == np.inf


def test_as_f32_refuses_inexact_conversion():
    with pytest.raises(ValueError):
        b32.as_f32(np.float64(0.1))
    assert b32.as_f32(np.float64(0.5)).dtype == np.float32
