"""Probe: FA4's scalar polynomial exp2 emulation, ``flash_attn.cute.utils.ex2_emulation``.

FA4 stage: exp2 (flash_attn/cute/utils.py:786 ex2_emulation, "Scalar variant"); mirrors
``flash_attn/cute/utils.py::ex2_emulation`` (with ``evaluate_polynomial``, ``add_round_down``,
``combine_int_frac_ex2``) for ``poly_degree`` 1..5 (``POLY_EX2``).

The kernel calls FA4's own function, so whatever the DSL and ptxas make of it (the Horner loop
contracted into FMAs, ``add.rm.ftz``, the integer exponent combine) is what runs. Scalar ops only,
so it compiles for sm_90a (and runs on the H200) as well as sm_100a. The SM100 kernels call the
packed twin ``ex2_emulation_2`` (see ``probe_ex2_emulation_packed``), degree 3.

Output: fp32, one per input.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from fa4verify.kernels.fa4_device import fa_utils

from fa4verify.kernels.probes.probe_base import BLOCK, ChunkRunner, compile_only_here

STAGE = "exp2 emulation (scalar), flash_attn/cute/utils.py:786 ex2_emulation"
MIRRORS = "flash_attn/cute/utils.py::ex2_emulation"
ARCHS = ("sm_90a", "sm_100a")
VARIANTS = ("1", "2", "3", "4", "5")   # polynomial degree
IN_DTYPES = ("f32",)
OUT_SPECS = (("f32", 1),)


@cute.kernel
def _kernel(gX: cute.Tensor, gY: cute.Tensor, degree: cutlass.Constexpr[int]):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    bdim, _, _ = cute.arch.block_dim()
    i = bidx * bdim + tidx
    gY[i] = fa_utils.ex2_emulation(gX[i], poly_degree=degree)


@cute.jit
def launch(mX: cute.Tensor, mY: cute.Tensor, degree: cutlass.Constexpr[int]):
    n = cute.size(mX)
    _kernel(mX, mY, degree).launch(grid=[n // BLOCK, 1, 1], block=[BLOCK, 1, 1])


_RUNNER = ChunkRunner(launch, OUT_SPECS)


def run(x, variant: str = "3"):
    """GPU: ``ex2_emulation(x, poly_degree=int(variant))`` over a CUDA float32 tensor ``x``."""
    return _RUNNER([x], consts=(int(variant),))[0]


def compile_only(variant: str = "3", n: int = 4 * BLOCK):
    """Compile for ``CUTE_DSL_ARCH`` without a GPU; returns ``(ptx, sass)``."""
    return compile_only_here(launch, IN_DTYPES, OUT_SPECS, consts=(int(variant),), n=n)
