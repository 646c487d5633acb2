"""AttentionProblem (a frozen, JSON-round-trippable description of one attention call) and the
``attention_problems`` composite strategy that draws them.

A problem holds only small integers, flags and a value seed; :meth:`AttentionProblem.materialize`
generates the arrays with numpy. Layout follows FA4: dense ``(batch, seqlen, nheads, head_dim)``;
varlen ``(total, nheads, head_dim)`` with ``cu_seqlens`` (int32, length batch + 1).
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from typing import Any, Collection, Optional

import numpy as np
from hypothesis import reject, strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import DrawFn

from fa4verify._strategies.calls import CALL_FEATURES, DEFAULT_PAGE_SIZES, MOD_FEATURE, CallForm, keep_call_forms, \
    kv_call_forms
from fa4verify._strategies.masks import MaskMod, Window, causal_and_windows, mask_mods, resolve_window, \
    softcaps, varlen_seqlens, window_keep_mask
from fa4verify._strategies.shapes import ARCHS, DTYPES, check_arch, check_dtype, check_head_dims, head_counts, \
    head_dims, seqlen_pairs
from fa4verify.kernels import facts as _facts
from fa4verify._strategies.values import DISTRIBUTIONS, ValueSpec, generate_values, value_specs

#: JSON schema tag written by :meth:`AttentionProblem.to_dict`.
PROBLEM_FORMAT = "fa4verify-attention-problem/1"

#: Optional features :func:`attention_problems` can switch on (all by default).
FEATURES: tuple[str, ...] = ("causal", "local", "softcap", "sink", "varlen", "mask_mod", "gqa")


@dataclass(frozen=True)
class AttentionProblem:
    """One attention problem: shapes, masking, score modifiers and a value recipe.

    Fields (all plain Python values, so a problem hashes, compares and round-trips JSON):

    * ``arch``: "sm90" | "sm100"; ``dtype``: "bf16" | "fp16" (q, k, v, dout are exact in it).
    * ``batch, seqlen_q, seqlen_k, nheads, nheads_kv, head_dim, head_dim_v``. For varlen problems
      ``seqlen_q``/``seqlen_k`` are the maxima of ``seqlens_q``/``seqlens_k`` and ``batch`` their length.
    * ``causal``, ``window_size=(left, right)`` (FA4 semantics, :mod:`fa4verify._strategies.masks`).
    * ``softcap`` (0.0 = off), ``sink`` (learnable per-head sink present), ``softmax_scale``
      (None = FA4's default ``1/sqrt(head_dim)``).
    * ``seqlens_q``/``seqlens_k``: per-sequence lengths of a varlen batch (zeros allowed), or None.
    * ``mask_mod``: a boolean keep-pattern (:class:`MaskMod`) or None; never together with
      causal/window/varlen.
    * ``values``: the :class:`ValueSpec` the arrays are generated from.
    * ``call``: how FA4 is called (:class:`~fa4verify._strategies.calls.CallForm`: paged KV,
      seqused_k, block sparsity, a CuTe mask_mod), or None for the plain call; it never changes
      what the problem computes beyond the keep-mask it adds (Note [Call forms keep the
      problem's meaning]).
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

    def __post_init__(self) -> None:
        # the one problem type of fa4verify: every arch and dtype FA4 has (the strategies draw
        # a subset: shapes.ARCHS / shapes.DTYPES)
        if self.arch not in _facts.ARCHS:
            raise InvalidArgument(f"arch={self.arch!r} is not supported; expected one of {_facts.ARCHS}")
        if self.dtype not in _facts.DTYPES:
            raise InvalidArgument(f"dtype={self.dtype!r} is not supported; expected one of {_facts.DTYPES}")
        if self.arch in ARCHS and self.dtype in DTYPES:
            check_head_dims(self.arch, self.head_dim, self.head_dim_v)
        elif not _facts.head_dims_supported(self.arch, self.head_dim, self.head_dim_v, self.dtype):
            raise InvalidArgument(f"(head_dim, head_dim_v)=({self.head_dim}, {self.head_dim_v}) is not "
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
        object.__setattr__(self, "window_size", tuple(self.window_size))
        object.__setattr__(self, "mods", tuple(self.mods))
        if self.mods:
            score, mask = self.mod_pairs()
            if self.varlen or self.mask_mod is not None:
                raise ValueError("mods cannot be combined with varlen or a MaskMod pattern (dense problems only)")
            if self.call is not None:
                raise ValueError("mods cannot be combined with an FA4 call form (paged KV, seqused_k, "
                                 "block sparsity, a named mask_mod) yet")
            if mask is not None and (self.causal or self.window_size != (None, None)):
                raise ValueError(f"mask pair {mask.name!r} with causal/window: FA4 drops causal and the window "
                                 f"when a mask_mod is given; write them into the mask")
            if score is not None and self.softcap:
                raise ValueError("a score pair and softcap cannot be combined (FA4 asserts)")
            for p_ in (score, mask):
                if p_ is not None and p_.self_attention_only and self.seqlen_q != self.seqlen_k:
                    raise ValueError(f"mod pair {p_.name!r} needs seqlen_q == seqlen_k")
        if self.call is not None:
            self.call.validate(self)

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
                **(self.call.labels() if self.call is not None else {})}

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
            parts.append("sink")
        if self.softmax_scale is not None:
            parts.append(f"scale={self.softmax_scale:g}")
        if self.mask_mod:
            parts.append(f"mask_mod={self.mask_mod.kind}({self.mask_mod.param})")
        if self.mods:
            parts.append("mods=" + "+".join(self.mods) + (f"#{self.mod_seed}" if self.mod_seed else ""))
        if self.call is not None:
            parts.append(self.call.describe())
        parts.append(f"values={self.values.distribution}#{self.values.seed}")
        return " ".join(parts)

    def _seq_bounds(self) -> list[tuple[int, int, int, int]]:
        """``(q_start, q_len, k_start, k_len)`` per batch entry, along the varlen token axis
        (dense problems: starts are 0 and lengths the full seqlens)."""
        if not self.varlen:
            return [(0, self.seqlen_q, 0, self.seqlen_k)] * self.batch
        cq = np.concatenate([[0], np.cumsum(self.seqlens_q)])
        ck = np.concatenate([[0], np.cumsum(self.seqlens_k)])
        return [(int(cq[b]), self.seqlens_q[b], int(ck[b]), self.seqlens_k[b]) for b in range(self.batch)]

    def mod_pairs(self):
        """``(score pair, mask pair)`` named by :attr:`mods` (None where absent)."""
        from fa4verify import mods as _mods
        return _mods.resolve(self.mods)

    def keep_masks(self, arrays: Optional[dict] = None) -> list[np.ndarray]:
        """Per batch entry, the boolean ``(len_q, len_k)`` keep-mask (True = attended) combining
        causal/local masking, the mask_mod pattern and a mask pair (its aux from ``arrays`` or its
        factory). Independent of heads."""
        out = []
        mask = self.mod_pairs()[1] if self.mods else None
        if mask is not None:
            from fa4verify import mods as _mods
            aux = _mods.aux_for(self, mask, arrays)
            qi = np.arange(self.seqlen_q)[:, None]
            ki = np.arange(self.seqlen_k)[None, :]
            return [np.broadcast_to(np.asarray(mask.ref(b, 0, qi, ki, aux), bool), (self.seqlen_q, self.seqlen_k))
                    for b in range(self.batch)]
        for _, lq, _, lk in self._seq_bounds():
            if self.mask_mod is not None:
                out.append(self.mask_mod.keep_mask(lq, lk))
            else:
                out.append(window_keep_mask(lq, lk, causal=self.causal, window_size=self.window_size))
            extra = self.call.keep_mask(lq, lk) if self.call is not None else None
            if extra is not None:
                out[-1] = out[-1] & extra
        return out

    def fully_masked_rows(self) -> np.ndarray:
        """Boolean array in FA4's LSE layout: ``(batch, nheads, seqlen_q)`` dense, ``(nheads,
        total_q)`` varlen; True where a query row attends to no key (so O = 0 and, without a
        sink, LSE = -inf)."""
        rows = [~m.any(axis=1) for m in self.keep_masks()]
        if self.varlen:
            flat = np.concatenate(rows) if rows else np.zeros(0, bool)
            return np.broadcast_to(flat[None, :], (self.nheads, flat.size)).copy()
        return np.broadcast_to(np.stack(rows)[:, None, :], (self.batch, self.nheads, self.seqlen_q)).copy()

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
        ``learnable_sink`` (float32 ``(nheads,)``, bf16-exact, or None), ``cu_seqlens_q`` /
        ``cu_seqlens_k`` (int32 ``(batch + 1,)`` or None) and ``mask`` (bool ``(batch, seqlen_q,
        seqlen_k)`` keep-mask when the problem has a mask_mod, else None).
        """
        sh = self.shapes()
        if self.varlen:
            key_pos = np.concatenate([np.arange(n) for n in self.seqlens_k] or [np.zeros(0, int)])
        else:
            key_pos = np.arange(self.seqlen_k)
        arrs = generate_values(self.values, dtype=self.dtype, q_shape=sh["q"], k_shape=sh["k"], v_shape=sh["v"],
                               key_positions=key_pos, softmax_scale=self.scale, nheads=self.nheads,
                               with_sink=self.sink)
        if self.values.distribution == "edges":     # Note [Edge values]
            from fa4verify._strategies.edges import plant_edges
            from fa4verify._strategies.values import round_to_dtype
            planted = plant_edges(self, {"q": arrs["q"].astype(np.float64), "k": arrs["k"].astype(np.float64)},
                                  score=self.values.param("score", 6.0), seed=self.values.seed)
            lim = 16384.0 if self.dtype == "fp16" else 1e30
            for n in ("q", "k"):
                arrs[n] = round_to_dtype(np.clip(planted[n], -lim, lim).astype(np.float32), self.dtype)
            arrs["edges"] = planted["edges"]
        arrs["cu_seqlens_q"] = arrs["cu_seqlens_k"] = None
        if self.varlen:
            arrs["cu_seqlens_q"] = np.concatenate([[0], np.cumsum(self.seqlens_q)]).astype(np.int32)
            arrs["cu_seqlens_k"] = np.concatenate([[0], np.cumsum(self.seqlens_k)]).astype(np.int32)
        arrs["mask"] = None
        if self.mask_mod is not None:
            arrs["mask"] = np.stack(self.keep_masks())
        return arrs

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
                **({"call": self.call.to_dict()} if self.call is not None else {})}

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
                   call=CallForm.from_dict(d["call"]) if d.get("call") else None)

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


def _arch_features(arch: str, head_dim: int, head_dim_v: int) -> set[str]:
    """Features FA4 lacks for a head-dim pair: SM100's dedicated (256, 256) kernel has no softcap,
    sinks, local windows or mask_mod (fa4_numerics.md section 9.2)."""
    if arch in ("sm100", "sm103") and (head_dim, head_dim_v) == (256, 256):
        return {"softcap", "sink", "local", "mask_mod"}
    return set()


@st.composite
def attention_problems(draw: DrawFn, *, dtype: Optional[str] = None, arch: str = "sm90", max_seqlen: int = 256,
                       max_batch: int = 3, max_heads: int = 4, max_head_dim: int = 128,
                       features: Collection[str] = FEATURES, distributions: Optional[Collection[str]] = None,
                       max_work: Optional[int] = None,
                       head_dim_choices: Optional[Collection[Any]] = None,
                       page_sizes: Collection[int] = DEFAULT_PAGE_SIZES,
                       hostile_nan: bool = False,
                       head_count_choices: Optional[Collection[tuple[int, int]]] = None,
                       seqlen_q_range: Optional[tuple[int, int]] = None,
                       seqlen_k_range: Optional[tuple[int, int]] = None,
                       mask_choices: Optional[Collection[str]] = None,
                       window_choices: Collection[tuple[int, int]] = (),
                       softcap_choices: Optional[Collection[float]] = None,
                       sinks: Optional[bool] = None) -> AttentionProblem:
    """Draw an :class:`AttentionProblem` that FA4 accepts on ``arch``. Never runs a kernel.

    Arguments (all keyword-only):

    * ``dtype``: "bf16" or "fp16"; None draws either (bf16 first).
    * ``arch``: "sm90" (head dims 8..256, multiples of 8) or "sm100" (8..128, (192, 128),
      (256, 256)); unsupported values raise :class:`InvalidArgument`.
    * ``max_seqlen`` (>= 1): bound on every sequence length, inclusive. Lengths are biased to
      tile edges (1, 63/64/65, 127/128/129, ..., ``2^k +- 1``), with ``seqlen_q != seqlen_k``
      drawn in both directions.
    * ``max_batch`` (>= 1), ``max_heads`` (>= 1), ``max_head_dim`` (>= 8): inclusive bounds.
    * ``features``: subset of :data:`FEATURES` allowed to appear. Each is drawn on or off
      (off shrinks first). Features FA4 lacks for a drawn head dim are switched off.
    * ``distributions``: subset of :data:`~fa4verify._strategies.values.DISTRIBUTIONS`.
    * ``max_work``: optional bound on :attr:`AttentionProblem.work`; larger draws are rejected
      with ``assume`` (keep it generous: rejection costs examples).
    * ``head_dim_choices``: only these head dims (an int ``d`` is ``(d, d)``, a pair is
      ``(head_dim, head_dim_v)``; each must be valid on ``arch``; ``max_head_dim`` is then ignored).
    * confinement to a deployment (Note [Confined draws]; each None / empty = drawn as usual):
      ``head_count_choices`` ((nheads, nheads_kv) pairs; ``max_heads`` and the gqa feature are then
      ignored), ``seqlen_q_range`` / ``seqlen_k_range`` ((min, max) of every sequence, the
      maximum clipped to ``max_seqlen`` but never below the minimum; a varlen sequence is empty
      only where its side's minimum is 0),
      ``mask_choices`` (any of "none", "causal", "window") with ``window_choices`` ((left, right)
      windows), ``softcap_choices`` (values, 0 = off), ``sinks`` (always / never). A drawn head
      dim for which FA4 lacks every allowed choice (SM100's (256, 256): no window, softcap or
      sink) is rejected.
    * call features (opt-in, :data:`~fa4verify._strategies.calls.CALL_FEATURES` in ``features``):
      ``"paged_kv"`` / ``"seqused_k"`` (one of them, or neither, per problem: a varlen problem run
      with batched K/V, paged with ``page_sizes`` (-1 = the head dim's tile_n) and a random page
      permutation), ``"block_sparse"`` / ``"mask_mod_fn"`` (dense non-causal problems). NaN in
      unused pages only with ``hostile_nan=True``.

    Never generates: fp8, MLA head dims, empty dense sequences, NaN/Inf inputs, a mask_mod together
    with causal/window/varlen, or a varlen batch with no query row. Values are exact in ``dtype``.
    Shrinks toward: bf16, batch 1, one head, head dim 8, seqlen 1, no features, standard normal
    values with seed 0.
    """
    check_arch(arch)
    if dtype is not None:
        check_dtype(dtype)
    for name, val, lo in (("max_seqlen", max_seqlen, 1), ("max_batch", max_batch, 1), ("max_heads", max_heads, 1),
                          ("max_head_dim", max_head_dim, 8)):
        if not isinstance(val, int) or val < lo:
            raise InvalidArgument(f"{name}={val!r} must be an int >= {lo}")
    feats = set(features)
    unknown = feats - set(FEATURES) - set(CALL_FEATURES) - {MOD_FEATURE}
    if unknown:
        raise InvalidArgument(f"features={sorted(features)!r}: unknown {sorted(unknown)} "
                              f"(known: {FEATURES + CALL_FEATURES + (MOD_FEATURE,)})")
    for p in page_sizes:
        if not isinstance(p, int) or not (p == -1 or p >= 1):
            raise InvalidArgument(f"page_sizes={tuple(page_sizes)!r}: each must be an int >= 1 (or -1: tile_n)")
    if distributions is not None:
        bad = set(distributions) - set(DISTRIBUTIONS)
        if bad or not distributions:
            raise InvalidArgument(f"distributions={distributions!r}: unknown {sorted(bad)} (known: {DISTRIBUTIONS})")

    if max_work is not None and (seqlen_q_range or seqlen_k_range or head_count_choices):
        # Note [Confined draws]: a deployment whose smallest problem exceeds the size bound has
        # nothing to draw; say so at once instead of rejecting every draw
        hds = [(c, c) if isinstance(c, int) else tuple(c) for c in head_dim_choices or ((8, 8),)]
        smallest = (_clip_range(seqlen_q_range, max_seqlen)[0] * _clip_range(seqlen_k_range, max_seqlen)[0]
                    * min((int(h) for h, _ in head_count_choices or ((1, 1),)))
                    * min(int(a) + int(b) for a, b in hds))
        if smallest > max_work:
            raise InvalidArgument(f"the smallest confined problem (work {smallest:,}: seqlens {seqlen_q_range} x "
                                  f"{seqlen_k_range}, heads {tuple(head_count_choices or ())}) exceeds "
                                  f"max_work={max_work:,}")
    dt = dtype if dtype is not None else draw(st.sampled_from(("bf16", "fp16")))
    hd, hdv = draw(head_dims(arch=arch, max_head_dim=max_head_dim,
                             choices=tuple(head_dim_choices) if head_dim_choices is not None else None))
    feats -= _arch_features(arch, hd, hdv)
    if head_count_choices is not None:
        nheads, nheads_kv = draw(st.sampled_from(sorted((int(h), int(k)) for h, k in head_count_choices)))
    else:
        nheads, nheads_kv = draw(head_counts(max_heads=max_heads, gqa="gqa" in feats))
    batch = draw(st.integers(1, max_batch))
    confined = seqlen_q_range is not None or seqlen_k_range is not None
    qr, kr = _clip_range(seqlen_q_range, max_seqlen), _clip_range(seqlen_k_range, max_seqlen)
    use_varlen = "varlen" in feats and draw(st.booleans())
    if use_varlen:
        sq_list, sk_list = draw(varlen_seqlens(batch=batch, max_seqlen=max_seqlen,
                                               q_range=qr if confined else None, k_range=kr if confined else None))
        sq, sk = max(sq_list), max(sk_list)
    else:
        sq_list = sk_list = None
        if confined:                        # a dense sequence is never empty
            sq, sk = draw(seqlen_pairs(min_seqlen=max(1, qr[0]), max_seqlen=qr[1], min_seqlen_k=max(1, kr[0]),
                                       max_seqlen_k=kr[1]))
        else:
            sq, sk = draw(seqlen_pairs(max_seqlen=max_seqlen))
    # a registered score_mod / mask_mod pair (the mod_pairs feature): dense problems only, about
    # one in three of them; no MaskMod pattern, sink or call form with it (what mod_problems draws)
    use_mods = (MOD_FEATURE in feats and not use_varlen and not sinks
                and draw(st.sampled_from((False, False, True))))
    mm = None
    causal, window = False, (None, None)
    if "mask_mod" in feats and not use_varlen and not use_mods and draw(st.booleans()):
        mm = draw(mask_mods(seqlen_q=sq, seqlen_k=sk))
    elif mask_choices is not None:
        masks = [m for m in ("none", "causal", "window") if m in mask_choices
                 and (m != "window" or "local" in feats)]
        if not masks:
            reject()                        # FA4 has none of the deployment's masks for this head dim
        m = draw(st.sampled_from(masks))
        if m == "causal":
            causal = True
        elif m == "window":
            window = draw(st.sampled_from(sorted((int(a), int(b)) for a, b in window_choices)))
    elif "causal" in feats or "local" in feats:
        causal, window = draw(causal_and_windows(seqlen_q=max(sq, 1), seqlen_k=max(sk, 1),
                                                 local="local" in feats, causal="causal" in feats))
        if "causal" not in feats and resolve_window(causal, window)[0]:
            causal, window = False, (None, None)   # e.g. (None, 0) is causal in FA4's resolution
    if softcap_choices is not None:
        caps = sorted({float(c) for c in softcap_choices if c == 0 or "softcap" in feats})
        if not caps:
            reject()
        softcap = draw(st.sampled_from(caps))
    else:
        softcap = draw(softcaps()) if "softcap" in feats and draw(st.booleans()) else 0.0
    if sinks is not None:
        if sinks and "sink" not in feats:
            reject()
        sink = bool(sinks)
    else:
        sink = "sink" in feats and not use_mods and draw(st.booleans())
    scale = draw(st.sampled_from((None, None, None, 1.0, 0.0625)))
    values = draw(value_specs(dtype=dt, distributions=tuple(distributions) if distributions else None, sinks=sink))
    prob = AttentionProblem(arch=arch, dtype=dt, batch=batch, seqlen_q=sq, seqlen_k=sk, nheads=nheads,
                            nheads_kv=nheads_kv, head_dim=hd, head_dim_v=hdv, causal=causal, window_size=window,
                            softcap=softcap, sink=sink, softmax_scale=scale, seqlens_q=sq_list, seqlens_k=sk_list,
                            mask_mod=mm, values=values)
    kv = [f for f in ("paged_kv", "seqused_k") if f in feats]
    keep = "block_sparse" in feats or "mask_mod_fn" in feats
    if use_mods:
        prob = draw(_with_mod_pair(prob))
    elif kv or keep:
        # one call-form family per problem; "plain" first so it shrinks away
        fam = draw(st.sampled_from(["plain"] + kv + (["keep"] if keep else [])))
        if fam in ("paged_kv", "seqused_k"):
            prob = draw(kv_call_forms(prob, paged=fam == "paged_kv", page_sizes=tuple(page_sizes),
                                      hostile_nan=hostile_nan, min_used=kr[0] if confined else 0))
        elif fam == "keep":
            prob = draw(keep_call_forms(prob, block_sparse="block_sparse" in feats,
                                        mask_mod_fn="mask_mod_fn" in feats))
    if confined and not _in_ranges(prob, qr, kr):
        reject()                            # e.g. a self-attention mod pair's seqlen_k = seqlen_q
    if max_work is not None:
        from hypothesis import assume
        assume(prob.work <= max_work)
    return prob


def _clip_range(r: Optional[tuple[int, int]], max_seqlen: int) -> tuple[int, int]:
    """A deployment's (min, max) sequence range under the draw's ``max_seqlen``: the maximum is
    clipped to it, never below the minimum (the deployment's shortest sequence is still drawn).
    Without a range: empty varlen sequences allowed, as unconfined draws have them."""
    lo, hi = (0, max_seqlen) if r is None else (max(0, int(r[0])), int(r[1]))
    return lo, max(lo, 1, min(hi, max_seqlen))


def _in_ranges(p: AttentionProblem, qr: tuple[int, int], kr: tuple[int, int]) -> bool:
    qs, ks = (p.seqlens_q, p.seqlens_k) if p.varlen else ((p.seqlen_q,), (p.seqlen_k,))
    return all(qr[0] <= x <= qr[1] for x in qs) and all(kr[0] <= x <= kr[1] for x in ks)


# Note [Confined draws]
# ---------------------
# A deployment profile says what a team runs; a fuzz draw for it must lie inside it in every
# dimension the profile names, or a passing audit vouches for shapes the team never runs while
# the team's own shapes go unchecked (issue 26: 0 of 38 draws inside a hd-128, 32/8-head,
# seqlen 4096..8192 profile). The confinement arguments choose among the profile's values (head
# dims and pairs, head counts, masks and windows, softcaps, sinks) instead of switching features
# on and off, and draw every sequence length inside the profile's range. The draw's size bound
# (``max_seqlen``, a CPU budget) clips the range from above but never below its minimum: the
# shortest sequence the deployment runs is drawn even when it is longer than the bound; the
# ``max_work`` bound (the CPU judge's cost) still holds, and a deployment whose smallest problem
# exceeds it is refused by name (InvalidArgument), never drawn outside the profile nor left empty.
# tests/test_deployment_confinement.py checks every shipped profile on the audit's own draw.


@st.composite
def _with_mod_pair(draw: DrawFn, prob: AttentionProblem) -> AttentionProblem:
    """``prob`` with one registered score_mod / mask_mod pair (the ``mod_pairs`` feature of
    :func:`attention_problems`), under the same constraints as :func:`mod_problems`: a mask pair
    drops causal and the window (FA4 ignores them with a mask_mod), a score pair drops softcap,
    a self-attention pair gets ``seqlen_k = seqlen_q``."""
    from fa4verify import mods as _mods
    names = _mods.names()
    if not names:
        return prob
    name = draw(st.sampled_from(names))
    pair = _mods.get(name)
    sk = prob.seqlen_q if pair.self_attention_only else prob.seqlen_k
    causal = bool(prob.causal) and pair.kind == "score" and prob.window_size == (None, None)
    return prob.replace(seqlen_k=sk, causal=causal, window_size=(None, None), softcap=0.0, mods=(name,),
                        mod_seed=draw(st.integers(0, 3)))


@st.composite
def mod_problems(draw: DrawFn, *, mods: Optional[Collection[str]] = None, arch: str = "sm90",
                 dtype: Optional[str] = None, max_seqlen: int = 256, max_batch: int = 2, max_heads: int = 4,
                 max_head_dim: int = 128, distributions: Optional[Collection[str]] = None,
                 head_dim_choices: Optional[Collection[Any]] = None,
                 head_count_choices: Optional[Collection[tuple[int, int]]] = None,
                 seqlen_q_range: Optional[tuple[int, int]] = None,
                 seqlen_k_range: Optional[tuple[int, int]] = None) -> AttentionProblem:
    """Draw a dense :class:`AttentionProblem` with one registered score_mod / mask_mod pair
    (``fa4verify.mods``; ``mods``: the names to draw from, default every registered pair, yours
    included). Score pairs may come with causal masking (FA4 keeps it with a score_mod); mask
    pairs never (FA4 drops causal and windows with a mask_mod). Pairs that need
    ``seqlen_q == seqlen_k`` get it. The aux tensors come from the pair's factory at the drawn
    ``mod_seed`` (0..3). Never generates: varlen, softcap, sinks, MaskMod patterns. The head dims,
    head counts and sequence ranges confine the draw as in :func:`attention_problems`. Shrinks
    toward the first name in sorted order, then as :func:`attention_problems`."""
    from fa4verify import mods as _mods
    names = sorted(mods) if mods is not None else _mods.names()
    if not names:
        raise InvalidArgument("mods: no pair names to draw from")
    for n in names:
        _mods.get(n)                       # unknown names fail here, with the registry's message
    name = draw(st.sampled_from(names))
    pair = _mods.get(name)
    feats = {"gqa"} | ({"causal"} if pair.kind == "score" else set())
    base = draw(attention_problems(arch=arch, dtype=dtype, max_seqlen=max_seqlen, max_batch=max_batch,
                                   max_heads=max_heads, max_head_dim=max_head_dim, features=feats,
                                   distributions=distributions, head_dim_choices=head_dim_choices,
                                   head_count_choices=head_count_choices, seqlen_q_range=seqlen_q_range,
                                   seqlen_k_range=seqlen_k_range))
    sk = base.seqlen_q if pair.self_attention_only else base.seqlen_k
    if seqlen_k_range is not None and not seqlen_k_range[0] <= sk <= seqlen_k_range[1]:
        reject()
    causal = bool(base.causal) and pair.kind == "score"
    return base.replace(seqlen_k=sk, causal=causal, window_size=(None, None), mods=(name,),
                        mod_seed=draw(st.integers(0, 3)))


def sibling_key(problem: AttentionProblem) -> str:
    """What a sibling keeps of its problem (:func:`problem_groups`): everything but the values
    and, for a varlen problem with the plain call, the per-sequence lengths. Equal keys in a row
    of a drawn campaign are one group."""
    d = problem.to_dict()
    d.pop("values", None)
    if problem.varlen and problem.call is None:
        d.pop("seqlens_q", None)
        d.pop("seqlens_k", None)
    return json.dumps(d, sort_keys=True)


@st.composite
def problem_groups(draw: DrawFn, problems: st.SearchStrategy[AttentionProblem], *, siblings: int,
                   distributions: Optional[Collection[str]] = None,
                   max_work: Optional[int] = None, seqlen_q_range: Optional[tuple[int, int]] = None,
                   seqlen_k_range: Optional[tuple[int, int]] = None) -> list[AttentionProblem]:
    """A drawn problem followed by ``siblings`` problems that run the same FA4 kernels with other
    inputs (Note [Siblings share compile keys]).

    Each sibling has its own :class:`ValueSpec` (distribution, parameters and seed drawn as by
    :func:`value_specs`); a varlen problem's siblings also get new per-sequence lengths, tile-edge
    biased in ``[0, max]``, with the batch's maxima kept (FA4 compiles for the maxima, never for
    the lengths: cu_seqlens are run-time data), unless they would exceed ``max_work`` (the bound
    :func:`attention_problems` drew under): then the sibling keeps the lengths; with
    ``seqlen_q_range`` / ``seqlen_k_range`` (a deployment's) they stay inside them. Everything
    else -- head dims, head counts, masks, softcap, sink, scale, call form, mods -- is the drawn
    problem's.

    Note [Siblings share compile keys]: a production fuzz example costs FA4 compiles (1 to 4 s each
    on the H200, measured) for every kernel it is the first to need; a campaign of distinct draws
    compiled 80 kernels for 50 examples (session 7). What selects FA4's kernel is the key built
    in ``flash_attn.cute.interface`` from dtypes, head dims, flags, tiles and, through heuristics
    (split-KV, single-block backward), the maximal sequence lengths -- not the input values and
    not the lengths of a varlen batch below its maxima. A sibling keeps every one of those, so it
    reuses its group's kernels: the audit measures it (``example_kernels`` in the fuzz result,
    Note [Compile keys in the timeline]) rather than trusting this model. A sibling that compiles
    anyway is only slower, never less checked: every example is judged in full.
    """
    from fa4verify._strategies.shapes import seqlen_edges
    if siblings < 0:
        raise InvalidArgument(f"siblings={siblings} must be >= 0")
    p = draw(problems)
    out = [p]
    for _ in range(siblings):
        q = p.replace(values=draw(value_specs(dtype=p.dtype, distributions=tuple(distributions) if distributions
                                               else None, sinks=p.sink)))
        if p.varlen and p.call is None and p.batch > 1:
            lens = []
            for m, rng in ((p.seqlen_q, seqlen_q_range), (p.seqlen_k, seqlen_k_range)):
                if rng is not None:                # inside the deployment's range (0: empty allowed)
                    edges = (seqlen_edges(m, min_seqlen=min(max(1, int(rng[0])), m)) or (m,)) if m >= 1 else (0,)
                    edges = ((0,) if int(rng[0]) == 0 and m >= 1 else ()) + edges
                else:
                    edges = (0,) + seqlen_edges(m) if m >= 1 else (0,)
                xs = [draw(st.sampled_from(edges)) for _ in range(p.batch)]
                xs[draw(st.integers(0, p.batch - 1))] = m     # the maximum stays: the same kernel
                lens.append(tuple(xs))
            try:
                r = q.replace(seqlens_q=lens[0], seqlens_k=lens[1])
            except ValueError:
                r = q                      # lengths this problem cannot take: the values only
            if max_work is None or r.work <= max_work:
                q = r
        out.append(q)
    return out
