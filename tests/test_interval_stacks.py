"""Note [Blocks in stacks] (fa4verify/judge/stats.py): the interval bound and the first-order
budgets' sums evaluate their small (segment, query head) blocks stacked and padded; every
gradient's bound, fallback mask and power threshold are those of the blocks evaluated one at a
time, up to float64 summation order (SLACK covers it). CPU, the judge alone."""
from __future__ import annotations

import copy

import numpy as np
import pytest

from fa4verify import judge
from fa4verify.coverage import cases
from fa4verify.fuzz.properties import _budget
from fa4verify.judge import stats as stats_mod
from fa4verify.problem import AttentionProblem, ValueSpec

_SQ = (1, 6, 2, 7, 3, 8, 4, 9, 5, 0, 6, 2, 7, 3, 8, 4, 9, 5, 1, 6)
_SK = (13, 5, 9, 2, 13, 11, 7, 0, 12, 4, 3, 13, 8, 6, 10, 1, 13, 9, 5, 7)


def _problem(name: str) -> AttentionProblem:
    vs = ValueSpec("outliers", 1174656166, cases._VALUE_PARAMS.get("outliers", ()))
    base = AttentionProblem(arch="sm90", dtype="bf16", batch=len(_SQ), seqlen_q=max(_SQ), seqlen_k=max(_SK),
                            seqlens_q=_SQ, seqlens_k=_SK, nheads=8, nheads_kv=2, head_dim=64, head_dim_v=64,
                            softmax_scale=0.05, values=vs)
    return {"varlen_gqa": base,
            "varlen_causal_sink_softcap": base.replace(causal=True, sink=True, softcap=30.0),
            "varlen_window_mha": base.replace(nheads=3, nheads_kv=3, window_size=(3, 1)),
            # score pairs: the pair's callables per block of a stack, with the block's own indices
            "varlen_alibi_gqa": base.replace(mods=("alibi",), causal=True),
            "varlen_rel_scale": base.replace(nheads=2, nheads_kv=2, mods=("rel_scale",)),
            "dense_batches": AttentionProblem(arch="sm90", dtype="bf16", batch=5, seqlen_q=9, seqlen_k=17, nheads=4,
                                              nheads_kv=1, head_dim=32, head_dim_v=32, softmax_scale=0.1,
                                              values=vs, sink=True)}[name]


def _passes(p: AttentionProblem):
    """The driver's pass and a dLSE pass on one statistics object, as the fuzz runner judges."""
    a = p.materialize()
    dl = (np.random.default_rng(3).standard_normal(p.fully_masked_rows().shape) * 0.5).astype(np.float32)
    of, (ob, obd) = judge.oracle_pass(p, a, (None, dl))
    ref_out, _lse, st, _ = judge.forward_allowances(p, a, budgets=_budget(p), oracle=of)
    kw = dict(probabilistic=False, kernel_fwd=(np.asarray(of.out, np.float32), np.asarray(of.lse, np.float32)),
              tensor_core="sm90")
    out = []
    with np.errstate(invalid="ignore", over="ignore"):
        for o, d in ((ob, None), (obd, dl)):
            s = copy.copy(st)
            b = s.backward(o, ref_out.budget, ref_out.bound, dlse=d, **kw)
            # the first-order budgets on their own too, the sharper tier's sums included
            fo = copy.copy(st)._backward_first_order(o, ref_out.budget, ref_out.bound, probabilistic=d is None,
                                                     dl_t=None if d is None else st._lse_tokens(d))
            b.update({f"first_order_{n}": x for n, x in fo.items()})
            out.append(({n: np.asarray(x, np.float64) for n, x in b.items()},
                        {n: np.asarray(x) for n, x in s.bwd_fallback.items()}, dict(s.bwd_blind_above)))
    return out, st


@pytest.mark.parametrize("name", ["varlen_gqa", "varlen_causal_sink_softcap", "varlen_window_mha", "dense_batches",
                                  "varlen_alibi_gqa", "varlen_rel_scale"])
