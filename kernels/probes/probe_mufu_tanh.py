"""Probe: FA4's hardware tanh, ``cute.math.tanh(x, fastmath=True)`` (PTX ``tanh.approx.f32``).

FA4 stage: the softcap's tanh, forward and backward (flash_attn/cute/utils.py
``create_softcap_scoremod`` / ``create_softcap_scoremod_bwd``: ``softcap * tanh(x / softcap)``
and ``1 - tanh(x / softcap)^2``, ``fastmath=True``).

Output: fp32, one per input. :func:`sweep` runs it over every fp32 bit pattern and reduces the
error against float64 ``tanh`` on the GPU (Note [MUFU tanh envelope]).

Note [MUFU tanh envelope]
-------------------------
PTX documents ``tanh.approx.f32`` only as "maximum relative error 2^-10.987" (``tanh_rel``). Where
a softcap saturates (``|x / softcap|`` of a few units and more) the backward's factor
``f = 1 - th^2`` is tiny, and a relative error of ``th`` is an absolute error ``2 tanh_rel`` of f:
it swamps the exact factor, and the backward interval bound admits a zero gradient there
(DERIVATIONS.md#backward-interval, Note [A bound without power]). How the MUFU rounds near 1 is
a fact of the GPU, measured here exhaustively: per binade of ``|x|`` the largest absolute and
relative error against float64 tanh, the signed extremes, whether ``|th| <= 1`` holds, and the
saturation point ``sat``: the smallest fp32 ``a`` with ``th(x) == +-1`` exactly for every fp32
``|x| >= a``. The budgets of an arch where it was measured carry it as reviewed data
(``tanh_sat``, ``tanh_abs1``: the largest absolute error at ``|x| >= 1``); the audit's check
``mufu.tanh`` re-measures it on the GPU it runs on and fails when the GPU is outside them.
"""
from __future__ import annotations

import math

import cutlass.cute as cute

from fa4verify.kernels.probes.probe_base import BLOCK, ChunkRunner, compile_only_here

STAGE = "softcap tanh (MUFU.TANH), flash_attn/cute/utils.py create_softcap_scoremod(_bwd)"
MIRRORS = "flash_attn/cute/utils.py::create_softcap_scoremod_bwd (cute.math.tanh fastmath)"
ARCHS = ("sm_90a", "sm_100a")
VARIANTS = ("fastmath",)
IN_DTYPES = ("f32",)
OUT_SPECS = (("f32", 1),)


@cute.kernel
def _kernel(gX: cute.Tensor, gY: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    bdim, _, _ = cute.arch.block_dim()
    i = bidx * bdim + tidx
    gY[i] = cute.math.tanh(gX[i], fastmath=True)


@cute.jit
def launch(mX: cute.Tensor, mY: cute.Tensor):
    n = cute.size(mX)
    _kernel(mX, mY).launch(grid=[n // BLOCK, 1, 1], block=[BLOCK, 1, 1])


_RUNNER = ChunkRunner(launch, OUT_SPECS)


def run(x, variant: str = "fastmath"):
    """GPU: ``tanh.approx(x)`` over a CUDA float32 tensor."""
    return _RUNNER([x])[0]


def compile_only(variant: str = "fastmath", n: int = 4 * BLOCK):
    return compile_only_here(launch, IN_DTYPES, OUT_SPECS, n=n)


#: one binade of fp32 bit patterns (2^23): the sweep's unit of work and of its per-binade figures
BINADE = 1 << 23


def sweep(progress=None, *, fn=None, device: str = "cuda", exponents=range(256)) -> dict:
    """Every fp32 bit pattern through :func:`run` on the current CUDA device (NaN inputs left out),
    one binade of ``|x|`` (and its negation) at a time: the envelope of Note [MUFU tanh envelope]
    as a JSON-able dict. ``progress(done, total)`` is called after each binade (256 of them).
    ``fn``, ``device``, ``exponents``: another function, device and exponent fields (tests)."""
    import struct

    import torch
    dev = torch.device(device)
    fn = run if fn is None else fn
    exponents = list(exponents)
    rows = []
    over_one = nonfinite = odd_violations = 0
    last_unsat = -1              # the largest |x| bit pattern whose output is not exactly +-1
    for e in exponents:          # exponent field: 0 = zero and subnormals, 255 = inf and NaN
        bits = torch.arange(e * BINADE, (e + 1) * BINADE, dtype=torch.int32, device=dev)
        x = bits.view(torch.float32)
        ok = ~torch.isnan(x)
        if not bool(ok.any()):
            continue
        x = x[ok]
        y, yn = fn(x), fn(-x)
        t = torch.tanh(x.double())
        err = torch.cat([y.double() - t, yn.double() + t])
        tt = torch.cat([t, -t])
        rel = torch.where(tt != 0, (err / tt).abs(), torch.where(err != 0, torch.inf, 0.0))
        both = torch.cat([y, -yn])
        over_one += int((both.abs() > 1).sum())
        nonfinite += int((~torch.isfinite(both)).sum())
        odd_violations += int((yn != -y).sum())
        unsat = torch.nonzero((y != 1.0) | (yn != -1.0))
        if unsat.numel():
            last_unsat = int(bits[ok][unsat[-1, 0]])
        lo = 0.0 if e == 0 else (math.inf if e == 255 else math.ldexp(1.0, e - 127))
        rows.append({"bin": e, "abs_lo": lo, "inputs": int(err.numel()), "max_abs": float(err.abs().max()),
                     "max_rel": float(rel.max()), "min_signed": float(err.min()),
                     "max_signed": float(err.max())})
        if progress is not None:
            progress(len(rows), len(exponents))
    # sat: the fp32 just above the largest magnitude whose output is not exactly +-1
    sat = struct.unpack("<f", struct.pack("<I", last_unsat + 1))[0] if last_unsat >= 0 else 0.0
    # the figures the budgets carry: over the normal binades (FA4's arguments are normal or 0;
    # subnormal inputs flush), the largest relative error; from |x| >= 1 on, the largest absolute
    normal = [r for r in rows if 0 < r["bin"] < 255]
    return {"inputs": sum(r["inputs"] for r in rows), "sat": sat, "over_one": over_one,
            "nonfinite": nonfinite, "odd_violations": odd_violations,
            "max_rel_normal": max((r["max_rel"] for r in normal), default=0.0),
            "max_abs_from_1": max((r["max_abs"] for r in rows if r["abs_lo"] >= 1.0), default=0.0),
            "bins": rows}
