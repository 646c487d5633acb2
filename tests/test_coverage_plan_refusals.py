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


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_forward_only_row_never_asks_fa4_for_a_backward(seed):
    """H200, FA4 4.0.0b36, seeds 0-2 (main 99c7b71): a block-sparse row at head dim 104 (no SM90
    backward builds there, so the space runs it forward only and keeps det=on) called FA4's
    deterministic backward anyway; FA4 refused the call ("Deterministic not implemented for
    block-sparse backward") and the row's forward pairs became holes: coverage undecided."""
    from fa4verify.checks.coverage import row_backward
    space = space_for("sm90", "bf16")
    rows = planner.plan(space, seed=seed).rows
    bwd = row_backward(space, rows)
    for i, row in enumerate(rows):
        assert bwd[i] == ("bwd" in space.passes(row))
        if row["form"] == "block_sparse" and row["det"] == "on":
            assert not bwd[i], row
    assert any(r["form"] == "block_sparse" and r["det"] == "on" for r in rows)   # the case the GPU met


def test_a_case_without_backward_never_calls_the_targets_backward(monkeypatch):
    from fa4verify.checks import fuzz as cf
    from fa4verify.problem import AttentionProblem
    from fa4verify.targets import TwinTarget

    class NoBackward(TwinTarget):
        def backward(self, *a, **k):
            raise AssertionError("the backward of a forward-only row was called")

    monkeypatch.setattr(cf, "_target", lambda name: NoBackward())
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=17, seqlen_k=33, nheads=1,
                         nheads_kv=1, head_dim=64, head_dim_v=64)
    head = {"arch": "sm90", "profile": "ci", "seed": 0, "where": "CPU twin", "extra": {}, "properties": None,
            "deadline": None}
    out = cf.run_example(None, cf.DrawnCase(0, p, "twin", head, True, False))["outcome"]
    assert out["status"] == "ran", out
    called = cf.run_example(None, cf.DrawnCase(0, p, "twin", head, True, True))["outcome"]   # the control
    assert called["status"] == "violation" and "forward-only row was called" in called["failure"]["message"]
