"""``production.head_dims``: the recorded H200 head-dim sweep of FA4's SM90 backward.

It must FAIL on the recorded flash-attn-4 4.0.0b36 data (a real FA4 defect), pass on a sweep
where dQ is as accurate as dK/dV, refuse to apply a recording made with another FA4 version, and
report an error when the source-level predictor and the recording disagree."""
from __future__ import annotations

import json

import pytest

from fa4verify.audit.environment import dist_version
from fa4verify.audit.registry import CheckContext, SkipCheck
from fa4verify.checks import production
from fa4verify.kernels import fa4_params, golden

REC = golden.golden_dir() / "hd_sweep_h200.json"


@pytest.fixture()
def ctx():
    return CheckContext(profile="default", check_id="production.head_dims")


def _good_sweep(version):
    rows = [{"head_dim": hd, "dq_rel_err": 2.4e-3, "dk_rel_err": 2.3e-3, "dv_rel_err": 2.3e-3}
            for hd in (24, 32, 64, 128)]
    return {"versions": {"fa4": version, "gpu": "NVIDIA H200", "compute_capability": "9.0"},
            "sweeps": [{"causal": False, "seqlen": 256, "rows": rows}]}


def _use(tmp_path, monkeypatch, data):
    (tmp_path / "hd_sweep_h200.json").write_text(json.dumps(data))
    monkeypatch.setattr(golden, "golden_dir", lambda: tmp_path)


def test_fails_on_the_recorded_h200_sweep(ctx):
    if not REC.exists():
        pytest.skip("hd_sweep_h200.json not recorded")
    if dist_version("flash-attn-4") not in (None, "4.0.0b36"):
        pytest.skip("the recording is for flash-attn-4 4.0.0b36")
    r = production.head_dims(ctx)
    assert r.status == "fail" and r.where == "recorded on NVIDIA H200 (sm_90)"
    assert "[8, 16, 40, 48, 72, 80]" in r.summary and "[104, 112]" in r.summary
    assert r.metrics["dq_wrong"] > 0 and r.metrics["raised"] == 2


def test_passes_when_dq_is_as_accurate_as_dk_dv(ctx, tmp_path, monkeypatch):
    _use(tmp_path, monkeypatch, _good_sweep(dist_version("flash-attn-4")))
    r = production.head_dims(ctx)
    assert r.status == "pass", r.summary
    assert r.metrics["dq_wrong"] == 0 and r.tightness < 1


def test_recording_for_another_fa4_version_is_not_applied(ctx, tmp_path, monkeypatch):
    if dist_version("flash-attn-4") is None:
        pytest.skip("flash-attn-4 not installed: no version to compare")
    _use(tmp_path, monkeypatch, _good_sweep("0.0.1"))
    with pytest.raises(SkipCheck, match="recorded with flash-attn-4 0.0.1"):
        production.head_dims(ctx)


def test_predictor_disagreement_is_reported(ctx, tmp_path, monkeypatch):
    if fa4_params.sm90_dq_accum_mismatch(64, 64)["mismatch"] is None:
        pytest.skip("predictor unavailable without FA4's source")
    d = _good_sweep(dist_version("flash-attn-4"))
    d["sweeps"][0]["rows"][2]["dq_rel_err"] = 0.9   # hd 64 "wrong": the predictor says it is fine
    _use(tmp_path, monkeypatch, d)
    r = production.head_dims(ctx)                   # a wrong dQ fails whatever the predictor says
    assert r.status == "fail" and "predictor disagrees at ['hd64 sq256']" in r.summary
    d = _good_sweep(dist_version("flash-attn-4"))
    d["sweeps"][0]["rows"].append({"head_dim": 8, "dq_rel_err": 2.4e-3, "dk_rel_err": 2.3e-3,
                                   "dv_rel_err": 2.3e-3})   # predicted wrong, measured right
    _use(tmp_path, monkeypatch, d)
    r = production.head_dims(ctx)
    assert r.status == "error" and "predictor expects a wrong dQ at ['hd8 sq256']" in r.summary


