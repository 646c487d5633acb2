"""The mutant catalogue: every planted numeric fault of FA4's CPU twin, the stage it corrupts and
how (if at all) production FA4 can express it through a public knob."""
from __future__ import annotations

import dataclasses
from typing import Literal

Arch = Literal["sm90", "sm100"]


# =============================================================================== the catalogue
@dataclasses.dataclass(frozen=True)
class Mutant:
    """One planted numeric fault.

    ``name`` is the twin's mutation name (``twin_attention.forward(..., mutations={name})``).
    ``archs``: the twin archs on which the fault changes anything (the suite runs the mutant on
    these only). ``passes``: which passes it corrupts. ``poly`` marks exp2-polynomial mutants
    (the exp2 certification applies); ``emulation`` every mutant of the emulated exp2 function
    (the bit-exact exp2 gate applies). ``production``: how (if at all) the same fault can be
    produced in production FA4 through a public knob; ``None`` = not expressible (the fault sits
    in hard-coded kernel code).
    """

    name: str
    title: str
    stage: str
    archs: tuple[Arch, ...]
    passes: tuple[Literal["fwd", "bwd"], ...]
    poly: bool = False
    emulation: bool = False
    fp8_only: bool = False
    dtypes: tuple[str, ...] = ("bf16", "fp8")
    production: str | None = None
    source: str = ""


CATALOGUE: tuple[Mutant, ...] = (
    Mutant("poly_degree_2", "degree-2 exp2 polynomial instead of degree 3", "exp2 (emulated)",
           ("sm100",), ("fwd",), poly=True, emulation=True,
           source="POLY_EX2[2], fc/utils.py:28-62; PR #2316 proposes degree 2"),
    Mutant("poly_coeff_ulp", "degree-3 polynomial with one coefficient off by 1 fp32 ulp",
           "exp2 (emulated)", ("sm100",), ("fwd",), poly=True, emulation=True,
           source="POLY_EX2[3], fc/utils.py:28-62"),
    Mutant("p_cast_rz", "P cast to bf16 with RZ instead of RNE", "P cast",
           ("sm90", "sm100"), ("fwd", "bwd"), dtypes=("bf16",),
           source="cvt.rn / .to(dtype), fc/softmax.py:400-401, fc/utils.py:630-685"),
    Mutant("rescale_skipped", "O rescale skipped when the row max grows", "O rescale",
           ("sm90", "sm100"), ("fwd",),
           source="correction warps, fc/flash_fwd_sm100.py:2679-2702; fc/softmax.py:230-241"),
    Mutant("fp8_old_threshold", "fp8: rescale_threshold 4 with max_offset 8 (FA #2577)",
           "row max / P scaling", ("sm100",), ("fwd",), fp8_only=True,
           source="fc/flash_fwd_sm100.py:2182, 2190; #2577, #2716"),
    Mutant("nan_to_zero_emulated", "NaN scores turned to 0 in emulated lanes only",
           "exp2 (emulated)", ("sm100",), ("fwd",), emulation=True,
           source="fmax(NaN, -127) = -127 in ex2_emulation_2, fc/utils.py:776"),
    Mutant("causal_top_left", "causal mask aligned top-left instead of bottom-right", "mask",
           ("sm90", "sm100"), ("fwd", "bwd"),
           production="window_size=(None, seqlen_q - seqlen_k) with causal=False",
           source="causal_row_offset, fc/mask.py:714-721"),
    Mutant("causal_off_by_one", "causal mask off by one column", "mask",
           ("sm90", "sm100"), ("fwd", "bwd"),
           production="window_size=(None, 1) with causal=False",
           source="fc/mask.py"),
    Mutant("tail_tile_dropped", "last partial KV tile dropped", "tiling",
           ("sm90", "sm100"), ("fwd", "bwd"),
           production="K, V truncated to seqlen_k rounded down to the KV tile (as seqused_k)",
           source="n_block_max, fc/block_info.py"),
    Mutant("row_sum_rounded_p", "row sum from the rounded (bf16) P instead of fp32 P", "row sum",
           ("sm90", "sm100"), ("fwd",),
           source="update_row_sum on fp32 P, fc/softmax.py:334-339"),
    Mutant("rcp_low_precision", "rcp.approx replaced by a 2^-10-accurate reciprocal",
           "normalize", ("sm90", "sm100"), ("fwd",),
           source="rcp_approx, fc/flash_fwd_sm100.py:2743-2746; fc/softmax.py:216-220"),
    Mutant("d_from_fp32_o", "D = rowsum(dO * O) from the fp32 O instead of the rounded O",
           "bwd preprocess", ("sm90", "sm100"), ("bwd",),
           source="fc/flash_bwd_preprocess.py:389-397"),
    Mutant("dq_shuffled_order", "shuffled dQ accumulation order under deterministic=True",
           "dQ accumulation", ("sm90", "sm100"), ("bwd",),
           production="deterministic=False (atomic, unordered fp32 reduce-add)",
           source="semaphores, fc/flash_bwd_sm90.py:1880-1918; fc/barrier.py"),
)

MUTANT_NAMES: tuple[str, ...] = tuple(m.name for m in CATALOGUE)

#: Mutants the production column can express through FA4's public API on the H200 (SM90 kernels);
#: every other mutant is hard-coded kernel arithmetic. SM100-only knob (not runnable on the H200):
#: ``ex2_emu_freq = 0`` in ``flash_attn.cute.flash_fwd_sm100._TUNING_CONFIG`` turns the exp2
#: emulation off (flash_attn/cute/flash_fwd_sm100.py:550-557, ex2_emu_freq) -- not a fault, so not a mutant here.
PRODUCTION_KNOBS: dict[str, str] = {m.name: m.production for m in CATALOGUE if m.production}


def get_mutant(name: str) -> Mutant:
    for m in CATALOGUE:
        if m.name == name:
            return m
    raise KeyError(f"unknown mutant {name!r}; known: {', '.join(MUTANT_NAMES)}")
