"""Standalone reproducer for upstream: FA4's SM90 backward returns a wrong dQ at some head dims.

Needs only torch and flash-attn-4 (4.0.0b36) on an SM90 GPU:  python repro_sm90_dq_small_hd.py

Expected with 4.0.0b36 (the same computation as fa4verify's scripts/gpu_hd_sweep.py, which was
measured on an H200 on 2026-11-30; this file itself was written after the device session and
has not been run as-is): dQ relative error ~1 at head dims 8, 16, 40, 48, 72, 80 when
seqlen_q > 64, ~2.4e-3 (like dK and dV) otherwise.  Cause: flash_bwd_sm90.py tiles the fp32 dQ
accumulator with the head dim rounded to 16 while interface.py / flash_bwd_postprocess.py
allocate and read it rounded to 32.
"""
import torch
from flash_attn.cute import flash_attn_func


def rel_err(head_dim: int, seqlen_q: int, seqlen_k: int = 128) -> tuple[float, float, float]:
    g = torch.Generator(device="cpu").manual_seed(0)
    mk = lambda s: torch.randn(1, s, 2, head_dim, generator=g).to("cuda", torch.bfloat16)  # noqa: E731
    q, k, v, do = mk(seqlen_q), mk(seqlen_k), mk(seqlen_k), mk(seqlen_q)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, _ = flash_attn_func(*leaves, deterministic=True, return_lse=True)
    out.backward(do)
    ref = [t.double().clone().requires_grad_(True) for t in (q, k, v)]
    s = torch.einsum("bqhd,bkhd->bhqk", ref[0], ref[1]) / head_dim ** 0.5
    torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), ref[2]).backward(do.double())
    return tuple(float((a.grad.double() - b.grad).norm() / b.grad.norm()) for a, b in zip(leaves, ref))


if __name__ == "__main__":
    print(torch.cuda.get_device_name(0))
    for hd in (8, 16, 24, 32, 40, 48, 64, 72, 80, 128):
        for sq in (64, 65, 256):
            dq, dk, dv = rel_err(hd, sq)
            flag = "  <-- wrong dQ" if dq > 0.05 else ""
            print(f"hd {hd:3d} seqlen_q {sq:3d}: rel err dQ {dq:.2e} dK {dk:.2e} dV {dv:.2e}{flag}")
