"""FP8 inputs with FA4's q/k/v descales as problems the audit plans and judges (Note [FP8
descales] in fa4verify/problem/__init__.py): the problem's arrays, the judge's descaled inputs,
the twin's model of FA4's folds, the budgets' extra roundings and the fp8 coverage space."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify import judge
from fa4verify.coverage import planner
from fa4verify.coverage.cases import plan_problems
from fa4verify.coverage.space import DESCALES, space_for
from fa4verify.problem import AttentionProblem
from fa4verify.targets import FP8_NO_BACKWARD, TwinTarget

pytest.importorskip("ml_dtypes")


def _p(**kw):
    base = dict(arch="sm100", dtype="fp8", batch=2, seqlen_q=150, seqlen_k=260, nheads=4, nheads_kv=2,
                head_dim=128, head_dim_v=128, descales=("q", "k", "v"))
    base.update(kw)
    return AttentionProblem(**base)


def test_fp8_problem_arrays_are_e4m3_exact_and_descales_fp32_per_kv_head():
    import ml_dtypes
    p = _p(values=__import__("fa4verify.problem", fromlist=["ValueSpec"]).ValueSpec("outliers", 3,
                                                                                    (("p", 0.05),)))
    a = p.materialize()
    for n in ("q", "k", "v"):
        x = a[n]
        assert np.array_equal(x.astype(ml_dtypes.float8_e4m3fn).astype(np.float32), x)
        assert np.abs(x).max() <= 448.0
    for n in ("q", "k", "v"):
        f = a[f"{n}_descale"]
        assert f.shape == (2, 2) and f.dtype == np.float32
        assert np.all((f >= 0.25) & (f <= 4.0))
    b = p.replace(descales=("v",)).materialize()
    assert b["q_descale"] is None and b["k_descale"] is None
    assert np.array_equal(b["v_descale"], a["v_descale"])   # the factors do not depend on which are used
    assert np.array_equal(b["q"], a["q"])                     # nor move the other draws


def test_descales_round_trip_and_refuse_other_dtypes_and_orders():
    p = _p(descales=("k", "v"))
    assert AttentionProblem.from_json(p.to_json()) == p
    assert "descale=kv" in p.describe()
    assert "descales" not in _p(descales=()).to_dict()
    with pytest.raises(ValueError, match="fp8"):
        _p(dtype="bf16")
    with pytest.raises(ValueError, match="order"):
        _p(descales=("v", "q"))


def test_effective_inputs_scale_by_the_kv_head_of_each_query_head_and_the_sequence_of_each_token():
    p = _p()
    a = p.materialize()
    e = judge.effective_inputs(p, a)
    g = p.nheads // p.nheads_kv
    for h in range(p.nheads):
        np.testing.assert_array_equal(e["q"][1, :, h], a["q"][1, :, h].astype(np.float64)
                                      * np.float64(a["q_descale"][1, h // g]))
    np.testing.assert_array_equal(e["v"][0, :, 1], a["v"][0, :, 1] * np.float64(a["v_descale"][0, 1]))
    assert judge.effective_inputs(p, e) is e          # marked: a second call is the identity
    # varlen: token t of sequence b takes row b of the factors
    pv = _p(batch=3, seqlen_q=40, seqlen_k=50, seqlens_q=(40, 0, 7), seqlens_k=(9, 50, 3))
    av = pv.materialize()
    ev = judge.effective_inputs(pv, av)
    np.testing.assert_array_equal(ev["k"][59:62, 1], av["k"][59:62, 1] * np.float64(av["k_descale"][2, 1]))
    np.testing.assert_array_equal(ev["k"][:9, 0], av["k"][:9, 0] * np.float64(av["k_descale"][0, 0]))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("descales", [("q", "k", "v"), ("k",), ("v",)])
def test_twin_with_descales_passes_the_composed_budget(descales, causal):
    p = _p(descales=descales, causal=causal)
    a = p.materialize()
    f = TwinTarget().forward(p, a)
    j = judge.judge_forward(p, a, f.out, f.lse)
    assert j.out.status == "pass" and j.lse.status == "pass", (j.out.reason, j.lse.reason)


@pytest.mark.parametrize("mutation, descales, quantity", [
    ("v_descale_dropped", ("q", "k", "v"), "out"),          # the epilogue forgets v_descale
    ("qk_descale_query_head", ("k",), "lse"),               # h % hk instead of h // group
])
def test_a_descale_fault_in_the_twin_fails_the_judge(mutation, descales, quantity):
    p = _p(descales=descales)
    a = p.materialize()
    f = TwinTarget([mutation]).forward(p, a)
    j = judge.judge_forward(p, a, f.out, f.lse)
    assert getattr(j, quantity).status == "fail"


def test_unit_descales_give_the_twin_bits_of_the_call_without_them():
    """Factors of 1.0: FA4's products are exact, so the descaled call is the plain one bit for bit
    (the twin's folds are the kernel's, not a second model)."""
    p = _p(descales=("q", "k", "v"))
    a = dict(p.materialize())
    for n in ("q", "k", "v"):
        a[f"{n}_descale"] = np.ones((2, 2), np.float32)
    f = TwinTarget().forward(p, a)
    g = TwinTarget().forward(p.replace(descales=()), a)
    assert np.array_equal(f.out, g.out) and np.array_equal(f.lse, g.lse)


def test_fp8_budgets_count_the_descale_roundings():
    from fa4verify import error_budgets as eb
    assert eb.load("fp8", "sm100").constants["c_roundings"] == 5
    assert eb.load("fp8", "sm100").constants["o_scale_roundings"] == 3
    assert eb.load("bf16", "sm100").constants["c_roundings"] == 3
    assert eb.load("bf16", "sm90").constants["o_scale_roundings"] == 2


def test_fp8_space_is_forward_only_with_a_descale_dimension_and_the_plan_covers_it():
    sp = space_for("sm100", "fp8")
    assert sp.values["descale"] == tuple(DESCALES) and sp.values["det"] == ("on",)
    assert "score_mod" not in sp.values["form"] and "block_sparse_mod" not in sp.values["form"]
    assert sp.no_backward({"form": "dense"}) == FP8_NO_BACKWARD
    assert sp.why_not({"descale": "qkv", "softcap": "on"}) is not None
    assert sp.why_not({"descale": "off", "softcap": "on"}) is None
    pl = planner.plan(sp, seed=0)
    cov = planner.coverage(sp, pl.rows)
    assert cov["covered"] == cov["supported"] and not cov["holes"]
    _, probs = plan_problems(sp, pl.rows, seed=0)
    assert {p.descales for p in probs} == set(DESCALES.values())
    assert all(p.dtype == "fp8" and not p.mods for p in probs)
    # a 16-bit space has no descale dimension (its plan is unchanged by it)
    assert "descale" not in space_for("sm100", "bf16").values


def test_the_fp8_space_without_a_descale_value_names_the_hole():
    sp = space_for("sm100", "fp8")
    pl = planner.plan(sp.restrict("descale", ("off", "qkv", "k"), "test: v alone dropped"), seed=0)
    cov = planner.coverage(sp, pl.rows)
    assert cov["covered"] < cov["supported"]
    assert any("descale=v" in h for h in cov["holes"])


def test_fp8_head_dims_that_do_not_build_are_named_and_absorbed_only_there():
    """The compile-only finding sm100_fp8_fwd_no_build: head dims padding to 48/80/112 (measured at
    those three), not 16/32/64/96/128/(192, 128)/256 (measured to compile)."""
    from fa4verify import fuzz
    from fa4verify.fuzz.violation import Violation
    from fa4verify.kernels.features import sm100_fp8_fwd_does_not_build
    assert [h for h in range(8, 129, 8) if sm100_fp8_fwd_does_not_build(h)] == [40, 48, 72, 80, 104, 112]
    assert not any(sm100_fp8_fwd_does_not_build(h, v) for h, v in ((16, 16), (192, 128), (256, 256)))
    sp = space_for("sm100", "fp8")
    why = sp.why_not({"hd": "80"})
    assert why is not None and "sm100_fp8_fwd_no_build" in why
    assert sp.why_not({"hd": "64"}) is None

    def prob(hd, dtype="fp8"):
        return AttentionProblem(arch="sm100", dtype=dtype, batch=1, seqlen_q=64, seqlen_k=64, nheads=1,
                                nheads_kv=1, head_dim=hd, head_dim_v=hd)
    v = Violation("runs", "MLIRError: failed to partition `input` '(128,80)' with `tiled_mma` | case: ...")
    assert fuzz.match_known_issue(prob(80), v, target="production").name == "sm100_fp8_fwd_no_build"
    for p in (prob(64), prob(80, "bf16")):
        assert fuzz.match_known_issue(p, v, target="production") is None
    assert fuzz.match_known_issue(prob(80), Violation("runs", "RuntimeError: CUDA error"), target="production") is None


def test_edge_values_of_a_descaled_problem_are_planted_and_checked_in_the_descaled_logits():
    """Note [Edge values] with descales: the spike is planted in the descaled logits (a factor of
    1/16 would flatten a raw one) and the self-check's reference rows read the descaled inputs,
    so every edge is seen on the clean twin and a one-key shift of the diagonal fails."""
    from fa4verify.checks.coverage import PLAN_PROPERTIES
    from fa4verify.fuzz import check_problem
    from fa4verify.fuzz.violation import Violation
    from fa4verify.problem import ValueSpec
    p = _p(causal=True, seqlen_q=200, seqlen_k=260, values=ValueSpec("edges", 5, (("score", 6.0),)))
    a = p.materialize()
    e = judge.effective_inputs(p, a)
    t = a["edges"][0]
    b, i = t["b"], t["i"]
    j = next(j for j, inside in t["keys"] if inside and 0 <= j)
    s = float(e["q"][b, i, 0] @ e["k"][b, j, 0]) * p.scale          # the planted key, head 0
    others = e["q"][b, i, 0] @ e["k"][b, :, 0].T * p.scale
    assert s > np.median(others) + 3.0
    out = check_problem(p, TwinTarget(), properties=PLAN_PROPERTIES, backward=False)
    assert "edge_sensitive" in out.ran
    with pytest.raises(Violation):
        check_problem(p, TwinTarget(["causal_off_by_one"]), properties=PLAN_PROPERTIES, backward=False)


def test_metamorphic_properties_carry_the_descales():
    """batch_invariance runs one entry with its own factors; gqa_repeat gives each copied KV head
    its factor."""
    from fa4verify.fuzz import check_problem
    p = _p(causal=True, seqlen_q=90, seqlen_k=120)
    out = check_problem(p, TwinTarget(), properties=("runs", "fwd_budget", "batch_invariance", "gqa_repeat"),
                        backward=False)
    assert {"batch_invariance", "gqa_repeat"} <= set(out.ran)
