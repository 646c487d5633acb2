"""Fake-device harness: with torch's CUDA queries patched to an H200, a B200, a B300 or GPUs FA4 runs
no SM90/SM100 kernel on, the audit selects the live checks for the device's arch, labels them
"measured on <GPU> (sm_XY)", picks that arch's budget files and SM100 knobs, and skips with a
reason where FA4 is unsupported. No GPU runs here (CPU); the live checks themselves are exercised
with stand-ins in tests/test_production_budget_checks.py and compile-only in
tests/test_production_compile_only.py."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fa4verify import _options  # noqa: E402
from fa4verify.audit import registry, runner  # noqa: E402
from fa4verify.audit.registry import CheckContext, SkipCheck  # noqa: E402
from fa4verify.kernels import device, facts  # noqa: E402
from fa4verify.kernels.fa4_params import load_params  # noqa: E402
from fa4verify import errors  # noqa: E402

GPUS = {
    "h200": ("NVIDIA H200", (9, 0), "sm90", "sm_90"),
    "b200": ("NVIDIA B200", (10, 0), "sm100", "sm_100"),
    "b300": ("NVIDIA B300 SXM6 AC", (10, 3), "sm103", "sm_103"),
    "thor": ("NVIDIA Thor", (11, 0), "sm100", "sm_110"),
}
UNSUPPORTED = {"a100": ("NVIDIA A100-SXM4-80GB", (8, 0)), "rtx5090": ("NVIDIA GeForce RTX 5090", (12, 0))}


@pytest.fixture()
def fake_gpu(monkeypatch):
    def install(name, cap):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: name)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: cap)
        device.local_gpu.cache_clear()
    yield install
    device.local_gpu.cache_clear()


@pytest.mark.parametrize("key", sorted(GPUS))
def test_arch_label_and_budget_files_follow_the_device(fake_gpu, key):
    name, cap, arch, sm = GPUS[key]
    fake_gpu(name, cap)
    assert _options.resolve_archs(("auto",), "cuda") == (arch,)
    cfg = _options.build_config(device="auto")
    assert cfg.device == "cuda" and cfg.archs == (arch,)
    ctx = CheckContext(device="cuda", archs=cfg.archs, arch=arch)
    assert ctx.device_arch == arch
    assert ctx.where_measured() == f"measured on {name} ({sm})"
    assert registry.valid_where(ctx.where_measured())
    from fa4verify import judge
    files = judge.load_budgets("bf16", arch).files
    assert any(f.endswith(f"bf16_{arch}.toml") for f in files), files


@pytest.mark.parametrize("key", sorted(UNSUPPORTED))
def test_a_gpu_fa4_runs_no_sm90_sm100_kernel_on_skips_with_the_reason(fake_gpu, key):
    name, cap = UNSUPPORTED[key]
    fake_gpu(name, cap)
    # the twins only: nothing is labelled with an arch the GPU does not run
    assert _options.resolve_archs(("auto",), "cuda") == ("sm90", "sm100")
    ctx = CheckContext(device="cuda")
    with pytest.raises(SkipCheck, match=f"compute capability {cap[0]}.{cap[1]}: FA4 runs its SM80-style"):
        ctx.require_gpu()


@pytest.mark.parametrize("key", sorted(GPUS))
def test_live_checks_are_selected_on_every_supported_gpu(fake_gpu, key):
    name, cap, arch, _ = GPUS[key]
    fake_gpu(name, cap)
    cfg = _options.build_config(device="cuda", profile="default")
    sel = runner.select(runner.load_specs(cfg), cfg)
    ids = {s.id for s in sel}
    live = {"budgets.production.forward", "budgets.production.backward", "production.forward_rule",
            "production.head_dims_live", "fuzz.production", "determinism.fa4"}
    assert live <= ids, live - ids
    for s in sel:
        if s.id in live:
            assert registry.unmet_need(s.spec, "cuda", cuda=True) is None, s.id
            assert s.arch == arch


@pytest.mark.parametrize("arch", ["sm100", "sm103"])
def test_sm100_knobs_come_from_the_installed_fa4(arch):
    prm = load_params()
    kc = facts.kernel_constants(arch, "bf16", 128, 128)
    assert (kc.tile_n, kc.max_offset, kc.rescale_threshold) == (128, prm.max_offset_other, prm.rescale_threshold_16bit)
    assert kc.rescale_threshold == 8.0 and kc.x_max == 8.0
    kf = facts.kernel_constants(arch, "fp8", 128, 128)
    assert (kf.max_offset, kf.rescale_threshold) == (prm.max_offset_fp8, prm.rescale_threshold_other)
    # hd 256: the generic forward of the installed release (its lazy rescale), or a dedicated one without
    k256 = facts.kernel_constants(arch, "bf16", 256, 256)
    assert k256.rescale_threshold == (0.0 if facts.sm100_hd256_dedicated("fwd") else kc.rescale_threshold)
    k90 = facts.kernel_constants("sm90", "bf16", 128, 128)
    assert (k90.max_offset, k90.rescale_threshold) == (0.0, 0.0)


def test_recorded_h200_evidence_does_not_apply_on_a_b200(fake_gpu):
    from fa4verify.checks import production
    fake_gpu(*GPUS["b200"][:2])
    ctx = CheckContext(device="cuda", archs=("sm100",), arch="sm100", check_id="production.head_dims")
    with pytest.raises(SkipCheck, match="not applicable"):
        production.head_dims(ctx)
    with pytest.raises(SkipCheck, match="not applicable"):
        production.figures(ctx)
    # golden vectors compare the CPU twin with stored bits: true on any machine, labelled by the recording
    r = production.binary32_vs_gpu(CheckContext(device="cuda", archs=("sm100",), check_id="golden.binary32"))
    assert r.status == "pass" and r.where == "recorded on NVIDIA H200 (sm_90)"


def test_production_target_takes_the_arch_and_label_from_the_device(fake_gpu, monkeypatch):
    from fa4verify import targets
    from fa4verify.kernels import adapter
    fake_gpu(*GPUS["b300"][:2])
    monkeypatch.setattr(adapter, "cuda_status", lambda: (True, "NVIDIA B300 SXM6 AC, sm_103"))
    t = targets.ProductionTarget()
    assert t.arch == "sm103" and t.where == "measured on NVIDIA B300 SXM6 AC (sm_103)"
    t0 = targets.ProductionTarget(emulation="disabled")
    assert t0.describe()["exp2_emulation"] == "disabled"
    fake_gpu(*GPUS["h200"][:2])
    with pytest.raises(errors.Unsupported, match="no exp2 emulation"):
        targets.ProductionTarget(emulation="disabled")


def test_fa4verify_git_commit_names_the_commit_in_reports(monkeypatch):
    from fa4verify.audit import environment
    monkeypatch.setenv("FA4VERIFY_GIT_COMMIT", "0123abc")
    assert environment.collect("cpu")["versions"]["fa4verify_git"] == "0123abc"
    monkeypatch.delenv("FA4VERIFY_GIT_COMMIT")
    assert environment.collect("cpu")["versions"].get("fa4verify_git") != "0123abc"


def test_fp8_sm100_audit_is_not_failed_by_sm90_recordings(tmp_path):
    """``fa4verify audit --dtype fp8 --arch sm100`` on the CPU: the SM90 bf16 recordings do not
    apply (skip "not applicable"), the fp8 twin budgets run, exit 0 (CPU twin / recorded)."""
    import json
    import subprocess
    import sys
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", "fa4verify", "audit", "--dtype", "fp8", "--arch", "sm100", "--no-live",
                        "-k", "budgets.twin.forward or production", "--json", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = {x["id"]: x for x in json.loads(out.read_text())["results"]}
    assert res["budgets.twin.forward[sm100]"]["status"] == "pass"
    for cid in ("production.head_dims", "production.figures"):
        assert res[cid]["status"] == "skip" and res[cid]["summary"].startswith("not applicable"), res[cid]
