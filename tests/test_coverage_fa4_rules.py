"""The feature space's support rules that come from FA4's own refusals (fa4verify.coverage.space),
each tied to the FA4 source line it models, and the adapter's deterministic block-sparse tensors.

Found on the H200 (2026-12-02, flash-attn-4 4.0.0b36): 13 of 97 planned rows of coverage.production
were refused by FA4 ("FA4 rejected the call"). Three refusals are FA4 limits the space now knows
(the source tests below fail if FA4 drops or changes them); the fourth ("deterministic block-sparse
backward requires dq_write_order") was fa4verify's: the adapter did not pass FA4 the write order.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from fa4verify.coverage import planner, space
from fa4verify.kernels import facts


def _fa4_source(name: str) -> str:
    spec = importlib.util.find_spec("flash_attn.cute")
    assert spec is not None and spec.submodule_search_locations
    return (Path(list(spec.submodule_search_locations)[0]) / name).read_text()


@pytest.mark.fa4
@pytest.mark.parametrize("fname, text", [
    ("flash_fwd.py", "hdim_multiple_of = 16"),
    ("flash_fwd_sm100.py", "hdim_multiple_of = 16"),
    ("flash_fwd_sm90.py", "Paged KV does not support irregular head dim"),
    ("flash_fwd_sm100.py", "Paged KV does not support irregular head dim"),
    ("interface.py", "paged_kv_non_tma=page_size not in [None, tile_n]"),
    ("flash_bwd_sm90.py", "GQA backward requires head_dim == head_dim_v"),
    ("flash_bwd_sm90.py", "Deterministic not implemented for block-sparse backward"),
    ("interface.py", "deterministic block-sparse backward requires dq_write_order in block_sparse_tensors"),
])
def test_the_modelled_refusal_is_in_the_installed_fa4(fname, text):
    assert text in _fa4_source(fname), f"{fname} no longer says {text!r}: re-read the rule in coverage/space.py"


def test_hdim_multiple_matches_fa4_padding():
    assert facts.HDIM_MULTIPLE == 16


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_non_tma_paged_kv_refuses_irregular_head_dims(arch):
    sp = space.space_for(arch, "bf16")
    for name, (hd, hdv) in sp.hd.items():
        why = sp.why_not({"form": "paged_small", "hd": name})
        irregular = hd % 16 or hdv % 16
        assert (why is not None) == bool(irregular), (name, why)
        if irregular:
            assert "irregular head dim" in why
        assert sp.why_not({"form": "paged_tile", "hd": name}) is None, name   # TMA path: any head dim


def test_sm90_gqa_backward_needs_equal_head_dims():
    sp = space.space_for("sm90", "bf16")
    assert "192x128" in sp.hd
    for gqa in ("2", "4", "mqa"):
        assert "head_dim == head_dim_v" in sp.no_backward({"hd": "192x128", "gqa": gqa})
    assert sp.no_backward({"hd": "192x128", "gqa": "1"}) is None
    assert sp.no_backward({"hd": "128", "gqa": "mqa"}) is None
    row = {"form": "dense", "hd": "192x128", "gqa": "2"}
    assert sp.passes(row) == ("fwd",)
    assert sp.why_not(dict(row, det="off")) is not None       # det is a backward setting


def test_sm90_block_sparse_backward_is_not_deterministic():
    sp90, sp100 = space.space_for("sm90", "bf16"), space.space_for("sm100", "bf16")
    assert "Deterministic not implemented" in sp90.why_not({"form": "block_sparse", "det": "on"})
    assert sp90.why_not({"form": "block_sparse", "det": "off"}) is None
    assert sp100.why_not({"form": "block_sparse", "det": "on"}) is None
    # a head dim without a block-sparse backward (known issue sm90_block_sparse_bwd_no_build) runs
    # the forward only, where det is moot: the row stays plannable
    assert sp90.why_not({"form": "block_sparse", "hd": "200", "det": "on"}) is None


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_plan_has_no_row_fa4_refuses(arch):
    """Every planned row is one the rules above admit, and its passes are the ones FA4 runs."""
    sp = space.space_for(arch, "bf16")
    pl = planner.plan(sp, seed=0)
    for r in pl.rows:
        assert sp.why_not(r) is None, r
        hd, hdv = sp.hd[r["hd"]]
        if space.is_paged(r["form"]) and r["form"] != "paged_tile":
            assert hd % 16 == 0 and hdv % 16 == 0, r
        if arch == "sm90" and hd != hdv and sp.gqa_ratio(r["gqa"]) > 1:
            assert "bwd" not in sp.passes(r), r
        if arch == "sm90" and r["form"] == "block_sparse" and "bwd" in sp.passes(r):
            assert r["det"] == "off", r


@pytest.mark.fa4
def test_deterministic_block_sparse_tensors_carry_fa4s_write_order():
    """The write order the adapter hands FA4 equals an independent count: for KV block n and the
    i-th Q block m it visits, the number of KV blocks n' < n that Q block m sees."""
    from fa4verify.kernels import adapter
    rng = np.random.default_rng(3)
    m = rng.random((4, 5)) < 0.6
    m[:, 0] = True
    t = adapter.block_sparse_tensors(m, batch=2, nheads=3, block_size=(128, 128), direction="bwd",
                                     device="cpu", deterministic=True)
    assert t.spt is False and t.dq_write_order_full is not None
    order = t.dq_write_order_full.numpy()
    idx, cnt = t.full_block_idx.numpy(), t.full_block_cnt.numpy()
    assert order.shape == idx.shape
    for n in range(m.shape[1]):
        qs = np.flatnonzero(m[:, n])
        assert cnt[0, 0, n] == qs.size
        for i, mb in enumerate(qs):
            assert idx[1, 2, n, i] == mb
            assert order[1, 2, n, i] == int(m[mb, :n].sum()), (n, i)
    plain = adapter.block_sparse_tensors(m, batch=2, nheads=3, block_size=(128, 128), direction="bwd", device="cpu")
    assert plain.dq_write_order is None and plain.spt is None
    with pytest.raises(ValueError, match="backward"):
        adapter.block_sparse_tensors(m, batch=1, nheads=1, block_size=(128, 128), direction="fwd", device="cpu",
                                     deterministic=True)


