"""Exact IEEE binary32 arithmetic with PTX semantics, vectorised in numpy.

This is the one module every other part of fa4verify uses for bit-level fp32 work: the twin
(``fa4verify.kernels.twin``), the oracles and the judge. It lives in ``oracles/`` (imported as
``fa4verify.oracles.binary32``) because exact IEEE arithmetic is a truth-side primitive that both
the subject (``kernels/``) and the judge may import. Every operation returns exactly the bits
the corresponding PTX instruction returns on an NVIDIA GPU, under the semantics stated here.

Method (Note [Round to odd])
----------------------------
An fp32 product is exact in fp64 (24+24 = 48 <= 53 bits; no fp64 over/underflow for fp32 inputs).
A sum ``s = RN64(p + c)`` is not exact, but Knuth's TwoSum gives the exact remainder ``e`` with
``p + c = s + e``. Rounding ``s`` to *odd* in fp64 (step toward ``e`` and set the last bit when
``e != 0`` and the last bit is even) keeps the sticky information, and since 53 >= 24 + 2 a
single RNE cast of the round-to-odd value to fp32 equals RNE of the exact value (Boldo &
Melquiond, "Emulation of FMA and correctly rounded sums: proved algorithms using rounding to odd",
IEEE TC 2008). This also holds for subnormal fp32 results (the fp32 subnormal grid is a subset of
the fp64 normal grid at those magnitudes). Directed roundings (``rm``, ``rz``, ``rp``) are
derived from the RNE result by comparing it with the exact value ``s + e`` and stepping one fp32
ulp where the RNE result lies on the wrong side.

Semantics modelled explicitly
-----------------------------
* ``ftz=True``: subnormal inputs are flushed to sign-preserving zero before the operation and
  subnormal results are flushed to sign-preserving zero after rounding (PTX ``.ftz``).
* NaN results are the canonical PTX NaN ``0x7FFFFFFF`` (compare NaNs with ``isnan``, never by
  bits: torch and ml_dtypes write other payloads).
* ``fmax``/``fmin`` follow PTX ``max.f32``/``min.f32`` (IEEE 754-2019 maximumNumber): a NaN
  operand is ignored, two NaNs give canonical NaN, ``-0 < +0``. ``nan=True`` gives the
  ``.NaN`` variant that propagates NaN.
* Exact zero results of ``a + b`` are ``+0`` except under ``rm`` (``-0``), and ``x + x`` keeps the
  sign of ``x`` for zeros, as IEEE 754 prescribes.

Accuracy
--------
Exact: every function returns the correctly rounded result (in the stated mode) of the exact real
operation. Cross-checked against gmpy2 ``ieee(32)`` (MPFR) and mpmath in ``tests/test_binary32_*.py``.

Possible issues
---------------
Flush-to-zero of results is modelled *after* rounding (a result that rounds up to the smallest
normal is kept). None of FA4's ``.ftz`` call sites produce results near the subnormal boundary.
"""
from __future__ import annotations

from typing import Iterator, Literal

import numpy as np

Rounding = Literal["rn", "rm", "rz", "rp"]
ROUNDINGS: tuple[str, ...] = ("rn", "rm", "rz", "rp")

F32 = np.float32
F64 = np.float64
CANONICAL_NAN_BITS = np.uint32(0x7FFFFFFF)
FLT_MIN_NORMAL = np.float32(2.0**-126)
FLT_MAX = np.finfo(np.float32).max

__all__ = [
    "Rounding", "ROUNDINGS", "as_f32", "bits", "from_bits", "ftz", "is_subnormal",
    "round_to_odd_f64", "round_f64_pair", "add", "sub", "mul", "fma", "fmax", "fmin",
    "shl_i32", "add_i32", "to_bf16_bits", "bf16_bits_to_f32", "to_bf16", "to_fp16",
    "to_fp8_e4m3fn", "to_fp8_e5m2", "round_to_format", "ulp", "ordered", "ulp_distance",
    "f32_range", "iter_f32_range", "count_f32_range", "next_up", "next_down",
]


# --------------------------------------------------------------------------- bits and views
def as_f32(x) -> np.ndarray:
    """Return ``x`` as a float32 ndarray; raises if the conversion would round."""
    a = np.asarray(x)
    if a.dtype == np.float32:
        return a
    if a.dtype.kind == "f" and a.dtype.itemsize <= 4:
        return a.astype(np.float32)
    out = a.astype(np.float32)
    back = out.astype(a.dtype) if a.dtype.kind == "f" else None
    if back is not None and not np.array_equal(back, a, equal_nan=True):
        raise ValueError("as_f32: input is not exactly representable in binary32")
    return out


