"""The two SM90 backward defects FA4's source predicts, measured on the H200 (issue 16 item 7;
``kernels/evidence/golden/bwd_predictions_h200.json``, scripts/gpu_predictions.py):

1. GQA/MQA backward at hd 8/16/40/48/72/80: dK and dV wrong as well as dQ; with MHA only dQ.
2. causal / local backward at hd 104/112: compiles (the non-causal one does not) and dQ is wrong.

The source-level predictor (``fa4_params.sm90_dq_accum_mismatch`` / ``sm90_dq_defect_predicted``)
and the narrow known-issue matchers must agree with every recorded row (CPU, recorded on H200)."""
from __future__ import annotations

import json

import pytest

from fa4verify import fuzz
from fa4verify.problem import AttentionProblem
from fa4verify.kernels import fa4_params, golden

REC = golden.golden_dir() / "bwd_predictions_h200.json"
LIMIT = 0.05     # recorded: right <= 2.8e-3, wrong >= 0.85


def _rows():
    return json.loads(REC.read_text())["rows"]


def _need_source():
    if fa4_params.sm90_dq_accum_mismatch(64, 64).get("mismatch") is None:
        pytest.skip("predictor needs FA4's installed source (flash-attn-4 not installed)")


def test_recording_names_the_gpu_and_release():
    d = json.loads(REC.read_text())
    assert d["where"] == "measured on NVIDIA H200 (sm_90)"
    assert d["versions"]["fa4"] == "4.0.0b36" and d["versions"]["compute_capability"] == "9.0"


def test_gqa_rows_agree_with_the_predictor():
    _need_source()
    n = 0
    for r in _rows():
        if r["study"] != "gqa_small_hd" or "error" in r:
            continue
        pred = fa4_params.sm90_dq_accum_mismatch(r["head_dim"], r["head_dim"])["mismatch"]
        gqa = r["nheads_kv"] < r["nheads"]
        assert (r["dq_rel_err"] > LIMIT) == pred, r
        assert (r["dk_rel_err"] > LIMIT) == (pred and gqa), r
        assert (r["dv_rel_err"] > LIMIT) == (pred and gqa), r
        n += 1
    assert n == 24


def test_masked_hd104_112_rows_agree_with_the_predictor():
    _need_source()
    for r in _rows():
        if r["study"] != "hd104_112_masked":
            continue
        local = r["window_size"] != [None, None]
        if "error" in r:     # only the non-causal, non-local backward fails to compile
            assert r["head_dim"] in (104, 112) and not r["causal"] and not local, r
            assert "failed to partition" in r["error"]
            continue
        pred = fa4_params.sm90_dq_defect_predicted(r["head_dim"], r["head_dim"], [r["seqlen"]],
                                                   causal=r["causal"], local=local)
        assert (r["dq_rel_err"] > LIMIT) == pred, r
        assert max(r["dk_rel_err"], r["dv_rel_err"]) < LIMIT, r


def _violation(q):
    return fuzz.Violation("bwd_budget", f"{q}: 100 / 100 elements exceed", {"quantity": q})


@pytest.mark.parametrize("hd, hk, q, expect", [
    (40, 1, "dk", True), (40, 2, "dv", True), (40, 4, "dk", False),      # MHA: dK/dV right
    (64, 1, "dk", False), (128, 1, "dv", False),                           # no mismatch at 64/128
    (40, 1, "dq", False),                                                  # dQ is the other issue
])
def test_gqa_known_issue_absorbs_only_the_violation_it_describes(hd, hk, q, expect):
    _need_source()
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=256, seqlen_k=256, nheads=4,
                         nheads_kv=hk, head_dim=hd, head_dim_v=hd)
    ki = fuzz.match_known_issue(p, _violation(q), target="production")
    assert (ki is not None and ki.name == "sm90_gqa_dkdv_accum_hdim_rounding") == expect, ki
    assert fuzz.match_known_issue(p, _violation(q), target="twin") is None or q == "dq"
    # never on the twin, never on SM100
    p100 = p.replace(arch="sm100")
    assert fuzz.match_known_issue(p100, _violation(q), target="production") is None
