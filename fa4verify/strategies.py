"""Hypothesis strategies for FlashAttention-4 attention problems (public API).

This module only re-exports from ``fa4verify._strategies`` (shapes, masks, values, problem); see
docs/fuzzing.md. Typical use::

    from hypothesis import given
    from fa4verify.strategies import attention_problems

    @given(attention_problems(dtype="bf16", arch="sm90", max_seqlen=300))
    def test_my_kernel(problem):
        arrays = problem.materialize()      # q, k, v, dout, learnable_sink, cu_seqlens_*, mask
        ...

Every strategy here documents its value domain, what it never generates and what it shrinks
toward. None of them launches a kernel.
"""
from __future__ import annotations

from fa4verify._strategies.calls import (
    CALL_FEATURES,
    CallForm,
    MaskModPair,
    keep_call_forms,
    kv_call_forms,
    mask_mod_pairs,
    set_mask_mod_source,
)
from fa4verify._strategies.masks import (
    MASK_KINDS,
    MaskMod,
    causal_and_windows,
    mask_mods,
    resolve_window,
    softcaps,
    varlen_seqlens,
    window_keep_mask,
)
from fa4verify._strategies.problem import FEATURES, PROBLEM_FORMAT, AttentionProblem, attention_problems, mod_problems
from fa4verify._strategies.shapes import (
    ARCHS,
    DTYPES,
    TILE_SIZES,
    head_counts,
    head_dim_supported,
    head_dims,
    seqlen_edges,
    seqlen_pairs,
    seqlens,
    supported_head_dims,
)
from fa4verify._strategies.values import DISTRIBUTIONS, ValueSpec, generate_values, round_to_dtype, value_specs

__all__ = [
    "ARCHS",
    "CALL_FEATURES",
    "CallForm",
    "MaskModPair",
    "keep_call_forms",
    "kv_call_forms",
    "mask_mod_pairs",
    "set_mask_mod_source",
    "DISTRIBUTIONS",
    "DTYPES",
    "FEATURES",
    "MASK_KINDS",
    "PROBLEM_FORMAT",
    "TILE_SIZES",
    "AttentionProblem",
    "MaskMod",
    "ValueSpec",
    "attention_problems",
    "mod_problems",
    "causal_and_windows",
    "generate_values",
    "head_counts",
    "head_dim_supported",
    "head_dims",
    "mask_mods",
    "resolve_window",
    "round_to_dtype",
    "seqlen_edges",
    "seqlen_pairs",
    "seqlens",
    "softcaps",
    "supported_head_dims",
    "value_specs",
    "varlen_seqlens",
    "window_keep_mask",
]