def bits(x) -> np.ndarray:
    """The uint32 bit patterns of float32 ``x`` (same shape as ``x``; 0-d stays 0-d)."""
    a = as_f32(x)
    return np.ascontiguousarray(a).view(np.uint32).reshape(a.shape)


def from_bits(b) -> np.ndarray:
    """float32 values with the given (uint32 / int32 / int64) bit patterns; wraps mod 2^32."""
    b = np.asarray(b)
    return (b.astype(np.int64) & 0xFFFFFFFF).astype(np.uint32).view(np.float32)


def is_subnormal(x) -> np.ndarray:
    b = bits(x)
    return ((b & 0x7F800000) == 0) & ((b & 0x007FFFFF) != 0)


def ftz(x) -> np.ndarray:
    """Flush subnormals to sign-preserving zero (PTX ``.ftz``)."""
    x = as_f32(x)
    b = bits(x)
    sub = ((b & 0x7F800000) == 0) & ((b & 0x007FFFFF) != 0)
    if not sub.any():
        return x
    return from_bits(np.where(sub, b & 0x80000000, b))


def _canon_nan(r: np.ndarray) -> np.ndarray:
    nan = np.isnan(r)
    if nan.any():
        r = r.copy()
        r.view(np.uint32)[nan] = CANONICAL_NAN_BITS
    return r


def next_up(x) -> np.ndarray:
    return np.nextafter(as_f32(x), np.float32(np.inf))


def next_down(x) -> np.ndarray:
    return np.nextafter(as_f32(x), np.float32(-np.inf))


