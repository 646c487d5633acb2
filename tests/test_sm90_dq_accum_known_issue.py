"""The SM90 dQ-accumulator head-dim rounding defect of flash-attn-4 4.0.0b36.

Measured on the H200 (kernels/evidence/golden/hd_sweep_h200.json, scripts/gpu_hd_sweep.py): production
dQ is wrong (relative error ~1) at some head dims while dK and dV are right.  fa4verify predicts
the affected head dims from the installed FA4 source (``fa4_params.sm90_dq_accum_mismatch``) and
labels fuzz violations there as the known issue ``sm90_dq_accum_hdim_rounding``.  These tests tie
the predictor to the GPU measurement and check that the matcher fires only where it applies.
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from fa4verify import fuzz
from fa4verify.fuzz import Violation
from fa4verify.kernels import fa4_params
from fa4verify.kernels.evidence import evidence_path
from fa4verify.problem import AttentionProblem

SWEEP = evidence_path("golden/hd_sweep_h200.json")
SWEEP_SQ = evidence_path("golden/hd_sweep_seqlens_h200.json")


def _pred_or_skip(hd: int, causal: bool = False) -> dict:
    p = fa4_params.sm90_dq_accum_mismatch(hd, hd, causal=causal)
    if p["mismatch"] is None:
        pytest.skip(f"cannot predict without FA4's source/tile function: {p['reason']}")
    return p


def test_recorded_sweep_is_h200_measurement_with_versions():
    d = json.loads(SWEEP.read_text())
    assert d["where"].startswith("measured on") and "H200" in d["where"]
    assert d["versions"]["fa4"] == "4.0.0b36" and d["versions"]["compute_capability"] == "9.0"
    hds = [r["head_dim"] for r in d["sweeps"][0]["rows"]]
    assert hds == list(range(8, 257, 8)), "the non-causal sweep covers every SM90 head dim"


@pytest.mark.parametrize("sweep_idx", [0, 1], ids=["full", "causal"])
def test_predictor_matches_every_head_dim_measured_on_h200(sweep_idx):
    d = json.loads(SWEEP.read_text())
    sw = d["sweeps"][sweep_idx]
    ran = [r for r in sw["rows"] if "error" not in r]
    assert len(ran) >= 8
    mismatches = []
    for r in ran:
        broken = r["dq_rel_err"] > 0.05
        # dK and dV are right everywhere: the defect is confined to the dQ accumulator
        assert r["dk_rel_err"] < 0.01 and r["dv_rel_err"] < 0.01, r
        pred = _pred_or_skip(r["head_dim"], causal=sw["causal"])["mismatch"]
        if pred != broken:
            mismatches.append((r["head_dim"], pred, r["dq_rel_err"]))
    assert not mismatches, f"predicted vs measured disagree at (hd, predicted, dq_rel_err): {mismatches}"


def test_measured_broken_set_is_not_trivial():
    """Guards the test above from passing vacuously (all-broken or none-broken data)."""
    d = json.loads(SWEEP.read_text())
    rows = [r for r in d["sweeps"][0]["rows"] if "error" not in r]
    broken = {r["head_dim"] for r in rows if r["dq_rel_err"] > 0.05}
    assert broken == {8, 16, 40, 48, 72, 80}
    assert {r["head_dim"] for r in d["sweeps"][0]["rows"] if "error" in r} == {104, 112}


def test_row_rule_matches_the_seqlen_sweep_measured_on_h200():
    """dQ is right for seqlen_q <= 64 and wrong above, at both swept head dims: the predictor
    with the measured row rule must reproduce every row of the seqlen sweep."""
    d = json.loads(SWEEP_SQ.read_text())
    rows = d["sweeps"][0]["rows"]
    assert {r["head_dim"] for r in rows} == {8, 40} and "H200" in d["where"]
    assert {r["seqlen_q"] for r in rows} >= {1, 64, 65, 193}
    _pred_or_skip(8)
    wrong = []
    for r in rows:
        broken = r["dq_rel_err"] > 0.05
        assert r["dk_rel_err"] < 0.01 and r["dv_rel_err"] < 0.01, r
        pred = fa4_params.sm90_dq_defect_predicted(r["head_dim"], r["head_dim"], [r["seqlen_q"]])
        if pred != broken:
            wrong.append((r["head_dim"], r["seqlen_q"], pred, r["dq_rel_err"]))
    assert not wrong, f"(hd, seqlen_q, predicted, dq_rel_err) disagreeing: {wrong}"
    # both outcomes occur in the data, so the comparison above is not vacuous
    assert any(r["dq_rel_err"] > 0.05 for r in rows) and any(r["dq_rel_err"] < 0.01 for r in rows)


def test_defect_predictor_row_and_varlen_rules():
    _pred_or_skip(8)
    P = fa4_params.sm90_dq_defect_predicted
    assert P(8, 8, [64]) is False and P(8, 8, [65]) is True
    assert P(64, 64, [4096]) is False                      # no rounding mismatch at hd 64
    assert P(8, 8, [10, 0, 3], varlen=True) is True        # a later sequence's offset is mis-scaled
    assert P(8, 8, [10, 0, 0], varlen=True) is False


def test_predictor_reports_a_changed_fa4_source(tmp_path, monkeypatch):
    d = tmp_path / "cute"
    d.mkdir()
    (d / "flash_bwd_sm90.py").write_text("hdim_multiple_of = 32  # refactored\n")
    (d / "interface.py").write_text("hdim_multiple_of = 32\n")
    monkeypatch.setattr(fa4_params, "fa4_source_dir", lambda: d)
    fa4_params.sm90_dq_accum_roundings.cache_clear()
    try:
        r = fa4_params.sm90_dq_accum_mismatch(8, 8)
    finally:
        fa4_params.sm90_dq_accum_roundings.cache_clear()
    assert r["mismatch"] is None and "pattern is not in this FA4 release" in r["reason"]


def test_predictor_without_fa4(monkeypatch):
    monkeypatch.setattr(fa4_params, "fa4_source_dir", lambda: None)
    fa4_params.sm90_dq_accum_roundings.cache_clear()
    try:
        r = fa4_params.sm90_dq_accum_mismatch(8, 8)
    finally:
        fa4_params.sm90_dq_accum_roundings.cache_clear()
    assert r["mismatch"] is None and "not installed" in r["reason"]


def _problem(hd, arch="sm90", sq=144):
    return AttentionProblem(arch, "bf16", 1, sq, sq, 1, 1, hd, hd, causal=True)


def _v(prop, quantity):
    return Violation(prop, f"{quantity}: 10 / 512 elements exceed ...", {"quantity": quantity})


def test_known_issue_matches_only_dq_on_production_sm90_at_predicted_head_dims():
    _pred_or_skip(8)
    p8, p64 = _problem(8), _problem(64)
    a = {}  # the matcher needs no arrays
    ki = fuzz.match_known_issue(p8, _v("bwd_budget", "dq"), a, target="production")
    assert ki is not None and ki.name == "sm90_dq_accum_hdim_rounding"
    assert fuzz.match_known_issue(p8, _v("bwd_budget", "dk"), a, target="production") is None
    assert fuzz.match_known_issue(p8, _v("fwd_budget", "out"), a, target="production") is None
    assert fuzz.match_known_issue(p64, _v("bwd_budget", "dq"), a, target="production") is None
    # within the first 64 rows dQ is right on the H200: a dQ violation there is not this issue
    assert fuzz.match_known_issue(_problem(8, sq=64), _v("bwd_budget", "dq"), a, target="production") is None
    # the twin models the algorithm, not this defect: a twin dQ violation at hd 8 stays a failure
    assert fuzz.match_known_issue(p8, _v("bwd_budget", "dq"), a, target="twin") is None
    assert fuzz.match_known_issue(_problem(8, "sm100"), _v("bwd_budget", "dq"), a, target="production") is None


def test_compile_failure_known_issue_is_narrow():
    a = {}
    msg = "MLIRError: Operation creation failed: failed to partition `input` '(112,80)' with `tiled_mma`"
    plain = AttentionProblem("sm90", "bf16", 1, 144, 144, 1, 1, 104, 104)
    ki = fuzz.match_known_issue(plain, Violation("runs", msg), a, target="production")
    assert ki is not None and ki.name == "sm90_bwd_hd104_112_compile"
    assert fuzz.match_known_issue(dataclasses.replace(plain, head_dim=96, head_dim_v=96), Violation("runs", msg), a,
                                  target="production") is None
    assert fuzz.match_known_issue(plain, Violation("runs", "RuntimeError: CUDA error"), a,
                                  target="production") is None
    assert fuzz.match_known_issue(plain, Violation("runs", msg), a, target="twin") is None
    # measured without causal or window only (tile m 80): a causal or local call builds at hd 104
    # today (tile m 64), so the same message there is another failure (red-team round 12)
    for other in (dict(causal=True), dict(window_size=(32, None)), dict(window_size=(None, 0))):
        assert fuzz.match_known_issue(dataclasses.replace(plain, **other), Violation("runs", msg), a,
                                      target="production") is None, other


def test_a_moved_rounding_moves_the_prediction_not_what_is_absorbed(tmp_path, monkeypatch):
    """Red-team round 12's F1 (sm90_bwd_accum_round64_widened): the accumulator rounded to 64 in
    interface.py. The source predictor follows it to hd 96 and says ``moved``; the known issue
    still absorbs only where the pinned 4.0.0b36 roundings predict the defect (Note [Pinned roundings])."""
    _pred_or_skip(8)
    src = fa4_params.fa4_source_dir()
    d = tmp_path / "cute"
    d.mkdir()
    (d / "flash_bwd_sm90.py").write_text((src / "flash_bwd_sm90.py").read_text())
    intf = (src / "interface.py").read_text()
    old = "hdim_multiple_of = 64 if arch // 10 == 9 and dKV_swapAB else 32"
    assert intf.count(old) == 1
    (d / "interface.py").write_text(intf.replace(old, old[:-2] + "64"))
    monkeypatch.setattr(fa4_params, "fa4_source_dir", lambda: d)
    fa4_params.sm90_dq_accum_roundings.cache_clear()
    try:
        r96 = fa4_params.sm90_dq_accum_mismatch(96, 96)
        assert r96["mismatch"] is True and r96["pinned_mismatch"] is False and r96["moved"] is True
        assert fa4_params.sm90_dq_defect_predicted(96, 96, [144]) is True
        assert fa4_params.sm90_dq_defect_predicted(96, 96, [144], pinned=True) is False
        a = {}
        assert fuzz.match_known_issue(_problem(96), _v("bwd_budget", "dq"), a, target="production") is None
        gqa = AttentionProblem("sm90", "bf16", 1, 144, 144, 4, 2, 96, 96)
        assert fuzz.match_known_issue(gqa, _v("bwd_budget", "dk"), a, target="production") is None
        # where both predict the defect it is still absorbed
        ki = fuzz.match_known_issue(_problem(8), _v("bwd_budget", "dq"), a, target="production")
        assert ki is not None and ki.name == "sm90_dq_accum_hdim_rounding"
        assert fa4_params.sm90_dq_accum_mismatch(8, 8)["moved"] is False
    finally:
        fa4_params.sm90_dq_accum_roundings.cache_clear()


def test_the_pinned_roundings_are_the_installed_release_s():
    """The pinned pair is 4.0.0b36's: on the pinned release the source and the pin agree everywhere."""
    r = fa4_params.sm90_dq_accum_roundings()
    if "error" in r:
        pytest.skip(f"no FA4 source: {r['error']}")
    from fa4verify.kernels.facts import dist_version
    if dist_version("flash-attn-4") != "4.0.0b36":
        pytest.skip(f"another FA4 release is installed ({dist_version('flash-attn-4')})")
    assert (r["main"], r["accum"]) == (fa4_params.SM90_DQ_ACCUM_ROUNDINGS_PINNED["main"],
                                       fa4_params.SM90_DQ_ACCUM_ROUNDINGS_PINNED["accum"])


