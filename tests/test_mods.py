"""score_mod / mask_mod pairs (issue 16 item 1): each pair's float64 reference, applied by the
mod oracle (``fa4verify.oracles.mods``), against independent float64 references written
differently (dense python loops for the bias / keep, torch ``scaled_dot_product_attention`` with
an explicit additive bias or boolean mask, torch autograd for the gradients, the certified
oracle for softcap and windows); the registry's refusals; the judge on problems with mods."""
from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fa4verify import mods  # noqa: E402
from fa4verify.kernels import mods as km  # noqa: E402
from fa4verify.oracles import mods as om  # noqa: E402
from fa4verify import errors  # noqa: E402

B, S, H, D = 2, 160, 2, 32


def _inputs(seed=0, sq=S, sk=S):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, sq, H, D)) * 1.5
    k = rng.standard_normal((B, sk, H, D))
    v = rng.standard_normal((B, sk, H, D))
    do = rng.standard_normal((B, sq, H, D))
    return q, k, v, do


def _pair_callables(pair, sq=S, sk=S, seed=0):
    aux = pair.make_aux(km.ModShape(B, H, sq, sk), seed)
    qi = np.arange(sq)[:, None]
    ki = np.arange(sk)[None, :]
    if pair.kind == "score":
        return aux, dict(score=lambda x, b, h: pair.ref(x, b, h, qi, ki, aux),
                         grad=lambda x, b, h: pair.grad(x, b, h, qi, ki, aux), curvature=pair.curvature)
    keeps = [np.broadcast_to(pair.ref(b, 0, qi, ki, aux), (sq, sk)) for b in range(B)]
    return aux, dict(keep=lambda b, h: keeps[b])


# -- independent biases / keeps: python loops over (i, j), no numpy broadcasting of the pair
def _loop_bias(name, aux, b, h, sq, sk):
    out = np.zeros((sq, sk))
    for i in range(sq):
        for j in range(sk):
            if name == "alibi":
                out[i, j] = -float(2.0 ** (-8.0 * (h + 1) / H)) * abs(i - j)
            elif name == "rel_bias":
                r = km.REL_RADIUS
                out[i, j] = float(aux[0][min(max(j - i, -r), r) + r])
            elif name == "scalar_bias":
                s0, s1 = aux.scalars
                out[i, j] = s0 - s1 * abs(i - j)
    return out


def _loop_keep(name, aux, b, sq, sk):
    out = np.zeros((sq, sk), bool)
    for i in range(sq):
        for j in range(sk):
            if name == "document":
                out[i, j] = aux[0][b, i] == aux[0][b, j]
            elif name == "prefix_lm":
                out[i, j] = j < km.PREFIX or j <= i
            elif name == "sliding_window":
                out[i, j] = i - km.WINDOW[0] <= j <= i + km.WINDOW[1]
            elif name == "causal":
                out[i, j] = j <= i
            elif name == "checkerboard":
                out[i, j] = (i // 128 + j // 128) % 2 == 0
    return out


def _sdpa(q, k, v, mask, scale):
    t = lambda x: torch.from_numpy(np.ascontiguousarray(x.transpose(1, 0, 2)))  # noqa: E731  (h, s, d)
    return torch.nn.functional.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=torch.from_numpy(mask),
                                                            scale=scale).numpy().transpose(1, 0, 2)


@pytest.mark.parametrize("name", ["alibi", "rel_bias", "scalar_bias"])
def test_additive_score_pair_output_equals_sdpa_with_explicit_bias(name):
    pair = mods.get(name)
    q, k, v, _ = _inputs(1)
    aux, kw = _pair_callables(pair)
    kw.pop("grad"), kw.pop("curvature")
    r = om.forward(q, k, v, **kw)
    sc = D ** -0.5
    for b in range(B):
        for h in range(H):
            ref = _sdpa(q[b, :, h:h + 1], k[b, :, h:h + 1], v[b, :, h:h + 1], _loop_bias(name, aux, b, h, S, S), sc)
            assert np.abs(r.out[b, :, h] - ref[:, 0]).max() < 1e-12
    # and the bias is really there (the identity is far away)
    plain = om.forward(q, k, v)
    assert np.abs(r.out - plain.out).max() > 1e-2


