"""Note [P before dO] (error_budgets/interval.py): the interval bound's P part reads neither dO,
O nor dLSE, so the backward passes of one call (the driver's, the dLSE pass, a loss through the LSE
alone) share it through their statistics -- and every pass's allowances stay exactly those of
statistics that computed everything afresh. CPU, the judge alone."""
from __future__ import annotations

import copy

import numpy as np
import pytest

from fa4verify import judge
from fa4verify.coverage import cases
from fa4verify.error_budgets import interval as ivm
from fa4verify.fuzz.properties import _budget
from fa4verify.problem import AttentionProblem, ValueSpec


def _problems():
    vs = ValueSpec("outliers", 1174656166, cases._VALUE_PARAMS.get("outliers", ()))
    base = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=70, seqlen_k=66, nheads=4, nheads_kv=2,
                            head_dim=64, head_dim_v=64, softmax_scale=0.05, values=vs)
    return {"plain": base, "softcap_sink": base.replace(softcap=30.0, sink=True),
            "causal_varlen": base.replace(causal=True, seqlens_q=(9, 40), seqlens_k=(30, 41), batch=2, seqlen_q=40,
                                                   seqlen_k=41)}


def _passes(p, st_of, calls):
    """The three passes' allowances: ``st_of()`` gives the statistics each pass reads."""
    a = p.materialize()
    of = judge.oracle_forward(p, a)
    ref_out, _lse, _st, _ = judge.forward_allowances(p, a, budgets=_budget(p), oracle=of)
    kf = (np.asarray(of.out, np.float32), np.asarray(of.lse, np.float32))
    kw = dict(probabilistic=False, kernel_fwd=kf, tensor_core="sm90")
    dl = (np.random.default_rng(1).standard_normal(np.shape(of.lse)) * 0.5).astype(np.float32)
    a0 = dict(a, dout=np.zeros_like(a["dout"]))
    out = []
    with np.errstate(invalid="ignore", over="ignore"):
        for ob, d, zero in ((judge.oracle_backward(p, a), None, False),
                            (judge.oracle_backward(p, a, dlse=dl), dl, False),
                            (judge.oracle_backward(p, a0, dlse=dl), dl, True)):
            st = st_of(p, a, of)
            st = st.with_zero_dout(a0) if zero else copy.copy(st)
            n0 = calls["n"]
            out.append((st.backward(ob, ref_out.budget, ref_out.bound, dlse=d, **kw), calls["n"] - n0,
                        bool(st.bwd_fallback["dq"].any())))
    return out


@pytest.mark.parametrize("name", ["plain", "softcap_sink", "causal_varlen"])
def test_passes_sharing_the_p_part_equal_passes_computing_it_afresh(name, monkeypatch):
    p = _problems()[name]
    calls = {"n": 0}
    orig = ivm.pair_p

    def counted(*args, **kw):
        calls["n"] += 1
        return orig(*args, **kw)
    monkeypatch.setattr(ivm, "pair_p", counted)
    shared = {}

    def one(p, a, of):                   # one statistics object for all passes (as the fuzz runner)
        if "st" not in shared:
            shared["st"] = judge.forward_allowances(p, a, budgets=_budget(p), oracle=of)[2]
        return shared["st"]
    got = _passes(p, one, calls)
    fresh = _passes(p, lambda p, a, of: judge.forward_allowances(p, a, budgets=_budget(p), oracle=of)[2], calls)
    assert got[0][2], "the interval bound must decide somewhere for this test to say anything"
    assert got[0][1] > 0 and got[1][1] == 0 and got[2][1] == 0, [g[1] for g in got]     # shared after the first
    assert all(f[1] == got[0][1] for f in fresh)                                         # afresh every time
    for (g, _n, _f), (f, _m, _e) in zip(got, fresh):
        for q in g:
            assert np.array_equal(np.asarray(g[q]), np.asarray(f[q]), equal_nan=True), q


def test_a_pass_whose_kernel_lse_differs_computes_its_p_part_again(monkeypatch):
    p = _problems()["plain"]
    a = p.materialize()
    of = judge.oracle_forward(p, a)
    ref_out, _lse, st, _ = judge.forward_allowances(p, a, budgets=_budget(p), oracle=of)
    ob = judge.oracle_backward(p, a)
    out, lse = np.asarray(of.out, np.float32), np.asarray(of.lse, np.float32)
    lse2 = lse.copy()
    lse2[0, 0, 3] = np.nextafter(lse2[0, 0, 3], np.float32(np.inf))      # one row's LSE one ulp up
    with np.errstate(invalid="ignore", over="ignore"):
        copy.copy(st).backward(ob, ref_out.budget, ref_out.bound, probabilistic=False, kernel_fwd=(out, lse),
                               tensor_core="sm90")
        again = copy.copy(st).backward(ob, ref_out.budget, ref_out.bound, probabilistic=False,
                                       kernel_fwd=(out, lse2), tensor_core="sm90")
        _, _, st2, _ = judge.forward_allowances(p, a, budgets=_budget(p), oracle=of)
        fresh = st2.backward(ob, ref_out.budget, ref_out.bound, probabilistic=False, kernel_fwd=(out, lse2),
                             tensor_core="sm90")
    for q in again:
        assert np.array_equal(np.asarray(again[q]), np.asarray(fresh[q]), equal_nan=True), q
