"""The feature space of FA4's public call on one arch and dtype, and what FA4 supports in it.

Dimensions (:data:`DIMENSIONS`; a row of the plan picks one value of each):

* ``form``: how FA4 is called: ``dense``, ``varlen`` (cu_seqlens), ``seqused_k`` (batched K/V),
  ``seqused_q`` (batched Q with used lengths, K/V batched whole),
  ``paged_small`` (page size 16: FA4's cp.async path), ``paged_tile`` (page size = the forward
  tile_n: FA4's TMA path, ``interface.py`` ``paged_kv_non_tma=page_size not in [None, tile_n]``),
  ``block_sparse`` (``block_sparse_tensors``, full blocks), ``block_sparse_mod`` (full and mask
  blocks, a mask pair's mask_mod inside the mask blocks: Note [Partial blocks] in
  ``fa4verify.problem.calls``), ``block_sparse_varlen`` (FA4's varlen block sparsity on a packed
  call: ``cu_total_m_blocks``, ``cu_block_idx_offsets``; forward only), ``mask_mod`` (a CuTe mask_mod callable, yours included),
  ``score_mod`` (a score_mod pair, yours included); the two pair forms run dense, and on a
  varlen call (plain ``cu_seqlens``) at the seqlen values that need one (``zero``, ``many``);
  ``split_kv`` (``num_splits > 1``: FA4's split-KV forward and its internal combine, SM 10.x/11.x
  only; forward-only; Note [Split-KV as a call form] in ``fa4verify.judge.split_combine``): planned
  where fa4verify models FA4's cut of the keys (under a causal or local mask, a call of one query
  tile: the plan's masked split rows take a short query side; at hd != hdv FA4's 64-key tiles and
  its own split count, over 64 KV tiles more); the other tuples are reported not planned with
  the reason;
* ``mask``: ``none``, ``causal``, ``left`` (window left side only), ``right``, ``both``,
  ``causal_left`` (causal + a left window);
* ``hd``: head-dim classes, one per tile class FA4's tile tables select (forward tile, backward
  tile, and the dQ-accumulator rounding class: whether rounding the head dim to 16 and to 32
  differ), each represented by one head dim (:func:`head_dim_classes`), plus the classes of the
  hd != hdv pairs (192, 128), (64, 128) and (128, 64);
* ``gqa``: query heads per KV head: ``1``, ``2``, ``4``, ``7`` (14 query / 2 KV heads, as
  Qwen2.5-0.5B: a ratio that divides neither the SM90 forward's tile_m 128 nor 192, so FA4 loads
  the packed Q with cp.async, at tile_m 192 with two row pointers per thread, ``pack_gqa.py``
  ``compute_ptr``), ``mqa`` (one KV head), ``2_unpacked`` (2, with ``pack_gqa=False``: FA4 packs
  every GQA forward unless the caller says not to; score and mask pairs too);
* ``seqlen``: relative to the forward tile: ``lt_tile``, ``eq_tile``, ``tile_m1``, ``tile_p1``,
  ``multi`` (several tiles), ``q_gt_k``, ``q_lt_k``, ``zero`` (a zero-length sequence), and
  ``many``: more sequences than FA4's batch-search threshold (``BIN_BATCH_SEARCH_THRESH``, read
  from the installed release: 256 in 4.0.0b36), where the varlen tile scheduler runs with its
  batch lookup (``cu_total_m_blocks``: kernels of their own in the forward and the backward);
* ``softcap``: ``off`` / ``on``; ``sink``: ``off``, ``fp32`` or ``bf16`` (a learnable sink, in that
  dtype: FA4 takes fp16 / bf16 / fp32 sinks, the dtype is in its compile key and dsink is written
  in it);
* ``scale``: the call's ``softmax_scale``: ``default`` (None: FA4 uses 1/sqrt(hd)) or ``custom``
  (:func:`custom_scale`: muP's 1/hd, passed explicitly). FA4 carries the value as a kernel
  argument, and GQA scales dK in the dK postprocess, MHA in the main kernel
  (``_bwd_postprocess_convert(dk_accum, dk, softmax_scale, ...)``): a custom scale on a GQA
  backward is a pair the plan must hold;
* ``det``: ``on`` / ``off``: the backward's ``deterministic`` flag;
* ``values``: the value distribution (``normal``, ``outliers``, ``negative_scores``,
  ``peaked_rescale``, ``tiny``, ``edges``: Note [Edge values]);
* ``descale`` (fp8 spaces only): which fp8 descales the call passes (:data:`DESCALES`: none, all
  three, ``k_descale`` alone, ``v_descale`` alone; Note [FP8 descales]). An fp8 space runs the
  forward only (FA4 has no fp8 backward): its ``det`` dimension holds ``on`` alone, and it has no
  score_mod or mod-pair forms (the adapter does not route a score_mod or aux tensors with fp8).

``pass`` (``fwd`` / ``bwd``) is not chosen: a row runs the backward wherever FA4 has one for it
(:meth:`FeatureSpace.passes`), so a row covers its tuples for every pass it runs.

Support comes from the installed FA4's claims (:mod:`fa4verify.kernels.features`, checked against
its source by ``tests/test_features_table.py``), its head-dim rules and tile tables
(:mod:`fa4verify.kernels.facts`) and the problem type's own constraints; each unsupported value
pair says why (:meth:`FeatureSpace.why_not`), and the coverage report lists them.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping, Optional, Sequence

from fa4verify.kernels import facts

__all__ = ["DIMENSIONS", "DESCALES", "SCALES", "custom_scale", "FeatureSpace", "head_dim_classes", "space_for", "FORMS", "MASKS", "SEQLENS",
           "PASSES", "PLAN_DISTRIBUTIONS", "BLOCK_FORMS", "MOD_FORMS", "VARLEN_SEQLENS"]

FORMS: tuple[str, ...] = ("dense", "varlen", "seqused_k", "seqused_q", "paged_small", "paged_tile",
                          "block_sparse", "block_sparse_mod", "block_sparse_varlen", "mask_mod", "score_mod",
                          "split_kv")
MASKS: tuple[str, ...] = ("none", "causal", "left", "right", "both", "causal_left")
GQAS: tuple[str, ...] = ("1", "2", "4", "7", "mqa", "2_unpacked")
SEQLENS: tuple[str, ...] = ("lt_tile", "eq_tile", "tile_m1", "tile_p1", "multi", "q_gt_k", "q_lt_k", "zero", "many")
ONOFF: tuple[str, ...] = ("off", "on")
PASSES: tuple[str, ...] = ("fwd", "bwd")
#: the value distributions the plan covers ("huge" is left to the fuzz while the backward budget
#: is first-order only: its dQ/dK/dV are undecided there, error_budgets/DERIVATIONS.md)
PLAN_DISTRIBUTIONS: tuple[str, ...] = ("normal", "outliers", "negative_scores", "peaked_rescale", "tiny", "edges")

#: fp8 descale values: the call's ``q/k/v_descale`` (value -> the inputs that carry one)
DESCALES: dict[str, tuple[str, ...]] = {"off": (), "qkv": ("q", "k", "v"), "k": ("k",), "v": ("v",)}

SCALES: tuple[str, ...] = ("default", "custom")
SINKS: tuple[str, ...] = ("off", "fp32", "bf16")

DIMENSIONS: tuple[str, ...] = ("form", "mask", "hd", "gqa", "seqlen", "softcap", "sink", "scale", "det", "values",
                               "descale")


def custom_scale(head_dim: int) -> float:
    """The plan's ``scale=custom`` softmax_scale: muP's 1/hd (a real models' choice; differs from
    FA4's default 1/sqrt(hd) at every head dim above 1)."""
    return 1.0 / head_dim

_PAGED = ("paged_small", "paged_tile")
_KV_FORMS = ("varlen", "seqused_k", "seqused_q", "block_sparse_varlen") + _PAGED   # varlen problems (zero lengths)
#: forms whose FA4 call takes a mask_mod: FA4 drops causal/window (``_resolve_causal_local_window``;
#: block lists without one keep them: Note [Block lists with causal or a window])
_MOD_KEEP_FORMS = ("block_sparse_mod", "mask_mod")
BLOCK_FORMS = ("block_sparse", "block_sparse_mod", "block_sparse_varlen")   # FA4's block-sparse kernels
#: the pair forms; on the seqlen values that need a varlen call (:data:`VARLEN_SEQLENS`) they run
#: on one (plain cu_seqlens: FA4 hands the mods sequence-local indices and the sequence as b)
MOD_FORMS = ("score_mod", "mask_mod")
VARLEN_SEQLENS = ("zero", "many")
_CU_SEQLENS_FORMS = ("varlen", "seqused_k", "block_sparse_varlen") + _PAGED  # calls passing cu_seqlens


#: FA4 refuses a varlen backward with block sparsity
VARLEN_SPARSE_BWD = ("FA4 has no varlen backward with block sparsity (interface.py: 'Varlen backward with block "
                     "sparsity is not yet supported')")


def is_local(mask: Optional[str]) -> bool:
    """Whether a mask value is a local window (FA4's ``local``)."""
    return mask in ("left", "right", "both", "causal_left") or (mask or "").startswith("win:")


def is_paged(form: Optional[str]) -> bool:
    return (form or "").startswith("paged")


def is_unpacked(gqa: Optional[str]) -> bool:
    """Whether a ``gqa`` value asks FA4's forward for ``pack_gqa=False`` (``2_unpacked``, a
    deployment's ``h:<q>/<kv>_unpacked``)."""
    return (gqa or "").endswith("_unpacked")


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def head_dim_classes(arch: str, dtype: str = "bf16", *, limit: Optional[Iterable[tuple[int, int]]] = None
                     ) -> dict[str, tuple[int, int]]:
    """One representative (hd, hdv) per tile class FA4 selects on ``arch``: the class of a head
    dim is (forward tile, backward tile, ``round_up(hd, 16) != round_up(hd, 32)``; on SM100 the
    forward kernel and its Q stages and the backward kernel stand for the tiles); the
    representative is the largest head dim of its class (the class's widest tile use), except the
    odd class, whose smallest member is taken (8, 40, 72, ...: the narrowest padding). ``limit``:
    only these (hd, hdv) pairs (a deployment's); the classes are then those the pairs fall in."""
    # hd != hdv both ways (FA4 accepts any pair its rule allows; its forward keeps O in Q's shared
    # memory, so hdv > hd is a layout of its own: the fourth red-team round; hd <= 128 with hdv > 128
    # rescales O before the PV GEMM under the warp-scheduler barrier: the seventh)
    cands = [(d, d) for d in range(8, 257, 8)] + [(192, 128), (64, 128), (128, 64), (128, 256)]
    if limit is not None:
        cands = sorted({(int(a), int(b)) for a, b in limit})
    out: dict[tuple, tuple[int, int]] = {}
    for hd, hdv in cands:
        if not facts.head_dims_supported(arch, hd, hdv, dtype):
            continue
        if arch == "sm90":
            # hdv > 128: the forward rescales O before the PV GEMM (flash_fwd_sm90.py rescale_O_before_gemm)
            key: tuple = (facts.sm90_fwd_tile(hd, hdv, False, False), facts.sm90_bwd_tile(hd, hdv, False, False),
                          _round_up(hd, 16) != _round_up(hd, 32), hd != hdv, hdv > 128)
        else:
            # SM100: the forward kernel, its Q stages (one Q tile at hdv 256, TMEM), the backward
            # kernel (dedicated at (256, 256)), small head dims, padding, hd != hdv
            k = facts.kernel_constants(arch, dtype, hd, hdv)
            key = (k.kernel, hdv == 256, bool(facts.sm100_hd256_lacks(arch, hd, hdv, "bwd")), hd <= 64,
                   _round_up(hd, 16) != _round_up(hd, 32), hd != hdv)
        prev = out.get(key)
        odd = _round_up(hd, 16) != _round_up(hd, 32)
        if prev is None or (not odd and hd > prev[0]) or (odd and hd < prev[0]):
            out[key] = (hd, hdv)
    named = {}
    for hd, hdv in sorted(out.values()):
        named[f"{hd}" if hd == hdv else f"{hd}x{hdv}"] = (hd, hdv)
    return named


@dataclasses.dataclass
class FeatureSpace:
    """The dimensions and values of one audit's space, and the support predicate.

    ``values``: dimension -> its values (ordered). ``hd``: class name -> (hd, hdv).
    ``bwd_support(row) -> reason or None``: why FA4 runs no backward for a (partial) row."""

    arch: str
    dtype: str
    values: dict[str, tuple[str, ...]]
    hd: dict[str, tuple[int, int]]
    score_pairs: tuple[str, ...] = ()
    mask_pairs: tuple[str, ...] = ()
    mask_pairs_bwd: tuple[str, ...] = ()
    notes: dict[str, str] = dataclasses.field(default_factory=dict)
    #: concrete values behind a deployment's dimension values (name -> value); the generic
    #: space's values are realised by :func:`fa4verify.coverage.cases.problem_for` itself
    windows: dict[str, tuple] = dataclasses.field(default_factory=dict)     # "win:L,R" -> (L, R)
    heads: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)   # "h:32/8" -> (32, 8)
    lengths: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)  # "len:a,b" -> (a, b)
    softcaps: dict[str, float] = dataclasses.field(default_factory=dict)  # "on:30" -> 30.0
    pages: dict[str, int] = dataclasses.field(default_factory=dict)       # "paged:16" -> 16
    scales: dict[str, float] = dataclasses.field(default_factory=dict)    # "scale:0.0625" -> 0.0625

    # ---------------------------------------------------------------- support
    def why_not(self, row: Mapping[str, str]) -> Optional[str]:
        """Why no valid problem has the (partial) ``row``'s values, or None. Pairwise by
        construction: every rule names at most two dimensions (plus the arch)."""
        g = row.get
        form, mask, hd = g("form"), g("mask"), g("hd")
        for dim, v in row.items():
            if dim in self.values and v not in self.values[dim]:
                return f"{dim}={v} is outside this space"
        if g("softcap") not in (None, "off"):
            row = dict(row, softcap="on")
            g = row.get
        if g("sink") not in (None, "off"):
            row = dict(row, sink="on")
            g = row.get
        if form == "split_kv" and (why := self._split_kv_refusal(row)) is not None:
            return why
        if g("descale") not in (None, "off") and g("softcap") == "on":
            return ("fa4verify does not judge softcap with fp8 descales yet (FA4 folds the descales into the "
                    "softcap score_mod's scale: two fp32 roundings its softcap budget does not count)")
        if form in _MOD_KEEP_FORMS and mask not in (None, "none"):
            return f"{form}: FA4 drops causal/window with a mask_mod (write them into the mask)"
        if form == "score_mod":
            if not self.score_pairs:
                return "no score_mod pair with a CuTe function is registered"
            if g("softcap") == "on":
                return "a score_mod pair and softcap cannot be combined (FA4 asserts)"
            if g("sink") == "on":
                # fa4verify's own gap: FA4's interface.py takes both (no assertion ties them)
                return "fa4verify does not plan a score_mod pair with a learnable sink yet (FA4 takes both)"
        if form == "block_sparse_mod" and not self.block_mask_pairs:
            return "no mask pair with a CuTe mask_mod (fa4verify.mods) is registered for the mask blocks"
        if form == "mask_mod" and not self.mask_pairs:
            return "no CuTe mask_mod pair is registered"
        if form == "seqused_q" and g("seqlen") == "zero" and "zero" in self.lengths and self.lengths["zero"][0] != 0:
            return "seqused_q: this deployment's empty sequences are keys only, and K/V go batched whole here"
        if g("seqlen") == "zero" and form is not None and not (form in _KV_FORMS + MOD_FORMS or is_paged(form)):
            return f"a zero-length sequence needs a varlen call form, not {form}"
        if g("seqlen") == "many" and form is not None and not (form in _KV_FORMS + MOD_FORMS or is_paged(form)):
            return f"more sequences than FA4's batch-search threshold need a varlen call form, not {form}"
        if form in MOD_FORMS and g("seqlen") in VARLEN_SEQLENS and not self.varlen_pairs(form):
            return (f"{form} on a varlen call takes a pair of fa4verify.mods that needs no square sequences; "
                    "none is registered")
        if (why := self._hd256_refusal(row, "fwd")) is not None:
            return why
        if self.dtype == "fp8" and hd is not None:
            from fa4verify.kernels.features import sm100_fp8_fwd_does_not_build
            if sm100_fp8_fwd_does_not_build(*self.hd[hd]):
                return ("known issue sm100_fp8_fwd_no_build (FA4's fp8 forward does not compile at head dims that "
                        "pad to 48, 80 or 112: compile-only)")
        if is_paged(form) and hd is not None and self._paged_non_tma(form, hd, mask) \
                and any(d % facts.HDIM_MULTIPLE for d in self.hd[hd]):
            return (f"{form}: FA4's non-TMA paged KV (page size != tile_n) needs head dims that are multiples "
                    f"of {facts.HDIM_MULTIPLE} (flash_fwd_sm90.py / flash_fwd_sm100.py assert 'Paged KV does not "
                    f"support irregular head dim')")
        if form in BLOCK_FORMS and g("det") == "on" and self.arch == "sm90" and self.no_backward(row) is None:
            return (f"{form}: FA4's SM90 block-sparse backward has no deterministic mode (flash_bwd_sm90.py "
                    "asserts 'Deterministic not implemented for block-sparse backward')")
        if g("det") == "off" and (why := self.no_backward(row)) is not None:
            return f"det=off is a backward setting; {why}"
        return None

    def _split_kv_refusal(self, row: Mapping[str, str]) -> Optional[str]:
        """Why no row calls FA4 with ``num_splits > 1`` at the (partial) row's values: FA4's own
        refusal on this arch, or a cut of the keys fa4verify does not model
        (:func:`fa4verify.kernels.facts.split_kv_key_ranges`: under a causal or local mask, one
        query tile's rows; FA4 runs hd != hdv with hdv 512 unsplit), or None. The generic space's
        masked split rows take a short query side (:func:`fa4verify.coverage.cases.problem_for`),
        except ``q_gt_k``; its hd != hdv split rows 64 KV tiles more (FA4's own 64-key tiles and
        split count)."""
        from fa4verify.kernels.features import cell
        if cell("split_kv", "sm90" if self.arch == "sm90" else "sm100", "fwd").status != "supported":
            return "split_kv: FA4 has no split-KV forward on this arch (interface.py asserts 'SplitKV not supported')"
        hd, mask, seqlen, gqa = row.get("hd"), row.get("mask"), row.get("seqlen"), row.get("gqa")
        if hd is not None and self.hd[hd][1] == 512 and self.hd[hd][0] != 512:
            return "split_kv: FA4 runs an hd != hdv call with hdv 512 unsplit (interface.py _get_fwd_config)"
        if hd is not None and self.hd[hd][0] != self.hd[hd][1] and seqlen == "q_gt_k" and seqlen not in self.lengths:
            return ("split_kv: not planned by fa4verify at hd != hdv: FA4 splits such a call only over 64 KV tiles "
                    "or more, and a query side longer than that fills a B200's SMs with query tiles at most head "
                    "counts, where FA4's heuristic keeps one split (interface.py _get_fwd_config)")
        if mask is None or not (mask in ("causal", "causal_left") or is_local(mask)) or seqlen is None:
            return None
        rows = facts.SPLIT_KV_ONE_TILE_ROWS
        if seqlen in self.lengths:
            from fa4verify.coverage.cases import heads_of
            sq = self.lengths[seqlen][0]
            ratio = 1 if gqa is None else heads_of(self, gqa)[0] // heads_of(self, gqa)[1]
            if sq * ratio <= rows:
                return None
        elif seqlen != "q_gt_k":
            return None
        return (f"split_kv: under a causal or local mask fa4verify models FA4's cut for one query tile "
                f"(query rows x packed heads <= {rows}; FA4 cuts each tile's own key range)")

    def _paged_non_tma(self, form: str, hd: str, mask: Optional[str] = None) -> bool:
        """Whether FA4 reads this paged form's K/V without TMA (``interface.py``:
        ``paged_kv_non_tma=page_size not in [None, tile_n]``). tile_n is the forward tile of the
        row's mask; without a mask, a page size is non-TMA only when it matches the tile of no mask."""
        if form == "paged_tile":
            return False
        page = 16 if form == "paged_small" else self.pages.get(form)
        if page is None:
            return False
        hdv = self.hd[hd]
        masks = [(mask in ("causal", "causal_left"), is_local(mask))] if mask is not None else \
            [(False, False), (True, False), (False, True), (True, True)]
        tiles = {facts.fwd_tile(self.arch, self.dtype, *hdv, causal and not local, local)[1] for causal, local in masks}
        return page not in tiles

    def gqa_ratio(self, gqa: str) -> float:
        """Query heads per KV head of a ``gqa`` value (a deployment's ``h:<q>/<kv>`` included)."""
        if gqa in self.heads:
            q, kv = self.heads[gqa]
            return q / kv
        return {"1": 1.0, "2": 2.0, "4": 4.0, "7": 7.0, "mqa": float("inf"), "2_unpacked": 2.0}[gqa]

    def _form_bwd(self, form: str) -> Optional[str]:
        from fa4verify.kernels.features import cell
        if is_paged(form):
            c = cell("paged_kv", "sm90" if self.arch == "sm90" else "sm100", "bwd")
            if c.status != "supported":
                return "FA4 has no paged-KV backward (page_table is forward-only)"
        if form == "mask_mod" and not self.mask_pairs_bwd:
            return "no registered CuTe mask_mod pair has a backward"
        if form == "block_sparse_mod" and not any(n in self.mask_pairs_bwd for n in self.block_mask_pairs):
            return "no registered mask pair for the mask blocks has a backward"
        if form == "block_sparse_varlen":
            return VARLEN_SPARSE_BWD
        if form == "split_kv":
            return "split-KV is forward-only (_flash_attn_bwd has no num_splits)"
        return None

    def varlen_pairs(self, form: str) -> tuple[str, ...]:
        """The pairs a ``form`` row (a :data:`MOD_FORMS` one) takes on a varlen call: those of
        :mod:`fa4verify.mods` (a named CuTe mask_mod has no varlen call form here) that do not
        need square sequences."""
        from fa4verify import mods
        names = self.score_pairs if form == "score_mod" else self.block_mask_pairs
        return tuple(n for n in names if n.startswith("mod:") and n[4:] in mods.names()
                     and not mods.get(n[4:]).self_attention_only)

    @property
    def block_mask_pairs(self) -> tuple[str, ...]:
        """The mask pairs a ``block_sparse_mod`` row can put inside its mask blocks: those of
        :mod:`fa4verify.mods` (``"mod:<name>"``: FA4's ``mask_mod`` with their aux tensors)."""
        return tuple(n for n in self.mask_pairs if n.startswith("mod:"))

    def _hd256_refusal(self, row: Mapping[str, str], pass_: str) -> Optional[str]:
        """Why FA4's dedicated SM100 (256, 256) kernel of ``pass_`` refuses the row's features
        (:func:`fa4verify.kernels.facts.sm100_hd256_lacks`: with the pinned 4.0.0b36 the backward
        only), or None."""
        dims = self.hd.get(row.get("hd")) if row.get("hd") is not None else None
        lacks = facts.sm100_hd256_lacks(self.arch, *dims, pass_) if dims is not None else frozenset()
        if not lacks:
            return None
        form, mask = row.get("form"), row.get("mask")
        used = {name for name, on in (("softcap", row.get("softcap") == "on"), ("sink", row.get("sink") not in (None, "off")),
                                      ("local", is_local(mask)), ("score_mod", form == "score_mod"),
                                      ("mask_mod", form in ("mask_mod", "block_sparse_mod")),
                                      ("block_sparse", form in BLOCK_FORMS)) if on} & lacks
        return facts.sm100_hd256_refusal(pass_, used) if used else None

    def _bwd(self, form: str, hd: str) -> Optional[str]:
        why = self._form_bwd(form)
        if why is None and form in BLOCK_FORMS and self.arch == "sm90":
            from fa4verify.kernels.features import sm90_sparse_bwd_does_not_build
            if sm90_sparse_bwd_does_not_build(*self.hd[hd]):
                why = "known issue sm90_block_sparse_bwd_no_build (FA4's SM90 block-sparse backward does not build)"
        if why is None and form in BLOCK_FORMS and self.arch == "sm90" and not facts.sm90_fwd_fits_sparse_kv():
            from fa4verify.coverage.cases import sm90_bwd_sparse_block, sparse_block_size
            d, dv = self.hd[hd]           # a block-sparse row has no causal/window (why_not)
            bwd_n, fwd_n = sm90_bwd_sparse_block(d, dv)[1], sparse_block_size(self.arch, d, dv)[1]
            if fwd_n != bwd_n:
                why = (f"this FA4 release's SM90 block-sparse forward takes KV blocks of its own tile_n ({fwd_n}) "
                       f"only and its backward of {bwd_n}: no block mask serves both passes "
                       f"(_fit_sm90_fwd_tile_to_block_sparsity came with 4.0.0b33)")
        return why

    def no_backward(self, row: Mapping[str, str]) -> Optional[str]:
        """Why FA4 runs no backward for a (partial) row, as far as its form (and head dim) tell;
        None where it may."""
        form, hd, gqa = row.get("form"), row.get("hd"), row.get("gqa")
        if self.dtype == "fp8":
            from fa4verify.targets import FP8_NO_BACKWARD
            return FP8_NO_BACKWARD
        if form is not None:
            why = self._form_bwd(form) if hd is None else self._bwd(form, hd)
            if why is not None:
                return why
        if (why := self._hd256_refusal(row, "bwd")) is not None:
            return why
        cu_seqlens = form in _CU_SEQLENS_FORMS or (form in MOD_FORMS and row.get("seqlen") in VARLEN_SEQLENS)
        if cu_seqlens and (row.get("softcap") not in (None, "off") or form == "score_mod") \
                and not facts.bwd_takes_varlen_score_mod():
            return ("this FA4 release has no varlen backward with a score_mod, softcap included (its "
                    "_flash_attn_bwd asserts 'varlen + score_mod not supported in bwd yet')")
        if form == "seqused_q" and row.get("seqlen") == "many" and facts.bwd_refuses_many_seqused_q():
            return ("FA4 finding seqused_q_many_bwd: the backward asserts on a seqused_q call with more "
                    "sequences than its batch-search threshold (_flash_attn_bwd builds the K side's batch "
                    "lookup from cu_seqlens_k / seqused_k, both None when K/V go batched whole)")
        if row.get("sink") not in (None, "off") and not facts.bwd_takes_sink():
            return ("this FA4 release has no backward with a learnable sink (its _flash_attn_bwd takes no "
                    "learnable_sink; 4.0.0b26 added it)")
        if self.arch == "sm90" and hd is not None:
            from fa4verify.fuzz.known_issues import sm90_bwd_smem_over_holds
            if sm90_bwd_smem_over_holds(*self.hd[hd]):
                # a row there runs no backward: its triples would be holes (measured, 0518951)
                return ("known issue sm90_bwd_hdv_gt_hd_smem (FA4's SM90 MHA backward at head_dim < head_dim_v "
                        "does not launch: its shared storage exceeds a block's; with GQA FA4 asserts)")
        mask = row.get("mask")
        if self.arch == "sm90" and hd is not None and mask is not None:
            from fa4verify.kernels.features import sm90_bwd_does_not_build
            if sm90_bwd_does_not_build(*self.hd[hd], mask in ("causal", "causal_left"), is_local(mask)):
                return "known issue sm90_bwd_hd104_112_compile (FA4's SM90 backward does not compile there)"
        if hd is not None and gqa is not None:
            return facts.bwd_refusal(self.arch, *self.hd[hd], self.gqa_ratio(gqa))
        return None

    def passes(self, row: Mapping[str, str]) -> tuple[str, ...]:
        """The passes a full row runs: ("fwd", "bwd") where FA4 has a backward for it."""
        return ("fwd",) if self.no_backward(row) is not None else PASSES

    def valid(self, row: Mapping[str, str]) -> bool:
        return self.why_not(row) is None

    def describe(self) -> dict[str, Any]:
        """JSON form (:meth:`from_dict` reads it back: the report's merge re-derives coverage)."""
        return {"arch": self.arch, "dtype": self.dtype, "dimensions": {k: list(v) for k, v in self.values.items()},
                "head_dims": {k: list(v) for k, v in self.hd.items()}, "score_pairs": list(self.score_pairs),
                "mask_pairs": list(self.mask_pairs), "mask_pairs_bwd": list(self.mask_pairs_bwd),
                "notes": dict(self.notes), "windows": {k: list(v) for k, v in self.windows.items()},
                "heads": {k: list(v) for k, v in self.heads.items()},
                "lengths": {k: list(v) for k, v in self.lengths.items()}, "softcaps": dict(self.softcaps),
                "pages": dict(self.pages), "scales": dict(self.scales)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FeatureSpace":
        return cls(d["arch"], d["dtype"], {k: tuple(v) for k, v in d["dimensions"].items()},
                   {k: (int(v[0]), int(v[1])) for k, v in d["head_dims"].items()}, tuple(d.get("score_pairs", ())),
                   tuple(d.get("mask_pairs", ())), tuple(d.get("mask_pairs_bwd", ())), dict(d.get("notes", {})),
                   {k: tuple(v) for k, v in d.get("windows", {}).items()},
                   {k: (int(v[0]), int(v[1])) for k, v in d.get("heads", {}).items()},
                   {k: (int(v[0]), int(v[1])) for k, v in d.get("lengths", {}).items()},
                   {k: float(v) for k, v in d.get("softcaps", {}).items()},
                   {k: int(v) for k, v in d.get("pages", {}).items()},
                   {k: float(v) for k, v in d.get("scales", {}).items()})

    def restrict(self, dim: str, keep: Iterable[str], note: str) -> "FeatureSpace":
        """This space with ``dim`` confined to ``keep`` (order kept); ``note`` says why (reports)."""
        k = set(keep)
        vals = dict(self.values)
        vals[dim] = tuple(v for v in self.values[dim] if v in k)
        hd = self.hd if dim != "hd" else {n: self.hd[n] for n in vals["hd"]}
        notes = dict(self.notes)
        notes[dim] = note
        return dataclasses.replace(self, values=vals, hd=hd, notes=notes)

    def empty(self) -> bool:
        return any(not v for v in self.values.values())


def space_for(arch: str, dtype: str, *, forms: Optional[Sequence[str]] = None, deployment: Any = None,
              score_pairs: Optional[Sequence[str]] = None, mask_pairs: Optional[Sequence[str]] = None,
              mask_pairs_bwd: Optional[Sequence[str]] = None,
              distributions: Sequence[str] = PLAN_DISTRIBUTIONS) -> FeatureSpace:
    """The space of an audit on ``arch`` / ``dtype``. ``forms``: the call forms the target runs
    (default all); ``deployment``: a :class:`fa4verify.deployment.Deployment` that confines every
    dimension (:meth:`~fa4verify.deployment.Deployment.confine`); the registered pairs default to
    the registries' (:mod:`fa4verify.mods`, :func:`fa4verify.problem.calls.mask_mod_pairs`)."""
    if score_pairs is None or mask_pairs is None or mask_pairs_bwd is None:
        reg_s, reg_m, reg_mb = registered_pairs()
        score_pairs = reg_s if score_pairs is None else score_pairs
        mask_pairs = reg_m if mask_pairs is None else mask_pairs
        mask_pairs_bwd = reg_mb if mask_pairs_bwd is None else mask_pairs_bwd
    hd = head_dim_classes(arch, dtype)
    vals: dict[str, tuple[str, ...]] = {
        "form": tuple(f for f in FORMS if forms is None or f in forms),
        "mask": MASKS, "hd": tuple(hd), "gqa": GQAS, "seqlen": SEQLENS, "softcap": ONOFF, "sink": SINKS,
        "scale": SCALES, "det": ("on", "off"), "values": tuple(distributions)}
    notes: dict[str, str] = {}
    if facts.varlen_batch_search_threshold() is None:
        vals["seqlen"] = tuple(v for v in vals["seqlen"] if v != "many")
        notes["seqlen"] = "this FA4 release has no varlen batch-search threshold (BIN_BATCH_SEARCH_THRESH)"
    if not score_pairs:
        vals["form"] = tuple(f for f in vals["form"] if f != "score_mod")
    if not mask_pairs:
        vals["form"] = tuple(f for f in vals["form"] if f != "mask_mod")
    if not any(n.startswith("mod:") for n in mask_pairs):
        vals["form"] = tuple(f for f in vals["form"] if f != "block_sparse_mod")
    if not facts.varlen_block_sparsity():
        vals["form"] = tuple(f for f in vals["form"] if f != "block_sparse_varlen")
        notes["form"] = "this FA4 release takes no block sparsity on a varlen call (no cu_total_m_blocks)"
    if dtype == "fp8":     # forward only, no mod pairs (the adapter routes no score_mod / aux with fp8)
        from fa4verify.kernels.features import cell
        fp8 = cell("fp8", "sm90" if arch == "sm90" else "sm100", "fwd")
        if fp8.status != "supported" or arch not in ("sm100", "sm103"):
            vals["hd"], hd = (), {}
            notes["hd"] = f"FA4 runs fp8 on SM 10.x only, not {arch} (interface.py asserts 'FP8 is only supported on SM100')"
        score_pairs, mask_pairs = (), tuple(n for n in mask_pairs if n.startswith("fn:"))
        mask_pairs_bwd = ()
        vals["form"] = tuple(f for f in vals["form"] if f not in ("score_mod", "block_sparse_mod")
                             and (f != "mask_mod" or mask_pairs))
        vals["det"] = ("on",)
        vals["descale"] = tuple(DESCALES)
        notes["det"] = "fp8: FA4 runs the forward only"
    sp = FeatureSpace(arch, dtype, vals, hd, tuple(score_pairs), tuple(mask_pairs), tuple(mask_pairs_bwd))
    if notes:
        sp = dataclasses.replace(sp, notes=dict(sp.notes, **notes))
    if deployment is not None:
        sp = deployment.confine(sp)
    return sp


def registered_pairs() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(score pairs, mask pairs, mask pairs with a backward) registered in this process: the
    :mod:`fa4verify.mods` pairs (``"mod:<name>"``: run through FA4's ``mask_mod`` / ``score_mod``
    with their aux tensors, backward included) and the CuTe mask_mod call forms of
    :func:`fa4verify.problem.calls.mask_mod_pairs` (``"fn:<name>"``)."""
    from fa4verify import mods
    from fa4verify.problem.calls import mask_mod_pairs
    score = tuple(f"mod:{n}" for n in mods.names() if mods.get(n).kind == "score")
    mask_mod = tuple(f"mod:{n}" for n in mods.names() if mods.get(n).kind == "mask")
    mm = mask_mod_pairs()
    fn = tuple(f"fn:{n}" for n in sorted(mm))
    fn_bwd = tuple(f"fn:{n}" for n in sorted(mm) if mm[n].backward)
    return score, mask_mod + fn, mask_mod + fn_bwd
