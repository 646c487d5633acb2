"""Note [First-order validity] (error_budgets/loader.py, DERIVATIONS.md top and #fwd-lse): the
composed budgets are +inf where their first-order margins do not hold, the exponentials are exact
(``expm1``), and the forward LSE bound is rigorous for any size of the argument error.

Figures: CPU twin (the judge's fp64 statistics on twin outputs) and mpmath.
"""
from __future__ import annotations

import math
from pathlib import Path

import mpmath
import numpy as np
import pytest

from fa4verify import error_budgets as eb
from fa4verify import judge
from fa4verify.error_budgets import loader
from fa4verify.targets import TwinTarget

from test_hull_fallback import HUGE, _problem

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

LIMIT = loader.FIRST_ORDER_LIMIT
SESSION4 = Path(__file__).parent / "fixtures" / "session4_first_order_entries.toml"


# ----------------------------------------------------------------------------- (a) the functions
def test_first_order_limit_is_two_to_minus_seven_and_guarantees_its_inequality():
    """``e^s - 1 <= s + s^2/(1-s) <= 1.01 s`` and ``e^s <= 1.01`` for every s up to the limit
    (checked in mpmath at the limit, where both sides are largest relative to s)."""
    assert LIMIT == 2.0 ** -7
    ctx = mpmath.MPContext()
    ctx.prec = 200
    for s in (ctx.mpf(LIMIT), ctx.mpf(LIMIT) / 3, ctx.mpf(2) ** -30):
        assert ctx.expm1(s) <= s + s * s / (1 - s) <= ctx.mpf("1.01") * s
        assert ctx.exp(s) <= ctx.mpf("1.01")
    s = ctx.mpf(1) / 99          # just past 1/101 the second inequality fails: the limit is not slack
    assert s + s * s / (1 - s) > ctx.mpf("1.01") * s


def test_first_order_returns_x_up_to_the_limit_and_inf_above_negative_or_nan():
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    s = np.array([0.0, LIMIT / 2, LIMIT, np.nextafter(LIMIT, 1.0), -1e-300, np.nan])
    got = loader._first_order(x, s)
    np.testing.assert_array_equal(got, [1.0, 2.0, 3.0, np.inf, np.inf, np.inf])
    # broadcasting: a per-row s against per-element x
    g2 = loader._first_order(np.ones((3, 4)), np.array([[0.0], [1.0], [LIMIT]]))
    assert g2.shape == (3, 4) and np.isinf(g2[1]).all() and (g2[[0, 2]] == 1).all()


def test_numpy_and_torch_backends_agree_on_expm1_log1p_first_order():
    torch = pytest.importorskip("torch")
    be = loader.TorchBackend("cpu")
    known = {"x": (), "s": ()}
    rng = np.random.default_rng(3)
    x = rng.uniform(0, 2, 64)
    s = np.concatenate([rng.uniform(0, 2 * LIMIT, 60), [LIMIT, np.nextafter(LIMIT, 1), np.nan, -0.0]])
    for text in ("expm1(x)", "log1p(-s)", "first_order(x, s)", "first_order(expm1(x), s) - log1p(-s)",
                 "first_order(2 * x, 0.001)"):
        f = loader.Formula(text, where=("-", "t"), known=known)
        a = np.broadcast_to(np.asarray(f.evaluate({"x": x, "s": s}), np.float64), x.shape)
        b = f.evaluate({"x": torch.tensor(x), "s": torch.tensor(s)}, backend=be).cpu().numpy()
        b = np.broadcast_to(b, x.shape)
        np.testing.assert_array_equal(np.isinf(a), np.isinf(b), err_msg=text)
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b), err_msg=text)
        fin = np.isfinite(a)
        np.testing.assert_allclose(a[fin], b[fin], rtol=4e-16, atol=0, err_msg=text)
    fo = loader.Formula("first_order(x, s)", where=("-", "t"), known=known)
    got = fo.evaluate({"x": x, "s": s})
    assert np.isinf(got[s > LIMIT]).all() and (got[s <= LIMIT] == x[s <= LIMIT]).all()


