"""Bit-exact CPU twin of FA4's polynomial exp2 emulation and of its column-selection rule.

``fa4verify.kernels.twin.exp2`` (re-exported by the package ``fa4verify.kernels.twin``, which is
what this module was before the twin became a package).

Note [exp2 emulation]
---------------------
FA4 (SM100/SM110 forward) computes part of ``P = 2^x`` with a polynomial on the FMA pipe instead
of the MUFU ``ex2.approx`` unit. ``ex2_emulation`` here reproduces, bit for bit, the two device
functions in ``flash_attn/cute/utils.py``:

``variant="packed"`` -- ``ex2_emulation_2`` (what the SM100 kernels run, via
``SoftmaxSm100.apply_exp2_convert``). With DSL 4.8.1 the sequence is::

    xc  = max.f32(x, -127.0)                      # cute.arch.fmax: NaN-quiet, no .ftz
    xr  = add.rm.f32x2(xc, 0x4B400000)            # C = 1.5*2^23; rnd="rm"; ftz=None -> no .ftz
    xrb = sub.rn.f32x2(xr, C)                     # exact
    f   = sub.rn.f32x2(xc, xrb)                   # f = xc - floor(xc), rounded (see below)
    q   = c_d; q = fma.rn.f32x2(q, f, c_i) for i = d-1 .. 0   # Horner, fused
    out = bits(shl.b32(bits(xr), 23) + bits(q))   # add.s32, wrapping

  ``calc_packed_f32x2_op`` (DSL ``cute/arch/nvvm_wrappers.py``) defaults to ``ftz=None``, which
  emits no ``ftz`` attribute, so the packed ops keep subnormals (the sm_100a PTX census in
  env_feasibility.md shows ``add.rm.f32x2`` / ``sub.rn.f32x2`` / ``fma.rn.f32x2``, no ``.ftz``).

``variant="scalar"`` -- ``ex2_emulation`` (not called by the kernels; the GPU probes record it).
The same sequence, except ``add.rm.ftz.f32`` (inline asm), then two Python-level ``-`` (emitted
as ``sub.f32`` = round-to-nearest) and Horner written as ``out * x + c``, which the compiler
contracts into ``fma.rn.f32``; the twin models these as fused FMAs (an unfused model disagrees
with the GPU on ~3.5% of inputs). Whether the ``sub``/``fma`` carry ``.ftz``
does not change any result: a subnormal operand only reaches them as ``f == x`` for a subnormal
``x``, where both choices give ``p(f)`` rounding to exactly 1.0.

Edge behaviour (both variants unless stated)
--------------------------------------------
* ``x`` an integer in [-126, 127]: exact ``2^x`` (p(0) = c0 = 1).
* ``x`` in [-2^-25, 0) (normal x): ``floor = -1`` and ``f = RN(1 + x) = 1.0`` (-2^-25 is a tie,
  rounded to the even 1.0), so the result is ``p(1)/2`` (0.99991482 for degree 3) instead of ~1.0.
* Negative subnormal ``x``: packed gives ``p(1)/2`` (as above); scalar flushes ``x`` to ``-0`` in
  ``add.rm.ftz``, so floor = 0 and the result is 1.0. The two variants differ only here. The H200
  golden vectors (scalar variant) show 1.0 on all 952 negative subnormals they contain
  (``tests/test_twin_ex2_golden_variants.py``); the packed no-ftz behaviour follows from the DSL
  defaults and the PTX census and has not been recorded on a GPU.
* ``x`` in (-127, -126): the exponent field becomes 0, so the bits of ``p(f)`` with exponent field
  0 give the subnormal ``(p(f) - 1) * 2^-126``, not ``2^x``.
* ``x <= -127``, ``-inf`` and NaN (``fmax`` ignores NaN): +0.0.
* ``x`` in [127, 128): still a correct (normal) result, exponent field 254.
* ``x >= 128``: garbage -- the exponent field reaches 255 and beyond, wrapping into the sign bit
  (infinities, NaNs, negative numbers); ``+inf`` gives NaN. FA4 assumes ``x <= 127``; its forward
  pass never exceeds ``max_offset + rescale_threshold = 8``.

Column selection (``emulated_columns``)
---------------------------------------
``SoftmaxSm100.apply_exp2_convert`` (``flash_attn/cute/softmax.py``) walks the thread's row of
``n_block_size`` scores in fragments of 32; pair ``(k, k+1)`` (k even) of fragment ``j`` uses the
MUFU when ``k % freq < freq - res or j >= frg_cnt - 1 or j < start_frg`` (res = 4, the default,
is never overridden by the callers) and the polynomial otherwise; ``freq == 0`` means all MUFU.
``freq`` and ``start_frg`` come from ``FlashAttentionForwardSm100.__init__``
(``flash_fwd_sm100.py``), which this module re-implements, reading the tables from
``load_params()``.
"""
from __future__ import annotations

from typing import Literal

import numpy as np