def test_production_backward_refuses_what_fa4_asserts():
    """The target says why before calling FA4 (the row keeps its forward; on the H200 the row was
    refused whole by FA4's assert, losing its forward coverage)."""
    from fa4verify.problem import AttentionProblem
    from fa4verify.targets import _call_backward_unsupported
    gqa = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=64, seqlen_k=64, nheads=4, nheads_kv=2,
                           head_dim=192, head_dim_v=128)
    assert "head_dim == head_dim_v" in _call_backward_unsupported(gqa)
    assert _call_backward_unsupported(gqa.replace(nheads_kv=4)) is None
    assert _call_backward_unsupported(gqa.replace(arch="sm100")) is None


def test_coverage_names_every_violating_row_and_the_known_ones():
    """The campaign's summary keeps the first violation; the coverage details name every violating
    row (and the rows a known issue absorbed), so a report shows all of them."""
    from fa4verify.audit.registry import CheckResult
    from fa4verify.checks.coverage import planned_result
    sp = space.space_for("sm90", "bf16")
    pl = planner.plan(sp, seed=0)
    head = {"extra": {"plan": {"space": sp.describe(), "rows": pl.rows, "seed": 0, "uncoverable": []}}}

    def fail(i):
        return {"index": i, "status": "violation", "known": [],
                "failure": {"property": "bwd_budget", "message": f"dq: row {i}", "describe": f"problem {i}"}}
    outcomes = [{"index": i, "status": "ran", "metrics": {}, "known": []} for i in range(len(pl.rows))]
    outcomes[3], outcomes[7] = fail(3), fail(7)
    outcomes[5] = {"index": 5, "status": "known", "known": [],
                   "known_raised": {"name": "sm90_dq_accum_hdim_rounding", "property": "bwd_budget"}}
    out = planned_result(CheckResult(status="fail", where="CPU twin", summary="x"), head, outcomes)
    cov = out.details["plan_coverage"]
    assert sorted(cov["violating_rows"]) == ["3", "7"]
    assert cov["violating_rows"]["7"]["message"] == "dq: row 7" and cov["violating_rows"]["7"]["row"] == pl.rows[7]
    assert cov["known_rows"] == {"5": ["sm90_dq_accum_hdim_rounding"]}
    assert cov["violating_edges"] == {}
    assert "2 violating: row 3 (bwd_budget), row 7 (bwd_budget)" in out.summary
    assert cov["known_absorbed"] == {} and "known FA4 issues absorbed" not in out.summary