def _entry_file(tmp_path, formula, dim="v"):
    f = tmp_path / "b.toml"
    f.write_text('[meta]\nschema_version = 1\ndtype = "bf16"\narch = "sm90"\n\n[e2e.t]\n'
                 f'dim = "{dim}"\nformula = "{formula}"\nreason = "DERIVATIONS.md#fwd-composition"\n')
    return f


def test_first_order_keeps_the_first_arguments_dimension_and_refuses_a_dimensioned_s(tmp_path):
    bs = eb.load_file(_entry_file(tmp_path, "first_order(abs_o, 0.001 + e_p_bwd)"))
    assert bs.get("t").dim == "v"
    with pytest.raises(eb.BudgetError, match="dimensionless second argument"):
        eb.load_file(_entry_file(tmp_path, "first_order(abs_o, abs_o)"))
    with pytest.raises(eb.BudgetError, match="has units v, but t is in 1"):
        eb.load_file(_entry_file(tmp_path, "first_order(abs_o, 0.001)", dim="1"))
    with pytest.raises(eb.BudgetError, match="needs dimensionless"):
        eb.load_file(_entry_file(tmp_path, "expm1(abs_o)", dim="v"))


@pytest.mark.parametrize("dtype,arch", eb.available())
def test_every_composed_first_order_budget_is_guarded(dtype, arch):
    """Every composed budget that relies on the 1.01 / 1.02 margins calls first_order, and none
    of the session-4 shortcuts (``1.01 * ln2``, ``1.01 * forward_lse``, ``2.02 * ln2``) is left."""
    bs = eb.load(dtype, arch)
    for n in ("forward_out", "forward_out_prob", "backward_dv", "backward_dq", "backward_dq_accum",
              "backward_dk", "backward_dv_prob", "backward_dq_prob", "backward_dk_prob",
              ):
        assert bs.get(n).text.startswith("first_order("), n
    # the combine is the exact product of its factors, finite for any size (DERIVATIONS.md#combine)
    for n in ("combine_out", "combine_lse"):
        assert "first_order(" not in bs.get(n).text, n
    for n, b in bs.entries.items():
        for bad in ("1.01 * ln2", "1.01 * forward_lse", "2.02 * ln2", "1.01 * (e_p"):
            assert bad not in b.text, (n, bad)
    for n in ("e_arg", "backward_p", "rescale"):
        assert "expm1(" in bs.get(n).text, n
    assert "log1p(-lse_rest)" in bs.get("forward_lse").text


# ----------------------------------------------------------------------------- (b) the judge
FP16_HUGE = HUGE[4]          # fp16 "huge", e_qk 6: e_den < 1 but e_arg ~ 0.13 > 2^-7


def test_past_the_limit_the_interval_bound_decides_the_gradients_and_the_hull_decides_o(session4):
    p = FP16_HUGE
    assert p.dtype == "fp16" and dict(p.values.params)["e_qk"] == 6.0
    a = p.materialize()
    t = TwinTarget()
    f = t.forward(p, a)
    ref_out, _, st, _ = judge.forward_allowances(p, a)
    env = dict(st._common())
    env.update(st._row_stats())
    e_arg = np.asarray(st.budget.evaluate("e_arg", env))
    e_den = np.asarray(st.budget.evaluate("e_den", env))
    assert e_arg.max() > 0.1 and e_den.max() < 1        # finite but not first order
    fo = st.forward_out()
    assert np.isinf(fo).any()
    j = judge.judge_forward(p, a, f.out, f.lse)
    assert j.out.status == "pass" and j.out.n_hull > 0, j.out.summary()
    assert j.lse.status == "pass", j.lse.summary()       # rigorous for any size: still decided
    g = t.backward(p, a, f)
    # the first-order dQ/dK need the forward O error (D = rowsum(dO O)): +inf past the limit
    obwd = judge.oracle_backward(p, a)
    with np.errstate(all="ignore"):
        first = st._backward_first_order(obwd, j.ref_out.budget, j.ref_out.bound, probabilistic=False)
    assert not np.isfinite(first["dq"]).all() and not np.isfinite(first["dk"]).all()
    # Note [Backward interval fallback]: there the interval bound (DERIVATIONS.md#backward-interval)
    # decides, on the kernel's own forward outputs or on the oracle's widened by their allowances
    for kf in ((f.out, f.lse), None):
        jb = judge.judge_backward(p, a, g.dq, g.dk, g.dv, forward=j, kernel_fwd=kf)
        for n, v in (("dq", jb.dq), ("dk", jb.dk), ("dv", jb.dv)):
            assert v.status == "pass" and v.n_unjudged == 0, (n, kf is None, v.summary())
            assert np.isfinite(np.asarray(jb.budgets[n])).all(), n
    # with the session-4 formulas the same gradients "passed" on a non-rigorous budget
    old = session4(p.dtype, p.arch)
    jo = judge.judge_forward(p, a, f.out, f.lse, budgets=old)
    jbo = judge.judge_backward(p, a, g.dq, g.dk, g.dv, forward=jo)
    assert jbo.dq.status == jbo.dk.status == "pass"


