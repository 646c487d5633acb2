"""The backward interval bound (error_budgets/interval.py, DERIVATIONS.md#backward-interval, Note
[Backward interval fallback] in fa4verify/judge/stats.py): rigorous at any finite logit scale,
cross-checked against the mpmath arbiter (oracles/arbiter.py) on problems at and past the old
first-order limit, and meaningful there: planted faults on huge-logit problems are caught, each by
a named check. Figures: CPU twin and mpmath.
"""
from __future__ import annotations

import types

import numpy as np
import pytest

from fa4verify import judge
from fa4verify.judge.attention import as_input_dtype
from fa4verify.kernels.twin import backward as twin_bwd
from fa4verify.oracles import arbiter
from fa4verify.oracles.semantics import parse_problem
from fa4verify.stages.taps import judge_taps
from fa4verify.targets import TwinTarget
from fa4verify.problem import AttentionProblem, ValueSpec

from test_hull_fallback import _problem

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

# small enough for the arbiter; e_qk from below to far past the old first-order limit
SMALL = [
    _problem("huge", 40 + e, (("e_qk", float(e)), ("e_v", 2.0)), sq=6, sk=9, h=2, hk=1, d=8, dtype=dt,
             causal=(e % 2 == 0), softcap=(3.0 if e == 7 else 0.0))
    for e, dt in ((2, "fp16"), (3, "fp16"), (6, "fp16"), (5, "bf16"), (7, "bf16"), (8, "bf16"), (10, "bf16"))
]
#: the kernel models the bound must contain (every accumulation order, the MUFU at its bounds)
MODELS = [dict(accumulation="exact-then-round"), dict(accumulation="sequential", mufu="perturbed", seed=3),
          dict(accumulation="pairwise", mufu="perturbed", seed=5),
          # the SM90 tensor core bit for bit: the bound then takes each score as its point
          dict(accumulation="sm90-tensor-core", mufu="perturbed", seed=7)]


def _arbiter(p, a):
    dt = p.dtype
    sp = parse_problem(as_input_dtype(a["q"], dt), as_input_dtype(a["k"], dt), as_input_dtype(a["v"], dt),
                       softmax_scale=p.scale, causal=p.causal, window_size=p.window_size, softcap=p.softcap,
                       learnable_sink=None, cu_seqlens_q=None, cu_seqlens_k=None)
    bits = 80 if dict(p.values.params)["e_qk"] < 8 else 160
    do = np.asarray(a["dout"], np.float64)
    return arbiter.backward(sp, do.reshape((-1,) + do.shape[-2:]), None, None, bits=bits)


@pytest.mark.parametrize("p", SMALL, ids=lambda p: p.describe()[:70])
def test_every_kernel_model_is_inside_the_interval_bound_against_the_arbiter(p):
    """|kernel model - arbiter| <= the interval bound computed against the arbiter's gradient (+ its
    own certified bound), for every accumulation order and the MUFU at its bounds, on the kernel's
    own forward outputs and on the oracle's widened ones."""
    a = p.materialize()
    ab = _arbiter(p, a)
    for model in MODELS:
        t = TwinTarget(**model)
        f = t.forward(p, a)
        g = t.backward(p, a, f)
        j = judge.judge_forward(p, a, f.out, f.lse)
        ref = types.SimpleNamespace(**{n: np.asarray(getattr(ab, n)).reshape(np.shape(getattr(g, n)))
                                       for n in ("dq", "dk", "dv")})
        for kf in ((f.out, f.lse), None):
            iv = j.stats.backward_interval(ref, j.ref_out.budget, j.ref_out.bound, kernel_fwd=kf,
                                           tensor_core=t.tensor_core)
            for n in ("dq", "dk", "dv"):
                b = np.asarray(iv[n])
                assert np.isfinite(b).all() and (b >= 0).all(), (n, model)
                rb = np.asarray(getattr(ab, f"{n}_bound")).reshape(b.shape)
                err = np.abs(np.asarray(getattr(g, n), np.float64) - getattr(ref, n))
                assert np.all(err <= b + rb), (n, model, kf is None, float(np.max(err / (b + rb))))