def _varlen_problem(lens_q, lens_k, hd=8):
    return AttentionProblem("sm90", "bf16", len(lens_q), max(lens_q), max(lens_k), 1, 1, hd, hd,
                            seqlens_q=tuple(lens_q), seqlens_k=tuple(lens_k))


def _v_at(tokens):
    v = _v("bwd_budget", "dq")
    v.over_indices = np.array([(t, 0, 0) for t in tokens])
    return v


def test_varlen_rows_of_later_sequences_are_the_issue_but_early_rows_of_the_first_are_not():
    """The H200 case of session 5 (q lens [65, 1] at hd 8: dQ wrong at token 64 = row 64 of
    sequence 0, and token 65 = row 0 of sequence 1) is absorbed; a dQ violation in the first
    64 rows of the first sequence is not."""
    _pred_or_skip(8)
    p = _varlen_problem((65, 1), (15, 191))
    ki = fuzz.match_known_issue(p, _v_at([64, 65]), {}, target="production")
    assert ki is not None and ki.name == "sm90_dq_accum_hdim_rounding"
    assert fuzz.match_known_issue(p, _v_at([3, 64]), {}, target="production") is None
    assert fuzz.match_known_issue(_varlen_problem((65, 1), (15, 191), hd=64), _v_at([64, 65]), {},
                                  target="production") is None


def test_batched_q_calls_absorb_only_rows_past_the_good_ones_of_each_entry():
    """seqused_q / q_batched pass no cu_seqlens_q: FA4's dQ accumulator is batched, so a later
    batch entry's early rows are not the packed-offset defect (found in review: the packed rule
    absorbed a real dQ error at sequence 1, row 1)."""
    _pred_or_skip(8)
    from fa4verify.problem import CallForm
    p = _varlen_problem((70, 66), (15, 15)).replace(call=CallForm(seqused_q=True, q_capacity=72))
    assert fuzz.match_known_issue(p, _v_at([71]), {}, target="production") is None     # entry 1, row 1
    ki = fuzz.match_known_issue(p, _v_at([64, 70 + 64]), {}, target="production")    # row 64 of each
    assert ki is not None and ki.name == "sm90_dq_accum_hdim_rounding"
    packed = _varlen_problem((70, 66), (15, 15))
    assert fuzz.match_known_issue(packed, _v_at([71]), {}, target="production") is not None
    short = _varlen_problem((10, 5), (15, 15)).replace(call=CallForm(seqused_q=True, q_capacity=12))
    assert fuzz.match_known_issue(short, _v_at([11]), {}, target="production") is None   # nothing predicted
