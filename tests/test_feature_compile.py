"""fa4verify.feature_compile: case parsing, and one compile-only run on the CPU that records an
FA4 refusal and a compiler abort as results (not as a crash of the runner)."""
from __future__ import annotations

import importlib.util

import pytest

from fa4verify.feature_compile import FeatureCase, main, parse_cases, run


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
