"""CPU twin of FA4's split-KV combine kernel (``flash_attn/cute/flash_fwd_combine.py``,
``FlashAttentionForwardCombine``, flash-attn-4 4.0.0b36), fp32 arithmetic modelled op by op.

Per row (the kernel's Steps 4-7, ``kernel`` lines ~555-700)::

    lse_max   = max_s L_s                                   (fp32, exact)
    m         = 0 if lse_max == -inf else lse_max
    t_s       = L_s * LOG2_E - m * LOG2_E                   (LOG2_E = fp32(log2 e); ``contract``:
                                                              one FFMA with the negated product
                                                              RN(m LOG2_E), else mul, mul, sub)
    scale_s   = ex2.approx.ftz(t_s)                         (``cute.math.exp2(..., fastmath=True)``)
    Z         = sum_s scale_s                               (fp32; per-thread in split order, then
                                                              a butterfly over ``threads_per_col``)
    LSE       = log(Z) + lse_max                            (``cute.math.log(fastmath=True)``:
                                                              lg2.approx * ln2)
    inv       = 0 if Z == 0 or Z is NaN else 1 / Z           (IEEE fp32 division)
    w_s       = scale_s * inv
    O         = sum_{s <= max valid split, w_s > 0} w_s * O_s   (fp32 FMA chain in split order;
                                                              partials read as fp32)
    out       = cvt.rn(O) to the output dtype

The kernel skips splits past the last one with ``L_s != -inf`` and terms whose weight is 0, so a
NaN partial of an empty split never reaches the output (modelled).

``mufu``: as :class:`fa4verify.kernels.twin.forward.Mufu` ("correctly-rounded" or "perturbed" within
``MUFU_BOUNDS``). The local budget of this stage is ``[stage.combine_out]`` /
``[stage.combine_lse]`` in ``error_budgets/_base.toml`` (DERIVATIONS.md#combine).

Possible issues
---------------
The summation order of ``Z`` across the lanes of a column (``threads_per_col`` = 256 / tile_m
lanes, each summing ``max_splits / threads_per_col`` splits) is modelled as per-lane sequential
sums then a pairwise butterfly; the budget covers every order (``gamma(n_splits)``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fa4verify.oracles import binary32 as b32
from fa4verify.kernels.twin.forward import Mufu, cast_to

__all__ = ["CombineTwinResult", "combine", "LOG2_E32"]

F32 = np.float32
LOG2_E32 = np.float32(math.log2(math.e))
LN2_32 = np.float32(math.log(2.0))


@dataclass(frozen=True)
class CombineTwinResult:
    out: np.ndarray     #: (..., d) float32 holding ``out_dtype`` values
    lse: np.ndarray     #: (...,) float32
    weights: np.ndarray  #: (S, ...) float32 normalised scales


def _lanes(head_dim: int, num_splits: int) -> int:
    """threads_per_col of FA4's combine: 256 threads / tile_m rows (tile_m 8 for hd > 64, else 16)."""
    k_block = 64 if head_dim <= 64 else 128
    tile_m = 8 if k_block % 128 == 0 else 16
    return 256 // tile_m


def _butterfly_sum(x: np.ndarray, lanes: int) -> np.ndarray:
    """Per-lane sequential sums (lane l owns splits l, l + lanes, ...) then a xor-butterfly."""
    S = x.shape[0]
    part = [np.zeros(x.shape[1:], F32) for _ in range(lanes)]
    for s in range(S):
        part[s % lanes] = b32.add(part[s % lanes], x[s])
    step = lanes // 2
    while step >= 1:
        part = [b32.add(part[i], part[i ^ step]) for i in range(lanes)]
        step //= 2
    return part[0]


def combine(out_partial, lse_partial, *, out_dtype: str = "bf16", contract: bool = True,
            mufu: str = "correctly-rounded", seed: int = 0) -> CombineTwinResult:
    """FA4's combine of ``out_partial`` (S, ..., d) and ``lse_partial`` (S, ...) (values exact in
    fp32; bf16/fp16 partials are read as fp32 like the kernel's ``.to(Float32)``)."""
    O = np.asarray(out_partial, np.float64).astype(F32)
    L = np.asarray(lse_partial, np.float64).astype(F32)
    if O.shape[:-1] != L.shape:
        raise ValueError(f"out_partial {O.shape} and lse_partial {L.shape} disagree")
    S, d = L.shape[0], O.shape[-1]
    if S > 256:
        raise ValueError("FA4's combine takes at most 256 splits")
    mf = Mufu(mufu, seed)
    lmax = L.max(axis=0)
    m = np.where(lmax == -np.inf, F32(0), lmax).astype(F32)
    mc = b32.mul(m, np.full_like(m, LOG2_E32))
    c = np.full_like(L, LOG2_E32)
    if contract:
        t = b32.fma(L, c, np.broadcast_to(-mc, L.shape).copy())
    else:
        t = b32.sub(b32.mul(L, c), np.broadcast_to(mc, L.shape).copy())
    scale = mf.ex2(t).astype(F32)
    Z = _butterfly_sum(scale, _lanes(d, S))
    with np.errstate(divide="ignore", invalid="ignore"):
        lg = mf.lg2(Z).astype(F32)
        ln = b32.mul(lg, np.full_like(lg, LN2_32))
        lse = b32.add(ln, lmax)
        ok = (Z != 0) & ~np.isnan(Z)
        inv = np.where(ok, (np.float64(1.0) / np.where(ok, Z, 1).astype(np.float64)).astype(F32), F32(0)).astype(F32)
    w = b32.mul(scale, np.broadcast_to(inv, scale.shape).copy())
    # max valid split per row: the last split with L_s != -inf
    valid = L != -np.inf
    idx = np.arange(S).reshape((S,) + (1,) * (L.ndim - 1))
    last = np.where(valid, idx, -1).max(axis=0)
    acc = np.zeros(O.shape[1:], F32)
    for s in range(S):
        use = ((s <= last) & (w[s] > 0))[..., None]
        nxt = b32.fma(np.broadcast_to(w[s][..., None], acc.shape).copy(), O[s], acc)
        acc = np.where(use, nxt, acc)
    out = cast_to(acc, out_dtype) if out_dtype in ("bf16", "fp16") else acc
    return CombineTwinResult(np.asarray(out, F32), np.asarray(lse, F32), w)
