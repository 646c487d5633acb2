"""Investigate the production hd=8 dQ finding (docs/results/h200/README.md, finding 2) on a GPU.

Usage (on a CUDA machine):  python scripts/gpu_investigate_small_hd.py --json F

The committed case ``tests/regressions/bwd_budget-twin-ftz-floor.json`` (bf16, b=2, sq=sk=144,
h=1, d=8, causal, outlier values) gave production dQ far outside the composed budget while dK, dV
and the CPU twin were fine.  This script separates the candidate causes by running variants of
that problem through production FA4 and comparing against two float64 references computed with
torch on the same device:

* ``exact``: the true gradient of the bf16 inputs (float64 autograd);
* ``algo``: FA's backward algorithm in float64 fed with production's *own* forward outputs
  (P = exp(S*scale - LSE_prod), D = rowsum(dO * O_prod)), i.e. what an exact-arithmetic kernel
  would return given FA4's forward.  If production matches ``algo`` but not ``exact``, the error
  comes from the forward outputs (an algorithmic amplification); if it matches neither, the
  backward kernel itself is wrong.

Variants: the recorded case through the private driver (deterministic and not) and the public
autograd path; the same problem zero-padded to head dims 16/32/64 with the hd=8 softmax scale
(identical math, different kernel); each batch alone; the outliers scaled down; and
standard-normal hd 8/16/32 problems.  Every figure printed is "measured on <GPU>".
"""
from __future__ import annotations

import argparse
import json
import math
import os

import numpy as np

CASE = os.path.join(os.path.dirname(__file__), "..", "tests", "regressions", "bwd_budget-twin-ftz-floor.json")


def _ref(torch, q, k, v, do, scale, causal, out_prod=None, lse_prod=None):
    """float64 references: exact gradients, and the FA algorithm given production's O/LSE."""
    q64, k64, v64, do64 = (t.double() for t in (q, k, v, do))
    sq = q64.shape[1]
    sk = k64.shape[1]
    qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q64, k64, v64))
    s = torch.einsum("bqhd,bkhd->bhqk", qq, kk) * scale
    mask = None
    if causal:
        # bottom-right aligned causal (FA convention): key j visible to query i iff j <= i + sk - sq
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        mask = j > i + (sk - sq)
        s = s.masked_fill(mask, float("-inf"))
    p = torch.softmax(s, dim=-1)
    o = torch.einsum("bhqk,bkhd->bqhd", p, vv)
    o.backward(do64)
    exact = {"out": o.detach(), "lse": torch.logsumexp(s.detach(), dim=-1),
             "dq": qq.grad, "dk": kk.grad, "dv": vv.grad}
    algo = None
    if out_prod is not None and lse_prod is not None:
        s0 = torch.einsum("bqhd,bkhd->bhqk", q64, k64) * scale
        p2 = torch.exp(s0 - lse_prod.double()[..., None])
        if mask is not None:
            p2 = p2.masked_fill(mask, 0.0)
        dpp = torch.einsum("bqhd,bkhd->bhqk", do64, v64)
        D = (do64 * out_prod.double()).sum(-1).permute(0, 2, 1)  # (b,h,sq)
        ds = p2 * (dpp - D[..., None])
        algo = {"dq": torch.einsum("bhqk,bkhd->bqhd", ds, k64) * scale,
                "dk": torch.einsum("bhqk,bqhd->bkhd", ds, q64) * scale,
                "dv": torch.einsum("bhqk,bqhd->bkhd", p2, do64)}
        # a crude per-element bf16-level noise scale for dQ: 2^-8 * (|dS| @ |K|) * scale
        algo["dq_scale"] = torch.einsum("bhqk,bkhd->bqhd", ds.abs() + p2 * (dpp.abs() + D.abs()[..., None]),
                                        k64.abs()) * scale * 2.0 ** -8
    return exact, algo


def _cmp(torch, got, ref, scale_t=None):
    g = got.double()
    e = (g - ref).abs()
    r = {"max_abs_err": float(e.max()), "max_abs_ref": float(ref.abs().max()),
         "argmax": [int(x) for x in np.unravel_index(int(e.argmax()), tuple(e.shape))]}
    if scale_t is not None:
        over = e > scale_t + 1e-30
        r["over_noise"] = int(over.sum())
        if r["over_noise"]:
            rows = torch.nonzero(over.any(-1).any(-1))  # (b, q) pairs
            r["rows_over"] = [[int(a), int(b)] for a, b in rows[:40].tolist()]
    return r