def test_coverage_says_how_each_known_issue_absorbed():
    """Note [Known issues with a model]: the absorbed violations by case, within a model of the
    defect or by the issue's configuration rule alone, counted in the summary."""
    from fa4verify.audit.registry import CheckResult
    from fa4verify.checks.coverage import planned_result
    sp = space.space_for("sm90", "bf16")
    pl = planner.plan(sp, seed=0)
    head = {"extra": {"plan": {"space": sp.describe(), "rows": pl.rows, "seed": 0, "uncoverable": []}}}
    outcomes = [{"index": i, "status": "ran", "metrics": {}, "known": []} for i in range(len(pl.rows))]
    outcomes[2]["known"] = [{"name": "sm90_score_mod_gqa_bwd_indices", "property": "bwd_budget", "quantity": "dq",
                             "tightness_key": "dq", "model": "within"},
                            {"name": "sm90_score_mod_gqa_bwd_indices", "property": "bwd_stages",
                             "quantity": "dq_accum", "tightness_key": "dq_accum", "model": "not judged by the model"}]
    outcomes[4]["known"] = [{"name": "sm90_dq_accum_hdim_rounding", "property": "bwd_budget", "quantity": "dq",
                             "tightness_key": "dlse_dq"}]
    out = planned_result(CheckResult(status="pass", where="CPU twin", summary="x"), head, outcomes)
    cov = out.details["plan_coverage"]
    assert sorted(cov["known_absorbed"]) == ["2", "4"]
    assert cov["known_absorbed"]["4"] == [{"name": "sm90_dq_accum_hdim_rounding", "quantity": "dlse_dq",
                                           "property": "bwd_budget", "model": "no model"}]
    assert "known FA4 issues absorbed 3 violation(s) in 2 case(s), 1 within a model of the defect, 2 by " \
           "configuration alone" in out.summary
    # an issue whose rule names the elements the defect reaches (KnownIssue.names)
    outcomes[6]["known"] = [{"name": "sm90_sparse_bwd_left_window_unwritten", "property": "masked_rows",
                             "quantity": "dv", "tightness_key": "dv", "model": "elements"}]
    out = planned_result(CheckResult(status="pass", where="CPU twin", summary="x"), head, outcomes)
    assert "known FA4 issues absorbed 4 violation(s) in 3 case(s), 1 within a model of the defect, 1 on " \
           "elements the defect's rule names, 2 by configuration alone" in out.summary


