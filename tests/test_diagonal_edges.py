"""Note [The diagonal's block bounds] (fa4verify.coverage.cases._diagonal_edges): the causal and
right-window edges one key past a tile edge pass on the clean twin and fail with the twin's model of
source mutant fwd_causal_nblock_max_inclusive_row (the forward's KV-tile bound one row short);
diagonal_offsets finds the offset where both FA4 bounds have no slack."""
from __future__ import annotations

import pytest

from fa4verify.checks.coverage import PLAN_PROPERTIES
from fa4verify.coverage.cases import diagonal_offsets, edge_problems
from fa4verify.coverage.space import space_for
from fa4verify.fuzz import check_problem
from fa4verify.fuzz.violation import Violation
from fa4verify.targets import TwinTarget

EDGES = ("causal_key_past_tile", "right_window_key_past_tile")


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
@pytest.mark.parametrize("edge", EDGES)
def test_the_edge_passes_clean_and_fails_a_kv_tile_bound_one_row_short(arch, edge):
    got = {n: (p, b) for n, p, b in edge_problems(space_for(arch, "bf16"))}
    p, bwd = got[edge]
    assert bwd
    check_problem(p, TwinTarget(), properties=PLAN_PROPERTIES, backward=True, deterministic=False)
    with pytest.raises(Violation) as ei:
        check_problem(p, TwinTarget(["nblock_max_row_exclusive"]), properties=PLAN_PROPERTIES, backward=False)
    assert ei.value.prop == "fwd_budget"


def test_diagonal_offsets_find_the_no_slack_residues():
    assert diagonal_offsets((128, 128), (64, 128), 256) == 1          # hd 128 on SM90: sk = sq + 1
    assert diagonal_offsets((128, 128), (128, 128), 256) == 1
    # SM90's 192-row forward tile (hd <= 96): sk = sq + 1 once M tile 1 ends inside (384 rows), else
    # the key offset 65 (192 + 65 = 1 mod 128)
    assert diagonal_offsets((192, 128), (64, 128), 384) == 1
    assert diagonal_offsets((192, 128), (64, 128), 300) == 65
    assert diagonal_offsets((128, 128), (64, 128), 100) is None         # no M tile ends inside 100 rows


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_the_per_head_block_edge_passes_clean_and_fails_lists_read_by_kv_head(arch):
    """Note [Block masks by head]: GQA 4/2 with a block mask per query head; the twin's model of
    source mutant block_sparse_packgqa_guard_dropped (each head of a group reads the lists of the
    head numbered as its KV head) fails it."""
    got = {n: (p, b) for n, p, b in edge_problems(space_for(arch, "bf16"))}
    p, bwd = got["block_sparse_per_head"]
    assert p.call.block_per_head and p.nheads == 2 * p.nheads_kv and p.heads_differ
    check_problem(p, TwinTarget(), properties=PLAN_PROPERTIES, backward=bwd, deterministic=False)
    with pytest.raises(Violation):
        check_problem(p, TwinTarget(["block_lists_by_kv_head"]), properties=PLAN_PROPERTIES, backward=False)


@pytest.mark.parametrize("arch", ["sm90"])
def test_the_negative_score_edge_fails_a_running_max_stored_after_its_guard(arch):
    # rows fully masked in their M tile's first KV tile (all but its last) keep the 0 that stands
    # in for -inf as their running max: with every score near -100 nats each later P flushes to 0
    got = {n: (p, b) for n, p, b in edge_problems(space_for(arch, "bf16"))}
    p, bwd = got["causal_key_past_tile_negative"]
    assert bwd and p.values.distribution == "negative_scores"
    assert (p.seqlen_q, p.seqlen_k) == (got["causal_key_past_tile"][0].seqlen_q, got["causal_key_past_tile"][0].seqlen_k)
    check_problem(p, TwinTarget(), properties=PLAN_PROPERTIES, backward=False)
    with pytest.raises(Violation):
        check_problem(p, TwinTarget(["max_stored_after_inf_guard"]), properties=PLAN_PROPERTIES, backward=False)
    # the same fault on the edge's normal-valued twin passes: shift invariance hides it there
    check_problem(got["causal_key_past_tile"][0], TwinTarget(["max_stored_after_inf_guard"]),
                  properties=PLAN_PROPERTIES, backward=False)
