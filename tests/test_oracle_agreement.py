"""The fast certified reference never differs from the mpmath arbiter by more than the stated bounds.

Hypothesis draws small problems with every feature: bf16/fp16/fp32, causal, windows (including
negative and one-sided), softcap, learnable sinks, GQA/MQA, varlen with zero-length sequences,
seqlen_q != seqlen_k, custom scales, ``dlse``, and both choices of the O entering D.

Checked inequality, elementwise, for every returned quantity x:
``|x_fast - x_arbiter| <= x_fast_bound + x_arbiter_bound``.
On well-scaled inputs (|logits| <= ~40) the fast bound must also be <= 2^-40 relative to the
natural scale (sum_j P_j |V_j| for O, max(1, |lse|) for LSE).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fa4verify.oracles import attention, stats

ml_dtypes = pytest.importorskip("ml_dtypes")

DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}
REL_CLAIM = 2.0 ** -40


@dataclass
class Case:
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    do: np.ndarray
    kw: dict
    dlse: Optional[np.ndarray]
    dtype: str

    def __repr__(self) -> str:  # hypothesis prints this on failure
        return (f"Case(dtype={self.dtype}, q={self.q.shape}, k={self.k.shape}, v={self.v.shape}, "
                f"kw={ {k: (v.tolist() if hasattr(v, 'tolist') else v) for k, v in self.kw.items()} }, "
                f"dlse={'yes' if self.dlse is not None else 'no'}, q0={self.q.reshape(-1)[:4].astype(float).tolist()})")


@st.composite
def cases(draw: Any, max_len: int = 5) -> Case:
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    hk = draw(st.integers(1, 2))
    h = hk * draw(st.integers(1, 3))
    d = draw(st.integers(1, 6))
    dv = draw(st.sampled_from([d, draw(st.integers(1, 5))]))
    varlen = draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    sigma = draw(st.sampled_from([0.5, 1.0, 2.5]))
    dt = DTYPES[dtype]

    def arr(shape, s=sigma):
        return (rng.standard_normal(shape) * s).astype(np.float32).astype(dt)

    kw: dict = {}
    if varlen:
        nb = draw(st.integers(1, 3))
        lq = [draw(st.integers(0, max_len)) for _ in range(nb)]
        lk = [draw(st.integers(0, max_len)) for _ in range(nb)]
        kw["cu_seqlens_q"] = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
        kw["cu_seqlens_k"] = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
        qs, ks = (sum(lq), h, d), (sum(lk), hk, d)
        vs, dos = (sum(lk), hk, dv), (sum(lq), h, dv)
        lse_shape = (h, sum(lq))
    else:
        b = draw(st.integers(1, 2))
        sq, sk = draw(st.integers(1, max_len)), draw(st.integers(1, max_len))
        qs, ks, vs, dos = (b, sq, h, d), (b, sk, hk, d), (b, sk, hk, dv), (b, sq, h, dv)
        lse_shape = (b, h, sq)
    kw["causal"] = draw(st.booleans())
    if draw(st.booleans()):
        ws = st.one_of(st.none(), st.integers(-2, 4))
        kw["window_size"] = (draw(ws), draw(ws))
    if draw(st.booleans()):
        kw["softcap"] = draw(st.sampled_from([0.5, 1.0, 3.0, 10.0]))
    if draw(st.booleans()):
        kw["learnable_sink"] = (rng.standard_normal(h) * 2).astype(np.float32).astype(dt)
    if draw(st.booleans()):
        kw["softmax_scale"] = draw(st.floats(0.05, 2.0))
    dlse = (rng.standard_normal(lse_shape) * 0.5) if draw(st.booleans()) else None
    return Case(arr(qs), arr(ks), arr(vs), arr(dos, 1.0), kw, dlse, dtype)


def _within(name: str, fast: np.ndarray, fb: np.ndarray, arb: np.ndarray, ab: np.ndarray) -> float:
    __tracebackhide__ = True
    fast, arb = np.asarray(fast, float), np.asarray(arb, float)
    same_inf = (fast == arb) & np.isinf(fast)
    with np.errstate(invalid="ignore"):
        diff = np.where(same_inf, 0.0, np.abs(fast - arb))
    ok = diff <= fb + ab
    if not ok.all():
        idx = np.argwhere(~ok)[:5]
        raise AssertionError(f"{name}: |fast - arbiter| > bound at {idx.tolist()}: diff "
                             f"{diff[~ok][:5]}, fast bound {fb[~ok][:5]}, arbiter bound {ab[~ok][:5]}")
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(fb > 0, diff / fb, 0.0)
    return float(r.max(initial=0.0))


SETTINGS = settings(max_examples=250, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@SETTINGS
@given(cases())
def test_forward_reference_within_bound_of_mp_arbiter(c: Case):
    fast = attention.forward(c.q, c.k, c.v, **c.kw)
    arb = attention.forward(c.q, c.k, c.v, precision=80, **c.kw)
    _within("out", fast.out, fast.bound, arb.out, arb.bound)
    _within("lse", fast.lse, fast.lse_bound, arb.lse, arb.lse_bound)
    assert np.array_equal(np.isneginf(fast.lse), np.isneginf(arb.lse))


@SETTINGS
@given(cases(max_len=4), st.booleans())
def test_backward_reference_within_bound_of_mp_arbiter(c: Case, caller_out: bool):
    out = None
    if caller_out:   # what FA4 does: D from the output rounded to the input dtype
        out = attention.forward(c.q, c.k, c.v, **c.kw).out.astype(np.float32).astype(DTYPES[c.dtype])
    fast = attention.backward(c.q, c.k, c.v, out, c.do, dlse=c.dlse, **c.kw)
    arb = attention.backward(c.q, c.k, c.v, out, c.do, dlse=c.dlse, precision=80, **c.kw)
    assert fast.out_source == arb.out_source == ("caller" if caller_out else "oracle")
    for n in ("dq", "dk", "dv", "d"):
        _within(n, getattr(fast, n), getattr(fast, n + "_bound"), getattr(arb, n), getattr(arb, n + "_bound"))
    if "learnable_sink" in c.kw:
        _within("dsink", fast.dsink, fast.dsink_bound, arb.dsink, arb.dsink_bound)
    else:
        assert fast.dsink is None and arb.dsink is None


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(cases())
def test_forward_bound_is_below_2_to_minus_40_relative_on_well_scaled_inputs(c: Case):
    fast = attention.forward(c.q, c.k, c.v, **c.kw)
    s = stats.forward_stats(c.q, c.k, c.v, **c.kw)
    assert np.all(fast.bound <= REL_CLAIM * s.sum_abs_pv)
    fin = np.isfinite(fast.lse)
    assert np.all(fast.lse_bound[fin] <= REL_CLAIM * np.maximum(1.0, np.abs(fast.lse[fin])))


def test_bound_is_not_vacuous_it_is_within_a_small_factor_of_the_observed_error():
    """Tightness: over a fixed sample the largest |fast - arbiter| / bound must be > 2^-10, i.e.
    the bound is not inflated by orders of magnitude (otherwise budgets built on it are useless)."""
    rng = np.random.default_rng(1)
    worst = 0.0
    for _ in range(6):
        q, k, v = (rng.standard_normal((1, 6, 2, 8)).astype(np.float32).astype(ml_dtypes.bfloat16)
                   for _ in range(3))
        f = attention.forward(q, k, v, causal=True)
        a = attention.forward(q, k, v, causal=True, precision=120)
        worst = max(worst, float((np.abs(f.out - a.out) / f.bound).max()))
    assert 2.0 ** -10 < worst <= 1.0, worst


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(cases(max_len=4))
def test_backward_bounds_are_below_2_to_minus_40_of_the_natural_scales(c: Case):
    """dV relative to sum_i P |dO|; dQ, dK relative to |scale| sum_j P g f |K| (resp. |Q|) where
    g = sum|dO||V| + sum|dO||O| + |dlse| is the cancellation-free size of dP - D' (stats.sum_pg_*);
    D relative to sum |dO||O|."""
    fast = attention.backward(c.q, c.k, c.v, None, c.do, dlse=c.dlse, **c.kw)
    s = stats.backward_stats(c.q, c.k, c.v, None, c.do, dlse=c.dlse, **c.kw)
    sc = abs(fast.forward.softmax_scale)
    assert np.all(fast.dv_bound <= REL_CLAIM * s.sum_abs_p_do)
    tiny = 1e-290   # softcap factors below ~1e-308 underflow to 0 in the float64 stats
    assert np.all(fast.dq_bound <= REL_CLAIM * sc * s.sum_pg_k + tiny)
    assert np.all(fast.dk_bound <= REL_CLAIM * sc * s.sum_pg_q + tiny)
    assert np.all(fast.d_bound <= REL_CLAIM * s.sum_abs_do_o)
