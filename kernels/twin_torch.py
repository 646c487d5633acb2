"""Device twin: :func:`fa4verify.kernels.twin.ex2_emulation` re-expressed in torch ops, so the
bit-exact model of FA4's exp2 emulation runs on the GPU next to FA4's own device function.

Note [Device twin of the exp2 emulation]
----------------------------------------
The CPU twin follows the PTX sequence of ``ex2_emulation`` / ``ex2_emulation_2`` (Note [exp2
emulation] in ``kernels/twin.py``). torch has no ``add.rm`` and no fused fp32 FMA that is
guaranteed fused, so each step is rewritten with operations that torch performs exactly (the same
on CPU and CUDA: IEEE fp32/fp64 add/sub/mul round to nearest even, float64 -> float32 casts round
to nearest even, integer ops wrap):

* ``xc = max.f32(x, -127)``: ``where(isnan(x) | (x < -127), -127, x)`` (PTX ``max`` ignores a
  NaN operand, quiet or signalling; ``torch.fmax`` on the CPU returns a signalling NaN);
  ``scalar`` flushes a subnormal ``xc`` to a signed zero for the ``add.rm.ftz`` only.
* ``xr = add.rm(xc, 1.5*2^23)``, ``xrb = xr - 1.5*2^23``: for ``-127 <= xc < 2^22`` the exact sum
  lies in [2^23, 2^24) where the fp32 spacing is 1, so rounding down gives ``C + floor(xc)``:
  ``xrb = floor(xc)`` and ``bits(xr) << 23 = floor(xc) << 23 (mod 2^32)`` (the low 9 bits of
  ``bits(C)`` are 0).
* ``f = sub.rn(xc, xrb)``: one fp32 subtraction.
* ``fma.rn.f32(q, f, c)``: ``q*f`` is exact in float64 (24 + 24 bits); ``s = RN64(q*f + c)`` and
  its exact error ``e`` (TwoSum) give the round-to-odd sum (step ``s`` one unit toward zero when
  ``e`` points the other way, then set the last bit when ``e != 0``); rounding that to fp32 is
  the correctly rounded FMA (53 >= 24 + 2 bits: Note [Round to odd] in ``binary32``).
* ``out = bits(xr << 23) + bits(q)``: int64 arithmetic modulo 2^32.

Domain: finite ``x < 2^22``, ``-inf`` and NaN (every input FA4 can produce, and every input the
device sweep generates). For ``x >= 2^22`` and ``+inf`` the rewrite of ``add.rm`` no longer holds
and the function raises. Bit-exactness against the CPU twin is tested on CPU tensors
(``tests/test_exp2_device.py``) over every class of input and a large random sample.
"""
from __future__ import annotations

from typing import Literal

__all__ = ["ex2_emulation_torch", "DOMAIN_HI"]

#: Inputs must lie below this (see the Note).
DOMAIN_HI = 2.0**22

Variant = Literal["packed", "scalar"]


def _fma_rn_f32(q64, f64, c: float):
    """Correctly rounded fp32 ``fma(q, f, c)`` from exact float64 ``q``, ``f`` (fp32 values)."""
    import torch
    p = q64 * f64                                 # exact
    s = p + c
    bb = s - p                                    # TwoSum: e = (p - (s - bb)) + (c - bb)
    e = (p - (s - bb)) + (c - bb)
    bits = s.view(torch.int64)
    toward_zero = (e != 0) & ((e < 0) != (s < 0))
    bits = (bits - toward_zero.to(torch.int64)) | (e != 0).to(torch.int64)
    return bits.view(torch.float64).to(torch.float32)


def ex2_emulation_torch(x, degree: int = 3, variant: Variant = "packed", *, check_domain: bool = True):
    """FA4's polynomial ``2^x`` on a float32 torch tensor (any device), bit-exact to
    ``twin.ex2_emulation(x, degree, variant)`` on the domain of the Note. Returns float32.

    ``check_domain=False`` skips the domain check (one reduction) where the caller generated
    the inputs itself."""
    import torch
    from fa4verify.kernels.twin import poly_coeffs_f32
    if variant not in ("packed", "scalar"):
        raise ValueError(f"unknown variant {variant!r}; expected 'packed' or 'scalar'")
    if x.dtype != torch.float32:
        raise TypeError("ex2_emulation_torch expects a float32 tensor")
    cs = [float(c) for c in poly_coeffs_f32(degree)]
    if check_domain and bool((x >= DOMAIN_HI).any()):
        raise ValueError(f"ex2_emulation_torch: inputs >= 2^22 (or +inf) are outside its domain")
    # max.f32 ignores every NaN operand; torch.fmax does not ignore signalling NaNs on the CPU
    xc = torch.where(torch.isnan(x) | (x < -127.0), torch.tensor(-127.0, dtype=torch.float32, device=x.device), x)
    xa = xc
    if variant == "scalar":                       # add.rm.ftz: a subnormal operand reads as +-0
        xa = torch.where(xc.abs() < 2.0**-126, xc * 0.0, xc)
    n = torch.floor(xa)                           # = add.rm(xa, C) - C on the domain
    f = xc - n                                    # sub.rn.f32 (the UNflushed xc, as the kernel)
    f64 = f.to(torch.float64)
    q = torch.full_like(f, cs[-1])
    for c in cs[-2::-1]:
        q = _fma_rn_f32(q.to(torch.float64), f64, c)
    qb = q.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    ob = ((n.to(torch.int64) << 23) + qb) & 0xFFFFFFFF
    ob = torch.where(ob >= 2**31, ob - 2**32, ob)
    return ob.to(torch.int32).view(torch.float32)
