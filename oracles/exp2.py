"""Correctly rounded ``2^x`` for binary32 inputs, into fp32, bf16 and fp16.

``exp2_cr(x, fmt)`` returns ``RNE_fmt(2^x)`` -- the exact real ``2^x`` rounded once, to nearest
even, into ``fmt`` with gradual underflow (subnormal results included) and overflow to ``inf`` --
for any float32 ``x`` (``+-0``, subnormals, ``+-inf``, NaN -> NaN).

Method (Note [exp2 filter])
---------------------------
1. Exact cases: integer ``x`` (2^x is a power of two, rounded exactly by integer arithmetic), ``x``
   outside the range where the result can be nonzero and finite, ``+-inf`` and NaN.
2. Float64 filter: ``y = numpy.exp2(float64(x))``. ``numpy.exp2`` on float64 calls the C library's
   ``exp2``; glibc documents at most 1 ulp of error for it on x86-64 (its current implementation
   is below 0.51 ulp), i.e. ``|y - 2^x| <= 2^-52 * 2^x``. We assume a bound four times larger,
   ``FILTER_REL_BOUND = 2^-50``, and round both ``y*(1-2^-50)`` and ``y*(1+2^-50)`` (the two products
   are themselves within 2^-52 of exact, so the interval they span still contains 2^x). If both
   round to the same value of ``fmt``, that value is ``RNE_fmt(2^x)``. The assumption is checked
   against mpmath on samples by ``tests/test_exp2_oracle.py`` (the maximum observed error of
   ``numpy.exp2`` is reported there).
3. Fallback for undecided inputs (the float64 interval straddles a rounding boundary; about
   ``2^-25`` of inputs for fp32, far fewer for bf16/fp16): mpmath interval arithmetic
   (``mpmath.iv``) at 160, then 320, ... bits, until the enclosure of 2^x rounds to a single
   value. For non-integer ``x``, ``2^x`` is irrational (a non-integer rational power of 2), so it is
   never a rounding boundary and the loop terminates.

Accuracy
--------
Exact (correctly rounded), under the stated float64 bound for ``numpy.exp2``; the fallback is
certified by interval arithmetic.

Possible issues
---------------
If the platform's ``exp2`` were worse than 4 ulp, the filter could decide wrongly; run
``tests/test_exp2_oracle.py`` on a new platform. ``stats()`` counts fallbacks per process.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = ["exp2_cr", "exp2_cr_from_f64", "round_f64", "round_f64_reference", "FORMATS", "FILTER_REL_BOUND", "first_x_above", "exp2_interval",
           "round_mpf", "oracle_stats", "Format"]

Format = Literal["f32", "bf16", "f16"]


@dataclass(frozen=True)
class _Fmt:
    mant_bits: int      # fraction bits
    emin: int           # exponent of the smallest normal
    max_finite: float


FORMATS: dict[str, _Fmt] = {
    "f32": _Fmt(23, -126, float(np.finfo(np.float32).max)),
    "bf16": _Fmt(7, -126, float.fromhex("0x1.fep127")),
    "f16": _Fmt(10, -14, 65504.0),
}

#: assumed relative error bound of numpy.exp2 on float64 (4x the documented 1 ulp = 2^-52)
FILTER_REL_BOUND = 2.0**-50

_STATS = {"inputs": 0, "fallbacks": 0}


def oracle_stats() -> dict[str, int]:
    """Process-wide counters: inputs handled and mpmath fallbacks taken."""
    return dict(_STATS)


def round_f64(v: np.ndarray, fmt: Format) -> np.ndarray:
    """RNE of float64 values ``v`` into ``fmt`` (gradual underflow, overflow to inf), as float64.

    Fast paths: fp32 and fp16 use numpy's float64 -> float32 / float16 casts (correctly rounded,
    directly from the float64 bits); bf16 rounds to *odd* into fp32 (keeping a sticky bit; exact
    since 24 >= 8 + 2) and then to nearest even on the bits. ``round_f64_reference`` is the
    slow, obviously-correct version they are tested against.
    """
    v = np.asarray(v, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        if fmt == "f32":
            return v.astype(np.float32).astype(np.float64)
        if fmt == "f16":
            return v.astype(np.float16).astype(np.float64)
        if fmt != "bf16":
            raise ValueError(f"unknown format {fmt!r}")
        r = v.astype(np.float32)                                   # RNE
        d = r.astype(np.float64) - v                               # sign of RN32(v) - v (0 iff exact)
        b = r.view(np.uint32).copy()
        inexact = d != 0
        # |r| > |v|: step one ulp toward zero (truncation), then set the sticky bit: round to odd
        b -= (inexact & ((d > 0) != (v < 0))).view(np.uint8)
        b |= inexact.view(np.uint8)
        b += 0x7FFF + ((b >> 16) & 1)
        b &= np.uint32(0xFFFF0000)
        out = b.view(np.float32).astype(np.float64)
        bad = ~np.isfinite(out) | ~np.isfinite(v)
        if bad.any():   # overflow to inf (the sticky trick above is only for finite r), inf, NaN
            out = np.where(bad, round_f64_reference(v, "bf16"), out)
        return out


def round_f64_reference(v: np.ndarray, fmt: Format) -> np.ndarray:
    """Reference RNE of float64 into ``fmt`` by power-of-two scaling and ``rint`` (exact, slow)."""
    f = FORMATS[fmt]
    v = np.asarray(v, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        _, ex = np.frexp(v)
        e = np.maximum(ex - 1, f.emin)
        e = np.where(np.isfinite(v) & (v != 0), e, f.emin)
        q = np.ldexp(1.0, (e - f.mant_bits).astype(np.int64))
        r = np.rint(v / q) * q
    r = np.where(v == 0, v, r)
    r = np.where(np.abs(r) > f.max_finite, np.copysign(np.inf, v), r)
    return np.where(np.isnan(v), np.nan, r)


def round_mpf(m, fmt: Format) -> float:
    """RNE of an mpmath ``mpf`` into ``fmt`` (exact integer arithmetic), as a Python float."""
    import mpmath
    f = FORMATS[fmt]
    if m == 0:
        return 0.0
    if not mpmath.isfinite(m):
        return float(m)
    sign, man, exp, bc = m._mpf_
    # value = (-1)^sign * man * 2^exp, man odd; leading bit exponent = exp + bc - 1
    lead = exp + bc - 1
    e = max(lead, f.emin)
    shift = (e - f.mant_bits) - exp          # quantum 2^(e - mant_bits)
    if shift <= 0:
        q = man << (-shift)
        r = q
    else:
        q, rem = divmod(man, 1 << shift)
        half = 1 << (shift - 1)
        if rem > half or (rem == half and (q & 1)):
            q += 1
        r = q
    val = float(mpmath.ldexp(r, e - f.mant_bits))
    if abs(val) > f.max_finite:
        val = float("inf")
    return -val if sign else val


def exp2_interval(x: float, prec: int):
    """An ``mpmath.iv`` enclosure of ``2^x`` at ``prec`` bits (``x`` a float, exact)."""
    import mpmath
    ctx = mpmath.iv
    old = ctx.prec
    try:
        ctx.prec = prec
        return ctx.exp(ctx.mpf(x) * ctx.log(2))
    finally:
        ctx.prec = old


def _fallback(x: float, fmt: Format) -> float:
    import mpmath
    prec = 160
    while prec <= 5120:
        iv = exp2_interval(x, prec)
        a = round_mpf(mpmath.mpf(iv.a), fmt)
        b = round_mpf(mpmath.mpf(iv.b), fmt)
        if a == b:
            return a
        prec *= 2
    raise ArithmeticError(f"exp2 oracle: could not decide RNE_{fmt}(2^{x!r}) at {prec // 2} bits")


def exp2_cr(x, fmt: Format = "f32") -> np.ndarray:
    """Correctly rounded (RNE) ``2^x`` in ``fmt`` for float32 ``x``, returned as float32
    (bf16/fp16 values widen exactly). NaN -> NaN, ``-inf`` -> +0, ``+inf`` -> +inf."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {sorted(FORMATS)}")
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise TypeError("exp2_cr expects float32 inputs")
    x64 = x.astype(np.float64).reshape(-1)
    _STATS["inputs"] += x64.size
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        y = np.exp2(x64)
        lo = round_f64(y * (1 - FILTER_REL_BOUND), fmt)
        hi = round_f64(y * (1 + FILTER_REL_BOUND), fmt)
    out = lo.copy()
    integer = np.isfinite(x64) & (np.floor(x64) == x64)
    # exact powers of two (2^x exact in float64 for -1074 <= x <= 1023; beyond: 0 or inf)
    with np.errstate(over="ignore", under="ignore"):
        out[integer] = round_f64(np.exp2(x64[integer]), fmt)
    special = ~np.isfinite(x64) | (x64 > 200) | (x64 < -200)
    out[special] = round_f64(y[special], fmt)          # 0, inf, NaN: exact
    undecided = np.flatnonzero((lo != hi) & ~integer & ~special & ~(np.isnan(lo) & np.isnan(hi)))
    if undecided.size:
        _STATS["fallbacks"] += int(undecided.size)
        for i in undecided:
            out[i] = _fallback(float(x64[i]), fmt)
    return out.astype(np.float32).reshape(x.shape)


