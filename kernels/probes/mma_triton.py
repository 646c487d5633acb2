"""Probe: the SM90 tensor core's fp32-accumulating MMA for 16-bit inputs, through Triton (the one
place its GPU kernel lives: ``scripts/gpu_mma_probe.py`` records with it, the audit's check
``tensor_core.mma`` re-measures with it).

A Triton kernel computes ``acc = C0; for each 16-wide k block: acc = dot(A_blk, B_blk, acc)`` on
64 x 64 tiles with one warpgroup, so every k step is one ``wgmma.mma_async ...
m64n64k16.f32.{bf16.bf16,f16.f16}`` (the instruction FA4's SM90 kernels use for S = Q K^T; the PTX
is read back and counted). :func:`draw` makes inputs that expose the alignment of the products and
the accumulator: exponents spread over ``spread`` binades, random signs, some zeros, an fp32 C0
of varied magnitude (0 in a quarter of the rows). :func:`measure` compares the GPU with the model
of ``kernels/twin/tensor_core.py`` bit for bit (Note [SM90 MMA model]).

Needs CUDA and Triton (Triton comes with torch's CUDA builds; it is not a dependency of
fa4verify): :func:`run` raises :class:`ImportError` without it.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

CASES = (("bf16", 16), ("bf16", 64), ("fp16", 16), ("fp16", 64))
_KERNEL = None


def draw(rng: np.random.Generator, dtype: str, K: int, tiles: int, spread: int = 24):
    """Inputs ``(A (tiles, 64, K), B (tiles, K, 64), C (tiles, 64, 64))`` as float32 holding
    ``dtype`` values (A, B) and fp32 values (C)."""
    fbits = 128 if dtype == "bf16" else 1024

    def values(shape):
        e = rng.integers(-spread // 2, spread // 2 + 1, size=shape)
        m = 1.0 + rng.integers(0, fbits, size=shape) / fbits
        x = rng.choice([-1.0, 1.0], size=shape) * m * np.exp2(e)
        x[rng.random(shape) < 0.05] = 0.0
        return x.astype(np.float32)
    A = values((tiles, 64, K))
    B = values((tiles, K, 64))
    C = (rng.standard_normal((tiles, 64, 64))
         * np.exp2(rng.integers(-spread // 2, spread // 2 + 1, size=(tiles, 64, 64)))).astype(np.float32)
    C[:, ::4, :] = 0.0
    return A, B, C


def _kernel():
    global _KERNEL
    if _KERNEL is None:
        import triton
        import triton.language as tl

        @triton.jit
        def mma_steps(a_ptr, b_ptr, c_ptr, o_ptr, K: tl.constexpr):
            t = tl.program_id(0)
            rm = tl.arange(0, 64)
            rk = tl.arange(0, 16)
            acc = tl.load(c_ptr + t * 4096 + rm[:, None] * 64 + rm[None, :])
            for kb in tl.static_range(0, K, 16):
                a = tl.load(a_ptr + t * 64 * K + rm[:, None] * K + (kb + rk)[None, :])
                b = tl.load(b_ptr + t * 64 * K + (kb + rk)[:, None] * 64 + rm[None, :])
                acc = tl.dot(a, b, acc, input_precision="ieee", out_dtype=tl.float32)
            tl.store(o_ptr + t * 4096 + rm[:, None] * 64 + rm[None, :], acc)
        _KERNEL = mma_steps
    return _KERNEL


def run(A: np.ndarray, B: np.ndarray, C: np.ndarray, dtype: str) -> tuple[np.ndarray, int]:
    """GPU: ``C + A @ B`` in 16-wide wgmma k steps; returns the fp32 result and the number of
    ``wgmma.mma_async`` instructions in the kernel's PTX (one per k step expected)."""
    import torch
    tdt = torch.bfloat16 if dtype == "bf16" else torch.float16
    dev = torch.device("cuda")
    at = torch.tensor(A, device=dev).to(tdt)
    bt = torch.tensor(B, device=dev).to(tdt)
    if not (torch.equal(at.float().cpu(), torch.tensor(A)) and torch.equal(bt.float().cpu(), torch.tensor(B))):
        raise ValueError(f"inputs are not {dtype} values")
    ct = torch.tensor(C, device=dev)
    ot = torch.empty_like(ct)
    k = _kernel()[(A.shape[0],)](at, bt, ct, ot, K=A.shape[-1], num_warps=4)
    torch.cuda.synchronize()
    return ot.cpu().numpy(), k.asm.get("ptx", "").count("wgmma.mma_async")


def measure(tiles: int = 8, seed: int = 0, *, fn: Optional[Callable] = None,
            spread: int = 24) -> dict:
    """Every case of :data:`CASES` on ``tiles`` tiles: the GPU (``fn``: a stand-in with
    :func:`run`'s signature, for tests) against the SM90 model, bit for bit. Returns
    ``{"cases": {"bf16_k16": {"outputs", "model_bit_equal", "wgmma_per_tile", "first_mismatch"}},
    "outputs", "mismatches"}``."""
    from fa4verify.kernels.twin import tensor_core as tc
    rng = np.random.default_rng(seed)
    fn = fn or run
    out: dict = {"cases": {}, "outputs": 0, "mismatches": 0}
    for dt, K in CASES:
        A, B, C = draw(rng, dt, K, tiles, spread)
        O, n_wgmma = fn(A, B, C, dt)
        model = tc.mma(A, np.swapaxes(B, 1, 2), C, tc.SM90[dt])
        same = np.asarray(O, np.float32).view(np.int32) == model.view(np.int32)
        first = None
        if not same.all():
            i = tuple(int(x) for x in np.argwhere(~same)[0])
            first = {"index": i, "gpu": float(O[i]), "model": float(model[i])}
        out["cases"][f"{dt}_k{K}"] = {"outputs": int(same.size), "model_bit_equal": int(same.sum()),
                                      "wgmma_per_tile": int(n_wgmma), "first_mismatch": first}
        out["outputs"] += int(same.size)
        out["mismatches"] += int((~same).sum())
    return out
