"""Hypothesis strategies for FlashAttention-4 attention problems (public API).

This module only re-exports the strategies of ``fa4verify._strategies`` (shapes, masks, values,
call forms, problems); see docs/fuzzing.md. What they draw -- :class:`~fa4verify.problem.AttentionProblem`
and its parts (``ValueSpec``, ``MaskMod``, ``CallForm``) with their vocabularies (``FEATURES``,
``CALL_FEATURES``, ``DISTRIBUTIONS``, ``MASK_KINDS``) -- lives in :mod:`fa4verify.problem`, which
does not import Hypothesis. Typical use::

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

from fa4verify._strategies.calls import keep_call_forms, kv_call_forms
from fa4verify._strategies.masks import causal_and_windows, mask_mods, softcaps, varlen_seqlens
from fa4verify._strategies.problem import attention_problems, mod_problems
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
from fa4verify._strategies.values import value_specs

__all__ = [
    "ARCHS",
    "DTYPES",
    "TILE_SIZES",
    "attention_problems",
    "mod_problems",
    "causal_and_windows",
    "head_counts",
    "head_dim_supported",
    "head_dims",
    "keep_call_forms",
    "kv_call_forms",
    "mask_mods",
    "seqlen_edges",
    "seqlen_pairs",
    "seqlens",
    "softcaps",
    "supported_head_dims",
    "value_specs",
    "varlen_seqlens",
]
