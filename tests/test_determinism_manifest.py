"""Digest manifests: exact match, which tensor differs, and 'different environment'."""
from __future__ import annotations

import copy
import json

import pytest

from fa4verify import determinism as d

ENV = {"gpu": "NVIDIA H200", "compute_capability": "9.0", "driver": "580.1", "cuda": "13.0",
       "torch": "2.11.0", "fa4": "4.0.0b36", "dsl": "4.8.1", "python": "3.12.3"}


def _report(digests_by_key, inputs="in0"):
    cfgs = []
    for key, dg in digests_by_key.items():
        cfgs.append({"key": key, "name": key.split("|")[0], "status": "reproducible",
                     "config": {"name": key}, "digests": dict(dg), "inputs_digest": inputs,
                     "processes": [0, 1, 2], "devices": ["cuda:0"], "total_runs": 300})
    return {"configs": cfgs}


DG = {"a|full|s|bf16|seed0": {"dq": "1" * 64, "dk": "2" * 64, "dv": "3" * 64},
      "b|causal|s|bf16|seed1": {"dq": "4" * 64, "dk": "5" * 64, "dv": "6" * 64,
                                "dsink": "7" * 64}}


def test_identical_manifests_match():
    m = d.build_manifest(_report(DG), ENV)
    c = d.compare_manifests(m, copy.deepcopy(m))
    assert c["verdict"] == "match" and not c["failed"] and c["same_environment"]
    assert all(e["outcome"] == "match" for e in c["entries"])


def test_one_changed_digest_is_a_mismatch_naming_the_tensor():
    ref = d.build_manifest(_report(DG), ENV)
    dg2 = copy.deepcopy(DG)
    dg2["b|causal|s|bf16|seed1"]["dsink"] = "8" * 64
    cur = d.build_manifest(_report(dg2), ENV)
    c = d.compare_manifests(cur, ref)
    assert c["verdict"] == "mismatch" and c["failed"]
    bad = [e for e in c["entries"] if e["outcome"] == "mismatch"]
    assert bad == [{"key": "b|causal|s|bf16|seed1", "outcome": "mismatch", "tensors": ["dsink"]}]


def test_different_environment_is_reported_not_failed_unless_strict():
    ref = d.build_manifest(_report(DG), ENV)
    dg2 = copy.deepcopy(DG)
    dg2["a|full|s|bf16|seed0"]["dq"] = "9" * 64
    cur = d.build_manifest(_report(dg2), dict(ENV, driver="590.2"))
    c = d.compare_manifests(cur, ref)
    assert c["verdict"] == "different-environment" and not c["failed"]
    assert c["environment_diff"] == {"driver": ["590.2", "580.1"]}
    outcomes = {e["key"]: e["outcome"] for e in c["entries"]}
    assert outcomes == {"a|full|s|bf16|seed0": "different-environment",
                        "b|causal|s|bf16|seed1": "match"}
    s = d.compare_manifests(cur, ref, strict_env=True)
    assert s["verdict"] == "mismatch" and s["failed"]


def test_non_key_environment_fields_do_not_change_the_key():
    ref = d.build_manifest(_report(DG), ENV)
    cur = d.build_manifest(_report(DG), dict(ENV, python="3.11.0", hostname="x"))
    assert d.compare_manifests(cur, ref)["same_environment"]


def test_inputs_digest_difference_is_not_compared_as_outputs():
    ref = d.build_manifest(_report(DG, inputs="A"), ENV)
    cur = d.build_manifest(_report(DG, inputs="B"), ENV)
    c = d.compare_manifests(cur, ref)
    assert {e["outcome"] for e in c["entries"]} == {"inputs-differ"}
    assert not c["failed"] and c["verdict"] == "nothing-compared"


def test_entries_on_one_side_only_are_listed():
    ref = d.build_manifest(_report({k: v for k, v in DG.items() if k.startswith("a")}), ENV)
    cur = d.build_manifest(_report({k: v for k, v in DG.items() if k.startswith("b")}), ENV)
    c = d.compare_manifests(cur, ref)
    assert sorted(e["outcome"] for e in c["entries"]) == ["only-current", "only-reference"]
    assert not c["failed"]


def test_only_reproducible_configs_enter_the_manifest():
    r = _report(DG)
    r["configs"][1]["status"] = "not-reproducible"
    m = d.build_manifest(r, ENV)
    assert list(m["entries"]) == ["a|full|s|bf16|seed0"]


def test_manifest_round_trips_through_json_and_bad_files_are_rejected(tmp_path):
    m = d.build_manifest(_report(DG), ENV, provenance={"where": "CPU"})
    p = tmp_path / "m.json"
    p.write_text(json.dumps(m))
    assert d.load_manifest(str(p)) == m
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        d.load_manifest(str(tmp_path / "bad.json"))
    (tmp_path / "other.json").write_text(json.dumps({"schema": "x"}))
    with pytest.raises(ValueError, match="not a determinism manifest"):
        d.load_manifest(str(tmp_path / "other.json"))
    with pytest.raises(ValueError, match="cannot read"):
        d.load_manifest(str(tmp_path / "missing.json"))