# --------------------------------------------------------------------------- exact rounding core
def round_to_odd_f64(s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Round the exact value ``s + e`` (``s = RN64(s+e)``, ``|e| <= ulp(s)/2``) to odd in fp64.

    Where ``e != 0`` and ``s`` has an even last bit, step ``s`` one fp64 ulp toward ``e``;
    the result then has an odd last bit and lies strictly on the side of ``s + e``'s
    truncation, which preserves the sticky bit for a later rounding to <= 51 bits.
    """
    s = np.asarray(s, dtype=np.float64)
    e = np.asarray(e, dtype=np.float64)
    inexact = (e != 0) & np.isfinite(s)
    even = (s.view(np.int64) & 1) == 0
    step = inexact & even
    if not step.any():
        return s
    return np.where(step, np.nextafter(s, np.copysign(np.inf, e)), s)


def _two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with np.errstate(invalid="ignore", over="ignore"):
        s = a + b
        bb = s - a
        e = (a - (s - bb)) + (b - bb)
    e = np.where(np.isfinite(s), e, 0.0)
    return s, e


def round_f64_pair(s: np.ndarray, e: np.ndarray, rnd: Rounding = "rn") -> np.ndarray:
    """Correctly round the exact real ``s + e`` to binary32 in mode ``rnd``.

    ``s`` and ``e`` are float64 arrays with ``s = RN64(s + e)`` (e.g. the outputs of TwoSum).
    Infinite / NaN ``s`` pass through (NaN canonicalised by the callers).
    """
    ro = round_to_odd_f64(s, e)
    with np.errstate(over="ignore", invalid="ignore"):
        r = ro.astype(np.float32)
    if rnd == "rn":
        return r
    r64 = r.astype(np.float64)
    finite_v = np.isfinite(s)
    # sign of (r - exact): compare r64 with s first; ties broken by the sign of e.
    above = finite_v & ((r64 > s) | ((r64 == s) & (e < 0)))
    below = finite_v & ((r64 < s) | ((r64 == s) & (e > 0)))
    if rnd == "rm":
        step_down, step_up = above, np.zeros_like(above)
    elif rnd == "rp":
        step_down, step_up = np.zeros_like(above), below
    elif rnd == "rz":
        pos = s > 0
        step_down = above & pos
        step_up = below & ~pos & (s != 0)
    else:
        raise ValueError(f"unknown rounding mode {rnd!r}; expected one of {ROUNDINGS}")
    with np.errstate(over="ignore", invalid="ignore"):
        r = np.where(step_down, np.nextafter(r, np.float32(-np.inf)), r)
        r = np.where(step_up, np.nextafter(r, np.float32(np.inf)), r)
    return r.astype(np.float32)


def _check_rnd(rnd: str) -> None:
    if rnd not in ROUNDINGS:
        raise ValueError(f"unknown rounding mode {rnd!r}; expected one of {ROUNDINGS}")


def _finish(r: np.ndarray, flush: bool) -> np.ndarray:
    if flush:
        r = ftz(r)
    return _canon_nan(np.asarray(r, dtype=np.float32))


def _zero_sign_fix(r, rnd, s, e, x, y):
    """IEEE 754 sign of an exact zero sum ``x + y`` (the two addends, exact, as float64):
    two zeros of the same sign keep that sign; any other exact zero (cancellation, or zeros of
    opposite signs) is ``+0``, except ``-0`` under ``rm``."""
    exact_zero = (s == 0) & (e == 0)
    if not exact_zero.any():
        return r
    same_sign_zeros = (x == 0) & (y == 0) & (np.signbit(x) == np.signbit(y))
    neg = np.where(same_sign_zeros, np.signbit(x), rnd == "rm")
    z = np.where(neg, np.float32(-0.0), np.float32(0.0))
    return np.where(exact_zero, z, r)


# --------------------------------------------------------------------------- arithmetic
def add(a, b, rnd: Rounding = "rn", *, flush: bool = False) -> np.ndarray:
    """PTX ``add{.rnd}{.ftz}.f32``: correctly rounded ``a + b``."""
    _check_rnd(rnd)
    a, b = np.broadcast_arrays(as_f32(a), as_f32(b))
    if flush:
        a, b = ftz(a), ftz(b)
    if rnd == "rn":
        with np.errstate(over="ignore", invalid="ignore"):
            return _finish(a + b, flush)
    with np.errstate(invalid="ignore"):
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
    s, e = _two_sum(a64, b64)
    r = round_f64_pair(s, e, rnd)
    r = _zero_sign_fix(r, rnd, s, e, a64, b64)
    return _finish(r, flush)


def sub(a, b, rnd: Rounding = "rn", *, flush: bool = False) -> np.ndarray:
    """PTX ``sub{.rnd}{.ftz}.f32``: correctly rounded ``a - b`` (= ``a + (-b)``)."""
    return add(a, -as_f32(b), rnd, flush=flush)


def mul(a, b, rnd: Rounding = "rn", *, flush: bool = False) -> np.ndarray:
    """PTX ``mul{.rnd}{.ftz}.f32``: correctly rounded ``a * b``."""
    _check_rnd(rnd)
    a, b = np.broadcast_arrays(as_f32(a), as_f32(b))
    if flush:
        a, b = ftz(a), ftz(b)
    if rnd == "rn":
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            return _finish(a * b, flush)
    with np.errstate(invalid="ignore"):
        p = a.astype(np.float64) * b.astype(np.float64)  # exact
    r = round_f64_pair(p, np.zeros_like(p), rnd)
    return _finish(r, flush)


def fma(a, b, c, rnd: Rounding = "rn", *, flush: bool = False) -> np.ndarray:
    """PTX ``fma{.rnd}{.ftz}.f32``: ``a*b + c`` with a single rounding.

    A naive ``float32(float64(a)*b + c)`` double-rounds and is wrong on crafted inputs;
    this implementation uses TwoSum + round-to-odd (see Note [Round to odd]).
    """
    _check_rnd(rnd)
    a, b, c = np.broadcast_arrays(as_f32(a), as_f32(b), as_f32(c))
    if flush:
        a, b, c = ftz(a), ftz(b), ftz(c)
    with np.errstate(invalid="ignore", over="ignore"):
        p = a.astype(np.float64) * b.astype(np.float64)
        c64 = c.astype(np.float64)
        s, e = _two_sum(p, c64)
    r = round_f64_pair(s, e, rnd)
    # exact-zero sign: the product p is exact (p == 0 iff a or b is 0) and carries sign(a)^sign(b)
    r = _zero_sign_fix(r, rnd, s, e, p, c64)
    return _finish(r, flush)


def fmax(a, b, *, flush: bool = False, nan: bool = False) -> np.ndarray:
    """PTX ``max{.ftz}{.NaN}.f32``. Default: a NaN operand is ignored; ``-0 < +0``."""
    a, b = np.broadcast_arrays(as_f32(a), as_f32(b))
    if flush:
        a, b = ftz(a), ftz(b)
    an, bn = np.isnan(a), np.isnan(b)
    gt = (a > b) | ((a == b) & ~np.signbit(a))
    r = np.where(gt, a, b)
    if nan:
        r = np.where(an | bn, np.float32(np.nan), r)
    else:
        r = np.where(an, b, np.where(bn, a, r))
    return _finish(r, False)


def fmin(a, b, *, flush: bool = False, nan: bool = False) -> np.ndarray:
    """PTX ``min{.ftz}{.NaN}.f32``. Default: a NaN operand is ignored; ``-0 < +0``."""
    a, b = np.broadcast_arrays(as_f32(a), as_f32(b))
    if flush:
        a, b = ftz(a), ftz(b)
    an, bn = np.isnan(a), np.isnan(b)
    lt = (a < b) | ((a == b) & np.signbit(a))
    r = np.where(lt, a, b)
    if nan:
        r = np.where(an | bn, np.float32(np.nan), r)
    else:
        r = np.where(an, b, np.where(bn, a, r))
    return _finish(r, False)


# --------------------------------------------------------------------------- int32 bit ops
def shl_i32(x_bits, n: int) -> np.ndarray:
    """PTX ``shl.b32``: left shift of 32-bit patterns, wrapping (result as uint32)."""
    return ((np.asarray(x_bits).astype(np.int64) << n) & 0xFFFFFFFF).astype(np.uint32)


def add_i32(a_bits, b_bits) -> np.ndarray:
    """PTX ``add.s32``: two's-complement addition modulo 2^32 (result as uint32)."""
    return ((np.asarray(a_bits).astype(np.int64) + np.asarray(b_bits).astype(np.int64))
            & 0xFFFFFFFF).astype(np.uint32)


# --------------------------------------------------------------------------- conversions
def to_bf16_bits(x) -> np.ndarray:
    """RNE fp32 -> bf16 (PTX ``cvt.rn.bf16.f32``) as uint16 bits; NaN -> 0x7FFF (canonical)."""
    b0 = bits(x)
    b = b0.reshape(-1)
    # uint32 arithmetic: b + 0x8000 stays below 2^32 for every non-NaN pattern (the largest,
    # -inf, is 0xFF800000); a NaN's wrapped value is replaced below
    r = (b >> 16) & np.uint32(1)
    r += b
    r += np.uint32(0x7FFF)
    r >>= 16
    r = r.astype(np.uint16)
    r[(b & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)] = 0x7FFF
    return r.reshape(b0.shape)


def bf16_bits_to_f32(h) -> np.ndarray:
    return (np.asarray(h).astype(np.uint32) << 16).view(np.float32)


def to_bf16(x) -> np.ndarray:
    """RNE fp32 -> bf16, returned widened to float32 (exact)."""
    return bf16_bits_to_f32(to_bf16_bits(x))


def round_to_format(x, *, mant_bits: int, emin: int, max_finite: float,
                    overflow: Literal["inf", "satfinite", "nan"] = "inf") -> np.ndarray:
    """RNE of float32 ``x`` to a binary format with ``mant_bits`` fraction bits, minimum normal
    exponent ``emin`` (gradual underflow) and largest finite value ``max_finite``; returned as
    float64 (exact). ``overflow`` says what a value that rounds beyond ``max_finite`` becomes.
    """
    with np.errstate(invalid="ignore"):
        v = as_f32(x).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        _, ex = np.frexp(v)            # v = m * 2^ex, 0.5 <= |m| < 1
        e = np.maximum(ex - 1, emin)   # exponent of the leading bit, clamped to emin
        e = np.where(np.isfinite(v) & (v != 0), e, emin)
        q = np.ldexp(1.0, (e - mant_bits).astype(np.int64))
        r = np.rint(v / q) * q         # v/q exact (power-of-two scaling); rint is RNE
    r = np.where(v == 0, v, r)         # keep signed zeros
    big = np.abs(r) > max_finite
    if overflow == "inf":
        r = np.where(big, np.copysign(np.inf, v), r)
    elif overflow == "satfinite":
        r = np.where(big | np.isinf(v), np.copysign(max_finite, v), r)
    elif overflow == "nan":
        r = np.where(big | np.isinf(v), np.nan, r)
    else:
        raise ValueError(f"unknown overflow policy {overflow!r}")
    return np.where(np.isnan(v), np.nan, r)


def to_fp16(x) -> np.ndarray:
    """RNE fp32 -> fp16 (``cvt.rn.f16.f32``), returned as float32 (exact)."""
    return round_to_format(x, mant_bits=10, emin=-14, max_finite=65504.0).astype(np.float32)


def to_fp8_e4m3fn(x, *, satfinite: bool = True) -> np.ndarray:
    """RNE fp32 -> fp8 e4m3fn (``cvt.rn.satfinite.e4m3x2.f32``), returned as float32.

    With ``satfinite`` (what FA4 uses) |values| above 448 and infinities become +-448; NaN stays NaN.
    Without it, overflow gives NaN (e4m3fn has no infinity)."""
    return round_to_format(x, mant_bits=3, emin=-6, max_finite=448.0,
                           overflow="satfinite" if satfinite else "nan").astype(np.float32)


def to_fp8_e5m2(x, *, satfinite: bool = True) -> np.ndarray:
    """RNE fp32 -> fp8 e5m2 (``cvt.rn.satfinite.e5m2x2.f32``), returned as float32."""
    return round_to_format(x, mant_bits=2, emin=-14, max_finite=57344.0,
                           overflow="satfinite" if satfinite else "inf").astype(np.float32)


# --------------------------------------------------------------------------- ulps
def ordered(x) -> np.ndarray:
    """Map float32 bit patterns to int64 so that the integer order is the float order and
    adjacent floats differ by 1 (+0 and -0 both map to 0)."""
    b = bits(x).astype(np.int64)
    mag = b & 0x7FFFFFFF
    return np.where(b & 0x80000000, -mag, mag)


def ulp_distance(a, b) -> np.ndarray:
    """Number of float32 values between ``a`` and ``b`` (int64; ±0 are the same point;
    stepping across zero or an exponent boundary counts one per float). NaN -> -1."""
    a, b = np.broadcast_arrays(as_f32(a), as_f32(b))
    d = np.abs(ordered(a) - ordered(b))
    return np.where(np.isnan(a) | np.isnan(b), -1, d)


def ulp(x, fmt: Literal["f32", "bf16", "f16"] = "f32") -> np.ndarray:
    """Unit in the last place of ``x`` in ``fmt`` (distance from |x| to the next larger
    magnitude, as if the exponent range were unbounded above; the subnormal spacing below the
    normal range; ``ulp(±0)`` is the smallest subnormal), as float64. ``±inf`` and NaN give NaN
    (as ``numpy.spacing``)."""
    v = np.abs(as_f32(x).astype(np.float64))
    p, emin = {"f32": (23, -126), "bf16": (7, -126), "f16": (10, -14)}[fmt]
    with np.errstate(divide="ignore", invalid="ignore"):
        _, ex = np.frexp(v)
    e = np.maximum(ex - 1, emin)
    e = np.where(v == 0, emin, e)
    out = np.ldexp(1.0, (e - p).astype(np.int64))
    return np.where(np.isfinite(v), out, np.nan)


# --------------------------------------------------------------------------- ranges
def f32_range(lo: float, hi: float) -> tuple[int, int]:
    """Ordered-integer bounds ``[olo, ohi]`` of all float32 values ``lo <= x <= hi``."""
    lo32, hi32 = np.float32(lo), np.float32(hi)
    if float(lo32) < lo:
        lo32 = np.nextafter(lo32, np.float32(np.inf))
    if float(hi32) > hi:
        hi32 = np.nextafter(hi32, np.float32(-np.inf))
    olo, ohi = int(ordered(lo32)), int(ordered(hi32))
    return olo, ohi


def count_f32_range(lo: float, hi: float) -> int:
    """Number of distinct float32 values in [lo, hi] (+0/-0 counted once)."""
    olo, ohi = f32_range(lo, hi)
    return max(0, ohi - olo + 1)


def _from_ordered(o: np.ndarray) -> np.ndarray:
    o = o.astype(np.int64)
    b = np.where(o < 0, (-o) | 0x80000000, o)
    return from_bits(b)


def iter_f32_range(lo: float, hi: float, chunk: int = 1 << 22) -> Iterator[np.ndarray]:
    """Yield every float32 in [lo, hi] in increasing order, in chunks of at most ``chunk``.

    -0.0 is not produced separately (it equals +0.0); NaNs and infinities only when the bounds
    say so (``hi=inf`` includes +inf)."""
    olo, ohi = f32_range(lo, hi)
    start = olo
    while start <= ohi:
        stop = min(ohi + 1, start + chunk)
        yield _from_ordered(np.arange(start, stop, dtype=np.int64))
        start = stop