def test_runtime_scalars_are_fp32_values_drawn_at_the_mod_seed():
    pair = mods.get("scalar_bias")
    assert pair.scalars is not None and "aux_scalars" in pair.features
    s0, s7 = pair.make_scalars(0), pair.make_scalars(7)
    assert len(s0) == 2 and s0 != s7 and pair.make_scalars(7) == s7
    for x in s0 + s7:
        assert float(np.float32(x)) == x              # what the kernel receives, exactly
    assert -2 <= s0[0] <= 2 and 0 <= s0[1] <= 0.25
    aux = pair.make_aux(km.ModShape(B, H, S, S), 7)
    assert list(aux) == [] and aux.scalars == s7
    # the problem's mod_seed reaches the references (and the same values reach FA4: targets._kw)
    p0 = _problem(("scalar_bias",), mod_seed=0)
    p7 = _problem(("scalar_bias",), mod_seed=7)
    assert mods.aux_for(p0, pair).scalars == s0 and mods.aux_for(p7, pair).scalars == s7
    # given aux arrays (real data) keep the problem's scalars, or bring their own
    assert mods.aux_for(p7, pair, {"mod_aux": {"scalar_bias": []}}).scalars == s7
    own = km.AuxValues([], (0.5, 0.125))
    assert mods.aux_for(p7, pair, {"mod_aux": {"scalar_bias": own}}).scalars == (0.5, 0.125)
    # other pairs take none
    assert mods.get("alibi").make_aux(km.ModShape(B, H, S, S)).scalars == ()


def test_a_pair_with_non_finite_scalars_is_refused():
    bad = km.ModPair("bad_scalar", "score", lambda x, *r: x, grad=lambda x, *r: np.ones_like(x),
                     err=lambda x, *r: np.zeros_like(x), scalars=lambda rng: (float("nan"),))
    with pytest.raises(errors.ModPairError, match="aux scalars must be finite"):
        mods.validate(bad, sweep=False)


@pytest.mark.parametrize("name", ["document", "prefix_lm", "sliding_window", "causal", "checkerboard"])
def test_mask_pair_output_equals_sdpa_with_boolean_mask(name):
    pair = mods.get(name)
    q, k, v, _ = _inputs(2)
    aux, kw = _pair_callables(pair)
    r = om.forward(q, k, v, **kw)
    for b in range(B):
        keep = _loop_keep(name, aux, b, S, S)
        assert keep.any(axis=1).all()
        ref = _sdpa(q[b], k[b], v[b], keep, D ** -0.5)
        assert np.abs(r.out[b] - ref).max() < 1e-12
        assert np.array_equal(kw["keep"](b, 0), keep)


def _loop_temperature(aux, sq, sk):
    out = np.zeros((sq, sk))
    r = km.SCALE_RADIUS
    for i in range(sq):
        for j in range(sk):
            out[i, j] = float(aux[0][min(max(j - i, -r), r) + r])
    return out


def test_rel_scale_is_an_index_reading_power_of_two_temperature():
    """rel_scale: y = x t[clip(kv - q)] with t in {1/2, 1}, not symmetric in kv - q (so a backward
    that swaps q_idx and kv_idx changes its derivative), and its oracle gradient is autograd's."""
    pair = mods.get("rel_scale")
    aux = pair.make_aux(km.ModShape(B, H, 96, 80), 0)
    t = np.asarray(aux[0], np.float64)
    r = km.SCALE_RADIUS
    assert set(np.unique(t)) == {0.5, 1.0} and t[r + 1] != t[r - 1]
    qi, ki = np.arange(96)[:, None], np.arange(80)[None, :]
    x = np.random.default_rng(0).standard_normal((96, 80))
    T = _loop_temperature(aux, 96, 80)
    assert np.array_equal(pair.ref(x, 0, 0, qi, ki, aux), x * T)
    assert np.array_equal(pair.grad(x, 0, 0, qi, ki, aux), T)
    assert not np.array_equal(T, _loop_temperature(aux, 80, 96).T)    # the swapped indices differ
    q, k, v, do = _inputs(4, sq=96, sk=96)
    aux, kw = _pair_callables(pair, 96, 96)
    res = om.backward(q, k, v, do, **kw)
    tq, tk, tv = (torch.from_numpy(x_.copy()).requires_grad_(True) for x_ in (q, k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", tq, tk) * D ** -0.5 * torch.from_numpy(_loop_temperature(aux, 96, 96))
    o = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), tv)
    o.backward(torch.from_numpy(do))
    for got, bound, ref in ((res.dq, res.dq_bound, tq.grad), (res.dk, res.dk_bound, tk.grad),
                            (res.dv, res.dv_bound, tv.grad)):
        assert np.all(np.abs(got - ref.numpy()) <= bound + 1e-12)