def test_coverage_names_a_violating_edge_behind_a_violating_row():
    """Measured on the H200 (e09f829): a row already violating in the clean run hid four planted
    faults whose own edges failed (the summary shrinks to the first violation, a row before the
    edges). Every violating edge is named in the details and in the summary."""
    from fa4verify.audit.registry import CheckResult
    from fa4verify.checks.coverage import planned_result
    sp = space.space_for("sm90", "bf16")
    pl = planner.plan(sp, seed=0)
    edges = ["varlen_lookup_long_first", "varlen_lookup_chunks"]
    head = {"extra": {"plan": {"space": sp.describe(), "rows": pl.rows, "seed": 0, "uncoverable": [],
                               "edges": edges}}}
    n = len(pl.rows)
    outcomes = [{"index": i, "status": "ran", "metrics": {}, "known": []} for i in range(n + len(edges))]
    outcomes[2] = {"index": 2, "status": "violation", "known": [],
                   "failure": {"property": "deterministic_bwd", "message": "dk: row 2", "describe": "p2"}}
    outcomes[n + 1] = {"index": n + 1, "status": "violation", "known": [],
                       "failure": {"property": "finite", "message": "dk: NaN", "describe": "chunks"}}
    out = planned_result(CheckResult(status="fail", where="CPU twin", summary="x"), head, outcomes)
    cov = out.details["plan_coverage"]
    assert list(cov["violating_edges"]) == ["varlen_lookup_chunks"]
    assert cov["violating_edges"]["varlen_lookup_chunks"]["property"] == "finite"
    assert "2 violating: row 2 (deterministic_bwd), edge varlen_lookup_chunks (finite)" in out.summary
    assert cov["edge_cases"] == {"varlen_lookup_long_first": "ran", "varlen_lookup_chunks": "violation"}


def test_a_deployment_page_is_non_tma_only_where_it_matches_no_tile():
    """A deployment page of 128 at hd 72 is FA4's TMA path under a causal or local mask (tile_n 128
    there, 144 unmasked): the row is refused only without a mask matching it."""
    sp = space.space_for("sm90", "bf16")
    sp.pages["paged:128"] = 128
    sp.values["form"] = sp.values["form"] + ("paged:128",)
    assert facts.sm90_fwd_tile(72, 72, True, False)[1] == 128 != facts.sm90_fwd_tile(72, 72, False, False)[1]
    assert sp.why_not({"form": "paged:128", "hd": "72"}) is None                     # some mask takes TMA
    assert sp.why_not({"form": "paged:128", "hd": "72", "mask": "causal"}) is None
    assert "irregular" in sp.why_not({"form": "paged:128", "hd": "72", "mask": "none"})


def test_a_row_stopped_by_a_known_backward_failure_covers_its_forward_only():
    """A row whose backward did not build (a known `runs` issue) judged no gradient: its backward
    triples are holes, not covered (review finding)."""
    from fa4verify.audit.registry import CheckResult
    from fa4verify.checks.coverage import planned_result
    sp = space.space_for("sm90", "bf16")
    pl = planner.plan(sp, seed=0)
    head = {"extra": {"plan": {"space": sp.describe(), "rows": pl.rows, "seed": 0, "uncoverable": []}}}
    ok = [{"index": i, "status": "ran", "metrics": {}, "known": []} for i in range(len(pl.rows))]
    full = planned_result(CheckResult(status="pass", where="CPU twin", summary="s"), head, ok).details["plan_coverage"]
    assert not full["holes"]
    i = next(j for j, r in enumerate(pl.rows) if "bwd" in sp.passes(r))
    stopped = list(ok)
    stopped[i] = {"index": i, "status": "known", "known": [],
                  "known_raised": {"name": "sm90_bwd_hd104_112_compile", "property": "runs"}}
    cov = planned_result(CheckResult(status="pass", where="CPU twin", summary="s"), head, stopped).details["plan_coverage"]
    bwd_only = planner.row_tuples(sp, pl.rows[i]) - planner.row_tuples(sp, pl.rows[i], passes=("fwd",))
    assert bwd_only and all("pass=bwd" in t or "bwd" in t for t in map(str, bwd_only))
    # each of its backward triples is a hole unless another row covers it
    others = set().union(*(planner.row_tuples(sp, r) for j, r in enumerate(pl.rows) if j != i))
    assert len(cov["holes"]) == len(bwd_only - others)