def test_combine_budgets_are_finite_past_the_old_margin_and_cover_the_worst_case():
    """combine_out / combine_lse are exact for any split-LSE size (DERIVATIONS.md#combine): finite
    at |L| = 10^4 and 10^6 nats, where a first-order margin made them +inf; the weight factor
    cmb_eps_w covers the worst corner of its own factors (mpmath, directed) and is tight to it."""
    bs = eb.load("bf16", "sm90")
    st = {"n_splits": 4.0, "cmb_abs": 1.0, "cmb_abs_o": 1.0}
    C = bs.constants
    for L in (30.0, 1e4, 1e6):
        for n in ("combine_out", "combine_lse"):
            assert np.isfinite(bs.evaluate(n, dict(st, cmb_lse_abs=L))), (n, L)
        ctx = mpmath.mp.clone()
        ctx.prec = 200
        g = 4 * ctx.mpf(2) ** -24 / (1 - 4 * ctx.mpf(2) ** -24)
        # the exponent argument's error in log2 units: 2 gamma(3, u) L log2 e
        theta = 2 * (3 * ctx.mpf(2) ** -24 / (1 - 3 * ctx.mpf(2) ** -24)) * L / ctx.log(2)
        m = ctx.mpf(C["mufu_ex2_rel"]) + ctx.mpf(2) ** -24
        r = ctx.mpf(C["rcp_rel"]) + ctx.mpf(2) ** -24
        # the worst weight ratio: numerator 2^theta (1 + m), denominator 2^-theta (1 - m)(1 - g),
        # reciprocal (1 + r) and the weight's own rounding (1 + u); and the downward corner
        up = ctx.power(2, 2 * theta) * (1 + m) / ((1 - m) * (1 - g)) * (1 + r) * (1 + ctx.mpf(2) ** -24) - 1
        down = 1 - ctx.power(2, -2 * theta) * (1 - m) / ((1 + m) * (1 + g)) * (1 - r) * (1 - ctx.mpf(2) ** -24)
        ew = ctx.mpf(float(bs.evaluate("cmb_eps_w", dict(st, cmb_lse_abs=L))))
        assert max(up, down) <= ew, (L, float(max(up, down)), float(ew))
        assert ew <= max(up, down) * (1 + ctx.mpf(2) ** -10), "not tight to its own factors"


def test_a_kernel_fault_past_the_limit_is_not_a_pass():
    """A planted gradient fault on the same problem: undecided or fail, never pass."""
    p = FP16_HUGE
    a = p.materialize()
    t = TwinTarget()
    f = t.forward(p, a)
    g = t.backward(p, a, f)
    j = judge.judge_forward(p, a, f.out, f.lse)
    jb = judge.judge_backward(p, a, g.dq * 1.5, g.dk, g.dv * 0.5, forward=j, kernel_fwd=(f.out, f.lse))
    # decided past the limit (the interval bound), and tight enough there to fail both faults
    assert jb.dq.status == "fail" and jb.dv.status == "fail", (jb.dq.summary(), jb.dv.summary())


