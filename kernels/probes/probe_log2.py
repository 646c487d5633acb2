"""Probe: FA4's ``cute.math.log2(x, fastmath=True)`` (MUFU ``lg2.approx.ftz.f32``).

FA4 stage: LSE ``(m*c + log2(row_sum)) * ln2`` (flash_attn/cute/softmax.py:253 Softmax.finalize, "Finalize");
mirrors ``flash_attn/cute/softmax.py::Softmax.finalize`` (``cute.math.log2(..., fastmath=True)``).

Output: fp32, one per input.
"""
from __future__ import annotations

import cutlass.cute as cute

from fa4verify.kernels.probes.probe_base import BLOCK, ChunkRunner, compile_only_here

STAGE = "LSE log2 (lg2.approx.ftz), flash_attn/cute/softmax.py:253 Softmax.finalize"
MIRRORS = "flash_attn/cute/softmax.py::Softmax.finalize (cute.math.log2 fastmath)"
ARCHS = ("sm_90a", "sm_100a")
VARIANTS = ("fastmath",)
IN_DTYPES = ("f32",)
OUT_SPECS = (("f32", 1),)


@cute.kernel
def _kernel(gX: cute.Tensor, gY: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    bdim, _, _ = cute.arch.block_dim()
    i = bidx * bdim + tidx
    gY[i] = cute.math.log2(gX[i], fastmath=True)


@cute.jit
def launch(mX: cute.Tensor, mY: cute.Tensor):
    n = cute.size(mX)
    _kernel(mX, mY).launch(grid=[n // BLOCK, 1, 1], block=[BLOCK, 1, 1])


_RUNNER = ChunkRunner(launch, OUT_SPECS)


def run(x, variant: str = "fastmath"):
    """GPU: ``log2(x)`` through MUFU over a CUDA float32 tensor."""
    return _RUNNER([x])[0]


def compile_only(variant: str = "fastmath", n: int = 4 * BLOCK):
    return compile_only_here(launch, IN_DTYPES, OUT_SPECS, n=n)
