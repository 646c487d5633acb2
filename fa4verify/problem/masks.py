"""Masks of a problem: causal, local windows (FA4's resolution) and mask_mod-style boolean patterns.

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

from fa4verify.kernels import facts as _facts

Window = tuple[Optional[int], Optional[int]]
MaskKind = Literal["document", "sliding_window", "block_sparse", "masked_rows"]
#: the kinds of mask_mod-style pattern (:class:`MaskMod`; ``fa4verify.strategies.mask_mods`` draws them).
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
