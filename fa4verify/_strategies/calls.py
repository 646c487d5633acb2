"""How FA4 is *called* for a problem, as opposed to what it computes: paged KV (``page_table``),
``seqused_k`` over batched K/V, block sparsity (``block_sparse_tensors``) and CuTe ``mask_mod``
callables (issue 16 item 8).

Note [Call forms keep the problem's meaning]
--------------------------------------------
A :class:`CallForm` never changes the mathematical function of its
:class:`~fa4verify._strategies.problem.AttentionProblem`; it says how the arrays reach FA4:

* ``seqused_k`` (no ``page_size``): the problem is varlen (``seqlens_q``, ``seqlens_k``); K/V are
  passed *batched* ``(batch, kv_capacity, hk, d)`` with sequence ``b``'s keys in rows
  ``[0, seqlens_k[b])`` and ``seqused_k = seqlens_k``; the rows past it hold finite filler
  (FA4 multiplies them by P = 0 on its TMA path: a NaN there is NaN in O, so real callers keep
  them finite). q is packed (``cu_seqlens_q``) or, with ``q_batched``, batched (all
  ``seqlens_q`` equal).
* ``page_size``: the same, with K/V as pages ``(num_pages, page_size, hk, d)`` and a
  ``page_table`` (``fa4verify.oracles.paged_kv.paginate``) whose page order is a permutation
  drawn from ``page_seed`` (None: identity). ``kv_capacity`` rounds up to whole pages, so last
  pages are partially filled. Pages no key uses hold finite filler unless ``hostile_nan``
  (then NaN: a stale KV-cache pool; only drawn when asked, known issue
  ``sm90_paged_tma_empty_seq_nan``).
* ``block_size``: the problem is dense (no causal/window/mask_mod/varlen) and FA4 gets
  ``block_sparse_tensors`` of a random block mask (``block_seed``, ``block_keep``; full blocks
  only); the problem's keep-mask is dense attention under that block mask
  (``fa4verify.oracles.block_sparse``).
* ``mask_mod_fn``: a named CuTe ``mask_mod`` from :func:`mask_mod_pairs` (each with its numpy
  keep-mask); the problem's keep-mask is that pattern.

The oracle and the judge see only the problem (with its keep-mask); the targets build the call.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import DrawFn

#: features of the call form that :func:`~fa4verify._strategies.problem.attention_problems` can
#: draw when asked (opt-in: the default ``FEATURES`` draws none of them)
CALL_FEATURES: tuple[str, ...] = ("seqused_k", "paged_kv", "block_sparse", "mask_mod_fn")

#: The score_mod / mask_mod pair feature (``fa4verify.mods``: a registered pair, yours included,
#: run through FA4's ``score_mod`` / ``mask_mod`` + ``aux_tensors``): opt-in like the call forms,
#: production-only (the twin refuses mod problems).
MOD_FEATURE = "mod_pairs"

#: page sizes drawn by default: 16 (FA4's cp.async path) and the forward tile_n (its TMA path:
#: ``interface.py`` ``paged_kv_tma = page_size == tile_n``), the two measured on the H200
DEFAULT_PAGE_SIZES: tuple[int, ...] = (16, -1)     # -1 = the head dim's tile_n


@dataclass(frozen=True)
class MaskModPair:
    """A CuTe ``mask_mod`` and its numpy keep-mask (True = attended): ``keep(seqlen_q, seqlen_k)``.
    ``load()`` returns the CuTe callable (None without the CUTLASS DSL). ``backward``: whether
    FA4's backward takes it here (the fuzz draws the backward only then)."""
    name: str
    keep: Callable[[int, int], np.ndarray]
    load: Callable[[], Any]
    backward: bool = False


def _builtin_pairs() -> dict[str, MaskModPair]:
    from fa4verify.kernels import mask_mods as mm
    return {"checkerboard_128": MaskModPair("checkerboard_128", mm.checkerboard_keep,
                                            lambda: mm.checkerboard_128)}


