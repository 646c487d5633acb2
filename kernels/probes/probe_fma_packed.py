"""Probe (compile-only on the H200 lease): ``cute.arch.fma_packed_f32x2``, FA4's packed FFMA2.

FA4 stage: the SM100 exponent argument ``x = fma(S, scale_log2, max_offset - m*scale_log2)``
as one packed FFMA2 per element pair (flash_attn/cute/softmax.py), and the backward P
recomputation (section 7.3); mirrors ``flash_attn/cute/softmax.py::SoftmaxSm100.scale_subtract_rowmax``
(``cute.arch.fma_packed_f32x2``, default ``rn``).

Needs sm_100a (``fma.rn.f32x2``); compiled, never run, on this project's lease.
Inputs ``a, b, c``; output ``fma(a, b, c)`` fp32, pairwise.
"""
from __future__ import annotations

import cutlass.cute as cute

from fa4verify.kernels.probes.probe_base import BLOCK, ChunkRunner, compile_only_here

STAGE = "SM100 exponent argument (packed FFMA2), flash_attn/cute/softmax.py"
MIRRORS = "flash_attn/cute/softmax.py::SoftmaxSm100 (cute.arch.fma_packed_f32x2)"
ARCHS = ("sm_100a",)
VARIANTS = ("rn",)
IN_DTYPES = ("f32", "f32", "f32")
OUT_SPECS = (("f32", 1),)


@cute.kernel
def _kernel(gA: cute.Tensor, gB: cute.Tensor, gC: cute.Tensor, gY: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    bdim, _, _ = cute.arch.block_dim()
    j = bidx * bdim + tidx
    r = cute.arch.fma_packed_f32x2((gA[2 * j], gA[2 * j + 1]), (gB[2 * j], gB[2 * j + 1]),
                                   (gC[2 * j], gC[2 * j + 1]))
    gY[2 * j] = r[0]
    gY[2 * j + 1] = r[1]


@cute.jit
def launch(mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, mY: cute.Tensor):
    n = cute.size(mA) // 2
    _kernel(mA, mB, mC, mY).launch(grid=[n // BLOCK, 1, 1], block=[BLOCK, 1, 1])


_RUNNER = ChunkRunner(launch, OUT_SPECS)


def run(a, b, c, variant: str = "rn"):
    """Needs an sm_100-family GPU."""
    return _RUNNER([a, b, c])[0]


def compile_only(variant: str = "rn", n: int = 4 * BLOCK):
    return compile_only_here(launch, IN_DTYPES, OUT_SPECS, n=n)
