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


def test_the_judge_tells_both_masks_from_either_alone():
    """The twin of a causal block-sparse call passes the judge; the oracle without the causal rule
    (or without the lists) would be another function: the twin is far outside its bounds there."""
    from fa4verify import judge
    from fa4verify.fuzz.properties import check_problem
    from fa4verify.targets import TwinTarget
    p = AttentionProblem(call=CALL, causal=True, **BASE)
    out = check_problem(p, TwinTarget(), properties=("runs", "fwd_budget", "bwd_budget", "masked_rows"))
    assert "fwd_budget" in out.ran and "bwd_budget" in out.ran
    a = p.materialize()
    f = TwinTarget().forward(p, a)
    for other in (p.replace(causal=False), AttentionProblem(causal=True, **BASE)):
        o = judge.oracle_forward(other, a)
        assert np.max(np.abs(f.out - np.asarray(o.out))) > 1e-2
