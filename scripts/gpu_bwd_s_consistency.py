"""Measure how far FA4's backward P strays from 1 on one-hot huge-logit rows: the evidence for or
against a sharper S model at bf16 e_qk >= 8 (error_budgets/DERIVATIONS.md#backward-interval, "What
it can and cannot see").

    python scripts/gpu_bwd_s_consistency.py --target production --problems 20 --json OUT.json
    python scripts/gpu_bwd_s_consistency.py --target twin --problems 20      (CPU twin, the control)

On a one-hot row i (q, k scaled by 2^e_qk) every key but the row's argmax j has P ~ 0, so when j is
the argmax of that row only, ``dV_j = RN_out(RN_p(P_ij) dO_i)`` and ``dV_j / dO_i`` reads the
backward's cast ``P_ij`` back (to a bf16 ulp). ``P_ij = ex2(S~_ij c - lse_log2_i)``: if the backward
recomputes the forward's S bitwise (as the twin does), it is ``2^r`` with ``r`` the LSE's and the
exponent argument's fp32 roundings only (~ u |S c|); if not, ``r`` also holds the difference of the
two S roundings, which the rigorous model allows up to ``2 gamma(d, u) sum |q||k| c`` (~ 60 log2
units at hd 64, e_qk 10). Prints, per problem, the largest ``|log2 P|`` over such keys and the model
limits; no verdict (a measurement).
"""
from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np


def _problem(seed: int, d: int, e_qk: float):
    from fa4verify.problem import AttentionProblem, ValueSpec
    return AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=128, seqlen_k=128, nheads=1, nheads_kv=1,
                            head_dim=d, head_dim_v=d, causal=False, softmax_scale=1.0 / math.sqrt(d),
                            values=ValueSpec("huge", seed, (("e_qk", e_qk), ("e_v", 0.0))))


def measure(target, p) -> dict:
    a = p.materialize()
    f = target.forward(p, a)
    g = target.backward(p, a, f)
    q, k = (np.asarray(a[n], np.float64)[0, :, 0] for n in ("q", "k"))
    do = np.asarray(a["dout"], np.float64)[0, :, 0]
    dv = np.asarray(g.dv, np.float64)[0, :, 0]
    S = q @ k.T * p.scale
    arg = np.argmax(S, axis=1)
    srt = np.sort(S, axis=1)
    gap = (srt[:, -1] - srt[:, -2]) * math.log2(math.e)       # log2 units to the runner-up
    once = np.bincount(arg, minlength=S.shape[1]) == 1
    logs = []
    for i, j in enumerate(arg):
        if not once[j] or gap[i] < 200:                        # one-hot: the runner-up below 2^-200
            continue
        ok = np.abs(do[i]) > 0
        r = dv[j][ok] / do[i][ok]
        logs.append(float(np.log2(np.median(r))))
    qk = np.abs(q) @ np.abs(k).T * p.scale * math.log2(math.e)
    d = p.head_dim
    g_d = d * 2.0 ** -24 / (1 - d * 2.0 ** -24)
    chain = chain_check(p, q, k, do, dv, np.asarray(f.lse, np.float64)[0, 0], arg, once, gap)
    return {"describe": p.describe(), "keys": len(logs), "max_abs_log2_p": max(map(abs, logs), default=None),
            "mean_log2_p": float(np.mean(logs)) if logs else None,
            "ulp_log2_s": float(2.0 ** -24 * np.max(np.abs(S)) * math.log2(math.e)),
            "model_s_error_log2": float(2 * g_d * qk.max()), **chain}


def chain_check(p, q, k, do, dv, lse, arg, once, gap) -> dict:
    """Note [One-hot LSE chain] (error_budgets/interval.py) against the read-back P: each one-hot
    key's ``dV_j / dO_i`` (the cast P, to a bf16 ulp of dV) inside the chain's enclosure of P,
    widened by the two bf16 casts (P's and dV's)? Counts the keys the chain decides, those
    outside, and the widest enclosure (log2 units)."""
    from fa4verify.error_budgets import interval as ivm
    from fa4verify.judge.attention import load_budgets
    bs = load_budgets(p.dtype, p.arch)
    S = q @ k.T
    A = np.abs(q) @ np.abs(k).T
    rS = np.asarray(bs.evaluate("bwd_s_accum", {"d": float(p.head_dim), "abs_qk": A}), np.float64)
    keep = np.ones(S.shape, bool)
    nb = np.full(S.shape[0], float(-(-S.shape[1] // 64)))       # at least as many blocks as the kernel's
    rows, cols, lo, hi = ivm.one_hot_chain(S - rS, S + rS, keep, ivm.chain_kappa(p.scale, mod=False), lse, None, nb, bs.constants)
    cast = (1 + 2.0 ** -8) ** 2 * (1 + 2.0 ** -20)
    n, out, width = 0, 0, 0.0
    for i, j, a, b in zip(rows, cols, lo, hi):
        if j != arg[i] or not once[j] or gap[i] < 200:
            continue
        ok = np.abs(do[i]) > 0
        r = np.median(dv[j][ok] / do[i][ok])
        n += 1
        out += int(not (a / cast <= r <= b * cast))
        width = max(width, float(np.log2(b / a)))
    return {"chain_keys": n, "chain_outside": out, "chain_width_log2": width}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", choices=("twin", "production"), default="twin")
    ap.add_argument("--problems", type=int, default=10)
    ap.add_argument("--e-qk", type=float, default=10.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    from fa4verify.targets import ProductionTarget, TwinTarget
    t = TwinTarget() if a.target == "twin" else ProductionTarget()
    rows = []
    for s in range(a.problems):
        for d in (64, 128):
            r = measure(t, _problem(1000 + s, d, a.e_qk))
            rows.append(r)
            print(f"{r['describe'][:60]:60s} keys {r['keys']:3d}  max|log2 P| {r['max_abs_log2_p']}  "
                  f"ulp(S c) {r['ulp_log2_s']:.3g}  model S error {r['model_s_error_log2']:.3g} (log2 units)  "
                  f"chain: {r['chain_keys']} keys, {r['chain_outside']} outside, width {r['chain_width_log2']:.3g}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"target": a.target, "e_qk": a.e_qk, "rows": rows,
                       "chain_keys": sum(r["chain_keys"] for r in rows),
                       "chain_outside": sum(r["chain_outside"] for r in rows)}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
