"""Note [Gradients by linearity] (oracles/attention.py ``backward_difference``): the oracle's
gradients of a loss through the LSE alone (dO = 0) as the dLSE pass's minus the driver's, with a
bound that certifies them; the judge takes that path for the pass ``autograd_lse_only`` and
reaches the verdicts the direct pass reaches. CPU (oracle, CPU twin)."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from fa4verify import judge
from fa4verify.coverage import cases
from fa4verify.fuzz import check_problem, properties as props
from fa4verify.fuzz.properties import _seeded_dlse
from fa4verify.oracles.attention import backward_difference
from fa4verify.problem import AttentionProblem, ValueSpec
from fa4verify.targets import TwinTarget

from test_lse_only_budget import PROPS, _AutogradTwin

GRADS = ("dq", "dk", "dv", "dsink", "d")


def _problems():
    vs = lambda d, s: ValueSpec(d, s, cases._VALUE_PARAMS.get(d, ()))     # noqa: E731
    base = dict(arch="sm90", dtype="bf16", head_dim=64, head_dim_v=64)
    yield "softcap_sink", AttentionProblem(batch=2, seqlen_q=70, seqlen_k=90, nheads=4, nheads_kv=2, softcap=30.0,
                                           sink=True, values=vs("outliers", 11), **base)
    yield "causal_varlen", AttentionProblem(batch=3, seqlens_q=(17, 0, 40), seqlens_k=(30, 5, 40), seqlen_q=40,
                                            seqlen_k=40, nheads=2, nheads_kv=2, causal=True, values=vs("normal", 12),
                                            **base)
    yield "window_gqa", AttentionProblem(batch=1, seqlen_q=96, seqlen_k=80, nheads=6, nheads_kv=2,
                                         window_size=(9, 3), values=vs("peaked_rescale", 13), **base)
    yield "score_mod", AttentionProblem(batch=1, seqlen_q=48, seqlen_k=64, nheads=2, nheads_kv=2, mods=("rel_bias",),
                                        values=vs("normal", 14), **base)


@pytest.mark.parametrize("name,p", list(_problems()), ids=lambda x: x if isinstance(x, str) else "")
def test_the_difference_certifies_the_lse_only_gradients(name, p):
    """The difference and the direct dO = 0 pass each claim ``|x - exact| <= bound``: the two
    values must lie within the sum of their bounds of each other, and the difference's bound
    stays near the direct one's scale (float64 level, far below any budget)."""
    a = p.materialize()
    fwd = judge.oracle_forward(p, a)
    dl = _seeded_dlse(p, fwd)
    plain = judge.oracle_backward(p, a)
    with_dl = judge.oracle_backward(p, a, dlse=dl)
    direct = judge.oracle_backward(p, dict(a, dout=np.zeros_like(a["dout"])), dlse=dl)
    diff = backward_difference(with_dl, plain)
    for n in GRADS:
        x, xb, y, yb = (getattr(o, f) for o in (diff, direct) for f in (n, f"{n}_bound"))
        if x is None:
            assert y is None, n
            continue
        fin = np.isfinite(y)
        assert np.array_equal(fin, np.isfinite(x)), n
        assert np.all(np.abs(x[fin] - y[fin]) <= xb[fin] + yb[fin]), (name, n)
        scale = max(float(np.max(np.abs(getattr(plain, n)[fin]), initial=0.0)), float(np.max(np.abs(dl))), 1.0)
        assert float(np.max(xb[fin], initial=0.0)) <= 2.0 ** -30 * scale, (name, n)
    assert diff.out is with_dl.out and "linearity" in diff.method


def _one(v: float, b: float = 0.0) -> np.ndarray:
    return np.array([v]), np.array([b])


def _result(v: float, b: float = 0.0, out: float = 0.5):
    x, xb = _one(v, b)
    z, zb = _one(0.0)
    return judge_backward(dq=x, dq_bound=xb, dk=z, dk_bound=zb, dv=z, dv_bound=zb, d=z, d_bound=zb,
                          out=np.array([out]), lse=np.array([0.0]))


def judge_backward(**kw):
    from fa4verify.oracles.attention import AttentionBackward
    return AttentionBackward(dsink=None, dsink_bound=None, out_source="oracle", precision="fast", method="t", **kw)


