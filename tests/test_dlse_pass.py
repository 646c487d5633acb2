"""Note [A gradient through the LSE] and Note [The composed budgets with dLSE]: the backward given
a seeded ``dlse`` is judged end to end -- its D' (where the stages are tapped) and its dQ, dK, dV
against the oracle's with the same ``dlse`` within the composed budgets, varlen calls included.
CPU twin; the oracles' ``dlse`` against independent float64 references."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify import judge
from fa4verify.fuzz import TwinTarget, Violation, check_problem
from fa4verify.problem import AttentionProblem, CallForm, ValueSpec

BASE = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=70, seqlen_k=90, nheads=2, nheads_kv=2,
                        head_dim=64, head_dim_v=64, causal=True, values=ValueSpec("normal", 5))
VARLEN = BASE.replace(batch=3, seqlens_q=(70, 33, 5), seqlens_k=(90, 41, 17))
PROPS = ["bwd_budget", "bwd_stages"]


def _dl(shape, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * 0.5).astype(np.float32)


def test_the_twin_backward_applies_dlse_as_fa4s_preprocess():
    """``D' = RN(D - dLSE)`` in fp32, read by the main kernel as D: the stage value is the fp32
    difference exactly, and the gradients move."""
    from fa4verify.kernels.twin import attention as ta
    a = BASE.materialize()
    f = ta.forward(a["q"], a["k"], a["v"], arch="sm90", causal=True)
    plain = ta.backward(a["q"], a["k"], a["v"], f.out, a["dout"], lse=f.lse, arch="sm90", causal=True)
    dl = _dl(np.shape(f.lse))
    g = ta.backward(a["q"], a["k"], a["v"], f.out, a["dout"], lse=f.lse, arch="sm90", causal=True, dlse=dl)
    want = np.asarray(plain.stages["D"], np.float32) - dl            # numpy fp32 subtraction: RN
    assert np.array_equal(np.asarray(g.stages["D"], np.float32), want)
    assert not np.array_equal(g.dq, plain.dq) and np.array_equal(g.dv, plain.dv)   # dV reads no D
    with pytest.raises(ValueError, match="dlse"):
        ta.backward(a["q"], a["k"], a["v"], f.out, a["dout"], lse=f.lse, arch="sm90", causal=True, dlse=dl[:, :1])


@pytest.mark.parametrize("problem", [
    BASE, VARLEN, BASE.replace(nheads=4, nheads_kv=1, causal=False, window_size=(20, 3)),
    VARLEN.replace(softcap=5.0, causal=False), BASE.replace(values=ValueSpec("huge", 3)),
], ids=["dense", "varlen", "gqa-window", "varlen-softcap", "huge"])
def test_the_clean_twin_passes_the_dlse_pass(problem):
    out = check_problem(problem, TwinTarget(), properties=PROPS)
    for n in ("dq", "dk", "dv"):
        assert 0 < out.metrics[f"tightness_dlse_{n}"] <= 1, out.metrics
    assert not any("dlse" in k for k in out.undecided), out.undecided
    assert ("tightness_D_dlse" in out.metrics) == (not problem.varlen)    # D' is tapped on dense calls


def test_a_varlen_dlse_offset_fault_is_caught_where_nothing_is_tapped():
    """Every sequence reading the first sequence's dLSE (a dropped ``offset_batch`` of FA4's
    preprocess): no stage is tapped on a varlen call and the autograd path shares the fault, so
    before the gradients of the dLSE pass were judged nothing could see it."""
    bad = TwinTarget(["varlen_dlse_offset_dropped"])
    with pytest.raises(Violation, match="gradient through the LSE") as ei:
        check_problem(VARLEN, bad, properties=PROPS)
    assert ei.value.prop == "bwd_budget" and ei.value.metrics["quantity"] in ("dq", "dk")
    check_problem(VARLEN, bad, properties=["bwd_budget"])        # the driver's own pass: blind to it
    check_problem(BASE, bad, properties=PROPS)                    # one sequence: nothing to misread


def test_gradients_that_ignore_dlse_fail_though_the_tapped_d_prime_is_right():
    """A main kernel that reads D instead of D' (the preprocess wrote D' elsewhere): the tap holds,
    the gradients do not."""
    class StaleD(TwinTarget):
        def backward(self, problem, a, fwd, *, deterministic=True, taps=None, dlse=None):
            if dlse is None:
                return super().backward(problem, a, fwd, deterministic=deterministic, taps=taps)
            tapped: dict = {}
            super().backward(problem, a, fwd, deterministic=deterministic, taps=tapped, dlse=dlse)
            g = super().backward(problem, a, fwd, deterministic=deterministic, taps=taps)
            if taps is not None:
                taps["dpsum"] = tapped["dpsum"]
            return g
    with pytest.raises(Violation, match="gradient through the LSE") as ei:
        check_problem(BASE, StaleD(), properties=PROPS)
    assert ei.value.metrics["quantity"] == "dq"


def test_the_composed_budgets_with_a_zero_dlse_are_the_plain_ones_widened_by_one_rounding():
    """The subtraction's one fp32 rounding (u (sum |O dO| + |dLSE|) on D, next to D's own
    gamma(dv) sum |O dO|) widens dQ/dK by a small fraction; dV reads no D."""
    p = BASE.replace(nheads=4, nheads_kv=2)
    a = p.materialize()
    from fa4verify.fuzz.properties import _budget
    ofwd = judge.oracle_forward(p, a)
    ref_out, _, stats, _ = judge.forward_allowances(p, a, budgets=_budget(p), oracle=ofwd)
    ob = judge.oracle_backward(p, a)
    plain = stats.backward(ob, ref_out.budget, ref_out.bound, probabilistic=False)
    zero = np.zeros(np.shape(ofwd.lse), np.float32)
    ob0 = judge.oracle_backward(p, a, dlse=zero)
    with0 = stats.backward(ob0, ref_out.budget, ref_out.bound, probabilistic=False, dlse=zero)
    for n in ("dq", "dk", "dv"):
        assert np.array_equal(getattr(ob0, n), getattr(ob, n))
        assert (with0[n] >= plain[n]).all() and (with0[n] <= plain[n] * (1 + 2.0 ** -10)).all(), n
        if n != "dv":       # the subtraction's rounding widens the dQ / dK allowances
            assert (with0[n] > plain[n]).mean() > 0.5, n
    assert np.array_equal(with0["dv"], plain["dv"])
    dl = _dl(np.shape(ofwd.lse), 4)
    obd = judge.oracle_backward(p, a, dlse=dl)
    wd = stats.backward(obd, ref_out.budget, ref_out.bound, probabilistic=False, dlse=dl)
    # the exact gradients move by far more than their allowances: the budgets can see a dropped dLSE
    assert np.max(np.abs(obd.dq - ob.dq) / wd["dq"]) > 2 and np.array_equal(obd.dv, ob.dv)


def _masked_reference(q, k, v, do, keep, scale, dl):
    """float64 masked attention's gradients with ``D' = D - dLSE`` ((b, s, h, d) layouts, GQA)."""
    g = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    s = np.where(keep, s, -np.inf)
    m = np.max(s, -1, keepdims=True)
    w = np.where(np.isfinite(m), np.exp(s - np.where(np.isfinite(m), m, 0)), 0.0)
    l_ = w.sum(-1, keepdims=True)
    P = np.where(l_ > 0, w / np.where(l_ > 0, l_, 1), 0)
    o = np.einsum("bhqk,bkhd->bqhd", P, v)
    D = np.einsum("bqhd,bqhd->bhq", do, o) - dl
    dS = P * (np.einsum("bqhd,bkhd->bhqk", do, v) - D[..., None])
    dq = np.einsum("bhqk,bkhd->bqhd", dS, k) * scale
    dk = np.einsum("bhqk,bqhd->bkhd", dS, q) * scale
    b, sk, h, d = dk.shape
    return dq, dk.reshape(b, sk, h // g, g, d).sum(3)


def test_the_keep_pattern_and_mods_oracles_take_dlse():
    """The block-sparse rewrite reads each packed row's own dLSE; the mods oracle subtracts it."""
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=2, seqlen_q=130, seqlen_k=200, nheads=2, nheads_kv=1,
                         head_dim=32, head_dim_v=32, call=CallForm(block_size=(64, 64), block_seed=0, block_keep=0.5))
    a = p.materialize()
    dl = _dl((2, 2, 130), 1)
    g = judge.oracle_backward(p, a, dlse=dl)
    q, k, v, do = (np.asarray(a[n], np.float64) for n in ("q", "k", "v", "dout"))
    keep = np.stack(p.keep_masks())[:, None]
    dq, dk = _masked_reference(q, k, v, do, keep, p.scale, dl.astype(np.float64))
    assert np.allclose(g.dq, dq, atol=1e-11) and np.allclose(g.dk, dk, atol=1e-11)
    from fa4verify.oracles import attention as orc, mods as om
    q, k, v, do = q[:1], k[:1], v[:1], do[:1]
    want = orc.backward(q, k, v, None, do, dlse=dl[:1])
    got = om.backward(q, k, v, do, dlse=dl[:1])
    assert np.allclose(got.dq, want.dq, atol=1e-12) and np.allclose(got.dk, want.dk, atol=1e-12)
    assert (np.abs(got.dq - want.dq) <= got.dq_bound + want.dq_bound).all()
    with pytest.raises(ValueError, match="dlse"):
        om.backward(q, k, v, do, dlse=dl)


