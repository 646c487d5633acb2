"""Exhaustive certification of FA4's polynomial exp2 emulation over every fp32 input of a range.

(One module of ~1200 lines on purpose: Note [Fast exhaustive sweep] below is the proof that the
fast path equals the direct sweep, and the code of each reduction (R1)-(R4) sits next to the
paragraph that justifies it; ``tests/test_exp2_sweep_fastpath.py`` checks them against the direct
path. The CLI and its report live in ``fa4verify/cli/exp2.py``.)

For a degree ``d`` and a range ``[lo, hi]`` this computes, over **every** float32 ``x`` in it
(labelled "CPU twin": the emulation is ``fa4verify.kernels.twin``'s bit-exact model):

* ``max_rel_error`` = max |emu(x)/2^x - 1| over x >= -126 (exact result a normal fp32), with argmax;
* ``max_ulp_fp32`` = max |ord(emu(x)) - ord(RN32(2^x))| (integer fp32 ulps from the correctly
  rounded value);
* ``max_ulp_bf16_after_rounding`` = max |RN_bf16(emu(x)) - 2^x| / ulp_bf16(2^x), and the fp16 twin;
* ``wrong_count_bf16`` / ``wrong_count_fp16``: inputs where RN(emu(x)) differs from the correctly
  rounded 2^x (``fa4verify.oracles.exp2``), with two rates: per fp32 input (each input counted
  once) and uniform in value (each input weighted by its spacing ulp(x), i.e. the fraction of the
  *length* of the range where the result is wrong, the convention of the FA4 paper and FA #2263);
* ``monotonicity_violations``: adjacent inputs (fp32 order) with emu(next) < emu(x);
* ``n_inputs``.

Note [Fast exhaustive sweep] -- what the range reduction does and does not give
--------------------------------------------------------------------------------
The emulation computes n = floor(x) exactly (``add.rm`` with 1.5*2^23) and f = RN(x - n).

(R1) **Exact fraction** for x >= 0 and x <= -1/2 (not only x <= -1): for n >= 1 or n <= -2,
     x and n are within a factor 2 (Sterbenz), for n = -1 and x in [-1, -1/2] too, and for n = 0,
     f = x. There emu(x) = p(f) * 2^n bit for bit (exponent-field add of a normal), 2^x = 2^f 2^n,
     and -- as long as the results are normal in the format considered -- relative error, fp32 ulp
     distance, bf16 ulp error and the RN-vs-CR comparison are all invariant under the 2^n scaling.
     The fraction values met on [n, n+1) are exactly the multiples of u(n) = ulp of the fp32 numbers
     there (u >= 2^-23 for |x| >= 1; 2^-24 on [-1,-1/2] and [1/2,1)). So one pass over
     f_i = i*2^-24, i < 2^24, with per-stride aggregates (i = 0 mod 2^k), covers every full unit
     interval [n, n+1) with n >= 1 or n <= -2 and the pieces [-1, -1/2] and [1/2, 1).
     NOT invariant: fp16 for results below 2^-14 (fp16 subnormals; n in [-25, -15] is evaluated
     directly; for n <= -26 both RN_fp16(emu) and RN_fp16(2^x) are 0, shown by 2^(n+1) <= 2^-25)
     and fp16 overflow (n >= 15, evaluated directly).
(R2) **Rounded fraction** for x in (-1/2, 0) (half of all inputs of [-127, 8]): f = RN(1 + x) on the
     2^-24 grid, so the error depends on x and not on f alone. Here the inputs split into 2^23 + 1
     buckets B_j = {x : RN(1+x) = 1/2 + j 2^-24} (contiguous in x; ties to even at the ends). On a
     bucket emu is one value v_j (checked: emu at both ends is evaluated and compared) while 2^x
     increases, so: the relative error and the fp32 / bf16 / fp16 ulp errors are largest at a
     bucket end (the format ulp is constant since 2^x stays in [1/2, 1)); and RN_fmt(v_j) equals
     RN_fmt(2^x) exactly for x in [X(m_lo), X(m_hi)), X(m) = the smallest fp32 with 2^x > m, m_lo /
     m_hi the midpoints around RN_fmt(v_j) (certified with ``mpmath.iv``; 2^x is never a midpoint).
     The bucket at j = 2^23 is [-2^-25, 0): all tiny negatives give p(1)/2.
(R3) **Monotone runs** on [0, 2^-5): all POLY_EX2 coefficients are positive and f = x >= 0, so each
     Horner step RN(c_i + q*f) is non-decreasing in x and emu is monotone; its ~2^18 distinct values
     form contiguous runs, found by bisection between sample points with equal values, and each
     run is treated like a bucket of (R2). The sweep checks the positivity assumption.
Everything else (the rest of [0, 1/2), partial unit intervals, fp16-subnormal unit intervals,
x >= 15) is evaluated directly. ``sweep(..., method="direct")`` evaluates every input directly;
``tests/test_exp2_sweep_fastpath.py`` proves each reduction by comparing both methods on
sub-ranges. Monotonicity of emu on [-126, 128) also follows from (R1)-(R3) and p(1 - u) < 2; the
sweep counts violations from the computed values rather than assuming it.

The edge domain (NaN, +-inf, x <= -127, (-127, -126), tiny negatives, x >= 128) is reported apart
by ``edge_report``.

Speed -- the same figures, fewer passes
---------------------------------------
The reductions above are unchanged; what changed is how each evaluated input is scored, and every
change is an exact identity, so the statistics are bit for bit those of the earlier kernels
(kept as ``impl="reference"``; ``tests/test_exp2_sweep_speed.py`` compares whole sweeps
on every special region and the whole CLI report):

* Note [Horner without round-to-odd] (``_fma_pos_fast``): one float64 add and a cast per FMA; the
  round-to-odd correction only where the float64 sum is an fp32 midpoint.
* Note [One oracle filter] (``metrics``): the float64 filter for fp32 only; RN_bf16 / RN_fp16 of
  2^x derived from RN32(2^x) by integer rounding, except at midpoints of the format, which take the
  format's own filter (so the mpmath fallbacks are the same inputs); fp16 subnormal rounding by
  exact scaling and ``rint`` instead of numpy's (slow) float16 cast; fp32 ulps as int32 bit
  differences.
* Run ends (R2/R3) score only the maxima they contribute; the value measure of one-sign runs takes
  the one branch that applies.
* L2-sized blocks (``FUSED_BLOCK`` = 2^14 inputs) for the elementwise work; the (R2) bucket blocks
  stay at ``BLOCK`` = 2^16, which fixes the order of their (inexact) float weight sums.
* Note [Sweep schedule] (``sweep``): direct pieces cut into tasks of 2^21 inputs, all tasks run
  longest first over ``jobs`` processes; merging is arranged so that the result does not depend on
  the schedule.

``benchmarks/exp2_cpu.py`` prints the full-range seconds per degree and, on sub-ranges in the same
run, the ratios to the reference kernels and to the direct sweep, with the bit-for-bit checks.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Iterable, Literal

import numpy as np

from fa4verify.oracles import binary32 as b32

__all__ = ["Stats", "sweep", "edge_report", "parse_range", "RANGES", "emu_direct", "direct_stats",
           "SweepResult", "FMTS"]

FMTS = ("bf16", "f16")
RANGES = {"neg": (-127.0, 0.0), "pos": (0.0, 8.0), "all": (-127.0, 8.0)}
SEG_HI = 2.0**-5          # (R3) runs below this, direct above
GRID_BITS = 24            # base fraction grid 2^-24
MAX_STRIDE_LOG = 7        # strides 2^0 .. 2^7 (|x| < 256)
CHUNK = 1 << 20           # inputs per direct task piece
BLOCK = 1 << 16           # buckets per (R2) block (fixes the order of the bucket weight sums)
FUSED_BLOCK = 1 << 14     # inputs per block of the fused kernels: the ~20 temporaries stay in L2


# ============================================================================ statistics
@dataclass
class Stats:
    """Mergeable statistics over a set of inputs (see module docstring for the definitions).

    ``rel``/``ulp32``/``ulp_bf16``/``ulp_f16`` hold ``(max, argmax_x)``; weights are in units of
    x (value measure) for the uniform-in-value rate.
    """
    n: int = 0
    max_rel: float = 0.0
    argmax_rel: float = float("nan")
    signed_rel_at_max: float = 0.0
    max_ulp32: int = 0
    argmax_ulp32: float = float("nan")
    max_ulp_bf16: float = 0.0
    argmax_ulp_bf16: float = float("nan")
    max_ulp_f16: float = 0.0
    argmax_ulp_f16: float = float("nan")
    wrong_bf16: int = 0
    wrong_f16: int = 0
    weight: float = 0.0
    weight_wrong_bf16: float = 0.0
    weight_wrong_f16: float = 0.0
    worst_wrong_bf16: float = float("nan")     # input with the largest bf16 error among wrong ones
    worst_wrong_bf16_ulp: float = 0.0
    worst_wrong_f16: float = float("nan")
    worst_wrong_f16_ulp: float = 0.0
    mono_violations: int = 0
    mono_at: list = field(default_factory=list)    # up to 5 inputs x where emu(x) < emu(previous x)
    # first/last input and emu value, for monotonicity across pieces
    first: tuple[float, float] | None = None
    last: tuple[float, float] | None = None

    def merge(self, o: "Stats") -> "Stats":
        if o.n == 0:
            return self
        if self.n == 0:
            return o
        r = Stats()
        r.n = self.n + o.n
        for key in ("rel", "ulp32", "ulp_bf16", "ulp_f16"):
            a, b = getattr(self, f"max_{key}"), getattr(o, f"max_{key}")
            src = self if (a > b or (a == b and _lt(getattr(self, f"argmax_{key}"), getattr(o, f"argmax_{key}")))) else o
            setattr(r, f"max_{key}", getattr(src, f"max_{key}"))
            setattr(r, f"argmax_{key}", getattr(src, f"argmax_{key}"))
            if key == "rel":
                r.signed_rel_at_max = src.signed_rel_at_max
        for k in ("wrong_bf16", "wrong_f16", "weight", "weight_wrong_bf16", "weight_wrong_f16", "mono_violations"):
            setattr(r, k, getattr(self, k) + getattr(o, k))
        r.mono_at = sorted(self.mono_at + o.mono_at)[:5]
        for f in ("bf16", "f16"):
            a, b = getattr(self, f"worst_wrong_{f}_ulp"), getattr(o, f"worst_wrong_{f}_ulp")
            src = self if a >= b else o
            setattr(r, f"worst_wrong_{f}_ulp", getattr(src, f"worst_wrong_{f}_ulp"))
            setattr(r, f"worst_wrong_{f}", getattr(src, f"worst_wrong_{f}"))
        # order pieces by their first input
        lo, hi = (self, o) if self.first[0] <= o.first[0] else (o, self)
        r.first, r.last = lo.first, hi.last
        if lo.last is not None and hi.first is not None and hi.first[1] < lo.last[1]:
            r.mono_violations += 1
            r.mono_at = sorted(r.mono_at + [hi.first[0]])[:5]
        return r

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("first"), d.pop("last")
        d["rate_bf16_per_input"] = self.wrong_bf16 / self.n if self.n else float("nan")
        d["rate_f16_per_input"] = self.wrong_f16 / self.n if self.n else float("nan")
        d["rate_bf16_uniform_in_value"] = self.weight_wrong_bf16 / self.weight if self.weight else float("nan")
        d["rate_f16_uniform_in_value"] = self.weight_wrong_f16 / self.weight if self.weight else float("nan")
        return d


def _lt(a: float, b: float) -> bool:
    if math.isnan(b):
        return True
    if math.isnan(a):
        return False
    return a < b


def merge_all(parts: Iterable[Stats]) -> Stats:
    parts = sorted((p for p in parts if p.n), key=lambda s: s.first[0])
    out = Stats()
    for p in parts:
        out = out.merge(p)
    return out


# ============================================================================ arithmetic
_COEFFS: dict = {}


def _coeffs(degree: int) -> tuple[np.float32, ...]:
    """FA4's POLY_EX2[degree] as float32 (``poly_coeffs_f32``, converted and checked once per
    coefficient list of ``load_params()``)."""
    from fa4verify.kernels.fa4_params import load_params
    from fa4verify.kernels.twin import poly_coeffs_f32
    key = (degree, tuple(load_params().poly_ex2.get(degree, ())))
    r = _COEFFS.get(key)
    if r is None:
        r = _COEFFS[key] = poly_coeffs_f32(degree)
    return r


def _fma_pos(q: np.ndarray, f64: np.ndarray, c: float, out: np.ndarray | None = None) -> np.ndarray:
    """Exact RN fp32 fma(q, f, c) for finite q, f >= 0 and c > 0 (round-to-odd in fp64)."""
    p = q.astype(np.float64)
    p *= f64                                    # exact (48 bits)
    s = p + c
    bb = s - p                                  # TwoSum: e = (p - (s - bb)) + (c - bb)
    e = s - bb
    np.subtract(p, e, out=e)
    bb -= c
    np.subtract(e, bb, out=e)
    bits = s.view(np.int64)
    bits -= (e < 0).view(np.uint8)              # s > 0: step toward zero when e < 0
    bits |= (e != 0).view(np.uint8)
    if out is None:
        return s.astype(np.float32)
    out[...] = s
    return out


def _fma_pos_fast(q: np.ndarray, f64: np.ndarray, c: float) -> np.ndarray:
    """``_fma_pos`` (RN fp32 fma(q, f, c), f >= 0, c > 0), bit for bit, in fewer passes.

    Note [Horner without round-to-odd]: p = q*f is exact in float64 (24 + 24 bits) and
    s = RN64(p + c). RN32(s) differs from RN32(p + c) only when s is an fp32 midpoint: RN64 is
    monotone and every fp32 midpoint is a float64, so if s is no midpoint then s and the exact sum
    lie on the same side of every midpoint, hence round to the same fp32 value. s > 0 is a
    midpoint iff its 29 low mantissa bits are 1 followed by 28 zeros (s is a normal float64: an fp32
    midpoint between normal fp32 values has 25 significant bits). Only those elements (about 2^-28
    of them) take the exact round-to-odd path of ``_fma_pos``.
    """
    p = q.astype(np.float64)
    p *= f64
    s = p + c
    mid = (s.view(np.int64) & 0x1FFFFFFF) == 0x10000000
    out = s.astype(np.float32)
    if mid.any():
        i = np.flatnonzero(mid)
        out[i] = _fma_pos(q[i], f64[i], c)
    return out


def _horner(f: np.ndarray, cs: tuple[np.float32, ...]) -> np.ndarray:
    """fp32 Horner with fused FMAs (FA4's ``evaluate_polynomial``), for f >= 0, positive coeffs."""
    if _IMPL == "reference":
        return _horner_reference(f, cs)
    if not all(float(c) >= 2.0**-126 for c in cs):
        raise ValueError("the fused Horner needs positive normal coefficients (Note [Horner without "
                         f"round-to-odd]); got {[float(c) for c in cs]}")
    out = np.empty(f.shape, dtype=np.float32)
    step = FUSED_BLOCK                          # cache-sized blocks (elementwise: any size)
    for a in range(0, f.size, step):
        fb = f[a:a + step]
        f64 = fb.astype(np.float64)
        q = np.full(fb.shape, cs[-1], dtype=np.float32)
        for c in cs[-2::-1]:
            q = _fma_pos_fast(q, f64, float(c))
        out[a:a + step] = q
    return out


def _horner_reference(f: np.ndarray, cs: tuple[np.float32, ...]) -> np.ndarray:
    """``_horner`` by round-to-odd FMAs at every step (the earlier implementation)."""
    out = np.empty(f.shape, dtype=np.float32)
    step = 1 << 16                              # cache-sized blocks
    for a in range(0, f.size, step):
        fb = f[a:a + step]
        f64 = fb.astype(np.float64)
        q = np.full(fb.shape, cs[-1], dtype=np.float32)
        for c in cs[-2::-1]:
            q = _fma_pos(q, f64, float(c), out=q)
        out[a:a + step] = q
    return out


def _bf16_rne(v: np.ndarray) -> np.ndarray:
    """RNE float32 -> bf16 (widened to float32) for finite values (``binary32.to_bf16`` without
    the NaN handling; uint32 arithmetic cannot overflow below 0x7F7FFFFF + 0x8000)."""
    b = v.view(np.uint32)
    r = b + (np.uint32(0x7FFF) + ((b >> 16) & np.uint32(1)))
    r &= np.uint32(0xFFFF0000)
    return r.view(np.float32)


def _pos_ordered(v: np.ndarray) -> np.ndarray:
    """Ordered ints of float32 values known to be >= +0 (their bit patterns, as int64)."""
    return v.view(np.uint32).astype(np.int64)


def _pow2_f64(e: np.ndarray) -> np.ndarray:
    """2.0**e for integer arrays e in the float64 normal range (built from exponent bits)."""
    return ((np.asarray(e, dtype=np.int64) + 1023) << 52).view(np.float64)


def emu_direct(x: np.ndarray, cs: tuple[np.float32, ...]) -> np.ndarray:
    """FA4's packed emulation for finite float32 x in [-126, 128) (bit-exact to the twin there;
    checked by tests): n = floor(x), f = RN32(x - n), p(f) by fused Horner, exponent add."""
    n = np.floor(x)
    f = x - n                                   # float32 arithmetic: RN, as sub.rn.f32
    q = _horner(f, cs)
    return (q.view(np.int32) + (n.astype(np.int32) << 23)).view(np.float32)


def _ulp_fmt(x: np.ndarray, mant: int, emin: int) -> np.ndarray:
    """ulp of the exact 2^x in a format (``mant`` fraction bits, normal exponent >= ``emin``):
    2^x lies in [2^floor(x), 2^(floor(x)+1)) -- taken from x, since float64 exp2(x) can round up to
    a power of two (e.g. x = -2^-149 gives 1.0)."""
    e = np.maximum(np.floor(np.asarray(x, dtype=np.float64)), emin)
    return _pow2_f64(e.astype(np.int64) - mant)


def _spacing(x: np.ndarray) -> np.ndarray:
    """ulp(x) of finite float32 x (the weight of x in the uniform-in-value convention):
    2^(max(E, 1) - 150) for the biased exponent field E; equals ``binary32.ulp`` (tested)."""
    e = ((x.view(np.uint32) >> 23) & 0xFF).astype(np.int64)
    return _pow2_f64(np.maximum(e, 1) - 150)


# ============================================================================ direct evaluation
def metrics_reference(x: np.ndarray, emu: np.ndarray, y: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """``metrics`` as computed by the earlier kernels (one oracle filter per format; any emu values).

    Per-input error measures for float32 inputs ``x`` (main domain) and emulated values ``emu``:
    ``rel`` (signed), ``d32`` (fp32 ulps from RN32(2^x)), ``u_bf16``/``u_f16`` (|RN_fmt(emu) - 2^x|
    in ulps of 2^x), ``w_bf16``/``w_f16`` (RN_fmt(emu) != RN_fmt(2^x)) and ``w`` (ulp(x) weights)."""
    from fa4verify.oracles.exp2 import exp2_cr_from_f64
    x64 = x.astype(np.float64)
    if y is None:
        y = np.exp2(x64)
    e64 = emu.astype(np.float64)
    m = {"rel": e64 / y - 1.0}
    cr32 = exp2_cr_from_f64(x, y, "f32").astype(np.float32)
    if np.all(emu >= 0):          # main domain: emu, RN32(2^x) > 0; ordered ints are the bits
        m["d32"] = np.abs(_pos_ordered(emu) - _pos_ordered(cr32))
    else:
        m["d32"] = np.abs(b32.ordered(emu) - b32.ordered(cr32))
    for fmt, mant, emin in (("bf16", 7, -126), ("f16", 10, -14)):
        # emu is a float32: RN_f16(emu) by numpy's float32 -> float16 cast (RNE, = round_f64(e64, "f16"))
        with np.errstate(over="ignore"):                 # fp16 overflow to inf is intended
            r = (_bf16_rne(emu) if fmt == "bf16" else emu.astype(np.float16)).astype(np.float64)
        cr = exp2_cr_from_f64(x, y, fmt)
        with np.errstate(invalid="ignore"):
            u = np.abs(r - y) / _ulp_fmt(x64, mant, emin)
        m[f"u_{fmt}"] = np.where(np.isnan(u), np.inf, u)
        m[f"w_{fmt}"] = r != cr
    m["w"] = _spacing(x)
    return m


#: "fused" (default) or "reference": which ``metrics`` / ``_horner`` the sweep runs; the two are
#: equal bit for bit (tests/test_exp2_sweep_speed.py compares whole sweeps).
_IMPL: Literal["fused", "reference"] = "fused"


def metrics(x: np.ndarray, emu: np.ndarray, y: np.ndarray | None = None, *,
            maxima_only: bool = False) -> dict[str, np.ndarray]:
    """Per-input error measures for float32 inputs ``x`` (main domain) and emulated values ``emu``:
    ``rel`` (signed), ``d32`` (fp32 ulps from RN32(2^x)), ``u_bf16``/``u_f16`` (|RN_fmt(emu) - 2^x|
    in ulps of 2^x), ``w_bf16``/``w_f16`` (RN_fmt(emu) != RN_fmt(2^x)) and ``w`` (ulp(x) weights).

    Note [One oracle filter]: equal to ``metrics_reference`` value for value, with one float64
    filter (fp32) instead of three. For x in the main domain the exact 2^x is irrational (x not an
    integer) or a power of two, never a bf16/fp16 midpoint, so RN_fmt(2^x) = RN_fmt(RN32(2^x))
    unless RN32(2^x) is itself a midpoint of fmt (double rounding: the argument of Note [Horner
    without round-to-odd]; every bf16/fp16 midpoint at or above 2^-25 is an fp32). Those elements
    -- fp32 values with low 16 bits 0x8000 (bf16), or low 13 bits 0x1000 in the fp16 normal
    range, and every value below 2^-14 (fp16 subnormal range, where the test is not the bit
    pattern) -- go through the format's own filter (``exp2_cr_from_f64``). An input the old
    per-format filter left undecided has 2^x within 2^-49 relative of a midpoint m of fmt, so
    RN32(2^x) = m and the input is in that subset: the mpmath fallbacks (and their count) are the
    same. Emulated values outside (0, inf) (mutants) take ``metrics_reference``.

    ``maxima_only``: only ``rel``, ``d32`` and ``u_*`` (what ``_maxima`` reads); the midpoint
    subsets still go through the oracle filters, so the fallback count does not change.
    """
    if _IMPL == "reference" or x.size == 0 or not bool(np.all((emu > 0) & (emu < np.inf))):
        return metrics_reference(x, emu, y)
    from fa4verify.oracles.exp2 import FILTER_REL_BOUND, exp2_cr_from_f64
    x64 = x.astype(np.float64)
    if y is None:
        y = np.exp2(x64)
    rel = emu.astype(np.float64)
    rel /= y
    rel -= 1.0
    m = {"rel": rel}
    # fp32: the filter of exp2_cr_from_f64 inline (same products, same casts), its fallback on
    # the undecided elements only
    with np.errstate(over="ignore", under="ignore"):
        cr32 = (y * (1 - FILTER_REL_BOUND)).astype(np.float32)
        hi = (y * (1 + FILTER_REL_BOUND)).astype(np.float32)
    und = cr32 != hi
    if und.any():
        i = np.flatnonzero(und)
        cr32[i] = exp2_cr_from_f64(x[i], y[i], "f32").astype(np.float32)
    cb = cr32.view(np.int32)
    d = emu.view(np.int32) - cb                 # both positive: bit patterns are ordered ints
    np.abs(d, out=d)
    m["d32"] = d
    # 1 / ulp_fmt(2^x) = 2^(mant - max(floor(x), emin)) (as _ulp_fmt; exact scaling)
    fl = np.floor(x64).astype(np.int64)
    for fmt, mant, emin in (("bf16", 7, -126), ("f16", 10, -14)):
        if fmt == "bf16":
            r32 = _bf16_rne(emu)
            cr = None if maxima_only else _bf16_rne(cr32)
            sub = (cb & 0xFFFF) == 0x8000
        else:
            r32 = _f16_rne(emu)
            cr = None if maxima_only else _f16_rne(cr32)
            sub = ((cb & 0x1FFF) == 0x1000) | (cb < 0x38800000)      # 0x38800000 = 2^-14
        if sub.any():
            i = np.flatnonzero(sub)
            ci = (exp2_cr_from_f64(x[i], y[i], fmt) if fmt == "bf16" else _cr_f16(x[i], y[i])).astype(np.float32)
            if cr is not None:
                cr[i] = ci
        r = r32.astype(np.float64)
        r -= y
        np.abs(r, out=r)
        e = np.maximum(fl, emin)
        np.subtract(1023 + mant, e, out=e)
        e <<= 52
        r *= e.view(np.float64)
        nan = np.isnan(r)
        if nan.any():
            r[nan] = np.inf
        m[f"u_{fmt}"] = r
        if not maxima_only:
            m[f"w_{fmt}"] = r32 != cr
    if not maxima_only:
        m["w"] = _spacing(x)
    return m


def metrics_blocked(x: np.ndarray, emu: np.ndarray) -> dict[str, np.ndarray]:
    """``metrics(x, emu)`` computed in blocks of ``FUSED_BLOCK`` into whole arrays (the measures
    are elementwise: the same arrays)."""
    if _IMPL == "reference" or x.size <= FUSED_BLOCK:
        return metrics(x, emu)
    out: dict = {}
    for a in range(0, x.size, FUSED_BLOCK):
        sl = slice(a, a + FUSED_BLOCK)
        m = metrics(x[sl], emu[sl])
        if not out:
            if set(m) != {"rel", "d32", "u_bf16", "u_f16", "w_bf16", "w_f16", "w"}:
                return metrics(x, emu)              # the reference path (mutant values)
            out = {k: np.empty(x.shape, dtype=v.dtype) for k, v in m.items()}
        if m.keys() != out.keys() or any(m[k].dtype != out[k].dtype for k in m):
            return metrics(x, emu)
        for k, v in m.items():
            out[k][sl] = v
    return out


def _cr_f16(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``exp2_cr_from_f64(x, y, "f16")``, value for value and with the same fallbacks, without
    numpy's float64 -> float16 cast where the filter's products lie below 2^-14 (that cast is
    slow on fp16 subnormals): there RN_f16(v) = rint(v 2^24) 2^-24 exactly (power-of-two scaling,
    RNE ``rint``; a v that rounds up to 2^-14 gives 2^-14 both ways). Undecided elements (the two
    products round apart) and elements at or above 2^-14 go through ``exp2_cr_from_f64``."""
    from fa4verify.oracles.exp2 import FILTER_REL_BOUND, exp2_cr_from_f64
    with np.errstate(over="ignore", under="ignore"):
        vlo = y * (1 - FILTER_REL_BOUND)
        vhi = y * (1 + FILTER_REL_BOUND)
    small = vhi < 2.0**-14
    lo = np.rint(vlo * 2.0**24) * 2.0**-24
    hi = np.rint(vhi * 2.0**24) * 2.0**-24
    other = ~small | (lo != hi)
    if other.any():
        i = np.flatnonzero(other)
        lo[i] = exp2_cr_from_f64(x[i], y[i], "f16")
    return lo


def _f16_rne(v: np.ndarray) -> np.ndarray:
    """RNE float32 -> fp16 (widened to float32) for v > 0: the bit trick of ``_bf16_rne`` with 13
    dropped bits where the result is an fp16 normal or overflows (v >= 2^-14), and below (fp16
    subnormals) rint(v 2^24) 2^-24 (exact scaling and RNE). Equals
    ``v.astype(float16).astype(float32)`` (tested)."""
    b = v.view(np.uint32)
    r = b + (np.uint32(0xFFF) + ((b >> 13) & np.uint32(1)))
    r &= np.uint32(0xFFFFE000)
    out = r.view(np.float32)
    out[out >= np.float32(65536.0)] = np.inf
    low = b < np.uint32(0x38800000)
    if low.any():
        out[low] = np.rint(v[low] * np.float32(2.0**24)) * np.float32(2.0**-24)
    return out


def aggregate(x: np.ndarray, emu: np.ndarray, m: dict[str, np.ndarray]) -> Stats:
    """Stats of sorted inputs ``x`` from their per-input ``metrics``."""
    st = Stats()
    if x.size == 0:
        return st
    st.n = int(x.size)
    _maxima(x, m, st)
    w = m["w"]
    st.weight = float(w.sum())
    for fmt in FMTS:
        u, wrong = m[f"u_{fmt}"], m[f"w_{fmt}"]
        setattr(st, f"wrong_{fmt}", int(np.count_nonzero(wrong)))
        setattr(st, f"weight_wrong_{fmt}", float(w[wrong].sum()))
        if wrong.any():
            uw = np.where(wrong, u, -1.0)
            j = int(np.argmax(uw))
            setattr(st, f"worst_wrong_{fmt}", float(x[j]))
            setattr(st, f"worst_wrong_{fmt}_ulp", float(u[j]))
    down = np.flatnonzero(emu[1:] < emu[:-1])
    st.mono_violations = int(down.size)
    st.mono_at = [float(x[i + 1]) for i in down[:5]]
    st.first = (float(x[0]), float(emu[0]))
    st.last = (float(x[-1]), float(emu[-1]))
    return st


def _maxima(x: np.ndarray, m: dict[str, np.ndarray], st: Stats) -> None:
    """Set the maxima of ``st`` (rel, fp32 ulps, bf16/fp16 ulps; argmax = first input attaining it)."""
    ar = np.abs(m["rel"])
    i = int(np.argmax(ar))
    st.max_rel, st.argmax_rel, st.signed_rel_at_max = float(ar[i]), float(x[i]), float(m["rel"][i])
    i = int(np.argmax(m["d32"]))
    st.max_ulp32, st.argmax_ulp32 = int(m["d32"][i]), float(x[i])
    for fmt in FMTS:
        u = m[f"u_{fmt}"]
        i = int(np.argmax(u))
        setattr(st, f"max_ulp_{fmt}", float(u[i]))
        setattr(st, f"argmax_ulp_{fmt}", float(x[i]))


def _maxima_blocked(x: np.ndarray, emu: np.ndarray, y: np.ndarray, st: Stats) -> None:
    """``_maxima(x, metrics(x, emu, y), st)`` in blocks of ``FUSED_BLOCK`` (the first input
    attaining each maximum wins, as with one argmax over the whole array)."""
    best: dict = {}
    for a in range(0, x.size, FUSED_BLOCK):
        sl = slice(a, a + FUSED_BLOCK)
        part = Stats()
        _maxima(x[sl], metrics(x[sl], emu[sl], y[sl], maxima_only=True), part)
        for key in ("rel", "ulp32", "ulp_bf16", "ulp_f16"):
            v = getattr(part, f"max_{key}")
            if key not in best or v > best[key][0]:
                best[key] = (v, getattr(part, f"argmax_{key}"), part.signed_rel_at_max)
    for key, (v, arg, sgn) in best.items():
        setattr(st, f"max_{key}", v)
        setattr(st, f"argmax_{key}", arg)
        if key == "rel":
            st.signed_rel_at_max = sgn


def direct_stats(x: np.ndarray, emu: np.ndarray, *, y: np.ndarray | None = None) -> Stats:
    """Statistics for sorted float32 inputs ``x`` (main domain, x >= -126) and their emulated values."""
    if x.size == 0:
        return Stats()
    return aggregate(x, emu, metrics(x, emu, y))


def _ordered_to_f32(o: np.ndarray) -> np.ndarray:
    """Inverse of ``binary32.ordered`` (0 maps to +0.0)."""
    o = np.asarray(o, dtype=np.int64)
    b = np.where(o < 0, (-o) | 0x80000000, o)
    return b.astype(np.uint32).view(np.float32)


def _f32_ord(v: float) -> int:
    return int(b32.ordered(np.float32(v)))


def task_direct(degree: int, olo: int, ohi: int, variant_check: bool = False) -> Stats:
    """Direct evaluation of the inputs with ordered ints in [olo, ohi] (main domain only)."""
    cs = _coeffs(degree)
    out = []
    o = olo
    block = FUSED_BLOCK if _IMPL == "fused" else BLOCK      # Note [Sweep schedule]: same Stats
    while o <= ohi:
        stop = min(ohi, o + block - 1)
        x = _ordered_to_f32(np.arange(o, stop + 1, dtype=np.int64))
        emu = emu_direct(x, cs)
        if variant_check:
            from fa4verify.kernels.twin import ex2_emulation
            assert np.array_equal(emu.view(np.uint32), ex2_emulation(x, degree).view(np.uint32))
        out.append(direct_stats(x, emu))
        o = stop + 1
    return merge_all(out)


# ============================================================================ (R1) fraction grid
_GRID_KEYS = [("full", s) for s in range(MAX_STRIDE_LOG + 1)] + [("lowhalf", 0), ("highhalf", 0)]


def task_grid(degree: int, a: int, b: int, kmin: int = 0) -> dict:
    """Per-class partial aggregates over base-grid indices i in [a, b), i = 0 mod 2^kmin
    (f = i 2^-24; ``a`` is a multiple of 2^MAX_STRIDE_LOG).

    Classes: ("full", k), k >= kmin: i = 0 mod 2^k; ("lowhalf", 0): i in [0, 2^23] (f in [0, 1/2]);
    ("highhalf", 0): i in [2^23, 2^24) (the halves only when kmin == 0). Each class's Stats uses
    x = f (n = 0); callers rescale (R1).
    """
    # a multiple of 2^MAX_STRIDE_LOG: blocks stay aligned
    span = BLOCK << kmin
    parts: dict = {}
    for ba in range(a, b, span):
        for key, st in _grid_block(degree, ba, min(b, ba + span), kmin).items():
            parts.setdefault(key, []).append(st)
    return {key: merge_all(v) for key, v in parts.items()}


def _grid_block(degree: int, a: int, b: int, kmin: int) -> dict:
    """``task_grid`` on one cache-sized block (``a`` aligned as there)."""
    cs = _coeffs(degree)
    i = np.arange(a, b, 1 << kmin, dtype=np.int64)
    f = (i.astype(np.float64) * 2.0**-GRID_BITS).astype(np.float32)
    q = _horner(f, cs)
    met = metrics_blocked(f, q)
    res = {}
    for cls, k in _GRID_KEYS:
        if cls == "full":
            if k < kmin:
                continue
            sl = slice(0, None, 1 << (k - kmin))            # i = 0 mod 2^k (a is aligned)
            res[(cls, k)] = aggregate(f[sl], q[sl], {kk: vv[sl] for kk, vv in met.items()})
            continue
        if kmin:
            continue
        m = (i <= (1 << 23)) if cls == "lowhalf" else (i >= (1 << 23))
        if m.all():                 # the whole block: the same aggregate as ("full", 0)
            res[(cls, k)] = replace(res[("full", 0)], mono_at=list(res[("full", 0)].mono_at))
        elif m.any():
            res[(cls, k)] = aggregate(f[m], q[m], {kk: vv[m] for kk, vv in met.items()})
    return res


# ============================================================================ (R2)/(R3) runs
@dataclass
class Runs:
    """Contiguous runs of inputs (ordered ints oa..ob inclusive) with constant emulated value v."""
    oa: np.ndarray
    ob: np.ndarray
    v: np.ndarray


def _boundary_table(fmt: str, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each value B (already in ``fmt``, positive normal), the ordered ints of X(m_lo) and
    X(m_hi): inputs x with RN_fmt(2^x) == B are exactly those with ord(x) in [lo, hi)."""
    if vals.size and bool(np.all(vals[1:] >= vals[:-1])):      # runs in input order: no sort needed
        first = np.concatenate([[True], vals[1:] != vals[:-1]])
        uniq, idx = vals[first], np.cumsum(first) - 1
    else:
        uniq = np.unique(vals)
        idx = np.searchsorted(uniq, vals)
    if fmt == "bf16":
        hb = (b32.bits(uniq.astype(np.float32)) >> 16).astype(np.int64)
        pred = b32.bf16_bits_to_f32((hb - 1).astype(np.uint16)).astype(np.float64)
        succ = b32.bf16_bits_to_f32((hb + 1).astype(np.uint16)).astype(np.float64)
    else:
        h = uniq.astype(np.float16)
        hb = h.view(np.uint16).astype(np.int64)
        pred = (hb - 1).astype(np.uint16).view(np.float16).astype(np.float64)
        succ = (hb + 1).astype(np.uint16).view(np.float16).astype(np.float64)
    mlo, mhi = (uniq + pred) / 2, (uniq + succ) / 2      # exact in float64
    xlo = np.array([_f32_ord(_first_above_cached(float(m))) for m in mlo], dtype=np.int64)
    xhi = np.array([_f32_ord(_first_above_cached(float(m))) for m in mhi], dtype=np.int64)
    return xlo[idx], xhi[idx], idx


_FIRST_ABOVE: dict[float, np.float32] = {}


def _first_above_cached(m: float) -> np.float32:
    from fa4verify.oracles.exp2 import first_x_above
    r = _FIRST_ABOVE.get(m)
    if r is None:
        r = _FIRST_ABOVE[m] = first_x_above(m)
    return r


def _value_measure(oa: np.ndarray, ob: np.ndarray) -> np.ndarray:
    """Sum of ulp(x) over the inputs with ordered ints in [oa, ob] (same sign, oa <= ob);
    0 for empty ranges (ob < oa)."""
    empty = ob < oa
    if _IMPL == "fused" and oa.size and not empty.any() and (bool(np.all(ob < 0)) or bool(np.all(oa >= 0))):
        # one sign, no empty range: the branch of the general formula below that applies
        fa, fb = _ordered_to_f32(oa), _ordered_to_f32(ob)
        xa, xb = fa.astype(np.float64), fb.astype(np.float64)
        if ob[0] < 0:
            w = np.abs(xa)
            w += _spacing(fa)
            w -= np.abs(xb)
        else:
            w = xb + _spacing(fb)
            w -= xa
        return w
    oa2, ob2 = np.where(empty, 0, oa), np.where(empty, 0, ob)
    fa, fb = _ordered_to_f32(oa2), _ordered_to_f32(ob2)
    xa, xb = fa.astype(np.float64), fb.astype(np.float64)
    ua, ub = _spacing(fa), _spacing(fb)
    pos = ob2 >= 0
    w = np.where(pos, (xb + ub) - xa, (np.abs(xa) + ua) - np.abs(xb))
    return np.where(empty, 0.0, w)


def runs_stats(runs: Runs) -> Stats:
    """Statistics of inputs covered by runs of constant emulated value (see (R2))."""
    from fa4verify.oracles.exp2 import round_f64
    st = Stats()
    if runs.oa.size == 0:
        return st
    oa, ob, v = runs.oa, runs.ob, runs.v
    st.n = int((ob - oa + 1).sum())
    xa, xb = _ordered_to_f32(oa), _ordered_to_f32(ob)
    ends = np.concatenate([xa, xb])
    vv = np.concatenate([v, v])
    y = np.exp2(ends.astype(np.float64))
    # the result binade of 2^x must not change inside a run (ulps constant): check
    ya, yb = y[: oa.size], y[oa.size:]
    assert np.all(np.floor(xa) == np.floor(xb)), "run crosses a binade of 2^x"
    # maxima at the run ends (the error is monotone inside a run): as direct_stats of the ends
    if _IMPL == "fused":
        _maxima_blocked(ends, vv, y, st)
    else:
        _maxima(ends, metrics(ends, vv, y, maxima_only=True), st)
    st.weight = float(_value_measure(oa, ob).sum())
    v64 = v.astype(np.float64)
    fused = _IMPL == "fused" and bool(np.all((v > 0) & (v < np.inf)))
    for fmt in FMTS:
        if fused:           # v > 0 finite: the bit tricks equal the general roundings (tested)
            r = (_bf16_rne(v) if fmt == "bf16" else _f16_rne(v)).astype(np.float64)
        else:
            r = b32.to_bf16(v).astype(np.float64) if fmt == "bf16" else round_f64(v64, "f16")
        lo, hi, _ = _boundary_table(fmt, r)
        # wrong = inputs below X(m_lo) or at/above X(m_hi)
        below_b = np.minimum(ob, lo - 1)
        above_a = np.maximum(oa, hi)
        n_below = np.maximum(0, below_b - oa + 1)
        n_above = np.maximum(0, ob - above_a + 1)
        setattr(st, f"wrong_{fmt}", int((n_below + n_above).sum()))
        # the measure of the wrong inputs, computed on the (few) runs that have any and scattered
        # into zeros (_value_measure is 0 on an empty range): the same array, summed in the same order
        wb, wa = np.flatnonzero(n_below > 0), np.flatnonzero(n_above > 0)
        wgt = np.zeros(oa.size)
        wgt[wb] = _value_measure(oa[wb], below_b[wb])
        wgt[wa] += _value_measure(above_a[wa], ob[wa])
        setattr(st, f"weight_wrong_{fmt}", float(wgt.sum()))
        # worst wrong input: a wrong run's far end carries its largest error (monotone 2^x)
        bad = (n_below + n_above) > 0
        if bad.any():
            mant, emin = (7, -126) if fmt == "bf16" else (10, -14)
            # the error at the far end of each wrong run (computed on those runs only), -1 elsewhere
            ulp_e = np.full(2 * oa.size, -1.0)
            ulp_e[wb] = np.abs(r[wb] - ya[wb]) / _ulp_fmt(xa[wb], mant, emin)
            ulp_e[oa.size + wa] = np.abs(r[wa] - yb[wa]) / _ulp_fmt(xb[wa], mant, emin)
            j = int(np.argmax(ulp_e))
            setattr(st, f"worst_wrong_{fmt}", float(ends[j]))
            setattr(st, f"worst_wrong_{fmt}_ulp", float(ulp_e[j]))
    down = np.flatnonzero(v[1:] < v[:-1])
    st.mono_violations = int(down.size)
    st.mono_at = [float(xa[i + 1]) for i in down[:5]]
    st.first = (float(xa[0]), float(v[0]))
    st.last = (float(xb[-1]), float(v[-1]))
    return st


def direct_stats_unsorted(x: np.ndarray, emu: np.ndarray, y: np.ndarray) -> Stats:
    """``direct_stats`` without the monotonicity/order-dependent parts (for run end points)."""
    s = direct_stats(x, emu, y=y)
    s.mono_violations, s.mono_at = 0, []
    return s


def runs_bucket(degree: int, ja: int, jb: int, olo: int, ohi: int) -> Runs:
    """(R2) buckets j in [ja, jb) of x in (-1/2, 0), clipped to ordered ints [olo, ohi]."""
    cs = _coeffs(degree)
    j = np.arange(ja, jb, dtype=np.int64)
    fj = 0.5 + j.astype(np.float64) * 2.0**-24
    lo_r, hi_r = fj - 1 - 2.0**-25, fj - 1 + 2.0**-25        # exact, representable
    even = (j % 2) == 0
    oa = b32.ordered(lo_r.astype(np.float32)) + np.where(even, 0, 1)
    ob = b32.ordered(np.minimum(hi_r, -2.0**-149).astype(np.float32)) - np.where(even | (hi_r >= 0), 0, 1)
    oa = np.maximum(oa, max(olo, _f32_ord(-0.5) + 1))
    ob = np.minimum(ob, min(ohi, -1))
    keep = ob >= oa
    oa, ob = oa[keep], ob[keep]
    if oa.size == 0:
        return Runs(oa, ob, np.zeros(0, np.float32))
    xa, xb = _ordered_to_f32(oa), _ordered_to_f32(ob)
    va, vb = emu_direct(xa, cs), emu_direct(xb, cs)
    assert np.array_equal(va, vb), "bucket structure violated: emu differs at the ends of a bucket"
    # and the neighbours just outside each bucket give the neighbouring bucket's value (structure
    # of (R2)): checked implicitly by monotone non-decreasing v across buckets in runs_stats.
    return Runs(oa, ob, va)


def runs_monotone(degree: int, olo: int, ohi: int, step: int = 4096) -> Runs:
    """(R3) maximal runs of constant emu over inputs with ordered ints [olo, ohi] in [0, 1)
    (emu non-decreasing there), found by bisection."""
    cs = _coeffs(degree)
    if not all(float(c) > 0 for c in cs):
        raise ValueError("monotone-run reduction needs positive coefficients")

    def ev(o):
        return emu_direct(_ordered_to_f32(o), cs)

    pts = np.unique(np.concatenate([np.arange(olo, ohi + 1, step, dtype=np.int64), [ohi]]))
    vals = ev(pts)
    if np.any(vals[1:] < vals[:-1]):
        raise AssertionError("emu not monotone on [0, 1): reduction (R3) invalid")
    lo, hi, vlo, vhi = pts[:-1], pts[1:], vals[:-1], vals[1:]
    m = vlo != vhi
    lo, hi, vlo, vhi = lo[m], hi[m], vlo[m], vhi[m]
    steps = []
    while lo.size:
        done = (hi - lo) == 1
        steps.append(hi[done])
        lo, hi, vlo, vhi = lo[~done], hi[~done], vlo[~done], vhi[~done]
        if not lo.size:
            break
        mid = (lo + hi) // 2
        vm = ev(mid)
        if np.any((vm < vlo) | (vm > vhi)):
            raise AssertionError("emu not monotone on [0, 1): reduction (R3) invalid")
        l_ok, r_ok = vlo != vm, vm != vhi
        lo = np.concatenate([lo[l_ok], mid[r_ok]])
        hi = np.concatenate([mid[l_ok], hi[r_ok]])
        vlo = np.concatenate([vlo[l_ok], vm[r_ok]])
        vhi = np.concatenate([vm[l_ok], vhi[r_ok]])
    st = np.sort(np.concatenate(steps)) if steps else np.zeros(0, np.int64)
    oa = np.concatenate([[olo], st]).astype(np.int64)
    ob = np.concatenate([st - 1, [ohi]]).astype(np.int64)
    return Runs(oa, ob, ev(oa))


def task_runs_bucket(degree, ja, jb, olo, ohi) -> Stats:
    """(R2) statistics of buckets j in [ja, jb), evaluated in cache-sized blocks of buckets."""
    return merge_all(runs_stats(runs_bucket(degree, a, min(jb, a + BLOCK), olo, ohi))
                     for a in range(ja, jb, BLOCK))


def task_runs_monotone(degree, olo, ohi) -> Stats:
    # split at binades of x so that runs never cross one (weights), and 2^x stays in [1, 2)
    return runs_stats(runs_monotone(degree, olo, ohi))


# ============================================================================ planning
@dataclass
class Piece:
    kind: Literal["direct", "grid", "bucket", "runs", "f16zero"]
    args: tuple
    size: int                 # number of inputs (for progress)
    n: int | None = None      # unit interval (grid pieces)


def _unit_ulp(n: int) -> float:
    """Spacing of the fp32 numbers strictly inside [n, n+1) (n >= 1 or n <= -2)."""
    a = n if n >= 1 else -n - 1
    return 2.0 ** (math.floor(math.log2(a)) - 23)


def plan(lo: float, hi: float, *, method: str = "fast") -> list[Piece]:
    """Split the main domain part of [lo, hi] (x in [-126, 128)) into pieces (see Note)."""
    lo = max(lo, -126.0)
    hi = min(hi, float(np.nextafter(np.float32(128.0), np.float32(0))))
    if hi < lo:
        return []
    olo, ohi = b32.f32_range(lo, hi)
    if ohi < olo:
        return []
    pieces: list[Piece] = []

    def direct(a: int, b: int):
        a, b = max(a, olo), min(b, ohi)
        o = a
        while o <= b:
            e = min(b, o + (1 << 23) - 1)
            pieces.append(Piece("direct", (o, e), e - o + 1))
            o = e + 1

    if method == "direct":
        direct(olo, ohi)
        return pieces
    o = lambda v: _f32_ord(v)  # noqa: E731
    prev = lambda v: _f32_ord(v) - 1  # noqa: E731  (ordered int of the float below v)
    n0, n1 = math.floor(float(np.float32(lo))), math.floor(float(_ordered_to_f32(np.int64(ohi))))
    for n in range(n0, n1 + 1):
        ua, ub = o(float(n)), prev(float(n + 1))          # ordered span of [n, n+1)
        if ub < olo or ua > ohi:
            continue
        full = ua >= olo and ub <= ohi
        if n == -1:
            a, b = o(-1.0), o(-0.5)                        # [-1, -1/2]
            if a >= olo and b <= ohi:
                pieces.append(Piece("grid", ("lowhalf", 0), b - a + 1, n=-1))
            else:
                direct(a, b)
            ba, bb = max(olo, o(-0.5) + 1), min(ohi, -1)      # (-1/2, 0)
            if ba <= bb:
                jall = (1 << 23) + 1
                step = 1 << 19
                for ja in range(0, jall, step):
                    jb = min(jall, ja + step)
                    xa = 0.5 + ja * 2.0**-24 - 1 - 2.0**-25
                    xb = 0.5 + jb * 2.0**-24 - 1 - 2.0**-25
                    sa = max(ba, o(max(xa, -0.5)))
                    sb_ = min(bb, o(min(xb, -(2.0**-149))))
                    if sa <= sb_ + 1:
                        pieces.append(Piece("bucket", (ja, jb, olo, ohi), max(0, sb_ - sa + 1)))
            continue
        if n == 0:
            a = o(0.0)
            sb = prev(SEG_HI)
            # (R3) runs on [0, 2^-5): one task per x-binade (and one for zero + subnormals)
            if sb >= olo and a <= ohi:
                edges = [o(0.0)] + [o(2.0**e) for e in range(-126, -4)]
                for k in range(len(edges) - 1):
                    ra, rb = max(edges[k], olo), min(edges[k + 1] - 1, ohi, sb)
                    if ra <= rb:
                        pieces.append(Piece("runs", (ra, rb), rb - ra + 1))
            direct(o(SEG_HI), prev(0.5))
            a, b = o(0.5), prev(1.0)
            if a >= olo and b <= ohi:
                pieces.append(Piece("grid", ("highhalf", 0), b - a + 1, n=0))
            else:
                direct(a, b)
            continue
        if not full:
            direct(ua, ub)
            continue
        if -25 <= n <= -15 or n >= 15:
            direct(ua, ub)                                  # fp16 not scale-invariant here
            continue
        k = int(round(math.log2(_unit_ulp(n) * 2.0**GRID_BITS)))
        pieces.append(Piece("grid", ("full", k), ub - ua + 1, n=n))
    return pieces


# ============================================================================ grid rescaling
def _scale_grid_stats(s: Stats, n: int, u: float, count: int) -> Stats:
    """Stats of the unit piece x = n + f from the class stats computed at x = f (see (R1))."""
    r = Stats(**{k: getattr(s, k) for k in s.__dataclass_fields__})
    sh = lambda f: float(np.float32(n + f)) if not math.isnan(f) else f  # noqa: E731
    for k in ("argmax_rel", "argmax_ulp32", "argmax_ulp_bf16", "argmax_ulp_f16", "worst_wrong_bf16",
              "worst_wrong_f16"):
        setattr(r, k, sh(getattr(s, k)))
    # all inputs but the first (x = n, or x = 1/2 for the [1/2, 1) piece) are spaced u apart; the
    # first may sit in the binade above (x = -2^k)
    r.weight = (count - 1) * u + float(_spacing(np.float32([n + s.first[0]]))[0])
    r.weight_wrong_bf16 = s.wrong_bf16 * u
    r.weight_wrong_f16 = s.wrong_f16 * u
    if n <= -26:                        # fp16: both RN_f16(emu) and RN_f16(2^x) are 0 (2^(n+1) <= 2^-25)
        r.wrong_f16, r.weight_wrong_f16 = 0, 0.0
        r.worst_wrong_f16, r.worst_wrong_f16_ulp = float("nan"), 0.0
        # |0 - 2^x| / 2^-24 is largest at the largest x of the piece
        xl = n + 1 - u
        r.max_ulp_f16, r.argmax_ulp_f16 = 2.0 ** (xl + 24), float(np.float32(xl))
    scale = 2.0**n
    r.mono_at = [float(np.float32(n + f)) for f in s.mono_at]
    r.first = (float(np.float32(n + s.first[0])), float(s.first[1]) * scale)
    r.last = (float(np.float32(n + s.last[0])), float(s.last[1]) * scale)
    return r


# ============================================================================ driver
@dataclass
class SweepResult:
    degree: int
    lo: float
    hi: float
    method: str
    stats: Stats
    seconds: float
    pieces: dict = field(default_factory=dict)
    fallbacks: int = 0


_GRID_CACHE: dict = {}

#: direct pieces are cut into tasks of at most this many inputs (load balance over --jobs)
DIRECT_TASK = 1 << 21
#: relative cost per unit of work (input, grid point, bucket) by task kind, for the longest-first
#: schedule (measured on the 2-core box; only the order of tasks depends on it)
_COST = {"direct": 1.0, "grid": 1.2, "bucket": 4.5, "runs": 1.0}


def _run_task(t):
    kind, degree, args, impl = t[:4]
    global _IMPL
    _IMPL = impl
    from fa4verify.oracles.exp2 import oracle_stats
    fb0 = oracle_stats()["fallbacks"]
    key = (degree, args, impl)
    if kind == "grid" and key in _GRID_CACHE:                  # same coefficients: same result
        return t, _GRID_CACHE[key], 0
    if kind == "direct":
        r = task_direct(degree, *args)
    elif kind == "grid":
        r = task_grid(degree, *args)
        _GRID_CACHE[key] = r
    elif kind == "bucket":
        r = task_runs_bucket(degree, *args)
    elif kind == "runs":
        r = task_runs_monotone(degree, *args)
    else:
        raise ValueError(kind)
    return t, r, oracle_stats()["fallbacks"] - fb0


def _task_work(kind: str, args: tuple, size: int) -> float:
    """Estimated cost of a task (schedule order only)."""
    if kind == "grid":
        return _COST["grid"] * ((args[1] - args[0]) >> args[2])
    if kind == "bucket":
        return _COST["bucket"] * (args[1] - args[0])
    return _COST[kind] * size


def sweep(degree: int, lo: float, hi: float, *, method: str = "fast", jobs: int = 1,
          progress: Callable[[int, int], None] | None = None,
          impl: Literal["fused", "reference"] = "fused") -> SweepResult:
    """Statistics over every float32 x in [lo, hi] ∩ [-126, 128) (see module docstring).

    ``method="fast"`` uses the reductions (R1)-(R3); ``"direct"`` evaluates every input.
    ``progress(done, total)`` is called as tasks finish (units: inputs). ``impl`` picks the
    per-input kernels (``metrics`` and ``_horner``: "fused", or "reference", the earlier
    code); the statistics are the same bit for bit (Note [Sweep schedule]).

    Note [Sweep schedule]: the statistics do not depend on the schedule. Tasks run longest first
    (``_task_work``) on ``jobs`` processes, in any completion order; a direct piece (at most 2^23
    contiguous inputs, so within two binades of x) is cut into tasks of ``DIRECT_TASK`` inputs whose
    Stats are merged back into the piece's Stats before anything else (every weight sum inside a
    piece is an exact multiple of the smaller spacing below 2^53 of it, so the association of the
    merge cannot change it); then all pieces are merged in input order as before.
    """
    t0 = time.perf_counter()
    _coeffs(degree)                                  # validate the degree early
    if impl not in ("fused", "reference"):
        raise ValueError(f"impl must be 'fused' or 'reference', got {impl!r}")
    pieces = plan(lo, hi, method=method)
    tasks = []                                        # (kind, degree, args, impl, piece index, work)
    classes = {p.args[0] for p in pieces if p.kind == "grid"}
    need_grid = bool(classes)
    if need_grid:
        g = 1 << 21
        ga = 0 if classes & {"full", "lowhalf"} else 1 << 23
        gb = (1 << 23) + g if classes == {"lowhalf"} else 1 << GRID_BITS
        # only the points the requested strides need (all of them once a half piece is needed)
        kmin = 0 if classes & {"lowhalf", "highhalf"} else min(p.args[1] for p in pieces if p.kind == "grid")
        for a in range(ga, gb, g):
            tasks.append(("grid", degree, (a, a + g, kmin), impl, -1))
    for ip, p in enumerate(pieces):
        if p.kind == "direct":
            a, b = p.args
            for o in range(a, b + 1, DIRECT_TASK):
                tasks.append(("direct", degree, (o, min(b, o + DIRECT_TASK - 1)), impl, ip))
        elif p.kind != "grid":
            tasks.append((p.kind, degree, p.args, impl, ip))
    size_of = {ip: p.size for ip, p in enumerate(pieces)}

    def work_of(t):
        kind, _, args, _, ip = t
        if kind == "direct":
            return _task_work(kind, args, args[1] - args[0] + 1)
        return _task_work(kind, args, size_of.get(ip, 0))

    tasks.sort(key=work_of, reverse=True)             # longest first; ties keep plan order
    total = sum(p.size for p in pieces) + sum((t[2][1] - t[2][0]) >> t[2][2] for t in tasks if t[0] == "grid")
    done = 0
    results = []
    fallbacks = 0

    def account(t, r, fb):
        nonlocal done, fallbacks
        kind, _, args, _, ip = t
        if kind == "grid":
            _GRID_CACHE[(degree, args, impl)] = r
        results.append((t, r))
        fallbacks += fb
        if kind == "grid":
            done += (args[1] - args[0]) >> args[2]
        elif kind == "direct":
            done += args[1] - args[0] + 1
        elif kind == "bucket":
            done += r.n
        else:
            done += size_of.get(ip, r.n)
        if progress:
            progress(done, total)

    global _IMPL
    old_impl = _IMPL
    try:
        if jobs > 1 and len(tasks) > 1:
            import multiprocessing as mp
            ctx = mp.get_context("fork") if hasattr(os, "fork") else mp.get_context()
            with ctx.Pool(jobs) as pool:
                for t, r, fb in pool.imap_unordered(_run_task, tasks):
                    account(t, r, fb)
        else:
            for t in tasks:
                account(*_run_task(t))
    finally:
        _IMPL = old_impl
    # combine grid partials per class
    grid_parts: dict = {}
    for t, r in results:
        if t[0] == "grid":
            for key, s in r.items():
                grid_parts.setdefault(key, []).append(s)
    # merge in input order (Stats.merge checks monotonicity at the seam of adjacent pieces)
    grid = {key: merge_all(v) for key, v in grid_parts.items()}
    by_piece: dict = {}
    for t, r in results:
        if t[0] != "grid":
            by_piece.setdefault(t[4], []).append(r)
    parts = []
    counts = {"direct": 0, "grid": 0, "bucket": 0, "runs": 0}
    for ip, p in enumerate(pieces):
        if p.kind == "grid":
            cls = grid[p.args]
            u = _unit_ulp(p.n) if p.args[0] == "full" else 2.0**-24
            s = _scale_grid_stats(cls, p.n, u, p.size)
            assert s.n == p.size, (p, s.n)
        else:
            s = merge_all(by_piece.get(ip, []))
            if p.kind == "direct":
                assert s.n == p.size, (p, s.n)
        parts.append(s)
        counts[p.kind] += s.n
    st = merge_all(parts)
    return SweepResult(degree, lo, hi, method, st, time.perf_counter() - t0, counts, fallbacks)


def grid_mean_rel(degree: int) -> dict:
    """Mean of |emu(f)/2^f - 1| and of the signed error over the 2^24 points f = i 2^-24 of [0, 1)
    (uniform in value; comparable with the FA4 paper's Table 2 means over 4M samples of [0, 1)).
    emu(f) = fp32 fused Horner p(f), exactly what the kernel computes for x = f."""
    cs = _coeffs(degree)
    s_abs = s_sgn = 0.0
    n = 1 << GRID_BITS
    for a in range(0, n, 1 << 22):
        f = (np.arange(a, a + (1 << 22), dtype=np.float64) * 2.0**-GRID_BITS).astype(np.float32)
        rel = _horner(f, cs).astype(np.float64) / np.exp2(f.astype(np.float64)) - 1.0
        s_abs += float(np.abs(rel).sum())
        s_sgn += float(rel.sum())
    return {"mean_abs_rel_error": s_abs / n, "mean_signed_rel_error": s_sgn / n, "points": n,
            "grid": "f = i * 2^-24, i < 2^24 (all fp32 in [1/2, 1) and a uniform subset below)"}


# ============================================================================ edge domain
def edge_report(degree: int, lo: float = -127.0, hi: float = 8.0) -> dict:
    """The inputs FA4 treats specially, reported apart from the main statistics (CPU twin)."""
    from fa4verify.kernels.twin import ex2_emulation
    from fa4verify.oracles.exp2 import exp2_cr
    out: dict = {}
    sp = np.float32([np.nan, np.inf, -np.inf])
    e = ex2_emulation(sp, degree)
    out["nan"] = {"emu": repr(float(e[0])), "exact": "nan", "note": "fmax(NaN, -127) = -127: NaN scores become +0.0"}
    out["+inf"] = {"emu": repr(float(e[1])), "exact": "inf", "note": "garbage (FA4 assumes x <= 127)"}
    out["-inf"] = {"emu": repr(float(e[2])), "exact": "0.0"}
    # x <= -127
    xm = np.float32([-127.0, np.nextafter(np.float32(-127), np.float32(-np.inf)), -128.0, -1e30])
    em = ex2_emulation(xm, degree)
    out["le_minus127"] = {"all_zero": bool(np.all(em.view(np.uint32) == 0)), "examples": [float(v) for v in xm],
                          "exact_fp32": [float(v) for v in exp2_cr(xm, "f32")]}
    # (-127, -126): subnormal-writing region, all inputs
    a, b = b32.f32_range(-127.0, -126.0)
    x = _ordered_to_f32(np.arange(a + 1, b, dtype=np.int64))            # open interval
    em = ex2_emulation(x, degree)
    cr32 = exp2_cr(x, "f32")
    d = np.abs(b32.ordered(em) - b32.ordered(cr32))
    crb = exp2_cr(x, "bf16")
    wb = b32.to_bf16(em) != crb
    out["subnormal_region"] = {
        "range": "(-127, -126)", "n_inputs": int(x.size), "in_requested_range": bool(lo < -126.0),
        "max_ulp_fp32": int(d.max()), "argmax": float(x[int(np.argmax(d))]),
        "wrong_count_fp32": int(np.count_nonzero(em != cr32)), "wrong_count_bf16": int(wb.sum()),
        "note": "exponent field 0: emu = (p(f) - 1) * 2^-126 instead of 2^x (both below 2^-126)"}
    # tiny negatives [-2^-25, 0)
    ta, tb = b32.f32_range(-(2.0**-25), -(2.0**-149))
    xt = np.float32([-(2.0**-25), -1e-20, -(2.0**-149)])
    et = ex2_emulation(xt, degree)
    out["tiny_negatives"] = {
        "range": "[-2^-25, 0)", "n_inputs": int(tb - ta + 1), "emu_value": float(et[0]),
        "all_same": bool(np.all(et == et[0])), "exact_rounds_to": 1.0,
        "rel_error": float(abs(float(et[0]) - 1.0)),
        "fp32_ulp_error": int(b32.ulp_distance(et[0], np.float32(1.0))),
        "bf16_rounds_correctly": bool(b32.to_bf16(et[:1])[0] == 1.0),
        "fp16_rounds_correctly": bool(b32.to_fp16(et[:1])[0] == 1.0),
        "note": "floor = -1 and f = RN(1 + x) = 1.0, so emu = p(1)/2 (counted in the main statistics too)"}
    # x >= 128
    xg = np.float32([127.99999, 128.0, 129.5, 200.0])
    eg = ex2_emulation(xg, degree)
    out["ge_128"] = {"examples": [float(v) for v in xg], "emu": [repr(float(v)) for v in eg],
                     "note": "exponent field overflows (garbage); FA4's forward never exceeds 8"}
    return out


def parse_range(spec: str) -> tuple[float, float]:
    """'neg' | 'pos' | 'all' | 'LO:HI' (floats, LO <= HI) -> (lo, hi). Raises ValueError."""
    if spec in RANGES:
        return RANGES[spec]
    parts = spec.split(":")
    if len(parts) != 2:
        raise ValueError(f"malformed range {spec!r}: expected neg, pos, all or LO:HI")
    try:
        lo, hi = float(parts[0]), float(parts[1])
    except ValueError:
        raise ValueError(f"malformed range {spec!r}: LO and HI must be numbers") from None
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
        raise ValueError(f"malformed range {spec!r}: need finite LO <= HI")
    return lo, hi
