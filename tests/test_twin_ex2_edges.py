"""Edge behaviour of the exp2 twin, stated in ``fa4verify.kernels.twin`` (Note [exp2 emulation])."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify.oracles import binary32 as b32
from fa4verify.kernels.fa4_params import load_params
from fa4verify.kernels.twin import ex2_emulation, ex2_emulation_parts

VARIANTS = ("packed", "scalar")


def _p_at_one_fp32(degree: int) -> np.float32:
    """fp32 Horner at f = 1: each fma(q, 1, c) is RN(q + c), computed exactly in float64."""
    cs = load_params().poly_ex2[degree]
    q = np.float32(cs[-1])
    for c in cs[-2::-1]:
        q = np.float32(float(q) + c)   # a sum of two fp32 of similar size is exact in fp64
    return q


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("degree", [1, 3, 5])
def test_integer_inputs_give_exact_powers_of_two(variant, degree):
    n = np.arange(-126, 128, dtype=np.float32)
    assert np.array_equal(ex2_emulation(n, degree, variant), np.exp2(n.astype(np.float64)).astype(np.float32))


@pytest.mark.parametrize("variant", VARIANTS)
def test_clamped_inputs_and_nan_give_positive_zero(variant):
    x = np.array([-127.0, -127.5, -1000.0, -np.inf, np.nan, -3e38,
                  np.uint32(0xFFC00001).view(np.float32)], dtype=np.float32)
    out = ex2_emulation(x, 3, variant)
    assert (out.view(np.uint32) == 0).all(), out


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("degree", [3, 5])
def test_tiny_negative_inputs_give_p_of_one_over_two(variant, degree):
    rng = np.random.default_rng(0)
    x = -np.exp2(rng.uniform(-126, -25, 5000)).astype(np.float32)
    x = x[x > -2.0**-25]
    out = ex2_emulation(x, degree, variant)
    assert np.all(out == np.float32(float(_p_at_one_fp32(degree)) / 2)), np.unique(out)
    # -2^-25 itself is a tie: RN(1 - 2^-25) = 1.0 (even); the next float below gives 1 - 2^-24
    below = np.float32(-2.0**-25) * np.float32(1 + 2.0**-23)
    _, xr, f, _, _ = ex2_emulation_parts(np.float32([-2.0**-25, below]), degree, variant)
    assert float(f[0]) == 1.0 and float(f[1]) == 1 - 2.0**-24


def test_packed_and_scalar_differ_exactly_on_negative_subnormals():
    rng = np.random.default_rng(3)
    x = rng.integers(0, 2**32, 400_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([x, np.arange(1, 5000, dtype=np.uint32).view(np.float32),
                        (np.arange(1, 5000, dtype=np.uint32) | 0x80000000).view(np.float32)])
    a, b = ex2_emulation(x, 3, "packed"), ex2_emulation(x, 3, "scalar")
    differ = a.view(np.uint32) != b.view(np.uint32)
    neg_sub = b32.is_subnormal(x) & np.signbit(x)
    assert np.array_equal(differ, neg_sub)
    assert (b[neg_sub] == 1.0).all()
    assert (a[neg_sub] == np.float32(float(_p_at_one_fp32(3)) / 2)).all()


@pytest.mark.parametrize("variant", VARIANTS)
def test_subnormal_writing_region_is_p_minus_one_times_2_pow_minus_126(variant):
    """x in (-127, -126): exponent field 0 -> the value (p(f) - 1) * 2^-126, f = x + 127."""
    rng = np.random.default_rng(5)
    x = rng.uniform(-127, -126, 20_000).astype(np.float32)
    x = x[(x > -127) & (x < -126)]
    out = ex2_emulation(x, 3, variant).astype(np.float64)
    f = (x.astype(np.float64) + 127.0).astype(np.float32)          # exact
    pf = ex2_emulation(f, 3, variant).astype(np.float64)           # floor 0: the polynomial itself
    assert np.array_equal(out, (pf - 1.0) * 2.0**-126)
    assert np.all(out < 2.0**-126)


@pytest.mark.parametrize("degree", [3, 5])
def test_result_scales_exactly_by_powers_of_two_outside_minus_one_zero(degree):
    """Range-reduction lemma, exact part: for x >= 0 or x <= -1 (normal results) the output is
    p(f) * 2^floor(x) with f = x - floor(x) computed exactly; so emu(f + n) == emu(f) * 2^n."""
    rng = np.random.default_rng(degree)
    f = rng.integers(0, 2**17, 50_000).astype(np.float64) * 2.0**-17   # f on the 2^-17 grid
    base = ex2_emulation(f.astype(np.float32), degree)
    for n in (-126, -100, -64, -2, -1, 1, 7, 8, 64, 126):
        x = (f + n).astype(np.float32)
        assert np.array_equal(x.astype(np.float64), f + n)               # exact
        assert np.array_equal(ex2_emulation(x, degree).astype(np.float64), base.astype(np.float64) * 2.0**n)


def test_minus_one_zero_fraction_is_rounded():
    """For x in (-1, 0) the fraction is RN(1 + x), not exact: two different x share one result."""
    x = np.float32([-2.0**-30, -2.0**-27])
    _, _, f, _, out = ex2_emulation_parts(x, 3)
    assert np.all(f == 1.0) and out[0] == out[1]


def test_x_in_127_128_is_still_correct_and_128_is_garbage():
    x = np.float32([127.25, 127.9])
    out = ex2_emulation(x, 3).astype(np.float64)
    assert np.all(np.abs(out / np.exp2(x.astype(np.float64)) - 1) < 1e-4)
    g = ex2_emulation(np.float32([128.0, 200.0, np.inf]), 3)
    assert not np.any(np.isfinite(g) & (g > 0) & (np.abs(g.astype(np.float64) / np.exp2([128.0, 200.0, np.inf]) - 1) < 1e-3))


def test_rejects_unknown_degree_and_variant():
    with pytest.raises(ValueError, match="degree"):
        ex2_emulation(np.float32([0.0]), 7)
    with pytest.raises(ValueError, match="variant"):
        ex2_emulation(np.float32([0.0]), 3, "vector")
