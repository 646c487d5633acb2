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

from fa4verify.kernels.probes.probe_base import BLOCK, DEFAULT_CHUNK, ChunkRunner, compile_only_here

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


#: binade bins of |x|: 0 holds zero and the subnormals, e + 127 the binade [2^e, 2^(e+1)) for
#: e = -126 .. 127, 255 the infinities
N_BINS = 256


def sweep(chunk: int = DEFAULT_CHUNK, progress=None) -> dict:
    """Every fp32 bit pattern through :func:`run` on the current CUDA device (NaN inputs left out):
    the envelope of Note [MUFU tanh envelope] as a JSON-able dict. ``progress(done, total)`` is
    called after each chunk. Takes seconds on an H200."""
    import torch
    dev = torch.device("cuda")
    nb = N_BINS
    max_abs = torch.zeros(nb, dtype=torch.float64, device=dev)
    max_rel = torch.zeros(nb, dtype=torch.float64, device=dev)
    lo_signed = torch.zeros(nb, dtype=torch.float64, device=dev)
    hi_signed = torch.zeros(nb, dtype=torch.float64, device=dev)
    count = torch.zeros(nb, dtype=torch.int64, device=dev)
    over_one = 0
    nonfinite = 0
    odd_violations = 0
    last_unsat = -1              # the largest positive bit pattern whose output is not exactly +1
    first_unsat_neg = -1         # the largest |pattern| of the negative side not exactly -1
    total = 1 << 32
    done = 0
    for start in range(0, total, chunk):
        bits = torch.arange(start, start + chunk, dtype=torch.int64, device=dev)
        bits32 = torch.where(bits >= (1 << 31), bits - (1 << 32), bits).to(torch.int32)
        x = bits32.view(torch.float32)
        y = run(x)
        ok = ~torch.isnan(x)
        xd, yd = x.double(), y.double()
        t = torch.tanh(xd)
        err = torch.where(ok, yd - t, torch.zeros_like(t))
        rel = torch.where(ok & (t != 0), (err / t).abs(), torch.where(ok & (err != 0), torch.inf, 0.0))
        expo = ((bits & 0x7FFFFFFF) >> 23).to(torch.int64)
        b = torch.where(expo == 255, torch.full_like(expo, 255), expo)
        b = torch.where(ok, b, torch.zeros_like(b))
        max_abs.scatter_reduce_(0, b, err.abs(), "amax")
        max_rel.scatter_reduce_(0, b, rel, "amax")
        lo_signed.scatter_reduce_(0, b, err, "amin")
        hi_signed.scatter_reduce_(0, b, err, "amax")
        count.scatter_add_(0, b, ok.to(torch.int64))
        over_one += int((ok & (yd.abs() > 1)).sum())
        nonfinite += int((ok & ~torch.isfinite(y)).sum())
        pos = ok & (bits < (1 << 31))
        neg = ok & (bits >= (1 << 31))
        up = torch.nonzero(pos & (y != 1.0))
        if up.numel():
            last_unsat = max(last_unsat, int(bits[up[-1, 0]]))
        dn = torch.nonzero(neg & (y != -1.0))
        if dn.numel():
            first_unsat_neg = max(first_unsat_neg, int(bits[dn[-1, 0]]) - (1 << 31))
        # tanh is odd: the MUFU's answer at -x against its answer at x, checked on the positive
        # half (the negative patterns are the positive ones with the sign bit set)
        if start < (1 << 31):
            yn = run((bits32 | torch.tensor(-(1 << 31), dtype=torch.int32, device=dev)).view(torch.float32))
            odd_violations += int((ok & (yn != -y)).sum())
        done += chunk
        if progress is not None:
            progress(done, total)

    def _f(bits: int) -> float:
        import struct
        return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]

    # sat: the fp32 just above the largest non-saturated magnitude on either side
    worst = max(last_unsat, first_unsat_neg)
    sat = _f(worst + 1) if worst >= 0 else 0.0
    rows = []
    for i in range(nb):
        n = int(count[i])
        if not n:
            continue
        lo = 0.0 if i == 0 else (math.inf if i == 255 else math.ldexp(1.0, i - 127))
        rows.append({"bin": i, "abs_lo": lo, "inputs": n, "max_abs": float(max_abs[i]),
                     "max_rel": float(max_rel[i]), "min_signed": float(lo_signed[i]),
                     "max_signed": float(hi_signed[i])})
    # the figures the budgets carry: over the normal binades (FA4's arguments are normal or 0;
    # subnormal inputs flush), the largest relative error; from |x| >= 1 on, the largest absolute
    normal = [r for r in rows if 0 < r["bin"] < 255]
    return {"inputs": int(count.sum()), "sat": sat, "over_one": over_one, "nonfinite": nonfinite,
            "odd_violations": odd_violations,
            "max_rel_normal": max(r["max_rel"] for r in normal),
            "max_abs_from_1": max(r["max_abs"] for r in rows if r["abs_lo"] >= 1.0),
            "bins": rows}
