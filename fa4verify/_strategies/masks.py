"""Masks and score modifiers: causal, local windows, softcap, learnable sinks, varlen lengths and
mask_mod-style boolean patterns.

Conventions (FA4's, ``flash_attn/cute/mask.py`` and ``interface.py:_resolve_causal_local_window``):

* Causal and local masks are **bottom-right aligned**: query row ``i`` of a sequence with
  ``seqlen_q`` rows and ``seqlen_k`` keys sits at key position ``c = i + seqlen_k - seqlen_q``.
* ``window_size = (left, right)``; ``None`` is unbounded. Key ``j`` is kept iff
  ``c - left <= j <= c + right`` (each bound dropped when it is None). Negative values are legal
  (the window then excludes the diagonal and can be empty, giving fully masked rows); when both
  are negative FA4 drops the window entirely. ``causal`` forces ``right = 0``.
* A mask_mod-style pattern (:class:`MaskMod`) is a boolean ``(seqlen_q, seqlen_k)`` keep-mask
  generated from its parameters and seed. As in FA4, a mask_mod replaces causal/local masking;
  the strategies never combine a :class:`MaskMod` with ``causal`` or a window.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import DrawFn

from fa4verify._strategies.shapes import seqlens
from fa4verify.kernels import facts as _facts

Window = tuple[Optional[int], Optional[int]]
MaskKind = Literal["document", "sliding_window", "block_sparse", "masked_rows"]
#: mask_mod-style patterns that :func:`mask_mods` draws.
MASK_KINDS: tuple[str, ...] = ("document", "sliding_window", "block_sparse", "masked_rows")


def resolve_window(causal: bool, window_size: Window) -> tuple[bool, bool, Optional[int], Optional[int]]:
    """FA4's canonical form ``(causal, local, left, right)``: :func:`fa4verify.kernels.facts.resolve_causal_local_window`."""
    return _facts.resolve_causal_local_window(causal, window_size)


def window_keep_mask(seqlen_q: int, seqlen_k: int, *, causal: bool, window_size: Window) -> np.ndarray:
    """Boolean ``(seqlen_q, seqlen_k)`` keep-mask (True = attended) of causal/local masking,
    bottom-right aligned as in FA4."""
    causal, local, left, right = resolve_window(causal, window_size)
    i = np.arange(seqlen_q)[:, None]
    j = np.arange(seqlen_k)[None, :]
    c = i + seqlen_k - seqlen_q
    keep = np.ones((seqlen_q, seqlen_k), dtype=bool)
    if causal:
        keep &= j <= c
    if local:
        if left is not None:
            keep &= j >= c - left
        if right is not None:
            keep &= j <= c + right
    return keep


@dataclass(frozen=True)
class MaskMod:
    """A mask_mod-style pattern, materialised as a boolean keep-mask (True = attended).

    kind:
      * ``"document"``: ``param`` documents; query and key positions are split into documents at
        the same fractional boundaries (drawn from ``seed``); a key is kept iff it is in the same
        document (and, with ``causal_within``, not after the query's aligned position).
      * ``"sliding_window"``: keep ``|c - j| <= param`` (``c`` the bottom-right aligned position),
        or ``0 <= c - j <= param`` with ``causal_within``.
      * ``"block_sparse"``: ``param``-sized blocks kept independently with probability
        ``keep_prob`` (random block sparsity); can give fully masked rows.
      * ``"masked_rows"``: each query row fully masked with probability ``keep_prob``'s complement
        (``1 - keep_prob``), other rows attend to every key.
    """

    kind: str
    param: int
    seed: int
    keep_prob: float = 0.5
    causal_within: bool = False

    def __post_init__(self) -> None:
        if self.kind not in MASK_KINDS:
            raise ValueError(f"MaskMod.kind={self.kind!r} not in {MASK_KINDS}")
        if self.param < 1 and self.kind in ("document", "block_sparse"):
            raise ValueError(f"MaskMod.param={self.param} must be >= 1 for kind={self.kind!r}")
        if not 0.0 <= self.keep_prob <= 1.0:
            raise ValueError(f"MaskMod.keep_prob={self.keep_prob} must be in [0, 1]")

    def keep_mask(self, seqlen_q: int, seqlen_k: int) -> np.ndarray:
        """Boolean ``(seqlen_q, seqlen_k)`` keep-mask, deterministic in the fields."""
        rng = np.random.default_rng(self.seed)
        i = np.arange(seqlen_q)[:, None]
        j = np.arange(seqlen_k)[None, :]
        c = i + seqlen_k - seqlen_q
        if self.kind == "document":
            cuts = np.sort(rng.uniform(0.0, 1.0, size=self.param - 1))
            dq = np.searchsorted(cuts, (np.arange(seqlen_q) + 0.5) / max(seqlen_q, 1))
            dk = np.searchsorted(cuts, (np.arange(seqlen_k) + 0.5) / max(seqlen_k, 1))
            keep = dq[:, None] == dk[None, :]
            if self.causal_within:
                keep &= j <= c
            return keep
        if self.kind == "sliding_window":
            if self.causal_within:
                return (c - j >= 0) & (c - j <= self.param)
            return np.abs(c - j) <= self.param
        if self.kind == "block_sparse":
            b = self.param
            nbq, nbk = -(-seqlen_q // b), -(-seqlen_k // b)
            blocks = rng.random((max(nbq, 1), max(nbk, 1))) < self.keep_prob
            return np.repeat(np.repeat(blocks, b, axis=0), b, axis=1)[:seqlen_q, :seqlen_k]
        rows = rng.random(seqlen_q) < self.keep_prob
        return np.broadcast_to(rows[:, None], (seqlen_q, seqlen_k)).copy()

    def to_dict(self) -> dict:
        return {"kind": self.kind, "param": self.param, "seed": self.seed,
                "keep_prob": self.keep_prob, "causal_within": self.causal_within}

    @classmethod
    def from_dict(cls, d: dict) -> "MaskMod":
        return cls(kind=d["kind"], param=int(d["param"]), seed=int(d["seed"]),
                   keep_prob=float(d.get("keep_prob", 0.5)), causal_within=bool(d.get("causal_within", False)))


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
