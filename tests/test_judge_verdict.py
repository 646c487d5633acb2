"""``fa4verify.judge.compare``: the one comparison and its three-valued verdict (CPU)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from fa4verify.judge import combine, compare


def test_pass_fail_and_the_worst_element():
    ref = np.array([1.0, 2.0, 3.0])
    v = compare("x", ref + [0.0, 1e-3, 0.0], ref, budget=2e-3)
    assert v.status == "pass" and v.n_compared == 3 and v.worst.index == (1,) and v.tightness == pytest.approx(0.5)
    v = compare("x", ref + [0.0, 1e-3, 5e-3], ref, budget=2e-3, oracle_bound=1e-4)
    assert v.status == "fail" and v.n_over == 1 and v.violations[0].index == (2,)
    assert v.worst.allowed == pytest.approx(2.1e-3)


@pytest.mark.parametrize("bound, budget, why", [
    (math.inf, 1.0, "oracle bound"), (math.nan, 1.0, "oracle bound"), (-1e-9, 1.0, "oracle bound"),
    (0.0, math.inf, "budget"), (0.0, -0.5, "negative"), (0.0, math.nan, "budget"),
])
def test_an_invalid_bound_or_budget_is_undecided_never_pass(bound, budget, why):
    v = compare("x", np.zeros(4), np.zeros(4), oracle_bound=bound, budget=budget)
    assert v.status == "undecided" and why in v.reason and v.n_compared == 0


def test_a_violation_elsewhere_is_still_a_fail():
    ref = np.zeros(3)
    v = compare("x", [0.0, 1.0, 0.0], ref, budget=np.array([-1.0, 0.1, 0.1]))
    assert v.status == "fail" and v.n_over == 1 and v.n_unjudged == 1


def test_nan_reference_is_unjudged_or_matched():
    ref = np.array([np.nan, 1.0])
    assert compare("x", [0.0, 1.0], ref, budget=0.1).status == "undecided"
    assert compare("x", [np.nan, 1.0], ref, budget=0.1, nan="match").status == "pass"
    assert compare("x", [0.0, 1.0], ref, budget=0.1, nan="match").status == "fail"     # poison swallowed


def test_infinite_references_are_judged_by_equality():
    ref = np.array([-np.inf, 0.0])
    assert compare("lse", [-np.inf, 0.0], ref, budget=0.1).status == "pass"
    assert compare("lse", [-1e30, 0.0], ref, budget=0.1).status == "fail"


def test_nan_output_is_over_and_nothing_compared_is_undecided():
    v = compare("x", [np.nan], [1.0], budget=1.0)
    assert v.status == "fail" and math.isinf(v.tightness)
    assert compare("x", [1.0], [1.0], budget=1.0, select=[False]).status == "undecided"
    assert compare("x", [1.0, 2.0], [1.0], budget=1.0).status == "fail"                 # shape mismatch


def test_worst_element_is_a_judged_one():
    ref = np.array([np.nan, 1.0])
    v = compare("x", [5.0, 1.0], ref, budget=0.1)
    assert v.worst.index == (1,)


def test_combine_ranks_fail_over_undecided_over_pass():
    p = compare("a", [1.0], [1.0], budget=1.0)
    u = compare("b", [1.0], [np.nan], budget=1.0)
    f = compare("c", [3.0], [1.0], budget=1.0)
    assert combine([p, u]) == "undecided" and combine([p, u, f]) == "fail" and combine([p]) == "pass"
    assert combine([]) == "undecided"


def test_no_judge_submodule_shadows_a_judge_function():
    """A submodule named like a function of ``fa4verify.judge`` (e.g. ``judge/combine.py``)
    replaces that function on the package as soon as anything imports the submodule."""
    import pkgutil

    import fa4verify.judge as J
    subs = {m.name for m in pkgutil.iter_modules(J.__path__)}
    assert not subs & set(J.__all__), subs & set(J.__all__)


def test_a_mask_mod_problem_is_refused_by_the_oracle_with_a_reason():
    from fa4verify.problem import MaskMod, AttentionProblem
    from fa4verify.judge import attention as ja
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=8, seqlen_k=8, nheads=1,
                         nheads_kv=1, head_dim=64, head_dim_v=64,
                         mask_mod=MaskMod(kind="document", param=2, seed=0))
    with pytest.raises(NotImplementedError, match="mask_mod"):
        ja.oracle_forward(p, p.materialize())


# Note [The common verdict]: compare's fast path (nothing selected away) against its general path
# (the same comparison with an all-True ``select``), field for field, on inputs built to hit every
# branch: zero and negative-zero allowances, 0 / 0, NaN / inf anywhere, violations, broadcasting,
# the blind threshold and the hull count.
_SPECIAL = (0.0, -0.0, 1e-300, 5e-324, 1.0, 1e300, math.inf, -math.inf, math.nan)


def _case(rng: np.random.Generator, shape: tuple, special: float):
    r = rng.standard_normal(shape)
    a = r + rng.standard_normal(shape) * 10.0 ** rng.integers(-8, 1)
    exact = rng.random(shape) < 0.3
    a[exact] = r[exact]                                            # exact elements: err 0
    ob = np.abs(rng.standard_normal(shape)) * 1e-3 * (rng.random(shape) < 0.7)
    bu = np.abs(rng.standard_normal(shape[-1:])) * 10.0 ** rng.integers(-6, 1)
    target = rng.choice(["a", "r", "ob", "bu", "none", "none"])
    where = rng.random(shape) < 0.05
    if target == "a":
        a[where] = special
    elif target == "r":
        r[where] = special
    elif target == "ob":
        ob[where] = special
    elif target == "bu":
        bu[rng.random(bu.shape) < 0.3] = special
    return a, r, ob, bu


def _same(v, w):
    assert repr(v) == repr(w)          # field for field, a NaN figure equal to a NaN
    assert (v.over_indices is None) == (w.over_indices is None)
    if v.over_indices is not None:
        assert v.over_indices.shape == w.over_indices.shape and np.array_equal(v.over_indices, w.over_indices)


@pytest.mark.parametrize("seed", range(40))
def test_the_common_verdict_is_the_general_paths(seed):
    rng = np.random.default_rng(seed)
    shape = tuple(int(x) for x in rng.integers(1, 6, size=int(rng.integers(1, 4))))
    for special in _SPECIAL:
        a, r, ob, bu = _case(rng, shape, special)
        blind = None if rng.random() < 0.3 else np.abs(r) * rng.choice([0.5, 2.0, math.inf])
        fallback = None if rng.random() < 0.5 else rng.random(shape) < 0.5
        kw = dict(oracle_bound=ob, budget=bu, all_indices=bool(rng.random() < 0.5), fallback=fallback,
                  blind_above=blind)
        _same(compare("x", a, r, **kw), compare("x", a, r, select=np.ones(shape, bool), **kw))


def test_zero_dimensional_inputs_take_the_general_path():
    for act, bud in ((1.0, 1e-3), (1.5, 1e-3), (np.nan, 1.0)):
        v = compare("x", np.float64(act), np.float64(1.0), budget=bud)
        _same(v, compare("x", np.float64(act), np.float64(1.0), budget=bud, select=True))


def test_the_common_verdict_on_zero_allowances_and_scalars():
    ref = np.array([[1.0, 2.0], [3.0, 4.0]])
    for bound, budget in ((0.0, 0.0), (-0.0, -0.0), (0.0, np.array([0.0, 1e-3])), (np.zeros((2, 2)), 1e-3)):
        for act in (ref, ref + 1e-4, ref + np.array([[0.0, 1e-4], [0.0, 0.0]])):
            kw = dict(oracle_bound=bound, budget=budget)
            _same(compare("x", act, ref, **kw), compare("x", act, ref, select=True, **kw))
    v = compare("x", ref, ref, budget=-0.0)
    assert v.status == "pass" and v.tightness == 0.0      # 0 / 0 is an exact element, not NaN
