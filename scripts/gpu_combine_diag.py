"""Which call faults in the session-4 ``combine`` section (H200, FA4 4.0.0b36)?

Session 4's features run ended in "an illegal memory access" reported at a host-to-device copy
between the per-chunk FA4 forwards of the split-KV section (``scripts/gpu_features.py``), so
the faulting kernel is unknown (asynchronous report). This script runs each suspect alone, in
its own process (a fault poisons the CUDA context), synchronously (``CUDA_LAUNCH_BLOCKING=1``):

* ``fwd_full``    FA4 forward, the section's full problem (2 x 256 x 4 x 128, seqlen_k 2048);
* ``fwd_chunk``   FA4 forward on one key chunk of 683 / 682 / 256 keys (split 3 and 8);
* ``fwd_seq``     the section's exact sequence: full forward, then the three chunk forwards;
* ``combine_*``   ``flash_attn_combine`` alone on random partials in FA4's own test layout
  (LSE (S, b, h, s) transposed to (S, b, s, h)), fp32 / bf16 partials, S = 2, 3, 8, hd 64 / 128,
  compared with a float64 torch combine;
* ``combine_bf16/fp16_*``  16-bit partials (the public API allows fp16/bf16/fp32; FA4's own
  split-KV path always hands fp32): the fraction of wrong elements and rows, and which row
  residues mod 16 are wrong (root-cause hypothesis: the 128-bit O-partial copy covers
  num_threads / (k_block / (128 / width)) rows per pass, 16 for 16-bit partials at hd 128, while
  ``interface.py`` picks tile_m = 8 there from the head dim alone);
* ``section``     the features script's combine section itself.

    python3 scripts/gpu_combine_diag.py --json OUT.json [--only NAME ...]

Each case records ok / the error text and, for the combine cases, the max abs difference to the
float64 combine. Measured on the GPU this runs on (the JSON names it).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CASES = {
    "fwd_full": dict(kind="fwd", sk=2048),
    "fwd_chunk683": dict(kind="fwd", sk=683),
    "fwd_chunk682": dict(kind="fwd", sk=682),
    "fwd_chunk256": dict(kind="fwd", sk=256),
    "fwd_seq": dict(kind="seq", splits=3),
    "combine_fp32_s3_d128": dict(kind="combine", S=3, d=128, dt="float32"),
    "combine_fp32_s8_d128": dict(kind="combine", S=8, d=128, dt="float32"),
    "combine_fp32_s2_d64": dict(kind="combine", S=2, d=64, dt="float32"),
    "combine_bf16_s3_d128": dict(kind="combine", S=3, d=128, dt="bfloat16"),
    "combine_fp32_s3_d128_lsecontig": dict(kind="combine", S=3, d=128, dt="float32", contig=True),
    "combine_bf16_s2_d64": dict(kind="combine", S=2, d=64, dt="bfloat16"),
    "combine_fp16_s3_d128": dict(kind="combine", S=3, d=128, dt="float16"),
    "combine_fp16_s8_d64": dict(kind="combine", S=8, d=64, dt="float16"),
    "combine_bf16_s32_d128": dict(kind="combine", S=32, d=128, dt="bfloat16"),
    "combine_bf16_s3_d128_small": dict(kind="combine", S=3, d=128, dt="bfloat16", small=True),
    "section": dict(kind="section"),
}


def _child(name: str) -> dict:
    import torch
    spec = CASES[name]
    gen = torch.Generator().manual_seed(1)
    b, sq, h, d = (1, 16, 2, spec["d"]) if spec.get("small") else (2, 256, 4, spec.get("d", 128))
    dev = "cuda"
    t0 = time.time()
    if spec["kind"] in ("fwd", "seq"):
        from flash_attn.cute import flash_attn_func
        q = torch.randn(b, sq, h, d, generator=gen).to(torch.bfloat16).to(dev)
        sks = [spec["sk"]] if spec["kind"] == "fwd" else [2048, 683, 683, 682]
        for sk in sks:
            k = torch.randn(b, sk, h, d, generator=gen).to(torch.bfloat16).to(dev)
            v = torch.randn(b, sk, h, d, generator=gen).to(torch.bfloat16).to(dev)
            out, lse = flash_attn_func(q, k, v, return_lse=True)
            torch.cuda.synchronize()
            ref = torch.softmax(torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) * d ** -0.5, -1)
            o_ref = torch.einsum("bhqk,bkhd->bqhd", ref, v.double())
            err = float((out.double() - o_ref).abs().max())
        return {"ok": True, "max_abs_err_out": err, "seconds": time.time() - t0}
    if spec["kind"] == "combine":
        from flash_attn.cute.interface import flash_attn_combine
        S = spec["S"]
        dt = getattr(torch, spec["dt"])
        op = torch.randn(S, b, sq, h, d, generator=gen).to(dt).to(dev)
        if spec.get("contig"):
            lp = torch.randn(S, b, sq, h, generator=gen).to(dev)
        else:
            lp = torch.randn(S, b, h, sq, generator=gen).to(dev).transpose(-1, -2)
        out, lse = flash_attn_combine(op, lp, out_dtype=torch.bfloat16, return_lse=True)
        torch.cuda.synchronize()
        lpd = lp.double()
        lse_ref = torch.logsumexp(lpd, 0)
        w = torch.exp(lpd - lse_ref)                       # (S, b, sq, h)
        o_ref = (w[..., None] * op.double()).sum(0)
        err = (out.double() - o_ref).abs()
        bad = err > 0.05 * (1 + o_ref.abs())
        rows_bad = bad.any(-1)                                  # (b, sq, h)
        return {"ok": True, "max_abs_err_out": float(err.max()), "frac_elems_wrong": float(bad.double().mean()),
                "frac_rows_wrong": float(rows_bad.double().mean()),
                "wrong_rows_mod_16": sorted({int(i) % 16 for i in rows_bad.nonzero()[:, 1].tolist()})[:16],
                "max_abs_err_lse": float((lse.double() - lse_ref).abs().max()),
                "seconds": time.time() - t0}
    raise ValueError(spec["kind"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--child")
    ap.add_argument("--timeout", type=float, default=120)
    ns = ap.parse_args(argv)
    if ns.child:
        try:
            r = _child(ns.child)
        except Exception as e:  # noqa: BLE001 - the record is the point
            r = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:400]}"}
        print("RESULT " + json.dumps(r), flush=True)
        return 0
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    res = {"where": None, "cases": {}}
    try:
        import torch
        res["where"] = f"measured on {torch.cuda.get_device_name(0)}"
        res["torch"] = torch.__version__
    except Exception as e:  # noqa: BLE001
        res["where"] = f"no GPU ({e})"
    for name in ns.only or list(CASES):
        t = time.time()
        if CASES[name]["kind"] == "section":
            cmd = [sys.executable, "scripts/gpu_features.py", "--section", "combine", "--device", "cuda",
                   "--json", ns.json + ".section.json"]
        else:
            cmd = [sys.executable, __file__, "--json", ns.json, "--child", name]
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=ns.timeout)
            line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
            r = json.loads(line[-1][7:]) if line else {"ok": p.returncode == 0, "rc": p.returncode,
                                                       "tail": (p.stdout + p.stderr)[-800:]}
        except subprocess.TimeoutExpired:
            r = {"ok": False, "error": f"timeout {ns.timeout}s"}
        r["wall"] = round(time.time() - t, 1)
        res["cases"][name] = r
        print(f"{name:34s} {'ok ' if r.get('ok') else 'ERR'} {json.dumps(r)[:220]}", flush=True)
    with open(ns.json, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
