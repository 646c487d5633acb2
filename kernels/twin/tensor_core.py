"""A bit-exact model of the SM90 tensor core's fp32-accumulating MMA for 16-bit inputs: the
arithmetic of FA4's ``S = Q K^T`` on Hopper (``wgmma.mma_async ... .f32.bf16.bf16`` / ``.f16.f16``).

Note [SM90 MMA model]
---------------------
What: one ``wgmma`` k-step adds ``n`` exact products ``a_i b_i`` (16-bit inputs: every product is
exact in fp32's range, a 16 / 22-bit significand) to the fp32 accumulator ``c`` as a *block FMA*
(:class:`BlockFMA`): the terms of a chunk (its products, and ``c``) are aligned to the largest
exponent among them, each truncated (toward zero) to ``frac_bits`` bits below that exponent,
summed exactly, and the sum rounded once to fp32 (``final``). Chunks follow each other in k order,
each taking the previous chunk's fp32 result as its ``c``. A k-loop of ``wgmma`` instructions (FA4's
head dimension in 16-wide steps, ascending) is the same chain.

Why: the worst-case inner-product bound ``gamma(d, u) sum |q||k|`` (``bwd_s_accum``) pins a score
only to ``+- d 2^-24 sum |q||k|``. Where a softcapped or peaked row makes the gradient hang on one
key's score, that leaves the gradient's bound without power (error_budgets/DERIVATIONS.md#
backward-interval, Note [A bound without power]). With the hardware's own arithmetic the score is
a point.

What rests on it: the judge takes an sm90 target's scores from this model. That is a point, not
an enclosure -- where the model lies inside the worst-case enclosure of a score the judge uses it,
and a verdict there is only as right as the model. Hence the evidence below, the audit's check
``tensor_core.mma`` that re-measures it on the GPU the audit runs on (bit for bit; it fails on one
differing output), and :func:`in_domain`: the judge uses the model only where the inputs lie in
the range the recording covers (no subnormal input, products and sums far from fp32's subnormal
and overflow ranges; any scale in between, since a block FMA depends on relative exponents only).
A k loop longer than the recorded 4 steps (FA4's head dims up to 256: 16 steps) is the same
instruction repeated on its own output.

Evidence (recorded on NVIDIA H200, sm_90, 2026-12-03): the parameters of :data:`SM90` were fitted
and then checked bit for bit (``scripts/gpu_mma_probe.py``: a Triton kernel whose PTX is one
``wgmma`` per 16-wide k step; inputs whose exponents spread over 24 binades, so alignment
truncation happens in almost every block; ``kernels/evidence/golden/mma_sm90_h200.json``, two
tiles per case kept in ``mma_sm90_h200.npz`` for the tests). The model is a fact about SM90 tensor
cores: it applies to an sm90 target only, and only to what was measured (bf16 and fp16 inputs,
fp32 accumulation, normal fp32 results).

The vectorised :func:`block_fma` computes in float64: a term scaled by ``2^(frac_bits - E)`` is an
integer below ``2^(frac_bits + 3)``, so truncation, the sum of at most 17 such integers and the
scaling back are exact; :func:`block_fma_exact` is the independent path (Python integers and
:class:`fractions.Fraction`, one element at a time) the tests compare it with.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional, Sequence

import numpy as np

__all__ = ["BlockFMA", "SM90", "SM90_16BIT", "block_fma", "block_fma_exact", "mma", "mma_by_blocks", "model_for",
           "in_domain"]


@dataclass(frozen=True)
class BlockFMA:
    """One block FMA of the tensor core (Note [SM90 MMA model]).

    ``chunk``: products per block (the k step is ``16 / chunk`` blocks in k order);
    ``frac_bits``: bits kept below the block's largest exponent; ``product_exponent``:
    ``"inputs"`` (a product's alignment exponent is ``e_a + e_b``, its significand in [1, 4)) or
    ``"normalised"`` (``floor(log2 |a b|)``); ``term``: ``"rz"`` (toward zero) or ``"floor"``
    (toward -inf: a two's-complement truncation); ``final``: the sum's rounding to fp32,
    ``"rz"`` or ``"rn"``; ``acc_aligned``: the accumulator is a term of the block (else the
    block's fp32 result is added to it with one RN addition)."""

    chunk: int = 16
    frac_bits: int = 25
    product_exponent: str = "inputs"
    term: str = "rz"
    final: str = "rz"
    acc_aligned: bool = True


def _exponent(x: np.ndarray) -> np.ndarray:
    """``floor(log2 |x|)`` exactly (frexp), ``-inf`` at 0."""
    m, e = np.frexp(x)
    return np.where(x != 0, e.astype(np.float64) - 1.0, -np.inf)


def _to_fp32(x: np.ndarray, mode: str) -> np.ndarray:
    r = np.asarray(x, np.float64).astype(np.float32)
    if mode == "rz":
        over = np.abs(r.astype(np.float64)) > np.abs(x)
        r = np.where(over, np.nextafter(r, np.float32(0)), r)
    return r


def block_fma(c, a, b, m: BlockFMA) -> np.ndarray:
    """One block FMA, vectorised: ``c`` (...) fp32 values; ``a``, ``b`` (..., n) 16-bit values
    (any float dtype holding them exactly; broadcast against each other); returns fp32 (...)."""
    c = np.asarray(c, np.float64)
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    p = a * b                                           # exact: 16- / 22-bit significands
    if m.product_exponent == "inputs":
        ep = _exponent(a) + _exponent(b)
    else:
        ep = _exponent(p)
    ec = _exponent(c)
    E = ep.max(axis=-1)
    if m.acc_aligned:
        E = np.maximum(E, ec)
    E = np.where(np.isfinite(E), E, 0.0)
    sc = np.exp2(m.frac_bits - E)
    cut = np.trunc if m.term == "rz" else np.floor
    s = cut(p * sc[..., None]).sum(axis=-1)
    if m.acc_aligned:
        return _to_fp32((s + cut(c * sc)) / sc, m.final)
    blk = _to_fp32(s / sc, m.final).astype(np.float64)
    return (blk + c).astype(np.float32)


def block_fma_exact(c: float, a: Sequence[float], b: Sequence[float], m: BlockFMA) -> float:
    """:func:`block_fma` for one element in exact rational arithmetic (the independent path)."""
    def expo(x: Fraction) -> int:
        # floor(log2 |x|) of a nonzero rational
        e = x.numerator.bit_length() - x.denominator.bit_length()
        while abs(x) >= Fraction(2) ** (e + 1):
            e += 1
        while abs(x) < Fraction(2) ** e:
            e -= 1
        return e
    fa = [Fraction(float(x)) for x in a]
    fb = [Fraction(float(x)) for x in b]
    fc = Fraction(float(c))
    prods = [x * y for x, y in zip(fa, fb)]
    exps = [(expo(x) + expo(y) if m.product_exponent == "inputs" else expo(x * y))
            for x, y in zip(fa, fb) if x != 0 and y != 0]
    if m.acc_aligned and fc != 0:
        exps.append(expo(fc))
    E = max(exps) if exps else 0
    unit = Fraction(2) ** (E - m.frac_bits)

    def cut(x: Fraction) -> Fraction:
        q = x / unit
        n = math.floor(q) if m.term == "floor" else (math.floor(q) if q >= 0 else -math.floor(-q))
        return n * unit
    s = sum((cut(x) for x in prods), Fraction(0))

    def fp32(x: Fraction, mode: str) -> float:
        r = float(np.float32(float(x)))             # float(x) is RN to binary64: within the check below
        if Fraction(r) != x:
            # correct the double rounding: the nearest fp32 on each side, chosen by the exact value
            lo = float(np.nextafter(np.float32(r), np.float32(-np.inf)))
            hi = float(np.nextafter(np.float32(r), np.float32(np.inf)))
            cands = sorted({lo, r, hi}, key=lambda y: Fraction(y))
            below = max((y for y in cands if Fraction(y) <= x), key=Fraction)
            above = min((y for y in cands if Fraction(y) >= x), key=Fraction)
            if mode == "rz":
                r = below if x >= 0 else above
            else:
                db, da = x - Fraction(below), Fraction(above) - x
                if db != da:
                    r = below if db < da else above
                else:
                    r = below if (np.float32(below).view(np.int32) & 1) == 0 else above
        return r
    if m.acc_aligned:
        return fp32(s + cut(fc), m.final)
    return float(np.float32(fp32(s, m.final) + float(fc)))


#: elements of one row slice's (rows x N) working arrays in :func:`mma`: 1 MiB per float64
#: temporary, in cache (the slices change no bit)
_SLICE_ELEMS = 1 << 17
#: outputs at most which :func:`mma` takes the chain of :func:`block_fma` calls instead: on a few
#: rows and keys (a varlen sequence's block) numpy's per-call cost outweighs the (M, N, chunk)
#: temporaries (on the CPU: 1 x 13 x 64 scores 0.21 ms by blocks, 0.53 ms product by product; 32 x 32
#: x 128 about even; 128 x 128 x 128 10 ms against 50 ms)
_BLOCKS_AT_MOST = 1 << 10


def mma(a, b, init: Optional[np.ndarray], m: BlockFMA) -> np.ndarray:
    """``init + a @ b^T`` over the last axis of ``a`` (..., M, K) and ``b`` (..., N, K) as the
    tensor core computes it: blocks of ``m.chunk`` products in k order (``init`` None: a
    zero-initialised accumulator). fp32 result (..., M, N).

    The chain of :func:`block_fma` calls, computed product by product: each of a block's ``chunk``
    products is an outer product of a column of ``a`` and one of ``b`` over a slice of rows
    (contiguous (rows, N) arrays, updated in place), its alignment exponent folded into the
    block's running maximum and its truncated term into the running sum -- the same exact values as
    :func:`block_fma` (a maximum and a sum of integers below 2^53 in any order), without its
    (rows, N, chunk) temporaries and their reductions over the short last axis (a test holds the
    two equal for every parameter setting)."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    lead = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    shape = lead + (a.shape[-2], b.shape[-2])
    if int(np.prod(shape, dtype=np.int64)) <= _BLOCKS_AT_MOST:
        return mma_by_blocks(a, b, init, m)
    acc = np.zeros(shape, np.float32) if init is None else np.broadcast_to(np.asarray(init, np.float32), shape)
    out = np.empty(shape, np.float32)
    K, M, N = a.shape[-1], a.shape[-2], b.shape[-2]
    # k-major operands: one k column is a contiguous (..., M) / (..., N) vector
    at = np.ascontiguousarray(np.moveaxis(np.broadcast_to(a, lead + a.shape[-2:]), -1, 0))     # (K, ..., M)
    bt = np.ascontiguousarray(np.moveaxis(np.broadcast_to(b, lead + b.shape[-2:]), -1, 0))     # (K, ..., N)
    ea, eb = _exponent(at), _exponent(bt)
    cut = np.trunc if m.term == "rz" else np.floor
    step = max(1, _SLICE_ELEMS // max(1, int(np.prod(lead, dtype=np.int64)) * N))
    for r0 in range(0, M, step):
        rows = slice(r0, min(M, r0 + step))
        c = np.array(acc[..., rows, :], np.float64)
        E = np.empty_like(c)
        t = np.empty_like(c)
        s = np.empty_like(c)
        for k0 in range(0, K, m.chunk):
            ks = range(k0, min(K, k0 + m.chunk))
            E.fill(-np.inf)
            for k in ks:                # the block's alignment exponent
                if m.product_exponent == "inputs":
                    np.add(ea[k, ..., rows, None], eb[k, ..., None, :], out=t)
                else:
                    np.multiply(at[k, ..., rows, None], bt[k, ..., None, :], out=t)
                    t[...] = _exponent(t)
                np.maximum(E, t, out=E)
            if m.acc_aligned:
                np.maximum(E, _exponent(c), out=E)
            E[~np.isfinite(E)] = 0.0
            sc = np.exp2(m.frac_bits - E)
            s.fill(0.0)
            for k in ks:                # the truncated terms, summed exactly
                np.multiply(at[k, ..., rows, None], bt[k, ..., None, :], out=t)
                t *= sc
                cut(t, out=t)
                s += t
            if m.acc_aligned:
                s += cut(c * sc)
                c = _to_fp32(s / sc, m.final).astype(np.float64)
            else:
                c = (_to_fp32(s / sc, m.final).astype(np.float64) + c).astype(np.float32).astype(np.float64)
        out[..., rows, :] = c
    return out


def mma_by_blocks(a, b, init: Optional[np.ndarray], m: BlockFMA) -> np.ndarray:
    """:func:`mma` as the plain chain of :func:`block_fma` calls over (M, N, chunk) products: the
    second vectorised path the tests compare :func:`mma` with."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-2])
    acc = np.zeros(shape, np.float32) if init is None else np.broadcast_to(np.asarray(init, np.float32), shape)
    for k0 in range(0, a.shape[-1], m.chunk):
        ks = slice(k0, k0 + m.chunk)
        acc = block_fma(acc, a[..., :, None, ks], b[..., None, :, ks], m)
    return np.asarray(acc, np.float32)


#: the SM90 model per input dtype (Note [SM90 MMA model]): one block of all 16 products of a k step
#: and the accumulator, aligned to the largest of their exponents (a product's taken as e_a + e_b),
#: each cut toward zero 25 bits below it, the exact sum cut toward zero to fp32. Fitted on 2 of 64
#: recorded tiles per case (the only one of 480 candidate settings that matched), then bit-equal on
#: all 1,048,576 recorded outputs (bf16 and fp16, 1 and 4 k steps; a once-rounded exact sum matches
#: 25-55 % of them): kernels/evidence/golden/mma_sm90_h200.json
SM90_16BIT = BlockFMA(chunk=16, frac_bits=25, product_exponent="inputs", term="rz", final="rz", acc_aligned=True)
SM90: dict[str, BlockFMA] = {"bf16": SM90_16BIT, "fp16": SM90_16BIT}

#: the smallest normal input per dtype, and the product size kept clear of fp32's subnormal range:
#: the domain the recording covers (:func:`in_domain`)
_MIN_NORMAL = {"bf16": 2.0 ** -126, "fp16": 2.0 ** -14}
_SAFE_LO, _SAFE_HI = 2.0 ** -100, 2.0 ** 100


def in_domain(a: np.ndarray, b: np.ndarray, dtype: str) -> bool:
    """Whether ``a @ b^T`` (16-bit inputs of ``dtype``) lies where the model was measured: no
    subnormal input, every nonzero product and every partial sum far from fp32's subnormal and
    overflow ranges. The block FMA depends on its terms' exponents relative to each other only; the
    recording's 24-binade input spread (48 binades of products) exercises every alignment within
    the 25-bit window and beyond it, so within that range absolute scale does not matter."""
    a = np.abs(np.asarray(a, np.float64))
    b = np.abs(np.asarray(b, np.float64))
    lo = _MIN_NORMAL.get(dtype)
    if lo is None:
        return False
    nz_a, nz_b = a[a != 0], b[b != 0]
    if nz_a.size == 0 or nz_b.size == 0:
        return True
    if nz_a.min() < lo or nz_b.min() < lo:
        return False
    big = float(nz_a.max()) * float(nz_b.max()) * a.shape[-1]
    small = float(nz_a.min()) * float(nz_b.min())
    return _SAFE_LO <= small and big <= _SAFE_HI


def model_for(tensor_core: str, dtype: str) -> Optional[BlockFMA]:
    """The block FMA of ``tensor_core`` ("sm90") for ``dtype`` inputs, None where nothing was
    measured (a check applies only to what its evidence describes)."""
    if tensor_core != "sm90":
        raise ValueError(f"tensor_core={tensor_core!r}: only 'sm90' is modelled")
    return SM90.get(dtype)
