"""Note [Block lists with causal or a window] (fa4verify/problem/calls.py): FA4 keeps causal and
the window with block lists that come without a mask_mod, so a block-sparse problem may carry
them; its keep-mask is both masks, the plan covers the combinations, and the judge tells the
combined semantics from either mask alone."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify.coverage import planner
from fa4verify.coverage.space import space_for
from fa4verify.problem import AttentionProblem, CallForm, ValueSpec
from fa4verify.problem.masks import window_keep_mask

BASE = dict(arch="sm90", dtype="bf16", batch=2, seqlen_q=200, seqlen_k=300, nheads=2, nheads_kv=1, head_dim=64,
            head_dim_v=64, values=ValueSpec("normal", seed=5))
CALL = CallForm(block_size=(128, 128), block_seed=7, block_keep=0.6, block_per_batch=True)


@pytest.mark.parametrize("mask", [dict(causal=True), dict(window_size=(40, 0)), dict(window_size=(None, 17))])
def test_the_keep_mask_is_the_block_lists_and_the_causal_or_window_rule(mask):
    p = AttentionProblem(call=CALL, **mask, **BASE)
    plain = AttentionProblem(call=CALL, **BASE)
    for b, (got, lists) in enumerate(zip(p.keep_masks(), plain.keep_masks())):
        want = lists & window_keep_mask(200, 300, causal=p.causal, window_size=p.window_size)
        np.testing.assert_array_equal(got, want)
        assert got.sum() < lists.sum()          # the rule removes keys the lists keep


def test_a_mask_mod_still_takes_no_causal_or_window():
    with pytest.raises(ValueError, match="FA4 drops causal"):
        AttentionProblem(call=CallForm(block_size=(128, 128), block_seed=7, block_partial=0.5), causal=True,
                         mods=("sliding_window",), **BASE)
    with pytest.raises(ValueError, match="FA4 drops causal"):
        AttentionProblem(call=CallForm(mask_mod_fn="causal"), causal=True, **BASE)


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_the_plan_runs_block_lists_under_every_mask_it_has(arch):
    sp = space_for(arch, "bf16")
    pl = planner.plan(sp, seed=0)
    masks = {r["mask"] for r in pl.rows if r["form"] == "block_sparse"}
    assert masks == set(sp.values["mask"]), masks
    # only the lists that come with a mask_mod (a mask pair's partial blocks) leave masks out
    assert {why.partition(":")[0] for why in pl.unsupported.values() if "causal/window" in why} \
        <= {"block_sparse_mod", "mask_mod"}


class Rounded:
    """A target whose outputs are the oracle's, rounded as FA4 stores them (O and the gradients in
    the input dtype, the LSE in fp32): what a right kernel returns, up to its own rounding."""
    name = "rounded oracle"
    where = "CPU"
    tensor_core = None
    blames_fa4 = False

    def check_supported(self, problem):
        pass

    def backward_unsupported(self, problem):
        return None

    def forward(self, problem, a):
        from fa4verify import judge
        from fa4verify.problem.values import round_to_dtype
        from fa4verify.targets import Fwd
        o = judge.oracle_forward(problem, a)
        return Fwd(round_to_dtype(np.asarray(o.out, np.float32), problem.dtype).astype(np.float64),
                   np.asarray(o.lse, np.float32).astype(np.float64))

    def backward(self, problem, a, fwd, *, deterministic=True):
        from fa4verify import judge
        from fa4verify.problem.values import round_to_dtype
        from fa4verify.targets import Bwd
        g = judge.oracle_backward(problem, a)
        r = lambda x: round_to_dtype(np.asarray(x, np.float32), problem.dtype).astype(np.float64)   # noqa: E731
        return Bwd(r(g.dq), r(g.dk), r(g.dv), None)


def test_the_judge_tells_both_masks_from_either_alone():
    """Outputs right for both masks pass the judge; the oracle without the causal rule (or
    without the lists) is another function, far outside the bounds."""
    from fa4verify import judge
    from fa4verify.fuzz.properties import check_problem
    p = AttentionProblem(call=CALL, causal=True, **BASE)
    out = check_problem(p, Rounded(), properties=("runs", "fwd_budget", "bwd_budget", "masked_rows"))
    assert {"fwd_budget", "bwd_budget"} <= set(out.ran)
    a = p.materialize()
    o = np.asarray(judge.oracle_forward(p, a).out)
    for other in (p.replace(causal=False), AttentionProblem(causal=True, **BASE)):
        assert np.max(np.abs(o - np.asarray(judge.oracle_forward(other, a).out))) > 1e-2


MASKS = [dict(causal=True), dict(window_size=(40, 0)), dict(window_size=(None, 17)), dict(window_size=(30, 50))]


@pytest.mark.parametrize("lengths", [(200, 300), (512, 640)])
@pytest.mark.parametrize("mask", MASKS)
def test_the_twin_walks_every_listed_tile_with_the_rule_inside(mask, lengths):
    """Every block listed: the twin's block-sparse rewrite (the lists' grid, the rule as its keep
    argument) walks all tiles, the dense windowed call skips the ones the rule masks whole and
    masks by geometry -- another path to the same arithmetic: forward and dQ equal bit for bit, the
    deterministic dQ order (descending under the rule) included (dK / dV: the rewrite sums a key's
    copies over its query blocks in float64). Head dim 64: a tile the rule does not change."""
    from fa4verify.targets import TwinTarget
    t = TwinTarget(accumulation="sm90-tensor-core")
    every = CallForm(block_size=(128, 128), block_seed=7, block_keep=1.0, block_per_batch=True)
    shape = dict(BASE, seqlen_q=lengths[0], seqlen_k=lengths[1])
    p = AttentionProblem(call=every, **mask, **shape)
    d = AttentionProblem(**mask, **shape)
    a = p.materialize()
    f, fd = t.forward(p, a), t.forward(d, a)
    np.testing.assert_array_equal(f.out, fd.out)
    np.testing.assert_array_equal(f.lse, fd.lse)
    g, gd = t.backward(p, a, f), t.backward(d, a, fd)
    np.testing.assert_array_equal(g.dq, gd.dq)
    assert np.max(np.abs(g.dk - gd.dk)) <= 2.0 ** -6 * np.max(np.abs(gd.dk))


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
@pytest.mark.parametrize("mask", MASKS[:2])
def test_the_twin_runs_them_inside_the_budgets_and_the_rule_matters(arch, mask):
    """The twin on block lists under a rule passes the judge against the oracle; the same rewrite
    without the rule's keep-mask (the lists alone) fails it."""
    from fa4verify.fuzz.properties import check_problem
    from fa4verify.fuzz.violation import Violation
    from fa4verify.targets import TwinTarget

    class NoRule(TwinTarget):
        def _call_form(self, problem, a, head=0, **kw):
            vp, va, rw = super()._call_form(problem, a, head, **kw)
            return vp, {k: v for k, v in va.items() if k not in ("keep", "keep_rule")}, rw

    p = AttentionProblem(call=CALL, **mask, **{**BASE, "arch": arch})
    out = check_problem(p, TwinTarget(), properties=("runs", "fwd_budget", "bwd_budget", "masked_rows"))
    assert {"fwd_budget", "bwd_budget"} <= set(out.ran) and not out.undecided
    with pytest.raises(Violation):
        check_problem(p, NoRule(), properties=("runs", "fwd_budget", "bwd_budget", "masked_rows"))


