"""fa4verify.compile.features: case parsing, and one compile-only run on the CPU that records an
FA4 refusal and a compiler abort as results (not as a crash of the runner)."""
from __future__ import annotations


import pytest

from fa4verify.compile.features import FeatureCase, main, parse_cases, run


def test_parse_cases():
    cs = parse_cases("split_kv:8,paged:16,sparse_bwd:208,combine")
    assert cs == [FeatureCase("split_kv", num_splits=8), FeatureCase("paged", page_size=16),
                  FeatureCase("sparse_bwd", head_dim=208), FeatureCase("combine")]
    for bad in ("", "nope", "paged:0", "paged:x"):
        with pytest.raises(ValueError):
            parse_cases(bad)


def test_bad_cases_exit_2(capsys):
    assert main(["--arch", "sm_90a", "--cases", "bogus"]) == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.fa4
@pytest.mark.slow
def test_sm90_refusal_and_compiler_abort_are_recorded(tmp_path):
    out = run("sm_90a", parse_cases("split_kv:2,sparse_bwd:208,combine"), workdir=tmp_path)
    by = {r["label"]: r for r in out["results"]}
    assert out["where"] == "compile-only" and len(by) == 3
    assert not by["split_kv-hd128-s2"]["ok"] and "SplitKV not supported on SM 9.0" in by["split_kv-hd128-s2"]["error"]
    assert by["sparse_bwd-hd208"].get("aborted") is True and "epilogue_dKV" in by["sparse_bwd-hd208"]["error"]
    assert by["combine-hd128-s4"]["ok"] and by["combine-hd128-s4"]["kernels"] == ["FlashAttentionForwardCombine"]


def test_parse_mla_gather_fp8_seqused_cases():
    cs = parse_cases("mla_fwd,gather_fwd:64,gather_bwd,gather_bwd_rp,fp8_fwd,seqused_fwd:64,seqused_bwd")
    assert [c.label() for c in cs] == ["mla_fwd-hd64v512-h16", "gather_fwd-hd64v512-h64",
                                       "gather_bwd-hd64v512-h128", "gather_bwd_rp-hd64v512-h64",
                                       "fp8_fwd-hd128", "seqused_fwd-hd64", "seqused_bwd-hd128"]
    assert all(c.head_dim == 64 for c in cs[:4])


def _census(arch):
    import json
    from pathlib import Path
    p = Path(__file__).resolve().parents[1] / "docs" / "results" / "features" / f"compile_only_{arch}.json"
    return json.loads(p.read_text())


@pytest.mark.parametrize("arch", ["sm90a", "sm100a"])
def test_recorded_census_names_cases_feature_compile_knows(arch):
    """Every entry of the recorded compile-only census is a case this module can rebuild: its kind
    is in KINDS and its label is the label of FeatureCase(**case) (so the table reads real cases)."""
    d = _census(arch)
    assert d["where"] == "compile-only" and d["arch"] == f"sm_{arch[2:]}"
    labels = [r["label"] for r in d["results"]]
    assert len(labels) == len(set(labels)), "duplicate labels"
    for r in d["results"]:
        assert FeatureCase(**r["case"]).label() == r["label"]
        assert r["ok"] == (r["error"] is None), r["label"]


def test_census_covers_issue16_items_5_and_6():
    """The SM100 census holds MLA, gather (forward, both backward modes), fp8 + descale and
    seqused_k; the SM90 census records FA4's refusal of MLA, gather and fp8 as assertions."""
    kinds100 = {r["case"]["kind"]: r for r in _census("sm100a")["results"]}
    for k in ("mla_fwd", "gather_fwd", "gather_bwd", "gather_bwd_rp", "fp8_fwd", "seqused_fwd", "seqused_bwd",
              "sparse_bwd"):
        assert k in kinds100 and kinds100[k]["ok"], k
    assert kinds100["mla_fwd"]["config"]["softmax_scale"] == 1 / 24
    assert kinds100["fp8_fwd"]["shapes"]["out_dtype"] == "torch.bfloat16"
    rows90 = {r["case"]["kind"]: r for r in _census("sm90a")["results"]}
    for k, msg in (("mla_fwd", "(64, 512) is not supported on SM90"), ("gather_fwd", "(64, 512) is not supported on SM90"),
                   ("gather_bwd", "Unsupported compute capability. Supported: 10.x, 11.x"),
                   ("gather_bwd_rp", "Unsupported compute capability. Supported: 10.x, 11.x"),
                   ("fp8_fwd", "FP8 is only supported on SM100")):
        assert not rows90[k]["ok"] and "AssertionError" in rows90[k]["error"] and msg in rows90[k]["error"], k
    assert rows90["seqused_fwd"]["ok"] and rows90["seqused_bwd"]["ok"]


def test_merge_replaces_same_label_and_keeps_the_rest():
    from fa4verify.compile.features import merge
    old = {"arch": "sm_90a", "results": [{"label": "a", "ok": False}, {"label": "b", "ok": True}]}
    new = {"arch": "sm_90a", "wall_seconds": 1.0, "results": [{"label": "a", "ok": True}, {"label": "c", "ok": True}]}
    m = merge(old, new)
    assert [(r["label"], r["ok"]) for r in m["results"]] == [("a", True), ("b", True), ("c", True)]
    assert m["merged_runs"] == [{"labels": ["a", "c"], "wall_seconds": 1.0}]
    with pytest.raises(ValueError):
        merge(old, {**new, "arch": "sm_100a"})


@pytest.mark.fa4
@pytest.mark.slow
def test_mla_forward_compiles_for_sm100a_and_fa4_asserts_on_sm90a(tmp_path):
    a = run("sm_100a", parse_cases("mla_fwd"), workdir=tmp_path / "a")["results"][0]
    assert a["ok"], a["error"]
    assert a["kernels"] == ["FlashAttentionMLAForwardSm100"] and a["shapes"]["lse"] == [2, 128, 16]
    b = run("sm_90a", parse_cases("mla_fwd"), workdir=tmp_path / "b")["results"][0]
    assert not b["ok"] and "(64, 512) is not supported on SM90" in b["error"]


@pytest.mark.fa4
@pytest.mark.slow(extended="the sparse MLA backward and fp8 forward compiles for sm_100a (~2-4 min)")
def test_sparse_mla_backward_and_fp8_descale_compile_for_sm100a(tmp_path):
    out = run("sm_100a", parse_cases("gather_bwd_rp,fp8_fwd"), workdir=tmp_path)
    by = {r["label"]: r for r in out["results"]}
    g = by["gather_bwd_rp-hd64v512-h64"]
    assert g["ok"], g["error"]
    assert "FlashAttentionSparseMLABackwardSm100" in g["kernels"]
    assert g["config"]["backward"]["extra"]["recompute_p"] is True and g["shapes"]["p"] is None
    f = by["fp8_fwd-hd128"]
    assert f["ok"], f["error"]
    assert f["config"]["entry"] == "_flash_attn_fwd" and f["config"]["extra"]["q_descale"] is True


def test_bad_merge_file_exits_2_before_compiling(tmp_path, capsys):
    assert main(["--arch", "sm_90a", "--cases", "mla_fwd", "--merge", str(tmp_path / "missing.json")]) == 2
    other = tmp_path / "other.json"
    other.write_text('{"arch": "sm_100a", "results": []}')
    assert main(["--arch", "sm_90a", "--cases", "mla_fwd", "--merge", str(other)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 2 and "Traceback" not in err
