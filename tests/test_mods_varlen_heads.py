"""Mod pairs on varlen calls, and mask pairs that read the query head (Note [Masks by head] in
fa4verify/problem/__init__.py): the two red-team escapes of the H200 round at dd41c8f
(``fwd_mask_mod_packgqa_head_stride``, ``bwd_varlen_score_mod_q_wrap_by_seqlen_k``)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fa4verify import mods
from fa4verify.errors import ModPairError
from fa4verify.judge import attention as ja
from fa4verify.kernels.mods import ModPair
from fa4verify.oracles import mods as om
from fa4verify.problem import AttentionProblem


def _bf16(x):
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def _varlen(pair: str, sqs=(40, 0, 7, 19), sks=(33, 5, 0, 60), **kw) -> AttentionProblem:
    return AttentionProblem(arch="sm90", dtype="bf16", batch=len(sqs), seqlens_q=sqs, seqlens_k=sks,
                            seqlen_q=max(sqs), seqlen_k=max(sks), nheads=4, nheads_kv=2, head_dim=64, head_dim_v=64,
                            mods=(pair,), **kw)


@pytest.mark.parametrize("pair", ["alibi", "rel_bias", "rel_scale", "head_window", "prefix_lm", "document"])
def test_varlen_mod_oracle_is_each_sequence_on_its_own(pair):
    """Each sequence of a varlen call is a dense batch entry at sequence-local positions, ``b`` the
    sequence (FA4's indices): the packed oracle equals the dense oracle of each sequence, and a
    sequence without keys has O = 0, LSE = -inf and no gradient."""
    sqs, sks = ((40, 0, 7, 19), (40, 0, 7, 19)) if mods.get(pair).self_attention_only else ((40, 0, 7, 19), (33, 5, 0, 60))
    p = _varlen(pair, sqs, sks)
    a = p.materialize()
    f, g = ja.oracle_forward(p, a), ja.oracle_backward(p, a)
    cq, ck = a["cu_seqlens_q"], a["cu_seqlens_k"]
    kw = ja._mod_callables(p, a)
    for i, (lq, lk) in enumerate(zip(sqs, sks)):
        qs, ks = slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])
        if lq == 0:
            continue
        if lk == 0:
            assert not f.out[qs].any() and np.isneginf(f.lse[:, qs]).all() and not g.dq[qs].any()
            continue
        one = dict(kw, keep=lambda b, h, i=i: kw["keep"](i, h))
        for n in ("score", "grad"):
            if n in kw:
                one[n] = (lambda fn, i=i: (lambda x, b, h: fn(x, i, h)))(kw[n])
        args = [ja.as_input_dtype(a[n][s][None], "bf16") for n, s in (("q", qs), ("k", ks), ("v", ks), ("dout", qs))]
        one.pop("cu_seqlens_q", None), one.pop("cu_seqlens_k", None)
        d = om.backward(*args, **one)
        assert np.array_equal(f.out[qs], d.out[0]) and np.array_equal(f.lse[:, qs], d.lse[0])
        for n in ("dq", "dk", "dv"):
            s = qs if n == "dq" else ks
            assert np.array_equal(getattr(g, n)[s], getattr(d, n)[0]), n


def test_varlen_oracle_refuses_inconsistent_cu_seqlens():
    q = np.zeros((5, 2, 8))
    with pytest.raises(ValueError, match="cu_seqlens"):
        om.forward(q, q, q, cu_seqlens_q=np.array([0, 3, 4]), cu_seqlens_k=np.array([0, 3, 5]))


def test_the_judge_passes_a_right_varlen_score_pair_and_fails_a_wrapped_query_index():
    """The escape ``bwd_varlen_score_mod_q_wrap_by_seqlen_k``: a kernel whose score_mod reads the
    query position modulo the sequence's *key* length (only where queries outnumber keys) fails;
    the oracle's own gradients, rounded to bf16, pass."""
    p = _varlen("rel_bias", (70, 17, 0), (33, 60, 4))
    a = p.materialize()
    f, g = ja.oracle_forward(p, a), ja.oracle_backward(p, a)
    jf = ja.judge_forward(p, a, _bf16(f.out), f.lse)
    jb = ja.judge_backward(p, a, _bf16(g.dq), _bf16(g.dk), _bf16(g.dv), forward=jf)
    assert [v.status for v in jf.verdicts + jb.verdicts] == ["pass"] * 5
    kw = ja._mod_callables(p, a)
    pair, aux = mods.get("rel_bias"), mods.aux_for(p, mods.get("rel_bias"), a)
    sks = p.seqlens_k

    def wrapped(fn):
        def at(x, b, h):
            qi = (np.arange(x.shape[0]) % sks[b])[:, None]
            return fn(x, b, h, qi, np.arange(x.shape[1])[None, :], aux)
        return at
    kw["score"], kw["grad"] = wrapped(pair.ref), wrapped(pair.grad)
    bad = om.backward(*(ja.as_input_dtype(a[n], "bf16") for n in ("q", "k", "v", "dout")), **kw)
    jb = ja.judge_backward(p, a, _bf16(bad.dq), _bf16(bad.dk), _bf16(bad.dv), forward=jf)
    assert "fail" in {v.status for v in jb.verdicts}


def test_a_mask_by_head_is_judged_per_head_and_a_wrong_head_fails():
    """The escape ``fwd_mask_mod_packgqa_head_stride``: under PackGQA FA4 rebuilds the query head
    of a packed row; a kernel that hands the mask_mod ``kv_head + offset`` instead of ``kv_head * g
    + offset`` keeps another head's window. The per-head judge fails it and passes the right one."""
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=150, seqlen_k=150, nheads=8, nheads_kv=2,
                         head_dim=64, head_dim_v=64, mods=("head_window",))
    assert p.heads_differ
    a = p.materialize()
    f = ja.oracle_forward(p, a)
    assert [v.status for v in ja.judge_forward(p, a, _bf16(f.out), f.lse).verdicts] == ["pass", "pass"]
    kw = ja._mod_callables(p, a)
    right = kw["keep"]
    kw["keep"] = lambda b, h: right(b, h // 4 + h % 4)
    for n in ("grad", "curvature"):
        kw.pop(n, None)
    bad = om.forward(*(ja.as_input_dtype(a[n], "bf16") for n in ("q", "k", "v")), **kw)
    assert [v.status for v in ja.judge_forward(p, a, _bf16(bad.out), bad.lse).verdicts] == ["fail", "fail"]


def test_fully_masked_rows_follow_each_heads_mask():
    pair = ModPair("odd_heads_empty", "mask", lambda b, h, qi, ki, a: np.broadcast_to(h % 2 == 0, np.broadcast_shapes(
        np.shape(qi), np.shape(ki))), by_head=True)
    mods.register_mod_pair(pair)
    try:
        p = AttentionProblem(arch="sm90", dtype="bf16", batch=2, seqlen_q=5, seqlen_k=3, nheads=4, nheads_kv=2,
                             head_dim=64, head_dim_v=64, mods=("odd_heads_empty",))
        rows = p.fully_masked_rows()
        assert rows.shape == (2, 4, 5)
        assert not rows[:, 0::2].any() and rows[:, 1::2].all()
    finally:
        mods.unregister("odd_heads_empty")


def test_a_head_dependent_mask_must_say_so():
    def ref(b, h, qi, ki, a):
        return np.broadcast_to(np.asarray(ki) <= np.asarray(qi) + h, np.broadcast_shapes(np.shape(qi), np.shape(ki)))
    with pytest.raises(ModPairError, match="by_head=True"):
        mods.validate(ModPair("reads_head", "mask", ref))
    assert mods.validate(ModPair("reads_head", "mask", ref, by_head=True))
    with pytest.raises(ModPairError, match="by_head"):
        mods.validate(ModPair("s", "score", lambda x, *r: x, grad=lambda x, *r: np.ones_like(x),
                              err=lambda x, y, *r: np.zeros_like(x), by_head=True))


def test_a_self_attention_pair_needs_square_sequences_on_a_varlen_call():
    with pytest.raises(ValueError, match="every sequence"):
        _varlen("prefix_lm", (8, 9), (9, 8))
    assert _varlen("prefix_lm", (8, 9), (8, 9)).varlen and _varlen("document", (8, 9), (9, 8)).varlen