def _decided(p, v) -> bool:
    """A gradient verdict is decided (pass), or dV of a bf16 problem with e_qk >= 8, where the
    interval bound admits a zero dV and the judge says so (Note [A bound without power] in
    fa4verify/judge/verdict.py; tests/test_huge_regime_power.py)."""
    if v.status == "pass":
        return True
    return (v.status == "undecided" and v.name == "dv" and p.dtype == "bf16"
            and dict(p.values.params)["e_qk"] >= 8 and "Note [A bound without power]" in v.reason)


def test_the_battery_reaches_past_the_old_first_order_limit():
    """Both sides of the old limit: the first-order dQ/dK are +inf on some problems (undecided
    before), finite on others; with the interval fallback every gradient is decided (but a dV the
    bound cannot tell from 0 at bf16 e_qk >= 8, which is undecided with that reason)."""
    past = below = 0
    for p in SMALL:
        a = p.materialize()
        t = TwinTarget()
        f = t.forward(p, a)
        g = t.backward(p, a, f)
        j = judge.judge_forward(p, a, f.out, f.lse)
        obwd = judge.oracle_backward(p, a)
        with np.errstate(all="ignore"):
            first = j.stats._backward_first_order(obwd, j.ref_out.budget, j.ref_out.bound, probabilistic=False)
        inf = not all(np.isfinite(first[n]).all() for n in ("dq", "dk", "dv"))
        past += inf
        below += not inf
        jb = judge.judge_backward(p, a, g.dq, g.dk, g.dv, forward=j, oracle_bwd=obwd, kernel_fwd=(f.out, f.lse))
        for v in jb.verdicts:
            assert _decided(p, v), (p.describe(), v.summary())
    assert past >= 2 and below >= 2, (past, below)


# ----------------------------------------------------------------------------- meaningful: faults
def _huge(dtype, e_qk, seed, **kw):
    kw = {"sq": 33, "sk": 150, "causal": True, **kw} if dtype == "fp16" else {"sq": 33, "sk": 70, **kw}
    return _problem("huge", seed, (("e_qk", float(e_qk)), ("e_v", 5.0 if dtype == "fp16" else 2.0)),
                    dtype=dtype, **kw)


#: huge-logit problems past the old first-order limit where a 1.5x dQ fault changes the error by more
#: than the model admits (bf16 e_qk <= 7, fp16 e_qk <= 6; see the Note for e_qk >= 8 bf16)
FAULT_PROBLEMS = [_huge("bf16", 4, 104), _huge("bf16", 7, 107), _huge("fp16", 4, 204), _huge("fp16", 6, 14)]


@pytest.mark.parametrize("p", FAULT_PROBLEMS, ids=lambda p: p.describe()[:60])
def test_a_planted_gradient_fault_on_huge_logits_fails_bwd_budget(p):
    a = p.materialize()
    t = TwinTarget()
    f = t.forward(p, a)
    g = t.backward(p, a, f)
    j = judge.judge_forward(p, a, f.out, f.lse)
    obwd = judge.oracle_backward(p, a)
    kf = (f.out, f.lse)
    clean = judge.judge_backward(p, a, g.dq, g.dk, g.dv, forward=j, oracle_bwd=obwd, kernel_fwd=kf)
    assert all(v.status == "pass" for v in clean.verdicts), [v.summary() for v in clean.verdicts]
    # decided by the interval bound (the first-order budget is past its limit on these problems)
    assert j.stats.bwd_fallback["dq"].any()
    for n in ("dq", "dk", "dv"):
        bad = {m: getattr(g, m) * (1.5 if m == n else 1.0) for m in ("dq", "dk", "dv")}
        jb = judge.judge_backward(p, a, bad["dq"], bad["dk"], bad["dv"], forward=j, oracle_bwd=obwd, kernel_fwd=kf)
        assert getattr(jb, n).status == "fail", (n, getattr(jb, n).summary())


@pytest.mark.parametrize("p", [_huge("bf16", 10, 110), _huge("bf16", 7, 107), _huge("fp16", 6, 14)],
                         ids=lambda p: p.describe()[:60])