@pytest.mark.parametrize("name", ["alibi", "rel_bias", "scalar_bias", "softcap", "document", "prefix_lm"])
def test_mod_oracle_gradient_equals_torch_autograd(name):
    pair = mods.get(name)
    q, k, v, do = _inputs(3, sq=96, sk=96)
    aux, kw = _pair_callables(pair, 96, 96)
    r = om.backward(q, k, v, do, **kw)
    tq, tk, tv = (torch.from_numpy(x.copy()).requires_grad_(True) for x in (q, k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", tq, tk) * D ** -0.5
    if name == "softcap":
        s = km.SOFTCAP * torch.tanh(s / km.SOFTCAP)
    elif pair.kind == "score":
        s = s + torch.from_numpy(np.stack([np.stack([_loop_bias(name, aux, b, h, 96, 96) for h in range(H)])
                                           for b in range(B)]))
    else:
        keep = torch.from_numpy(np.stack([_loop_keep(name, aux, b, 96, 96) for b in range(B)]))[:, None]
        s = s.masked_fill(~keep, float("-inf"))
    o = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), tv)
    o.backward(torch.from_numpy(do))
    for got, bound, ref in ((r.dq, r.dq_bound, tq.grad), (r.dk, r.dk_bound, tk.grad), (r.dv, r.dv_bound, tv.grad)):
        err = np.abs(got - ref.numpy())
        assert err.max() < 1e-11
        assert (err <= bound + 1e-13).all()      # the first-order bound holds against autograd


def test_softcap_pair_matches_the_certified_softcap_oracle_within_its_bounds():
    from fa4verify.oracles import attention as orc
    q, k, v, do = _inputs(4, sq=64, sk=64)
    q = q * 8         # scores reach the cap
    _, kw = _pair_callables(mods.get("softcap"), 64, 64)
    r = om.backward(q, k, v, do, **kw)
    c = orc.backward(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), None, do.astype(np.float32),
                     softcap=km.SOFTCAP)
    # same float32-exact inputs: compare where both take them as given
    r32 = om.backward(*(x.astype(np.float32).astype(np.float64) for x in (q, k, v, do)), **kw)
    assert np.abs(r32.forward.out - c.forward.out).max() <= (r32.forward.bound + c.forward.bound).max()
    for n in ("dq", "dk", "dv"):
        diff = np.abs(getattr(r32, n) - getattr(c, n))
        assert (diff <= getattr(r32, f"{n}_bound") + getattr(c, f"{n}_bound")).all(), n
    assert np.abs(r.forward.out).max() > 0


@pytest.mark.parametrize("sq, sk, left, right", [(64, 64, 16, 0), (48, 80, 8, 4), (80, 48, None, 0),
                                                 (64, 64, 0, 24), (33, 97, 5, None)])
def test_window_mask_pair_keeps_exactly_fa4s_window(sq, sk, left, right):
    from fa4verify.problem import window_keep_mask
    from fa4verify.oracles.semantics import resolve_window, visible_mask
    pair = km.sliding_window(left, right, offset=sk - sq)
    qi, ki = np.arange(sq)[:, None], np.arange(sk)[None, :]
    keep = np.broadcast_to(pair.ref(0, 0, qi, ki, []), (sq, sk))
    # the certified oracle's window (oracles/semantics.py) and the strategies' (bottom-right aligned)
    assert np.array_equal(keep, visible_mask(sq, sk, *resolve_window(False, (left, right))))
    assert np.array_equal(keep, window_keep_mask(sq, sk, causal=False, window_size=(left, right)))
    assert pair.equivalent["window_size"] == (left, right)


def test_causal_mask_pair_equals_fa4_causal_with_offset():
    from fa4verify.problem import window_keep_mask
    for sq, sk in ((64, 64), (40, 100), (100, 40)):
        pair = km.causal_mask(offset=sk - sq)
        keep = np.broadcast_to(pair.ref(0, 0, np.arange(sq)[:, None], np.arange(sk)[None, :], []), (sq, sk))
        assert np.array_equal(keep, window_keep_mask(sq, sk, causal=True, window_size=(None, None)))


# -- the registry
def _score(name="user_bias", **kw):
    base = dict(grad=lambda x, *r: np.ones_like(x), err=lambda x, y, *r: 2.0 ** -24 * np.abs(x))
    base.update(kw)
    return km.ModPair(name, "score", lambda x, b, h, qi, ki, a: x + 0.5, **base)


@pytest.mark.parametrize("pair, msg", [
    (lambda: _score("Bad Name"), "must match"),
    (lambda: km.ModPair("x1", "both", lambda *a: 0), "kind must be"),
    (lambda: _score(grad=None), "needs a callable grad"),
    (lambda: _score(err=None), "needs a callable err"),
    (lambda: _score(err=lambda x, y, *r: -np.abs(x) - 1), "err must be >= 0"),
    (lambda: _score(lipschitz=float("inf")), "lipschitz must be"),
    (lambda: km.ModPair("m1", "mask", lambda b, h, qi, ki, a: (qi >= ki).astype(float)), "must return booleans"),
    (lambda: km.ModPair("m2", "mask", lambda b, h, qi, ki, a: (qi + h) >= ki), "depends on the head"),
    (lambda: km.ModPair("m3", "mask", lambda b, h, qi, ki, a: np.ones(3, bool)), "not broadcastable"),
    (lambda: km.ModPair("m4", "mask", lambda b, h, qi, ki, a: a[0] > 0), "reference failed"),
    (lambda: km.ModPair("m5", "mask", lambda b, h, qi, ki, a: qi >= ki, grad=lambda *r: 1), "has no grad/err"),
    (lambda: _score(ref=None) if False else km.ModPair("s9", "score", lambda x, *r: x * np.nan,
                                                         grad=lambda x, *r: np.ones_like(x),
                                                         err=lambda x, y, *r: np.abs(x)), "finite floats"),
    (lambda: "not a pair", "expected a fa4verify.kernels.mods.ModPair"),
])
def test_registry_refuses_malformed_pairs_with_one_line(pair, msg):
    with pytest.raises(errors.ModPairError, match=msg) as ei:
        mods.register_mod_pair(pair())
    assert "\n" not in str(ei.value)


