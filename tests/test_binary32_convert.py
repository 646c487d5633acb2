"""fp32 -> bf16 / fp16 / fp8 conversions of ``fa4verify.oracles.binary32`` equal ml_dtypes and torch
(RNE; NaN compared with isnan; satfinite modelled as PTX ``cvt.rn.satfinite``)."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify.oracles import binary32 as b32

ml_dtypes = pytest.importorskip("ml_dtypes")


def inputs(seed: int = 0, n: int = 300_000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    r = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    # dense near the target formats' ranges, ties included (low mantissa bits = exact halves)
    e = rng.integers(90, 160, n).astype(np.uint32)
    m = rng.integers(0, 2**23, n).astype(np.uint32)
    tie16 = (m & ~np.uint32(0xFFFF)) | np.uint32(0x8000)          # bf16 ties
    tie13 = (m & ~np.uint32(0x1FFF)) | np.uint32(0x1000)          # fp16 ties
    tie20 = (m & ~np.uint32(0xFFFFF)) | np.uint32(0x80000)        # fp8 e4m3 ties
    s = rng.integers(0, 2, n).astype(np.uint32) << 31
    parts = [r, s | (e << 23) | m, s | (e << 23) | tie16, s | (e << 23) | tie13, s | (e << 23) | tie20]
    special = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 448, 464, 465, 480, -464.0001, 57344, 61439,
                          61440, 65504, 65519.99, 65520, 2.0**-24, 2.0**-25, 2.0**-25 * 1.0000001,
                          2.0**-9, 2.0**-10, 2.0**-16, 2.0**-17, 3.3895314e38, 3.4e38]).view(np.uint32)
    return np.concatenate(parts + [special]).view(np.float32)


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return ((a == b) & (np.signbit(a) == np.signbit(b))) | (np.isnan(a) & np.isnan(b))


def _assert_all(ok: np.ndarray, x: np.ndarray, got, ref, what: str) -> None:
    bad = np.flatnonzero(~ok)
    assert bad.size == 0, f"{what}: {bad.size} mismatches, e.g. " + "; ".join(
        f"x={x[i]!r} ({x[i:i+1].view(np.uint32)[0]:#010x}) got={np.asarray(got)[i]!r} ref={np.asarray(ref)[i]!r}"
        for i in bad[:5])


def test_bf16_equals_ml_dtypes_and_torch():
    x = inputs(1)
    got = b32.to_bf16(x)
    ref = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    _assert_all(_same(got, ref), x, got, ref, "to_bf16 vs ml_dtypes")
    torch = pytest.importorskip("torch")
    tref = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    _assert_all(_same(got, tref), x, got, tref, "to_bf16 vs torch")
    bits = b32.to_bf16_bits(x)
    assert np.all(bits[np.isnan(x)] == 0x7FFF)
    assert np.array_equal(b32.bf16_bits_to_f32(bits)[~np.isnan(x)], got[~np.isnan(x)])


def test_fp16_equals_numpy_ml_dtypes_and_torch():
    x = inputs(2)
    got = b32.to_fp16(x)
    ref = x.astype(np.float16).astype(np.float32)
    _assert_all(_same(got, ref), x, got, ref, "to_fp16 vs numpy float16")
    torch = pytest.importorskip("torch")
    tref = torch.from_numpy(x).to(torch.float16).float().numpy()
    _assert_all(_same(got, tref), x, got, tref, "to_fp16 vs torch")


def test_fp8_e4m3fn_satfinite_equals_torch_and_nonsat_equals_ml_dtypes():
    x = inputs(3)
    got = b32.to_fp8_e4m3fn(x, satfinite=True)
    torch = pytest.importorskip("torch")
    tref = torch.from_numpy(x).to(torch.float8_e4m3fn).float().numpy()   # torch saturates (inf -> 448)
    _assert_all(_same(got, tref), x, got, tref, "to_fp8_e4m3fn(satfinite) vs torch")
    clipped = np.where(np.isnan(x), x, np.clip(x, -448, 448)).astype(np.float32)
    mref = clipped.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    _assert_all(_same(got, mref), x, got, mref, "to_fp8_e4m3fn(satfinite) vs ml_dtypes(clip)")
    got_ns = b32.to_fp8_e4m3fn(x, satfinite=False)
    ref_ns = x.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    _assert_all(_same(got_ns, ref_ns), x, got_ns, ref_ns, "to_fp8_e4m3fn(no satfinite) vs ml_dtypes")


def test_fp8_e5m2_satfinite_and_plain_equal_ml_dtypes_and_torch():
    x = inputs(4)
    got = b32.to_fp8_e5m2(x, satfinite=False)
    ref = x.astype(ml_dtypes.float8_e5m2).astype(np.float32)
    _assert_all(_same(got, ref), x, got, ref, "to_fp8_e5m2 vs ml_dtypes")
    torch = pytest.importorskip("torch")
    tref = torch.from_numpy(x).to(torch.float8_e5m2).float().numpy()
    _assert_all(_same(got, tref), x, got, tref, "to_fp8_e5m2 vs torch")
    sat = b32.to_fp8_e5m2(x, satfinite=True)
    clipped = np.where(np.isnan(x), x, np.clip(x, -57344, 57344)).astype(np.float32)
    sref = clipped.astype(ml_dtypes.float8_e5m2).astype(np.float32)
    _assert_all(_same(sat, sref), x, sat, sref, "to_fp8_e5m2(satfinite) vs ml_dtypes(clip)")


def test_conversion_ties_go_to_even():
    # 1 + 2^-8 is a bf16 tie between 1 and 1 + 2^-7 -> 1 (even); 1 + 3*2^-8 -> 1 + 2^-6
    x = np.float32([1 + 2.0**-8, 1 + 3 * 2.0**-8, 1 + 2.0**-11, 1 + 3 * 2.0**-11])
    assert b32.to_bf16(x[:2]).tolist() == [1.0, 1 + 2.0**-6]
    assert b32.to_fp16(x[2:]).tolist() == [1.0, 1 + 2.0**-9]
