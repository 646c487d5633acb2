"""Record what the SM90 tensor core returns for bf16 / fp16 x -> fp32 MMA k-steps (wgmma, the
instruction FA4's SM90 kernels use for S = Q K^T), for fitting and checking the bit-exact model of
its accumulation (``kernels/twin/tensor_core.py``, Note [SM90 MMA model]).

The kernel and the input draw are :mod:`fa4verify.kernels.probes.mma_triton`'s (the audit's check
``tensor_core.mma`` re-measures with the same code). Output: ``--out`` (.npz) with, per case
(bf16 / fp16, K = 16 / 64), the inputs as fp32 arrays, the GPU's fp32 results and the wgmma count
read from the PTX. Measured on a GPU only (needs CUDA and Triton).
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

    from fa4verify.kernels.probes import mma_triton as probe
    rng = np.random.default_rng(args.seed)
    out = {"gpu": torch.cuda.get_device_name(0), "capability": ".".join(map(str, torch.cuda.get_device_capability(0)))}
    for dt, K in probe.CASES:
        A, B, C = probe.draw(rng, dt, K, args.tiles, args.spread)
        O, n_wgmma = probe.run(A, B, C, dt)
        print(f"{dt} K={K}: {args.tiles} tiles, PTX wgmma.mma_async x{n_wgmma}")
        out[f"A_{dt}_{K}"], out[f"B_{dt}_{K}"], out[f"C_{dt}_{K}"] = A, B, C
        out[f"O_{dt}_{K}"] = O
        out[f"wgmma_{dt}_{K}"] = n_wgmma
    np.savez_compressed(args.out, **out)
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