def test_the_twin_plan_runs_block_lists_under_every_mask():
    from fa4verify.targets import TwinTarget
    TwinTarget().check_supported(AttentionProblem(call=CALL, causal=True, **BASE))
    pl = planner.plan(space_for("sm90", "bf16"), seed=0)
    assert {r["mask"] for r in pl.rows if r["form"] == "block_sparse"} - {"none"}


def test_at_hd_192_under_a_window_the_twin_takes_fa4s_fitted_tile():
    """hd 192 under a window: FA4's SM90 forward tile_n is 96 (128 without the window), fitted to a
    96-key block (``_fit_sm90_fwd_tile_to_block_sparsity``): with every block listed the rewrite's
    forward equals the dense windowed call's (tile 96) bit for bit; one with the unwindowed tile (128
    over the packed 96-key blocks) would not."""
    from fa4verify.targets import TwinTarget, _sparse_kw
    t = TwinTarget(accumulation="sm90-tensor-core")
    shape = dict(BASE, seqlen_q=300, seqlen_k=400, head_dim=192, head_dim_v=128)
    every = CallForm(block_size=(128, 96), block_seed=7, block_keep=1.0, block_per_batch=True)
    p = AttentionProblem(call=every, window_size=(150, 0), **shape)
    d = AttentionProblem(window_size=(150, 0), **shape)
    a = p.materialize()
    f, fd = t.forward(p, a), t.forward(d, a)
    np.testing.assert_array_equal(f.out, fd.out)
    vp, va, _rw = t._call_form(p, a)
    assert _sparse_kw(vp, va) == {"tile_n": 96}
    assert _sparse_kw(vp, dict(va, keep_rule=(False, False))) == {"tile_n": 96}     # fitted down from 128
    assert _sparse_kw(vp, dict(va, keep_block=(128, 128))) == {"tile_n": 96}        # the window's own
