"""Split-KV combine: oracle semantics (vs mpmath and vs a float64 full attention), the CPU twin of
FA4's combine kernel within its local budget, and split forwards + combine end to end."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fa4verify.judge import dense_problem
from fa4verify.judge.split_combine import judge_combine_stage, judge_split_combine, split_problems
from fa4verify.kernels import twin_combine as tc
from fa4verify.oracles import combine as oc
from fa4verify.targets import TwinTarget


def _partials(rng, S, shape=(2, 5, 3), d=16, lse_scale=3.0, lse_shift=0.0, empty=0.0):
    O = rng.standard_normal((S,) + shape + (d,)).astype(np.float32)
    L = (rng.standard_normal((S,) + shape) * lse_scale + lse_shift).astype(np.float32)
    if empty:
        L = np.where(rng.random(L.shape) < empty, -np.inf, L).astype(np.float32)
        O = np.where(np.isinf(L)[..., None], np.nan, O).astype(np.float32)   # empty splits: anything
    return O, L


def test_combine_reference_within_bound_of_mpmath_arbiter():
    rng = np.random.default_rng(1)
    for S, empty in ((1, 0.0), (3, 0.0), (7, 0.3), (5, 1.0)):
        O, L = _partials(rng, S, shape=(4,), d=3, lse_scale=20.0, empty=empty)
        r = oc.combine(O, L)
        mo, ml = oc.combine_mp(O, L)
        fin = np.isfinite(mo)
        assert np.all(np.abs(r.out - mo)[fin] <= r.bound[fin])
        assert np.all(np.isfinite(r.out) == fin)
        lf = np.isfinite(ml)
        assert np.all(np.abs(r.lse - ml)[lf] <= r.lse_bound[lf])
        assert np.array_equal(np.isneginf(r.lse), np.isneginf(ml))
        assert np.all(r.out[~lf] == 0)                 # every split empty: O = 0, LSE = -inf


def _naive_attention(q, k, v, scale):
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    m = s.max(-1, keepdims=True)
    e = np.exp(s - m)
    lse = (np.log(e.sum(-1)) + m[..., 0])                    # (b, h, q)
    o = np.einsum("bhqk,bkhd->bqhd", e / e.sum(-1, keepdims=True), v)
    return o, lse


def test_exact_combine_of_chunk_attention_is_full_attention():
    """The split identity, checked against an independent float64 attention (not the oracle)."""
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, 6, 2, 8)) for _ in range(3))
    k = np.concatenate([k, rng.standard_normal((1, 31, 2, 8))], axis=1)
    v = np.concatenate([v, rng.standard_normal((1, 31, 2, 8))], axis=1)
    o_full, l_full = _naive_attention(q, k, v, 0.3)
    for S in (1, 2, 5, 37):
        edges = [round(i * k.shape[1] / S) for i in range(S + 1)]
        parts = [_naive_attention(q, k[:, a:b], v[:, a:b], 0.3) for a, b in zip(edges, edges[1:])]
        r = oc.combine(np.stack([p[0] for p in parts]), np.stack([p[1].transpose(0, 2, 1) for p in parts]))
        np.testing.assert_allclose(r.out, o_full, rtol=0, atol=1e-13)
        np.testing.assert_allclose(r.lse, l_full.transpose(0, 2, 1), rtol=0, atol=1e-13)


@pytest.mark.parametrize("mufu", ["correctly-rounded", "perturbed"])
@pytest.mark.parametrize("contract", [True, False])
def test_twin_combine_within_local_budget(mufu, contract):
    rng = np.random.default_rng(3)
    for S, scale, shift, empty, dt in ((1, 1.0, 0.0, 0.0, "bf16"), (2, 3.0, 5.0, 0.0, "bf16"),
                                       (16, 30.0, -200.0, 0.2, "fp16"), (64, 2.0, 900.0, 0.5, "bf16"),
                                       (256, 5.0, 0.0, 0.0, "bf16")):
        O, L = _partials(rng, S, lse_scale=scale, lse_shift=shift, empty=empty)
        r = tc.combine(O, L, out_dtype=dt, contract=contract, mufu=mufu, seed=S)
        vo, vl = judge_combine_stage(O, L, r.out, r.lse, dtype=dt, arch="sm90")
        assert vo.status == "pass", vo.summary()
        assert vl.status == "pass", vl.summary()
        assert vo.n_compared > 0


def test_twin_combine_ignores_nan_partials_of_empty_splits():
    rng = np.random.default_rng(4)
    O, L = _partials(rng, 6, empty=0.5)
    assert np.isnan(O).any()
    r = tc.combine(O, L, out_dtype="bf16")
    allempty = np.all(np.isinf(L), axis=0)
    assert np.all(np.isfinite(r.out))
    assert np.all(r.out[allempty] == 0) and np.all(np.isneginf(r.lse[allempty]))


def test_wrong_combine_fails_the_stage_budget():
    """A combine that drops the last split (a plausible off-by-one) must fail the same judge."""
    rng = np.random.default_rng(5)
    O, L = _partials(rng, 4)
    r = tc.combine(O[:-1], L[:-1], out_dtype="bf16")
    vo, vl = judge_combine_stage(O, L, r.out, r.lse, dtype="bf16", arch="sm90")
    assert vo.status == "fail" and vl.status == "fail"


def _problem(seqlen_k=200, seed=0):
    p = dense_problem(np.zeros((1, 24, 2, 32)), np.zeros((1, seqlen_k, 2, 32)), np.zeros((1, seqlen_k, 2, 32)),
                      arch="sm90", dtype="bf16")
    p = dataclasses.replace(p, values=dataclasses.replace(p.values, seed=seed))
    return p, p.materialize()


@pytest.mark.parametrize("S", [1, 3, 8])
def test_twin_split_forwards_plus_combine_within_composed_budget(S):
    p, a = _problem()
    tw = TwinTarget()
    parts = [tw.forward(pp, aa) for pp, aa, _ in split_problems(p, a, S)]
    O = np.stack([f.out for f in parts])
    L = np.stack([np.transpose(f.lse, (0, 2, 1)) for f in parts])
    r = tc.combine(O, L, out_dtype="bf16")
    j = judge_split_combine(p, a, S, [f.out for f in parts], [f.lse for f in parts], r.out,
                            np.transpose(r.lse, (0, 2, 1)))
    for v in j.verdicts:
        assert v.status == "pass", v.summary()
    assert 0 < j.out.tightness < 1


def test_split_combine_with_a_wrong_weight_fails():
    p, a = _problem(seed=1)
    tw = TwinTarget()
    parts = [tw.forward(pp, aa) for pp, aa, _ in split_problems(p, a, 4)]
    O = np.stack([f.out for f in parts])
    L = np.stack([np.transpose(f.lse, (0, 2, 1)) for f in parts])
    r = tc.combine(O, L + np.float32(0.05) * (np.arange(4) == 0)[:, None, None, None], out_dtype="bf16")
    j = judge_split_combine(p, a, 4, [f.out for f in parts], [f.lse for f in parts], r.out)
    assert j.out.status == "fail", j.out.summary()
