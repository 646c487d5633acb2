"""Fuzz production FA4's call forms on an SM90 GPU (issue 16 item 8): paged KV (page_table,
drawn page permutations, page sizes 16 and tile_n, partially filled last pages, empty sequences),
seqused_k (forward and backward), block sparsity and the CuTe checkerboard mask_mod, every
example judged by the one judge (``fa4verify.fuzz``) and the paged ones also bitwise against
contiguous K/V (``paged_kv_bitwise``).

``--device cpu`` runs the same campaign on the CPU twin (a stand-in with the same surface, small
sizes), so ``tests/test_gpu_fuzz_features_script.py`` runs every line without a GPU; such output
says "CPU twin" and is not evidence about FA4.

Run on the H200: ``bash scripts/gpu/fuzz_features.sh`` (~2-3 min cold, each step time-limited).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--features", default="paged_kv,seqused_k,block_sparse,mask_mod_fn",
                    help="call forms drawn (CALL_FEATURES), comma list")
    ap.add_argument("--head-dims", default="128", help="comma list of head dims drawn")
    ap.add_argument("--examples", type=int, default=30)
    ap.add_argument("--time-limit", type=float, default=100.0, help="seconds of drawing (a shrink runs on)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--nan-pages", action="store_true", help="NaN in unused pages (known issue scope)")
    ap.add_argument("--json", required=True)
    ns = ap.parse_args(argv)
    from fa4verify import fuzz
    from fa4verify.problem import CALL_FEATURES
    feats = tuple(f for f in ns.features.split(",") if f)
    bad = set(feats) - set(CALL_FEATURES)
    if bad:
        print(f"gpu_fuzz_features: unknown call feature(s) {sorted(bad)} (known: {CALL_FEATURES})", file=sys.stderr)
        return 2
    hds = tuple(int(x) for x in ns.head_dims.split(",") if x)
    out: dict = {"command": "python scripts/gpu_fuzz_features.py " + " ".join(argv or sys.argv[1:])}
    t0 = time.time()
    try:
        if ns.device == "cuda":
            tgt = fuzz.ProductionTarget()
            arch = tgt.arch
            limits = dict(max_seqlen=600, max_batch=3, max_heads=4, head_dim_choices=hds, max_work=60_000_000)
        else:
            tgt = fuzz.TwinTarget()
            arch = "sm90"
            limits = dict(max_seqlen=140, max_batch=2, max_heads=2, head_dim_choices=tuple(min(h, 32) for h in hds),
                          max_work=400_000)
        if ns.nan_pages:
            limits["hostile_nan"] = True
        # the dense call's features too: call forms combine with causal, windows, GQA, softcap, sinks
        base = ("causal", "local", "softcap", "sink", "varlen", "gqa")
        res = fuzz.run_campaign(target=tgt, arch=arch, dtype="bf16", examples=ns.examples, seed=ns.seed,
                                profile="ci", features=base + feats, limits=limits, time_limit_s=ns.time_limit)
        r = res.to_json()
        calls = {k: {v: n for v, n in res.coverage.get(k, {}).items() if v not in ("None", "False")}
                 for k in ("paged_kv", "seqused_k", "block_sparse", "mask_mod_fn", "hostile_nan")}
        out.update(where=res.target.get("where"), campaign=r, call_forms=calls,
                   summary={"examples": res.examples_run, "violation": res.failure is not None,
                            "failure": None if res.failure is None else
                            {k: res.failure[k] for k in ("property", "describe", "message")},
                            "known_issue_hits": {k: v["count"] for k, v in res.known_hits.items()},
                            "undecided": {k: v["count"] for k, v in res.undecided.items()},
                            "tightness_max": res.max_metrics.get("tightness_max"),
                            "paged_kv_bitwise_ran": res.properties_ran.get("paged_kv_bitwise", 0),
                            "bwd_budget_ran": res.properties_ran.get("bwd_budget", 0),
                            "unsupported": res.unsupported, "stopped": res.stopped})
        rc = 1 if res.failure is not None else 0
    except Exception as e:  # noqa: BLE001 - recorded, nonzero exit
        out["crash"] = f"{type(e).__name__}: {e}"
        out["traceback"] = traceback.format_exc()[-4000:]
        rc = 3
    out["seconds"] = round(time.time() - t0, 1)
    with open(ns.json, "w") as f:
        json.dump(out, f, indent=1, default=str)
    print(f"[fuzz_features] {out.get('where', ns.device)}: " + (out.get("crash") or json.dumps(
        {**out["summary"], "call_forms": out["call_forms"], "seconds": out["seconds"]}, default=str)), flush=True)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