#: the source of mask_mod pairs (a zero-argument callable returning name -> MaskModPair); point
#: it at a registry of score/mask-mod pairs with :func:`set_mask_mod_source`
_SOURCE: list[Callable[[], Mapping[str, MaskModPair]]] = [_builtin_pairs]


def mask_mod_pairs() -> dict[str, MaskModPair]:
    """The mask_mod pairs the strategies draw from (name -> :class:`MaskModPair`)."""
    return dict(_SOURCE[0]())


def set_mask_mod_source(source: Optional[Callable[[], Mapping[str, MaskModPair]]]) -> None:
    """Draw mask_mods from ``source()`` (None: the built-in checkerboard)."""
    _SOURCE[0] = source if source is not None else _builtin_pairs


@dataclass(frozen=True)
class CallForm:
    """The call form of a problem (Note [Call forms keep the problem's meaning])."""
    seqused_k: bool = False
    q_batched: bool = False
    kv_capacity: int = 0
    page_size: Optional[int] = None
    page_seed: Optional[int] = None
    spare_pages: int = 0
    hostile_nan: bool = False
    block_size: Optional[tuple[int, int]] = None
    block_seed: int = 0
    block_keep: float = 0.5
    mask_mod_fn: Optional[str] = None

    def __post_init__(self) -> None:
        if self.block_size is not None:
            object.__setattr__(self, "block_size", tuple(int(x) for x in self.block_size))
        if self.page_size is not None and (int(self.page_size) < 1):
            raise ValueError(f"page_size={self.page_size} must be >= 1")
        if self.hostile_nan and self.page_size is None:
            raise ValueError("hostile_nan needs paged KV (page_size)")
        if self.page_size is not None and not self.seqused_k:
            object.__setattr__(self, "seqused_k", True)

    @property
    def paged(self) -> bool:
        return self.page_size is not None

    @property
    def keep_pattern(self) -> bool:
        """Whether the call form adds a keep-mask (block sparsity or a mask_mod callable)."""
        return self.block_size is not None or self.mask_mod_fn is not None

    def validate(self, problem: Any) -> None:
        """Raise ValueError when this call form cannot carry ``problem`` (FA4's constraints)."""
        if self.seqused_k:
            if not problem.varlen:
                raise ValueError("seqused_k / paged KV call forms need a varlen problem (seqlens_k = seqused_k)")
            if self.kv_capacity < max(problem.seqlens_k, default=0):
                raise ValueError(f"kv_capacity={self.kv_capacity} < max(seqlens_k)={max(problem.seqlens_k)}")
            if self.q_batched and len(set(problem.seqlens_q)) > 1:
                raise ValueError("q_batched needs equal seqlens_q")
            if self.q_batched and problem.seqlen_q == 0:
                raise ValueError("q_batched needs seqlen_q >= 1")
            if self.keep_pattern:
                raise ValueError("block sparsity / mask_mod are not drawn with paged KV or seqused_k")
        if self.keep_pattern:
            if self.block_size is not None and self.mask_mod_fn is not None:
                raise ValueError("block_size and mask_mod_fn are exclusive")
            if problem.varlen or problem.causal or problem.window_size != (None, None) or problem.mask_mod:
                raise ValueError("block sparsity / mask_mod_fn need a dense problem without causal, window or mask_mod")
            if self.mask_mod_fn is not None and self.mask_mod_fn not in mask_mod_pairs():
                raise ValueError(f"mask_mod_fn={self.mask_mod_fn!r}: not a registered pair "
                                 f"({', '.join(mask_mod_pairs()) or 'none'})")

    # ------------------------------------------------------------------ keep-masks
    def block_mask(self, seqlen_q: int, seqlen_k: int) -> Optional[np.ndarray]:
        """The (n_q_blocks, n_kv_blocks) boolean block mask (block sparsity), else None. Every
        query block keeps at least one KV block unless ``block_keep`` draws it empty."""
        if self.block_size is None:
            return None
        bq, bk = self.block_size
        nq, nk = -(-seqlen_q // bq), -(-seqlen_k // bk)
        rng = np.random.default_rng(self.block_seed)
        return rng.random((nq, nk)) < self.block_keep

    def keep_mask(self, seqlen_q: int, seqlen_k: int) -> Optional[np.ndarray]:
        """The (seqlen_q, seqlen_k) keep-mask this call form adds, or None."""
        if self.block_size is not None:
            from fa4verify.oracles.block_sparse import dense_mask
            return dense_mask(self.block_mask(seqlen_q, seqlen_k), self.block_size, seqlen_q, seqlen_k)
        if self.mask_mod_fn is not None:
            return np.asarray(mask_mod_pairs()[self.mask_mod_fn].keep(seqlen_q, seqlen_k), bool)
        return None

    # ------------------------------------------------------------------ JSON / labels
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if d["block_size"] is not None:
            d["block_size"] = list(d["block_size"])
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CallForm":
        known = {f.name for f in dataclasses.fields(cls)}
        bad = set(d) - known
        if bad:
            raise ValueError(f"unknown call-form key(s) {sorted(bad)}")
        kw = dict(d)
        if kw.get("block_size") is not None:
            kw["block_size"] = tuple(kw["block_size"])
        return cls(**kw)

    def describe(self) -> str:
        parts = []
        if self.paged:
            parts.append(f"paged(P={self.page_size}, perm={'id' if self.page_seed is None else self.page_seed}"
                         f"{', spare=' + str(self.spare_pages) if self.spare_pages else ''}"
                         f"{', NaN pool' if self.hostile_nan else ''})")
        elif self.seqused_k:
            parts.append(f"seqused_k(cap={self.kv_capacity})")
        if self.seqused_k:
            parts.append("q=batched" if self.q_batched else "q=packed")
        if self.block_size is not None:
            parts.append(f"block_sparse({self.block_size[0]}x{self.block_size[1]}, keep={self.block_keep:g}, "
                         f"#{self.block_seed})")
        if self.mask_mod_fn is not None:
            parts.append(f"mask_mod_fn={self.mask_mod_fn}")
        return " ".join(parts)

    def labels(self) -> dict[str, Any]:
        return {"paged_kv": self.page_size, "seqused_k": self.seqused_k,
                "block_sparse": None if self.block_size is None else f"{self.block_size[0]}x{self.block_size[1]}",
                "mask_mod_fn": self.mask_mod_fn, "hostile_nan": self.hostile_nan}


# ============================================================================ strategies
def sm90_tile_n(arch: str, head_dim: int, head_dim_v: int, causal: bool = False, local: bool = False) -> int:
    """FA4's forward tile_n for the head dims (the TMA page size)."""
    from fa4verify.kernels import facts
    return int(facts.kernel_constants(arch, "bf16", head_dim, head_dim_v, causal, local).tile_n)


def _used_lengths(draw: DrawFn, batch: int, cap: int, lo: int = 0) -> tuple[int, ...]:
    """Per-sequence seqused_k in [lo, cap]: biased to 0 (an empty sequence), cap and a page edge."""
    lo = min(lo, cap)
    edge = st.sampled_from(sorted({max(x, lo) for x in (0, cap, max(cap - 1, 0), min(1, cap))}))
    return tuple(draw(st.one_of(edge, st.integers(lo, cap))) for _ in range(batch))


@st.composite
def kv_call_forms(draw: DrawFn, problem: Any, *, paged: bool, page_sizes: tuple[int, ...] = DEFAULT_PAGE_SIZES,
                  hostile_nan: bool = False, min_used: int = 0) -> Any:
    """A problem with a ``seqused_k`` (``paged=False``) or paged-KV call form, derived from
    ``problem``: a dense problem becomes varlen with ``seqlens_q = (seqlen_q,) * batch`` (batched q)
    and drawn ``seqused_k`` (at least ``min_used``: a deployment's shortest context); a varlen
    problem keeps its lengths (packed q). ``page_sizes``: -1 means the head dim's tile_n (FA4's
    TMA path). Shrinks toward identity page order, no spare pages."""
    from fa4verify._strategies.masks import resolve_window
    if problem.mask_mod is not None:
        return problem                      # a boolean mask_mod pattern is dense-only
    if problem.varlen:
        sq_list, sk_list = problem.seqlens_q, problem.seqlens_k
        cap = max(sk_list) + draw(st.sampled_from((0, 0, 1, 7)))
        q_batched = False
    else:
        cap = problem.seqlen_k
        sq_list = (problem.seqlen_q,) * problem.batch
        sk_list = _used_lengths(draw, problem.batch, cap, min_used)
        q_batched = True
    base = problem.replace(seqlens_q=tuple(sq_list), seqlens_k=tuple(sk_list), seqlen_q=max(sq_list),
                           seqlen_k=max(sk_list), call=None)
    cap = max(cap, 1)
    if not paged:
        return base.replace(call=CallForm(seqused_k=True, q_batched=q_batched, kv_capacity=cap))
    causal, local, _, _ = resolve_window(problem.causal, problem.window_size)
    tn = sm90_tile_n(problem.arch, problem.head_dim, problem.head_dim_v, causal, local)
    sizes = sorted({tn if p == -1 else int(p) for p in page_sizes})
    P = draw(st.sampled_from(sizes))
    perm = draw(st.one_of(st.none(), st.integers(0, 2 ** 16)))
    spare = draw(st.sampled_from((0, 0, 1, 3)))
    cap = -(-cap // P) * P
    return base.replace(call=CallForm(seqused_k=True, q_batched=q_batched, kv_capacity=cap, page_size=P,
                                      page_seed=perm, spare_pages=spare, hostile_nan=bool(hostile_nan)))


@st.composite
def keep_call_forms(draw: DrawFn, problem: Any, *, block_sparse: bool, mask_mod_fn: bool) -> Any:
    """A dense non-causal problem with a block-sparse or mask_mod call form (causal/window are
    dropped; a varlen or boolean-mask_mod problem is returned unchanged). SM90 block sizes: q block 64 or 128 (a
    multiple of tile_m, or 64 with tile_m 64), kv block 64 or tile_n (FA4 shrinks tile_n to a
    smaller multiple of 16; a larger one must equal tile_n)."""
    if problem.varlen or problem.mask_mod is not None:
        return problem
    if problem.causal or problem.window_size != (None, None):
        # the family was drawn: FA4 takes causal/local masking here only inside a mask_mod
        problem = problem.replace(causal=False, window_size=(None, None))
    kinds = ([("block", None)] if block_sparse else []) + (
        [("mm", n) for n in sorted(mask_mod_pairs())] if mask_mod_fn else [])
    if not kinds:
        return problem
    kind, name = draw(st.sampled_from(kinds))
    if kind == "mm":
        return problem.replace(call=CallForm(mask_mod_fn=name))
    tn = sm90_tile_n(problem.arch, problem.head_dim, problem.head_dim_v)
    bq = draw(st.sampled_from((128, 64)))
    bk = draw(st.sampled_from(sorted({min(64, tn), tn})))
    return problem.replace(call=CallForm(block_size=(bq, bk), block_seed=draw(st.integers(0, 2 ** 16)),
                                         block_keep=draw(st.sampled_from((0.5, 0.75, 0.25, 1.0)))))


def check_call_features(features: Any) -> None:
    bad = set(features) - set(CALL_FEATURES)
    if bad:
        raise InvalidArgument(f"unknown call feature(s) {sorted(bad)} (known: {CALL_FEATURES})")