def test_registry_refuses_builtin_and_duplicate_names_and_unknown_lookups():
    with pytest.raises(errors.ModPairError, match="built-in"):
        mods.register_mod_pair(_score("alibi"))
    p = mods.register_mod_pair(_score("user_bias_dup"))
    try:
        with pytest.raises(errors.ModPairError, match="already registered"):
            mods.register_mod_pair(_score("user_bias_dup"))
        assert mods.register_mod_pair(_score("user_bias_dup"), replace=True) is not p
    finally:
        mods.unregister("user_bias_dup")
    with pytest.raises(errors.ModPairError, match="unknown mod pair 'nope'"):
        mods.get("nope")
    import fa4verify
    assert fa4verify.register_mod_pair is mods.register_mod_pair


# -- the judge on problems with mods
def _bf16(x, dtype="bf16"):
    """``x`` rounded to the kernel's output dtype (bf16 or fp16), as float64."""
    import ml_dtypes
    t = np.float16 if dtype == "fp16" else ml_dtypes.bfloat16
    return np.asarray(x, np.float32).astype(t).astype(np.float64)


def _problem(mods_, **kw):
    from fa4verify.problem import AttentionProblem
    base = dict(arch="sm90", dtype="bf16", batch=1, seqlen_q=192, seqlen_k=192, nheads=2, nheads_kv=2,
                head_dim=64, head_dim_v=64, mods=tuple(mods_))
    base.update(kw)
    return AttentionProblem(**base)


@pytest.mark.parametrize("names", [("alibi",), ("softcap",), ("document",), ("rel_bias", "prefix_lm")])
def test_judge_passes_the_rounded_oracle_and_fails_when_the_mod_is_dropped(names):
    from fa4verify.judge import judge_backward, judge_forward
    from fa4verify.judge.attention import oracle_backward, oracle_forward
    p = _problem(names, values=__import__("fa4verify.problem", fromlist=["ValueSpec"]).ValueSpec(
        "normal", 3))
    a = p.materialize()
    o = oracle_forward(p, a)
    j = judge_forward(p, a, _bf16(o.out), o.lse)
    assert j.out.status == j.lse.status == "pass", (j.out.summary(), j.lse.summary())
    ob = oracle_backward(p, a)
    jb = judge_backward(p, a, _bf16(ob.dq), _bf16(ob.dk), _bf16(ob.dv), forward=j)
    assert all(v.status == "pass" for v in jb.verdicts), [v.summary() for v in jb.verdicts]
    o0 = oracle_forward(p.replace(mods=()), a)
    if names == ("softcap",):        # normal scores sit far below the cap: scale q to reach it
        a = dict(a, q=a["q"] * 16)
        o = oracle_forward(p, a)
        o0 = oracle_forward(p.replace(mods=()), a)
        j = judge_forward(p, a, _bf16(o.out), o.lse)
        assert j.out.status == "pass"
    bad = judge_forward(p, a, _bf16(o0.out), o0.lse)
    assert bad.out.status == "fail" or bad.lse.status == "fail"