# ----------------------------------------------------------------------------- (c) normal draws
def _session4(dtype, arch, tmp):
    tmp.mkdir(parents=True, exist_ok=True)
    f = tmp / f"s4_{dtype}_{arch}.toml"
    base = eb.budget_path(dtype, arch)
    f.write_text(f'[meta]\nschema_version = 1\nextends = "{base}"\n\n' + SESSION4.read_text())
    return eb.load_file(f)


@pytest.fixture(scope="module")
def session4(tmp_path_factory):
    """``session4(dtype, arch)``: the shipped budget set with the session-4 composed formulas."""
    tmp = tmp_path_factory.mktemp("s4")
    return lambda dtype, arch: _session4(dtype, arch, tmp)


NORMAL = [
    _problem("normal", 31, (("sigma", 1.0),), sk=90),
    _problem("normal", 32, (("sigma", 1.0),), causal=True, h=4, hk=2, dtype="fp16"),
    _problem("normal", 33, (("sigma", 0.5),), arch="sm100", sk=150),
    _problem("normal", 34, (("sigma", 1.0),), d=128, sq=20, sk=40, softcap=30.0),
]


@pytest.mark.parametrize("p", NORMAL, ids=lambda p: p.describe()[:60])
def test_on_normal_draws_the_new_budgets_are_equal_or_slightly_smaller(p, session4):
    """expm1 replaced ``1.01 x`` (e_arg, rescale, backward_p) and the LSE lost its doubled margin:
    O, LSE and dV budgets are <= their session-4 values and within 1 % (LSE 2 %: its argument part
    was 1.01 * 1.01 ln2 A, now ln2 A exactly); dQ / dK grew by at most u_p relative (their dP and
    D error terms now carry the factor 1 + max(backward_p, u_p) they lacked); every verdict equal."""
    a = p.materialize()
    t = TwinTarget()
    f = t.forward(p, a)
    g = t.backward(p, a, f)
    old = session4(p.dtype, p.arch)
    new_j = judge.judge_forward(p, a, f.out, f.lse)
    old_j = judge.judge_forward(p, a, f.out, f.lse, budgets=old)
    new_b = judge.judge_backward(p, a, g.dq, g.dk, g.dv, forward=new_j)
    old_b = judge.judge_backward(p, a, g.dq, g.dk, g.dv, forward=old_j)
    pairs = {"out": (new_j.ref_out.budget, old_j.ref_out.budget, 0.01),
             "lse": (new_j.ref_lse.budget, old_j.ref_lse.budget, 0.02)}
    up = eb.load(p.dtype, p.arch).constants["u_p"]
    for n in ("dq", "dk", "dv", "dq_prob", "dk_prob", "dv_prob"):
        pairs[n] = (new_b.budgets[n], old_b.budgets[n], 0.01)
    for n, (nb, ob, tol) in pairs.items():
        nb, ob = np.asarray(nb, np.float64), np.asarray(ob, np.float64)
        assert np.isfinite(nb).all() and np.isfinite(ob).all(), n
        grow = up if n[:2] in ("dq", "dk") else (1e-6 if (n == "out" and p.dtype == "fp16") else 1e-12)
        assert np.all(nb <= ob * (1 + grow)), (n, float(np.max(nb / ob)))
        assert np.all(nb >= ob * (1 - tol)), (n, float(np.min(nb / ob)))
    for v_new, v_old in zip(new_j.verdicts + new_b.verdicts, old_j.verdicts + old_b.verdicts):
        assert v_new.status == v_old.status == "pass", (v_new.summary(), v_old.summary())


# ----------------------------------------------------------------------------- (d) the LSE bound
def _lse_case(ctx, rng, n, A, e, *, worst_down=False):
    """(|ln L~ - ln L|, bound, session-4 bound) in mpmath for logits x (log2 units), a kernel whose
    arguments err by <= A (log2 units) and whose row-sum terms carry relative errors in [-e, e]."""
    x = [ctx.mpf(float(v)) for v in rng.normal(0, 3, n)]
    if worst_down:
        dx = [-ctx.mpf(A)] * n
        c = [-ctx.mpf(e)] * n
    else:
        dx = [ctx.mpf(float(v)) for v in rng.uniform(-A, A, n)]
        c = [ctx.mpf(float(v)) for v in rng.choice([-e, e, 0.0], n)]
    L = ctx.fsum(ctx.power(2, xi) for xi in x)
    Lk = ctx.fsum(ctx.power(2, xi + d) * (1 + ci) for xi, d, ci in zip(x, dx, c))
    err = abs(ctx.log(Lk) - ctx.log(L))
    bound = ctx.log(2) * A - ctx.log1p(-ctx.mpf(e))
    old = ctx.mpf("1.01") * (ctx.mpf("1.01") * ctx.log(2) * A + e)       # session-4 1.01 (e_arg + e)
    return err, bound, old


