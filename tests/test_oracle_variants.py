"""Note [Variants share a pass] (oracles/reference.py): ``oracles.attention.backwards`` computes
the backward for several gradients through the LSE in one pass of the fast reference; each
result must be the one a pass of its own gives, bit for bit (values, bounds, D, the sink's
gradient, the forward), over the layouts and masks the reference has. CPU."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify.oracles import attention as orc

FIELDS = ("dq", "dk", "dv", "dsink", "d", "dq_bound", "dk_bound", "dv_bound", "dsink_bound", "d_bound", "out", "lse")


def _bf16(x):
    import ml_dtypes
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16)


def _case(kind: str, rng):
    h, hk, d, dv = (4, 2, 32, 48)
    if kind == "varlen":
        cu_q, cu_k = np.array([0, 7, 7, 40]), np.array([0, 12, 20, 51])
        q = _bf16(rng.standard_normal((40, h, d)))
        k = _bf16(rng.standard_normal((51, hk, d)))
        v = _bf16(rng.standard_normal((51, hk, dv)))
        do = _bf16(rng.standard_normal((40, h, dv)))
        kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True)
        lse_shape = (h, 40)
    else:
        q = _bf16(rng.standard_normal((2, 33, h, d)) * 2)
        k = _bf16(rng.standard_normal((2, 45, hk, d)))
        v = _bf16(rng.standard_normal((2, 45, hk, dv)))
        do = _bf16(rng.standard_normal((2, 33, h, dv)))
        kw = {"softcap": dict(softcap=8.0, learnable_sink=rng.standard_normal(h)),
              "window": dict(window_size=(5, 2)),
              "plain": {}}[kind]
        lse_shape = (2, h, 33)
    dls = (None, (rng.standard_normal(lse_shape) * 0.5).astype(np.float32),
           (rng.standard_normal(lse_shape) * 3).astype(np.float32))
    return (q, k, v, do), kw, dls


def _same(a, b, what):
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        if x is None or y is None:
            assert x is None and y is None, (what, f)
            continue
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        assert x.shape == y.shape and np.array_equal(x.view(np.uint64), y.view(np.uint64)), (what, f)
    for f in ("out", "bound", "lse", "lse_bound"):
        x, y = (np.asarray(getattr(r.forward, f), np.float64) for r in (a, b))
        assert np.array_equal(x.view(np.uint64), y.view(np.uint64)), (what, "forward." + f)


@pytest.mark.parametrize("kind", ["plain", "softcap", "window", "varlen"])
def test_each_variant_equals_its_own_pass_bit_for_bit(kind):
    (q, k, v, do), kw, dls = _case(kind, np.random.default_rng(hash(kind) % 2 ** 32))
    together = orc.backwards(q, k, v, None, do, dlses=dls, **kw)
    assert len(together) == len(dls)
    for i, dl in enumerate(dls):
        alone = orc.backward(q, k, v, None, do, dlse=dl, **kw)
        _same(together[i], alone, (kind, i))
    # and the variants differ where their dLSE does (the pass did not reuse one dS for all)
    assert not np.array_equal(together[0].dq, together[1].dq)


def test_a_non_finite_dlse_taints_only_its_own_variant():
    (q, k, v, do), kw, dls = _case("plain", np.random.default_rng(3))
    bad = dls[1].copy()
    bad[0, 1, 4] = np.nan
    together = orc.backwards(q, k, v, None, do, dlses=(None, bad), **kw)
    assert np.all(np.isfinite(together[0].dq))
    assert np.isnan(together[1].dq[0, 4, 1]).all()
    _same(together[0], orc.backward(q, k, v, None, do, **kw), "clean")


def test_a_caller_o_and_a_tainted_input_keep_the_rules_of_a_single_pass():
    (q, k, v, do), kw, dls = _case("softcap", np.random.default_rng(4))
    o = orc.forward(q, k, v, **kw).out.astype(np.float32)
    q = np.array(q)
    q[1, 3, 0, 0] = np.inf
    together = orc.backwards(q, k, v, o, do, dlses=dls, **kw)
    for i, dl in enumerate(dls):
        _same(together[i], orc.backward(q, k, v, o, do, dlse=dl, **kw), ("caller O, tainted", i))


def test_the_judge_takes_every_oracle_of_an_example_from_one_pass_with_the_same_metrics(monkeypatch):
    """The judge computes the driver's and the dLSE pass's oracles and the forward's in one
    ``oracle_backwards`` call (Note [One oracle pass]: no ``oracle_forward``, no separate dLSE
    oracle), and every metric equals the one separate passes give, exactly."""
    from fa4verify import judge
    from fa4verify.fuzz import check_problem
    from fa4verify.judge import attention as ja
    from test_lse_only_budget import PROPS, _AutogradTwin
    from test_oracle_linearity import _deterministic_problem
    p = _deterministic_problem()
    calls: list = []
    fwd, one, several = ja.oracle_forward, ja.oracle_backward, ja.oracle_backwards

    def spy_fwd(problem, a):
        calls.append("forward")
        return fwd(problem, a)

    def spy_one(problem, a, dlse=None):
        calls.append(("one", dlse is not None))
        return one(problem, a, dlse=dlse)

    def spy_many(problem, a, dlses):
        calls.append(("many", tuple(dl is not None for dl in dlses)))
        return several(problem, a, dlses)
    for mod in (judge, ja):
        monkeypatch.setattr(mod, "oracle_forward", spy_fwd)
        monkeypatch.setattr(mod, "oracle_backward", spy_one)
        monkeypatch.setattr(mod, "oracle_backwards", spy_many)
    fused = check_problem(p, _AutogradTwin(), properties=PROPS)
    assert calls == [("many", (False, True))], calls
    calls.clear()
    monkeypatch.setattr(judge, "oracle_pass", lambda problem, a, dlses: (fwd(problem, a),
                                                                        [one(problem, a, dlse=d) for d in dlses]))
    separate = check_problem(p, _AutogradTwin(), properties=PROPS)
    assert fused.metrics == separate.metrics and fused.ran == separate.ran


def test_a_forward_only_example_computes_the_forward_oracle_alone(monkeypatch):
    from fa4verify import judge
    from fa4verify.fuzz import check_problem
    from fa4verify.judge import attention as ja
    from test_lse_only_budget import _AutogradTwin
    from test_oracle_linearity import _deterministic_problem
    calls: list = []
    several = ja.oracle_backwards
    monkeypatch.setattr(judge, "oracle_backwards", lambda *a_: calls.append("backwards") or several(*a_))
    monkeypatch.setattr(ja, "oracle_backwards", lambda *a_: calls.append("backwards") or several(*a_))
    out = check_problem(_deterministic_problem(), _AutogradTwin(), properties=("runs", "fwd_budget"), backward=False)
    assert "fwd_budget" in out.ran and calls == []


def test_the_backwards_forward_is_the_forward_oracles_bit_for_bit():
    """Note [One oracle pass]: ``judge.oracle_pass``'s forward equals ``judge.oracle_forward``'s
    (out, LSE and their bounds) on the plain oracle's layouts, masks, softcap, sink and a tainted
    input; the keep-pattern and by-head oracles compute it by ``oracle_forward`` itself."""
    from fa4verify import judge
    from fa4verify.coverage import cases
    from fa4verify.problem import AttentionProblem, ValueSpec
    vs = lambda d, s_: ValueSpec(d, s_, cases._VALUE_PARAMS.get(d, ()))     # noqa: E731
    base = dict(arch="sm90", dtype="bf16", head_dim=64, head_dim_v=64)
    probs = [
        AttentionProblem(batch=2, seqlen_q=70, seqlen_k=90, nheads=4, nheads_kv=2, softcap=30.0, sink=True,
                         values=vs("outliers", 21), **base),
        AttentionProblem(batch=3, seqlens_q=(17, 0, 40), seqlens_k=(30, 5, 40), seqlen_q=40, seqlen_k=40, nheads=2,
                         nheads_kv=2, causal=True, values=vs("normal", 22), **base),
        AttentionProblem(batch=1, seqlen_q=96, seqlen_k=80, nheads=6, nheads_kv=2, window_size=(9, 3),
                         values=vs("peaked_rescale", 23), **base),
        AttentionProblem(batch=1, seqlen_q=48, seqlen_k=64, nheads=2, nheads_kv=2, mods=("rel_bias",),
                         values=vs("normal", 24), **base),
    ]
    for p in probs:
        a = p.materialize()
        for tainted in (False, True):
            if tainted:
                a = dict(a, q=np.array(a["q"], np.float32))
                a["q"].flat[5] = np.inf
            f = judge.oracle_forward(p, a)
            g, bs = judge.oracle_pass(p, a, (None,))
            assert len(bs) == 1
            for n in ("out", "bound", "lse", "lse_bound"):
                x, y = (np.asarray(getattr(r, n), np.float64) for r in (f, g))
                assert np.array_equal(x.view(np.uint64), y.view(np.uint64)), (p.describe(), tainted, n)


def test_a_failing_one_pass_oracle_falls_back_to_the_forward_alone(monkeypatch):
    """Where the one oracle pass fails, the forward is judged on ``oracle_forward`` as before and
    the backward computes (or fails on) its own oracle where it is judged."""
    from fa4verify import judge
    from fa4verify.fuzz import check_problem
    from test_lse_only_budget import PROPS, _AutogradTwin
    from test_oracle_linearity import _deterministic_problem

    def boom(*_a, **_k):
        raise RuntimeError("one pass failed")
    monkeypatch.setattr(judge, "oracle_pass", boom)
    out = check_problem(_deterministic_problem(), _AutogradTwin(), properties=PROPS)
    assert {"fwd_budget", "bwd_budget", "bwd_stages"} <= set(out.ran) and not out.undecided, out
