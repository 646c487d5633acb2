"""The README's feature x arch table is generated (fa4verify.tables.features) and current; every
cell is non-empty and carries one of the evidence labels; the compile-only census it reads agrees
with the SM90 block-sparse finding's predicate."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fa4verify.tables import features as T
from fa4verify.kernels import features as F

ROOT = Path(__file__).resolve().parents[1]
LABELS = ("measured on", "H200: not run yet", "compile-only", "CPU twin", "not supported by FA4", "n/a",
          "not run by fa4verify yet")


def _rows(table: str) -> list[list[str]]:
    lines = [ln for ln in table.strip().splitlines()[2:]]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", ln)[1:-1]] for ln in lines]


@pytest.mark.parametrize("full", [True, False])
def test_every_cell_is_labelled_and_nonempty(full):
    rows = _rows(T.render(full=full))
    assert len(rows) == len(F.FEATURES)
    for r in rows:
        assert len(r) == 1 + len(F.ARCHS) * len(F.DIRECTIONS)
        for cell in r[1:]:
            assert cell and any(lab in cell for lab in LABELS), cell


def test_the_summary_names_the_evidence_the_full_cell_holds():
    """The README's cell says each kind of evidence its full cell (docs/features.md) holds, and
    no other; a kind whose text records an FA4 finding or a failure is marked (!), a clean one is
    not, and a section not yet run is not called measured."""
    ev = T.load_evidence()
    kinds = ("measured on", "compile-only", "CPU twin")
    for f in F.FEATURES:
        for a in F.ARCHS:
            for d in F.DIRECTIONS:
                c = F.cell(f, a, d)
                full, short = T.cell_text(c, ev), T.cell_summary(c, ev)
                assert len(short) < 120, short
                for k in kinds:
                    assert (k in full) == (k in short), (f, a, d, k, full, short)
    assert "(sm_90) (!)" in T.cell_summary(F.cell("paged_kv", "sm90", "fwd"), ev)
    c = F.cell("block_sparse", "sm90", "bwd")
    for verdict, flagged in (("does not run (compile abort or error)", True), ("refuted", False)):
        ev["h200"]["sparse"] = {"where": "measured on NVIDIA H200 (sm_90)", "result": {
            "verdict": verdict, "predicted_hds_not_running": [], "predicted_hds_wrong_values": [],
            "controls_right": [128]}}
        short = T.cell_summary(c, ev)
        assert ("(sm_90) (!)" in short) == flagged, short
    ev["h200"].pop("mods", None)
    short = T.cell_summary(F.cell("score_mod", "sm90", "bwd"), ev)
    assert "H200: not run yet" in short and "measured" not in short, short


def test_readme_and_docs_blocks_are_current():
    assert T.main(["--check", str(ROOT / "README.md")]) == 0
    assert T.main(["--full", "--check", str(ROOT / "docs" / "features.md")]) == 0


def test_stale_readme_is_detected(tmp_path):
    p = tmp_path / "R.md"
    p.write_text(f"x\n{T.START}\n| old |\n{T.END}\n")
    assert T.main(["--check", str(p)]) == 1
    assert T.main(["--write", str(p)]) == 0 and T.main(["--check", str(p)]) == 0


def test_h200_results_fill_the_measured_cells(tmp_path):
    """With a results JSON the cell says where it was measured and the max tightness."""
    ev = T.load_evidence()
    ev["h200"]["paged"] = {"where": "measured on NVIDIA H200 (sm_90)",
                           "result": {"max_tightness": 0.4321, "all_within_budget": True, "permutation_bitwise": True}}
    txt = T.cell_text(F.cell("paged_kv", "sm90", "fwd"), ev)
    assert "measured on NVIDIA H200 (sm_90): within budget, max tightness 0.432" in txt
    assert "permutation bitwise equal" in txt
    ev["h200"]["paged"]["result"]["permutation_bitwise"] = False
    assert "NOT bitwise equal" in T.cell_text(F.cell("paged_kv", "sm90", "fwd"), ev)


def test_sparse_bwd_predicate_matches_compile_only_census():
    d = json.loads((ROOT / "docs/results/features/compile_only_sm90a.json").read_text())
    seen = {r["case"]["head_dim"]: r["ok"] for r in d["results"] if r["case"]["kind"] == "sparse_bwd"}
    assert {200, 208, 224, 232, 240, 128, 256} <= set(seen)
    for hd, ok in seen.items():
        assert F.sm90_sparse_bwd_does_not_build(hd) == (not ok), hd
    dense = {r["case"]["head_dim"]: r["ok"] for r in d["results"] if r["case"]["kind"] == "dense_bwd"}
    assert dense and all(dense.values())          # the same head dims build without sparsity


@pytest.mark.fa4
def test_sparse_bwd_premise_is_fa4s_config():
    from fa4verify.kernels import adapter
    for hd in (200, 208, 224, 232, 240, 256):
        assert adapter.sm90_bwd_config(hd, sparse=True)["dKV_swapAB"] is False
        assert adapter.sm90_bwd_config(hd)["dKV_swapAB"] is True


def test_seqused_backward_cell_reads_its_h200_section():
    ev = T.load_evidence()
    c = F.cell("seqused", "sm90", "bwd")
    ev["h200"].pop("seqused_bwd", None)
    assert "H200: not run yet" in T.cell_text(c, ev)
    ev["h200"]["seqused_bwd"] = {"where": "measured on NVIDIA H200 (sm_90)", "result": {
        "rows": [{"causal": False, "dq": {}}, {"causal": True, "dq": {}}], "max_tightness": 0.5123,
        "all_within_budget": True, "errors": []}}
    txt = T.cell_text(c, ev)
    assert "measured on NVIDIA H200 (sm_90): seqused_k backward (causal and not) within budget, max tightness 0.512" in txt
    assert "compile-only: seqused_k, hd 128 compile" in txt
    ev["h200"]["seqused_bwd"]["result"]["all_within_budget"] = False
    assert "NOT within budget" in T.cell_text(c, ev)


def test_sm90_mla_cells_quote_fa4s_assertions():
    ev = T.load_evidence()
    fwd = T.cell_text(F.cell("mla", "sm90", "fwd"), ev)
    bwd = T.cell_text(F.cell("gather", "sm90", "bwd"), ev)
    assert "**not supported by FA4**" in fwd and 'FA4 asserts ("(head_dim, head_dim_v)=(64, 512)' in fwd
    assert 'FA4 asserts in the backward ("Unsupported compute capability. Supported: 10.x, 11.x")' in bwd
    assert bwd.count("FA4 asserts") == 1


def test_mods_h200_results_fill_the_score_mod_cells_fwd_and_bwd():
    """scripts/gpu/mods.sh's JSON makes both SM90 score_mod cells "measured on"; a built-in
    comparison that is not bitwise is said so; SM100 cells stay compile-only."""
    ev = T.load_evidence()
    v = {"status": "pass", "tightness": 0.5}
    ev["h200"]["mods"] = {"where": "measured on NVIDIA H200 (sm_90)", "result": {
        "pairs": ["alibi", "softcap"], "errors": [],
        "fwd": {"n_runs": 2, "max_tightness": 0.61, "all_within_budget": True},
        "bwd": {"n_runs": 2, "max_tightness": 0.72, "all_within_budget": False},
        "vs_builtin": {"softcap": {"bitwise": {"out": True, "lse": True, "dq": True, "dk": False, "dv": True},
                                   "builtin_within_budget": True}},
        "rows": [{"out": v}]}}
    fwd = T.cell_text(F.cell("score_mod", "sm90", "fwd"), ev)
    bwd = T.cell_text(F.cell("score_mod", "sm90", "bwd"), ev)
    assert "measured on NVIDIA H200 (sm_90): 2 mod-pair runs (alibi/softcap) within budget, max tightness 0.61" in fwd
    assert "softcap bitwise equal to the built-in" in fwd
    assert "NOT all within budget, max tightness 0.72" in bwd and "softcap differs from the built-in" in bwd
    assert "measured on" not in T.cell_text(F.cell("score_mod", "sm100", "bwd"), ev)
    n = len(__import__("fa4verify.mods", fromlist=["names"]).names())
    assert f"compile-only: {n}/{n} mod pairs" in T.cell_text(F.cell("score_mod", "sm100", "bwd"), ev)