def test_the_varlen_oracles_take_dlse_per_sequence_and_agree():
    """Varlen with a learnable sink and a sequence without keys: the plain oracle, the mods
    oracle (sequence by sequence) and the keep-pattern rewrite (block sparsity on a varlen call)
    give the same gradients with dLSE; a keyless row adds its dLSE to dsink (its P_sink is 1)."""
    from fa4verify.oracles import attention as orc, mods as om
    p = VARLEN.replace(batch=3, seqlens_q=(40, 7, 23), seqlens_k=(70, 0, 41), seqlen_q=40, seqlen_k=70,
                       causal=False, sink=True)
    a = p.materialize()
    q, k, v, do = (np.asarray(a[n], np.float64) for n in ("q", "k", "v", "dout"))
    cq, ck = (np.concatenate([[0], np.cumsum(x)]).astype(np.int32) for x in (p.seqlens_q, p.seqlens_k))
    dl = _dl((p.nheads, sum(p.seqlens_q)), 2)
    sink = np.asarray(a["learnable_sink"], np.float64)
    kw = dict(cu_seqlens_q=cq, cu_seqlens_k=ck, learnable_sink=sink, dlse=dl)
    want = orc.backward(q, k, v, None, do, **kw)
    got = om.backward(q, k, v, do, **kw)
    for n in ("dq", "dk", "dv", "dsink"):
        x, y = getattr(got, n), getattr(want, n)
        assert (np.abs(x - y) <= getattr(got, f"{n}_bound") + getattr(want, f"{n}_bound") + 1e-12).all(), n
    alone = om.backward(q[40:47], k[:0], v[:0], do[40:47], cu_seqlens_q=np.array([0, 7], np.int32),
                        cu_seqlens_k=np.array([0, 0], np.int32), learnable_sink=sink, dlse=dl[:, 40:47])
    assert np.allclose(alone.dsink, dl[:, 40:47].astype(np.float64).sum(axis=1), rtol=1e-14)   # the keyless one
    # the keep-pattern rewrite on a varlen call: each packed row reads its own row's dLSE
    pb = p.replace(sink=False, call=CallForm(block_size=(16, 16), block_seed=3, block_keep=0.6))
    ab = pb.materialize()
    gk = judge.oracle_backward(pb, ab, dlse=dl)
    keeps = pb.keep_masks()
    gm = om.backward(*(np.asarray(ab[n], np.float64) for n in ("q", "k", "v", "dout")), cu_seqlens_q=cq,
                     cu_seqlens_k=ck, keep=lambda b, h: keeps[b], dlse=dl)
    for n in ("dq", "dk", "dv"):
        assert np.allclose(getattr(gk, n), getattr(gm, n), atol=1e-11), n
    assert not np.allclose(gk.dq, judge.oracle_backward(pb, ab).dq, atol=1e-6)


def test_a_dlse_pass_failure_shrinks_to_a_case_that_replays_as_a_failure(tmp_path):
    """The campaign finds the varlen dLSE offset fault, shrinks it, and the case it writes replays
    as a failure: its violation is ``bwd_budget``'s, judged inside ``bwd_stages``, so the case and
    the printed reproducer name both properties (``replay_properties``)."""
    from fa4verify import fuzz
    from fa4verify.fuzz.cases import replay_case
    res = fuzz.run_campaign(target=TwinTarget(["varlen_dlse_offset_dropped"]), examples=60, seed=0,
                            features=("varlen",), cases_dir=tmp_path)
    assert res.found and "gradient through the LSE" in res.failure["message"]
    assert "properties=['bwd_budget', 'bwd_stages']" in res.failure["snippet"]
    out = replay_case(res.failure["case_file"])
    assert out.status == "fail" and out.property == "bwd_budget"
    assert replay_case(res.failure["case_file"], target=TwinTarget()).status == "pass"
