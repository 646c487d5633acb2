"""The CPU twin and fa4verify.oracles.binary32 reproduce the H200 golden vectors bit for bit.

The vectors in kernels/evidence/golden (package data) were recorded on the lent H200 by
``scripts/gpu_golden.py`` (see each file's .json for GPU, driver, CUDA, torch, FA4 and DSL
versions). 100% of stored inputs must match; NaN outputs are compared with isnan (payloads differ between libraries).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from fa4verify.oracles import binary32 as b32
from fa4verify.kernels.evidence import evidence_path

GOLDEN = evidence_path("golden")


def _load(name):
    from fa4verify.kernels import golden
    p = GOLDEN / f"{name}.npz"
    if not p.exists():
        pytest.skip(f"{p.name} not recorded yet (run scripts/gpu_golden.py on a GPU)")
    return golden.load(p)


def _twin():
    from fa4verify.kernels import twin
    return twin


def _assert_same_f32(got_bits: np.ndarray, want_bits: np.ndarray, x_bits: np.ndarray, what: str):
    got, want = got_bits.view(np.float32), want_bits.view(np.float32)
    both_nan = np.isnan(got) & np.isnan(want)
    bad = ~both_nan & (got_bits != want_bits)
    n = int(bad.sum())
    if n:
        idx = np.flatnonzero(bad)[:5]
        rows = [f"x={x_bits[i]:#010x} ({x_bits[i:i+1].view(np.float32)[0]!r}): twin {got_bits[i]:#010x} "
                f"GPU {want_bits[i]:#010x}" for i in idx]
        pytest.fail(f"{what}: {n} / {got.size} ({100 * n / got.size:.4f}%) mismatches; first: "
                    + "; ".join(rows))


@pytest.mark.parametrize("degree", [3, 5, 1, 2, 4])
def test_twin_ex2_emulation_scalar_matches_h200_bits(degree):
    g = _load("probe_outputs")
    twin = _twin()
    x = g["x"]
    got = np.asarray(twin.ex2_emulation(x.view(np.float32), degree, variant="scalar"),
                     dtype=np.float32).view(np.uint32)
    _assert_same_f32(got, g[f"ex2_emulation_deg{degree}"], x, f"ex2_emulation degree {degree}")


@pytest.mark.parametrize("variant", ["cvt_bf16x2", "to_bf16"])
def test_binary32_bf16_rounding_matches_h200_cvt(variant):
    g = _load("probe_outputs")
    x = g["x"].view(np.float32)
    want = g[variant]
    got = np.asarray(b32.to_bf16_bits(x), dtype=np.uint16)
    nan = np.isnan(x)
    assert np.all(((want & 0x7FFF) > 0x7F80)[nan]), "NaN inputs must give NaN"
    bad = ~nan & (got != want)
    assert not bad.any(), f"{int(bad.sum())} mismatches, first x={g['x'][bad][:5]}"


@pytest.mark.parametrize("variant", ["cvt_f16x2", "to_f16"])
def test_binary32_fp16_rounding_matches_h200_cvt(variant):
    g = _load("probe_outputs")
    x = g["x"].view(np.float32)
    want = g[variant]
    got = np.asarray(b32.to_fp16(x), dtype=np.float16).view(np.uint16)
    nan = np.isnan(x)
    assert np.all(((want & 0x7FFF) > 0x7C00)[nan]), "NaN inputs must give NaN"
    bad = ~nan & (got != want)
    assert not bad.any(), f"{int(bad.sum())} mismatches, first x={g['x'][bad][:5]}"


@pytest.mark.parametrize("ci", [0, 1, 2, 3])
def test_sm90_exponent_argument_is_one_fused_multiply_add(ci):
    """S*c - m*c on the H200 == fma(S, c, -(m*c)) exactly (ptxas contraction), and differs from
    the separately rounded mul-then-sub on some inputs (so the test can tell them apart)."""
    g = _load("exparg_outputs")
    s, m = g.f32("s"), g.f32("m")
    c = g.f32("c")[ci]
    mc = b32.mul(m, np.full_like(m, c))
    fused = np.asarray(b32.fma(s, np.full_like(s, c), -mc), dtype=np.float32).view(np.uint32)
    _assert_same_f32(fused, g[f"arg_c{ci}"], g["s"], f"exponent argument, c={c!r}")
    unfused = np.asarray(b32.sub(b32.mul(s, np.full_like(s, c)), mc), dtype=np.float32).view(np.uint32)
    assert (unfused != g[f"arg_c{ci}"]).any(), "sample cannot distinguish fused from unfused"


def test_mufu_stats_recorded_exhaustively_with_validated_reference():
    p = GOLDEN / "mufu_stats.json"
    if not p.exists():
        pytest.skip("mufu_stats.json not recorded yet (run scripts/gpu_golden.py on a GPU)")
    doc = json.loads(p.read_text())
    assert doc["where"].startswith("measured on")
    for name, chk in doc["reference_check"].items():
        assert chk["ok"], f"float64 reference for {name} disagrees with mpmath: {chk}"
    st = doc["stats"]
    # exhaustive: every fp32 in [-126, 0] and [0, 8]
    assert st["ex2.approx.ftz [-126,0]"]["inputs"] == 0xC2FC0000 - 0x80000000 + 1
    assert st["ex2.approx.ftz [0,8]"]["inputs"] == 0x41000000 + 1
    for label, d in st.items():
        if "max_err_mpmath_recheck" in d and d["max_err"] < 1e6:
            assert d["max_err_mpmath_recheck"] == pytest.approx(d["max_err"], rel=1e-6, abs=1e-6), label


def _ulp_err_exp2(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """|y - 2^x| in fp32 ulps of 2^x (float64 exp2; fine at 1e-16 relative vs the fp32 ulp)."""
    r = np.exp2(x.astype(np.float64))
    e = np.floor(np.log2(r))
    ulp = np.exp2(np.maximum(e, -126) - 23)
    return np.abs(y.astype(np.float64) - r) / ulp


def test_mufu_argmax_recheck_with_mpmath_here():
    """Check the checker on this machine: the exact error at each recorded argmax (GPU output
    stored in the file) recomputed with mpmath at 120 bits equals the recorded maximum."""
    import mpmath
    p = GOLDEN / "mufu_stats.json"
    if not p.exists():
        pytest.skip("mufu_stats.json not recorded yet")
    st = json.loads(p.read_text())["stats"]
    ctx = mpmath.mp.clone() if hasattr(mpmath.mp, "clone") else mpmath.mp
    ctx.prec = 120
    checked = 0
    for label, d in st.items():
        if "argmax_output" not in d or d["max_err"] > 1e6:
            continue
        x = ctx.mpf(float(np.float32(d["argmax_x"])))
        ex = {"ex2": lambda: ctx.power(2, x), "rcp": lambda: 1 / x, "lg2": lambda: ctx.log(x, 2)}[
            "ex2" if "ex2" in label else ("rcp" if "rcp" in label else "lg2")]()
        e = int(ctx.floor(ctx.log(abs(ex), 2)))
        ulp = ctx.ldexp(1, max(e, -126) - 23)
        err = float(abs(ctx.mpf(d["argmax_output"]) - ex) / ulp)
        assert err == pytest.approx(d["max_err"], rel=1e-9), label
        checked += 1
    assert checked >= 6


def test_stored_mufu_ex2_sample_within_exhaustive_maximum():
    """Two independent H200 recordings agree: the stored MUFU exp2 outputs of the golden sample
    never exceed the exhaustive maximum error of their range, and reach at least 1 ulp."""
    g = _load("probe_outputs")
    p = GOLDEN / "mufu_stats.json"
    if not p.exists():
        pytest.skip("mufu_stats.json not recorded yet")
    st = json.loads(p.read_text())["stats"]
    x = g.f32("x")
    y = g.f32("mufu_ex2")
    with np.errstate(all="ignore"):
        for label, lo, hi in (("ex2.approx.ftz [-126,0]", -126.0, 0.0), ("ex2.approx.ftz [0,8]", 0.0, 8.0)):
            m = (x >= lo) & (x <= hi)
            err = _ulp_err_exp2(x[m], y[m])
            assert err.max() <= st[label]["max_err"] * (1 + 1e-9), label
            assert err.max() >= 1.0, f"{label}: sample max {err.max()} suspiciously small"
        # flush to zero below 2^-126 (ex2.approx.ftz): x in (-127, -126) gives +0
        sub = (x > -127) & (x < -126)
        assert np.all(y[sub] == 0)
