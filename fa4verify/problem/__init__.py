"""The attention problem: :class:`AttentionProblem`, a frozen, JSON-round-trippable description of
one attention call -- what fa4verify runs, judges and reports, whoever made it (a check's fixed
cases, the coverage plan, a deployment profile, a fuzz draw, a user).

A problem holds only small integers, flags and a value seed; :meth:`AttentionProblem.materialize`
generates the arrays with numpy. Layout follows FA4: dense ``(batch, seqlen, nheads, head_dim)``;
varlen ``(total, nheads, head_dim)`` with ``cu_seqlens`` (int32, length batch + 1).

Its parts, one module each: :mod:`~fa4verify.problem.masks` (causal and window resolution, the
mask_mod-style patterns :class:`MaskMod`), :mod:`~fa4verify.problem.values` (:class:`ValueSpec` and
the value distributions), :mod:`~fa4verify.problem.edges` (the mask-edge values) and
:mod:`~fa4verify.problem.calls` (:class:`CallForm`: how FA4 is called for a problem). None of them
imports Hypothesis: the strategies that draw problems are :mod:`fa4verify.strategies`.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import numpy as np

from fa4verify.kernels import facts as _facts
from fa4verify.problem.calls import CALL_FEATURES, MOD_FEATURE, CallForm
from fa4verify.problem.masks import MaskMod, Window, resolve_window, window_keep_mask
from fa4verify.problem.values import (DESCALE_INPUTS, DISTRIBUTIONS, INPUT_LIMIT, ValueSpec, generate_descales,
                                      generate_values, round_to_dtype)

__all__ = ["AttentionProblem", "PROBLEM_FORMAT", "FEATURES", "SINK_DTYPES", "CALL_FEATURES", "MOD_FEATURE", "CallForm",
           "MaskMod", "Window", "ValueSpec", "DISTRIBUTIONS", "head_dims_supported", "resolve_window",
           "window_keep_mask", "generate_values", "round_to_dtype"]

#: JSON schema tag written by :meth:`AttentionProblem.to_dict`.
PROBLEM_FORMAT = "fa4verify-attention-problem/1"

#: The optional features of a problem (each a field or pattern of :class:`AttentionProblem`);
#: :func:`fa4verify.strategies.attention_problems` switches them on and off (all by default).
FEATURES: tuple[str, ...] = ("causal", "local", "softcap", "sink", "varlen", "mask_mod", "gqa")
#: the dtypes of a learnable sink FA4 4.0.0b26+ takes (``_LEARNABLE_SINK_DTYPES``; b20..b25: bf16 only)
SINK_DTYPES: tuple[str, ...] = ("fp32", "bf16", "fp16")


def head_dims_supported(arch: str, head_dim: int, head_dim_v: int, dtype: str = "bf16") -> bool:
    """The head dims a problem takes: FA4's rule (:func:`fa4verify.kernels.facts.head_dims_supported`),
    less the MLA shapes (``head_dim_v`` 512 off SM90) for 16-bit problems: valid in FA4, but a
    16-bit problem here is standard attention (MLA is :mod:`fa4verify.oracles.mla`'s)."""
    if dtype in ("bf16", "fp16") and arch != "sm90" and head_dim_v == 512:
        return False
    return _facts.head_dims_supported(arch, head_dim, head_dim_v, dtype)


@functools.lru_cache(maxsize=64)
def _varlen_bounds(seqlens_q: tuple, seqlens_k: tuple) -> tuple[tuple[int, int, int, int], ...]:
    """``(q_start, q_len, k_start, k_len)`` per sequence (memoised: the edge self-check asks per
    key, and a planned row has 257 sequences)."""
    cq = np.concatenate([[0], np.cumsum(seqlens_q)])
    ck = np.concatenate([[0], np.cumsum(seqlens_k)])
    return tuple((int(cq[b]), int(seqlens_q[b]), int(ck[b]), int(seqlens_k[b])) for b in range(len(seqlens_q)))


@dataclass(frozen=True)
class AttentionProblem:
    """One attention problem: shapes, masking, score modifiers and a value recipe.

    Fields (all plain Python values, so a problem hashes, compares and round-trips JSON):

    * ``arch``: "sm90" | "sm100"; ``dtype``: "bf16" | "fp16" | "fp8" (e4m3fn; q, k, v, dout are
      exact in it).
    * ``batch, seqlen_q, seqlen_k, nheads, nheads_kv, head_dim, head_dim_v``. For varlen problems
      ``seqlen_q``/``seqlen_k`` are the maxima of ``seqlens_q``/``seqlens_k`` and ``batch`` their length.
    * ``causal``, ``window_size=(left, right)`` (FA4 semantics, :mod:`fa4verify.problem.masks`).
    * ``softcap`` (0.0 = off), ``sink`` (learnable per-head sink present), ``sink_dtype`` (the
      sink tensor's dtype: "fp32", "bf16" or "fp16"; FA4 writes dsink in it), ``softmax_scale``
      (None = FA4's default ``1/sqrt(head_dim)``).
    * ``seqlens_q``/``seqlens_k``: per-sequence lengths of a varlen batch (zeros allowed), or None.
    * ``mask_mod``: a boolean keep-pattern (:class:`MaskMod`) or None; never together with
      causal/window/varlen.
    * ``values``: the :class:`ValueSpec` the arrays are generated from.
    * ``call``: how FA4 is called (:class:`~fa4verify.problem.calls.CallForm`: paged KV,
      seqused_k, block sparsity, a CuTe mask_mod), or None for the plain call; it never changes
      what the problem computes beyond the keep-mask it adds (Note [Call forms keep the
      problem's meaning]).
    * ``descales``: which of q, k, v carry an fp32 descale factor per (batch entry, KV head)
      (fp8 problems only: FA4's ``q_descale`` / ``k_descale`` / ``v_descale``); the problem
      computes attention on the descaled inputs (Note [FP8 descales]).

    Note [FP8 descales]
    -------------------
    FA4 (SM 10.x, ``interface._flash_attn_fwd``) takes fp32 (batch, nheads_kv) descales with fp8
    inputs and computes attention on ``q_descale q``, ``k_descale k``, ``v_descale v`` (the
    factor of a query head is its KV head's; ``flash_attn.cute.testing.attention_ref`` likewise).
    The problem's arrays hold the fp8 values and the factors (:meth:`materialize`); the judge
    reads the descaled inputs, exact in float64 (:func:`fa4verify.oracles.descale.descaled`:
    4 + 24 significand bits), so the oracle and the budget statistics see the real-number
    function. The kernel folds ``q_descale * k_descale`` into its exponent scale and
    ``v_descale`` into the normaliser, three more fp32 roundings, which the budgets count
    (``c_roundings`` and ``o_scale_roundings`` in ``error_budgets/fp8_*.toml``,
    DERIVATIONS.md#fp8-descale).
    """

    arch: str
    dtype: str
    batch: int
    seqlen_q: int
    seqlen_k: int
    nheads: int
    nheads_kv: int
    head_dim: int
    head_dim_v: int
    causal: bool = False
    window_size: Window = (None, None)
    softcap: float = 0.0
    sink: bool = False
    softmax_scale: Optional[float] = None
    seqlens_q: Optional[tuple[int, ...]] = None
    seqlens_k: Optional[tuple[int, ...]] = None
    mask_mod: Optional[MaskMod] = None
    values: ValueSpec = field(default_factory=ValueSpec)
    #: registered score_mod / mask_mod pair names (``fa4verify.mods``; at most one of each kind)
    mods: tuple[str, ...] = ()
    #: seed of the pairs' aux-tensor factories (callers may pass real aux data: ``arrays["mod_aux"]``)
    mod_seed: int = 0
    call: Optional[CallForm] = None
    descales: tuple[str, ...] = ()
    sink_dtype: str = "fp32"

    def __post_init__(self) -> None:
        # the one problem type of fa4verify: every arch and dtype FA4 has (the strategies draw
        # a subset: fa4verify._strategies.shapes.ARCHS / DTYPES)
        if self.arch not in _facts.ARCHS:
            raise ValueError(f"arch={self.arch!r} is not supported; expected one of {_facts.ARCHS}")
        if self.dtype not in _facts.DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is not supported; expected one of {_facts.DTYPES}")
        mla = self.call is not None and self.call.mla      # its head dims: CallForm._validate_mla
        if not mla and not head_dims_supported(self.arch, self.head_dim, self.head_dim_v, self.dtype):
            raise ValueError(f"(head_dim, head_dim_v)=({self.head_dim}, {self.head_dim_v}) is not "
                             f"supported on {self.arch} ({self.dtype}): {_facts.supported_head_dims_text(self.arch)}")
        if self.nheads < 1 or self.nheads_kv < 1 or self.nheads % self.nheads_kv:
            raise ValueError(f"nheads={self.nheads} must be a positive multiple of nheads_kv={self.nheads_kv}")
        if (self.seqlens_q is None) != (self.seqlens_k is None):
            raise ValueError("seqlens_q and seqlens_k must both be given (varlen) or both be None")
        if self.seqlens_q is not None:
            object.__setattr__(self, "seqlens_q", tuple(int(x) for x in self.seqlens_q))
            object.__setattr__(self, "seqlens_k", tuple(int(x) for x in self.seqlens_k))
            if not (len(self.seqlens_q) == len(self.seqlens_k) == self.batch):
                raise ValueError(f"varlen: len(seqlens_q)={len(self.seqlens_q)}, len(seqlens_k)="
                                 f"{len(self.seqlens_k)} and batch={self.batch} must agree")
            if min(self.seqlens_q + self.seqlens_k) < 0:
                raise ValueError("varlen sequence lengths must be >= 0")
            if (self.seqlen_q, self.seqlen_k) != (max(self.seqlens_q), max(self.seqlens_k)):
                raise ValueError("varlen: seqlen_q/seqlen_k must be the maxima of seqlens_q/seqlens_k")
        elif self.batch < 1 or self.seqlen_q < 1 or self.seqlen_k < 1:
            raise ValueError(f"dense problems need batch, seqlen_q, seqlen_k >= 1, got "
                             f"{self.batch}, {self.seqlen_q}, {self.seqlen_k}")
        if self.mask_mod is not None and (self.causal or self.window_size != (None, None) or self.varlen):
            raise ValueError("mask_mod cannot be combined with causal, a window, or varlen")
        if self.softcap < 0 or not math.isfinite(self.softcap):
            raise ValueError(f"softcap={self.softcap} must be finite and >= 0")
        if self.sink_dtype not in SINK_DTYPES:
            raise ValueError(f"sink_dtype={self.sink_dtype!r}: expected one of {SINK_DTYPES}")
        if self.call is not None and self.call.mask_causal and not self.mods:
            raise ValueError("the mask_causal call form needs a mask pair (mods)")
        if self.sink_dtype != "fp32" and not self.sink:
            raise ValueError(f"sink_dtype={self.sink_dtype!r} without a sink")
        object.__setattr__(self, "window_size", tuple(self.window_size))
        object.__setattr__(self, "mods", tuple(self.mods))
        if self.mods:
            score, mask = self.mod_pairs()
            if self.mask_mod is not None:
                raise ValueError("mods cannot be combined with a MaskMod pattern")
            # pack_gqa alone rides along; a batched layout (seqused_k / seqused_q / a page table / the
            # batched call) holds the same varlen rows, each at its logical position in its sequence
            other = self.call is not None and self.call.rearranges and not self.call.batched_layout
            # Note [Varlen mask blocks]: a mask pair inside varlen block sparsity's mask blocks
            sparse_mask = other and self.call.block_size is not None and self.call.mask_mod_fn is None \
                and score is None and mask is not None
            if self.varlen and other and not sparse_mask:
                raise ValueError("mods on a varlen call take no keep-pattern or MLA call form (block sparsity, "
                                 "a named mask_mod, qv) but a mask pair inside block sparsity's mask blocks: "
                                 "cu_seqlens, seqused, the batched call or paged KV only")
            if other and (self.call.block_size is None or self.call.mask_mod_fn is not None):
                raise ValueError("mods combine with block sparsity only (Note [Partial blocks]), not with "
                                 "another FA4 call form (paged KV, seqused_k/q, a named mask_mod)")
            if self.call is not None and self.call.mask_causal and (mask is None or self.causal):
                raise ValueError("the mask_causal call form passes causal=True along with a mask pair: the "
                                 "problem needs a mask pair and no causal of its own")
            if mask is not None and (self.causal or self.window_size != (None, None)):
                raise ValueError(f"mask pair {mask.name!r} with causal/window: FA4 drops causal and the window "
                                 f"when a mask_mod is given; write them into the mask")
            if score is not None and self.softcap:
                raise ValueError("a score pair and softcap cannot be combined (FA4 asserts)")
            for p_ in (score, mask):
                if p_ is not None and p_.self_attention_only and (
                        self.seqlen_q != self.seqlen_k or (self.varlen and self.seqlens_q != self.seqlens_k)):
                    raise ValueError(f"mod pair {p_.name!r} needs seqlen_q == seqlen_k (every sequence)")
        if self.call is not None:
            self.call.validate(self)
        object.__setattr__(self, "descales", tuple(self.descales))
        if self.descales:
            if self.dtype != "fp8":
                raise ValueError("descales take fp8 inputs (FA4 asserts 'q_descale/k_descale/v_descale are only "
                                 "supported for FP8 inputs')")
            if tuple(n for n in DESCALE_INPUTS if n in self.descales) != self.descales:
                raise ValueError(f"descales={self.descales!r}: a subset of {DESCALE_INPUTS}, in that order")
        if self.dtype == "fp8" and self.mods:
            raise ValueError("mod pairs on fp8 inputs are not judged (FA4 folds the descales into a score_mod's "
                             "scale; fa4verify's adapter does not route them)")

    # ------------------------------------------------------------------ derived facts
    @property
    def varlen(self) -> bool:
        return self.seqlens_q is not None

    @property
    def scale(self) -> float:
        """The softmax scale actually used (FA4's default ``1/sqrt(head_dim)`` when None)."""
        return self.softmax_scale if self.softmax_scale is not None else 1.0 / math.sqrt(self.head_dim)

    @property
    def local(self) -> bool:
        return resolve_window(self.causal, self.window_size)[1]

    @property
    def work(self) -> int:
        """Multiply-adds of one forward pass (size measure, e.g. for shrinking reports)."""
        if self.varlen:
            pairs = sum(a * b for a, b in zip(self.seqlens_q, self.seqlens_k))
        else:
            pairs = self.batch * self.seqlen_q * self.seqlen_k
        return pairs * self.nheads * (self.head_dim + self.head_dim_v)

    def features(self) -> dict[str, Any]:
        """Flat feature labels (for campaign coverage counts and reports)."""
        return {"arch": self.arch, "dtype": self.dtype, "hdim": f"{self.head_dim}x{self.head_dim_v}",
                "causal": self.causal, "local": self.local, "softcap": self.softcap > 0, "sink": self.sink,
                "varlen": self.varlen, "gqa": self.nheads_kv < self.nheads,
                "mask_mod": self.mask_mod.kind if self.mask_mod else None,
                "mods": "+".join(self.mods) or None,
                "distribution": self.values.distribution,
                "seqlen_q_ne_k": self.seqlen_q != self.seqlen_k,
                "tile_edge": any(x % 64 in (0, 1, 63) for x in (self.seqlen_q, self.seqlen_k)),
                "zero_length": bool(self.varlen and 0 in (self.seqlens_q + self.seqlens_k)),
                **(self.call.labels() if self.call is not None else {}),
                "block_sparse_varlen": bool(self.varlen and self.call is not None and self.call.block_size is not None),
                **({"descales": "".join(self.descales)} if self.descales else {})}

    def describe(self) -> str:
        """One-line human summary."""
        parts = [f"{self.arch} {self.dtype} b={self.batch} sq={self.seqlen_q} sk={self.seqlen_k} "
                 f"h={self.nheads}/{self.nheads_kv} d={self.head_dim}" +
                 (f"/{self.head_dim_v}" if self.head_dim_v != self.head_dim else "")]
        if self.varlen:
            parts.append(f"varlen q={list(self.seqlens_q)} k={list(self.seqlens_k)}")
        if self.causal:
            parts.append("causal")
        if self.window_size != (None, None):
            parts.append(f"window={self.window_size}")
        if self.softcap:
            parts.append(f"softcap={self.softcap:g}")
        if self.sink:
            parts.append("sink" if self.sink_dtype == "fp32" else f"sink[{self.sink_dtype}]")
        if self.softmax_scale is not None:
            parts.append(f"scale={self.softmax_scale:g}")
        if self.mask_mod:
            parts.append(f"mask_mod={self.mask_mod.kind}({self.mask_mod.param})")
        if self.mods:
            parts.append("mods=" + "+".join(self.mods) + (f"#{self.mod_seed}" if self.mod_seed else ""))
        if self.call is not None:
            parts.append(self.call.describe())
        if self.descales:
            parts.append("descale=" + "".join(self.descales))
        parts.append(f"values={self.values.distribution}#{self.values.seed}")
        return " ".join(parts)

    def _seq_bounds(self) -> list[tuple[int, int, int, int]]:
        """``(q_start, q_len, k_start, k_len)`` per batch entry, along the varlen token axis
        (dense problems: starts are 0 and lengths the full seqlens)."""
        if not self.varlen:
            return [(0, self.seqlen_q, 0, self.seqlen_k)] * self.batch
        return list(_varlen_bounds(tuple(self.seqlens_q), tuple(self.seqlens_k)))

    def mod_pairs(self):
        """``(score pair, mask pair)`` named by :attr:`mods` (None where absent)."""
        from fa4verify import mods as _mods
        return _mods.resolve(self.mods)

    @property
    def heads_differ(self) -> bool:
        """Whether the keep-mask depends on the query head (a mask pair declared ``by_head``:
        Note [Masks by head])."""
        mask = self.mod_pairs()[1] if self.mods else None
        per_head_blocks = self.call is not None and self.call.block_per_head    # Note [Block masks by head]
        return bool((mask is not None and mask.by_head) or per_head_blocks)

    @property
    def masked_lists(self) -> bool:
        """Whether FA4 gets block lists under a causal or window rule (Note [Block lists with
        causal or a window] in ``fa4verify.problem.calls``)."""
        return (self.call is not None and self.call.block_size is not None
                and (self.causal or tuple(self.window_size) != (None, None)))

    @property
    def rule_blocks_in_mask_lists(self) -> bool:
        """Whether FA4's forward gets this call's rule-cut blocks as mask blocks (Note [Rule-cut
        blocks in the mask lists] in ``fa4verify.problem.calls``): block lists under a causal or
        window rule on SM 10.x."""
        return self.masked_lists and _facts.is_sm100_family(self.arch)

    def rule_mask_blocks(self, listed: np.ndarray, seqlen_q: int, seqlen_k: int) -> np.ndarray:
        """Which of the ``listed`` blocks (a boolean grid on its last two axes, of the call's block
        size, for one sequence of lengths ``seqlen_q`` x ``seqlen_k``) FA4's SM 10.x forward gets as
        mask blocks (Note [Rule-cut blocks in the mask lists]): those where the causal / window
        rule keeps some but not every in-bounds pair, or none, and the block holding the
        sequence's last key where the block size does not divide ``seqlen_k``."""
        listed = np.asarray(listed, bool)
        bq, bk = self.call.block_size
        nq, nk = listed.shape[-2:]
        causal, local, left, right = resolve_window(self.causal, self.window_size)
        # each block's first and last in-bounds row and key; the rule (window_keep_mask: row i keeps
        # keys up to c_i = i + seqlen_k - seqlen_q, down to c_i - left) is monotone in both, so a
        # block is whole iff its corners are kept
        r0 = np.arange(nq)[:, None] * bq
        r1 = np.minimum(r0 + bq, seqlen_q) - 1
        k0 = np.arange(nk)[None, :] * bk
        k1 = np.minimum(k0 + bk, seqlen_k) - 1
        off = seqlen_k - seqlen_q
        whole = np.ones((nq, nk), bool)
        if causal:
            whole &= k1 <= r0 + off
        if local and left is not None:
            whole &= k0 >= r1 + off - left
        if local and right is not None:
            whole &= k1 <= r0 + off + right
        cut = ~whole
        if seqlen_k % bk and nk:
            cut[:, (seqlen_k - 1) // bk] = True
        return listed & cut

    def keep_masks(self, arrays: Optional[dict] = None, head: int = 0) -> list[np.ndarray]:
        """Per batch entry (varlen: per sequence), the boolean ``(len_q, len_k)`` keep-mask (True =
        attended) of query head ``head`` combining causal/local masking, the mask_mod pattern and
        a mask pair (its aux from ``arrays`` or its factory; on a varlen call at the
        sequence-local positions FA4 hands it). The same for every head unless
        :attr:`heads_differ`.

        Note [Masks by head]
        --------------------
        A mask pair may read the query head (``by_head``: a window per head). FA4 hands its
        mask_mod the logical query head, which under PackGQA it rebuilds from the packed row
        (``mask.py``: ``head_idx * qhead_per_kvhead + head_offset``): a fault there keeps another
        head's set and is visible only to a judge that keeps per head. Every reader of a
        head-dependent mask asks per head: the oracle's ``keep(b, h)``, the budget statistics,
        :meth:`fully_masked_rows`; readers that only need a superset of the attended keys (a
        key no head sees) take the union over heads."""
        out = []
        mask = self.mod_pairs()[1] if self.mods else None
        if mask is not None:
            from fa4verify import mods as _mods
            aux = _mods.aux_for(self, mask, arrays)
            bounds = self._seq_bounds()
            keeps = [np.broadcast_to(np.asarray(mask.ref(b, int(head), np.arange(lq)[:, None], np.arange(lk)[None, :],
                                                         aux), bool), (lq, lk))
                     for b, (_, lq, _, lk) in enumerate(bounds)]
            if self.call is not None and self.call.block_size is not None:    # Note [Partial blocks]
                keeps = [self.call.keep_mask(lq, lk, inner=m, seq=self.call.grid_seq(self, b), head=int(head))
                         for b, (m, (_, lq, _, lk)) in enumerate(zip(keeps, bounds))]
            return keeps
        for i, (_, lq, _, lk) in enumerate(self._seq_bounds()):
            if self.mask_mod is not None:
                out.append(self.mask_mod.keep_mask(lq, lk))
            else:
                out.append(window_keep_mask(lq, lk, causal=self.causal, window_size=self.window_size))
            extra = (self.call.keep_mask(lq, lk, seq=self.call.grid_seq(self, i), head=int(head))
                     if self.call is not None else None)
            if extra is not None:
                out[-1] = out[-1] & extra
        return out

    def fully_masked_rows(self) -> np.ndarray:
        """Boolean array in FA4's LSE layout: ``(batch, nheads, seqlen_q)`` dense, ``(nheads,
        total_q)`` varlen; True where a query row attends to no key (so O = 0 and, without a
        sink, LSE = -inf)."""
        per = []
        for h in (range(self.nheads) if self.heads_differ else (0,)):
            rows = [~m.any(axis=1) for m in self.keep_masks(head=h)]
            per.append((np.concatenate(rows) if rows else np.zeros(0, bool)) if self.varlen else np.stack(rows))
        if self.varlen:
            return np.broadcast_to(np.stack(per), (self.nheads, per[0].size)).copy()
        return np.broadcast_to(np.stack(per, axis=1), (self.batch, self.nheads, self.seqlen_q)).copy()

    # ------------------------------------------------------------------ arrays
    def shapes(self) -> dict[str, tuple[int, ...]]:
        if self.varlen:
            tq, tk = sum(self.seqlens_q), sum(self.seqlens_k)
            return {"q": (tq, self.nheads, self.head_dim), "k": (tk, self.nheads_kv, self.head_dim),
                    "v": (tk, self.nheads_kv, self.head_dim_v), "out": (tq, self.nheads, self.head_dim_v)}
        b, sq, sk = self.batch, self.seqlen_q, self.seqlen_k
        return {"q": (b, sq, self.nheads, self.head_dim), "k": (b, sk, self.nheads_kv, self.head_dim),
                "v": (b, sk, self.nheads_kv, self.head_dim_v), "out": (b, sq, self.nheads, self.head_dim_v)}

    def materialize(self) -> dict[str, Optional[np.ndarray]]:
        """Generate the arrays (deterministic in the problem's fields).

        Returns a dict with ``q, k, v, dout`` (float32 holding exact ``dtype`` values, FA4 layout),
        ``learnable_sink`` (float32 ``(nheads,)``, exact in bf16 and in :attr:`sink_dtype`, or
        None), ``cu_seqlens_q`` /
        ``cu_seqlens_k`` (int32 ``(batch + 1,)`` or None), ``mask`` (bool ``(batch, seqlen_q,
        seqlen_k)`` keep-mask when the problem has a mask_mod, else None) and ``q_descale`` /
        ``k_descale`` / ``v_descale`` (float32 ``(batch, nheads_kv)`` for the inputs in
        :attr:`descales`, else None).
        """
        sh = self.shapes()
        if self.varlen:
            key_pos = np.concatenate([np.arange(n) for n in self.seqlens_k] or [np.zeros(0, int)])
        else:
            key_pos = np.arange(self.seqlen_k)
        arrs = generate_values(self.values, dtype=self.dtype, q_shape=sh["q"], k_shape=sh["k"], v_shape=sh["v"],
                               key_positions=key_pos, softmax_scale=self.scale, nheads=self.nheads,
                               with_sink=self.sink)
        if self.sink_dtype == "fp16" and arrs.get("learnable_sink") is not None:   # exact in the sink's dtype
            arrs["learnable_sink"] = round_to_dtype(arrs["learnable_sink"], "fp16")
        arrs.update(generate_descales(self.values.seed, self.batch, self.nheads_kv, self.descales))
        arrs["cu_seqlens_q"] = arrs["cu_seqlens_k"] = None
        if self.varlen:
            arrs["cu_seqlens_q"] = np.concatenate([[0], np.cumsum(self.seqlens_q)]).astype(np.int32)
            arrs["cu_seqlens_k"] = np.concatenate([[0], np.cumsum(self.seqlens_k)]).astype(np.int32)
        if self.values.distribution == "edges":     # Note [Edge values]
            from fa4verify.problem.edges import plant_edges
            qk = {"q": arrs["q"].astype(np.float64), "k": arrs["k"].astype(np.float64)}
            fac = self._descale_factors(arrs)       # Note [FP8 descales]: plant the score in the descaled logits
            planted = plant_edges(self, {n: qk[n] * fac[n] for n in qk},
                                  score=self.values.param("score", 6.0), seed=self.values.seed)
            lim = INPUT_LIMIT[self.dtype]
            for n in ("q", "k"):
                arrs[n] = round_to_dtype(np.clip(planted[n] / fac[n], -lim, lim).astype(np.float32), self.dtype)
            arrs["edges"] = planted["edges"]
        if self.call is not None and self.call.mla:     # Note [MLA as a call form]: k's qv columns are v
            arrs["k"] = arrs["k"].copy()
            arrs["k"][..., self.head_dim - self.call.qv_dim:] = arrs["v"]
        arrs["mask"] = None
        if self.mask_mod is not None:
            arrs["mask"] = np.stack(self.keep_masks())
        return arrs

    def _descale_factors(self, arrs: dict) -> dict[str, Any]:
        """The float64 factor of every element of q and k (1.0 without descales): the judge's
        descaled inputs of arrays of ones (varlen: by sequence)."""
        if not self.descales:
            return {"q": 1.0, "k": 1.0}
        from fa4verify.judge.attention import effective_inputs
        d = effective_inputs(self, dict(arrs, **{n: np.ones(arrs[n].shape) for n in ("q", "k", "v")}))
        return {"q": d["q"], "k": d["k"]}

    def kwargs(self, arrays: Optional[dict] = None) -> dict[str, Any]:
        """Keyword arguments shared by the oracle, the twin and the adapter (the contract in
        common.md): ``softmax_scale, causal, window_size, softcap, learnable_sink, cu_seqlens_q,
        cu_seqlens_k``. The mask_mod pattern is not included (see ``materialize()["mask"]``)."""
        arrays = self.materialize() if arrays is None else arrays
        kw: dict[str, Any] = {"softmax_scale": self.softmax_scale, "causal": self.causal,
                              "window_size": tuple(self.window_size), "softcap": float(self.softcap),
                              "learnable_sink": arrays["learnable_sink"]}
        if self.varlen:
            kw["cu_seqlens_q"] = arrays["cu_seqlens_q"]
            kw["cu_seqlens_k"] = arrays["cu_seqlens_k"]
        return kw

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        return {"format": PROBLEM_FORMAT, "arch": self.arch, "dtype": self.dtype, "batch": self.batch,
                "seqlen_q": self.seqlen_q, "seqlen_k": self.seqlen_k, "nheads": self.nheads,
                "nheads_kv": self.nheads_kv, "head_dim": self.head_dim, "head_dim_v": self.head_dim_v,
                "causal": self.causal, "window_size": list(self.window_size), "softcap": self.softcap,
                "sink": self.sink, "softmax_scale": self.softmax_scale,
                "seqlens_q": list(self.seqlens_q) if self.varlen else None,
                "seqlens_k": list(self.seqlens_k) if self.varlen else None,
                "mask_mod": self.mask_mod.to_dict() if self.mask_mod else None,
                "values": self.values.to_dict(),
                **({"mods": list(self.mods), "mod_seed": self.mod_seed} if self.mods else {}),
                # only when set: the JSON (and digest) of a plain problem is unchanged
                **({"call": self.call.to_dict()} if self.call is not None else {}),
                **({"descales": list(self.descales)} if self.descales else {}),
                **({"sink_dtype": self.sink_dtype} if self.sink_dtype != "fp32" else {})}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "AttentionProblem":
        fmt = d.get("format", PROBLEM_FORMAT)
        if fmt != PROBLEM_FORMAT:
            raise ValueError(f"unknown problem format {fmt!r} (expected {PROBLEM_FORMAT!r})")
        ws = d.get("window_size") or (None, None)
        return cls(arch=d["arch"], dtype=d["dtype"], batch=int(d["batch"]), seqlen_q=int(d["seqlen_q"]),
                   seqlen_k=int(d["seqlen_k"]), nheads=int(d["nheads"]), nheads_kv=int(d["nheads_kv"]),
                   head_dim=int(d["head_dim"]), head_dim_v=int(d["head_dim_v"]), causal=bool(d.get("causal")),
                   window_size=(ws[0], ws[1]), softcap=float(d.get("softcap", 0.0)), sink=bool(d.get("sink")),
                   softmax_scale=d.get("softmax_scale"),
                   seqlens_q=tuple(d["seqlens_q"]) if d.get("seqlens_q") is not None else None,
                   seqlens_k=tuple(d["seqlens_k"]) if d.get("seqlens_k") is not None else None,
                   mask_mod=MaskMod.from_dict(d["mask_mod"]) if d.get("mask_mod") else None,
                   values=ValueSpec.from_dict(d.get("values", {"distribution": "normal", "seed": 0})),
                   mods=tuple(d.get("mods") or ()), mod_seed=int(d.get("mod_seed", 0)),
                   call=CallForm.from_dict(d["call"]) if d.get("call") else None,
                   descales=tuple(d.get("descales") or ()), sink_dtype=str(d.get("sink_dtype", "fp32")))

    def to_json(self, **kw: Any) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, **kw)

    @classmethod
    def from_json(cls, s: str) -> "AttentionProblem":
        return cls.from_dict(json.loads(s))

    def digest(self) -> str:
        """Short stable hash of the JSON form (names case files)."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:12]

    def replace(self, **changes: Any) -> "AttentionProblem":
        return replace(self, **changes)
