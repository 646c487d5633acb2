"""The plan never rests a backward tuple on a row whose backward FA4 cannot build (on the H200,
seed 2: the only dense / no-mask row had head dim 104, whose SM90 backward does not compile, so
coverage.production reported the (dense, none, bwd) hole, undecided)."""
from __future__ import annotations

import pytest

from fa4verify.coverage import planner
from fa4verify.coverage.space import is_local, space_for
from fa4verify.kernels.features import sm90_bwd_does_not_build


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_no_planned_backward_runs_where_fa4s_sm90_backward_does_not_build(seed):
    space = space_for("sm90", "bf16")
    pl = planner.plan(space, seed=seed)
    assert not pl.uncoverable
    for row in pl.rows:
        hd, mask = space.hd[row["hd"]], row["mask"]
        if sm90_bwd_does_not_build(*hd, mask in ("causal", "causal_left"), is_local(mask)):
            assert "bwd" not in space.passes(row), row
    cov = planner.coverage(space, pl.rows)
    assert not cov["holes"], cov["holes"]


def test_the_rule_is_what_the_sweep_measured():
    assert sm90_bwd_does_not_build(104, 104, False, False) and sm90_bwd_does_not_build(112, 112, False, False)
    assert not sm90_bwd_does_not_build(104, 104, True, False)      # causal: m_block 64, not measured
    assert not sm90_bwd_does_not_build(96, 96, False, False) and not sm90_bwd_does_not_build(128, 128, False, False)