def test_live_sweep_plumbing_with_a_stand_in_adapter():
    """fa4verify.hd_sweep.measure/summarize on the CPU: an adapter whose dQ is exact passes, one
    whose dQ is permuted across rows (what the FA4 defect does) is flagged, one where FA4 raises
    (a flash_attn frame) is recorded as raised, and one where the call fails outside FA4 is
    fa4verify's error (Note [Blame]), never "the backward raises"."""
    pytest.importorskip("torch")
    from types import SimpleNamespace

    from fa4verify import hd_sweep
    fa4: dict = {}
    exec(compile("def bwd():\n    raise RuntimeError('failed to partition')\n",
                 "/site-packages/flash_attn/cute/interface.py", "exec"), fa4)

    def make(kind):
        def forward(q, k, v, *, causal=False, return_lse=True):
            return SimpleNamespace(out=None, lse=None)

        def backward(q, k, v, out, do, lse, *, causal=False, deterministic=True):
            if kind == "raise":
                fa4["bwd"]()
            if kind == "own":
                raise TypeError("_flash_attn_bwd() got an unexpected keyword argument 'learnable_sink'")
            dq, dk, dv = hd_sweep.reference_grads(q, k, v, do, q.shape[-1] ** -0.5, causal)
            if kind == "rows":
                dq = dq.roll(64, dims=1)
            return SimpleNamespace(dq=dq.to(q.dtype), dk=dk.to(q.dtype), dv=dv.to(q.dtype))
        return SimpleNamespace(forward=forward, backward=backward)

    rows = [hd_sweep.measure(make(kind), 16, 256, 256, device="cpu") for kind in ("ok", "rows", "raise", "own")]
    sm = hd_sweep.summarize(rows)
    assert [t[1] for t in sm["table"]] == ["ok", "wrong dQ", "raised", "fa4verify error"]
    assert hd_sweep.dq_ratio(rows[0]) < 1 < hd_sweep.dq_ratio(rows[1])
    # only fa4verify's error: the check is an error, and it does not blame FA4
    r = production._head_dim_result([rows[0], rows[3]], "CPU", "4.0.0b25")
    assert r.status == "error" and "fa4verify's own call failed" in r.summary
    assert "backward raises" not in r.summary and "FA4 4.0.0b25" not in r.summary


# ------------------------------------------------------------- evidence scoped to what it describes
def test_recording_does_not_apply_to_an_sm100_fp8_audit():
    ctx = CheckContext(profile="default", check_id="production.head_dims", dtype="fp8", archs=("sm100",))
    with pytest.raises(SkipCheck, match="not applicable: hd_sweep_h200.json describes sm90"):
        production.head_dims(ctx)


def test_recording_does_not_apply_to_an_fp16_audit():
    ctx = CheckContext(profile="default", check_id="production.head_dims", dtype="fp16", archs=("sm90",))
    with pytest.raises(SkipCheck, match="recorded for bf16; this audit is fp16"):
        production.head_dims(ctx)


def test_recording_does_not_apply_on_another_gpu_family(monkeypatch):
    from fa4verify.kernels import device
    monkeypatch.setattr(CheckContext, "gpu", property(lambda self: device.GPU("NVIDIA B200", 10, 0)))
    ctx = CheckContext(profile="default", check_id="production.head_dims", archs=("sm90", "sm100"), device="cuda")
    with pytest.raises(SkipCheck, match="this audit runs on NVIDIA B200 \\(sm_100\\)"):
        production.head_dims(ctx)


def test_recording_without_fa4_installed_reports_instead_of_failing(monkeypatch):
    from fa4verify.kernels import facts
    monkeypatch.setattr(facts, "dist_version", lambda d: None if d == "flash-attn-4" else "1")
    ctx = CheckContext(profile="default", check_id="production.head_dims", archs=("sm90",))
    with pytest.raises(SkipCheck, match="not applicable: FA4 not installed"):
        production.head_dims(ctx)


@pytest.mark.parametrize("name", ["llama3-8b", "hd256", "small-hd", "hd256-full"])
def test_deployment_scopes_the_recorded_finding(name):
    """The recorded dQ finding (hd 8/16/40/48/72/80) applies to a deployment that ships one of
    those head dims; a deployment whose shapes the sweep never ran (hd 128 causal, hd 256 causal
    or windowed) gets "not applicable"; one whose shapes were recorded right passes."""
    if dist_version("flash-attn-4") not in (None, "4.0.0b36") or not REC.exists():
        pytest.skip("the recording is for flash-attn-4 4.0.0b36")
    from fa4verify.deployment import Deployment, load
    dep = (Deployment.from_mapping({"name": "hd256-full", "head_dims": [256], "masks": ["none"]})
           if name == "hd256-full" else load(name))
    ctx = CheckContext(profile="default", check_id="production.head_dims", archs=("sm90",),
                       deployment=dep.to_dict())
    if name in ("llama3-8b", "hd256"):
        with pytest.raises(SkipCheck, match=f"has no case deployment '{name}' ships"):
            production.head_dims(ctx)
        return
    r = production.head_dims(ctx)
    if name == "small-hd":
        assert r.status == "fail" and "[8, 40, 80]" in r.summary
    else:
        assert r.status == "pass", r.summary
        assert {row[0].split()[0] for row in r.details["table"]["rows"]} == {"hd256"}
