"""Probe: FA4's fp32 -> bf16 / fp16 conversions.

FA4 stage: the P cast before the PV MMA, the dS cast in backward and the output cast
(the P cast of the forward, the dS cast of the backward: flash_attn/cute/utils.py:689 cvt_f16); mirrors
``flash_attn/cute/utils.py::cvt_f16x2_f32`` (inline ``cvt.rn.{bf16x2|f16x2}.f32``, called by
``utils.cvt_f16`` on SM90) and the DSL ``.to(dtype)`` (``arith.truncf``, used for ``acc_O`` and
on SM100).

Variants: ``cvt_bf16x2``, ``cvt_f16x2`` (packed inline PTX over input pairs ``(x[2i], x[2i+1])``)
and ``to_bf16``, ``to_f16`` (scalar ``Float32.to``). Output of :func:`run`: the 16-bit result
patterns as a ``torch.int16`` tensor, one per input, in input order.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float16
from fa4verify.kernels.fa4_device import fa_utils

from fa4verify.kernels.probes.probe_base import BLOCK, ChunkRunner, compile_only_here

STAGE = "P / dS / O cast fp32 -> bf16|fp16 (RNE), flash_attn/cute/utils.py:689 cvt_f16"
MIRRORS = "flash_attn/cute/utils.py::cvt_f16x2_f32 (via cvt_f16) and Float32.to(dtype)"
ARCHS = ("sm_90a", "sm_100a")
VARIANTS = ("cvt_bf16x2", "cvt_f16x2", "to_bf16", "to_f16")
IN_DTYPES = ("f32",)


@cute.kernel
def _kernel_cvt(gX: cute.Tensor, gY: cute.Tensor, to_bf16: cutlass.Constexpr[bool]):
    # one thread per input PAIR: gY[j] = cvt.rn.{bf16x2|f16x2}(x[2j], x[2j+1]) with x[2j] in
    # the low half (cvt_f16x2_f32(a, b) emits "cvt d, b, a": a lands in the low half).
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    bdim, _, _ = cute.arch.block_dim()
    j = bidx * bdim + tidx
    if cutlass.const_expr(to_bf16):
        gY[j] = fa_utils.cvt_f16x2_f32(gX[2 * j], gX[2 * j + 1], BFloat16)
    else:
        gY[j] = fa_utils.cvt_f16x2_f32(gX[2 * j], gX[2 * j + 1], Float16)


@cute.jit
def launch_cvt(mX: cute.Tensor, mY: cute.Tensor, to_bf16: cutlass.Constexpr[bool]):
    n = cute.size(mY)
    _kernel_cvt(mX, mY, to_bf16).launch(grid=[n // BLOCK, 1, 1], block=[BLOCK, 1, 1])


@cute.kernel
def _kernel_to(gX: cute.Tensor, gY: cute.Tensor, to_bf16: cutlass.Constexpr[bool]):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    bdim, _, _ = cute.arch.block_dim()
    i = bidx * bdim + tidx
    if cutlass.const_expr(to_bf16):
        gY[i] = gX[i].to(BFloat16)
    else:
        gY[i] = gX[i].to(Float16)


@cute.jit
def launch_to(mX: cute.Tensor, mY: cute.Tensor, to_bf16: cutlass.Constexpr[bool]):
    n = cute.size(mX)
    _kernel_to(mX, mY, to_bf16).launch(grid=[n // BLOCK, 1, 1], block=[BLOCK, 1, 1])


_SPECS = {
    "cvt_bf16x2": (launch_cvt, (("i32", 0.5),), True),
    "cvt_f16x2": (launch_cvt, (("i32", 0.5),), False),
    "to_bf16": (launch_to, (("bf16", 1),), True),
    "to_f16": (launch_to, (("f16", 1),), False),
}
_RUNNERS = {v: ChunkRunner(spec[0], spec[1]) for v, spec in _SPECS.items()}


def run(x, variant: str = "cvt_bf16x2"):
    """GPU: convert CUDA float32 ``x`` (even length) with ``variant``; returns int16 bit patterns."""
    import torch
    if x.numel() % 2:
        raise ValueError("probe_cvt needs an even number of inputs (packed pairs)")
    y = _RUNNERS[variant]([x], consts=(_SPECS[variant][2],))[0]
    return y.view(torch.int16)


def compile_only(variant: str = "cvt_bf16x2", n: int = 4 * BLOCK):
    launch, specs, flag = _SPECS[variant]
    return compile_only_here(launch, IN_DTYPES, specs, consts=(flag,), n=n)