def exp2_cr_from_f64(x: np.ndarray, y: np.ndarray, fmt: Format) -> np.ndarray:
    """``exp2_cr`` for finite, non-integer float32 ``x`` in [-200, 200] given ``y = numpy.exp2(x)``
    (float64) already computed: the float64 filter, then the mpmath fallback where undecided.
    Returns float64. The caller guarantees the preconditions (used by the sweeps for speed)."""
    with np.errstate(over="ignore", under="ignore"):
        lo = round_f64(y * (1 - FILTER_REL_BOUND), fmt)
        hi = round_f64(y * (1 + FILTER_REL_BOUND), fmt)
    _STATS["inputs"] += int(lo.size)
    undecided = np.flatnonzero(lo != hi)
    if undecided.size:
        _STATS["fallbacks"] += int(undecided.size)
        x64 = np.asarray(x, dtype=np.float64).reshape(-1)
        lo = lo.copy()
        for i in undecided:
            if float(x64[i]) == np.floor(x64[i]):
                lo[i] = float(round_f64(np.exp2(x64[i:i + 1]), fmt)[0])
            else:
                lo[i] = _fallback(float(x64[i]), fmt)
    return lo


def first_x_above(m: float) -> np.float32:
    """The smallest float32 ``x`` with ``2^x > m``, for a positive float ``m`` that is not a power
    of two (so ``log2(m)`` is irrational and never a float32). Certified with ``mpmath.iv``."""
    import mpmath
    if not (m > 0 and np.isfinite(m)):
        raise ValueError(f"first_x_above needs a positive finite m, got {m!r}")
    mant, _ = np.frexp(m)
    if mant == 0.5:
        raise ValueError(f"{m!r} is a power of two; log2 is exact there")
    ctx = mpmath.iv
    old = ctx.prec
    try:
        ctx.prec = 200
        t = ctx.log(ctx.mpf(m)) / ctx.log(2)
        ta, tb = mpmath.mpf(t.a), mpmath.mpf(t.b)
        # candidates around float(t): the answer is the smallest float32 > log2(m)
        x = np.float32(float(ta))
        for _ in range(4):
            x = np.nextafter(x, np.float32(-np.inf))
        while True:
            xv = mpmath.mpf(float(x))
            if xv > tb:
                return x
            if xv >= ta:   # inside the enclosure: cannot happen for irrational log2(m) at 200 bits
                raise ArithmeticError(f"first_x_above({m!r}): enclosure too wide")
            x = np.nextafter(x, np.float32(np.inf))
    finally:
        ctx.prec = old
