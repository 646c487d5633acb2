#!/usr/bin/env python3
"""Production FA4 figures on a CUDA GPU (run on the lent H200); prints and writes JSON.

Figures (bf16, ``torch.manual_seed(0)``, q, k, v, dout = ``torch.randn`` in that order):

1. forward max|out - ref64| at (2, 1024, 8, 128), non-causal and causal, next to the
   "PyTorch-in-bf16" reference of FA4's own tests (``attention_ref(upcast=False,
   reorder_ops=True)``), both against a float64 reference from the same bf16 inputs;
2. LSE max|lse - lse64| for the same calls;
3. default-mode backward: number of elements of dQ / dK / dV that differ bitwise from the first
   of ``--repeats`` runs (FA4 reduces dQ with fp32 atomics in arbitrary order);
4. ``deterministic=True``: are dQ / dK / dV bitwise identical over ``--repeats`` runs;
5. forward throughput at (4, 8192, 16, 128) bf16, FA4 vs torch SDPA with the cuDNN backend
   (and the flash backend), non-causal and causal, TFLOP/s = 4*b*h*s^2*d / t (halved causal),
   CUDA-event timing, median of ``--iters`` after warm-up.

Every figure is labelled "measured on <GPU>" and the JSON carries the versions and each FA4
call's configuration record. Usage::

    python3 benchmarks/gpu_production_figures.py [--json F] [--repeats 5] [--iters 20]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _inputs(shape, seed=0, dtype=None, dout=False):
    import torch
    torch.manual_seed(seed)
    dtype = dtype or torch.bfloat16
    q = torch.randn(*shape, device="cuda", dtype=dtype)
    k = torch.randn(*shape, device="cuda", dtype=dtype)
    v = torch.randn(*shape, device="cuda", dtype=dtype)
    do = torch.randn(*shape, device="cuda", dtype=dtype) if dout else None
    return q, k, v, do


def accuracy(causal: bool) -> dict:
    import torch
    from gpu_reference import reference
    from fa4verify.kernels import adapter
    q, k, v, _ = _inputs((2, 1024, 8, 128))
    f = adapter.forward(q, k, v, causal=causal, return_lse=True)
    ref = reference(q, k, v, causal=causal)
    out_pt = adapter.upstream_reference(q, k, v, causal=causal, upcast=False, reorder_ops=True)
    out_ref32 = adapter.upstream_reference(q, k, v, causal=causal, upcast=True, reorder_ops=False)
    err = (f.out.double() - ref.out).abs()
    variants = {}
    try:   # other readings of "PyTorch in bf16", to compare with figures quoted elsewhere
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        variants["attention_ref(upcast=False, reorder_ops=False)"] = float(
            (adapter.upstream_reference(q, k, v, causal=causal, upcast=False, reorder_ops=False).double()
             - ref.out).abs().max())
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        for name, be in (("sdpa_math_bf16", SDPBackend.MATH), ("sdpa_flash_bf16", SDPBackend.FLASH_ATTENTION),
                         ("sdpa_cudnn_bf16", SDPBackend.CUDNN_ATTENTION)):
            with sdpa_kernel(be):
                o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)
            variants[name] = float((o.double() - ref.out).abs().max())
        sc = 1.0 / math.sqrt(q.shape[-1])
        s_ = torch.einsum("bqhd,bkhd->bhqk", q, k) * sc                      # bf16 GEMM, bf16 scale
        if causal:
            s_ = s_.masked_fill(torch.ones(s_.shape[-2:], dtype=torch.bool, device="cuda").triu(1), float("-inf"))
        p_ = torch.softmax(s_, dim=-1)                                        # bf16 out
        variants["naive_bf16(qk*scale, softmax, pv)"] = float(
            (torch.einsum("bhqk,bkhd->bqhd", p_, v).double() - ref.out).abs().max())
    except Exception as e:  # pragma: no cover - record, do not fail the figures
        variants["error"] = f"{type(e).__name__}: {e}"
    return {
        "pytorch_bf16_variants_max_abs_err": variants,
        "shape": [2, 1024, 8, 128], "causal": causal,
        "fa4_max_abs_err": float(err.max()),
        "fa4_mean_abs_err": float(err.mean()),
        "pytorch_bf16_max_abs_err": float((out_pt.double() - ref.out).abs().max()),
        "fp32_ref_rounded_to_bf16_max_abs_err": float((out_ref32.double() - ref.out).abs().max()),
        "lse_max_abs_err": float((f.lse.double() - ref.lse).abs().max()),
        "lse_max_rel_err": float(((f.lse.double() - ref.lse).abs() / ref.lse.abs()).max()),
        "config": f.config.to_dict(),
    }


def backward_repeatability(deterministic: bool, repeats: int, causal: bool = False) -> dict:
    import torch
    from fa4verify.kernels import adapter
    q, k, v, do = _inputs((2, 1024, 8, 128), dout=True)
    f = adapter.forward(q, k, v, causal=causal, return_lse=True)
    runs = []
    for _ in range(repeats):
        b = adapter.backward(q, k, v, f.out, do, f.lse, causal=causal, deterministic=deterministic)
        torch.cuda.synchronize()
        runs.append((b.dq.clone(), b.dk.clone(), b.dv.clone()))
    d = {"shape": [2, 1024, 8, 128], "causal": causal, "deterministic": deterministic,
         "repeats": repeats, "config": b.config.to_dict()}
    for i, name in enumerate(("dq", "dk", "dv")):
        diffs = [int((r[i].view(torch.int16) != runs[0][i].view(torch.int16)).sum()) for r in runs[1:]]
        d[f"{name}_elements_differing_from_run0"] = diffs
        d[f"{name}_bitwise_identical_all_runs"] = all(x == 0 for x in diffs)
        d[f"{name}_numel"] = int(runs[0][i].numel())
    return d


def _time(fn, iters: int, warmup: int = 3, rounds: int = 5) -> float:
    """Seconds per call: ``iters`` calls enqueued back to back between two CUDA events (so host
    overhead overlaps GPU work), median over ``rounds``."""
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) / 1e3 / iters)
    return statistics.median(ts)


def throughput(iters: int, causal: bool) -> dict:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from fa4verify.kernels import adapter
    b, s, h, d = 4, 8192, 16, 128
    q, k, v, _ = _inputs((b, s, h, d))
    flops = 4 * b * h * s * s * d / (2 if causal else 1)
    res = {"shape": [b, s, h, d], "causal": causal, "dtype": "bfloat16", "iters": iters}
    cfg = adapter.forward(q, k, v, causal=causal, return_lse=False).config
    t = _time(adapter.timing_callable(q, k, v, causal=causal), iters)
    res["fa4_seconds"] = t
    res["fa4_tflops"] = flops / t / 1e12
    t = _time(lambda: adapter.forward(q, k, v, causal=causal, return_lse=False), iters)
    res["fa4_via_adapter_record_seconds"] = t
    res["fa4_via_adapter_record_tflops"] = flops / t / 1e12
    res["fa4_config"] = cfg.to_dict()
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    for name, be in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel(be):
                fn = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)  # noqa: E731
                fn()
                t = _time(fn, iters)
            res[f"{name}_seconds"] = t
            res[f"{name}_tflops"] = flops / t / 1e12
        except Exception as e:  # backend unavailable on this build
            res[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write figures here")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--only", choices=["accuracy", "backward", "throughput"], action="append",
                    help="run only these parts (repeatable); default all")
    args = ap.parse_args(argv)
    import torch
    from fa4verify.kernels import adapter, golden
    ok, why = adapter.cuda_status()
    if not ok:
        print(f"no CUDA device: {why}", file=sys.stderr)
        return 2
    where = f"measured on {torch.cuda.get_device_name(0)}"
    t0 = time.time()
    out = {"where": where,
           "provenance": golden.provenance("python3 benchmarks/gpu_production_figures.py "
                                           + " ".join(argv if argv is not None else sys.argv[1:]),
                                           where=where),
           "timing_method": "CUDA events around --iters back-to-back calls, median of 5 rounds"}
    parts = set(args.only or ["accuracy", "backward", "throughput"])
    if "accuracy" in parts:
        out["forward_accuracy"] = [accuracy(False), accuracy(True)]
    for a in out.get("forward_accuracy", []):
        print(f"[{where}] fwd (2,1024,8,128) bf16 {'causal' if a['causal'] else 'non-causal'}: "
              f"FA4 max|err| {a['fa4_max_abs_err']:.4g}, PyTorch-bf16 {a['pytorch_bf16_max_abs_err']:.4g}, "
              f"LSE max|err| {a['lse_max_abs_err']:.3g}")
    if "backward" in parts:
        out["backward_default"] = [backward_repeatability(False, args.repeats),
                                   backward_repeatability(False, args.repeats, causal=True)]
        out["backward_deterministic"] = [backward_repeatability(True, args.repeats),
                                         backward_repeatability(True, args.repeats, causal=True)]
    for r in out.get("backward_default", []) + out.get("backward_deterministic", []):
        print(f"[{where}] bwd deterministic={r['deterministic']} causal={r['causal']}: elements differing "
              f"from run 0: dQ {r['dq_elements_differing_from_run0']}, dK {r['dk_elements_differing_from_run0']}, "
              f"dV {r['dv_elements_differing_from_run0']}")
    if "throughput" in parts:
        out["throughput"] = [throughput(args.iters, False), throughput(args.iters, True)]
    for r in out.get("throughput", []):
        print(f"[{where}] fwd (4,8192,16,128) bf16 {'causal' if r['causal'] else 'non-causal'}: "
              f"FA4 {r['fa4_tflops']:.0f} TFLOP/s (through adapter.forward with its record: "
              f"{r['fa4_via_adapter_record_tflops']:.0f}), SDPA cuDNN {r.get('sdpa_cudnn_tflops', float('nan')):.0f}, "
              f"SDPA flash {r.get('sdpa_flash_tflops', float('nan')):.0f}")
    out["seconds_total"] = round(time.time() - t0, 1)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
