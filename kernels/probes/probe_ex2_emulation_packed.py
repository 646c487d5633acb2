"""Probe (compile-only on the H200 lease): FA4's PACKED exp2 emulation ``utils.ex2_emulation_2``.

FA4 stage: exp2 on emulated columns of the SM100 forward (flash_attn/cute/utils.py:786 ex2_emulation, "the path
that runs"); mirrors ``flash_attn/cute/utils.py::ex2_emulation_2`` (``add_packed_f32x2`` with
``rnd="rm"``, ``sub_packed_f32x2``, ``evaluate_polynomial_2`` via ``fma_packed_f32x2``).

The packed ``.f32x2`` instructions exist only on sm_100a and later, so this probe is
compiled (never run) here; its PTX/SASS shows FFMA2 / FADD2 chains with the ``POLY_EX2``
constants. Output: fp32, one per input; thread j handles the pair (x[2j], x[2j+1]).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from fa4verify.kernels.fa4_device import fa_utils

from fa4verify.kernels.probes.probe_base import BLOCK, ChunkRunner, compile_only_here

STAGE = "exp2 emulation (packed f32x2, SM100), flash_attn/cute/utils.py:786 ex2_emulation"
MIRRORS = "flash_attn/cute/utils.py::ex2_emulation_2"
ARCHS = ("sm_100a",)
VARIANTS = ("1", "2", "3", "4", "5")
IN_DTYPES = ("f32",)
OUT_SPECS = (("f32", 1),)


@cute.kernel
def _kernel(gX: cute.Tensor, gY: cute.Tensor, degree: cutlass.Constexpr[int]):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    bdim, _, _ = cute.arch.block_dim()
    j = bidx * bdim + tidx
    a, b = fa_utils.ex2_emulation_2(gX[2 * j], gX[2 * j + 1], poly_degree=degree)
    gY[2 * j] = a
    gY[2 * j + 1] = b


@cute.jit
def launch(mX: cute.Tensor, mY: cute.Tensor, degree: cutlass.Constexpr[int]):
    n = cute.size(mX) // 2
    _kernel(mX, mY, degree).launch(grid=[n // BLOCK, 1, 1], block=[BLOCK, 1, 1])


_RUNNER = ChunkRunner(launch, OUT_SPECS)


def run(x, variant: str = "3"):
    """Needs an sm_100-family GPU (packed f32x2 instructions)."""
    return _RUNNER([x], consts=(int(variant),))[0]


def compile_only(variant: str = "3", n: int = 4 * BLOCK):
    return compile_only_here(launch, IN_DTYPES, OUT_SPECS, consts=(int(variant),), n=n)