def test_a_d_bias_on_huge_logits_fails_the_d_stage(p, monkeypatch):
    """A 2^-10 relative bias of D = rowsum(dO O) (the backward preprocess) is caught by the stage
    check ``bwd_stages.D`` (fa4verify/stages/taps.py: D against the exact rowsum of FA4's own O,
    budget d_pre): its budget is evaluated on the kernel's own O, so it does not grow with the
    logits -- also at bf16 e_qk 10, where no end-to-end gradient bound can see it."""
    a = p.materialize()
    t = TwinTarget()
    f = t.forward(p, a)
    obwd = judge.oracle_backward(p, a)
    j = judge.judge_forward(p, a, f.out, f.lse)
    taps: dict = {}
    clean = t.backward(p, a, f, taps=taps)         # the twin's taps (TwinTarget.taps_unsupported)
    jb = judge.judge_backward(p, a, clean.dq, clean.dk, clean.dv, forward=j, oracle_bwd=obwd,
                              kernel_fwd=(f.out, f.lse))
    vs = judge_taps(p, a, f.out, f.lse, taps, budgets=j.stats.budget, backward=jb)
    assert all(v.status == "pass" for v in vs.values()), {n: v.summary() for n, v in vs.items()}
    orig = twin_bwd._d_preprocess

    def biased(*args, **kw):
        return orig(*args, **kw) * (1 + 2.0 ** -10)

    monkeypatch.setattr(twin_bwd, "_d_preprocess", biased)
    taps = {}
    t.backward(p, a, f, taps=taps)
    vs = judge_taps(p, a, f.out, f.lse, taps, budgets=j.stats.budget, backward=jb)
    assert vs["D"].status == "fail", vs["D"].summary()


def test_clean_tightness_per_tensor_in_the_huge_regime_is_reported_and_within():
    """Clean tightness (error / allowance) of the interval-decided gradients on huge-logit draws
    (CPU twin): every value <= 1; printed for the report (pytest -s)."""
    rows = []
    for p in FAULT_PROBLEMS + [_huge("bf16", 8, 108), _huge("bf16", 10, 110)]:
        a = p.materialize()
        t = TwinTarget()
        f = t.forward(p, a)
        g = t.backward(p, a, f)
        j = judge.judge_forward(p, a, f.out, f.lse)
        jb = judge.judge_backward(p, a, g.dq, g.dk, g.dv, forward=j, kernel_fwd=(f.out, f.lse))
        tt = {v.name: v.tightness for v in jb.verdicts}
        assert all(_decided(p, v) for v in jb.verdicts), [v.summary() for v in jb.verdicts]
        rows.append(f"{p.dtype} e_qk={dict(p.values.params)['e_qk']:g}: " +
                    ", ".join(f"{n} {x:.3g}" for n, x in tt.items()))
    print("\n".join(rows))


@pytest.mark.parametrize("p", [_huge("bf16", 7, 107), _huge("bf16", 10, 110), _huge("fp16", 6, 14)],
                         ids=lambda p: p.describe()[:60])
def test_a_rowsum_bias_on_huge_logits_fails_the_statistical_tier(p, monkeypatch):
    """A 2^-9 relative bias of 1/rowsum (the forward's normaliser) on huge logits: the worst-case
    O check cannot see it (the hull decides O there; and in bf16 2^-9 is below the P cast plus the
    output cast, 2^-7, at every scale), the statistical tier's radial-bias test does
    (fa4verify/judge/statistical.py, Note [Statistical tier]: stat.out), while the clean kernel
    passes it (MUFU perturbed against the correctly rounded prediction)."""
    from fa4verify.judge import statistical as S
    from fa4verify.kernels.twin import forward as tf
    p = p.replace(nheads=4, nheads_kv=4, seqlen_q=128)
    a = p.materialize()
    t = TwinTarget(mufu="perturbed", seed=9)
    ofwd = judge.oracle_forward(p, a)
    alpha = S.alpha_per_test(S.DEFAULT_ALPHA, 4)
    clean = S.tier_on(p, {"out": t.forward(p, a).out}, {"out": ofwd.out}, a, alpha_test=alpha)[0]
    assert clean.status == "pass", clean
    orig = tf.Mufu.rcp
    monkeypatch.setattr(tf.Mufu, "rcp", lambda self, x: (orig(self, x) * np.float32(1 + 2.0 ** -9)).astype(np.float32))
    f = t.forward(p, a)
    monkeypatch.undo()                     # the prediction is the clean twin's
    j = judge.judge_forward(p, a, f.out, f.lse, oracle=ofwd)
    assert j.out.status == "pass"          # the worst-case tier: blind to it here
    v = S.tier_on(p, {"out": f.out}, {"out": ofwd.out}, a, alpha_test=alpha)[0]
    assert v.status == "fail" and v.radial_ci[0] > v.margin_ulp, v


