"""The numpy twin of FA4's exp2 emulation equals an independent gmpy2 (MPFR) model, bit for bit.

The reference below is written per element with MPFR ``ieee(32)`` contexts and explicit rounding
modes (no numpy, no ``fa4verify.oracles.binary32``), following ``ex2_emulation_2`` / ``ex2_emulation`` in
``flash_attn/cute/utils.py`` operation by operation.
"""
from __future__ import annotations

import math
import struct

import numpy as np
import pytest

gmpy2 = pytest.importorskip("gmpy2")

from fa4verify.kernels.fa4_params import load_params  # noqa: E402
from fa4verify.kernels.twin import ex2_emulation  # noqa: E402

# ----------------------------------------------------------------------------- reference
_CTX = {"rn": gmpy2.ieee(32), "rm": gmpy2.ieee(32)}
_CTX["rn"].round = gmpy2.RoundToNearest
_CTX["rm"].round = gmpy2.RoundDown          # toward -infinity
MIN_NORMAL = 2.0 ** -126


def f2b(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


def _ftz(v: float) -> float:
    if v != 0 and abs(v) < MIN_NORMAL:
        return math.copysign(0.0, v)
    return v


def op_add(a: float, b: float, rnd: str, ftz: bool = False) -> float:
    if ftz:
        a, b = _ftz(a), _ftz(b)
    r = float(_CTX[rnd].add(gmpy2.mpfr(a), gmpy2.mpfr(b)))
    return _ftz(r) if ftz else r


def op_sub(a: float, b: float) -> float:
    return float(_CTX["rn"].sub(gmpy2.mpfr(a), gmpy2.mpfr(b)))


def op_fma(a: float, b: float, c: float) -> float:
    return float(_CTX["rn"].fma(gmpy2.mpfr(a), gmpy2.mpfr(b), gmpy2.mpfr(c)))


def op_fmax(a: float, b: float) -> float:
    """PTX max.f32: NaN-quiet (maximumNumber), -0 < +0."""
    if math.isnan(a):
        return b
    if math.isnan(b):
        return a
    if a == b:
        return b if math.copysign(1.0, a) < 0 else a
    return a if a > b else b


def ex2_emulation_ref(x: float, coeffs: tuple[float, ...], variant: str) -> int:
    """Bits of FA4's emulated 2^x for the float32 value ``x``; NaN results as 0x7FFFFFFF."""
    C = 12582912.0  # 1.5 * 2^23
    xc = op_fmax(x, -127.0)
    xr = op_add(xc, C, "rm", ftz=(variant == "scalar"))
    f = op_sub(xc, op_sub(xr, C))
    q = coeffs[-1]
    for c in coeffs[-2::-1]:
        q = op_fma(q, f, c)
    qb = 0x7FFFFFFF if math.isnan(q) else f2b(q)
    xr_bits = 0x7FFFFFFF if math.isnan(xr) else f2b(xr)
    return (((xr_bits << 23) & 0xFFFFFFFF) + qb) & 0xFFFFFFFF


# ----------------------------------------------------------------------------- inputs
def edge_domain_inputs(n: int, seed: int) -> np.ndarray:
    """``n`` float32 inputs spanning the emulation's whole edge domain (see twin docstring)."""
    rng = np.random.default_rng(seed)
    k = n // 10
    parts = [
        rng.uniform(-127.0, 8.0, k),                       # FA4's operating range, uniform in value
        rng.uniform(-1.0, 0.0, k),                         # x in (-1,0): the fraction rounds
        -np.exp2(rng.uniform(-149, 0, k)),                 # negatives of every magnitude
        np.exp2(rng.uniform(-149, 7, k)),                  # positives of every magnitude
        rng.uniform(-128.0, -125.0, k),                    # clamp / subnormal-writing region
        -np.exp2(rng.uniform(-40, -24, k)),                # tiny negatives around -2^-25
        rng.uniform(126.0, 130.0, k),                      # x > 127 (garbage region)
    ]
    a = np.concatenate(parts).astype(np.float32)
    # random bit patterns (all exponents, NaNs, infinities, subnormals)
    r = rng.integers(0, 2**32, n - a.size - 400, dtype=np.uint64).astype(np.uint32).view(np.float32)
    # integers and their neighbours, and special values
    ints = np.arange(-130, 131, dtype=np.float32)
    near = np.concatenate([ints, np.nextafter(ints, np.float32(np.inf)),
                           np.nextafter(ints, np.float32(-np.inf))])
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 2.0**-149, -2.0**-149, -2.0**-25,
                        -2.0**-26, -2.0**-24, np.float32(-2.0**-25) * np.float32(1 + 2**-23),
                        -127.0, -126.0, 127.0, 128.0], dtype=np.float32)
    out = np.concatenate([a, r, near, special]).astype(np.float32)
    return out[: max(n, out.size)]


def _compare(x: np.ndarray, degree: int, variant: str) -> None:
    coeffs = tuple(load_params().poly_ex2[degree])
    got = ex2_emulation(x, degree, variant).view(np.uint32)
    xs = x.astype(np.float64).tolist()
    ref = np.fromiter((ex2_emulation_ref(v, coeffs, variant) for v in xs), dtype=np.uint32, count=len(xs))
    # NaN payloads: the twin canonicalises to 0x7FFFFFFF, the reference too; compare bits exactly.
    bad = np.flatnonzero(got != ref)
    assert bad.size == 0, (
        f"twin != gmpy2 reference for degree {degree} variant {variant}: {bad.size}/{x.size} mismatches; "
        "first: " + ", ".join(f"x={x[i]!r} ({x[i:i+1].view(np.uint32)[0]:#010x}) twin={got[i]:#010x} "
                              f"ref={ref[i]:#010x}" for i in bad[:5]))


@pytest.mark.slow  # 200k inputs through gmpy2, ~20 s on 2 cores
def test_twin_bitwise_equals_gmpy2_reference_deg3_packed_200k():
    x = edge_domain_inputs(200_000, seed=20261130)
    assert x.size >= 200_000
    _compare(x, 3, "packed")


@pytest.mark.parametrize("degree,variant", [(3, "scalar"), (5, "packed"), (5, "scalar"),
                                            (1, "packed"), (2, "packed"), (4, "packed"), (0, "packed")])
def test_twin_bitwise_equals_gmpy2_reference_other_degrees(degree, variant):
    _compare(edge_domain_inputs(30_000, seed=degree * 7 + len(variant)), degree, variant)


def test_reference_catches_an_unfused_horner():
    """The comparison can fail: an unfused (mul then add) Horner differs from the fused model."""
    from fa4verify.oracles import binary32 as b32
    from fa4verify.kernels.twin import ex2_emulation_parts
    x = np.random.default_rng(1).uniform(-20, 8, 20_000).astype(np.float32)
    xc, xr, f, q, out = ex2_emulation_parts(x, 3, "packed")
    cs = [np.float32(c) for c in load_params().poly_ex2[3]]
    qq = np.full_like(f, cs[-1])
    for c in cs[-2::-1]:
        qq = b32.add(b32.mul(qq, f), c)
    unfused = b32.from_bits(b32.add_i32(b32.shl_i32(b32.bits(xr), 23), b32.bits(qq)))
    assert (unfused.view(np.uint32) != out.view(np.uint32)).mean() > 0.005
