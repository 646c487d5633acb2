"""Compile-only instruction census of production FA4 (sm_90a / sm_100a), no GPU.

Each FA4 compile takes ~5-15 s on the 2-core CI box; the default run compiles three cases
(shared between xdist workers through a file lock). FA4VERIFY_SLOW=1 adds the full matrix.
"""
from __future__ import annotations

import fcntl
import importlib.util
import json
import os
from pathlib import Path

import pytest

# fa4: skipped with the reason without flash-attn-4 / the DSL (tests/conftest.py); slow: three
# FA4 compiles (~5-15 s each on 2 cores)
pytestmark = [pytest.mark.fa4, pytest.mark.slow]


def _shared_dir(tmp_path_factory) -> Path:
    # The parent of the per-worker base temp is shared by all xdist workers of one run.
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    d = root / "fa4census-shared"
    d.mkdir(parents=True, exist_ok=True)
    return d


def census_of(case, tmp_path_factory) -> dict:
    """Compile ``case`` once per test run (file-locked) and return its census dict."""
    from fa4verify.compile import census as C
    d = _shared_dir(tmp_path_factory)
    out = d / f"{case.label()}.json"
    with open(d / f"{case.label()}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.exists():
            res = C.compile_case(case, d / "dumps")
            out.write_text(json.dumps(C.census_case(res)))
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def sm100_hd128_noncausal(tmp_path_factory):
    from fa4verify.compile.census import CensusCase
    return census_of(CensusCase("sm_100a", 128, causal=False), tmp_path_factory)


@pytest.fixture(scope="module")
def sm100_hd128_causal(tmp_path_factory):
    from fa4verify.compile.census import CensusCase
    return census_of(CensusCase("sm_100a", 128, causal=True), tmp_path_factory)


@pytest.fixture(scope="module")
def sm90_hd128_causal(tmp_path_factory):
    from fa4verify.compile.census import CensusCase
    return census_of(CensusCase("sm_90a", 128, causal=True), tmp_path_factory)


def _fwd(cen: dict) -> dict:
    return cen["kernels"][cen["forward_kernel"]]


def _twin_available() -> bool:
    return importlib.util.find_spec("fa4verify.kernels.twin") is not None


@pytest.mark.parametrize("fixture", ["sm100_hd128_noncausal", "sm100_hd128_causal"])
def test_census_sm100_emulated_columns_from_ptx_equal_twin_rule(fixture, request):
    cen = request.getfixturevalue(fixture)
    if not _twin_available():
        pytest.skip("fa4verify.kernels.twin not present yet")
    d = cen["emulation_from_ptx"]
    assert d["copies_agree"], f"unrolled softmax copies disagree: {d}"
    assert d["tile_copies"] >= 1
    assert d["emulated_columns"] == cen["twin_emulated_columns"], (
        f"PTX-derived emulated columns {d['emulated_columns']} != twin rule "
        f"{cen['twin_emulated_columns']} for {cen['label']}")
    assert cen["ptx_matches_twin"] is True


def test_census_sm100_noncausal_uses_2cta_and_18_75_percent(sm100_hd128_noncausal):
    # flash_attn/cute/flash_fwd_sm100.py:550-557, ex2_emu_freq: hd128 non-causal 2-CTA key (T,F,128,F) has freq 10 -> 24/128 columns
    cen = sm100_hd128_noncausal
    assert cen["forward_config"]["use_2cta"] is True
    assert cen["forward_config"]["tuning_key"] == [True, False, 128, False]
    assert cen["emulation_from_ptx"]["share"] == pytest.approx(24 / 128)


def test_census_sm100_causal_uses_1cta_and_12_5_percent(sm100_hd128_causal):
    cen = sm100_hd128_causal
    assert cen["forward_config"]["use_2cta"] is False
    assert cen["emulation_from_ptx"]["share"] == pytest.approx(16 / 128)


@pytest.mark.parametrize("fixture", ["sm100_hd128_noncausal", "sm100_hd128_causal"])
def test_census_sm100_exp2_instruction_accounting(fixture, request):
    """Every PTX emulation floor is one FADD2.RM in SASS, every ex2.approx one MUFU.EX2, the
    degree-3 constants are present, and the Horner chains are packed FFMA2."""
    cen = request.getfixturevalue(fixture)
    k = _fwd(cen)
    ptx, sass = k["ptx"], k["sass"]
    d = cen["emulation_from_ptx"]
    pairs = ptx["add.rm.f32x2 (emulation floor, pair)"]
    assert pairs * 2 == sum(d["emulated_per_copy"]), "each add.rm.f32x2 is one emulated pair"
    assert sass["FADD2.RM"] == pairs
    assert sass["MUFU.EX2"] == ptx["ex2.approx.ftz.f32"]
    for c in ("poly3 c3 0f3D9DF09D", "poly3 c2 0f3E6906A4", "poly3 c1 0f3F31F519"):
        assert ptx[c] >= 1, f"degree-3 constant {c} missing"
    # three packed FMAs per emulated pair (degree 3 Horner)
    assert sass["FFMA2"] >= 3 * pairs
    # P cast is round-to-nearest-even only
    assert ptx["cvt.rn.bf16x2.f32"] > 0 and ptx["cvt.rz/rm/rp to 16-bit"] == 0
    assert ptx["rcp.approx.ftz.f32"] >= 1 and ptx["lg2.approx.ftz.f32"] >= 1


def test_census_sm90_has_no_emulation_and_contracts_exponent_argument(sm90_hd128_causal):
    cen = sm90_hd128_causal
    k = _fwd(cen)
    ptx, sass = k["ptx"], k["sass"]
    assert cen["forward_config"]["emulated_share"] == 0.0
    assert ptx["add.rm.f32x2 (emulation floor, pair)"] == 0 and ptx["add.rm.ftz.f32 (emulation floor)"] == 0
    assert ptx["poly3 c3 0f3D9DF09D"] == 0
    assert sass["FFMA2"] == 0 and sass["FADD2.RM"] == 0
    assert sass["MUFU.EX2"] == ptx["ex2.approx.ftz.f32"] > 0
    # PTX writes S*c - m*c as separate un-suffixed mul.f32 and sub.f32 ...
    assert ptx["sub.f32 (contractible)"] >= 128 and ptx["mul.f32 (contractible)"] >= 128
    # ... and ptxas contracts them: one FFMA with a negated addend per exp2 of the S tile
    tile_ex2 = ptx["sub.f32 (contractible)"]
    assert sass["FFMA with negated addend"] >= tile_ex2 - 8, (
        f"{sass['FFMA with negated addend']} FFMA(-addend) for {tile_ex2} PTX sub.f32")
    assert sass["HGMMA"] > 0 and ptx["cvt.rn.bf16x2.f32"] > 0


@pytest.mark.slow(extended="the full compile matrix (16 FA4 compiles)")
@pytest.mark.parametrize("arch,hd,causal", [(a, h, c) for a in ("sm_90a", "sm_100a")
                                             for h in (64, 128, 192, 256) for c in (False, True)])
def test_census_full_matrix_twin_agreement(arch, hd, causal, tmp_path_factory):
    from fa4verify.compile.census import CensusCase
    hdv = 128 if (arch == "sm_100a" and hd == 192) else None
    cen = census_of(CensusCase(arch, hd, causal=causal, head_dim_v=hdv), tmp_path_factory)
    d = cen["emulation_from_ptx"]
    assert d["copies_agree"]
    if _twin_available() and cen["twin_emulated_columns"] is not None:
        assert d["emulated_columns"] == cen["twin_emulated_columns"], cen["label"]


@pytest.mark.slow(extended="the backward compiles")
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_census_deterministic_backward_uses_hardware_exp2_only(arch, tmp_path_factory):
    from fa4verify.compile.census import CensusCase
    cen = census_of(CensusCase(arch, 128, causal=False, backward=True, deterministic=True),
                    tmp_path_factory)
    bwd = [k for n, k in cen["kernels"].items() if "bwd" in n.lower() or "backward" in n.lower()]
    assert bwd, f"no backward kernel dumped: {list(cen['kernels'])}"
    for k in bwd:
        assert k["ptx"]["add.rm.f32x2 (emulation floor, pair)"] == 0
        assert k["ptx"]["poly3 c3 0f3D9DF09D"] == 0


@pytest.mark.slow(extended="one more FA4 compile (exp2 emulation off)")
def test_census_exp2_emulation_switch_removes_every_polynomial(tmp_path_factory):
    """adapter.exp2_emulation_disabled() (tuning-table recipe, flash_attn/cute/flash_fwd_sm100.py:550-557, ex2_emu_freq): the compiled SM100
    kernel has no emulation floor and every tile exp2 is MUFU; the config records it."""
    from fa4verify.compile.census import CensusCase
    cen = census_of(CensusCase("sm_100a", 128, causal=False, exp2_emulation=False), tmp_path_factory)
    k = cen["kernels"][cen["forward_kernel"]]
    assert k["ptx"]["add.rm.f32x2 (emulation floor, pair)"] == 0
    assert k["ptx"]["poly3 c3 0f3D9DF09D"] == 0 and k["sass"]["FADD2.RM"] == 0
    assert cen["emulation_from_ptx"]["share"] == 0.0
    assert cen["forward_config"]["emulated_share"] == 0.0
    assert "disabled" in cen["forward_config"]["exp2_emulation"]