from fa4verify.oracles import binary32 as b32

__all__ = ["ex2_emulation", "ex2_emulation_parts", "emulated_columns", "uses_2cta",
           "emulation_settings", "EmulationSettings", "columns_from_settings", "ROUND_INT",
           "CLAMP_LO", "EX2_EMU_RES", "FRG_TILE", "Variant", "poly_coeffs_f32"]

#: ``fp32_round_int = float(2**23 + 2**22)`` in ``ex2_emulation`` (0x4B400000).
ROUND_INT = np.float32(2.0**23 + 2.0**22)
#: the clamp ``fmax(x, -127.0)``.
CLAMP_LO = np.float32(-127.0)
#: ``ex2_emu_res`` default of ``apply_exp2_convert`` (callers never pass it).
EX2_EMU_RES = 4
FRG_TILE = 32

Variant = Literal["packed", "scalar"]


def poly_coeffs_f32(degree: int) -> tuple[np.float32, ...]:
    """``POLY_EX2[degree]`` from the installed FA4 (``load_params()``) as exact float32 scalars."""
    from fa4verify.kernels.fa4_params import load_params
    poly = load_params().poly_ex2
    if degree not in poly:
        raise ValueError(f"unknown polynomial degree {degree!r}; FA4 has {sorted(poly)}")
    cs = tuple(np.float32(c) for c in poly[degree])
    for c, c64 in zip(cs, poly[degree]):
        if float(c) != c64:
            raise ValueError(f"POLY_EX2[{degree}] coefficient {c64!r} is not a binary32 number")
    return cs


def ex2_emulation_parts(x, degree: int = 3, variant: Variant = "packed"):
    """Intermediate values of the emulation: ``(x_clamped, x_rounded, frac, poly, out)``,
    each a float32 array of ``x``'s shape (``x_rounded`` holds floor(x) in its low mantissa bits).
    """
    if variant not in ("packed", "scalar"):
        raise ValueError(f"unknown variant {variant!r}; expected 'packed' or 'scalar'")
    cs = poly_coeffs_f32(degree)
    x = b32.as_f32(x)
    shape = x.shape
    x = np.ascontiguousarray(x).reshape(-1)
    xc = b32.fmax(x, CLAMP_LO)
    xr = b32.add(xc, ROUND_INT, "rm", flush=(variant == "scalar"))
    xrb = b32.sub(xr, ROUND_INT, "rn")
    frac = b32.sub(xc, xrb, "rn")
    q = np.full(frac.shape, cs[-1], dtype=np.float32)
    for c in cs[-2::-1]:
        q = b32.fma(q, frac, c, "rn")
    out = b32.from_bits(b32.add_i32(b32.shl_i32(b32.bits(xr), 23), b32.bits(q)))
    return tuple(a.reshape(shape) for a in (xc, xr, frac, q, out))


def ex2_emulation(x, degree: int = 3, variant: Variant = "packed") -> np.ndarray:
    """FA4's polynomial ``2^x`` (float32 in, float32 out), bit-exact to the GPU.

    ``variant="packed"`` is ``flash_attn.cute.utils.ex2_emulation_2`` (what SM100 kernels run),
    ``"scalar"`` is ``ex2_emulation``. ``degree`` selects ``POLY_EX2[degree]`` (FA4 uses 3).
    Accuracy for x in [-126, 127]: relative error = that of the polynomial on the rounded fraction
    (``fa4verify exp2`` certifies it; degree 3: max 8.77e-5). See Note [exp2 emulation] above for
    the edge cases (x < -126, tiny negatives, NaN, x > 127).
    """
    return ex2_emulation_parts(x, degree, variant)[-1]


# --------------------------------------------------------------------------- column rule
class EmulationSettings(tuple):
    """``(freq, res, start_frg)`` as ``apply_exp2_convert`` receives them."""
    __slots__ = ()

    def __new__(cls, freq: int, res: int, start_frg: int):
        return super().__new__(cls, (int(freq), int(res), int(start_frg)))

    freq = property(lambda s: s[0])
    res = property(lambda s: s[1])
    start_frg = property(lambda s: s[2])


