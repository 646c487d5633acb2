"""Strategies for the masks of a problem: causal and local windows (FA4's semantics,
:mod:`fa4verify.problem.masks`), softcaps, varlen lengths and mask_mod-style patterns
(:class:`~fa4verify.problem.masks.MaskMod`).
"""
from __future__ import annotations

from typing import Optional

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import DrawFn

from fa4verify._strategies.shapes import seqlens
from fa4verify.problem.masks import MASK_KINDS, MaskMod, Window


def _window_bound(max_extent: int) -> st.SearchStrategy[int]:
    """A window bound: mostly small (0..8), sometimes up to the sequence, sometimes wider than it,
    sometimes negative. Shrinks toward 0."""
    return st.one_of(st.integers(0, 8), st.integers(0, max_extent), st.integers(max_extent, 2 * max_extent + 8),
                     st.integers(-max_extent - 2, -1))


@st.composite
def causal_and_windows(draw: DrawFn, *, seqlen_q: int, seqlen_k: int, local: bool = True,
                       causal: bool = True) -> tuple[bool, Window]:
    """``(causal, window_size)`` for a ``seqlen_q x seqlen_k`` problem.

    Modes: no mask; causal; two-sided window; one-sided windows (left only, right only, and causal
    with a left window, i.e. sliding-window causal); windows with a negative side (empty windows,
    fully masked rows); windows wider than the sequence; both sides negative (FA4 ignores the
    window). Shrinks toward ``(False, (None, None))``.
    """
    modes = ["none"] + (["causal"] if causal else [])
    if local:
        modes += ["two_sided", "left_only", "right_only", "negative", "wide", "both_negative"]
        if causal:
            modes += ["causal_left"]
    mode = draw(st.sampled_from(modes))
    ext = max(seqlen_q, seqlen_k, 1)
    if mode == "none":
        return False, (None, None)
    if mode == "causal":
        return True, (None, None)
    if mode == "two_sided":
        return False, (draw(_window_bound(ext)), draw(_window_bound(ext)))
    if mode == "left_only":
        return False, (draw(_window_bound(ext)), None)
    if mode == "right_only":
        return False, (None, draw(_window_bound(ext)))
    if mode == "causal_left":
        return True, (draw(_window_bound(ext)), None)
    if mode == "negative":
        neg = draw(st.integers(-ext - 2, -1))
        pos = draw(st.integers(0, ext + 2))
        return False, ((neg, pos) if draw(st.booleans()) else (pos, neg))
    if mode == "wide":
        return False, (draw(st.integers(ext, 2 * ext + 8)), draw(st.integers(ext, 2 * ext + 8)))
    return False, (draw(st.integers(-ext - 2, -1)), draw(st.integers(-ext - 2, -1)))


@st.composite
def mask_mods(draw: DrawFn, *, seqlen_q: int, seqlen_k: int) -> MaskMod:
    """A :class:`MaskMod` for a ``seqlen_q x seqlen_k`` problem: document masks (1-5 documents),
    sliding windows (0..max(seqlen)), random block sparsity (blocks of 16..128, keep
    probability 0.25/0.5/0.75/0.9) and randomly fully masked rows. Shrinks toward a one-document
    mask with seed 0."""
    kind = draw(st.sampled_from(MASK_KINDS))
    seed = draw(st.integers(0, 2**16 - 1))
    ext = max(seqlen_q, seqlen_k, 1)
    causal_within = draw(st.booleans())
    if kind == "document":
        return MaskMod(kind, draw(st.integers(1, 5)), seed, causal_within=causal_within)
    if kind == "sliding_window":
        return MaskMod(kind, draw(st.integers(0, ext)), seed, causal_within=causal_within)
    keep = draw(st.sampled_from((0.5, 0.25, 0.75, 0.9)))
    if kind == "block_sparse":
        return MaskMod(kind, draw(st.sampled_from((16, 32, 64, 128))), seed, keep_prob=keep)
    return MaskMod(kind, 1, seed, keep_prob=keep)


def softcaps() -> st.SearchStrategy[float]:
    """Softcap values > 0 (``tanh`` capping of the scaled scores): FA4's test value 15, small caps
    that bind often (1, 2.5, 5) and large ones (30, 50), or any float in [0.5, 100]. Shrinks toward 1."""
    return st.one_of(st.sampled_from((1.0, 2.5, 5.0, 15.0, 30.0, 50.0)),
                     st.floats(0.5, 100.0, allow_nan=False, allow_infinity=False))


@st.composite
def varlen_seqlens(draw: DrawFn, *, batch: int, max_seqlen: int, zero_lengths: bool = True,
                   q_range: Optional[tuple[int, int]] = None, k_range: Optional[tuple[int, int]] = None
                   ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per-sequence ``(seqlens_q, seqlens_k)`` of a varlen batch of ``batch`` sequences.

    Each length is tile-edge biased (:func:`seqlens`) in ``[0, max_seqlen]``; with ``zero_lengths``
    about one sequence in four has an empty query side, key side or both (FA #2562). At least one
    query row exists in the batch. ``q_range`` / ``k_range``: ``(min, max)`` of each side instead
    of ``[0, max_seqlen]`` (a deployment's; a side is empty only where its minimum is 0, and
    only with ``zero_lengths``). Shrinks toward all lengths 1 (the ranges' minima).
    """
    if batch < 1:
        raise InvalidArgument(f"batch={batch} must be >= 1")
    qlo, qhi = q_range or (0, max_seqlen)
    klo, khi = k_range or (0, max_seqlen)
    empty = (["q"] if qlo == 0 else []) + (["k"] if klo == 0 else []) + (["both"] if qlo == klo == 0 else [])
    qs, ks = [], []
    for _ in range(batch):
        zero = draw(st.sampled_from(("none", "none", "none", *empty))) if zero_lengths and empty else "none"
        sq = 0 if zero in ("q", "both") else draw(seqlens(max_seqlen=qhi, min_seqlen=max(qlo, 1)))
        sk = 0 if zero in ("k", "both") else draw(seqlens(max_seqlen=khi, min_seqlen=max(klo, 1)))
        qs.append(sq)
        ks.append(sk)
    if sum(qs) == 0:
        qs[0] = max(qlo, 1)
    return tuple(qs), tuple(ks)
