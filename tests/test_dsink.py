"""Note [dsink given the forward]: the learnable sink's gradient is judged against the sum FA4 must
form from its own forward LSE and O (error_budgets/interval.py ``dsink_given_forward``). The
allowance holds against FA4's fp32 procedure simulated with every rounding at its worst (MUFU
perturbed, the sums in a shuffled order), and a wrong dsink fails."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from fa4verify.error_budgets import interval as ivm
from fa4verify.error_budgets.loader import load as load_budget

C = load_budget("bf16", "sm90").constants
LOG2E_F32 = np.float32(np.log2(np.e))


def _bf16(x):
    import torch
    return torch.as_tensor(np.asarray(x, np.float32)).to(torch.bfloat16).to(torch.float32).numpy().astype(np.float64)


def _case(rng, B=2, S=37, H=3, d=64, lse_scale=3.0):
    out = _bf16(rng.standard_normal((B, S, H, d)))
    dout = _bf16(rng.standard_normal((B, S, H, d)))
    lse = np.float32(rng.standard_normal((B, H, S)) * lse_scale + 2.0).astype(np.float64)
    sink = _bf16(rng.standard_normal(H))
    return sink, lse, dout, out


def _fa4_like(sink, lse, dout, out, rng, dlse=None):
    """FA4's dsink in fp32 (dsink_row_term + block_sum), the roundings real, MUFU perturbed within
    its bound, the sums in a random order; with ``dlse`` the preprocess's D' = RN(D - dLSE)."""
    f32 = np.float32
    B, S, H, d = out.shape
    res = np.zeros(H)
    for h in range(H):
        terms = []
        for b in range(B):
            for i in range(S):
                o = out[b, i, h].astype(f32)
                prod = (dout[b, i, h].astype(f32) * o).astype(f32)
                D = f32(0)
                for t in rng.permutation(prod):
                    D = f32(D + t)
                if dlse is not None:
                    D = f32(D - f32(dlse[b, h, i]))
                arg = f32(f32(sink[h]) - f32(lse[b, h, i]))
                x = f32(arg * LOG2E_F32)
                p = f32(np.exp2(np.float64(x)) * (1 + rng.uniform(-1, 1) * C["mufu_ex2_rel"]))
                terms.append(f32(-p * D))
        acc = f32(0)
        for t in rng.permutation(np.array(terms, f32)):
            acc = f32(acc + t)
        res[h] = float(acc)
    return res


@pytest.mark.parametrize("seed", range(8))
def test_the_allowance_holds_fa4s_fp32_procedure(seed):
    rng = np.random.default_rng(seed)
    sink, lse, dout, out = _case(rng)
    ref, allow = ivm.dsink_given_forward(sink, lse, dout, out, C)
    got = _fa4_like(sink, lse, dout, out, rng)
    err = np.abs(got - ref)
    assert (err <= allow).all(), (err, allow)
    assert (allow < 1e-3 * np.maximum(np.abs(ref), 1e-6) + 1e-3).all(), (allow, ref)   # not vacuous


@pytest.mark.parametrize("sink_dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("seed", range(4))
def test_a_16_bit_sink_takes_dsink_stored_in_its_dtype(seed, sink_dtype):
    """FA4 writes dsink in the sink's dtype (``torch.empty_like(learnable_sink)``): the fp32 sum
    rounded to bf16 / fp16 stays inside that dtype's allowance, and exceeds the fp32 one (so the
    store term is the one that admits it, not slack elsewhere)."""
    import torch
    rng = np.random.default_rng(200 + seed)
    sink, lse, dout, out = _case(rng, S=64)
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}[sink_dtype]
    got32 = _fa4_like(sink, lse, dout, out, rng)
    got = torch.as_tensor(got32, dtype=torch.float32).to(tdt).double().numpy()
    ref, allow = ivm.dsink_given_forward(sink, lse, dout, out, C, sink_dtype=sink_dtype)
    assert (np.abs(got - ref) <= allow).all(), (np.abs(got - ref), allow)
    _, allow32 = ivm.dsink_given_forward(sink, lse, dout, out, C)
    assert (np.abs(got - ref) > allow32).any(), (np.abs(got - ref), allow32)
    with pytest.raises(ValueError, match="sink dtype"):
        ivm.dsink_given_forward(sink, lse, dout, out, C, sink_dtype="fp8")


@pytest.mark.parametrize("seed", range(4))
def test_the_allowance_holds_with_a_gradient_through_the_lse(seed):
    """D' = RN(D - dLSE) enters each row's term; the allowance takes the subtraction, and a
    dsink formed without dLSE (or with its sign flipped) fails."""
    rng = np.random.default_rng(100 + seed)
    sink, lse, dout, out = _case(rng)
    dl = np.float32(rng.standard_normal(lse.shape) * 0.5).astype(np.float64)
    ref, allow = ivm.dsink_given_forward(sink, lse, dout, out, C, dlse=dl)
    got = _fa4_like(sink, lse, dout, out, rng, dlse=dl)
    assert (np.abs(got - ref) <= allow).all(), (np.abs(got - ref), allow)
    plain, _ = ivm.dsink_given_forward(sink, lse, dout, out, C)
    flipped, _ = ivm.dsink_given_forward(sink, lse, dout, out, C, dlse=-dl)
    assert (np.abs(plain - ref) > allow).all() and (np.abs(flipped - ref) > allow).all()
    v_ref, v_allow = ivm.dsink_given_forward(sink, lse[0], dout[0], out[0], C, dlse=dl[0])   # varlen layout
    d_ref, d_allow = ivm.dsink_given_forward(sink, lse[:1], dout[:1], out[:1], C, dlse=dl[:1])
    assert np.allclose(v_ref, d_ref, rtol=1e-15) and np.allclose(v_allow, d_allow, rtol=1e-12)
    with pytest.raises(ValueError, match="dLSE"):
        ivm.dsink_given_forward(sink, lse, dout, out, C, dlse=dl[0])


def test_a_wrong_dsink_exceeds_the_allowance():
    rng = np.random.default_rng(7)
    sink, lse, dout, out = _case(rng)
    ref, allow = ivm.dsink_given_forward(sink, lse, dout, out, C)
    assert (np.abs(ref) * 2.0 ** -10 > allow).all(), (ref, allow)         # a 2^-10 relative bias fails
    dropped = lse.copy()
    dropped[0, :, 5] = np.inf                                            # one row's term missing
    ref2, _ = ivm.dsink_given_forward(sink, dropped, dout, out, C)
    assert (np.abs(ref2 - ref) > allow).any()


def test_rows_that_attended_nothing_or_overflowed_follow_fa4s_rule_and_a_nan_is_undecided():
    rng = np.random.default_rng(3)
    sink, lse, dout, out = _case(rng, B=1, S=4, H=1, d=8)
    lse[0, 0, 0], lse[0, 0, 1] = -np.inf, np.inf          # sink holds all the mass; sink overflow (p = 0)
    ref, allow = ivm.dsink_given_forward(sink, lse, dout, out, C)
    D = np.einsum("bshd,bshd->bhs", dout, out)[0, 0]
    want = -(D[0] + np.exp(sink[0] - lse[0, 0, 2]) * D[2] + np.exp(sink[0] - lse[0, 0, 3]) * D[3])
    assert ref[0] == pytest.approx(want, rel=1e-12) and np.isfinite(allow).all()
    lse[0, 0, 2] = np.nan
    assert np.isnan(ivm.dsink_given_forward(sink, lse, dout, out, C)[1]).all()


def test_a_sink_of_minus_inf_takes_the_dlse_of_the_rows_no_key_reaches():
    """Note [A sink of -inf]: P_sink is 0 where a key is visible and 1 where the LSE is -inf (O = 0
    there, so D' = -dLSE): dsink is the sum of dLSE over those rows, in the allowance's reach of
    the oracle's own value, and FA4's branch taken as 0 (the planted ``dsink_empty_row_zero``)
    falls outside it."""
    from fa4verify.oracles import attention
    rng = np.random.default_rng(13)
    q, k, v, do = (rng.standard_normal(s).astype(np.float32) for s in ((1, 9, 2, 8), (1, 4, 2, 8), (1, 4, 2, 8),
                                                                        (1, 9, 2, 8)))
    sink = np.array([-np.inf, 0.25])
    dl = rng.standard_normal((1, 2, 9)).astype(np.float32)
    f = attention.forward(q, k, v, causal=True, learnable_sink=sink)       # rows 0..4 see no key
    assert np.all(f.lse[0, 0, :5] == -np.inf)
    ref, allow = ivm.dsink_given_forward(sink, f.lse, do, f.out.astype(np.float32), C, dlse=dl)
    ob = attention.backward(q, k, v, f.out.astype(np.float32), do, causal=True, learnable_sink=sink, dlse=dl)
    assert ref[0] == pytest.approx(float(dl[0, 0, :5].astype(np.float64).sum()), rel=1e-12)
    assert abs(ref[0] - float(ob.dsink[0])) <= allow[0] and np.isfinite(allow).all()
    assert abs(ref[1] - float(ob.dsink[1])) <= allow[1]
    assert abs(ref[0]) > allow[0]      # a P_sink of 0 there (dsink 0) is outside the allowance


def test_varlen_layout_matches_the_dense_one():
    rng = np.random.default_rng(5)
    sink, lse, dout, out = _case(rng, B=1, S=21, H=2, d=16)
    ref, allow = ivm.dsink_given_forward(sink, lse, dout, out, C)
    ref_v, allow_v = ivm.dsink_given_forward(sink, lse[0], dout[0], out[0], C)
    assert np.allclose(ref, ref_v, rtol=1e-15) and np.allclose(allow, allow_v, rtol=1e-12)
    with pytest.raises(ValueError, match="layouts"):
        ivm.dsink_given_forward(sink, lse, dout[:, :5], out[:, :5], C)


def test_the_property_judges_a_targets_dsink():
    from fa4verify.fuzz.properties import _judge_dsink
    from fa4verify.fuzz.violation import Violation
    from fa4verify.problem import AttentionProblem
    rng = np.random.default_rng(11)
    sink, lse, dout, out = _case(rng, B=1, S=16, H=2, d=32)
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=16, seqlen_k=16, nheads=2, nheads_kv=2,
                         head_dim=32, head_dim_v=32, sink=True)
    a = {"learnable_sink": sink.astype(np.float32), "dout": dout}
    fwd = SimpleNamespace(out=out, lse=lse)
    stats = SimpleNamespace(budget=SimpleNamespace(constants=C))
    ref, _ = ivm.dsink_given_forward(sink, lse, dout, out, C)
    und: dict = {}
    assert _judge_dsink(p, a, fwd, SimpleNamespace(dsink=ref.astype(np.float32)), stats, und) < 1 and not und
    with pytest.raises(Violation, match="dsink"):
        _judge_dsink(p, a, fwd, SimpleNamespace(dsink=(ref * (1 + 2.0 ** -8)).astype(np.float32)), stats, und)


def test_the_score_pair_oracle_reads_a_sink_of_minus_inf_as_the_reference_does():
    """Note [A sink of -inf] in the score-pair oracle (``oracles/mods.py``): the head's O and LSE
    are those without a sink, nothing NaN, and dsink the sum of dLSE over the rows no key reaches."""
    from fa4verify import judge
    from fa4verify.problem import AttentionProblem, ValueSpec
    base = dict(arch="sm90", dtype="bf16", batch=1, seqlen_q=9, seqlen_k=5, nheads=2, nheads_kv=2, head_dim=32,
                head_dim_v=32, mods=("alibi",), causal=True)
    p = AttentionProblem(sink=True, values=ValueSpec("normal", 3, (("sink_off_head", 0.0),)), **base)
    a = p.materialize()
    assert a["learnable_sink"][0] == -np.inf and np.isfinite(a["learnable_sink"][1])
    f = judge.oracle_forward(p, a)
    dl = np.random.default_rng(2).standard_normal(np.shape(f.lse)).astype(np.float32)
    b = judge.oracle_backward(p, a, dlse=dl)
    assert np.isfinite(f.out).all() and np.isfinite(f.lse[:, 1]).all() and np.isfinite(b.dsink_bound).all()
    assert np.all(np.asarray(f.lse)[0, 0, :4] == -np.inf)
    f0 = judge.oracle_forward(AttentionProblem(values=ValueSpec("normal", 3), **base), dict(a, learnable_sink=None))
    assert np.array_equal(np.asarray(f.out)[:, :, 0], np.asarray(f0.out)[:, :, 0])
    want = float(dl[0, 0, :4].astype(np.float64).sum())
    assert abs(float(b.dsink[0]) - want) <= float(b.dsink_bound[0]) <= 1e-12 * max(1.0, abs(want))
