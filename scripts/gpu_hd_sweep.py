"""Sweep FA4's SM90 backward over every head dim 8..256 (step 8) and test the dQ-accumulator
hypothesis for the small-hd dQ finding (docs/results/h200/README.md).

Usage (on a CUDA machine with an SM90 GPU):  python scripts/gpu_hd_sweep.py --json F

Hypothesis (from flash-attn-4 4.0.0b36's source, read from the installed package): the SM90 main
backward kernel tiles its fp32 dQ accumulator in blocks of ``tile_m x tile_hdim`` with
``tile_hdim = ceil(hd / 16) * 16`` (``ceil(hd / 64) * 64`` when ``dKV_swapAB``), while the
interface allocates the accumulator and the dQ postprocess reads it with
``ceil(hd / 32) * 32`` (64 when ``dKV_swapAB``).  Where the two roundings differ, the postprocess
reads another layout than the one written, so dQ is wrong (past the first 64 query rows, as
measured) while dK and dV are right.  Rows are made by :func:`fa4verify.hd_sweep.measure` (inputs
drawn q, dO, K, V; the recorded full sweep of 2026-11-30 drew q, K, V, dO, same seed).  The
prediction comes from :func:`fa4verify.kernels.fa4_params.sm90_dq_accum_mismatch`, computed from
FA4's own tile-size function; this script measures every head dim and reports whether the
measured set of broken head dims equals the predicted set.
"""
from __future__ import annotations

import argparse
import json


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=None)
    ap.add_argument("--seqlen", type=int, default=256, help="seqlen_k (and seqlen_q unless --seqlens-q)")
    ap.add_argument("--seqlens-q", default=None, help="comma list of seqlen_q values to sweep per head dim")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--head-dims", default="8-256", help="comma list, or A-B for every multiple of 8 in [A, B]")
    args = ap.parse_args()
    import torch
    from fa4verify.kernels import adapter, fa4_params

    from fa4verify import hd_sweep
    if not torch.cuda.is_available():
        print("no CUDA device: torch.cuda.is_available() is False; nothing run")
        return 2
    g = torch.Generator(device="cpu").manual_seed(0)
    rows = []
    if "-" in args.head_dims:
        lo, hi = (int(x) for x in args.head_dims.split("-"))
        hds = list(range(lo, hi + 1, 8))
    else:
        hds = [int(x) for x in args.head_dims.split(",")]
    sqs = [int(x) for x in args.seqlens_q.split(",")] if args.seqlens_q else [args.seqlen]
    for hd, sq in ((h, s) for h in hds for s in sqs):
        pred = fa4_params.sm90_dq_accum_mismatch(hd, hd, causal=args.causal)
        row = hd_sweep.measure(adapter, hd, sq, args.seqlen, causal=args.causal, generator=g)
        row.update(predicted_broken=bool(fa4_params.sm90_dq_defect_predicted(hd, hd, [sq], causal=args.causal)),
                   prediction=pred)
        if "error" not in row:
            row["measured_broken"] = hd_sweep.dq_ratio(row) > 1
        rows.append(row)
        print(f"hd {hd:3d} sq {sq:4d} predicted {'BROKEN' if row['predicted_broken'] else 'ok    '} | "
              + (f"dQ rel {row['dq_rel_err']:.2e} dK {row['dk_rel_err']:.2e} dV {row['dv_rel_err']:.2e}"
                 if "error" not in row else row["error"]), flush=True)
    ran = [r for r in rows if "error" not in r]
    measured = sorted(r["head_dim"] for r in ran if r["measured_broken"])
    predicted = sorted(r["head_dim"] for r in ran if r["predicted_broken"])
    failed = sorted(r["head_dim"] for r in rows if "error" in r)
    verdict = ("prediction confirmed" if measured == predicted else "prediction REFUTED") + \
        f" on the {len(ran)} head dims that ran"
    print(f"measured broken: {measured}\npredicted broken (among those that ran): {predicted}\n"
          f"FA4 raised for: {failed}\n{verdict}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"where": f"measured on {torch.cuda.get_device_name(0)}", "versions": adapter.versions(),
                       "seqlen": args.seqlen, "causal": args.causal, "rows": rows,
                       "measured_broken": measured, "predicted_broken": predicted, "raised": failed,
                       "verdict": verdict}, fh, indent=2)
    return 0 if measured == predicted else 1


if __name__ == "__main__":
    raise SystemExit(main())
