"""Cost of FA4's deterministic backward: time with deterministic=True vs False (GPU).

Usage (on a CUDA machine with flash-attn-4; see shared/device/README.md for the lent H200)::

    python benchmarks/gpu_determinism_cost.py                       # the built-in timing shapes
    python benchmarks/gpu_determinism_cost.py --batch 2 --seqlen 8192 --nheads 16 \\
        --nheads-kv 4 --head-dim 128 --causal --reps 20

Prints one row per shape: median backward time (ms, CUDA events around the adapter call,
interleaved det/default blocks after warm-up), det/default ratio, deterministic speed as a
percentage of the default speed (the FA4 paper's figure: "up to 75%" on B200), backward TFLOP/s
(2.5 x forward FLOPs, halved for causal), and the environment fingerprint. Asserts nothing.
Figures are "measured on <GPU>"; clocks are whatever the machine runs at (not locked).
The same measurement is ``fa4verify determinism --timing``; recorded H200 figures are in
kernels/evidence/determinism/README.md.
"""
from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=None, metavar="B")
    ap.add_argument("--seqlen", type=int, default=4096, metavar="S")
    ap.add_argument("--nheads", type=int, default=16, metavar="H")
    ap.add_argument("--nheads-kv", type=int, default=None, metavar="HKV")
    ap.add_argument("--head-dim", type=int, default=128, metavar="D")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--reps", type=int, default=20, help="timed reps per block (default 20)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", default=None, metavar="F", help="also write the rows as JSON")
    a = ap.parse_args(argv)

    from fa4verify import determinism as d
    try:
        be = d.load_backend("fa4")
    except EnvironmentError as ex:
        print(f"gpu_determinism_cost: {ex}", file=sys.stderr)
        return 2
    if a.batch is None:
        cfgs = d.TIMING_CONFIGS
    else:
        cfgs = (d.DeterminismConfig(
            "custom", batch=a.batch, seqlen_q=a.seqlen, seqlen_k=a.seqlen, nheads=a.nheads,
            nheads_kv=a.nheads_kv or a.nheads, head_dim=a.head_dim, causal=a.causal,
            dtype=a.dtype),)
    for c in cfgs:
        errs = d.validate_config(c)
        if errs:
            print("gpu_determinism_cost: " + "; ".join(errs), file=sys.stderr)
            return 2
    env = be.environment("cuda:0")
    print(f"# {be.where}; " + ", ".join(f"{k}={env[k]}" for k in d.ENV_KEY_FIELDS if k in env))
    print(f"{'shape':<52} {'default ms':>10} {'det ms':>9} {'det/def':>8} {'det speed':>9} "
          f"{'TFLOP/s def':>11} {'TFLOP/s det':>11}")
    rows = []
    for c in cfgs:
        r = d.time_backward(be, c, "cuda:0", reps=a.reps, warmup=a.warmup)
        rows.append(r)
        if r.get("status") != "ok":
            print(f"{c.shape_key():<52} {r.get('status')}: {r.get('reason')}")
            continue
        print(f"{c.shape_key() + (' causal' if c.causal else ''):<52} {r['default_ms']:>10.3f} "
              f"{r['det_ms']:>9.3f} {r['ratio_det_over_default']:>8.3f} "
              f"{r['det_speed_pct_of_default']:>8.1f}% {r['bwd_tflops_default']:>11.1f} "
              f"{r['bwd_tflops_det']:>11.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"environment": env, "where": be.where, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