@pytest.mark.parametrize("pair, builtin, softcap, sink", [
    ("causal", dict(causal=True), 30.0, True),
    ("causal", dict(causal=True), 30.0, False),
    ("sliding_window", dict(window_size=km.WINDOW), 0.0, True),
])
def test_mask_pair_oracle_applies_the_problems_softcap_and_sink(pair, builtin, softcap, sink):
    """Note [Mods with softcap and sink]: a mask pair on a softcap / sink problem is judged
    against FA4's semantics with both (the certified oracle on the built-in mask the pair
    equals), GQA included; before, the mod oracle dropped them (production rows 33, 98, 100)."""
    from fa4verify.problem import ValueSpec
    from fa4verify.judge import judge_backward, judge_forward
    from fa4verify.judge.attention import oracle_backward, oracle_forward
    p = _problem((pair,), seqlen_q=160, seqlen_k=160, nheads=4, nheads_kv=2, softcap=softcap, sink=sink,
                 values=ValueSpec("outliers", 7))
    a = p.materialize()
    ref = p.replace(mods=(), **builtin)
    o, c = oracle_forward(p, a), oracle_forward(ref, a)
    assert np.abs(o.out).max() > 0.1
    assert (np.abs(o.out - c.out) <= o.bound + c.bound).all()
    fin = np.isfinite(c.lse)
    assert np.array_equal(fin, np.isfinite(o.lse))
    assert (np.abs(o.lse - c.lse)[fin] <= (o.lse_bound + c.lse_bound)[fin]).all()
    ob, cb = oracle_backward(p, a), oracle_backward(ref, a)
    for n in ("dq", "dk", "dv"):
        assert (np.abs(getattr(ob, n) - getattr(cb, n)) <= getattr(ob, f"{n}_bound") + getattr(cb, f"{n}_bound")).all(), n
    if sink:
        assert (np.abs(ob.dsink - cb.dsink) <= ob.dsink_bound + cb.dsink_bound).all()
    # the judge: FA4's right answer (the built-in's oracle, rounded) passes the mod problem
    j = judge_forward(p, a, _bf16(c.out), c.lse)
    assert j.out.status == j.lse.status == "pass", (j.out.summary(), j.lse.summary())
    jb = judge_backward(p, a, _bf16(cb.dq), _bf16(cb.dk), _bf16(cb.dv), forward=j)
    assert all(v.status == "pass" for v in jb.verdicts), [v.summary() for v in jb.verdicts]


def test_mod_oracle_refuses_softcap_with_a_score_function():
    q, k, v, _ = _inputs(1, sq=16, sk=16)
    _, kw = _pair_callables(mods.get("alibi"), 16, 16)
    kw.pop("grad"), kw.pop("curvature")
    with pytest.raises(ValueError, match="FA4 refuses"):
        om.forward(q, k, v, softcap=30.0, **kw)


def test_user_pair_with_lipschitz_above_one_is_undecided_never_pass():
    from fa4verify.judge import judge_forward
    from fa4verify.judge.attention import oracle_forward
    mods.register_mod_pair(km.ModPair("user_double", "score", lambda x, *r: 2 * x,
                                      grad=lambda x, *r: np.full_like(x, 2.0),
                                      err=lambda x, y, *r: 2.0 ** -24 * np.abs(y), lipschitz=2.0))
    try:
        p = _problem(("user_double",))
        a = p.materialize()
        o = oracle_forward(p, a)
        j = judge_forward(p, a, _bf16(o.out), o.lse)
        assert j.out.status == "undecided"
    finally:
        mods.unregister("user_double")


def test_user_aux_data_overrides_the_factory():
    from fa4verify.judge.attention import oracle_forward
    p = _problem(("document",))
    a = p.materialize()
    ids = np.zeros((1, 192), np.int32)
    ids[0, 96:] = 1
    two = oracle_forward(p, dict(a, mod_aux={"document": [ids, ids]}))
    one = oracle_forward(p, dict(a, mod_aux={"document": [np.zeros((1, 192), np.int32)] * 2}))
    plain = oracle_forward(p.replace(mods=()), a)
    assert np.abs(one.out - plain.out).max() < 1e-12
    assert np.abs(two.out - plain.out).max() > 1e-2


def test_problem_with_mods_round_trips_json_and_refuses_bad_combinations():
    from fa4verify.problem import AttentionProblem
    p = _problem(("alibi", "document"), mod_seed=7)
    assert AttentionProblem.from_json(p.to_json()) == p
    assert "mods=alibi+document#7" in p.describe()
    assert _problem(()).to_dict().keys() == AttentionProblem.from_json(_problem(()).to_json()).to_dict().keys()
    with pytest.raises(ValueError, match="drops causal"):
        _problem(("document",), causal=True)
    with pytest.raises(ValueError, match="two score mods"):
        _problem(("alibi", "rel_bias"))
    with pytest.raises(ValueError, match="softcap cannot be combined"):
        _problem(("alibi",), softcap=10.0)
    with pytest.raises(ValueError, match="seqlen_q == seqlen_k"):
        _problem(("prefix_lm",), seqlen_k=256)
    with pytest.raises(ValueError, match="unknown mod pair"):
        _problem(("nope",))
    # a score pair with causal is allowed (FA4 keeps causal with a score_mod)
    assert _problem(("alibi",), causal=True).causal


@pytest.mark.fa4
def test_cute_functions_are_built_lazily_and_cached():
    pair = km.alibi()
    assert "fns" not in pair._cache
    f = pair.cute()
    assert f is not None and pair.cute() is f and pair.cute_bwd() is not None
    assert km.document_mask().cute_bwd() is None
    assert math.isclose(km.softcap_mod().equivalent["softcap"], km.SOFTCAP)


