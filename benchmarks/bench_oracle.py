"""Benchmark the attention oracles on this CPU (figures are "CPU", not GPU measurements).

Usage::

    python benchmarks/bench_oracle.py                      # defaults: 1 x 8 heads x 4096 x 128, causal
    python benchmarks/bench_oracle.py --seqlen 1024 --heads 2 --arbiter-seqlen 16

Prints: (1) the fast certified reference, forward and forward+backward wall time, and the
largest bound relative to the natural scale (sum_j P_j |V_j| for O); (2) the mpmath arbiter's
throughput in multiply-adds per second at ``--bits`` (default 80; the arbiter evaluates at p and
2p bits, both included); (3) ``--agreement N`` random small problems with every feature, fast vs
arbiter: values outside the summed bounds (must be 0), tightness, worst relative bound.
Asserts nothing.

Wall time depends on what else runs on the machine (the script prints the load average); the
process CPU time is the steadier figure of the work done. The reference runs independent
(segment, kv head) tasks on ``FA4VERIFY_ORACLE_THREADS`` threads (default: all CPUs).

Measured (CPU, 2 cores shared with other jobs, 2026-11-30), 1 x 8 x 4096 x 128 causal bf16:
at load average ~3.3: forward 1.5 s wall (2.7 s CPU); one ``backward`` call (forward + backward
in one pass, ``result.forward``) 6.4 s wall (9.0 s CPU); separate ``forward`` + ``backward``
calls 10.3 s wall (12.4 s CPU). At load ~15 the same work took 25-41 s wall. Arbiter at 80/160
bits: 2-6e5 (forward) and 3.5e5 (backward) multiply-adds per second.
"""
from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np


def _bf16(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    import ml_dtypes
    return rng.standard_normal(shape).astype(np.float32).astype(ml_dtypes.bfloat16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--bits", type=int, default=80)
    ap.add_argument("--arbiter-seqlen", type=int, default=16)
    ap.add_argument("--arbiter-headdim", type=int, default=16)
    ap.add_argument("--skip-arbiter", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--agreement", type=int, default=200, metavar="N",
                    help="random small problems for the fast-vs-arbiter figures (0: skip). Default: %(default)r")
    a = ap.parse_args()

    from fa4verify.oracles import attention, stats as ostats  # noqa: F401
    import fa4verify.oracles.reference as ref

    causal = not a.no_causal
    rng = np.random.default_rng(a.seed)
    shape = (a.batch, a.seqlen, a.heads, a.headdim)
    q, k, v, do = (_bf16(rng, shape) for _ in range(4))
    print(f"# fa4verify oracle benchmark (CPU) -- {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, numpy {np.__version__}, python {platform.python_version()}, "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}")
    print(f"# load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          f"(other processes on this machine slow every figure down)")
    print(f"# fast reference: bf16 {a.batch}x{a.heads} heads x {a.seqlen} x {a.headdim}, causal={causal}, "
          f"row block {ref.ROW_BLOCK}")
    t0, c0 = time.perf_counter(), time.process_time()
    f = attention.forward(q, k, v, causal=causal)
    t1, c1 = time.perf_counter(), time.process_time()
    b = attention.backward(q, k, v, f.out.astype(np.float32).astype(q.dtype), do, causal=causal)
    t2, c2 = time.perf_counter(), time.process_time()
    st = ostats.forward_stats(q, k, v, causal=causal)
    rel = f.bound / np.maximum(st.sum_abs_pv, np.finfo(float).tiny)
    print(f"forward               {t1 - t0:8.2f} s wall  {c1 - c0:8.2f} s CPU time   (CPU)")
    print(f"backward (incl. fwd)  {t2 - t1:8.2f} s wall  {c2 - c1:8.2f} s CPU time   (CPU)")
    print(f"forward + backward    {t2 - t0:8.2f} s wall  {c2 - c0:8.2f} s CPU time   (CPU; goal <= 10 s wall)")
    ob = f.out.astype(np.float32).astype(q.dtype)
    t3, c3 = time.perf_counter(), time.process_time()
    attention.backward(q, k, v, ob, do, causal=causal)   # .forward carries the forward result
    t4, c4 = time.perf_counter(), time.process_time()
    print(f"one backward call (fwd+bwd in one pass, result.forward) "
          f"{t4 - t3:8.2f} s wall  {c4 - c3:8.2f} s CPU time   (CPU; goal <= 10 s wall)")
    print(f"# load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"max out bound / sum|P||V|      2^{np.log2(rel.max()):.1f}   (median 2^{np.log2(np.median(rel)):.1f})")
    print(f"max lse bound                   2^{np.log2(f.lse_bound.max()):.1f}")
    for n in ("dq", "dk", "dv"):
        bb = getattr(b, n + "_bound")
        val = np.abs(getattr(b, n))
        print(f"max {n} bound                    2^{np.log2(bb.max()):.1f}   (max |{n}| {val.max():.3g})")
    if a.skip_arbiter:
        return
    if a.agreement:
        from fa4verify.checks.oracles import compare_fast_arbiter, random_problem
        arng = np.random.default_rng(a.seed)
        viol, tight, worst = 0, 0.0, -np.inf
        for dt in ("bf16", "fp16", "fp32"):
            for _ in range(a.agreement // 3):
                r = compare_fast_arbiter(random_problem(arng, dt), bits=a.bits)
                viol += r["violations"]
                tight = max(tight, r["tightness"])
                worst = max(worst, r["log2_rel_bound"])
        print(f"# fast reference vs arbiter ({a.bits} bits): {3 * (a.agreement // 3)} random small problems "
              f"(bf16/fp16/fp32; causal, windows, softcap, sinks, GQA/MQA, varlen incl. empty, dlse), fwd+bwd")
        print(f"values outside fast bound + arbiter bound   {viol}   (CPU)")
        print(f"max |fast - arbiter| / fast bound           {tight:.3f}   (CPU)")
        print(f"worst out bound / sum|P||V|                 2^{worst:.1f}   (CPU)")
    n, dh = a.arbiter_seqlen, a.arbiter_headdim
    qa, ka, va, da = (_bf16(rng, (1, n, 1, dh)) for _ in range(4))
    t0 = time.perf_counter()
    attention.forward(qa, ka, va, causal=False, precision=a.bits)
    t1 = time.perf_counter()
    attention.backward(qa, ka, va, None, da, causal=False, precision=a.bits)
    t2 = time.perf_counter()
    macs_f = 2 * n * n * dh            # QK^T and PV, per precision
    macs_b = macs_f + 4 * n * n * dh   # + dP, dQ, dK, dV
    print(f"# arbiter: mpmath {a.bits}/{2 * a.bits} bits, 1 head, seqlen {n}, headdim {dh}, non-causal")
    print(f"forward   {t1 - t0:7.2f} s   {2 * macs_f / (t1 - t0):10.3g} multiply-adds/s (both precisions counted; CPU)")
    print(f"backward  {t2 - t1:7.2f} s   {2 * macs_b / (t2 - t1):10.3g} multiply-adds/s (both precisions counted; CPU)")


if __name__ == "__main__":
    main()
