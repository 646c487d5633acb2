"""Power of the judge in the huge-logit regime (issue 28), CPU twin: a bound that a wrong answer
meets with equality is a hole, and the planted faults the issue names are caught, each by a named
check of the product's own path (``fuzz.properties.check_problem``: ``fa4verify fuzz``).
Figures: CPU twin."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify import judge
from fa4verify._strategies.problem import AttentionProblem
from fa4verify._strategies.values import ValueSpec
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
