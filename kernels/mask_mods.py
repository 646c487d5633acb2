"""FA4 ``mask_mod`` callables (CuTe DSL) that fa4verify runs, each with its numpy keep-mask, so the
oracle sees exactly the mask the kernel applies.

A ``mask_mod`` is FA4's ``(batch, head, q_idx, kv_idx, seqlen_info, aux_tensors) -> Boolean``
(``flash_attn/cute/mask.py: call_mask_mod``; indices are Int32 SSA values, True = attend).

* :data:`checkerboard_128` keeps key ``j`` for query ``i`` iff ``(i // 128 + j // 128) % 2 == 0``:
  a block-aligned pattern (128 x 128 blocks), so the same mask is also expressible as block
  sparsity with full blocks only (:func:`checkerboard_block_mask`), which is the property
  (a block-sparse run equals the equivalent mask_mod run, both within budget).
"""
from __future__ import annotations

import numpy as np

__all__ = ["CHECKER_BLOCK", "checkerboard_keep", "checkerboard_block_mask", "checkerboard_128"]

CHECKER_BLOCK = 128


def checkerboard_keep(seqlen_q: int, seqlen_k: int, block: int = CHECKER_BLOCK) -> np.ndarray:
    i = np.arange(seqlen_q)[:, None] // block
    j = np.arange(seqlen_k)[None, :] // block
    return (i + j) % 2 == 0


def checkerboard_block_mask(seqlen_q: int, seqlen_k: int, block: int = CHECKER_BLOCK) -> np.ndarray:
    return checkerboard_keep(-(-seqlen_q // block), -(-seqlen_k // block), 1)


def _make():
    try:
        import cutlass.cute as cute
    except Exception:        # no CUTLASS DSL: the numpy masks still work
        return None

    @cute.jit
    def checkerboard_128(b, h, q_idx, kv_idx, seqlen_info, aux_tensors):
        return ((q_idx // 128 + kv_idx // 128) % 2) == 0
    return checkerboard_128


#: the CuTe DSL mask_mod (None without nvidia-cutlass-dsl)
checkerboard_128 = _make()