# -- fuzzing: mod problems drawn by the public strategy, built-in and user pairs alike
def test_drawn_mod_problems_pass_the_rounded_oracle_forward_and_backward():
    from hypothesis import HealthCheck, given, settings

    from fa4verify.judge import judge_backward, judge_forward
    from fa4verify.judge.attention import oracle_backward
    from fa4verify.strategies import mod_problems
    mods.register_mod_pair(_score("user_fuzz_bias"))
    seen = set()
    try:
        @settings(max_examples=12, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(mod_problems(max_seqlen=72, max_heads=2, max_head_dim=32))
        def prop(p):
            assert len(p.mods) == 1 and not p.varlen
            pair = mods.get(p.mods[0])
            assert not (pair.kind == "mask" and p.causal)
            seen.add(p.mods[0])
            a = p.materialize()
            ob = oracle_backward(p, a)
            r = lambda x: _bf16(x, p.dtype)  # noqa: E731
            j = judge_forward(p, a, r(ob.forward.out), ob.forward.lse, oracle=ob.forward)
            assert j.out.status == "pass" and j.lse.status in ("pass",), (p.describe(), j.out.summary())
            jb = judge_backward(p, a, r(ob.dq), r(ob.dk), r(ob.dv), forward=j, oracle_bwd=ob,
                                probabilistic=False)
            # a one-key row at huge logits: the backward's recomputed P may stray far from 1, so
            # the dV bound admits a zero dV -- "impossible question" (Note [A bound without
            # power]), the one undecided cause a finite input may have; never a fail
            for v in jb.verdicts:
                assert v.status == "pass" or (v.status == "undecided" and v.reason.startswith(
                    "impossible question")), (p.describe(), v.summary())
        prop()
    finally:
        mods.unregister("user_fuzz_bias")
    assert len(seen) >= 4


def test_mod_problems_refuse_unknown_names():
    from hypothesis.errors import InvalidArgument

    from fa4verify.strategies import mod_problems
    with pytest.raises(errors.ModPairError, match="unknown mod pair"):
        mod_problems(mods=("nope",)).example()
    with pytest.raises(InvalidArgument):
        mod_problems(mods=()).example()


def test_gate_takes_mods_and_catches_a_dropped_mod():
    from fa4verify import assert_attention_within_budget
    from fa4verify.judge.attention import oracle_forward
    p = _problem(("alibi",))
    a = p.materialize()
    o = oracle_forward(p, a)
    s = assert_attention_within_budget(_bf16(o.out), a["q"], a["k"], a["v"], dtype="bf16", mods=("alibi",))
    assert s.status == "pass"
    plain = oracle_forward(p.replace(mods=()), a)
    with pytest.raises(AssertionError, match="mods=alibi"):
        assert_attention_within_budget(_bf16(plain.out), a["q"], a["k"], a["v"], dtype="bf16", mods=("alibi",))


# -- the production target passes the pairs through the adapter (stand-in adapter on the CPU)
def _recording_adapter(problem, arrays):
    import inspect
    import types

    from fa4verify.judge.attention import oracle_backward
    from fa4verify.kernels import adapter
    calls = []
    ob = oracle_backward(problem, arrays)
    bf = lambda x: torch.from_numpy(np.asarray(x, np.float32)).to(torch.bfloat16)  # noqa: E731
    cfg = types.SimpleNamespace(to_dict=lambda: {"op": "x", "arch": 90, "tile_mn": None, "dtype": "bf16"})

    def forward(q, k, v, **kw):
        inspect.signature(adapter.forward).bind(q, k, v, **kw)
        calls.append(("forward", kw))
        return types.SimpleNamespace(out=bf(ob.forward.out), lse=torch.from_numpy(ob.forward.lse.astype(np.float32)),
                                     config=cfg)

    def backward(q, k, v, out, dout, lse, **kw):
        inspect.signature(adapter.backward).bind(q, k, v, out, dout, lse, **kw)
        calls.append(("backward", kw))
        return types.SimpleNamespace(dq=bf(ob.dq), dk=bf(ob.dk), dv=bf(ob.dv), dsink=None, config=cfg)
    mod = types.SimpleNamespace(forward=forward, backward=backward, versions=lambda: {})
    return mod, calls


@pytest.mark.fa4
def test_production_target_passes_cute_mods_and_aux_tensors_and_the_twin_refuses_them():
    from fa4verify import fuzz
    from fa4verify.targets import TwinTarget
    from fa4verify.errors import Unsupported
    p = _problem(("rel_bias", "prefix_lm"))
    a = p.materialize()
    ad, calls = _recording_adapter(p, a)
    t = fuzz.ProductionTarget(adapter=ad, device="cpu")
    f = t.forward(p, a)
    t.backward(p, a, f)
    (fn, fkw), (bn, bkw) = calls
    score, mask = mods.get("rel_bias"), mods.get("prefix_lm")
    assert fkw["score_mod"] is score.cute() and fkw["mask_mod"] is mask.cute() and "score_mod_bwd" not in fkw
    assert bkw["score_mod_bwd"] is score.cute_bwd() and bkw["mask_mod"] is mask.cute()
    (aux,) = fkw["aux_tensors"]
    assert aux.dtype == torch.float32 and np.array_equal(aux.numpy(), mods.aux_for(p, score, a)[0])
    with pytest.raises(Unsupported, match="does not model score_mod"):
        TwinTarget().forward(p, a)
    with pytest.raises(Unsupported, match="aux_tensors list"):
        t.forward(_problem(("alibi", "document")), a)


def test_attention_problems_draw_mod_pairs_only_when_asked_and_within_fa4s_constraints():
    """The ``mod_pairs`` feature (what fuzz.production and deployment profiles draw): every
    registered pair appears, on dense and on varlen problems (plain cu_seqlens), without sinks or
    MaskMod patterns, mask pairs without causal/window, score pairs without softcap; never without
    the feature."""
    from hypothesis import HealthCheck, given, settings

    from fa4verify.problem import CALL_FEATURES, MOD_FEATURE, FEATURES
    from fa4verify._strategies.problem import attention_problems
    from fa4verify.fuzz.campaign import _fixed_constant_pool
    seen: dict[str, int] = {}

    @settings(max_examples=1000, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(attention_problems(arch="sm90", dtype="bf16", features=FEATURES + CALL_FEATURES + (MOD_FEATURE,),
                              max_seqlen=64, max_batch=2, max_heads=2, head_dim_choices=(64,)))
    def body(p):
        if not p.mods:
            return
        (name,) = p.mods
        seen[name] = seen.get(name, 0) + 1
        pair = mods.get(name)
        assert not p.sink and p.mask_mod is None and p.softcap == 0
        if p.call is not None and not p.call.rearranges:     # pack_gqa alone rides along
            assert p.nheads > p.nheads_kv and p.call.pack_gqa is not None
            seen["(pack_gqa)"] = seen.get("(pack_gqa)", 0) + 1
            p = p.replace(call=None)
        if p.varlen:
            seen["(varlen)"] = seen.get("(varlen)", 0) + 1
            assert p.call is None
            if pair.self_attention_only:
                assert p.seqlens_q == p.seqlens_k
        if p.call is not None:      # Note [Partial blocks]: a mask pair decides inside mask blocks
            assert pair.kind == "mask" and p.call.block_size is not None and p.call.block_partial > 0
            seen["(with mask blocks)"] = seen.get("(with mask blocks)", 0) + 1
        if pair.kind == "mask":
            assert not p.causal and p.window_size == (None, None)
        if pair.self_attention_only:
            assert p.seqlen_q == p.seqlen_k

    @settings(max_examples=60, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(attention_problems(arch="sm90", dtype="bf16", features=FEATURES + CALL_FEATURES, max_seqlen=64))
    def without(p):
        assert not p.mods

    with _fixed_constant_pool():
        body()
        without()
    assert seen.pop("(with mask blocks)", 0) > 0, seen
    assert seen.pop("(varlen)", 0) > 0, seen
    assert seen.pop("(pack_gqa)", 0) > 0, seen
    assert set(seen) == set(mods.names()), seen


def test_drawn_campaign_meets_the_mod_quota_deterministically():
    """Note [Mod quota]: a drawn campaign asked for ``mod_pairs`` carries at least
    examples // MOD_QUOTA_SHARE mod problems (seed 0 drew none before the quota), the same list
    twice, and none without the feature."""
    from fa4verify.problem import CALL_FEATURES, MOD_FEATURE, FEATURES
    from fa4verify.fuzz import drawn
    feats = [f for f in FEATURES if f != "mask_mod"] + list(CALL_FEATURES) + [MOD_FEATURE]
    kw = dict(arch="sm90", dtype="bf16", examples=24, seed=0, profile="ci", distributions=None,
              limits={"head_dim_choices": [64, 128]})
    a = drawn._draw_here(features=feats, **kw)
    b = drawn._draw_here(features=feats, **kw)
    assert [p.digest() for p in a] == [p.digest() for p in b]
    assert sum(1 for p in a if p.mods) >= 24 // drawn.MOD_QUOTA_SHARE
    assert len({p.digest() for p in a}) == len(a) <= 24
    assert not any(p.mods for p in drawn._draw_here(features=feats[:-1], **kw))


@pytest.mark.fa4
def test_a_score_pair_rides_with_pack_gqa_false_to_the_forward_only():
    """The seventh red-team round: a score pair on unpacked GQA (pack_gqa=False; FA4 also unpacks by
    itself for per-head block masks) is a problem of its own, the forward gets pack_gqa=False with
    the score_mod, the backward neither (FA4's backward never packs)."""
    from fa4verify import fuzz
    from fa4verify.problem import AttentionProblem, CallForm
    p = _problem(("rel_bias",)).replace(nheads=4, nheads_kv=2, call=CallForm(pack_gqa=False))
    assert AttentionProblem.from_json(p.to_json()) == p and "pack_gqa=False" in p.describe()
    a = p.materialize()
    ad, calls = _recording_adapter(p, a)
    t = fuzz.ProductionTarget(adapter=ad, device="cpu")
    t.backward(p, a, t.forward(p, a))
    (_, fkw), (_, bkw) = calls
    assert fkw["pack_gqa"] is False and fkw["score_mod"] is mods.get("rel_bias").cute()
    assert "pack_gqa" not in bkw and bkw["score_mod_bwd"] is mods.get("rel_bias").cute_bwd()
    with pytest.raises(ValueError, match="another FA4 call form"):
        p.replace(call=CallForm(mask_mod_fn="checkerboard_128"))


@pytest.mark.fa4
def test_a_score_pair_rides_on_paged_kv_with_its_aux_tensors():
    """The seventh red-team round: an aux-tensor score pair on paged KV (full pages, no seqused_k):
    the forward gets the page table, the score_mod and its aux tensors; the mods oracle judges the
    problem's varlen keys; so do seqused_k / seqused_q; a keep-pattern on a varlen call refuses a
    pair."""
    from fa4verify import fuzz
    from fa4verify.problem import AttentionProblem, CallForm
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=2, seqlens_q=(37, 100), seqlens_k=(256, 256), seqlen_q=100,
                         seqlen_k=256, nheads=2, nheads_kv=2, head_dim=128, head_dim_v=128, mods=("rel_bias",),
                         call=CallForm(seqused_k=True, kv_capacity=256, page_size=128, page_seed=7, full_pages=True))
    assert AttentionProblem.from_json(p.to_json()) == p
    a = p.materialize()
    ad, calls = _recording_adapter(p, a)
    fuzz.ProductionTarget(adapter=ad, device="cpu").forward(p, a)
    ((_, fkw),) = calls
    assert fkw["page_table"] is not None and fkw["score_mod"] is mods.get("rel_bias").cute()
    assert "seqused_k" not in fkw and "score_mod_bwd" not in fkw and fkw["aux_tensors"]
    # the other batched layouts carry it too (the same varlen rows at their logical positions)
    q = p.replace(call=CallForm(seqused_k=True, kv_capacity=256, seqused_q=True, q_capacity=128))
    qq, _k, _v, _do, fkw = fuzz.ProductionTarget(adapter=ad, device="cpu")._call_kw(q, a)
    assert tuple(qq.shape) == (2, 128, 2, 128) and "cu_seqlens_q" not in fkw
    assert fkw["seqused_k"] is not None and fkw["seqused_q"] is not None and fkw["aux_tensors"]
    assert fkw["score_mod"] is mods.get("rel_bias").cute()
    # a keep-pattern on a varlen call does not (its rewrite moves the rows the pair indexes)
    with pytest.raises(ValueError, match="keep-pattern"):
        p.replace(call=CallForm(block_size=(128, 128)))


@pytest.mark.fa4
def test_the_mask_causal_call_form_passes_causal_with_the_mask_pair_on_purpose():
    """The eighth red-team round: a mask pair whose call also passes causal=True (FA4's forward drops
    it for a mask_mod; its backward must too). The problem stays the mask pair's (causal=False, the
    oracle's); forward and backward get causal=True with the adapter's guard lifted on purpose; the
    public autograd path gets causal=True alone."""
    from fa4verify import fuzz
    from fa4verify.problem import AttentionProblem, CallForm
    p = _problem(("document",), call=CallForm(mask_causal=True))
    assert AttentionProblem.from_json(p.to_json()) == p and not p.causal and "+causal passed" in p.describe()
    a = p.materialize()
    ad, calls = _recording_adapter(p, a)
    t = fuzz.ProductionTarget(adapter=ad, device="cpu")
    t.backward(p, a, t.forward(p, a))
    (_, fkw), (_, bkw) = calls
    for kw in (fkw, bkw):
        assert kw["causal"] is True and kw["causal_with_mask_mod"] is True and kw["mask_mod"] is not None
    with pytest.raises(ValueError, match="mask_causal"):
        _problem(("alibi",), call=CallForm(mask_causal=True))
    with pytest.raises(ValueError, match="mask_causal"):
        _problem((), call=CallForm(mask_causal=True))