def test_lse_bound_holds_for_large_argument_errors_and_the_old_one_did_not():
    ctx = mpmath.MPContext()
    ctx.prec = 160
    rng = np.random.default_rng(7)
    for n, A, e in [(5, 3.0, 0.3), (17, 0.5, 0.05), (9, 12.0, 0.0), (33, 0.0, 0.6), (4, 2.0, 2 ** -20)]:
        for _ in range(20):
            err, bound, _ = _lse_case(ctx, rng, n, A, e)
            assert err <= bound, (n, A, e)
        err, bound, old = _lse_case(ctx, rng, n, A, e, worst_down=True)
        assert ctx.almosteq(err, bound, rel_eps=ctx.mpf(2) ** -100)   # attained: the bound is tight
    # the constructed downward case: every term -e relative -> -ln(1-e) > 1.01 e
    err, bound, old = _lse_case(ctx, rng, 8, 0.0, 0.3, worst_down=True)
    assert err > old and err <= bound
    assert float(err / old) > 1.17          # a real gap: -ln(0.7) / (1.01 * 0.3) = 1.177


@pytest.mark.parametrize("dtype,arch", [("bf16", "sm90"), ("bf16", "sm100"), ("fp16", "sm90")])
def test_forward_lse_formula_covers_the_downward_worst_case_of_its_own_terms(dtype, arch, session4):
    """The shipped forward_lse on statistics with a large relative row-sum error (a row of ~2^21
    KV blocks: e_sum up to ~0.5) bounds the downward worst case ln2 A - ln(1 - lse_rest) exactly
    (mpmath); the session-4 formula does not; past lse_rest >= 1 it is NaN/inf (undecided)."""
    bs = eb.load(dtype, arch)
    old = session4(dtype, arch)
    st = {"d": 128.0, "tile_n": 128.0, "max_offset": 0.0, "x_max": 0.0, "qk_c_max": 40.0, "sc_max": 8.0,
          "mc_abs": 5.0, "softcap_err": 0.0, "lg2_l": 20.0, "lse_abs": 20.0}
    ctx = mpmath.MPContext()
    ctx.prec = 120
    for nb in (2.0 ** 10, 2.0 ** 16, 2.0 ** 17, 1.6e5):
        s = dict(st, n_blocks=nb, n_rescale=nb)
        rest = float(bs.evaluate("lse_rest", s))
        arg = float(bs.evaluate("lse_arg", s))
        worst = ctx.mpf(arg) - ctx.log1p(-ctx.mpf(rest))
        new = float(bs.evaluate("forward_lse", s))
        assert ctx.mpf(new) >= worst
        if rest > 0.1:
            assert float(old.evaluate("forward_lse", s)) < worst      # the gap is real
    s = dict(st, n_blocks=2.0 ** 19, n_rescale=2.0 ** 19)
    assert float(bs.evaluate("lse_rest", s)) >= 1
    assert not np.isfinite(float(bs.evaluate("forward_lse", s)))


def test_minus_log1p_is_accurate_for_tiny_relative_errors_in_float64():
    """-log1p(-e) in float64 against mpmath for e down to 2^-60: relative error < 4 ulp (no 1.01
    factor is needed; -ln2 log2(1 - e) would lose all digits below e ~ 2^-53)."""
    ctx = mpmath.MPContext()
    ctx.prec = 200
    for k in range(1, 61, 3):
        e = 2.0 ** -k * 1.37
        got = -math.log1p(-e)
        want = -ctx.log1p(-ctx.mpf(e))
        assert abs(ctx.mpf(got) - want) <= 4 * 2.0 ** -53 * want, k
