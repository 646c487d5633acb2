"""Power of the judge in the huge-logit regime (issue 28), CPU twin: a bound that a wrong answer
meets with equality is a hole, and the planted faults the issue names are caught, each by a named
check of the product's own path (``fuzz.properties.check_problem``: ``fa4verify fuzz``).
Figures: CPU twin."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify import judge
from fa4verify.problem import AttentionProblem, ValueSpec
from fa4verify.targets import Fwd, TwinTarget

from test_hull_fallback import _problem

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _huge(dtype, e_qk, seed, **kw):
    kw = {"sq": 33, "sk": 70, **kw}
    return _problem("huge", seed, (("e_qk", float(e_qk)), ("e_v", 2.0)), dtype=dtype, **kw)


#: the worst problem of an H200 campaign (fuzz --distribution huge --seed 11, 2026-12-02) without
#: its sink: every gradient element is decided by the interval bound (the first-order one is past
#: its limit)
WORST = AttentionProblem(arch="sm90", dtype="bf16", batch=2, seqlen_q=129, seqlen_k=5, nheads=1, nheads_kv=1,
                         head_dim=64, head_dim_v=64, window_size=(7, None),
                         values=ValueSpec("huge", 7, (("e_qk", 4.0), ("e_v", 13.0), ("sink_scale", 4.0),
                                                      ("sink_shift", 50.0))))


def test_a_gradient_read_from_an_infinite_lse_is_judged_against_a_correct_forward():
    """Note [A forward LSE outside every model] (fa4verify/judge/stats.py): a row whose kernel LSE
    is +inf (FA4's sink overflow gives exactly that; here planted in the row with the largest exact
    dQ) makes the backward compute P = 0 there, so the row is missing from dK and dV. The interval
    bound used to enclose what that LSE implies (the row's pairs exactly 0): dK passed at tightness
    0.9997, a bound the wrong answer met with equality. Judged against a correct forward it fails;
    the clean backward still passes."""
    p = WORST
    a = p.materialize()
    t = TwinTarget()
    f = t.forward(p, a)
    j = judge.judge_forward(p, a, f.out, f.lse)
    obwd = judge.oracle_backward(p, a)
    g = t.backward(p, a, f)
    clean = judge.judge_backward(p, a, g.dq, g.dk, g.dv, forward=j, oracle_bwd=obwd, kernel_fwd=(f.out, f.lse))
    assert all(v.status == "pass" for v in clean.verdicts), [v.summary() for v in clean.verdicts]
    assert j.stats.bwd_fallback["dk"].all()          # the interval bound decides every dK element
    dq = np.abs(np.asarray(obwd.dq))                  # (b, s, h, d)
    b, s, h, _ = np.unravel_index(np.argmax(dq), dq.shape)
    lse = np.array(f.lse, np.float64)                 # (b, h, s)
    lse[b, h, s] = np.inf
    bad = t.backward(p, a, Fwd(f.out, lse))
    assert not np.any(bad.dq[b, s, h]), "the twin's backward computes P = 0 from an LSE of +inf"
    jb = judge.judge_backward(p, a, bad.dq, bad.dk, bad.dv, forward=j, oracle_bwd=obwd, kernel_fwd=(f.out, lse))
    assert jb.dk.status == "fail" and jb.dq.status == "fail" and jb.dv.status == "fail", \
        [v.summary() for v in jb.verdicts]


def _zero_dv(monkeypatch):
    """Plant a backward fault in the twin: dV returned as 0 (every other output unchanged)."""
    from fa4verify.targets import Bwd
    orig = TwinTarget.backward

    def faulty(self, problem, a, fwd, **kw):
        g = orig(self, problem, a, fwd, **kw)
        return Bwd(g.dq, g.dk, np.zeros_like(g.dv), g.dsink, stages=g.stages)

    monkeypatch.setattr(TwinTarget, "backward", faulty)


def _chain_off(monkeypatch):
    """The shipped budgets without Note [One-hot LSE chain] (``fwd_lse_chain``)."""
    import dataclasses
    from fa4verify import error_budgets as eb
    orig = eb.load

    def load(dtype, arch):
        bs = orig(dtype, arch)
        return dataclasses.replace(bs, constants={k: v for k, v in bs.constants.items() if k != "fwd_lse_chain"})

    monkeypatch.setattr(eb, "load", load)


def test_without_the_chain_a_zero_dv_at_bf16_e_qk_10_is_undecided_never_passed(monkeypatch):
    """Note [A bound without power] (fa4verify/judge/verdict.py): where no bound has power (here
    the budgets without the chain: the shared-scores bound admits P errors past 2x at bf16 e_qk 10,
    so it admits a zero dV although dV is as large as its terms), bwd_budget.dv is undecided with
    its reason, for the zero dV and for the clean one alike: never a pass (a zeroed dV used to pass
    every property, tightness 8.6e-8)."""
    from fa4verify.fuzz.properties import check_problem
    _chain_off(monkeypatch)
    p = _huge("bf16", 10, 110)
    clean = check_problem(p, TwinTarget())
    # the dLSE pass's dV (the same values: dV reads no D) is undecided for the same reason
    assert set(clean.undecided) == {"bwd_budget.dv", "bwd_budget.dlse_dv"}, clean.undecided
    assert all("admits a zero dv" in clean.undecided[k] for k in clean.undecided)
    _zero_dv(monkeypatch)
    out = check_problem(p, TwinTarget())            # no violation: nothing can see it ...
    assert "admits a zero dv" in out.undecided.get("bwd_budget.dv", ""), out.undecided   # ... but no pass


@pytest.mark.parametrize("p", [_huge("bf16", 7, 107), _huge("bf16", 8, 108), _huge("fp16", 6, 106, sk=150, causal=True),
                               _huge("bf16", 10, 110), _huge("bf16", 12, 112)],
                         ids=lambda p: p.describe()[:50])
def test_where_a_bound_has_power_a_zero_dv_fails_and_the_clean_gradients_are_decided(p, monkeypatch):
    """The rule takes nothing away where the bound has power: the clean gradients are decided
    (one-hot rows make dQ/dK rounding noise of their terms, which a kernel may return as ~0:
    those stay decided) and a zero dV fails bwd_budget. bf16 e_qk 8 is decided through the
    softmax of the shared scores (sm90, Note [Same S in both passes]); it was undecided without.
    bf16 e_qk 10 and 12 through Note [One-hot LSE chain] (error_budgets/interval.py): the dominant
    key of a one-hot row bounded through FA4's SM90 LSE chain, where the shared-scores bound's
    worst-case eta (8 log2 units at |S c| ~ 2^22) admitted a zero dV."""
    from fa4verify.fuzz.properties import check_problem
    from fa4verify.fuzz.violation import Violation
    clean = check_problem(p, TwinTarget())
    assert not clean.undecided, clean.undecided
    _zero_dv(monkeypatch)
    with pytest.raises(Violation) as e:
        check_problem(p, TwinTarget())
    assert e.value.prop == "bwd_budget" and e.value.args[0].startswith("[bwd_budget] dv:"), e.value


# ---------------------------------------------------------------- issue 28: planted faults, huge regime
# The twin mutations carry the names of the production source mutants that plant the same fault in
# FA4's source (fa4verify.mutants.source: dpsum_bias_2m10, recip_bias_2m9), so the same command
# shows it on the H200 with PYTHONPATH on the planted copy.

def test_a_2m10_d_bias_fails_bwd_stages_d_in_a_huge_campaign(tmp_path):
    """``fa4verify fuzz --target twin --mutation dpsum_bias_2m10 --distribution huge``: the fuzz's
    stage check ``bwd_stages`` (D against the exact rowsum of the kernel's own O, budget d_pre,
    which does not grow with the logits) fails on its own, without the end-to-end gradient bounds
    (``bwd_budget``, which catch some huge draws too: test below); the same draw without the
    mutation finds nothing."""
    from fa4verify.fuzz.campaign import run_campaign
    from fa4verify.fuzz.properties import PROPERTIES
    kw = dict(arch="sm90", dtype="bf16", examples=12, seed=3, distributions=("huge",), database_dir=tmp_path,
              properties=tuple(p for p in PROPERTIES if p != "bwd_budget"))
    bad = run_campaign(target=TwinTarget({"dpsum_bias_2m10"}), **kw)
    assert bad.failure is not None and bad.failure["property"] == "bwd_stages", bad.failure
    assert bad.failure["message"].startswith("D:"), bad.failure["message"]
    assert "values=huge" in bad.failure["describe"]
    clean = run_campaign(target=TwinTarget(), **kw)
    assert clean.failure is None


def test_a_2m10_d_bias_is_caught_at_bf16_e_qk_10():
    """bf16 e_qk 10: bwd_budget cannot tell dV from 0 there (undecided), yet the D bias fails the
    dQ bound (sm90: Note [Same S in both passes]; ``bwd_stages.D`` caught it before that, and
    still does on its own: tests/test_backward_interval.py)."""
    from fa4verify.fuzz.properties import check_problem
    from fa4verify.fuzz.violation import Violation
    p = _huge("bf16", 10, 110)
    with pytest.raises(Violation) as e:
        check_problem(p, TwinTarget({"dpsum_bias_2m10"}))
    assert e.value.prop == "bwd_budget" and e.value.args[0].startswith("[bwd_budget] dq:"), e.value


def test_a_2m9_rowsum_bias_fails_fwd_budget_at_the_smallest_fp16_huge_scale():
    """fp16 e_qk 2: the worst-case O budget (P cast + output cast, ~2^-10 |O|) sees a 2^-9 bias
    of 1/rowsum (the twin mutation recip_bias_2m9): ``fwd_budget.out``."""
    from fa4verify.fuzz.properties import check_problem
    from fa4verify.fuzz.violation import Violation
    p = _problem("huge", 72, (("e_qk", 2.0), ("e_v", 5.0)), dtype="fp16")
    assert not check_problem(p, TwinTarget()).undecided
    with pytest.raises(Violation) as e:
        check_problem(p, TwinTarget({"recip_bias_2m9"}))
    assert e.value.prop == "fwd_budget" and e.value.args[0].startswith("[fwd_budget] out:"), e.value


@pytest.mark.parametrize("dtype,e_qk", [("fp16", 4), ("bf16", 7), ("bf16", 10)])
def test_a_2m9_rowsum_bias_past_that_passes_the_fuzz_and_fails_the_statistical_tier(dtype, e_qk):
    """Past fp16 e_qk 2 (and in bf16 at every scale) the O budget carries the S rounding bound
    (fp16 e_qk 4: clean O at 0.04 of it; the hull past e_qk 6) or, in bf16, 2^-7 |O| of casts
    alone, so every fuzz property passes the planted recip_bias_2m9 (measured, CPU twin: caught
    at fp16 e_qk 2 only); the statistical tier's radial-bias test (fa4verify/judge/statistical.py,
    run by the audit's ``budgets.production.forward`` on its normal-valued cases) fails it. The
    fuzz does not run that tier: on huge draws the product does not catch this fault (open)."""
    from fa4verify.fuzz.properties import check_problem
    from fa4verify.judge import statistical as S
    kw = dict(sk=150, causal=True) if dtype == "fp16" else {}
    p = _problem("huge", 100 + e_qk, (("e_qk", float(e_qk)), ("e_v", 5.0 if dtype == "fp16" else 2.0)),
                 dtype=dtype, h=4, hk=4, sq=128, **kw)
    out = check_problem(p, TwinTarget({"recip_bias_2m9"}))          # no violation
    assert "fwd_budget" in out.ran
    a = p.materialize()
    ofwd = judge.oracle_forward(p, a)
    alpha = S.alpha_per_test(S.DEFAULT_ALPHA, 4)
    t = TwinTarget(mufu="perturbed", seed=9)
    clean = S.tier_on(p, {"out": t.forward(p, a).out}, {"out": ofwd.out}, a, alpha_test=alpha)[0]
    assert clean.status == "pass", clean
    f = TwinTarget({"recip_bias_2m9"}, mufu="perturbed", seed=9).forward(p, a)
    v = S.tier_on(p, {"out": f.out}, {"out": ofwd.out}, a, alpha_test=alpha)[0]
    assert v.status == "fail" and v.radial_ci[0] > v.margin_ulp, v