def test_the_fuzz_runs_the_stage_checks_on_the_twin_and_a_d_bias_fails_bwd_stages(monkeypatch):
    """The product's own path (``fa4verify fuzz --target twin``: fuzz.properties.check_problem)
    judges the twin's stage taps (property ``bwd_stages``) on dense problems; on a bf16 e_qk 10
    problem a 2^-10 D bias fails the end-to-end dQ bound (sm90: Note [Same S in both passes];
    before it, the bound was too loose there and ``bwd_stages`` caught it; the stage verdict on
    its own: test_a_d_bias_on_huge_logits_fails_the_d_stage)."""
    from fa4verify.fuzz.properties import check_problem
    from fa4verify.fuzz.violation import Violation
    p = _huge("bf16", 10, 110)
    out = check_problem(p, TwinTarget())
    # (dV decided through Note [One-hot LSE chain])
    assert "bwd_stages" in out.ran and not out.undecided, (out.ran, out.undecided)
    orig = twin_bwd._d_preprocess
    monkeypatch.setattr(twin_bwd, "_d_preprocess", lambda *a, **k: orig(*a, **k) * (1 + 2.0 ** -10))
    with pytest.raises(Violation) as e:
        check_problem(p, TwinTarget())
    assert e.value.prop == "bwd_budget" and e.value.args[0].startswith("[bwd_budget] dq:"), e.value


@pytest.mark.parametrize("chain", [True, False], ids=["chain", "no_chain"])
def test_a_postprocess_dq_fault_on_huge_logits_fails_bwd_stages_dq_post(chain, monkeypatch):
    """A 1.5x dQ fault between the accumulator and the output (the postprocess) on a bf16 e_qk 10
    problem. Through Note [One-hot LSE chain] the end-to-end dQ bound fails it (``bwd_budget.dq``);
    where that bound is loose (here: the budgets without the chain, where a 1.5x dQ passes
    ``bwd_budget``) the stage check ``bwd_stages.dq_post`` (dQ against ``dq_accum RN(scale)`` of
    the same call) fails it. A fault inside the accumulation itself (dq_accum and dQ both 1.5x) is
    not caught by the stage check: only an end-to-end bound can see it (DERIVATIONS.md#backward-interval)."""
    from fa4verify.fuzz.properties import check_problem
    from fa4verify.fuzz.violation import Violation
    from fa4verify.targets import Bwd
    if not chain:
        from test_huge_regime_power import _chain_off
        _chain_off(monkeypatch)
    p = _huge("bf16", 10, 110)
    orig = TwinTarget.backward

    def faulty(self, problem, a, fwd, **kw):
        g = orig(self, problem, a, fwd, **kw)
        return Bwd(g.dq * 1.5, g.dk, g.dv, g.dsink, stages=g.stages)

    monkeypatch.setattr(TwinTarget, "backward", faulty)
    with pytest.raises(Violation) as e:
        check_problem(p, TwinTarget())
    want = "bwd_budget] dq:" if chain else "bwd_stages] dq_post:"
    assert e.value.args[0].startswith("[" + want), e.value


def test_a_nan_forward_output_fed_to_the_backward_is_undecided_with_its_reason():
    """The only budget-side undecided cause left on finite inputs: the forward output the kernel's
    backward read is NaN/inf (the budget defines nothing there), said in one line."""
    p = _huge("bf16", 8, 108)
    a = p.materialize()
    t = TwinTarget()
    f = t.forward(p, a)
    out = np.array(f.out, np.float64)
    out[0, 3, 0, 5] = np.nan
    from fa4verify.targets import Fwd
    g = t.backward(p, a, Fwd(out, f.lse))
    j = judge.judge_forward(p, a, f.out, f.lse)
    jb = judge.judge_backward(p, a, g.dq, g.dk, g.dv, forward=j, kernel_fwd=(out, f.lse))
    assert jb.dq.status == "undecided" and jb.dq.n_over == 0, jb.dq.summary()
    assert "the forward output the kernel's backward read is non-finite (1 O value(s) NaN/inf" in jb.dq.reason
    # the clean forward output: decided
    g0 = t.backward(p, a, f)
    jb0 = judge.judge_backward(p, a, g0.dq, g0.dk, g0.dv, forward=j, kernel_fwd=(f.out, f.lse))
    assert all(_decided(p, v) for v in jb0.verdicts), [v.summary() for v in jb0.verdicts]


