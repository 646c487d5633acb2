"""Probe: FA4's SM90 softmax exponent argument ``S*c - m*c`` and ``P = exp2(that)``.

FA4 stage: scale / exponent argument and exp2 of the SM90 online softmax (``flash_attn/cute/softmax.py:187``); mirrors
``flash_attn/cute/softmax.py::Softmax.online_softmax``::

    row_max_cur_scaled = row_max_cur * scale_log2
    acc_S_row_exp = cute.math.exp2(acc_S_row * scale_log2 - row_max_cur_scaled, fastmath=True)

written as an un-suffixed fp32 multiply and subtract; ptxas contracts ``S*c - t`` into one FFMA
(``FFMA R, S, c, -t``), so the argument is ``fma(S, c, -(m*c))`` with one rounding, not two. The
compile-only census checks the FFMA in the SASS; the golden vectors check the bits.

Inputs: ``S`` (score), ``m`` (row max), and the runtime fp32 scalar ``c`` (= softmax_scale*log2 e).
Outputs of :func:`run`: ``(arg, p)`` float32 tensors.
"""
from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32

from fa4verify.kernels.probes.probe_base import BLOCK, ChunkRunner, compile_only_here

STAGE = "SM90 exponent argument S*c - m*c (ptxas FFMA) and exp2, flash_attn/cute/softmax.py:187 Softmax.online_softmax"
MIRRORS = "flash_attn/cute/softmax.py::Softmax.online_softmax"
ARCHS = ("sm_90a", "sm_100a")
VARIANTS = ("sm90",)
IN_DTYPES = ("f32", "f32")
OUT_SPECS = (("f32", 1), ("f32", 1))


@cute.kernel
def _kernel(gS: cute.Tensor, gM: cute.Tensor, gA: cute.Tensor, gP: cute.Tensor, scale_log2: Float32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    bdim, _, _ = cute.arch.block_dim()
    i = bidx * bdim + tidx
    row_max_cur_scaled = gM[i] * scale_log2
    arg = gS[i] * scale_log2 - row_max_cur_scaled
    gA[i] = arg
    gP[i] = cute.math.exp2(gS[i] * scale_log2 - row_max_cur_scaled, fastmath=True)


@cute.jit
def launch(mS: cute.Tensor, mM: cute.Tensor, mA: cute.Tensor, mP: cute.Tensor, scale_log2: Float32):
    n = cute.size(mS)
    _kernel(mS, mM, mA, mP, scale_log2).launch(grid=[n // BLOCK, 1, 1], block=[BLOCK, 1, 1])


_RUNNER = ChunkRunner(launch, OUT_SPECS)


def run(s, m, scale_log2: float, variant: str = "sm90"):
    """GPU: returns ``(arg, p)`` for CUDA float32 tensors ``s``, ``m`` and the fp32 scalar ``c``."""
    a, p = _RUNNER([s, m], scalars=(Float32(scale_log2),))
    return a, p


def compile_only(variant: str = "sm90", n: int = 4 * BLOCK):
    return compile_only_here(launch, IN_DTYPES, OUT_SPECS, scalars=(Float32(0.12751743074602467),), n=n)
