"""Note [Kernel variants] (fa4verify/coverage/variants.py): every SM90 kernel variant FA4 picks for
the audit's space -- its tile configuration, mask mode, PackGQA / GQA accumulation and
deterministic mode -- is compiled by some call of coverage.production, decided by construction.
Red-team round 13 (docs/results/redteam13/) found variants no call reached at seed 0, FA4's default
training call among them (hd 64, causal, MHA, deterministic=False)."""
from __future__ import annotations

import itertools

import pytest

from fa4verify.coverage import cases, planner, space
from fa4verify.coverage.variants import bwd_variant, fwd_variant, reached, variant_edges

pytestmark = pytest.mark.fa4          # FA4's own host functions name the variants


def _ran(sp, seed=0):
    from fa4verify.checks.coverage import row_backward
    pl = planner.plan(sp, seed=seed)
    rows, probs = cases.plan_problems(sp, pl.rows, seed=seed)
    bw = row_backward(sp, rows)
    ran = [(p, bw[i], r["det"] == "on") for i, (p, r) in enumerate(zip(probs, rows))]
    ran += [(p, b, n not in cases.NONDETERMINISTIC_EDGES) for n, p, b in cases.edge_problems(sp, seed=seed)]
    return ran


@pytest.fixture(scope="module")
def sm90():
    sp = space.space_for("sm90", "bf16")
    ran = _ran(sp)
    return sp, ran, variant_edges(sp, ran, seed=0)


def test_every_variant_of_the_space_is_compiled_by_some_call(sm90):
    """Every dense combination of head-dim class x mask x GQA ratio x deterministic mode the space
    supports: its forward variant, and its backward variant where FA4 has one, is reached by the
    plan, the constructed edges or a variant edge."""
    sp, ran, extra = sm90
    have = reached(ran + [(p, b, d) for _n, p, b, d in extra])
    missing = []
    for hd, mask, gqa, det in itertools.product(sp.values["hd"], sp.values["mask"], sp.values["gqa"],
                                                sp.values["det"]):
        row = {"form": "dense", "hd": hd, "mask": mask, "gqa": gqa}
        if any(sp.why_not({a: row[a], b: row[b]}) for a, b in itertools.combinations(row, 2)):
            continue
        p = cases.problem_for(sp, {"form": "dense", "seqlen": "multi", "softcap": "off", "sink": "off",
                                   "values": "normal", "scale": sp.values["scale"][0], "det": det, **row}, 0)
        want = [fwd_variant(p)]
        if sp.no_backward(row) is None:
            want.append(bwd_variant(p, det == "on"))
        missing += [(hd, mask, gqa, det, v) for v in want if v not in have]
    assert not missing, missing[:5]


def test_the_variants_round_13_found_unreached_are_run_now(sm90):
    """Round 13's first finding: no hd-64 causal MHA backward without deterministic; and no
    non-deterministic hd-256 MHA backward. Each now has a call, run as named."""
    sp, ran, extra = sm90
    have = reached(ran + [(p, b, d) for _n, p, b, d in extra])
    for hd, causal in ((64, True), (256, False), (96, True)):       # the catalogued round-13 faults' variants
        from fa4verify.problem import AttentionProblem
        p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=200, seqlen_k=200, nheads=2, nheads_kv=2,
                             head_dim=hd, head_dim_v=hd, causal=causal)
        assert bwd_variant(p, False) in have and bwd_variant(p, True) in have
    # and the PackGQA forward at hd 192 / hdv 128 (the 128 x 128 tile of hd 128, at another shape)
    from fa4verify.problem import AttentionProblem
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=200, seqlen_k=200, nheads=4, nheads_kv=2,
                         head_dim=192, head_dim_v=128)
    assert fwd_variant(p) in have and fwd_variant(p) not in reached(ran)
    # they were not reached before (what the variant edges add), and each edge names its variant
    before = reached(ran)
    assert any(v not in before for _n, p, _b, d in extra for v in (fwd_variant(p), bwd_variant(p, d)))
    names = {n for n, *_ in extra}
    assert len(names) == len(extra) and all(n.startswith("variant_") for n in names)


def test_a_variant_edge_runs_its_deterministic_mode():
    """The coverage check hands each variant edge its own deterministic mode (a non-deterministic
    variant run deterministically would compile the other kernel)."""
    import os
    from fa4verify.checks.coverage import _cases
    from fa4verify.audit.registry import CheckContext
    ctx = CheckContext(dtype="bf16", arch="sm90", device="cuda", profile="default", seed=0,
                       check_id="coverage.production", archs=("sm90",))
    os.environ["FA4VERIFY_FAKE_DEVICE"] = "h200"
    try:
        cs = _cases(ctx, target="production", features=("dense",), arch="sm90", dtype="bf16", where="x")
    finally:
        del os.environ["FA4VERIFY_FAKE_DEVICE"]
    plan = cs[0].head["extra"]["plan"]
    assert plan["variant_edges"] > 0
    names = plan["edges"]
    n_rows = len(plan["rows"])
    seen = set()
    for k, n in enumerate(names):
        if n.startswith("variant_") and n.endswith(("_det", "_nondet")):
            assert cs[n_rows + k].deterministic == n.endswith("_det"), n
            seen.add(n.endswith("_det"))
    assert seen == {True, False}


def test_no_variant_edges_for_fp8():
    """The keys are 16-bit ones (the SM100 exp2-emulation mirror leaves FA4's fp8 override out)."""
    sp = space.space_for("sm100", "fp8")
    assert variant_edges(sp, [], seed=0) == []


def test_the_coverage_summary_says_how_many_calls_are_for_variants():
    from fa4verify.audit.registry import CheckResult
    from fa4verify.checks.coverage import planned_result
    sp = space.space_for("sm90", "bf16")
    pl = planner.plan(sp, seed=0)
    edges = ["edge_a", "variant_x", "variant_y"]
    head = {"extra": {"plan": {"space": sp.describe(), "rows": pl.rows, "seed": 0, "uncoverable": [],
                               "edges": edges, "variant_edges": 2}}}
    outcomes = [{"index": i, "status": "ran", "metrics": {}, "known": []} for i in range(len(pl.rows) + 3)]
    out = planned_result(CheckResult(status="pass", where="CPU twin", summary="x"), head, outcomes)
    assert "3/3 constructed edges ran (2 of them for kernel variants no row or other edge compiles)" in out.summary