def test_stacked_blocks_bound_as_blocks_one_at_a_time(name, monkeypatch):
    p = _problem(name)
    stacked, st = _passes(p)
    sizes = [len(s) for s in st._interval_stacks()]
    assert max(sizes) > 1, f"no stack of several blocks formed ({sizes}): the test would compare nothing"
    assert stacked[0][1]["dq"].any(), "the interval bound must decide somewhere for this test to say anything"
    monkeypatch.setattr(stats_mod, "_STACK_PAIRS", 1)        # every block alone: the plain loop
    alone, st1 = _passes(p)
    assert max(len(s) for s in st1._interval_stacks()) == 1
    for (b_s, f_s, w_s), (b_a, f_a, w_a) in zip(stacked, alone):
        assert b_s.keys() == b_a.keys()
        for n in b_s:
            fin = np.isfinite(b_a[n])
            assert np.array_equal(fin, np.isfinite(b_s[n])), n
            np.testing.assert_allclose(b_s[n][fin], b_a[n][fin], rtol=1e-11, atol=0, err_msg=n)
        for n in f_s:
            assert np.array_equal(f_s[n], f_a[n]), n
        for n in w_s:
            np.testing.assert_allclose(w_s[n], w_a[n], rtol=1e-11, err_msg=n)


def test_a_padded_pair_adds_nothing():
    """A stack's padding (rows without a visible key, masked keys) carries exactly zero P and dS,
    and the cast's floor of a masked pair: the blocks of different sizes in one stack give each
    real pair its own interval."""
    from fa4verify.error_budgets import interval as ivm
    p = _problem("varlen_gqa")
    a = p.materialize()
    of = judge.oracle_forward(p, a)
    _ref, _lse, st, _ = judge.forward_allowances(p, a, budgets=_budget(p), oracle=of)
    stack = max(st._interval_stacks(), key=len)
    ix = stats_mod._Stack(st, stack)
    assert not ix.qv.all() and not ix.kv.all(), "the stack must hold padding"
    qb, kb = ix.at_q(st.q), ix.at_k(st.k)
    lse = ix.at_q(st.lse_t, -np.inf)
    kw = dict(q=qb, k=kb, lse_mid=lse, lse_rad=ix.at_q(np.zeros_like(st.lse_t)), keep=ix.keep, scale=st.scale,
              exact=(ix.at_q(st.O), lse))
    with np.errstate(invalid="ignore", over="ignore"):
        pi = ivm.pair_intervals(st.budget, v=ix.at_k(st.v), dout=ix.at_q(st.dout), o_mid=ix.at_q(st.O),
                                o_rad=ix.at_q(np.zeros_like(st.O)), **kw)
    pad = ~(ix.qv[:, :, None] & ix.kv[:, None, :])
    for x in (pi.p_lo, pi.ds_lo, pi.ds_hi, pi.p_ex, pi.ds_mag, pi.ds_drop):
        assert np.all(x[pad] == 0.0)
    floor = float(np.asarray(st.budget.evaluate("bwd_p_cast", {"p": np.zeros(1)})).ravel()[0])
    assert np.all(pi.p_hi[pad] == floor)


@pytest.mark.parametrize("name", ["varlen_gqa", "varlen_causal_sink_softcap", "varlen_window_mha", "dense_batches"])
def test_a_segments_heads_at_once_give_each_heads_statistics(name, monkeypatch):
    """Note [A segment's heads at once]: the forward statistics of a small segment's heads formed
    as one stack equal those of its heads one at a time (up to BLAS's order of sums), and so do
    the forward budgets built on them."""
    p = _problem(name)
    a = p.materialize()
    of = judge.oracle_forward(p, a)

    def stats():
        ref_out, _lse, st, _ = judge.forward_allowances(p, a, budgets=_budget(p), oracle=of)
        return ref_out, st
    r_s, s_s = stats()
    monkeypatch.setattr(stats_mod, "_SEG_STACK_PAIRS", 0)         # every head alone
    r_a, s_a = stats()
    for d_s, d_a in ((s_s.row, s_a.row), (s_s.el, s_a.el), (s_s.hull, s_a.hull)):
        for n in d_a:
            np.testing.assert_allclose(d_s[n], d_a[n], rtol=1e-13, atol=1e-300, err_msg=n)
    for (_q, _k, W_s, T_s), (_q2, _k2, W_a, T_a) in zip(s_s._w, s_a._w):
        np.testing.assert_allclose(W_s, W_a, rtol=1e-13, atol=1e-300)
        np.testing.assert_allclose(T_s, T_a, rtol=1e-13, atol=1e-300)
    np.testing.assert_allclose(r_s.budget, r_a.budget, rtol=1e-13, atol=1e-300)
