"""Measure two defects FA4's source predicts (issue 16, item 7) on an SM90 GPU:

1. GQA/MQA backward at small head dims: the dK/dV accumulators are rounded to 16 in
   flash_bwd_sm90.py but allocated with 32 in interface.py -> wrong dK/dV predicted at hd
   8/16/40/48/72/80 when nheads_kv < nheads (the dQ defect's root cause, on the KV side).
2. Causal / local backward at hd 104/112: a different tile (tile_m 64, no swap) -> predicted to
   compile and return a wrong dQ (the non-causal path does not compile there).

Every row: relative Frobenius error of dQ, dK, dV vs a float64 autograd reference on the same bf16
inputs (N(0,1)); a gradient whose error is > 4x the best of the three is flagged wrong. Run:
``python scripts/gpu_predictions.py --json OUT.json``. Prints "measured on <GPU> (sm_XY)".
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time


def ref_grads(q, k, v, do, scale, causal, window=(None, None)):
    import torch
    g = q.shape[2] // k.shape[2]
    qq, kk, vv = (t.double().requires_grad_(True) for t in (q, k, v))
    K = kk.repeat_interleave(g, dim=2)
    V = vv.repeat_interleave(g, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", qq, K) * scale
    sq, sk = s.shape[-2:]
    i = torch.arange(sq, device=s.device)[:, None]
    j = torch.arange(sk, device=s.device)[None, :]
    keep = torch.ones(sq, sk, dtype=torch.bool, device=s.device)
    if causal:
        keep &= j <= i + sk - sq
    left, right = window
    if left is not None:
        keep &= j >= i + sk - sq - left
    if right is not None:
        keep &= j <= i + sk - sq + right
    s = s.masked_fill(~keep, float("-inf"))
    o = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1).nan_to_num(0.0), V)
    o.backward(do.double())
    return qq.grad, kk.grad, vv.grad


def case(adapter, hd, nheads, nheads_kv, seqlen, causal, window, gen):
    import torch
    q, do = (torch.randn(1, seqlen, nheads, hd, generator=gen).to("cuda", torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(1, seqlen, nheads_kv, hd, generator=gen).to("cuda", torch.bfloat16) for _ in range(2))
    row = {"head_dim": hd, "nheads": nheads, "nheads_kv": nheads_kv, "seqlen": seqlen, "causal": causal,
           "window_size": list(window)}
    try:
        f = adapter.forward(q, k, v, causal=causal, window_size=window, return_lse=True)
        b = adapter.backward(q, k, v, f.out, do, f.lse, causal=causal, window_size=window, deterministic=True)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - a head dim FA4 accepts but cannot run is a result
        row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        return row
    refs = ref_grads(q, k, v, do, 1.0 / math.sqrt(hd), causal, window)
    for n, got, ref in zip(("dq", "dk", "dv"), (b.dq, b.dk, b.dv), refs):
        row[f"{n}_rel_err"] = float((got.double() - ref).norm() / ref.norm())
    best = min(row["dq_rel_err"], row["dk_rel_err"], row["dv_rel_err"])
    row["wrong"] = [n for n in ("dq", "dk", "dv") if row[f"{n}_rel_err"] > 4 * best]
    return row


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--seqlen", type=int, default=256)
    a = ap.parse_args(argv)
    import torch

    from fa4verify.kernels import adapter
    from fa4verify.kernels.device import local_gpu, where_measured
    gpu = local_gpu()
    where = where_measured(gpu)
    gen = torch.Generator(device="cpu").manual_seed(0)
    rows, t0 = [], time.time()
    # 1. GQA/MQA backward at small head dims (and controls)
    for hd in (8, 16, 40, 48, 64, 72, 80, 128):
        for h, hk in ((4, 1), (4, 2), (4, 4)):
            rows.append(dict(case(adapter, hd, h, hk, a.seqlen, False, (None, None), gen), study="gqa_small_hd"))
            print(where, json.dumps(rows[-1]), flush=True)
    # 2. causal / local backward at hd 104/112 (and 96/120/128 controls)
    for hd in (96, 104, 112, 120, 128):
        for causal, window in ((False, (None, None)), (True, (None, None)), (False, (64, 0))):
            rows.append(dict(case(adapter, hd, 2, 2, a.seqlen, causal, window, gen), study="hd104_112_masked"))
            print(where, json.dumps(rows[-1]), flush=True)
    out = {"where": where, "versions": adapter.versions(), "seconds": time.time() - t0,
           "command": "python scripts/gpu_predictions.py " + " ".join(argv or sys.argv[1:]), "rows": rows}
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
