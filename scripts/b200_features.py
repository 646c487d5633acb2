"""SM100-only FA4 features (issue 16 items 5, 6) on a B200: MLA (``qv``), top-k gather forward and
the sparse MLA backward, fp8 e4m3 with ``q/k/v_descale``; nothing here runs on the H200 (FA4
asserts on SM90: ``docs/results/features/compile_only_sm90a.json``).

Sections (``--section``, or ``all``; one JSON, ``--json``):

* ``mla_fwd``: dense MLA, hd 64 + 512, 16 heads / 1 KV head, causal and not;
* ``gather_fwd``: sparse MLA, 128 heads (FA4's 2CTA kernel) with -1 sentinels and the causal limit;
* ``gather_bwd``: the sparse MLA backward, saved P (128 heads) and recomputed P (64 heads, FA4's
  1CTA kernel, ``gather_bwd_recompute_p``);
* ``fp8_fwd``: e4m3 q/k/v with per-(batch, kv head) descales, hd 128, causal.

Each output is compared with the certified float64 oracle (``fa4verify.oracles.mla`` /
``.descale``): the largest error relative to the output's natural scale (``max |err| / max |ref|``),
the oracle's own bound (must be far below), and upstream's yardstick -- the error of an
``attention_ref``-style torch computation in the input dtype (fp32 accumulate, P rounded to the
input dtype) -- with FA's rule ``err <= 2 * ref_err + 1e-5`` (``fa_rule_ok``). fa4verify has no
derived budgets for these paths yet, so this is a measurement, not a budget verdict.

``--device cpu`` replaces FA4 by a CPU stand-in (the torch formula in float32) with small sizes so
``tests/test_b200_features_script.py`` runs every line; its output says "CPU stand-in".

On a B200: ``python scripts/b200_features.py --section all --json b200_features.json``
(estimate: 2-4 min, mostly FA4 compiles).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from typing import Any

import numpy as np


class Fa4:
    device = "cuda"

    def __init__(self):
        from fa4verify.kernels import adapter
        from fa4verify.kernels.device import local_gpu, where_measured
        self.ad = adapter
        self.where = where_measured(local_gpu())
        self.versions = adapter.versions()

    def mla_forward(self, q, k, v, qv, **kw):
        import torch
        r = self.ad.mla_forward(q, k, v, qv, **kw)
        torch.cuda.synchronize()
        return r, r.config.to_dict()

    def mla_backward(self, q, k, v, qv, fwd, dout, idx, **kw):
        import torch
        r = self.ad.mla_backward(q, k, v, qv, fwd.out, dout, fwd.lse, idx, fwd=fwd, **kw)
        torch.cuda.synchronize()
        return r, r.config.to_dict()

    def fp8_forward(self, q, k, v, qd, kd, vd, causal):
        import torch
        r = self.ad.forward(q, k, v, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd)
        torch.cuda.synchronize()
        return r.out, r.lse, r.config.to_dict()


class _Fwd:
    def __init__(self, out, lse):
        self.out, self.lse, self.p, self.row_max, self.o_lo = out, lse, None, None, None


class CpuStandIn:
    """Same surface as :class:`Fa4` without FA4: the formulas in float32 torch."""
    device = "cpu"
    where = "CPU stand-in (not evidence)"
    versions: dict = {}

    def mla_forward(self, q, k, v, qv, gather_kv_indices=None, causal=False, **kw):
        o, lse = torch_mla(q.float(), k.float(), v.float(), qv.float(), gather_kv_indices, causal)
        return _Fwd(o.to(q.dtype), lse), {"stand_in": True}

    def mla_backward(self, q, k, v, qv, fwd, dout, idx, causal=False, **kw):
        t = [x.float().detach().requires_grad_(True) for x in (q, k, v, qv)]
        o, _ = torch_mla(*t, idx, causal)
        o.backward(dout.float())

        class R:
            dq, dk, dv, dqv = (x.grad.to(q.dtype) for x in t)
        return R, {"stand_in": True}

    def fp8_forward(self, q, k, v, qd, kd, vd, causal):
        o, lse = torch_descaled(q, k, v, qd, kd, vd, causal, "float32")
        import torch
        return o.to(torch.bfloat16), lse, {"stand_in": True}


def torch_mla(q, k, v, qv, idx, causal, p_dtype=None):
    """softmax(scale (q k^T + qv v^T)) v over the visible keys (gather: the valid slots, -1 and
    past the causal limit empty), in the dtype of the inputs; ``p_dtype`` rounds P first
    (upstream's attention_ref does). Returns O (b, s, h, dv) and LSE (b, s, h)."""
    import torch
    b, s, h, d = q.shape
    sk, dv = v.shape[1], v.shape[-1]
    scale = 1.0 / math.sqrt(d + dv)
    x = scale * (torch.einsum("bshd,bkd->bhsk", q, k[:, :, 0]) + torch.einsum("bshd,bkd->bhsk", qv, v[:, :, 0]))
    rows = torch.arange(s)[:, None]
    lim = (rows + 1 + sk - s) if causal else torch.full((s, 1), sk)
    if idx is None:
        keep = (torch.arange(sk)[None, :] < lim)[None, None].expand(b, h, s, sk)
        vals = v[:, :, 0]
        keys = None
    else:
        ii = idx.long().cpu()
        valid = (ii >= 0) & (ii < lim[None])                                  # (b, s, topk)
        gi = ii.clamp(0, sk - 1)
        x = torch.gather(x, 3, gi[:, None].expand(b, h, s, ii.shape[-1]).to(x.device))
        keep = valid[:, None].expand(b, h, s, ii.shape[-1])
        keys = gi
    x = x.masked_fill(~keep.to(x.device), float("-inf"))
    lse = torch.logsumexp(x, -1)
    p = torch.softmax(x, -1).nan_to_num(0.0)
    if p_dtype is not None:
        p = p.to(p_dtype).to(x.dtype)
    if keys is None:
        o = torch.einsum("bhsk,bkd->bshd", p, vals)
    else:
        vv = v[:, :, 0][torch.arange(b)[:, None, None], keys.to(v.device)]   # (b, s, topk, dv)
        o = torch.einsum("bhst,bstd->bshd", p, vv)
    return o, lse.transpose(1, 2)


def torch_descaled(q, k, v, qd, kd, vd, causal, dtype, p_dtype=None):
    import torch
    dt = getattr(torch, dtype)
    b, s, h, d = q.shape
    hk, sk = k.shape[2], k.shape[1]
    g = h // hk
    qq = q.to(dt) * qd.to(dt).repeat_interleave(g, 1)[:, None, :, None]
    kk = (k.to(dt) * kd.to(dt)[:, None, :, None]).repeat_interleave(g, 2)
    vv = (v.to(dt) * vd.to(dt)[:, None, :, None]).repeat_interleave(g, 2)
    x = torch.einsum("bshd,bkhd->bhsk", qq, kk) / math.sqrt(d)
    if causal:
        keep = torch.arange(sk)[None, :] <= torch.arange(s)[:, None] + (sk - s)
        x = x.masked_fill(~keep.to(x.device), float("-inf"))
    lse = torch.logsumexp(x, -1)
    p = torch.softmax(x, -1)
    if p_dtype is not None:
        p = p.to(p_dtype).to(dt)
    return torch.einsum("bhsk,bkhd->bshd", p, vv), lse


def _np(t) -> np.ndarray:
    return t.detach().float().cpu().numpy().astype(np.float64)


def _err(got: np.ndarray, ref: np.ndarray, bound: np.ndarray, base: np.ndarray) -> dict[str, Any]:
    fin = np.isfinite(ref)
    e = float(np.abs(got[fin] - ref[fin]).max(initial=0.0))
    be = float(np.abs(base[fin] - ref[fin]).max(initial=0.0))
    scale = float(np.abs(ref[fin]).max(initial=0.0)) or 1.0
    return {"max_abs_err": e, "rel_to_max_ref": e / scale, "ref_err": be, "oracle_bound_max": float(bound[fin].max(initial=0.0)),
            "nonfinite_where_ref_finite": int((~np.isfinite(got[fin])).sum()),
            "fa_rule_ok": bool(e <= 2 * be + 1e-5)}


def _inputs(b, s, sk, h, small, seed):
    import torch
    gen = torch.Generator().manual_seed(seed)
    bf = torch.bfloat16
    q = torch.randn(b, s, h, 64, generator=gen).to(bf)
    qv = torch.randn(b, s, h, 512, generator=gen).to(bf)
    k = torch.randn(b, sk, 1, 64, generator=gen).to(bf)
    v = torch.randn(b, sk, 1, 512, generator=gen).to(bf)
    return q, k, v, qv


def _indices(b, s, sk, topk, seed):
    import torch
    rng = np.random.default_rng(seed)
    idx = np.stack([np.stack([rng.permutation(sk)[:topk] for _ in range(s)]) for _ in range(b)])
    idx[..., -7:] = -1                                   # sentinels
    return torch.from_numpy(idx.astype(np.int32))


def section_mla_fwd(K, small: bool) -> dict[str, Any]:
    import torch
    from fa4verify.oracles import mla
    b, s, sk, h = (1, 8, 32, 2) if small else (2, 128, 1024, 16)
    q, k, v, qv = _inputs(b, s, sk, h, small, 0)
    rows = []
    for causal in (False, True):
        r, cfg = K.mla_forward(*(t.to(K.device) for t in (q, k, v, qv)), causal=causal)
        ref = mla.forward(q, k, v, qv, causal=causal)
        base_o, base_l = torch_mla(q.float(), k.float(), v.float(), qv.float(), None, causal, torch.bfloat16)
        rows.append({"causal": causal, "out": _err(_np(r.out), ref.out, ref.bound, _np(base_o.to(torch.bfloat16))),
                     "lse": _err(_np(r.lse), ref.lse, ref.lse_bound, _np(base_l)), "config": cfg})
    return _summary(rows, {"batch": b, "seqlen_q": s, "seqlen_k": sk, "nheads": h, "head_dim": 64, "head_dim_v": 512})


def section_gather_fwd(K, small: bool) -> dict[str, Any]:
    import torch
    from fa4verify.oracles import mla
    b, s, sk, h, topk = (1, 8, 64, 2, 16) if small else (1, 128, 1024, 128, 256)
    q, k, v, qv = _inputs(b, s, sk, h, small, 1)
    idx = _indices(b, s, sk, topk, 1)
    rows = []
    for causal in (False, True):
        r, cfg = K.mla_forward(*(t.to(K.device) for t in (q, k, v, qv)), gather_kv_indices=idx.to(K.device),
                               causal=causal)
        ref = mla.forward(q, k, v, qv, gather_kv_indices=idx, causal=causal)
        base_o, base_l = torch_mla(q.float(), k.float(), v.float(), qv.float(), idx, causal, torch.bfloat16)
        rows.append({"causal": causal, "out": _err(_np(r.out), ref.out, ref.bound, _np(base_o.to(torch.bfloat16))),
                     "lse": _err(_np(r.lse), ref.lse, ref.lse_bound, _np(base_l)), "config": cfg})
    return _summary(rows, {"batch": b, "seqlen_q": s, "seqlen_k": sk, "nheads": h, "topk": topk})


def section_gather_bwd(K, small: bool) -> dict[str, Any]:
    import torch
    from fa4verify.oracles import mla
    b, s, sk, topk = (1, 8, 64, 16) if small else (1, 128, 1024, 256)
    rows = []
    for h, rp in (((2, False), (2, True)) if small else ((128, False), (64, True))):
        q, k, v, qv = _inputs(b, s, sk, h, small, 2 + h)
        idx = _indices(b, s, sk, topk, 2)
        gen = torch.Generator().manual_seed(9)
        do = torch.randn(b, s, h, 512, generator=gen).to(torch.bfloat16)
        dev = [t.to(K.device) for t in (q, k, v, qv)]
        f, _ = K.mla_forward(*dev, gather_kv_indices=idx.to(K.device), for_backward=True, gather_bwd_recompute_p=rp)
        r, cfg = K.mla_backward(*dev, f, do.to(K.device), idx.to(K.device), recompute_p=rp)
        ref = mla.backward(q, k, v, qv, None, do, gather_kv_indices=idx)     # exact O in D
        t = [x.float().detach().requires_grad_(True) for x in (q, k, v, qv)]
        o, _ = torch_mla(*t, idx, False, torch.bfloat16)
        o.backward(do.float())
        base = {n: _np(x.grad.to(torch.bfloat16)) for n, x in zip(("dq", "dk", "dv", "dqv"), t)}
        row = {"nheads": h, "recompute_p": rp, "config": cfg}
        for n in ("dq", "dk", "dv", "dqv"):
            row[n] = _err(_np(getattr(r, n)), getattr(ref, n), getattr(ref, f"{n}_bound"), base[n])
        rows.append(row)
    return _summary(rows, {"batch": b, "seqlen_q": s, "seqlen_k": sk, "topk": topk}, names=("dq", "dk", "dv", "dqv"))


def section_fp8_fwd(K, small: bool) -> dict[str, Any]:
    import torch
    from fa4verify.oracles import attention, descale
    b, s, sk, h, hk, d = (1, 16, 32, 2, 1, 64) if small else (2, 256, 1024, 4, 2, 128)
    gen = torch.Generator().manual_seed(3)
    e4 = torch.float8_e4m3fn
    q, k, v = ((torch.randn(b, n, hh, d, generator=gen) * 2).to(e4) for n, hh in ((s, h), (sk, hk), (sk, hk)))
    qd, kd, vd = (torch.rand(b, hk, generator=gen) * 2 + 0.05 for _ in range(3))
    out, lse, cfg = K.fp8_forward(*(t.to(K.device) for t in (q, k, v, qd, kd, vd)), True)
    dd = descale.descaled(q.float().numpy().astype(np.float64), k.float().numpy().astype(np.float64),
                          v.float().numpy().astype(np.float64), q_descale=qd.numpy(), k_descale=kd.numpy(),
                          v_descale=vd.numpy())
    ref = attention.forward(dd["q"], dd["k"], dd["v"], causal=True)
    bo, bl = torch_descaled(q, k, v, qd, kd, vd, True, "float32", torch.bfloat16)
    row = {"causal": True, "out": _err(_np(out), ref.out, ref.bound, _np(bo.to(torch.bfloat16))),
           "lse": _err(_np(lse), ref.lse, ref.lse_bound, _np(bl)), "config": cfg}
    return _summary([row], {"batch": b, "seqlen_q": s, "seqlen_k": sk, "nheads": h, "nheads_kv": hk, "head_dim": d})


def _summary(rows, shape, names=("out", "lse")) -> dict[str, Any]:
    return {"shape": shape, "rows": rows,
            "max_rel_err": max(r[n]["rel_to_max_ref"] for r in rows for n in names),
            "fa_rule_ok": all(r[n]["fa_rule_ok"] for r in rows for n in names),
            "nonfinite": sum(r[n]["nonfinite_where_ref_finite"] for r in rows for n in names)}


SECTIONS = {"mla_fwd": section_mla_fwd, "gather_fwd": section_gather_fwd, "gather_bwd": section_gather_bwd,
            "fp8_fwd": section_fp8_fwd}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--section", choices=sorted(SECTIONS) + ["all"], default="all")
    ap.add_argument("--json", required=True)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ns = ap.parse_args(argv)
    K = Fa4() if ns.device == "cuda" else CpuStandIn()
    out: dict[str, Any] = {"where": K.where, "versions": K.versions, "results": {}, "crashes": {},
                           "command": "python scripts/b200_features.py " + " ".join(argv or sys.argv[1:])}
    rc = 0
    for name in (SECTIONS if ns.section == "all" else [ns.section]):
        t0 = time.time()
        try:
            out["results"][name] = SECTIONS[name](K, small=ns.device == "cpu")
            out["results"][name]["seconds"] = time.time() - t0
        except Exception as e:  # noqa: BLE001 - recorded, nonzero exit
            out["crashes"][name] = {"error": f"{type(e).__name__}: {e}"[:1500], "traceback": traceback.format_exc()[-3000:]}
            rc = 3
        r = out["results"].get(name, {})
        print(f"[{name}] {K.where}: " + (out["crashes"].get(name, {}).get("error", "")[:200] or json.dumps(
            {k: r.get(k) for k in ("max_rel_err", "fa_rule_ok", "nonfinite")})), flush=True)
    with open(ns.json, "w") as f:
        json.dump(out, f, indent=1, default=str)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
