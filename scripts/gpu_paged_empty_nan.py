#!/usr/bin/env python3
"""Reproducer of the paged-KV finding (issue #16, measured on the H200 in session 4):

FA4 4.0.0b36 SM90 forward with ``page_table`` at page_size 128 (the TMA paged path for hd 128)
and ``seqused_k[b] = 0`` returns NaN in O for that sequence when the pages its table row points
at hold NaN (pages no token uses: stale / uninitialised KV-cache memory), while its LSE is -inf
as it should be. With page_size 16 (the cp.async path), or with the unused pages zero-filled, O
of the empty sequence is 0. Every other sequence is unaffected.

Prints, per (page_size, unused-page fill): NaN count in O per sequence and O's max |value| of the
empty sequence; writes --json. Usage: python3 scripts/gpu_paged_empty_nan.py [--json F]
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    import torch
    from fa4verify.kernels import adapter
    from fa4verify.oracles.paged_kv import paginate
    b, sq, h, hk, d, sk = 3, 128, 4, 2, 128, 1000
    used = np.array([sk, sk // 3, 0], np.int32)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, s, n, d, generator=g).to(torch.bfloat16)
               for s, n in ((sq, h), (sk, hk), (sk, hk)))
    rows = []
    for P in (128, 16):
        for fill in ("nan", "zero"):
            kp, vp, table = paginate(k.float().numpy(), v.float().numpy(), P, seqused_k=used,
                                     spare_pages=2, unused_fill=np.nan if fill == "nan" else 0.0)
            r = adapter.forward(q.cuda(), torch.from_numpy(kp).to("cuda", torch.bfloat16),
                                torch.from_numpy(vp).to("cuda", torch.bfloat16),
                                page_table=torch.from_numpy(table).cuda(),
                                seqused_k=torch.from_numpy(used).cuda())
            out = r.out.float().cpu()
            lse = r.lse.float().cpu()
            row = {"page_size": P, "unused_fill": fill,
                   "nan_in_out_per_seq": [int(torch.isnan(out[i]).sum()) for i in range(b)],
                   "empty_seq_out_max_abs": float(out[2].nan_to_num(nan=float("inf")).abs().max()),
                   "empty_seq_lse_all_neg_inf": bool(torch.isneginf(lse[2]).all())}
            rows.append(row)
            print(row)
    gpu = torch.cuda.get_device_name()
    doc = {"where": f"measured on {gpu}", "shape": [b, sq, h, hk, d, sk], "seqused_k": used.tolist(),
           "rows": rows}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