def test_the_bound_covers_the_rounding_of_the_difference():
    """Exact operands (bounds 0) whose float64 difference rounds: 1 - 2^-60 is 1.0 in float64,
    so the bound must be at least 2^-60 (the rounding term alone carries it)."""
    d = backward_difference(_result(1.0), _result(2.0 ** -60))
    assert d.dq[0] == 1.0
    err = abs(Fraction(1) - Fraction(2) ** -60 - Fraction(float(d.dq[0])))
    assert Fraction(float(d.dq_bound[0])) >= err > 0
    # and the operands' bounds add
    d = backward_difference(_result(3.0, 1e-10), _result(1.0, 2e-10))
    assert d.dq[0] == 2.0 and d.dq_bound[0] >= 3e-10


def test_results_of_different_forwards_are_refused():
    with pytest.raises(ValueError, match="different forwards"):
        backward_difference(_result(1.0, out=0.5), _result(1.0, out=0.25))


def test_a_tainted_value_keeps_an_infinite_bound():
    d = backward_difference(_result(np.nan), _result(1.0))
    assert np.isnan(d.dq[0]) and d.dq_bound[0] == np.inf


def _deterministic_problem() -> AttentionProblem:
    vs = ValueSpec("outliers", 1174656166, cases._VALUE_PARAMS.get("outliers", ()))
    return AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=96, seqlen_k=80, nheads=4, nheads_kv=1,
                            head_dim=128, head_dim_v=128, softcap=30.0, softmax_scale=0.01, values=vs)


def _spy_zero_dout(monkeypatch) -> list:
    """Per oracle backward computed (either entry point, each variant): whether it was a dO = 0 pass."""
    seen: list = []
    one, several = judge.oracle_backward, judge.oracle_backwards

    def spy(problem, a, dlse=None):
        seen.append(dlse is not None and not np.any(a["dout"]))
        return one(problem, a, dlse=dlse)

    def spy_many(problem, a, dlses):
        seen.extend(dl is not None and not np.any(a["dout"]) for dl in dlses)
        return several(problem, a, dlses)
    from fa4verify.judge import attention as ja
    for mod in (judge, ja):       # the package's names and the module's (judge.oracle_pass calls these)
        monkeypatch.setattr(mod, "oracle_backward", spy)
        monkeypatch.setattr(mod, "oracle_backwards", spy_many)
    return seen


def test_the_judge_takes_the_lse_only_oracle_by_linearity_with_the_same_verdicts(monkeypatch):
    p = _deterministic_problem()
    seen = _spy_zero_dout(monkeypatch)
    out = check_problem(p, _AutogradTwin(), properties=PROPS)
    assert "bwd_stages" in out.ran and not out.undecided, out
    assert len(seen) == 2 and not any(seen), seen            # the driver's and the dLSE pass: no dO = 0 pass
    monkeypatch.setattr(props, "_lse_only_oracle", lambda a, obwd, ob_dl: None)
    seen.clear()
    direct = check_problem(p, _AutogradTwin(), properties=PROPS)
    assert seen.count(True) == 1, seen
    keys = [k for k in direct.metrics if "lse_only" in k]
    assert keys, direct.metrics
    for k in keys:      # the oracle's values and bounds differ at float64 level (of the driver's magnitudes)
        assert out.metrics[k] == pytest.approx(direct.metrics[k], rel=1e-6, abs=1e-12), k


def test_a_non_finite_do_computes_the_lse_only_pass_afresh():
    p = _deterministic_problem()
    a = p.materialize()
    dout = np.array(a["dout"], np.float64)
    dout.flat[3] = np.inf
    assert props._lse_only_oracle(dict(a, dout=dout), object(), object()) is None
    assert props._lse_only_oracle(a, None, object()) is None


def test_the_planted_fault_of_the_lse_only_pass_still_fails_by_linearity():
    """The public path that reads the real dO where it must take zero (test_lse_only_budget's
    fault), judged against the oracle by linearity."""
    from fa4verify.fuzz.violation import Violation
    with pytest.raises(Violation) as ei:
        check_problem(_deterministic_problem(), _AutogradTwin(keep_dout=True), properties=PROPS)
    assert ei.value.metrics.get("pass") == "autograd_lse_only", ei.value


def test_the_twin_target_has_the_dlse_pass_the_linearity_needs():
    assert TwinTarget().dlse_unsupported(_deterministic_problem()) is None
