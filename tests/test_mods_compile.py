"""Compile-only (issue 16 item 1): the CuTe functions of the mod pairs build inside FA4's forward
and backward for sm_90a and sm_100a on the CPU (FakeTensorMode, ``fa4verify.compile.features``);
the recorded census (``docs/results/features/compile_only_*.json``, read by the README table)
covers every registered pair in both directions."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from fa4verify import mods
from fa4verify.compile.features import FeatureCase, merge, parse_cases, run

ROOT = Path(__file__).resolve().parents[1]


def test_mod_cases_parse_and_unknown_pairs_are_refused():
    assert parse_cases("mod_fwd:alibi,mod_bwd:document") == [FeatureCase("mod_fwd", mod="alibi"),
                                                              FeatureCase("mod_bwd", mod="document")]
    assert FeatureCase("mod_bwd", mod="softcap").label() == "mod_bwd-hd128-softcap"
    with pytest.raises(ValueError, match="unknown mod pair 'nope'"):
        parse_cases("mod_fwd:nope")
    with pytest.raises(ValueError, match="needs a mod pair name"):
        FeatureCase("mod_fwd")


def test_merge_replaces_same_labels_and_keeps_the_rest():
    old = {"arch": "sm_90a", "wall_seconds": 1.0, "results": [{"label": "a", "ok": True}, {"label": "b", "ok": False}]}
    new = {"arch": "sm_90a", "wall_seconds": 2.0, "results": [{"label": "b", "ok": True}, {"label": "c", "ok": True}]}
    m = merge(old, new)
    assert [(r["label"], r["ok"]) for r in m["results"]] == [("a", True), ("b", True), ("c", True)]
    assert [(r["labels"], r["wall_seconds"]) for r in m["merged_runs"]] == [(["b", "c"], 2.0)]
    with pytest.raises(ValueError, match="sm_90a.*sm_100a"):
        merge(old, dict(new, arch="sm_100a"))


@pytest.mark.parametrize("arch", ["sm90a", "sm100a"])
def test_recorded_compile_census_covers_every_pair_both_directions(arch):
    d = json.loads((ROOT / f"docs/results/features/compile_only_{arch}.json").read_text())
    got = {(r["case"]["kind"], r["case"].get("mod")): r["ok"] for r in d["results"]
           if r["case"]["kind"] in ("mod_fwd", "mod_bwd")}
    want = {(k, n) for n in mods.names() for k in ("mod_fwd", "mod_bwd")}
    assert want <= set(got), sorted(want - set(got))
    assert all(r["where"] == "compile-only" for r in d["results"])


@pytest.mark.fa4
@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_aux_tensor_score_and_mask_mods_build_in_fa4_fwd_and_bwd(arch, tmp_path):
    out = run(arch, parse_cases("mod_fwd:rel_bias,mod_bwd:rel_bias,mod_bwd:document"), workdir=tmp_path)
    by = {r["label"]: r for r in out["results"]}
    assert all(r["ok"] for r in by.values()), {k: r["error"] for k, r in by.items()}
    fwd = by["mod_fwd-hd128-rel_bias"]
    assert fwd["config"]["compile_key"]["score_mod_hash"] and fwd["config"]["extra"]["aux_tensors"] == 1
    assert any(k.startswith("FlashAttentionForward") for k in fwd["kernels"])
    assert any(k.startswith("FlashAttentionBackward") for k in by["mod_bwd-hd128-document"]["kernels"])
