"""Note [Judged siblings] (fa4verify/coverage/siblings.py): each planned SM90 backward whose gradients
a known FA4 issue absorbs by its configuration alone gets a sibling that the issue does not touch,
which keeps every other feature of the call (red-team round 17, docs/results/redteam17/)."""
from __future__ import annotations

import dataclasses

import pytest

from fa4verify.checks.coverage import row_backward
from fa4verify.coverage import planner
from fa4verify.coverage.cases import NONDETERMINISTIC_EDGES, edge_problems, plan_problems
from fa4verify.coverage.siblings import _bwd_block, configuration_only, judged_siblings
from fa4verify.coverage.space import space_for
from fa4verify.problem import AttentionProblem, CallForm

pytestmark = pytest.mark.fa4          # the accumulator defect is read from FA4's _tile_size_bwd_sm90


def _cases(sp):
    pl = planner.plan(sp, seed=0)
    rows, probs = plan_problems(sp, pl.rows, seed=0)
    bwd = row_backward(sp, rows)
    out = [(f"row{i}", p, bwd[i], rows[i]["det"] == "on") for i, p in enumerate(probs)]
    return out + [(n, p, b, n not in NONDETERMINISTIC_EDGES) for n, p, b in edge_problems(sp)]


def _same_but_head_dims(a, b):
    def strip(p):
        return {k: v for k, v in p.to_dict().items() if k not in ("head_dim", "head_dim_v")}
    return strip(a) == strip(b)


def test_every_call_absorbed_by_configuration_gets_a_judged_sibling_keeping_its_features():
    sp = space_for("sm90", "bf16")
    cases = _cases(sp)
    absorbed = {n: (p, configuration_only(p)) for n, p, b, _d in cases if b and configuration_only(p)}
    # the seed-0 plan has them: GQA at the accumulator head dims with used lengths or block sparsity,
    # and the tile-tail edge at FA4's 80-row tile with head_dim_v 64
    assert {"accumulator", "overrun"} <= {w for _p, w in absorbed.values()}
    sib, unjudged = judged_siblings(sp, cases)
    assert not unjudged
    by = {n[len("judged_"):]: (s, d) for n, s, _b, d in sib}
    assert set(by) == set(absorbed)
    det = {n: d for n, _p, _b, d in cases}
    for name, (s, d) in by.items():
        p, why = absorbed[name]
        assert configuration_only(s) is None, name            # nothing absorbs the sibling by configuration
        assert d == det[name]
        if why == "accumulator":
            assert (s.head_dim, s.head_dim_v) != (p.head_dim, p.head_dim_v) and _same_but_head_dims(s, p), name
            assert _bwd_block(p, s.head_dim, s.head_dim_v) == _bwd_block(p, p.head_dim, p.head_dim_v), name
        else:
            assert (s.batch, s.nheads, s.nheads_kv) == (1, 1, 1) and s.head_dim_v == 64, name


def test_a_space_without_a_sibling_head_dim_names_the_calls_left_unjudged():
    """The red-team's hd-72 block-sparse row needs a head dim of its tile outside the defect (64 or
    96 here); a deployment whose head dims are all in the defect has none: named, never silent."""
    sp = space_for("sm90", "bf16")
    odd = {n: d for n, d in sp.hd.items() if d[0] in (8, 72, 104) and d[0] == d[1]}
    narrow = dataclasses.replace(sp, hd=odd, values=dict(sp.values, hd=tuple(odd)))
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=2, seqlen_q=130, seqlen_k=200, nheads=4, nheads_kv=2,
                         head_dim=72, head_dim_v=72, call=CallForm(block_size=(128, 128), block_seed=1))
    assert configuration_only(p) == "accumulator"
    sib, unjudged = judged_siblings(narrow, [("x", p, True, False)])
    assert not sib and unjudged == ["x"]
    sib, unjudged = judged_siblings(sp, [("x", p, True, False)])
    assert [n for n, *_ in sib] == ["judged_x"] and sib[0][1].head_dim in (64, 96) and not unjudged


def test_a_call_the_misread_model_judges_needs_no_sibling():
    """A dense GQA call at hd 72: the misread map judges dQ and dK / dV (Note [The misread
    accumulator]): no configuration-only absorption, no sibling; nor on SM 10.x."""
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=130, seqlen_k=200, nheads=4, nheads_kv=2,
                         head_dim=72, head_dim_v=72)
    assert configuration_only(p) is None
    assert configuration_only(p.replace(arch="sm100")) is None
    assert judged_siblings(space_for("sm100", "bf16"), [("x", p.replace(arch="sm100"), True, False)]) == ([], [])


def test_the_coverage_summary_says_how_many_siblings_ran_and_names_an_unjudged_call():
    from fa4verify.audit.registry import CheckResult
    from fa4verify.checks.coverage import planned_result
    sp = space_for("sm90", "bf16")
    pl = planner.plan(sp, seed=0)
    head = {"extra": {"plan": {"space": sp.describe(), "rows": pl.rows, "seed": 0, "uncoverable": [],
                               "edges": ["edge_a", "judged_row7"], "variant_edges": 0, "judged_siblings": 1,
                               "unjudged": ["row44"]}}}
    outcomes = [{"index": i, "status": "ran", "metrics": {}, "known": []} for i in range(len(pl.rows) + 2)]
    out = planned_result(CheckResult(status="pass", where="CPU twin", summary="x"), head, outcomes)
    assert "2/2 constructed edges ran (1 judged siblings of calls a known issue absorbs by configuration)" in out.summary
    assert "1 call(s) a known issue absorbs by configuration with no judged sibling in the space: row44" in out.summary


def test_a_deployment_keeps_its_head_counts_and_head_dims():
    """A deployment's space fixes head counts: the one-head sibling of the overrun is not planned
    there (named as unjudged), and an accumulator sibling takes one of the deployment's head dims."""
    sp = space_for("sm90", "bf16")
    tail = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=137, seqlen_k=184, nheads=2, nheads_kv=2,
                            head_dim=128, head_dim_v=64)
    assert configuration_only(tail) == "overrun"
    assert [n for n, *_ in judged_siblings(sp, [("t", tail, True, True)])[0]] == ["judged_t"]
    fixed = dataclasses.replace(sp, heads={"h:2/2": (2, 2)})
    assert judged_siblings(fixed, [("t", tail, True, True)]) == ([], ["t"])
    for _n, s, _b, _d in judged_siblings(sp, [(n, p, b, d) for n, p, b, d in _cases(sp)])[0]:
        assert (s.head_dim, s.head_dim_v) in set(sp.hd.values())
