"""Does FA4's backward preprocess write outside its own rows? (GPU; the prediction of
docs/results/h200/session15_6f502c4/README.md, edge ``tile_tail_128x128``.)

For each configuration: FA4's forward, then its backward (with a dLSE, deterministic) with the
preprocess's outputs (D = ``dpsum``, ``lse_log2``, ``dq_accum``) swapped for views at the start of
NaN-filled buffers ``GUARD`` elements longer; after the preprocess the guard tail must still be NaN
(a value there is a write past the buffer FA4 allocated) and the views are copied into FA4's own
buffers so the backward goes on unchanged. D is also compared with rowsum(dO * O) - dLSE (fp32, on
the GPU) for every used row, over ``--reps`` repetitions: a wrong D row that differs between
repetitions is a race between CTAs.

    python scripts/gpu_preprocess_guard.py --json OUT.json [--reps 20]
"""
from __future__ import annotations

import argparse
import json
import sys
import time

GUARD = 1024

#: (name, batch, seqlen_q, seqlen_k, nheads, hd, hdv)
CONFIGS = [
    ("edge_tile_tail_128x128", 1, 137, 184, 2, 128, 64),
    ("hd128_hdv64_b2_h3", 2, 137, 184, 3, 128, 64),
    ("hd128_hdv64_sq80", 1, 80, 184, 2, 128, 64),
    ("hd128_hdv64_sq160", 1, 160, 184, 2, 128, 64),
    ("hd128_hdv128", 1, 137, 184, 2, 128, 128),
    ("hd64_hdv64", 1, 137, 184, 2, 64, 64),
    ("hd96_hdv96", 1, 137, 184, 2, 96, 96),
    ("hd192_hdv128", 1, 137, 184, 2, 192, 128),
    ("hd256_hdv256", 1, 137, 184, 2, 256, 256),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    import torch
    from fa4verify.kernels import adapter
    iface = adapter.interface_module()
    orig = iface._bwd_preprocess
    seen: dict = {}

    def pre(out, dout, dpsum, lse, lse_log2, dq_accum, *a, **kw):
        swapped, views = {}, []
        for name, t in (("dpsum", dpsum), ("lse_log2", lse_log2), ("dq_accum", dq_accum)):
            if t is None or not t.is_contiguous():
                views.append(t)
                continue
            big = torch.full((t.numel() + GUARD,), float("nan"), dtype=t.dtype, device=t.device)
            v = big[: t.numel()].view(t.shape)
            swapped[name] = (big, t, v)
            views.append(v)
        orig(out, dout, views[0], lse, views[1], views[2], *a, **kw)
        torch.cuda.synchronize()
        for name, (big, t, v) in swapped.items():
            tail = big[t.numel():]
            hit = (~torch.isnan(tail)).nonzero().flatten()
            seen.setdefault("guard", {}).setdefault(name, []).append(
                {"n": int(t.numel()), "shape": list(t.shape), "written_past_end": int(hit.numel()),
                 "first": [int(i) for i in hit[:4]], "values": [float(tail[i]) for i in hit[:4]]})
            t.copy_(v)
        seen["dpsum"] = views[0].clone() if views[0] is not None else None
        return None

    if hasattr(orig, "compile_cache"):
        pre.compile_cache = orig.compile_cache
    rows = []
    torch.manual_seed(0)
    for name, b, sq, sk, h, hd, hdv in CONFIGS:
        row = {"config": name, "batch": b, "seqlen_q": sq, "seqlen_k": sk, "nheads": h, "hd": hd, "hdv": hdv}
        t0 = time.time()
        try:
            q = torch.randn(b, sq, h, hd, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(b, sk, h, hd, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(b, sk, h, hdv, device="cuda", dtype=torch.bfloat16)
            do = torch.randn(b, sq, h, hdv, device="cuda", dtype=torch.bfloat16)
            fwd = adapter.forward(q, k, v)
            dlse = torch.randn_like(fwd.lse)
            exact = (fwd.out.float() * do.float()).sum(-1).transpose(1, 2) - dlse  # (b, h, sq)
            past, wrong_rows, dq_first, dq_differs = {}, set(), None, 0
            iface._bwd_preprocess = pre
            try:
                for r in range(args.reps):
                    seen.clear()
                    res = adapter.backward(q, k, v, fwd.out, do, fwd.lse, dlse=dlse, deterministic=True)
                    torch.cuda.synchronize()
                    for nm, recs in seen.get("guard", {}).items():
                        for rec in recs:
                            if rec["written_past_end"]:
                                past.setdefault(nm, rec)
                    d = seen.get("dpsum")
                    if d is not None:
                        got = d[:, :, :sq]
                        bad = ((got - exact).abs() > 1e-3 * (1 + exact.abs())).nonzero()
                        wrong_rows |= {tuple(int(x) for x in idx) for idx in bad[:64]}
                    if dq_first is None:
                        dq_first = res.dq.clone()
                    elif not torch.equal(res.dq, dq_first):
                        dq_differs += 1
            finally:
                iface._bwd_preprocess = orig
            row.update(status="ok", written_past_end=past, d_wrong_rows=sorted(wrong_rows)[:32],
                       d_wrong_count=len(wrong_rows), dq_not_bitwise_in_reps=dq_differs, reps=args.reps)
        except Exception as e:  # report and go on: this is a probe of FA4, not a check
            row.update(status="error", error=f"{type(e).__name__}: {e}"[:300])
        row["seconds"] = round(time.time() - t0, 2)
        rows.append(row)
        print(json.dumps({k: row[k] for k in row if k not in ("d_wrong_rows",)}), flush=True)
    with open(args.json, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "guard": GUARD, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
