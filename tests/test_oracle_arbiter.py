"""Properties of the mpmath arbiter: scoped precision, p/2p agreement, exact closed forms."""
from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from fa4verify.oracles import attention
from fa4verify.oracles.arbiter import ArbiterDisagreement


def _f32(rng, shape, s=1.0):
    return (rng.standard_normal(shape) * s).astype(np.float32)


def test_arbiter_never_touches_the_global_mpmath_precision():
    rng = np.random.default_rng(0)
    q, k, v = _f32(rng, (1, 3, 1, 4)), _f32(rng, (1, 3, 1, 4)), _f32(rng, (1, 3, 1, 4))
    old = mpmath.mp.prec
    try:
        mpmath.mp.prec = 20          # a caller's low global precision must not leak in
        a = attention.forward(q, k, v, precision=80)
        assert mpmath.mp.prec == 20
    finally:
        mpmath.mp.prec = old
    b = attention.forward(q, k, v, precision=80)
    assert np.array_equal(a.out, b.out)
    assert mpmath.mp.prec == old


def test_arbiter_raises_when_p_and_2p_bits_disagree():
    # float64 inputs, logits ~ 1.1e11 that differ by O(0.1): at 53 bits, rounding 0.1 * s costs
    # ~2^-16 absolute in the exponent argument, far beyond the 2^-(53-32) agreement tolerance
    q = np.ones((1, 1, 1, 1))
    k = np.array([2.0**40, 2.0**40 + 1, 2.0**40 + 3]).reshape(1, 3, 1, 1)
    v = np.array([1.0, -2.0, 0.5]).reshape(1, 3, 1, 1)
    with pytest.raises(ArbiterDisagreement, match="raise the precision"):
        attention.forward(q, k, v, precision=53, softmax_scale=0.1)
    r = attention.forward(q, k, v, precision=160, softmax_scale=0.1)
    f = attention.forward(q, k, v, softmax_scale=0.1)
    assert np.all(np.abs(f.out - r.out) <= f.bound + r.bound)


def test_single_visible_key_gives_v_exactly_and_lse_equal_to_the_logit():
    rng = np.random.default_rng(2)
    q, k, v = _f32(rng, (1, 1, 1, 5)), _f32(rng, (1, 1, 1, 5)), _f32(rng, (1, 1, 1, 5))
    for prec in ("fast", 80):
        r = attention.forward(q, k, v, softmax_scale=0.5, precision=prec)
        assert np.array_equal(r.out[0, 0, 0], v[0, 0, 0].astype(np.float64))
        exact = 0.5 * math.fsum(float(a) * float(b) for a, b in zip(q[0, 0, 0], k[0, 0, 0]))
        assert abs(r.lse[0, 0, 0] - exact) <= r.lse_bound[0, 0, 0]


def test_two_keys_match_closed_form_logistic_at_high_precision():
    q = np.array([[[[1.5, -0.25]]]], np.float32)
    k = np.array([[[[0.75, 2.0]], [[-1.0, 0.5]]]], np.float32)
    v = np.array([[[[3.0]], [[-2.0]]]], np.float32)
    ctx = mpmath.MPContext()
    ctx.prec = 200
    s1 = ctx.mpf(1.5) * ctx.mpf(0.75) + ctx.mpf(-0.25) * 2
    s2 = ctx.mpf(1.5) * -1 + ctx.mpf(-0.25) * ctx.mpf(0.5)
    p1 = 1 / (1 + ctx.exp(s2 - s1))
    o = p1 * 3 + (1 - p1) * -2
    lse = s1 + ctx.log(1 + ctx.exp(s2 - s1))
    for prec in ("fast", 80, 113):
        r = attention.forward(q, k, v, softmax_scale=1.0, precision=prec)
        assert abs(ctx.mpf(float(r.out[0, 0, 0, 0])) - o) <= r.bound[0, 0, 0, 0]
        assert abs(ctx.mpf(float(r.lse[0, 0, 0])) - lse) <= r.lse_bound[0, 0, 0]


@pytest.mark.parametrize("bad", [52, 0, "slow", 80.0, True])
def test_bad_precision_is_a_value_error_naming_precision(bad):
    q = np.zeros((1, 1, 1, 2), np.float32)
    with pytest.raises(ValueError, match="precision"):
        attention.forward(q, q, q, precision=bad)


def test_fast_bound_is_infinite_when_the_error_model_does_not_apply():
    # logits ~ 2^45 (fp32 inputs): u |logit| > 2^-11, the linearised exp error model is void
    q = np.full((1, 1, 1, 1), 2.0**23, np.float32)
    k = np.array([[[[2.0**22]]], [[[2.0**22 + 1]]]], np.float32).reshape(1, 2, 1, 1)
    v = np.ones((1, 2, 1, 1), np.float32)
    r = attention.forward(q, k, v, softmax_scale=1.0)
    assert np.isinf(r.bound).all() and np.isinf(r.lse_bound).all()


def test_saturated_softcap_matches_the_arbiter_forward_and_backward():
    # x/softcap up to ~800: cosh^2 overflows in float64, the softcap derivative underflows
    q = np.array([20.0, -3.0, 0.25], np.float32).reshape(1, 3, 1, 1)
    k = np.array([20.0, 19.5, -3.0, 0.5], np.float32).reshape(1, 4, 1, 1)
    v = np.array([1.0, -2.0, 0.5, 3.0], np.float32).reshape(1, 4, 1, 1)
    do = np.array([0.5, -1.0, 2.0], np.float32).reshape(1, 3, 1, 1)
    kw = dict(softcap=0.5, softmax_scale=1.0)
    fast = attention.backward(q, k, v, None, do, **kw)
    arb = attention.backward(q, k, v, None, do, precision=80, **kw)
    for n in ("dq", "dk", "dv", "d"):
        a, b = getattr(fast, n), getattr(arb, n)
        assert np.all(np.abs(a - b) <= getattr(fast, n + "_bound") + getattr(arb, n + "_bound")), n
    assert np.all(np.abs(fast.forward.out - arb.forward.out) <= fast.forward.bound + arb.forward.bound)


def test_backward_bounds_are_infinite_not_nan_when_the_error_model_does_not_apply():
    q = np.full((1, 2, 1, 1), 2.0**23, np.float32)
    k = np.array([2.0**22, 2.0**22 + 1, -(2.0**22)], np.float32).reshape(1, 3, 1, 1)
    v = np.ones((1, 3, 1, 1), np.float32)
    do = np.ones((1, 2, 1, 1), np.float32)
    r = attention.backward(q, k, v, None, do, causal=True, softmax_scale=1.0)
    for n in ("dq_bound", "dk_bound", "dv_bound", "d_bound"):
        b = getattr(r, n)
        assert not np.isnan(b).any() and np.isinf(b).any(), n
