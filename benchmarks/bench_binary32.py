"""Benchmark: throughput of the exact binary32 kit (``fa4verify.oracles.binary32``) and the exp2 twin.

Usage::

    python benchmarks/bench_binary32.py [--n 4000000]

Prints Melem/s per operation (one process) and the environment fingerprint. Asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import platform
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    import numpy as np
    from fa4verify import __version__
    from fa4verify.oracles import binary32 as b32
    from fa4verify.exp2 import cert as ec
    from fa4verify.kernels.twin import ex2_emulation
    from fa4verify.oracles.exp2 import exp2_cr

    rng = np.random.default_rng(0)
    n = args.n
    a = rng.uniform(-4, 4, n).astype(np.float32)
    b = rng.uniform(-4, 4, n).astype(np.float32)
    c = rng.uniform(-4, 4, n).astype(np.float32)
    x = rng.uniform(-127, 8, n).astype(np.float32)
    f = rng.uniform(0, 1, n).astype(np.float32)
    cs = ec._coeffs(3)
    cases = [
        ("add rn", lambda: b32.add(a, b, "rn")),
        ("add rm", lambda: b32.add(a, b, "rm")),
        ("mul rz", lambda: b32.mul(a, b, "rz")),
        ("fma rn", lambda: b32.fma(a, b, c, "rn")),
        ("fma rm", lambda: b32.fma(a, b, c, "rm")),
        ("fmax", lambda: b32.fmax(a, b)),
        ("to_bf16", lambda: b32.to_bf16(a)),
        ("to_fp16", lambda: b32.to_fp16(a)),
        ("to_fp8_e4m3fn", lambda: b32.to_fp8_e4m3fn(a)),
        ("ulp_distance", lambda: b32.ulp_distance(a, b)),
        ("twin ex2_emulation deg3 (packed)", lambda: ex2_emulation(x, 3)),
        ("sweep emu_direct deg3 (main domain)", lambda: ec.emu_direct(x, cs)),
        ("sweep fused Horner deg3 on [0,1)", lambda: ec._horner(f, cs)),
        ("oracle exp2_cr fp32", lambda: exp2_cr(x, "f32")),
        ("oracle exp2_cr bf16", lambda: exp2_cr(x, "bf16")),
    ]
    print(f"# bench_binary32 -- CPU; numpy {np.__version__}, fa4verify {__version__}, python "
          f"{platform.python_version()}, {os.cpu_count()} CPUs, n = {n:,}, best of {args.repeat}")
    print(f"{'operation':<40} {'seconds':>9} {'Melem/s':>9}")
    for name, fn in cases:
        best = float("inf")
        for _ in range(args.repeat):
            t = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t)
        print(f"{name:<40} {best:9.3f} {n / best / 1e6:9.1f}")


if __name__ == "__main__":
    main()