@pytest.mark.parametrize("mods", [("alibi",), ("rel_bias",), ("softcap",), ("alibi", "document")])
def test_score_mod_pairs_get_the_interval_bound(mods):
    """Score pairs (fa4verify.mods; production only, the twin does not model them) past the old
    limit: the interval bound takes the pair's Lipschitz and curvature constants
    (DERIVATIONS.md#backward-interval step 2, 6) and decides; the exact gradient computed from
    the oracle's own forward outputs passes within it."""
    p = _problem("huge", 7, (("e_qk", 6.0), ("e_v", 2.0)), sq=48, sk=48).replace(mods=mods)
    a = p.materialize()
    ofwd = judge.oracle_forward(p, a)
    obwd = judge.oracle_backward(p, a)
    j = judge.judge_forward(p, a, ofwd.out, ofwd.lse, oracle=ofwd)
    jb = judge.judge_backward(p, a, obwd.dq, obwd.dk, obwd.dv, forward=j, oracle_bwd=obwd,
                              kernel_fwd=(ofwd.out, ofwd.lse))
    for n in ("dq", "dk", "dv"):
        assert j.stats.bwd_fallback[n].all(), n
        assert getattr(jb, n).status == "pass", getattr(jb, n).summary()


def test_dq_post_matches_nan_where_the_tapped_accumulator_is_nan():
    """``bwd_stages.dq_post`` judges the postprocess against the kernel's own accumulator: an
    accumulator element that is NaN (e.g. filled by a known FA4 fault upstream) must give a NaN dQ
    there -- decided (pass), never "oracle NaN" undecided; a finite dQ there is a violation."""
    import math
    import types

    from fa4verify.stages.taps import judge_taps
    p = _huge("bf16", 8, 108)
    a = p.materialize()
    t = TwinTarget()
    f = t.forward(p, a)
    g = t.backward(p, a, f)
    taps = {k: np.array(v, np.float64) for k, v in g.stages.items() if k in ("dpsum", "lse_log2", "dq_accum",
                                                                              "dq_accum_zeroed")}
    assert "dq_accum" in taps
    scale = p.softmax_scale if p.softmax_scale is not None else 1.0 / math.sqrt(p.head_dim)
    dq = np.array(taps["dq_accum"] * float(np.float32(scale)), np.float32).astype(np.float64)
    taps["dq_accum"][0, 1, 0, :4] = np.nan
    dq_nan = dq.copy()
    dq_nan[0, 1, 0, :4] = np.nan
    from fa4verify.fuzz.properties import _budget
    jb = judge.judge_backward(p, a, g.dq, g.dk, g.dv, forward=judge.judge_forward(p, a, f.out, f.lse),
                              kernel_fwd=(f.out, f.lse))
    bw = types.SimpleNamespace(oracle=jb.oracle, budgets=jb.budgets)
    ok = judge_taps(p, a, f.out, f.lse, taps, budgets=_budget(p), backward=bw, dq=dq_nan)["dq_post"]
    assert ok.status == "pass", ok.reason
    bad = judge_taps(p, a, f.out, f.lse, taps, budgets=_budget(p), backward=bw, dq=dq)["dq_post"]
    assert bad.status == "fail" and bad.n_over >= 4, (bad.status, bad.n_over)


@pytest.mark.parametrize("sink", [None, 3.0, -40.0])
def test_leave_one_out_log_sum_exp_matches_the_direct_sum(sink):
    """Note [Same S in both passes]: log(sum_{k != j} e^a_k + e^sink) for every j, against the
    direct sum in mpmath, on rows with masked keys, ties and a dominant key far above the rest."""
    import mpmath

    from fa4verify.error_budgets.interval import _loo_lse
    rng = np.random.default_rng(7)
    a = rng.normal(0, 30, size=(5, 7))
    a[0, 2] = a[0, 5] = a[0].max() + 1.0                 # a tie at the top
    a[1, 3] = 1e4                                        # one key 1e4 above the rest
    a[2, [0, 6]] = -np.inf                               # masked keys
    got = _loo_lse(a, sink)
    for i in range(a.shape[0]):
        for j in range(a.shape[1]):
            terms = [mpmath.e ** mpmath.mpf(float(x)) for k, x in enumerate(a[i]) if k != j and np.isfinite(x)]
            if sink is not None:
                terms.append(mpmath.e ** mpmath.mpf(sink))
            want = float(mpmath.log(mpmath.fsum(terms))) if terms else -np.inf
            assert got[i, j] == pytest.approx(want, rel=1e-12, abs=1e-9), (i, j)


