"""How FA4 is *called* for a problem, as opposed to what it computes: paged KV (``page_table``),
``seqused_k`` over batched K/V, ``seqused_q`` over batched Q, block sparsity
(``block_sparse_tensors``), CuTe ``mask_mod`` callables and FA4's ``pack_gqa`` switch.

Note [Call forms keep the problem's meaning]
--------------------------------------------
A :class:`CallForm` never changes the mathematical function of its
:class:`~fa4verify.problem.AttentionProblem`; it says how the arrays reach FA4:

* ``seqused_k`` (no ``page_size``): the problem is varlen (``seqlens_q``, ``seqlens_k``); K/V are
  passed *batched* ``(batch, kv_capacity, hk, d)`` with sequence ``b``'s keys in rows
  ``[0, seqlens_k[b])`` and ``seqused_k = seqlens_k``; the rows past it hold finite filler
  (FA4 multiplies them by P = 0 on its TMA path: a NaN there is NaN in O, so real callers keep
  them finite). q is packed (``cu_seqlens_q``) or, with ``q_batched``, batched (all
  ``seqlens_q`` equal).
* ``q_batched`` alone: FA4's batched call of a varlen problem whose sequences are all of one
  length (``seqlens_q`` equal, ``seqlens_k`` equal): Q ``(batch, seqlen_q, h, d)``, K/V
  ``(batch, seqlen_k, hk, d)``, no ``cu_seqlens`` or ``seqused``. Either length may be 0: FA4's
  batched empty input (its early returns: O = 0, LSE -inf or the sink; zero gradients, dsink
  from dLSE), which a dense problem cannot state.
* ``seqused_q``: the problem is varlen; Q and dO are passed *batched* ``(batch, q_capacity, h,
  d)`` with sequence ``b``'s queries in rows ``[0, seqlens_q[b])`` and ``seqused_q = seqlens_q``;
  the rows past it hold finite filler, and FA4's O, LSE and dQ there are not part of the problem
  (dropped); with ``q_packed`` the same rows go packed at capacity offsets (``(batch *
  q_capacity, h, d)``, ``cu_seqlens_q`` at the offsets and ``seqused_q``: FA4's used length wins).
  K/V come through ``seqused_k`` as above, or, without it, batched and whole (all ``seqlens_k``
  equal).
* ``page_size``: the same, with K/V as pages ``(num_pages, page_size, hk, d)`` and a
  ``page_table`` (``fa4verify.oracles.paged_kv.paginate``) whose page order is a permutation
  drawn from ``page_seed`` (None: identity). ``kv_capacity`` rounds up to whole pages, so last
  pages are partially filled. Pages no key uses hold finite filler unless ``hostile_nan``
  (then NaN: a stale KV-cache pool; only drawn when asked, known issue
  ``sm90_paged_tma_empty_seq_nan``).
* ``block_size``: FA4 gets ``block_sparse_tensors`` of a random block mask (``block_seed``,
  ``block_keep``); the problem's keep-mask is attention under that block mask
  (``fa4verify.oracles.block_sparse``), and under the problem's causal/window mask where it has one
  and no mask_mod (Note [Block lists with causal or a window]). A varlen problem (packed, ``cu_seqlens``)
  gets FA4's varlen block sparsity (``cu_total_m_blocks``, ``cu_block_idx_offsets``): each sequence
  its own block grid, drawn from ``(block_seed, sequence index)``. With
  ``block_partial`` > 0 (Note [Partial blocks]) that share of the kept blocks goes to FA4 as
  *mask* blocks, inside which the problem's mask pair (``mods``) decides.
* ``mask_mod_fn``: a named CuTe ``mask_mod`` from :func:`mask_mod_pairs` (each with its numpy
  keep-mask); the problem's keep-mask is that pattern.
* ``pack_gqa``: FA4's forward argument (None: FA4 chooses, ``qhead_per_kvhead > 1`` on SM90; False
  runs the unpacked GQA kernel a caller may ask for); it moves no array. FA4's backward never
  packs (``interface.py``: "pack_gqa backward not yet supported"), so only the forward gets it.

* ``qv_dim`` (Note [MLA as a call form]): FA4's MLA call (``qv``); with ``gather_topk`` its top-k
  gather, whose keep-mask is the set of keys each query's slots list.

The oracle and the judge see only the problem (with its keep-mask); the targets build the call.

Note [MLA as a call form]
-------------------------
FA4's MLA forward (``qv``; SM 10.x/11.x, rope head dim 64 and latent dim 512) computes
``softmax(scale (q_i . k_j + qv_i . v_j)) V``: exactly standard attention on the concatenations
``q' = [q, qv]`` and ``k' = [k, v]`` (head dim 576) with value ``v`` (``oracles/mla.py``). So an
MLA problem is an :class:`~fa4verify.problem.AttentionProblem` with ``head_dim = 64 + 512``,
``head_dim_v = 512`` and the call form ``CallForm(qv_dim=512)``: its values tie k's last 512
columns to v (``AttentionProblem.materialize``), and the production target hands FA4 the split
(``q'[..., :64]`` as q, ``q'[..., 64:]`` as qv, ``k'[..., :64]`` as k, v). FA4's default scale
``1/sqrt(64 + 512)`` is the problem's own default. The oracle, the budget statistics and the
judge need nothing new but the kernel's constants (:func:`fa4verify.kernels.facts.mla_fwd_constants`:
MUFU exp2 only, no ``max_offset``, the narrowest MLA KV tile). A top-k gather
(``gather_topk``) lists distinct keys per query (:meth:`CallForm.gather_indices`), so its meaning is
a keep-mask like block sparsity's; FA4's causal limit on the slots is the problem's bottom-right
causal mask. The budget counts every slot tile FA4 walks (``stats.BudgetStats``). The problem is
a dense call: the production target refuses a varlen one (the twin's keep-pattern rewrite runs
varlen MLA problems of its own). Not judged: fp8 MLA and its descales, a key listed twice
(``oracles/mla.py`` Note [Gather duplicates]).

Note [The sparse MLA backward]
------------------------------
FA4 has a backward for the top-k gather only (``_flash_attn_bwd_sparse_mla``), after a training
forward (``requires_grad``) that saves, per 128-key block, its bf16 P at the running row maximum,
the maxima and an fp32 O residual (``o_lo``), or, with ``recompute_p`` (FA4's
``gather_bwd_recompute_p``), nothing and rebuilds P from the LSE. Its gradients are the
untied problem's in FA4's layout (``targets.mla_grads``; bf16 inputs only, as FA4 asserts): dq' = [dq, dqv], dk' holds the rope
columns, and dv both uses of v (the value, and the latent half of k'), summed in one fp32
accumulator and returned in fp32. The judge ties the oracle and the allowances the same way
(``judge.tie_mla``: their sums). The composed backward budgets hold with these changes
(error_budgets/DERIVATIONS.md#mla-bwd): P read from the saved bf16 P has ``backward_p_saved``,
P rebuilt ``backward_p_rebuilt``;
the dK/dV sums count an MMA over the heads of a token, both uses and one add per token
(``2 g + seqlen_q``); D is formed from ``O + o_lo`` (an fp32 O: each product rounds); dS carries
the softmax scale before its cast (the subnormal floor is not scaled). FA4 runs it without a
deterministic mode, and its driver takes no dLSE: ``bwd_stages`` runs FA4's public autograd path
(``flash_attn_func(..., qv=, gather_kv_indices=, return_lse=True)``) with a seeded dLSE as large as
the dO . v terms and judges its gradients against the oracle's with that dLSE (pass
``autograd_dlse``): 4.0.0b36's ``FlashAttnFunc.backward`` does not hand the dLSE it receives to
``_flash_attn_bwd_sparse_mla`` (read from the source), which this pass would show on a B200
(known issue ``sm100_sparse_mla_autograd_dlse_dropped``, predicted, not measured). The saved-P budget assumes a saved P of at most 1, which holds where FA4's training
forward rescales at every new maximum (``facts.mla_fwd_constants``: ``train_rescale_threshold``
0 in 4.0.0b36); elsewhere the saved-P backward is not run (``targets.MLA_BWD_UNJUDGED``).

Note [Partial blocks]
---------------------
FA4's ``block_sparse_tensors`` list, per query block, *full* KV blocks (attended whole; FA4
never calls the ``mask_mod`` there) and *mask* blocks (``mask_block_cnt`` / ``mask_block_idx``:
FA4 calls the ``mask_mod`` on every element), the FlexAttention ``BlockMask`` semantics::

    key j is visible to query i  iff  full[i // bq, j // bk]  or  (mask[i // bq, j // bk] and mask_mod(i, j))

A call form with ``block_partial`` > 0 draws, after the kept blocks (the same draw as without it,
so an old call form's blocks are unchanged), which kept blocks are mask blocks; the mask_mod is
the problem's mask pair (``mods``, with its aux tensors), which then acts only inside mask blocks:
the problem's keep-mask is the formula above (:meth:`CallForm.keep_mask` with ``inner`` the
pair's keep-mask). The blocks are drawn independently of the pair, so a mask block may be one
the mask_mod keeps whole, cuts, or drops whole, and a full block one it would cut: each of FA4's
branches meets each case.

Note [Block lists with causal or a window]
------------------------------------------
FA4 drops ``causal`` and the window only for a ``mask_mod`` (``interface.py``
``_resolve_causal_local_window``). Block lists without one keep them: the kernels walk the listed
KV blocks and mask inside each with the causal / window rule (``mask.py`` ``apply_mask`` with
``mask_causal`` / ``mask_local``; the block-sparse main loops hand it FA4's ``mask_fn``), so::

    key j is visible to query i  iff  listed[i // bq, j // bk]  and  causal/window(i, j)

(the problem's keep-mask: ``window_keep_mask & CallForm.keep_mask``). A listed block the causal or
window rule masks whole is walked and adds exact zeros (P = 0 there). FA4's SM90 sparse tiles do
not depend on causal / local under block sparsity (``_tile_size_bwd_sm90`` with
``sparse_block_size_q``, ``_fit_sm90_fwd_tile_to_block_sparsity``; every head dim, read from
4.0.0b36), so a masked block-sparse call takes the plain one's block size. A mask pair's partial
blocks or a named mask_mod pattern give FA4 a mask_mod: those calls stay without causal/window.

The CPU twin runs such a call as FA4 walks it: the varlen rewrite keeps the lists' grid (a
sequence per query block holding its listed KV blocks, ``keep_pattern.rewrite(lists=True)``) and
the rule goes in as an elementwise keep-mask the twin applies inside each tile (its ``keep``
argument: -inf scores, no tile skipped), so its prediction is the kernel's arithmetic for the
statistical tier; the kernel's flags go with it (``keep_rule``: SM 10.x's emulated exp2 columns,
no 2-CTA forward under block sparsity, the deterministic dQ order: SPT on SM90, the lists'
ascending ranks on SM 10.x; FA4's SM 10.x block-sparse backward may run 2-CTA, which the twin's
one-CTA 128 x 128 backward does not model). With every block listed, at a head dim
whose tile the rule does not change, its forward and dQ equal the dense windowed call's bit for
bit (``tests/test_block_lists_masked.py``); where FA4's windowed tile differs (SM90, hd 129-256
under a window) the twin keeps the lists' block, FA4's tile under block sparsity from 4.0.0b33 on
(``_fit_sm90_fwd_tile_to_block_sparsity``), which the plan's blocks are. The oracle, which has no
keep-mask argument, rewrites on the finest grid the keep-mask is constant on instead.

On SM 10.x FA4's forward masks fewer blocks: Note [Rule-cut blocks in the mask lists].

Note [Rule-cut blocks in the mask lists]
----------------------------------------
FA4's SM 10.x forward walks a query block's *mask* list, then its *full* list, each from its
highest block down, and masks inside every mask block but, of the full list, only the first block it
walks: the others go with ``mask_fn=None`` (4.0.0b36 ``block_sparse_utils.py``
``softmax_block_sparse_sm100`` / ``softmax_block_sparse_sm100_list``, ``allow_unmasked_inner_blocks``).
So under a causal or window rule a listed block the rule cuts (keeps some in-bounds pairs but not
all, or none) belongs in the mask list: as a full block past the first its cut keys would be
attended. On SM 10.x (:attr:`AttentionProblem.rule_blocks_in_mask_lists`) the production target's
forward lists them there (:meth:`AttentionProblem.rule_mask_blocks`), and the block holding the
sequence's last key too where the block size does not divide it (a mask block FA4 masks by the rule
and the sequence length: no change in meaning). The meaning of the call is unchanged: a mask block
without a mask_mod keeps what the rule keeps, a full block is one the rule keeps whole.

Not elsewhere: FA4's SM 10.x backward applies the rule inside every listed block, full or mask
(``mask.py`` ``apply_mask_sm100_transposed``: ``is_full_block`` only skips a mask_mod), and the SM90
kernels mask every block in both passes; their lists stay as they were (every listed block full),
the calls the SM90 audits judged on the H100.

The CPU twin's forward walks and masks as that kernel does: its rewrite of such a call lists each
query block's full blocks, then its mask blocks, each ascending (``keep_pattern.rewrite(...,
walk="sm100_forward")``), and the twin walks a sequence's tiles from the last down, so it meets the
mask blocks first, the highest first, then the full ones; its keep-mask holds the rule inside the
mask blocks and the first full block, none in the other full blocks. The last key's block is a mask
block so that a short block stays the sequence's last and every other tile keeps the lists' block
boundaries. With every listed block full (the lists before this note, planted in the twin as
``rule_cut_blocks_listed_full``) the twin attends the cut keys and the judge fails its forward
against the oracle; with these lists it passes (``tests/test_rule_mask_lists.py``). Read from the
source, compile-only and on the twin; not run on a B200.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import numpy as np

#: features of the call form that :func:`~fa4verify._strategies.problem.attention_problems` can
#: draw when asked (opt-in: the default ``FEATURES`` draws none of them)
CALL_FEATURES: tuple[str, ...] = ("seqused_k", "seqused_q", "paged_kv", "block_sparse", "mask_mod_fn", "pack_gqa",
                                   "split_kv")

#: The score_mod / mask_mod pair feature (``fa4verify.mods``: a registered pair, yours included,
#: run through FA4's ``score_mod`` / ``mask_mod`` + ``aux_tensors``): opt-in like the call forms,
#: production-only (the twin refuses mod problems).
MOD_FEATURE = "mod_pairs"


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


#: CallForm fields written to JSON only where they differ from their default (:meth:`CallForm.to_dict`)
_LATER_FIELDS = ("seqused_q", "q_capacity", "pack_gqa", "block_partial", "full_pages", "block_per_batch",
                 "kv_packed", "qv_dim", "gather_topk", "gather_seed", "recompute_p", "q_packed", "block_per_head",
                 "inference", "mask_causal", "num_splits", "pool_layout", "input_layout", "block_size_implicit")

# Note [Page pool layouts]
# ------------------------
# FA4 takes a paged K/V pool as any (num_pages, page_size, nheads_kv, head_dim) tensor whose last
# stride is 1 (``maybe_contiguous`` keeps other strides). Inference engines pass pools that are not
# one compact tensor per K and V: the halves of one (num_pages, 2, page, hk, d) cache (FlashInfer,
# TensorRT-LLM: a page stride twice the page), an HND cache (num_pages, hk, page, d) handed as its
# transposed view (vLLM's ``kv_cache_layout=HND``: row stride d, head stride page x d). FA4's
# cp.async paged loader computes each page's address by hand, its TMA path from the descriptor's
# strides; a loader that assumed a compact pool reads other pages (the eleventh red-team round).
# ``pool_layout`` says which the production target passes: ``separate`` (compact K and V),
# ``kv_fused`` and ``hnd``. The oracle and the twin read the logical pages: the layout changes
# addresses, never values.
POOL_LAYOUTS = ("separate", "kv_fused", "hnd")
#: the input layouts a call form may ask for (Note [Input layouts] in ``fa4verify.targets``;
#: ``broadcast``: stride 0 on every size-1 dim, e.g. the KV heads of an MQA call)
INPUT_LAYOUTS = ("contiguous", "strided", "transposed", "qkv_packed", "broadcast")

#: the archs whose FA4 has MLA (``qv``) kernels (``interface.py``: ``arch // 10 in [10, 11]``)
MLA_ARCHS = ("sm100", "sm103")


@dataclass(frozen=True)
class CallForm:
    """The call form of a problem (Note [Call forms keep the problem's meaning])."""
    seqused_k: bool = False
    q_batched: bool = False
    kv_capacity: int = 0
    seqused_q: bool = False
    q_capacity: int = 0
    page_size: Optional[int] = None
    page_seed: Optional[int] = None
    spare_pages: int = 0
    hostile_nan: bool = False
    block_size: Optional[tuple[int, int]] = None
    block_seed: int = 0
    block_keep: float = 0.5
    mask_mod_fn: Optional[str] = None
    pack_gqa: Optional[bool] = None
    #: Note [Partial blocks]: the share of kept blocks that are mask blocks (the mask pair inside)
    block_partial: float = 0.0
    #: paged KV whose every sequence fills its pages: FA4 gets the page table and no ``seqused_k``
    #: (it then reads ``page_size * pages_per_seq`` keys per sequence, ``flash_fwd_sm90.py``'s
    #: static ``seqlen_k``)
    full_pages: bool = False
    #: a dense problem's block mask drawn per batch entry (FA4 takes ``(batch, heads, ...)`` block
    #: lists; FlexAttention's document masks differ per sample), not one mask for every entry
    block_per_batch: bool = False
    #: ``seqused_k`` over *packed* K/V: each sequence's keys then slack up to ``kv_capacity``, with
    #: ``cu_seqlens_k`` at capacity offsets; FA4 reads ``seqused_k[b]`` keys from each offset
    #: (its length wins over the cu_seqlens_k one), where the plain form passes batched K/V
    kv_packed: bool = False
    #: Note [MLA as a call form]: FA4 gets the problem's last ``qv_dim`` columns of q as ``qv`` and
    #: of k as nothing (they are v: the problem's values tie them), the rest as its rope q and k
    qv_dim: int = 0
    #: top-k gather (sparse MLA, needs ``qv_dim``): FA4 gets ``gather_kv_indices`` of this many
    #: slots per query token, drawn from ``gather_seed`` (:meth:`gather_indices`)
    gather_topk: int = 0
    gather_seed: int = 0
    #: FA4's ``gather_bwd_recompute_p``: the sparse MLA backward rebuilds P from the LSE rather than
    #: reading the bf16 P its forward saved (Note [The sparse MLA backward])
    recompute_p: bool = False
    #: ``seqused_q`` over *packed* Q: each sequence's queries slack up to ``q_capacity``, with
    #: ``cu_seqlens_q`` at capacity offsets; FA4 takes ``seqused_q[b]`` rows from each offset (its
    #: length wins over the cu_seqlens_q one), where the plain form passes batched Q
    q_packed: bool = False
    #: a block mask drawn per query head (FA4 takes ``(batch, heads, ...)`` block lists: per-head
    #: sparsity, MInference / DuoAttention style), not one for every head (Note [Block masks by head])
    block_per_head: bool = False
    #: the forward is also called as inference (``return_lse=False``, no gradient): FA4 compiles a
    #: kernel without the LSE store (``lse is None`` in its compile key), whose O must be the
    #: training call's bit for bit (the ``inference_bitwise`` property)
    inference: bool = False
    #: a mask pair's call that also passes ``causal=True``: FA4's forward drops causal for a
    #: mask_mod (``_resolve_causal_local_window``), so the mask alone decides; its backward must
    #: drop it the same way (the problem is the mask pair's, causal=False)
    mask_causal: bool = False
    #: FA4's split-KV forward (``num_splits`` > 1, SM 10.x/11.x): the keys of each row cut into
    #: ``num_splits`` fp32 partials that FA4's combine kernel merges in the same call (Note [Split-KV
    #: as a call form] in ``fa4verify.judge.split_combine``); the problem is the unsplit one. 0:
    #: FA4's own heuristic picks the count (``num_splits=0``, Note [Split-KV by FA4's heuristic])
    num_splits: int = 1
    #: Note [Page pool layouts]: how the paged K/V pools lie in memory (:data:`POOL_LAYOUTS`)
    pool_layout: str = "separate"
    #: Note [Input layouts] (``fa4verify.targets``): the memory layout of the Q, K, V and dO
    #: tensors FA4 gets (``contiguous``, ``strided``, ``transposed``, ``qkv_packed``, ``broadcast``)
    input_layout: str = "contiguous"
    #: Note [Block lists without a size]: FA4 gets the block lists with ``block_size=None``
    block_size_implicit: bool = False

    def __post_init__(self) -> None:
        if self.block_size is not None:
            object.__setattr__(self, "block_size", tuple(int(x) for x in self.block_size))
        if self.page_size is not None and (int(self.page_size) < 1):
            raise ValueError(f"page_size={self.page_size} must be >= 1")
        if self.hostile_nan and self.page_size is None:
            raise ValueError("hostile_nan needs paged KV (page_size)")
        if self.page_size is not None and not self.seqused_k:
            object.__setattr__(self, "seqused_k", True)
        if self.seqused_q and self.q_batched:
            raise ValueError("seqused_q passes q batched with a capacity: q_batched is for seqused_k's equal lengths")
        if self.pack_gqa is not None:
            object.__setattr__(self, "pack_gqa", bool(self.pack_gqa))
        object.__setattr__(self, "block_partial", float(self.block_partial))
        if not 0.0 <= self.block_partial <= 1.0:
            raise ValueError(f"block_partial={self.block_partial} must lie in [0, 1]")
        if self.block_partial and self.block_size is None:
            raise ValueError("block_partial needs block sparsity (block_size)")
        if self.full_pages and self.page_size is None:
            raise ValueError("full_pages needs paged KV (page_size)")
        if self.pool_layout not in POOL_LAYOUTS:
            raise ValueError(f"pool_layout={self.pool_layout!r}: expected one of {POOL_LAYOUTS}")
        if self.pool_layout != "separate" and self.page_size is None:
            raise ValueError(f"pool_layout={self.pool_layout!r} needs paged KV (page_size)")
        if self.input_layout not in INPUT_LAYOUTS:
            raise ValueError(f"input_layout={self.input_layout!r}: expected one of {INPUT_LAYOUTS}")
        if self.input_layout != "contiguous" and (self.page_size is not None or self.qv_dim):
            raise ValueError("input_layout: paged pools take pool_layout; MLA calls take their inputs contiguous")
        if self.kv_packed and (not self.seqused_k or self.page_size is not None):
            raise ValueError("kv_packed is a seqused_k call over unpaged K/V")
        if self.q_packed and not self.seqused_q:
            raise ValueError("q_packed is a seqused_q call (Q packed at capacity offsets)")
        if self.block_per_batch and self.block_size is None:
            raise ValueError("block_per_batch needs block sparsity (block_size)")
        if self.block_size_implicit and self.block_size is None:
            raise ValueError("block_size_implicit needs block sparsity (block_size: the size FA4 must take)")
        if self.block_per_head and (self.block_size is None or self.block_partial):
            raise ValueError("block_per_head needs block sparsity (block_size) with full blocks only")
        object.__setattr__(self, "qv_dim", int(self.qv_dim))
        object.__setattr__(self, "num_splits", int(self.num_splits))
        if self.num_splits < 0:
            raise ValueError(f"num_splits={self.num_splits} must be >= 0 (0: FA4's split heuristic picks the count)")
        if self.split_kv and (self.rearranges or self.inference):
            raise ValueError("num_splits rides on the plain call only, not on another call form")
        object.__setattr__(self, "gather_topk", int(self.gather_topk))
        if self.qv_dim < 0 or self.gather_topk < 0 or int(self.gather_seed) < 0:
            raise ValueError("qv_dim, gather_topk and gather_seed must be >= 0")
        if self.gather_topk and not self.qv_dim:
            raise ValueError("gather_topk needs qv_dim (FA4: top-k gather is sparse MLA only)")
        if self.recompute_p and not self.gather_topk:
            raise ValueError("recompute_p is the sparse MLA backward's (needs gather_topk)")
        if self.qv_dim and (self.batched_layout or self.block_size is not None or self.mask_mod_fn is not None
                            or self.pack_gqa is not None):
            raise ValueError("an MLA call form (qv_dim) takes no other call form here")

    @property
    def paged(self) -> bool:
        return self.page_size is not None

    @property
    def batched_layout(self) -> bool:
        """Whether FA4 gets batched arrays (with used lengths: ``seqused_k`` / paged /
        ``seqused_q``; or whole: ``q_batched`` alone) in place of the problem's packed varlen
        layout (:mod:`fa4verify.call_layout`)."""
        return self.seqused_k or self.seqused_q or self.q_batched

    @property
    def mla(self) -> bool:
        return self.qv_dim > 0

    @property
    def keep_pattern(self) -> bool:
        """Whether the call form adds a keep-mask (block sparsity, a mask_mod callable or a top-k
        gather)."""
        return self.block_size is not None or self.mask_mod_fn is not None or self.gather_topk > 0

    @property
    def rearranges(self) -> bool:
        """Whether FA4 gets other arrays than the problem's own (a batched layout or a keep-pattern);
        a form that only sets ``pack_gqa`` does not: it is the plain call with one more argument."""
        return self.batched_layout or self.keep_pattern or self.mla

    @property
    def split_kv(self) -> bool:
        """Whether FA4 gets a split-KV request: a count over 1, or 0 (its heuristic's count)."""
        return self.num_splits != 1

    def validate(self, problem: Any) -> None:
        """Raise ValueError when this call form cannot carry ``problem`` (FA4's constraints)."""
        if self.mask_causal and self.rearranges:
            raise ValueError("mask_causal rides on the plain call of a mask pair only, not on another call form")
        if self.split_kv and (problem.varlen or problem.mods or problem.mask_mod is not None):
            raise ValueError("num_splits != 1: a dense call without mod pairs here (Note [Split-KV as a call form])")
        if self.mla:
            self._validate_mla(problem)
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
            if self.pool_layout == "kv_fused" and problem.head_dim != problem.head_dim_v:
                raise ValueError("pool_layout='kv_fused' holds K and V in one cache: head_dim == head_dim_v")
            if self.full_pages and (self.kv_capacity % self.page_size
                                    or any(n != self.kv_capacity for n in problem.seqlens_k)):
                raise ValueError("full_pages needs every seqlens_k equal to kv_capacity, a multiple of page_size")
        if self.q_batched and not self.seqused_k:
            # FA4's batched call: every sequence of one length on each side (0 allowed: empty input)
            if not problem.varlen:
                raise ValueError("the batched call form (q_batched alone) needs a varlen problem of equal lengths")
            if len(set(problem.seqlens_q)) > 1 or len(set(problem.seqlens_k)) > 1:
                raise ValueError("the batched call form (q_batched alone) needs equal seqlens_q and equal seqlens_k")
            if self.keep_pattern:
                raise ValueError("block sparsity / mask_mod are not drawn with the batched call form")
        if self.seqused_q:
            if not problem.varlen:
                raise ValueError("the seqused_q call form needs a varlen problem (seqlens_q = seqused_q)")
            if self.q_capacity < max(problem.seqlens_q, default=0) or self.q_capacity < 1:
                raise ValueError(f"q_capacity={self.q_capacity} < max(seqlens_q)={max(problem.seqlens_q, default=0)}")
            if not self.seqused_k and (len(set(problem.seqlens_k)) > 1 or problem.seqlen_k == 0):
                raise ValueError("seqused_q without seqused_k passes K/V batched and whole: equal seqlens_k >= 1")
            if self.keep_pattern:
                raise ValueError("block sparsity / mask_mod are not drawn with seqused_q")
        if self.block_size is not None or self.mask_mod_fn is not None:
            if self.block_size is not None and self.mask_mod_fn is not None:
                raise ValueError("block_size and mask_mod_fn are exclusive")
            masked = problem.causal or problem.window_size != (None, None)
            if problem.mask_mod or (masked and (self.mask_mod_fn is not None or problem.mods or self.block_partial)):
                # Note [Block lists with causal or a window]
                raise ValueError("block sparsity with a mask_mod (a named pattern, a mask pair's partial blocks) "
                                 "or mask_mod_fn needs a problem without causal, window or mask_mod: FA4 drops "
                                 "causal/window for a mask_mod")
            if problem.varlen and self.block_per_batch:
                raise ValueError("block_per_batch is a dense problem's (a varlen one draws per sequence)")
            if problem.varlen and self.block_per_head:
                raise ValueError("block_per_head is a dense problem's (FA4's varlen block lists are per head, "
                                 "not drawn here)")
            if problem.varlen and self.mask_mod_fn is not None:
                raise ValueError("a varlen problem takes block sparsity, not a named mask_mod pattern")
            mask_pair = problem.mods and problem.mod_pairs()[1] is not None
            if self.block_partial and not mask_pair:
                raise ValueError("block_partial needs a mask pair in the problem's mods (the mask_mod of the "
                                 "mask blocks, Note [Partial blocks])")
            if self.block_size_implicit:
                self._validate_implicit_size(problem)
            if mask_pair and self.block_size is None:
                raise ValueError("a mask pair with a keep-pattern call form needs block sparsity (block_size)")
            if self.mask_mod_fn is not None and self.mask_mod_fn not in mask_mod_pairs():
                raise ValueError(f"mask_mod_fn={self.mask_mod_fn!r}: not a registered pair "
                                 f"({', '.join(mask_mod_pairs()) or 'none'})")

    def _validate_implicit_size(self, problem: Any) -> None:
        """Note [Block lists without a size]
        ------------------------------------
        ``BlockSparseTensorsTorch.block_size`` may be None (FA4's own ``compute_block_sparsity``
        sets it; a caller building lists by hand may not). FA4 4.0.0b36 then takes the Q block
        from the lists' shape (``block_sparsity.get_sparse_q_block_size``: ``seqlen_q`` for one Q
        block; for n > 1 only where ``ceil(seqlen_q / n) == (seqlen_q - 1) // (n - 1)``, else its
        forward refuses: "require explicit sparse_block_size[0]"), its SM90 backward takes 128 rows
        (``interface.py``: ``elif arch // 10 == 9: sparse_q = 128``), and both take their tile's keys
        as the KV block. Lines the audit never ran with a size given (red-team round 15 #3). The form
        holds only where that is the problem's block: SM90, dense, one Q block of exactly 128 rows
        (the one shape both passes take), and the forward's and backward's KV tiles at the problem's
        head dims of the block's width."""
        from fa4verify.coverage.cases import sm90_bwd_sparse_block
        from fa4verify.kernels import facts
        if problem.arch != "sm90" or problem.varlen:
            raise ValueError("block_size_implicit: a dense SM90 call (FA4's SM 10.x backward takes 2 tiles of rows)")
        bq, bk = self.block_size
        fwd = facts.fwd_tile(problem.arch, problem.dtype, problem.head_dim, problem.head_dim_v, False, False)
        bwd_n = sm90_bwd_sparse_block(problem.head_dim, problem.head_dim_v)[1]
        if bq != 128 or problem.seqlen_q != bq or fwd[0] != bq or fwd[1] != bk or bwd_n != bk:
            raise ValueError(f"block_size_implicit: FA4 would take one Q block of seqlen_q rows (128 in its SM90 "
                             f"backward) and its tiles' keys (forward {fwd[0]}x{fwd[1]}, backward KV {bwd_n}): "
                             f"not the block {bq}x{bk} at seqlen_q {problem.seqlen_q}")

    def _validate_mla(self, problem: Any) -> None:
        """Note [MLA as a call form]: FA4's own asserts for ``qv`` (``interface.py``), and the
        MLA features fa4verify judges (a plain or top-k gather forward, dense)."""
        from fa4verify.kernels import facts
        if problem.arch not in MLA_ARCHS:
            raise ValueError(f"MLA (qv) runs on SM 10.x/11.x only (FA4 asserts), not {problem.arch}")
        if problem.dtype not in ("bf16", "fp16"):
            raise ValueError("MLA call forms here take 16-bit inputs (fp8 MLA and its descales are not judged)")
        rope, latent = facts.mla_head_dims()
        if (problem.head_dim, problem.head_dim_v, self.qv_dim) != (rope + latent, latent, latent):
            raise ValueError(f"MLA: FA4 does not take (head_dim, head_dim_v)=({problem.head_dim - self.qv_dim}, "
                             f"{self.qv_dim}) with qv: the problem's head dims are ({rope} + {latent}, {latent}) "
                             f"and qv_dim {latent}")
        if problem.local or problem.softcap or problem.sink or problem.mods or problem.mask_mod is not None:
            raise ValueError("MLA: FA4 takes no local window or softcap with qv; sinks and mods are not judged here")
        if problem.varlen and self.gather_topk:
            raise ValueError("a top-k gather call form here is a dense call")
        if problem.nheads_kv != 1 or problem.nheads > 128:
            raise ValueError("MLA call forms here have one KV head and at most 128 query heads (FA4's MLA kernels)")
        if self.gather_topk % 128:
            raise ValueError(f"gather_topk={self.gather_topk}: FA4 takes a multiple of 128")

    # ------------------------------------------------------------------ keep-masks
    def grid_seq(self, problem: Any, index: int) -> Optional[int]:
        """The ``seq`` argument of :meth:`block_mask` / :meth:`keep_mask` for batch entry (varlen:
        sequence) ``index`` of ``problem``: its own grid on a varlen problem, with
        ``block_per_batch`` or a top-k gather (each entry its own indices), else None (one grid for
        every entry)."""
        return int(index) if problem.varlen or self.block_per_batch or self.gather_topk else None

    def gather_kv_indices(self, problem: Any) -> np.ndarray:
        """FA4's ``gather_kv_indices`` of a dense ``problem``: ``(batch, seqlen_q, gather_topk)``
        int32, each batch entry's :meth:`gather_indices`."""
        return np.stack([self.gather_indices(problem.seqlen_q, problem.seqlen_k, b) for b in range(problem.batch)])

    def fold_latent(self, problem: Any, dk: Any, dv: Any) -> tuple[np.ndarray, np.ndarray]:
        """Note [The sparse MLA backward]: a key-layout pair of an MLA problem's untied q', k', v
        (gradients, bounds or allowances: dk' over [rope, latent], dv of the value use) in FA4's MLA
        layout: dv + dk'[..., rope:] (v is both) and dk' with its latent columns 0."""
        d = problem.head_dim - self.qv_dim
        dk = np.array(dk, np.float64, copy=True)
        dv = np.asarray(dv, np.float64) + dk[..., d:]
        dk[..., d:] = 0.0
        return dk, dv

    def gather_indices(self, seqlen_q: int, seqlen_k: int, seq: int) -> np.ndarray:
        """The ``(seqlen_q, gather_topk)`` int32 ``gather_kv_indices`` of batch entry ``seq``:
        each query's slots hold distinct keys of ``[0, seqlen_k)`` (a key listed twice would count
        twice in FA4's softmax, Note [Gather duplicates] of ``oracles/mla.py``; never drawn) and
        ``-1`` sentinels, in a shuffled slot order; the share of keys per row varies from none (an
        empty row: O = 0, LSE = -inf) to every slot. Deterministic in (``gather_seed``, ``seq``)."""
        rng = np.random.default_rng([self.gather_seed, int(seq)])
        t = self.gather_topk
        out = np.full((seqlen_q, t), -1, np.int32)
        for i in range(seqlen_q):
            n = min(t, seqlen_k) if i % 5 == 1 else (0 if i % 7 == 3 else int(rng.integers(1, min(t, seqlen_k) + 1)))
            keys = rng.choice(seqlen_k, size=n, replace=False) if n else np.zeros(0, np.int64)
            slots = rng.permutation(t)[:n]
            out[i, slots] = keys
        return out

    def block_mask(self, seqlen_q: int, seqlen_k: int, seq: Optional[int] = None,
                   head: Optional[int] = None) -> Optional[np.ndarray]:
        """The (n_q_blocks, n_kv_blocks) boolean mask of the blocks FA4 gets listed, full or mask
        blocks (block sparsity), else None. Each block is kept with probability ``block_keep``.
        ``seq``: the sequence of a varlen problem, or the batch entry with ``block_per_batch``
        (each draws its own grid: :meth:`grid_seq`); None for a dense one's shared grid.
        ``head``: the query head's grid with ``block_per_head`` (required there), else ignored.

        Note [Block masks by head]
        --------------------------
        FA4 takes block lists per (batch, head) and keeps PackGQA only where their head extent is
        1 (``interface.py``: "pack_gqa requires block sparse head dim == 1"): with one mask for every
        head that guard never fires, and a kernel reading another head's lists reads the same
        ones (the fourth red-team round). ``block_per_head`` draws each query head its own grid;
        the problem's keep-masks differ by head (``AttentionProblem.heads_differ``), so the judge
        keeps per head (Note [Masks by head]) and the oracle is the mods oracle's ``keep(b, h)``."""
        got = self._blocks(seqlen_q, seqlen_k, seq, head)
        return None if got is None else got[0]

    def partial_blocks(self, seqlen_q: int, seqlen_k: int, seq: Optional[int] = None,
                       head: Optional[int] = None) -> Optional[np.ndarray]:
        """Which listed blocks are mask blocks (Note [Partial blocks]): a boolean mask inside
        :meth:`block_mask`, all False without ``block_partial``; None without block sparsity."""
        got = self._blocks(seqlen_q, seqlen_k, seq, head)
        return None if got is None else got[1]

    def _blocks(self, seqlen_q: int, seqlen_k: int, seq: Optional[int] = None, head: Optional[int] = None
                ) -> Optional[tuple[np.ndarray, np.ndarray]]:
        if self.block_size is None:
            return None
        bq, bk = self.block_size
        nq, nk = -(-seqlen_q // bq), -(-seqlen_k // bk)
        if self.block_per_head:
            if head is None:
                raise ValueError("a call form with a block mask per head needs the head (block_per_head)")
            rng = np.random.default_rng([self.block_seed, 0 if seq is None else 1 + int(seq), 0x4EAD, int(head)])
        else:
            rng = np.random.default_rng(self.block_seed if seq is None else [self.block_seed, int(seq)])
        listed = rng.random((nq, nk)) < self.block_keep
        partial = np.zeros_like(listed)
        if self.block_partial:          # drawn after the kept blocks: those do not change
            partial = listed & (rng.random((nq, nk)) < self.block_partial)
        return listed, partial

    def keep_mask(self, seqlen_q: int, seqlen_k: int, inner: Optional[np.ndarray] = None,
                  seq: Optional[int] = None, head: Optional[int] = None) -> Optional[np.ndarray]:
        """The (seqlen_q, seqlen_k) keep-mask this call form adds, or None. ``inner``: the mask
        pair's keep-mask, which decides inside mask blocks (Note [Partial blocks]); required when
        the call form has them. ``seq``, ``head``: as in :meth:`block_mask`."""
        if self.block_size is not None:
            from fa4verify.oracles.block_sparse import dense_mask
            listed, partial = self._blocks(seqlen_q, seqlen_k, seq, head)
            if inner is None:
                if partial.any():
                    raise ValueError("a call form with mask blocks needs the mask pair's keep-mask (inner)")
                return dense_mask(listed, self.block_size, seqlen_q, seqlen_k)
            full = dense_mask(listed & ~partial, self.block_size, seqlen_q, seqlen_k)
            return full | (dense_mask(partial, self.block_size, seqlen_q, seqlen_k) & np.asarray(inner, bool))
        if self.mask_mod_fn is not None:
            return np.asarray(mask_mod_pairs()[self.mask_mod_fn].keep(seqlen_q, seqlen_k), bool)
        if self.gather_topk:
            idx = self.gather_indices(seqlen_q, seqlen_k, 0 if seq is None else seq)
            keep = np.zeros((seqlen_q, seqlen_k), bool)
            rows, slots = np.nonzero(idx >= 0)
            keep[rows, idx[rows, slots]] = True
            return keep
        return None

    # ------------------------------------------------------------------ JSON / labels
    def to_dict(self) -> dict[str, Any]:
        """JSON form; the fields added with ``seqused_q`` and ``pack_gqa`` only where set, so the
        JSON (and the digest) of every call form written before them is unchanged."""
        d = dataclasses.asdict(self)
        if d["block_size"] is not None:
            d["block_size"] = list(d["block_size"])
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for k in _LATER_FIELDS:
            if d[k] == defaults[k]:
                del d[k]
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
                         f"{', full, no seqused_k' if self.full_pages else ''}"
                         f"{', NaN pool' if self.hostile_nan else ''}"
                         f"{', ' + self.pool_layout + ' pool' if self.pool_layout != 'separate' else ''})")
        elif self.seqused_k:
            parts.append(f"seqused_k(cap={self.kv_capacity}{', K packed' if self.kv_packed else ''})")
        if self.seqused_q:
            parts.append(f"seqused_q(cap={self.q_capacity}{', Q packed' if self.q_packed else ''})")
        elif self.seqused_k:
            parts.append("q=batched" if self.q_batched else "q=packed")
        elif self.q_batched:
            parts.append("batched")
        if self.block_size is not None:
            partial = f", partial={self.block_partial:g}" if self.block_partial else ""
            parts.append(f"block_sparse({self.block_size[0]}x{self.block_size[1]}, keep={self.block_keep:g}"
                         f"{partial}{', per batch' if self.block_per_batch else ''}"
                         f"{', per head' if self.block_per_head else ''}"
                         f"{', size not passed' if self.block_size_implicit else ''}, #{self.block_seed})")
        if self.mask_mod_fn is not None:
            parts.append(f"mask_mod_fn={self.mask_mod_fn}")
        if self.pack_gqa is not None:
            parts.append(f"pack_gqa={self.pack_gqa}")
        if self.input_layout != "contiguous":
            parts.append(f"inputs={self.input_layout}")
        if self.split_kv:
            parts.append(f"splits={self.num_splits or 'auto'}")
        if self.inference:
            parts.append("+inference")
        if self.mask_causal:
            parts.append("+causal passed")
        if self.mla:
            parts.append(f"mla(qv={self.qv_dim}" + (f", top-{self.gather_topk} #{self.gather_seed}"
                                                    f"{', recompute P' if self.recompute_p else ''})"
                                                    if self.gather_topk else ")"))
        return " ".join(parts)

    def labels(self) -> dict[str, Any]:
        return {"paged_kv": self.page_size, "seqused_k": self.seqused_k, "seqused_q": self.seqused_q,
                "pack_gqa": None if self.pack_gqa is None else ("on" if self.pack_gqa else "off"),
                "block_sparse": None if self.block_size is None else f"{self.block_size[0]}x{self.block_size[1]}",
                "block_partial": self.block_partial or None,
                "mask_mod_fn": self.mask_mod_fn, "hostile_nan": self.hostile_nan,
                "mla": ("gather" if self.gather_topk else "dense") if self.mla else None,
                "num_splits": self.num_splits if self.split_kv else None}
