"""Record what the SM90 tensor core returns for bf16 x bf16 -> fp32 MMA k-steps (wgmma, the
instruction FA4's SM90 kernels use for S = Q K^T), for fitting and checking a bit-exact model of
its accumulation (``kernels/twin/tensor_core.py``).

A Triton kernel computes ``acc = C0; for each 16-wide k block: acc = dot(A_blk, B_blk, acc)`` on a
64 x 64 tile with one warpgroup, so every k step is one ``wgmma.mma_async ... m64n64k16.f32.bf16.bf16``
(the script checks the PTX says so). Inputs are drawn to expose the alignment of the products and
the accumulator: bf16 values with exponents spread over ``--spread`` binades, random signs, and an
fp32 C0 of varied magnitude (0 in a quarter of the rows). Output: ``--out`` (.npz) with the inputs as
fp32 arrays and the GPU's fp32 results, per case (K = 16 and K = 64).

Measured on a GPU only (needs CUDA and Triton); writes nothing else.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiles", type=int, default=64, help="64 x 64 tiles per case")
    ap.add_argument("--spread", type=int, default=24, help="binades the input exponents spread over")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    import torch
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

    rng = np.random.default_rng(args.seed)
    dev = torch.device("cuda")
    out = {"gpu": torch.cuda.get_device_name(0), "capability": ".".join(map(str, torch.cuda.get_device_capability(0)))}
    for dt, K in (("bf16", 16), ("bf16", 64), ("fp16", 16), ("fp16", 64)):
        T = args.tiles
        tdt = torch.bfloat16 if dt == "bf16" else torch.float16
        fbits = 128 if dt == "bf16" else 1024

        def draw(shape):
            e = rng.integers(-args.spread // 2, args.spread // 2 + 1, size=shape)
            m = 1.0 + rng.integers(0, fbits, size=shape) / fbits      # 7 / 10 fraction bits: exact
            s = rng.choice([-1.0, 1.0], size=shape)
            x = s * m * np.exp2(e)
            x[rng.random(shape) < 0.05] = 0.0
            return x.astype(np.float32)
        A = draw((T, 64, K))
        B = draw((T, K, 64))
        C = (rng.standard_normal((T, 64, 64)) * np.exp2(rng.integers(-args.spread // 2, args.spread // 2 + 1,
                                                                      size=(T, 64, 64)))).astype(np.float32)
        C[:, ::4, :] = 0.0
        at = torch.tensor(A, device=dev).to(tdt)
        bt = torch.tensor(B, device=dev).to(tdt)
        assert torch.equal(at.float().cpu(), torch.tensor(A)) and torch.equal(bt.float().cpu(), torch.tensor(B))
        ct = torch.tensor(C, device=dev)
        ot = torch.empty_like(ct)
        k = mma_steps[(T,)](at, bt, ct, ot, K=K, num_warps=4)
        torch.cuda.synchronize()
        ptx = k.asm.get("ptx", "")
        n_wgmma = ptx.count("wgmma.mma_async")
        print(f"{dt} K={K}: {T} tiles, PTX wgmma.mma_async x{n_wgmma}", [ln.strip() for ln in ptx.splitlines()
                                                                     if "wgmma.mma_async" in ln][:1])
        out[f"A_{dt}_{K}"], out[f"B_{dt}_{K}"], out[f"C_{dt}_{K}"] = A, B, C
        out[f"O_{dt}_{K}"] = ot.cpu().numpy()
        out[f"wgmma_{dt}_{K}"] = n_wgmma
    np.savez_compressed(args.out, **out)
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