def _pad16(d: int) -> int:
    return int(-(-int(d) // 16) * 16)


def uses_2cta(*, head_dim: int, head_dim_v: int | None = None, causal: bool = False,
              local: bool = False, varlen_q: bool = False, seqused_q: bool = False,
              split_kv: bool = False, block_sparse: bool = False, page_size: int | None = None,
              pack_gqa: bool = False, qhead_per_kvhead: int = 1, tile_m: int = 128,
              single_m_block: bool = False, hd256_decode_2cta: bool = False,
              hd256_varlen_ok: bool = True, disable_2cta: bool = False, arch: int = 100) -> bool:
    """Whether FA4's SM100 forward uses the 2-CTA kernel (``use_2cta_instrs`` in
    ``flash_attn/cute/interface.py``, ``_flash_attn_fwd``).

    The defaults describe a large dense problem (several M blocks, no split-KV, no paging).
    ``disable_2cta`` stands for ``FA_DISABLE_2CTA=1`` or a CUDA 12 toolkit (both disable 2-CTA
    forward). ``varlen_q`` means ``cu_seqlens_q`` is given; ``single_m_block`` means the packed
    query length fits one ``q_stage * tile_m`` block.
    """
    hv = head_dim if head_dim_v is None else head_dim_v
    is_hdim256 = head_dim == 256 and hv == 256
    return bool(
        arch // 10 in (10, 11)
        and not disable_2cta
        and not split_kv
        and (not varlen_q or (is_hdim256 and hd256_varlen_ok))
        and not seqused_q
        and not block_sparse
        and page_size in (None, 128)
        and (not single_m_block or hd256_decode_2cta)
        and (tile_m % qhead_per_kvhead == 0 or not pack_gqa)
        and (is_hdim256 or (not causal and not local and _pad16(head_dim) in (128, 192)
                            and _pad16(hv) == 128))
    )


def emulation_settings(*, head_dim: int, head_dim_v: int | None = None, causal: bool = False,
                       local: bool = False, pack_gqa: bool = False, varlen_q: bool = False,
                       use_2cta: bool | None = None, is_sm103: bool = False,
                       fp8: bool = False) -> EmulationSettings:
    """``(ex2_emu_freq, ex2_emu_res, ex2_emu_start_frg)`` as ``FlashAttentionForwardSm100``
    computes them (``__init__`` and ``__call__`` in ``flash_fwd_sm100.py``); ``varlen_q`` means
    ``cu_seqlens_q`` or ``seqused_q`` is given."""
    from fa4verify.kernels.fa4_params import load_params
    p = load_params()
    hd_pad = _pad16(head_dim)
    if use_2cta is None:
        use_2cta = uses_2cta(head_dim=head_dim, head_dim_v=head_dim_v, causal=causal, local=local,
                             varlen_q=varlen_q, pack_gqa=pack_gqa)
    key = (bool(use_2cta), bool(causal), hd_pad, bool(is_sm103))
    enable = ((hd_pad <= 128 or (hd_pad == 192 and use_2cta and not causal and not local))
              and not is_sm103)
    tune = dict(p.tuning_config.get(key, {}))
    if "ex2_emu_freq" in tune:
        enable = tune["ex2_emu_freq"] > 0
    if fp8 and hd_pad >= 96:
        fp8_tune = p.fp8_tuning_config.get(key, {})
        if "ex2_emu_freq" in fp8_tune:
            tune = {**tune, **fp8_tune}
            enable = tune["ex2_emu_freq"] > 0
    freq = 0
    start = tune.get("ex2_emu_start_frg", 1)
    if enable:
        freq = tune.get("ex2_emu_freq", 16)
        if pack_gqa and hd_pad > 64 and not causal and not local:
            freq = 32 if varlen_q else tune.get("ex2_emu_freq", 10)
    return EmulationSettings(freq, EX2_EMU_RES, start)


def columns_from_settings(settings: tuple[int, int, int], n_block_size: int = 128) -> np.ndarray:
    """The ``apply_exp2_convert`` rule: bool mask over the ``n_block_size`` columns of a KV tile,
    True where the polynomial is used."""
    freq, res, start = settings
    if n_block_size % FRG_TILE:
        raise ValueError(f"n_block_size={n_block_size} is not a multiple of {FRG_TILE}")
    frg_cnt = n_block_size // FRG_TILE
    mask = np.zeros(n_block_size, dtype=bool)
    if freq == 0:
        return mask
    for j in range(frg_cnt):
        for k in range(0, FRG_TILE, 2):
            hw = (k % freq < freq - res) or (j >= frg_cnt - 1) or (j < start)
            if not hw:
                mask[j * FRG_TILE + k] = mask[j * FRG_TILE + k + 1] = True
    return mask


def emulated_columns(*, head_dim: int, head_dim_v: int | None = None, causal: bool = False,
                     local: bool = False, pack_gqa: bool = False, varlen_q: bool = False,
                     use_2cta: bool | None = None, is_sm103: bool = False, fp8: bool = False,
                     n_block_size: int = 128) -> np.ndarray:
    """Which columns (mod the KV tile of ``n_block_size``) FA4's SM100 forward computes with the
    polynomial exp2: ``np.ndarray[bool]`` of shape ``(n_block_size,)``.

    Assumes the register index of a thread's row equals the column index (the ``32x32b`` TMEM load
    layout). ``use_2cta=None`` derives it with :func:`uses_2cta` for a large dense problem.
    """
    s = emulation_settings(head_dim=head_dim, head_dim_v=head_dim_v, causal=causal, local=local,
                           pack_gqa=pack_gqa, varlen_q=varlen_q, use_2cta=use_2cta,
                           is_sm103=is_sm103, fp8=fp8)
    return columns_from_settings(s, n_block_size)