def test_a_softcap_pair_is_bounded_by_the_built_in_softcap_model():
    """Note [A softcap pair in the built-in's model] (fa4verify/judge/stats.py): the softcap score
    pair computes the built-in softcap with its own operations, so its gradients get the built-in's
    interval bound, element for element. The problem is the H200's (fuzz.production, huge only,
    seed 7, 2026-12-03): one dV of the pair was undecided there (exact 1.67, allowed 3.77: the
    generic pair step admitted any P of a saturated row). The twin of the built-in softcap stands
    in for the kernel (the same arithmetic): every gradient is decided and passes."""
    pair = AttentionProblem.from_dict({
        "format": "fa4verify-attention-problem/1", "arch": "sm90", "dtype": "bf16", "batch": 1,
        "seqlen_q": 5, "seqlen_k": 9, "nheads": 1, "nheads_kv": 1, "head_dim": 64, "head_dim_v": 64,
        "causal": False, "window_size": [None, None], "softcap": 0.0, "sink": False,
        "values": {"distribution": "huge", "seed": 715, "params": {"e_qk": 9.0, "e_v": 20.0}},
        "mods": ["softcap"], "mod_seed": 1})
    cap = pair.mod_pairs()[0].equivalent["softcap"]
    builtin = pair.replace(mods=(), softcap=cap)
    a, ab = pair.materialize(), builtin.materialize()
    assert all(np.array_equal(a[n], ab[n]) for n in ("q", "k", "v", "dout"))
    t = TwinTarget()
    f = t.forward(builtin, ab)
    g = t.backward(builtin, ab, f)
    jp = judge.judge_backward(pair, a, g.dq, g.dk, g.dv, kernel_fwd=(f.out, f.lse))
    jb = judge.judge_backward(builtin, ab, g.dq, g.dk, g.dv, kernel_fwd=(f.out, f.lse))
    for n in ("dq", "dk", "dv"):
        assert np.array_equal(jp.budgets[n], jb.budgets[n]), n
        assert getattr(jp, n).status == "pass", getattr(jp, n).summary()
    # power: the bound is far below the exact dV, so a zeroed dV fails
    zero = judge.judge_backward(pair, a, g.dq, g.dk, np.zeros_like(g.dv), kernel_fwd=(f.out, f.lse))
    assert zero.dv.status == "fail", zero.dv.summary()


def test_a_user_pair_cannot_borrow_the_built_in_softcap_model():
    """Review finding (2026-12-03): a user pair whose ``equivalent`` claimed softcap 30 while its
    reference was softcap 20 made the judge pass a kernel computing softcap 30. The claim is now
    checked at registration, and only fa4verify's own softcap pair gets the built-in's model."""
    import dataclasses

    from fa4verify import mods
    from fa4verify.kernels.mods import softcap_mod
    liar = dataclasses.replace(softcap_mod(20.0), name="liar_softcap", equivalent={"softcap": 30.0})
    with pytest.raises(mods.ModPairError, match="claims"):
        mods.register_mod_pair(liar)
    honest = dataclasses.replace(softcap_mod(20.0), name="honest_softcap")
    mods.register_mod_pair(honest)
    try:
        assert not mods.is_builtin(honest) and mods.is_builtin(mods.get("softcap"))
        # the honest user pair keeps the generic pair step (its own Lipschitz and curvature
        # constants): a kernel computing softcap 30 for it fails
        p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=16, seqlen_k=24, nheads=1, nheads_kv=1,
                             head_dim=64, head_dim_v=64, values=ValueSpec("huge", 1, (("e_qk", 6.0), ("e_v", 2.0))),
                             mods=("honest_softcap",))
        a = p.materialize()
        wrong = TwinTarget()
        bp = p.replace(mods=(), softcap=30.0)
        f = wrong.forward(bp, bp.materialize())
        g = wrong.backward(bp, bp.materialize(), f)
        jb = judge.judge_backward(p, a, g.dq, g.dk, g.dv, kernel_fwd=(f.out, f.lse))
        assert jb.dv.status == "fail", [v.summary() for v in jb.verdicts]
    finally:
        mods.unregister("honest_softcap")
