"""fa4verify.kernels.twin -- the bit-exact CPU twin of FA4 (every figure from it: "CPU twin").

Modules (one concept each):

* :mod:`~fa4verify.kernels.twin.exp2` -- FA4's polynomial exp2 emulation (``ex2_emulation``,
  bit-exact) and its column-selection rule (``emulated_columns``), Note [exp2 emulation];
* :mod:`~fa4verify.kernels.twin.fp32` -- the fp32 building blocks the forward and the backward
  share (rounding arithmetic, casts, MMA accumulation models, input dtypes);
* :mod:`~fa4verify.kernels.twin.forward` / :mod:`~fa4verify.kernels.twin.backward` -- FA4's
  attention forward and backward, stage by stage;
* :mod:`~fa4verify.kernels.twin.attention` -- the public face of the algorithm twin:
  ``attention.forward(q, k, v, ...)`` and ``attention.backward(...)``.

This package re-exports everything the module ``fa4verify.kernels.twin`` exported before it
became a package (the exp2 names) and the algorithm twin's names.  ``twin.forward`` and
``twin.backward`` are the *submodules*; the entry functions are ``twin.attention.forward`` and
``twin.attention.backward`` (also ``twin.forward.forward`` / ``twin.backward.backward``).

The twin imports the exact fp32 kit from ``fa4verify.oracles.binary32`` and FA4's parameters from
``fa4verify.kernels.fa4_params``; it never imports the judge nor ``flash_attn.cute``.
"""
from __future__ import annotations

from fa4verify.kernels.twin import exp2, fp32  # noqa: F401  (submodules, in dependency order)
from fa4verify.kernels.twin.exp2 import (
    CLAMP_LO, EX2_EMU_RES, FRG_TILE, ROUND_INT, EmulationSettings, Variant, columns_from_settings,
    emulated_columns, emulation_settings, ex2_emulation, ex2_emulation_parts, poly_coeffs_f32,
    uses_2cta,
)
from fa4verify.kernels.twin import forward, backward, attention  # noqa: F401,E402  (submodules)
from fa4verify.kernels.twin.attention import (  # noqa: E402
    ACCUMULATIONS, BWD_MUTATIONS, BWD_STAGES, FWD_MUTATIONS, FWD_STAGES, MUFU_BOUNDS, MUFU_MODES,
    MUTATIONS, Mufu, StageSample, TwinBackwardResult, TwinConfig, TwinForwardResult, cast_to,
    emulated_exp2, mma, sm90_tile,
)

__all__ = [
    # submodules
    "exp2", "fp32", "forward", "backward", "attention",
    # exp2 emulation and column rule (what the module kernels.twin exported)
    "ex2_emulation", "ex2_emulation_parts", "emulated_columns", "uses_2cta", "emulation_settings",
    "EmulationSettings", "columns_from_settings", "ROUND_INT", "CLAMP_LO", "EX2_EMU_RES",
    "FRG_TILE", "Variant", "poly_coeffs_f32",
    # the algorithm twin (entry functions: attention.forward / attention.backward)
    "ACCUMULATIONS", "BWD_MUTATIONS", "BWD_STAGES", "FWD_MUTATIONS", "FWD_STAGES", "MUFU_BOUNDS",
    "MUFU_MODES", "MUTATIONS", "Mufu", "StageSample", "TwinBackwardResult", "TwinConfig",
    "TwinForwardResult", "cast_to", "emulated_exp2", "mma", "sm90_tile",
]