def run_variant(torch, fa, name, q, k, v, do, scale, causal, *, path="driver", deterministic=True,
                slice_d=None):
    from fa4verify.kernels import adapter
    if path == "driver":
        f = adapter.forward(q, k, v, softmax_scale=scale, causal=causal, return_lse=True)
        out, lse = f.out, f.lse
        bw = adapter.backward(q, k, v, out, do, lse, softmax_scale=scale, causal=causal,
                              deterministic=deterministic)
        dq, dk, dv = bw.dq, bw.dk, bw.dv
    else:
        out, lse, dq, dk, dv, _ = adapter.forward_backward_autograd(q, k, v, do, softmax_scale=scale, causal=causal,
                                                                    deterministic=deterministic)
    torch.cuda.synchronize()
    lse_bqh = lse.float()  # FA4 LSE is (b, h, sq)
    exact, algo = _ref(torch, q, k, v, do, scale, causal, out_prod=out, lse_prod=lse_bqh)
    sl = (lambda t: t[..., :slice_d]) if slice_d else (lambda t: t)
    row = {"variant": name, "shape": list(q.shape), "causal": causal, "path": path,
           "deterministic": deterministic, "softmax_scale": scale}
    row["out_vs_exact"] = _cmp(torch, sl(out), sl(exact["out"]))
    row["lse_vs_exact"] = _cmp(torch, lse_bqh, exact["lse"])
    for g, t in (("dq", dq), ("dk", dk), ("dv", dv)):
        noise = sl(algo["dq_scale"]) if g == "dq" else None
        row[f"{g}_vs_exact"] = _cmp(torch, sl(t), sl(exact[g]), noise)
        row[f"{g}_vs_algo"] = _cmp(torch, sl(t), sl(algo[g]), noise)
    print(f"{name:38s} dq vs exact {row['dq_vs_exact']['max_abs_err']:.3g} "
          f"(over noise {row['dq_vs_exact'].get('over_noise')}) | dq vs algo {row['dq_vs_algo']['max_abs_err']:.3g} "
          f"(over {row['dq_vs_algo'].get('over_noise')}) | dk {row['dk_vs_exact']['max_abs_err']:.3g} "
          f"dv {row['dv_vs_exact']['max_abs_err']:.3g} | out {row['out_vs_exact']['max_abs_err']:.3g} "
          f"lse {row['lse_vs_exact']['max_abs_err']:.3g} | max|dq| {row['dq_vs_exact']['max_abs_ref']:.3g}",
          flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch
    from fa4verify.kernels import adapter

    from fa4verify import fuzz
    if not torch.cuda.is_available():
        print("no CUDA device: torch.cuda.is_available() is False; nothing run")
        return 2
    case = fuzz.load_case(CASE)
    prob = case["problem_obj"]
    a = prob.materialize()
    bf = torch.bfloat16
    dev = "cuda"
    q, k, v, do = (torch.from_numpy(np.ascontiguousarray(a[n], np.float32)).to(dev, bf)
                   for n in ("q", "k", "v", "dout"))
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d)
    rows = []

    def go(*args, **kw):
        try:
            rows.append(run_variant(torch, None, *args, **kw))
        except Exception as e:  # noqa: BLE001 - one failing variant must not hide the others
            print(f"{args[0]:38s} ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
            rows.append({"variant": args[0], "error": f"{type(e).__name__}: {e}"})

    go("case hd8 driver det", q, k, v, do, scale, True)
    go("case hd8 driver nondet", q, k, v, do, scale, True, deterministic=False)
    go("case hd8 public autograd", q, k, v, do, scale, True, path="autograd", deterministic=False)
    for pad in (16, 32, 64):
        zq, zk, zv, zdo = (torch.nn.functional.pad(t, (0, pad - d)) for t in (q, k, v, do))
        go(f"case zero-padded to hd{pad}", zq, zk, zv, zdo, scale, True, slice_d=d)
    for bi in range(q.shape[0]):
        go(f"case batch {bi} alone", q[bi:bi + 1].contiguous(), k[bi:bi + 1].contiguous(),
           v[bi:bi + 1].contiguous(), do[bi:bi + 1].contiguous(), scale, True)
    go("case non-causal", q, k, v, do, scale, False)
    for div in (4.0, 16.0):
        go(f"case values / {div:g}", (q.float() / div).to(bf), (k.float() / div).to(bf), v, do, scale, True)
    g = torch.Generator(device="cpu").manual_seed(0)
    for hd in (8, 16, 32, 64):
        for sq in (128, 144):
            for causal in (True, False):
                t = [torch.randn(2, sq, 1, hd, generator=g).to(dev, bf) for _ in range(4)]
                go(f"normal hd{hd} sq{sq} {'causal' if causal else 'full'}", *t, 1.0 / math.sqrt(hd), causal)
    res = {"where": f"measured on {torch.cuda.get_device_name(0)}", "versions": adapter.versions(),
           "case": os.path.basename(CASE), "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
