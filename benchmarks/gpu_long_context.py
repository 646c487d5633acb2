"""Long-context audit time and tightness: production FA4 forward + backward at long seqlen,
judged against the streamed float64 oracle (fa4verify.judge.long_context).

    python3 benchmarks/gpu_long_context.py --seqlens 32768,131072 --json out.json   # H200
    python3 benchmarks/gpu_long_context.py --device cpu --kernel torch32 --seqlens 256 --heads 2 --head-dim 32

Prints, per seqlen: seconds per phase (kernel forward/backward, oracle forward, budget forward,
compare forward, D error + backward_p, oracle backward, budget backward, compare backward; every
phase device-synchronised), the verdict, elements compared, tightness per tensor, the oracle
bound's share of the allowance and the tightness histogram. ``--engine device`` (default) judges
on the oracle's device, ``--engine host`` the numpy path (the session-4 figures: 126.7 s at 131072,
measured on NVIDIA H200 (sm_90)).
Figures are "measured on <GPU>" with --kernel fa4, "CPU stand-in" with torch32. Asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlens", default="32768,131072")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--heads-kv", type=int, default=None)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--kernel", default="fa4", choices=("fa4", "torch32"))
    ap.add_argument("--block", type=int, default=4096)
    ap.add_argument("--engine", default="device", choices=("device", "host"))
    ap.add_argument("--chunk", type=int, default=16384, help="judged rows per device slab. Default: %(default)r")
    ap.add_argument("--plant", default="", metavar="SEQLENS",
                    help="seqlens whose out and dq get one planted fault each (the verdict must be fail). Default: none")
    ap.add_argument("--cross-check", default="", metavar="SEQLENS",
                    help="seqlens whose outputs the other engine judges too (agreement printed). Default: none")
    ap.add_argument("--row-stride", type=int, default=1)
    ap.add_argument("--forward-only", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    try:
        seqlens = [int(x) for x in a.seqlens.split(",") if x.strip()]
        cross = {int(x) for x in a.cross_check.split(",") if x.strip()}
        plant = {int(x) for x in a.plant.split(",") if x.strip()}
    except ValueError:
        print(f"gpu_long_context: error: --seqlens {a.seqlens!r} / --cross-check {a.cross_check!r} / "
              f"--plant {a.plant!r}: expected integers", file=sys.stderr)
        return 2
    import torch
    from fa4verify.checks.long_context import engine_agreement, histogram_row, phase_seconds, run_case
    where = "CPU stand-in"
    if a.kernel == "fa4":
        from fa4verify.kernels import device as kdev
        where = kdev.where_measured(kdev.local_gpu())
    res = []
    print(f"# long-context audit, {where}; torch {torch.__version__}; heads {a.heads}/{a.heads_kv or a.heads}, "
          f"hd {a.head_dim}, causal {not a.no_causal}, block {a.block}, row stride {a.row_stride}, "
          f"engine {a.engine}, chunk {a.chunk}")
    for s in seqlens:
        r = run_case(s, nheads=a.heads, nheads_kv=a.heads_kv or a.heads, head_dim=a.head_dim, causal=not a.no_causal,
                     device=a.device, kernel=a.kernel, seed=a.seed, block=a.block, row_stride=a.row_stride,
                     backward=not a.forward_only, engine=a.engine, chunk=a.chunk, cross_check=s in cross,
                     plant=s in plant)
        j = r["judgement"]
        secs = phase_seconds(r)
        audit = secs["total"]
        print(f"seqlen {s}: {j.status}, {j.n_compared} elements compared, audit {audit:.2f} s")
        if r["planted"]:
            caught = {n: (j.verdicts[n].status == "fail" and j.verdicts[n].worst is not None
                          and j.verdicts[n].worst.index == idx) for n, idx in r["planted"].items()}
            print(f"  planted faults {r['planted']}: " + ", ".join(
                f"{n} {'caught (fail, worst element = the planted one)' if c else 'NOT CAUGHT'}" for n, c in caught.items()))
        print("  phases: " + ", ".join(f"{k} {v:.2f}s" for k, v in secs.items()))
        for n, v in j.verdicts.items():
            print(f"  {n:4s} {v.status:9s} compared {v.n_compared:>11d}  tightness {v.tightness:.4f}  "
                  f"max|err| {v.max_abs_err:.3g}  oracle bound share {j.oracle_bound_rel.get(n, float('nan')):.3g}")
        for n, h in j.histograms.items():
            print(f"  {n:4s} tightness histogram " + " ".join(f"{k}:{c}" for k, c in histogram_row(h).items()))
        agree = None
        if "other" in r:
            agree = engine_agreement(j, r["other"])
            o = r["other"]
            print(f"  cross-check ({o.fingerprint['engine']} engine, {o.seconds['total']:.2f} s judge): "
                  + ("verdicts and counts equal" if agree["all_same"] else "DIFFERENT")
                  + ", tightness rel. diff max "
                  + f"{max(x['tightness_rel_diff'] for x in agree.values() if isinstance(x, dict) and 'tightness_rel_diff' in x):.2g}")
        res.append({"seqlen": s, "status": j.status, "n_compared": j.n_compared, "audit_seconds": audit,
                    "seconds": secs, "where": where, "fingerprint": j.fingerprint, "arch": r["arch"],
                    "histograms": {n: histogram_row(h) for n, h in j.histograms.items()},
                    "verdicts": {n: {"status": v.status, "n_compared": v.n_compared, "tightness": v.tightness,
                                     "max_abs_err": v.max_abs_err, "reason": v.reason,
                                     "oracle_bound_share": j.oracle_bound_rel.get(n)} for n, v in j.verdicts.items()},
                    **({"cross_check": agree} if agree is not None else {}),
                    **({"planted": {n: list(i) for n, i in r["planted"].items()},
                        "planted_caught": caught} if r["planted"] else {})})
        if a.json:     # after every seqlen: a later timeout keeps the earlier figures
            with open(a.json, "w") as fh:
                json.dump({"format": "fa4verify.long_context/2", "runs": res}, fh, indent=1, default=str)
        del r, j
    return 0


if __name__ == "__main__":
    sys.exit(main())
