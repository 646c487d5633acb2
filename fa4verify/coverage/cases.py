"""A plan row made concrete: the :class:`~fa4verify.problem.AttentionProblem` it runs.

Shapes are chosen relative to the forward tile the row's head dim selects (``seqlen`` class),
windows cross a tile boundary, page tables are permuted, block masks use the block size FA4's
backward takes, and every row with a mask or call-form edge gets the ``"edges"`` value
distribution on every other row of the plan (Note [Edge values]) so each edge kind is also judged
with the one-key self-check. Deterministic in (row, index, seed).
"""
from __future__ import annotations

import random
from typing import Any, Mapping, Optional

import numpy as np

from fa4verify.coverage.space import DESCALES, MOD_FORMS, custom_scale, VARLEN_SEQLENS, FeatureSpace, is_local, is_paged, is_unpacked
from fa4verify.kernels import facts

__all__ = ["problem_for", "plan_problems", "sparse_block_size", "varlen_sparse_block_size", "edge_problems",
           "NONDETERMINISTIC_EDGES"]

_VALUE_PARAMS: dict[str, tuple[tuple[str, float], ...]] = {
    "normal": (("sigma", 1.0),), "outliers": (("p", 0.01), ("outlier_std", 100.0)),
    "negative_scores": (("shift", 100.0),), "peaked_rescale": (("delta", 8.0), ("sigma", 0.1)),
    "tiny": (("e", 8.0),), "edges": (("score", 6.0),), "huge": (("e_qk", 6.0), ("e_v", 4.0)),
}
_HEADS = {"1": (2, 2), "2": (4, 2), "4": (8, 2), "7": (14, 2), "mqa": (3, 1), "2_unpacked": (4, 2)}


def heads_of(space: FeatureSpace, gqa: str) -> tuple[int, int]:
    """(query heads, KV heads) of a plan row's ``gqa`` value (a deployment's ``h:<q>/<kv>`` included)."""
    return space.heads.get(gqa) or _HEADS[gqa]


def sparse_block_size(arch: str, hd: int, hdv: int, *, causal: bool = False, local: bool = False) -> tuple[int, int]:
    """The (q, kv) block of a block-sparse row: on SM90 the block FA4's backward takes (read from
    FA4's ``_tile_size_bwd_sm90`` through the adapter when FA4 is installed), so forward and
    backward run on one block mask; 128 x 128 on SM100. A release whose SM90 forward takes only
    its own tile_n as KV block (:func:`fa4verify.kernels.facts.sm90_fwd_fits_sparse_kv` False)
    gets the forward's block where the two differ: that row runs forward only
    (:meth:`FeatureSpace.no_backward` asks this function, for an unmasked row). A causal or
    windowed block-sparse row (``causal`` / ``local``, Note [Block lists with causal or a window])
    takes the same block where the forward fits its tile to the lists (4.0.0b33 on), the forward's
    own masked tile_n before.

    SM100: 256 x 128, and 256 x 256 at head dims >= 128. Its forward takes Q blocks that are a
    multiple of ``q_stage * tile_m``, and ``q_stage`` is 2 once the (GQA-packed) query length
    passes one 128-row tile (``interface.py`` ``_get_fwd_config``): a 128-row block is refused there
    ("must be a multiple of 256", compile-only on this CPU, FA4 4.0.0b36, for MHA at seqlen_q 300
    and packed GQA 4/2 at 100), 256 rows serve both stages. Its backward runs 2-CTA at head dims
    >= 128 only when the KV block covers an even number of its tile_n tiles
    (``block_sparsity.block_sparse_bwd_supports_2cta``), and requires it at head dim 192 ("SM100
    block-sparse backward with head_dim=192 requires 2CTA", compile-only on this CPU): a 256-key
    block there runs FA4's 2-CTA block-sparse backward, the smaller head dims its 1-CTA one; the
    forward takes the 256-key block as two KV tiles. Forward and backward compile with these
    (compile-only: not run on a B200)."""
    if arch != "sm90":
        return 256, (256 if hd >= 128 else 128)
    bwd = sm90_bwd_sparse_block(hd, hdv)
    if not facts.sm90_fwd_fits_sparse_kv():
        fwd_n = sm90_fwd_sparse_tile_n(hd, hdv, causal, local, block_q=bwd[0])
        if fwd_n != bwd[1]:
            return bwd[0], fwd_n
    return bwd


def varlen_sparse_block_size(arch: str, hd: int, hdv: int, max_seqlen_q: int, rows_per_query: int,
                             dtype: str = "bf16") -> tuple[int, int]:
    """The (q, kv) block of a ``block_sparse_varlen`` row (forward only). FA4's varlen block
    sparsity takes Q blocks of exactly ``q_stage * tile_m`` of its forward
    (``normalize_block_sparse_config`` forces ``q_subtile_factor`` 1): on SM90 the forward's own
    tile_m (``q_stage`` 1; a 128-row block would shrink a 192-row tile to 64 rows, refused), on
    SM100 ``q_stage`` is 2 once the packed query length (``max_seqlen_q`` times
    ``rows_per_query``, the query heads per KV head where FA4 packs GQA) passes tile_m, except at
    hdv 256 (``interface.py`` ``_get_fwd_config``: "Two Q tiles exceed TMEM capacity at hdim_v
    256"); the KV block is :func:`sparse_block_size`'s."""
    tm = facts.fwd_tile(arch, dtype, hd, hdv, False, False)[0]
    kv = sparse_block_size(arch, hd, hdv)[1]
    if arch == "sm90":
        return tm, kv
    q_stage = 2 if max_seqlen_q * rows_per_query > tm and hdv != 256 else 1
    return q_stage * tm, kv


def sm90_fwd_sparse_tile_n(hd: int, hdv: int, causal: bool, local: bool, *, block_q: int = 128) -> int:
    """tile_n of FA4's SM90 forward under Q blocks of ``block_q`` rows (the adapter reads FA4's
    ``_tile_size_fwd_sm90``; without FA4 the pinned table, whose 192-row tiles at head dims <= 96
    fall back to 128 x 128 when 192 does not divide the Q block)."""
    try:
        from fa4verify.kernels import adapter
        return adapter.sm90_fwd_sparse_tile_n(hd, hdv, causal=causal, local=local, block_q=block_q)
    except Exception:  # noqa: BLE001  (no FA4 here)
        tm, tn = facts.sm90_fwd_tile(hd, hdv, causal, local)
        return 128 if (hd <= 96 and block_q % tm) else tn


def sm90_bwd_sparse_block(hd: int, hdv: int) -> tuple[int, int]:
    """The (q, kv) block FA4's SM90 backward takes under block sparsity (the adapter reads FA4's
    ``_tile_size_bwd_sm90``; without FA4 the twin's stand-in grid)."""
    try:
        from fa4verify.kernels import adapter
        return tuple(adapter.sm90_bwd_sparse_block_size(hd, hdv))
    except Exception:  # noqa: BLE001  (no FA4 here: the twin's stand-in grid)
        return 128, facts.sm90_bwd_tile(hd, hdv, False, False)[1]


def _lengths(cls: str, tm: int, tn: int) -> tuple[int, int]:
    return {"lt_tile": (tn // 2 + 3, tn // 2 + 3), "eq_tile": (tn, tn), "tile_m1": (tn - 1, tn - 1),
            "tile_p1": (tn + 1, tn + 1), "multi": (2 * tm + 5, 3 * tn + 7), "q_gt_k": (tm + 9, tn // 2 - 5),
            "q_lt_k": (17, 2 * tn + 3), "zero": (tn + 1, tn - 1), "many": (9, 13)}[cls]


#: the KV tiles (of the forward's default width) an hd != hdv split row adds: FA4 splits such a
#: call only over 64 of them or more (facts.split_kv_config)
SPLIT_KV_DIFF_HD_TILES = 64


def problem_for(space: FeatureSpace, row: Mapping[str, str], index: int, *, seed: int = 0):
    """The problem of plan row ``index``."""
    from fa4verify.problem import CallForm, AttentionProblem, ValueSpec
    rng = random.Random(f"{seed}:{index}:{sorted(row.items())}")
    arch, dtype = space.arch, space.dtype
    hd, hdv = space.hd[row["hd"]]
    form, mask = row["form"], row["mask"]
    nh, nk = heads_of(space, row["gqa"])
    causal = mask in ("causal", "causal_left")
    local = is_local(mask)
    tm, tn = facts.fwd_tile(arch, dtype, hd, hdv, causal and not local, local)
    sq, sk = space.lengths.get(row["seqlen"]) or _lengths(row["seqlen"], tm, tn)
    wl = rng.choice((1, 7, tn - 1, tn + 1))
    wr = rng.choice((1, 5, tn))
    window = space.windows.get(mask) or {"none": (None, None), "causal": (None, None), "left": (wl, None),
                                         "right": (None, wr), "both": (wl, wr), "causal_left": (wl, None)}[mask]
    dist = row["values"]
    vs = ValueSpec(dist, rng.randrange(2 ** 31), _VALUE_PARAMS.get(dist, ()))
    kw: dict[str, Any] = dict(arch=arch, dtype=dtype, nheads=nh, nheads_kv=nk, head_dim=hd, head_dim_v=hdv,
                              causal=causal, window_size=tuple(window),
                              softcap=space.softcaps.get(row["softcap"], 30.0 if row["softcap"] == "on" else 0.0),
                              sink=row["sink"] != "off", sink_dtype="fp32" if row["sink"] == "off" else row["sink"],
                              values=vs,
                              softmax_scale=space.scales.get(row.get("scale"),
                                                             custom_scale(hd) if row.get("scale") == "custom" else None),
                              descales=DESCALES[row.get("descale", "off")])
    mod_varlen = form in MOD_FORMS and row["seqlen"] in VARLEN_SEQLENS
    if form in ("varlen", "seqused_k", "seqused_q", "block_sparse_varlen") or is_paged(form) or mod_varlen:
        if row["seqlen"] == "zero" and "zero" in space.lengths:
            # a deployment's empty sequences: only on the side its minimum allows, the others at
            # one of its lengths
            zq, zk = space.lengths["zero"]
            sq, sk = next(v for n, v in space.lengths.items() if n != "zero")
            sqs, sks = (sq, 0 if zq == 0 else sq, sq), (sk, sk, 0 if zk == 0 else sk)
        elif row["seqlen"] in space.lengths:         # a deployment's lengths: every sequence inside it
            sqs, sks = (sq, sq), (sk, sk)
        elif row["seqlen"] == "zero":
            sqs, sks = (sq, 0, 33), (sk, 5, 0)
        elif row["seqlen"] == "many":       # one sequence past FA4's threshold, each 1..9 x 1..13
            n = (facts.varlen_batch_search_threshold() or 0) + 1
            sqs = tuple(1 + (i * 5) % sq for i in range(n))
            sks = tuple(1 + (i * 7) % sk for i in range(n))
        else:
            sqs, sks = (sq, max(1, sq // 3), sq // 2 + 1), (sk, max(1, sk // 2 + 3), max(1, sk - 9))
        if form == "seqused_q":              # K/V batched whole: every sequence sees the same keys
            sks = (max(sks),) * len(sqs)
            kw["call"] = CallForm(seqused_q=True, q_capacity=max(sqs) + 5)
        kw.update(batch=len(sqs), seqlens_q=sqs, seqlens_k=sks, seqlen_q=max(sqs), seqlen_k=max(sks))
        if form == "block_sparse_varlen":
            packed = 1 if is_unpacked(row["gqa"]) else nh // nk
            kw["call"] = _listed_block_call(
                CallForm, varlen_sparse_block_size(arch, hd, hdv, max(sqs), packed, dtype),
                [(lq, lk, i) for i, (lq, lk) in enumerate(zip(sqs, sks))], rng)
        elif form not in ("varlen", "seqused_q") and not mod_varlen:
            cap = max(sks) + 7
            page: Optional[int] = None
            if form == "paged_small":
                page = 16
            elif form == "paged_tile":
                page = tn
            elif is_paged(form):
                page = space.pages[form]
            if page is not None:
                cap = -(-cap // page) * page
            kw["call"] = CallForm(seqused_k=True, kv_capacity=cap, page_size=page,
                                  page_seed=rng.randrange(2 ** 16) if page else None, spare_pages=1 if page else 0)
    else:
        kw.update(batch=2, seqlen_q=sq, seqlen_k=sk)
    if form == "split_kv":
        # 2 or 3 splits over the class's keys and two more KV tiles, so at least two splits hold
        # keys and FA4's combine merges them (with 4 tiles in 3 splits the third is empty: LSE -inf)
        kw["call"] = CallForm(num_splits=rng.choice((2, 3)))
        if row["seqlen"] not in space.lengths:
            kw["seqlen_k"] += 2 * tn
            if row["seqlen"] == "q_gt_k":
                kw["seqlen_q"] += 2 * tn
            if causal or local:      # one query tile (facts.split_kv_key_ranges): decoding, a prefill chunk
                kw["seqlen_q"] = min(kw["seqlen_q"], facts.SPLIT_KV_ONE_TILE_ROWS // (nh // nk))
            if window[0] is not None and mask not in space.windows:   # the left window spans two more tiles too
                kw["window_size"] = (window[0] + 2 * tn, window[1])
        if hd != hdv and row["seqlen"] not in space.lengths:
            # FA4 splits an hd != hdv call only over 64 KV tiles of its default width or more, into
            # its heuristic's count of the SMs over the query tiles (facts.split_kv_config): the
            # keys (and a left window, its edge still inside them) grow by 64 tiles, one batch
            # entry (a deployment's own lengths stay: FA4 splits its calls, or runs them unsplit)
            grow = SPLIT_KV_DIFF_HD_TILES * tn
            kw["batch"] = 1
            kw["seqlen_k"] += grow
            if kw["window_size"][0] is not None and mask not in space.windows:
                kw["window_size"] = (kw["window_size"][0] + grow, kw["window_size"][1])
    if form == "block_sparse":       # a block mask per batch entry (CallForm.block_per_batch)
        kw["call"] = _listed_block_call(CallForm, sparse_block_size(arch, hd, hdv, causal=causal and not local,
                                                                    local=local),
                                        [(kw["seqlen_q"], kw["seqlen_k"], b) for b in range(kw["batch"])], rng,
                                        per_batch=True)
    if form in ("mask_mod", "score_mod", "block_sparse_mod"):
        names = space.varlen_pairs(form) if mod_varlen else _pairs_of(space, form)
        usable = [n for n in names if (sq == sk and not mod_varlen) or not _self_only(n)]
        if row.get("pair") in names:          # plan_problems' choice
            name = row["pair"]
            usable = [name] if name in usable else []
        else:
            name = usable[index % len(usable)] if usable else names[index % len(names)]
        kind, _, pair = name.partition(":")
        if kind == "fn":
            kw["call"] = CallForm(mask_mod_fn=pair)
        else:
            kw["mods"] = (pair,)
        if not usable:      # only self-attention pairs: make the row square
            kw.update(seqlen_q=sk)
        if form == "block_sparse_mod":
            kw["call"] = _partial_block_call(CallForm, sparse_block_size(arch, hd, hdv), kw["seqlen_q"],
                                             kw["seqlen_k"], rng)
    if is_unpacked(row["gqa"]):
        import dataclasses
        kw["call"] = dataclasses.replace(kw.get("call") or CallForm(), pack_gqa=False)
    return AttentionProblem(**kw)


def plan_problems(space: FeatureSpace, rows: list, *, seed: int = 0) -> tuple[list, list]:
    """(rows, problems) of a plan: every registered pair (yours included) runs on at least one
    row. The rows of the ``score_mod`` (``mask_mod``) form take the space's pairs in turn, each
    pair first on a row it runs as planned (a self-attention pair on a square row; on a row that
    runs the backward, a mask pair that has one), named in the row (``"pair"``, outside the
    coverage dimensions); a pair no row took gets a copy of a row it can run on (the copy covers
    no tuple its original does not)."""
    out = [dict(r) for r in rows]
    for form in ("score_mod", "mask_mod", "block_sparse_mod"):
        names = _pairs_of(space, form)
        idx = [i for i, r in enumerate(out) if r["form"] == form]
        if not idx or not names:
            continue

        def fits(row, *, backward: bool = True) -> list:
            if form in MOD_FORMS and row["seqlen"] in VARLEN_SEQLENS:     # a varlen call
                return list(space.varlen_pairs(form))
            ok = [n for n in names if not _self_only(n) or _square(space, row)] or list(names)
            if backward and form != "score_mod" and "bwd" in space.passes(row):
                ok = [n for n in ok if n in space.mask_pairs_bwd] or ok
            return ok

        pending = list(names)
        for k, i in enumerate(idx):
            ok = fits(out[i])
            first = [n for n in pending if n in ok]
            name = first[0] if first else ok[k % len(ok)]
            if name in pending:
                pending.remove(name)
            out[i]["pair"] = name
        for name in pending:
            base = next((out[i] for i in idx if name in fits(out[i], backward=False)), None)
            if base is None:        # a square length of the space, where the row allows one
                base = next((dict(out[i], seqlen=v) for i in idx for v in space.values["seqlen"]
                             if _square(space, {"seqlen": v}) and space.why_not(dict(out[i], seqlen=v)) is None),
                            out[idx[0]])
            out.append(dict(base, pair=name))
    return out, [problem_for(space, r, i, seed=seed) for i, r in enumerate(out)]


def _listed_block_call(CallForm, block: tuple[int, int], grids, rng: random.Random, *, per_batch: bool = False):
    """The call form of a ``block_sparse`` / ``block_sparse_varlen`` row: the first of 256 seeds
    (none: a ValueError) whose draw, over the row's grids (``(lq, lk, seq)``: one per varlen
    sequence, or per batch entry of a dense row with ``per_batch``), lists a block and, where there
    are two blocks or more, leaves one out; a dense row's entries get different masks where their
    grid has two blocks or more: FA4's skip of unlisted blocks, its listed-block loop and its
    per-entry block lists all run on the row by construction."""
    for _ in range(256):
        call = CallForm(block_size=block, block_seed=rng.randrange(2 ** 16), block_keep=0.6, block_per_batch=per_batch)
        masks = [call.block_mask(lq, lk, seq=seq) for lq, lk, seq in grids]
        listed = sum(int(m.sum()) for m in masks)
        total = sum(m.size for m in masks)
        differ = not per_batch or masks[0].size < 2 or any(not np.array_equal(masks[0], m) for m in masks[1:])
        if listed and (total < 2 or listed < total) and differ:
            return call
    raise ValueError(f"no block seed of 256 lists a block and leaves one out on grids {grids} (block {block})")


def _partial_block_call(CallForm, block: tuple[int, int], sq: int, sk: int, rng: random.Random):
    """The call form of a ``block_sparse_mod`` row (Note [Partial blocks]): the first of 256 seeds
    (none: a ValueError) whose draw lists a mask block; where the grid has two blocks or
    more, a full block too; and where the grid has room for both, a Q block with two mask blocks
    (FA4's block-sparse main loops take a row's first mask block and its later ones on branches of
    their own). Each of FA4's block lists, and the loop over several mask blocks, runs on the row by
    construction."""
    nq, nk = -(-sq // block[0]), -(-sk // block[1])
    for _ in range(256):
        call = CallForm(block_size=block, block_seed=rng.randrange(2 ** 16), block_keep=0.75, block_partial=0.5)
        listed, part = call.block_mask(sq, sk), call.partial_blocks(sq, sk)
        two = nk >= 3 or (nk == 2 and nq >= 2)      # room for two mask blocks in a row and a full block
        if part.any() and (nq * nk < 2 or (listed & ~part).any()) and (not two or part.sum(axis=1).max() >= 2):
            return call
    raise ValueError(f"no block seed of 256 gives the mask blocks a {sq} x {sk} row needs (block {block})")


def _pairs_of(space: FeatureSpace, form: str) -> tuple[str, ...]:
    """The registered pairs a row of ``form`` takes in turn (a ``block_sparse_mod`` row: the mask
    pairs of :mod:`fa4verify.mods`, whose mask_mod FA4 applies inside the mask blocks)."""
    return {"score_mod": space.score_pairs, "mask_mod": space.mask_pairs,
            "block_sparse_mod": space.block_mask_pairs}[form]


def _square(space: FeatureSpace, row) -> bool:
    """Whether the row's sequence-length value has seqlen_q == seqlen_k (in every sequence)."""
    sl = row["seqlen"]
    if row.get("form") in MOD_FORMS and sl in VARLEN_SEQLENS:
        return False
    if sl in space.lengths:
        a, b = space.lengths[sl]
        return a == b
    return sl in ("lt_tile", "eq_tile", "tile_m1", "tile_p1")


def _self_only(name: str) -> bool:
    kind, _, pair = name.partition(":")
    if kind != "mod":
        return False
    from fa4verify import mods
    return bool(getattr(mods.get(pair), "self_attention_only", False))


def _runs_bwd(space: FeatureSpace, **row: str) -> bool:
    """Whether FA4 runs a backward for an edge of these dimension values (the sink off unless the
    row says): :meth:`FeatureSpace.no_backward` finds no reason."""
    return space.no_backward({"sink": "off", **row}) is None


def _hd128(space: FeatureSpace) -> str:
    """The head-dim class of (128, 128) where the space has it, else its first: the edges that are
    not about head dims run at the head dim most models use."""
    return next((n for n in space.values["hd"] if space.hd[n] == (128, 128)), next(iter(space.values["hd"])))


def edge_problems(space: FeatureSpace, *, seed: int = 0) -> list[tuple[str, Any, bool]]:
    """Note [Constructed edges]: ``(name, problem, backward)`` of the FA4 paths no plan row's
    tile-relative shape reaches, each built by rule (never drawn), inside the space's own values;
    ``backward``: whether FA4 has a backward for it (:meth:`FeatureSpace.no_backward`):

    * ``empty_keys`` / ``empty_keys_sink``: a varlen call whose every key sequence is empty (FA4's
      forward returns before any kernel: O = 0, LSE = -inf, or the sink with a learnable sink; its
      backward returns zeros and, with a sink, dsink from dLSE);
    * ``empty_queries``: a varlen call whose every query sequence is empty;
    * ``negative_window``: window (-1, -1), which FA4 reads as no window
      (``_resolve_causal_local_window``);
    * ``sparse_q64`` (SM90): a block mask of 64-row Q blocks, on which FA4's SM90 forward shrinks its
      tile to 64 rows (``_fit_sm90_fwd_tile_to_block_sparsity``): a forward kernel of its own
      (forward only: the SM90 backward takes its own block), on releases whose forward fits its
      tile to the block (:func:`fa4verify.kernels.facts.sm90_fwd_fits_sparse_kv`);
    * ``packed_causal_block_end`` (SM90): PackGQA (3 query heads per KV head, which does not divide
      the forward's tile_m) with a causal mask, shaped so the last query row of the first M block
      (``ceil(tile_m / 3) - 1``) has its diagonal key at the first key of a KV tile: FA4's
      ``block_info.get_n_block_min_max`` must round the packed row bound up (``ceil_div``); with
      a small left window where the space has ``causal_left`` (the row then sees a few keys, so
      one lost key is a large share of it);
    * ``bwd_window_left_mblock`` (SM90): a window whose left edge puts the last query row that sees
      a KV tile's last key at the first row of a backward M block (``m_idx_left = 1 mod tile_m``
      of ``_tile_size_bwd_sm90``): FA4's ``get_m_block_min_max`` must include that M block;
    * ``score_bwd_indices`` (SM90): the ``rel_scale`` pair (its derivative reads ``kv - q``) on a
      dense MHA call at a head dim <= 128 (128 first: FA4's SM90 backward transposes S there,
      ``SdP_swapAB``), so ``score_mod_bwd`` must get the forward's indices; ``score_bwd_indices_tiles``
      the same over three backward M tiles and a bit (the pair's band crosses tile edges);
    * ``varlen_head_sections`` (SM90): a causal varlen call with 20 heads, more than one L2 head
      section of FA4's varlen LPT scheduler (16 heads for short sequences) and not a multiple of
      it: the last section's heads (``tile_scheduler.py``, ``nheads_in_this_section``);
    * ``head_mask_packgqa``: the ``head_window`` pair (a window per query head) on a packed GQA
      call with 4 query heads per KV head, two KV heads, rows past every head's span: FA4 must
      rebuild the logical query head of each packed row (``mask.py``, ``head_idx *
      qhead_per_kvhead + head_offset``) before it calls the mask_mod (Note [Masks by head]);
    * ``varlen_batch_groups``: a causal varlen call with 70 sequences, fewer than FA4's batch-search
      threshold and more than two of the varlen scheduler's warp-scan groups (31 sequences each,
      ``tile_scheduler.py``): the group stride of that search;
    * ``causal_l2_sections`` (SM90): a dense causal call whose K/V per head fill a third of FA4's
      LPT L2 budget (:func:`fa4verify.kernels.facts.lpt_l2_bytes`), so its 3 heads make a full L2
      section of 2 and a residual one: ``SingleTileLPTScheduler``'s section arithmetic (the plan's
      short rows all fit one section); ``causal_l2_sections_batch``: the same section of 2 filled by
      two batch entries of one head (the section count must count (batch, head) pairs);
    * ``det_bwd_l2_sections`` (SM90): a deterministic dense backward with 17 heads whose Q, dO and
      dQ accumulator per head fill a 24th of L2 (:func:`fa4verify.kernels.facts.lpt_bwd_swizzle`):
      ``SingleTileLPTBwdScheduler``'s full section of 16 and a residual one (every other
      deterministic backward of the audit fits one section);
    * ``varlen_lookup_long_first``: 257 sequences (more than FA4's batch-lookup threshold), 2 query
      heads per KV head, sequence 0 more packed M blocks of the forward than unpacked ones, and keys
      spanning two backward M tiles but one N tile: the lookup (``cu_total_m_blocks``) must count
      packed rows and each side's own tile (the plan's ``many`` rows have one block per sequence);
      its backward runs without ``deterministic`` (:data:`NONDETERMINISTIC_EDGES`);
    * ``varlen_lookup_chunks``: 1,100 one-query sequences, more than one chunk of FA4's block-count
      kernel (:func:`fa4verify.kernels.facts.cu_blocks_chunk`), which carries its running count
      from chunk to chunk (backward without ``deterministic``, as the one above);
    * ``packed_local_first_key`` (SM90): PackGQA (3 query heads per KV head) with a causal left
      window, shaped so M block 1's first packed row (logical row ``floor(tile_m / 3)``) has its
      leftmost key at the last key of a KV tile: FA4's ``get_n_block_min_max`` must round that
      row down;
    * ``seqused_k_packed``: ``seqused_k`` over packed K/V with ``cu_seqlens_k`` at capacity
      offsets (``CallForm.kv_packed``): FA4 takes each sequence's length from ``seqused_k`` and its
      offset from ``cu_seqlens_k`` (the plan's seqused_k rows pass batched K/V);
    * ``paged_full_pages``: paged KV at page size tile_n whose every sequence fills its pages,
      called without ``seqused_k`` (``CallForm.full_pages``): FA4 then takes each sequence's
      length from the page table's width (the plan's paged rows all pass ``seqused_k``);
    * ``varlen_score_aux_wrap``: a score pair that reads aux tensors at the query position
      (``rel_bias``, else ``alibi``) on a varlen call whose sequences have more queries than keys
      and more keys than queries (and an empty one): with aux tensors FA4 wraps the indices it
      hands the mod modulo the sequence's own lengths (``softmax.apply_score_mod_inner``; the
      backward rebuilds those divisors per sequence, ``recompute_fastdiv_mods_q``);
    * ``seqlen_info_varlen_score``, ``seqlen_info_varlen_scale``, ``seqlen_info_varlen_mask``,
      ``seqlen_info_seqused``, ``seqlen_info_dense_score``, ``seqlen_info_dense_scale``,
      ``seqlen_info_dense_mask``: the pairs that read the lengths FA4 hands the mods (Note [Lengths
      the mods see] in ``kernels/mods.py``: ``seqlen_bias``, ``causal_aligned``, and
      ``batch_length_scale``, whose score_mod_bwd reads them and the batch index too) on varlen
      calls whose sequences have more queries than keys, more keys than queries and equal lengths
      (GQA 4/2 for the mask), on batched Q and K/V with ``seqused_q`` / ``seqused_k`` below the
      capacities, and on dense calls with more keys than queries run backward (the backward's
      roles): another sequence's lengths, the static maximum, a capacity or the two lengths
      swapped move the bias, the temperature or the diagonal on each;
    * ``empty_first_blocks_<tm>x<tn>`` (and ``_left``): an unpacked causal call, one key more than
      queries, on each forward tile taller than wide, whose first rows meet no key in the first
      two KV tiles their M tile processes (Note [Rows empty in the first blocks]);
    * ``mla_causal_tail``, ``mla_short_keys``, ``mla_decode_kb64``, ``mla_decode_1cta``,
      ``mla_gather_2cta``, ``mla_gather_wide``, ``mla_gather_1cta`` (SM 10.x/11.x, Note [MLA as a
      call form]): FA4's MLA forward (``qv``, head dims 64 + 512, one KV head) dense and with a
      top-k gather, on each of its three kernels, and its sparse backward (:func:`_mla_edges`).
    * ``block_size_implicit`` (SM90): block lists handed to FA4 without ``block_size`` (Note [Block
      lists without a size], :func:`_implicit_block_edges`).
    * ``sink_off_masked_rows``: a learnable sink of -inf on one head of a causal call with rows no
      key reaches (:func:`_sink_off_edges`).

    Each needs its form in the space (the block-sparse edge only where the target runs block
    sparsity).

    Found with ``audit --source-coverage`` on the H200 (Note [Source coverage]): before these, only
    the drawn campaign (``fuzz.production``) ran those lines, when its seed happened to draw them;
    and by red-team reads of FA4's runtime branches (a line trace cannot see those): the source
    mutants each edge is named for (``fa4verify/mutants/source.py``)."""
    from fa4verify.problem import AttentionProblem, CallForm, ValueSpec
    rng = random.Random(f"edges:{seed}")
    hd_name = next(iter(space.values["hd"]), None)
    gqa = next(iter(space.values["gqa"]), None)
    if hd_name is None or gqa is None:
        return []
    hd, hdv = space.hd[hd_name]
    nh, nk = heads_of(space, gqa)
    base = dict(arch=space.arch, dtype=space.dtype, nheads=nh, nheads_kv=nk, head_dim=hd, head_dim_v=hdv)

    def vals() -> Any:
        return ValueSpec("normal", rng.randrange(2 ** 31), _VALUE_PARAMS["normal"])
    out: list[tuple[str, Any, bool]] = []
    forms = space.values["form"]

    def bwd(form: str, sink: bool) -> bool:
        return _runs_bwd(space, form=form, hd=hd_name, gqa=gqa, mask="none", sink="fp32" if sink else "off")
    if "zero" in space.values["seqlen"] and "varlen" in forms and "zero" not in space.lengths:
        out.append(("empty_keys", AttentionProblem(batch=2, seqlens_q=(5, 3), seqlens_k=(0, 0), seqlen_q=5,
                                                   seqlen_k=0, values=vals(), **base), bwd("varlen", False)))
        sinks = [v for v in space.values["sink"] if v != "off"]
        if sinks:
            out.append(("empty_keys_sink", AttentionProblem(batch=2, seqlens_q=(5, 3), seqlens_k=(0, 0), seqlen_q=5,
                                                            seqlen_k=0, sink=True, sink_dtype=sinks[-1], values=vals(),
                                                            **base),
                        bwd("varlen", True)))
        out.append(("empty_queries", AttentionProblem(batch=2, seqlens_q=(0, 0), seqlens_k=(4, 7), seqlen_q=0,
                                                      seqlen_k=7, values=vals(), **base), bwd("varlen", False)))
    tn = facts.fwd_tile(space.arch, space.dtype, hd, hdv, False, False)[1]
    if "none" in space.values["mask"] and "dense" in forms and not space.lengths:
        out.append(("negative_window", AttentionProblem(batch=2, seqlen_q=tn + 1, seqlen_k=tn + 1, window_size=(-1, -1),
                                                        values=vals(), **base), bwd("dense", False)))
    if space.arch == "sm90" and "block_sparse" in forms and not space.lengths and facts.sm90_fwd_fits_sparse_kv():
        v64 = vals()         # (drawn before the block seed, as ever)
        q64 = CallForm(block_size=(64, sparse_block_size(space.arch, hd, hdv)[1]), block_seed=rng.randrange(2 ** 16),
                       block_keep=0.6)
        out.append(("sparse_q64", AttentionProblem(batch=2, seqlen_q=3 * 64 + 5, seqlen_k=2 * tn + 3, values=v64,
                                                   call=q64, **base), False))
        if "causal" in space.values["mask"]:
            # Note [Block lists with causal or a window]: FA4's one 1-warpgroup forward (tile_m 64
            # under 64-row sparse Q blocks) with its causal mask (red-team round 13's F46: no call
            # compiled it); the same lists and values, no draw (the later edges keep their seeds)
            out.append(("sparse_q64_causal", AttentionProblem(batch=2, seqlen_q=3 * 64 + 5, seqlen_k=2 * tn + 3,
                                                              causal=True, values=v64, call=q64, **base), False))
    if "block_sparse" in forms and "2" in space.values["gqa"] and not space.lengths and not space.heads:
        # Note [Block masks by head]: a GQA call whose block lists differ by query head (FA4 must
        # keep it unpacked: a packed tile reads one head's lists for its whole group)
        name = _hd128(space)
        d, dv = space.hd[name]
        bq, bk = sparse_block_size(space.arch, d, dv)
        out.append(("block_sparse_per_head", AttentionProblem(
            batch=1, seqlen_q=2 * bq, seqlen_k=3 * bk, nheads=4, nheads_kv=2, head_dim=d, head_dim_v=dv,
            arch=space.arch, dtype=space.dtype, values=vals(),
            call=CallForm(block_size=(bq, bk), block_seed=rng.randrange(2 ** 16), block_keep=0.5, block_per_head=True)),
            _runs_bwd(space, form="block_sparse", hd=name, gqa="2", mask="none")))
    out += _mod_edges(space, vals)
    out += _layout_edges(space, vals)
    out += _lookup_edges(space, vals)
    out += _mla_edges(space, vals)
    out += _diagonal_edges(space)
    out += _empty_first_blocks_edges(space, vals)
    out += _tile_tail_edges(space, vals)
    if space.arch == "sm90":
        out += _sm90_tile_edges(space, vals)
    out += _forward_layout_edges(space, vals)
    # groups with value seeds of their own: the edges above keep theirs
    out += _pool_layout_edges(space)
    out += _wave_chain_edges(space)
    out += _padding_edges(space)
    out += _input_layout_edges(space)
    out += _wide_group_edges(space)
    out += _score_head_edges(space)
    out += _implicit_block_edges(space)
    out += _sink_off_edges(space)
    return out


def _sink_off_edges(space: FeatureSpace) -> list[tuple[str, Any, bool]]:
    """``sink_off_masked_rows``: a dense causal MHA call with more queries than keys (its first 37
    rows see no key, across FA4's first M tile) whose learnable sink is -inf on query head 0 --
    FA4's own "no sink" (Note [A sink of -inf] in ``oracles/semantics.py``) -- and finite on head 1.
    Head 0's O and LSE are those without a sink (O = 0, LSE = -inf on the empty rows), and its
    dsink is the sum of dLSE over those rows, which FA4's backward takes from its ``lse == -inf``
    branch (``flash_bwd_postprocess.dsink_row_term``: P_sink = 1); with a finite sink LSE >= sink,
    so no other call of the audit runs that branch (red-team round 16 #7)."""
    from fa4verify.problem import AttentionProblem, ValueSpec
    sinks = [v for v in space.values["sink"] if v != "off"]
    if (not sinks or space.lengths or space.heads or "dense" not in space.values["form"]
            or "causal" not in space.values["mask"] or "1" not in space.values["gqa"]):
        return []
    name = _hd128(space)
    hd, hdv = space.hd[name]
    v = _own_vals("sink_off", space)()
    p = AttentionProblem(batch=1, seqlen_q=137, seqlen_k=100, nheads=2, nheads_kv=2, head_dim=hd, head_dim_v=hdv,
                         arch=space.arch, dtype=space.dtype, causal=True, sink=True, sink_dtype=sinks[0],
                         values=ValueSpec(v.distribution, v.seed, v.params + (("sink_off_head", 0.0),)))
    return [("sink_off_masked_rows", p, _runs_bwd(space, form="dense", hd=name, gqa="1", mask="causal",
                                                  sink=sinks[0]))]


def _implicit_block_edges(space: FeatureSpace) -> list[tuple[str, Any, bool]]:
    """Note [Block lists without a size] (``fa4verify.problem.calls``): ``block_size_implicit``, the
    block lists of one 128-row Q block over three KV blocks and a tail handed to FA4 without
    ``block_size``, forward and backward (FA4's forward infers the Q block from the lists, its SM90
    backward takes 128 rows by default: red-team round 15 #3, lines no audit call ran). SM90, where
    the form holds at :func:`_hd128`."""
    from fa4verify.problem import AttentionProblem, CallForm
    if (space.arch != "sm90" or space.lengths or space.heads or "block_sparse" not in space.values["form"]
            or "1" not in space.values["gqa"]):
        return []
    name = _hd128(space)
    hd, hdv = space.hd[name]
    vals = _own_vals("implicit_blocks", space)
    try:
        p = AttentionProblem(batch=2, seqlen_q=128, seqlen_k=3 * 128 + 7, nheads=2, nheads_kv=2, head_dim=hd,
                             head_dim_v=hdv, arch=space.arch, dtype=space.dtype, values=vals(),
                             call=CallForm(block_size=(128, 128), block_seed=3, block_keep=0.6,
                                           block_size_implicit=True))
    except ValueError:          # the installed FA4's tiles are not that block here
        return []
    return [("block_size_implicit", p, _runs_bwd(space, form="block_sparse", hd=name, gqa="1", mask="none"))]


def _hd_plain_first(space: FeatureSpace) -> list[str]:
    """The space's head-dim classes, those at a multiple of 32 first (outside the SM90 dQ
    finding's head dims), each group by head dim."""
    return sorted(space.values["hd"], key=lambda n: (space.hd[n][0] % 32 != 0, space.hd[n][0]))


def _tile_tail_edges(space: FeatureSpace, vals) -> list[tuple[str, Any, bool]]:
    """Note [Every forward tile's tail]: FA4's forward tile (tile_m x tile_n) follows head dim, mask
    and form jointly (``_tile_size_fwd_sm90``), which a pairwise plan cannot promise to meet with a
    partial last KV tile; the seqlen mask of a tile wider than 128 keys works in two chunks (the
    192 x 144 SM90 tile at head dims 65..96 unmasked: the fifth red-team round). One edge per
    distinct unmasked forward tile of the space's head-dim classes: a dense MHA call whose last KV
    tile holds 56 keys (``tile_tail_<tm>x<tn>``), at a class's representative head dims (a multiple
    of 32 first: outside the SM90 dQ finding's head dims)."""
    from fa4verify.problem import AttentionProblem
    out: list[tuple[str, Any, bool]] = []
    if space.lengths or space.heads or "none" not in space.values["mask"] or "dense" not in space.values["form"] \
            or "1" not in space.values["gqa"]:
        return out
    seen: set = set()
    # each tile at a head dim outside the SM90 dQ finding's where the class has one (multiples of 32)
    for name in _hd_plain_first(space):
        hd, hdv = space.hd[name]
        if space.why_not({"hd": name, "mask": "none", "form": "dense"}) is not None:
            continue
        tiles = facts.fwd_tile(space.arch, space.dtype, hd, hdv, False, False)
        if tiles in seen:
            continue
        seen.add(tiles)
        sk = tiles[1] + 56
        out.append((f"tile_tail_{tiles[0]}x{tiles[1]}", AttentionProblem(
            arch=space.arch, dtype=space.dtype, batch=1, seqlen_q=tiles[0] + 9, seqlen_k=sk, nheads=2, nheads_kv=2,
            head_dim=hd, head_dim_v=hdv, values=vals()), _runs_bwd(space, form="dense", hd=name, gqa="1", mask="none")))
    return out


def diagonal_offsets(tiles_fwd: tuple[int, int], tiles_bwd: tuple[int, int], sq: int, *, limit: int = 4096
                     ) -> Optional[int]:
    """The smallest ``s = seqlen_k - seqlen_q + window_right >= 1`` (unpacked, ``sq`` queries) at
    which both block bounds of the causal / right-window diagonal have no slack (Note [The
    diagonal's block bounds]): some forward M tile ``m`` whose last row exists has ``(m + 1) tile_m
    + s = 1 (mod tile_n)`` (that row's rightmost key alone opens a KV tile), and some backward KV
    tile ``n`` has ``r = n tile_n - s`` a row, ``r = tile_m - 1 (mod tile_m)`` (the last row of an
    M tile alone sees the KV tile's first key). None where no ``s < limit`` does."""
    (tm, tn), (tmb, tnb) = tiles_fwd, tiles_bwd
    for off in range(1, limit):
        fwd = any((m + 1) * tm <= sq and ((m + 1) * tm + off) % tn == 1 for m in range(-(-sq // tm)))
        bwd = any(0 <= n * tnb - off < sq and (n * tnb - off) % tmb == tmb - 1 for n in range(1, sq // tnb + 3))
        if fwd and bwd:
            return off
    return None


def _diagonal_edges(space: FeatureSpace) -> list[tuple[str, Any, bool]]:
    """Note [The diagonal's block bounds]
    -----------------------------------
    FA4's forward skips the KV tiles past an M tile's causal (or right-window) limit and its
    backward the M tiles before a KV tile's first viewer (``block_info.get_n_block_min_max`` /
    ``get_m_block_min_max``). Both bounds are exact: a one-off slip drops one (row, key) pair, and
    only where a tile's last row alone reaches across a tile edge. The plan's tile-relative
    lengths never land there (the fourth red-team round: residues 0, 2, 3, ... where 1 is needed,
    ``docs/results/redteam4/analysis.md``), though the commonest shape does: a causal call with one
    key more than queries (a cached token, a BOS key, chunked prefill). Two edges, unpacked (MHA),
    at :func:`_hd128`, valued ``edges`` (the diagonal keys score high: Note [Edge values]):

    * ``causal_key_past_tile``: causal, ``seqlen_q = 2 tile_m``, ``seqlen_k = seqlen_q + s``;
    * ``right_window_key_past_tile``: a right window ``(None, s)`` on a square call;

    * ``causal_key_past_tile_negative``: the causal edge's shape on ``negative_scores`` values
      (every score near -100 nats): its rows fully masked in the first KV tile they process (all
      but the tile's last) must start their running max from their first real score, not from the
      0 that stands in for -inf in the exponent, or every later P flushes to 0 (the ninth red-team
      round, ``docs/results/redteam9/``: before, one plan row reached it, by its seed);

    ``s`` from :func:`diagonal_offsets` (1 at head dim 128 on both archs). Their backward runs without
    ``deterministic`` (:data:`NONDETERMINISTIC_EDGES`): a skipped tile would leave a dQ semaphore
    unreleased, a hang the deadline reports after minutes; without, the lost pair shows in dK/dV."""
    from fa4verify.problem import AttentionProblem, ValueSpec
    out: list[tuple[str, Any, bool]] = []
    if space.lengths or space.heads or "1" not in space.values["gqa"] or "dense" not in space.values["form"]:
        return out
    name = _hd128(space)
    hd, hdv = space.hd[name]
    rng = random.Random(f"diagonal:{space.arch}:{space.dtype}")
    base = dict(arch=space.arch, dtype=space.dtype, head_dim=hd, head_dim_v=hdv, nheads=2, nheads_kv=2, batch=1)
    for mask, edge in (("causal", "causal_key_past_tile"), ("right", "right_window_key_past_tile")):
        if mask not in space.values["mask"] or space.why_not({"mask": mask, "hd": name, "form": "dense"}) is not None:
            continue
        causal, local = mask == "causal", mask != "causal"
        tiles = facts.fwd_tile(space.arch, space.dtype, hd, hdv, causal, local)
        sq = 2 * tiles[0]
        off = diagonal_offsets(tiles, facts.bwd_tile(space.arch, hd, hdv, causal, local), sq)
        if off is None:
            continue
        vs = ValueSpec("edges", rng.randrange(2 ** 31), _VALUE_PARAMS["edges"])
        prob = (AttentionProblem(seqlen_q=sq, seqlen_k=sq + off, causal=True, values=vs, **base) if causal else
                AttentionProblem(seqlen_q=sq, seqlen_k=sq, window_size=(None, off), values=vs, **base))
        out.append((edge, prob, _runs_bwd(space, form="dense", hd=name, gqa="1", mask=mask)))
        if causal and "negative_scores" in space.values["values"]:
            neg = ValueSpec("negative_scores", rng.randrange(2 ** 31), _VALUE_PARAMS["negative_scores"])
            out.append((edge + "_negative", prob.replace(values=neg), out[-1][2]))
    return out


def rows_without_early_keys(tiles: tuple[int, int], sq: int, sk: int, *, window_left: Optional[int] = None,
                            blocks: int = 2) -> int:
    """The query rows of an unpacked causal call (bottom-right aligned; ``window_left`` keys to the
    left where given) that see some key but none in the first ``blocks`` KV tiles their forward M
    tile processes. FA4's forward walks an M tile's KV tiles from its last one down (``n_block_max -
    1`` first), and bounds the tile by its full height: ``n_block_max = min(ceil_div(seqlen_k,
    tile_n), ceil_div((m + 1) tile_m + seqlen_k - seqlen_q, tile_n))`` (``block_info.py``,
    :data:`fa4verify.kernels.facts.SPLIT_KV_SOURCE`)."""
    tm, tn = tiles
    off, count = sk - sq, 0
    for m in range(-(-sq // tm)):
        nmax = min(-(-sk // tn), -(-((m + 1) * tm + off) // tn))
        lo = (nmax - blocks) * tn                     # keys below lo lie outside the first processed tiles
        for r in range(m * tm, min((m + 1) * tm, sq)):
            hi = min(r + off, sk - 1)
            first = 0 if window_left is None else max(0, r + off - window_left)
            if first <= hi < lo:
                count += 1
    return count


def _empty_first_blocks_edges(space: FeatureSpace, vals) -> list[tuple[str, Any, bool]]:
    """Note [Rows empty in the first blocks]
    ----------------------------------------
    FA4's online softmax starts a row's running max at -inf and, with ``check_inf``, takes a max of
    -inf as 0 before it forms ``exp2(S - max)`` and the rescale of O (``softmax.py``
    ``online_softmax``); without it a row that has met no key yet turns NaN on its next KV tile
    and stays NaN. Where a forward tile is taller than it is wide (SM90: 192 x 128 at head dims <= 96,
    128 x 80 at 256, 128 x 112 at 129..192 with a wider V), the first rows of an M tile of an
    unpacked causal call can see no key in the first two KV tiles the tile processes (it walks them
    from the diagonal down): every chunked prefill with one cached key more than queries has such
    rows (the ninth red-team round: no plan row, edge, draw or sequence of the audit had one, as the
    plan's tall-tile causal rows are packed GQA or single-tile, ``docs/results/redteam9/``). One
    edge per such tile of the space's head-dim classes (causal, and causal with a left window
    where the space has ``causal_left``): MHA, ``seqlen_k = seqlen_q + 1``, ``seqlen_q`` the
    smallest from two M tiles up where :func:`rows_without_early_keys` finds rows
    (``empty_first_blocks_<tm>x<tn>``, ``_left`` for the window); forward and backward."""
    from fa4verify.problem import AttentionProblem
    out: list[tuple[str, Any, bool]] = []
    if space.lengths or space.heads or "1" not in space.values["gqa"] or "dense" not in space.values["form"]:
        return out
    seen: set = set()
    for mask in ("causal", "causal_left"):
        if mask not in space.values["mask"]:
            continue
        local = mask == "causal_left"
        for name in _hd_plain_first(space):
            hd, hdv = space.hd[name]
            if space.why_not({"hd": name, "mask": mask, "form": "dense"}) is not None:
                continue
            tiles = facts.fwd_tile(space.arch, space.dtype, hd, hdv, not local, local)
            if tiles[0] <= tiles[1] or (mask, tiles) in seen:
                continue
            seen.add((mask, tiles))
            wl = tiles[1] if local else None
            sq = next((q for q in range(2 * tiles[0], 8 * tiles[0])
                       if rows_without_early_keys(tiles, q, q + 1, window_left=wl)), None)
            if sq is None:
                continue
            out.append((f"empty_first_blocks_{tiles[0]}x{tiles[1]}" + ("_left" if local else ""), AttentionProblem(
                arch=space.arch, dtype=space.dtype, batch=1, seqlen_q=sq, seqlen_k=sq + 1, nheads=2, nheads_kv=2,
                head_dim=hd, head_dim_v=hdv, causal=True, window_size=(wl, 0) if local else (None, None),
                values=vals()), _runs_bwd(space, form="dense", hd=name, gqa="1", mask=mask)))
    return out


def _own_vals(group: str, space: FeatureSpace):
    """A ``normal`` value spec per call, from a seed stream of the edge group's own."""
    from fa4verify.problem import ValueSpec
    rng = random.Random(f"{group}:{space.arch}:{space.dtype}")
    return lambda: ValueSpec("normal", rng.randrange(2 ** 31), _VALUE_PARAMS["normal"])


def split_auto_edges(space: FeatureSpace) -> list[tuple[str, Any, bool]]:
    """Note [Split-KV by FA4's heuristic]
    ----------------------------------
    ``num_splits=0`` hands FA4's own heuristic (``interface.num_splits_heuristic``) the split
    count: the SMs per query tile, at most 128 and the KV blocks, 1 over 4 KV blocks or fewer.
    Every plan row asks for 1 (or, on SM 10.x, 2 or 3) splits, so the heuristic's path runs in no
    call; a decode call asks it here: ``split_auto_decode``, one query over 8192 keys at
    :func:`_hd128` without a mask, 2 heads (forward only, as every split call), where the heuristic
    picks 64 splits (:func:`fa4verify.kernels.facts.split_kv_config`). On SM 10.x FA4 runs and
    combines them (judged as a split call of that count); on SM90 its forward asserts against the
    split it chose (known issue ``sm90_split_auto_refused``; the call is then FA4's failure,
    ``own_choice`` in :meth:`fa4verify.targets.ProductionTarget._call`, not a refusal).
    Production only (the twin does not model FA4's SM90 failure); free lengths and heads only."""
    from fa4verify.problem import AttentionProblem, CallForm
    if (space.lengths or space.heads or "split_kv" not in space.values["form"] or "none" not in space.values["mask"]
            or space.dtype == "fp8"):
        return []
    name = _hd128(space)
    hd, hdv = space.hd[name]
    vals = _own_vals("split_auto", space)
    return [("split_auto_decode", AttentionProblem(
        arch=space.arch, dtype=space.dtype, batch=1, seqlen_q=1, seqlen_k=8192, nheads=2, nheads_kv=2, head_dim=hd,
        head_dim_v=hdv, values=vals(), call=CallForm(num_splits=0)), False)]


def _pool_layout_edges(space: FeatureSpace) -> list[tuple[str, Any, bool]]:
    """Note [Page pool layouts]: paged forwards over pools that are not one compact tensor per K
    and V, at :func:`_hd128` without a mask: ``paged_kv_fused_16`` / ``paged_hnd_16`` (16-key pages:
    FA4's cp.async loader, which computes page addresses itself) and ``paged_kv_fused_tile`` /
    ``paged_hnd_tile`` (a page of one KV tile: the TMA path, addresses from the descriptor). A
    decode row and a 37-query chunk over keys of three and two KV tiles and a few, on permuted
    pages with spare ones, 2 KV heads (an HND pool interleaves them); forward only (FA4 has no
    paged backward)."""
    from fa4verify.problem import AttentionProblem, CallForm
    if space.lengths or space.heads or "none" not in space.values["mask"] or "1" not in space.values["gqa"]:
        return []
    name = _hd128(space)
    hd, hdv = space.hd[name]
    vals = _own_vals("pool_layout", space)
    tn = facts.fwd_tile(space.arch, space.dtype, hd, hdv, False, False)[1]
    out: list[tuple[str, Any, bool]] = []
    for form, page, size in (("paged_small", 16, "16"), ("paged_tile", tn, "tile")):
        if form not in space.values["form"] or space.why_not({"form": form, "hd": name}) is not None:
            continue
        for layout, tag in (("kv_fused", "kv_fused"), ("hnd", "hnd")):
            if layout == "kv_fused" and hd != hdv:
                continue
            sqs, sks = (1, 37), (3 * tn + 9, 2 * tn - 5)
            cap = -(-(max(sks) + 7) // page) * page
            out.append((f"paged_{tag}_{size}", AttentionProblem(
                batch=2, seqlens_q=sqs, seqlens_k=sks, seqlen_q=max(sqs), seqlen_k=max(sks), nheads=2, nheads_kv=2,
                head_dim=hd, head_dim_v=hdv, arch=space.arch, dtype=space.dtype, values=vals(),
                call=CallForm(seqused_k=True, kv_capacity=cap, page_size=page, page_seed=13, spare_pages=2,
                              pool_layout=layout)), False))
    return out


def _wave_chain_edges(space: FeatureSpace) -> list[tuple[str, Any, bool]]:
    """Note [Chains longer than a wave]: FA4's deterministic causal backward adds each M block's dQ
    in decreasing KV-block order (``spt``: a CTA spins on a semaphore until every higher KV block of
    its (sequence, head) has added); its schedulers launch the highest KV block first (longest
    first). While every CTA of a grid is resident at once the semaphores alone keep the order; once
    a sequence's KV-block chain times its heads outgrows one wave of CTAs, a scheduler that
    launched low blocks first would fill the GPU with CTAs that wait on blocks never launched (a
    hang the audit's deadline reports). ``causal_l2_sections`` reaches the dense scheduler's order;
    these reach the varlen scheduler's, through ``cu_seqlens_k`` (``causal_l2_sections_varlen``) and
    ``seqused_k`` (``causal_l2_sections_seqused``): one sequence of 16 queries over the same keys,
    3 heads, 801 CTAs on SM90 at hd 128, each KV block a link of M block 0's chain (the audit's
    largest varlen deterministic grid with a chain was 96 CTAs). SM90, deterministic backward."""
    from fa4verify.problem import AttentionProblem, CallForm
    forms = space.values["form"]
    if (space.arch != "sm90" or space.lengths or space.heads or "causal" not in space.values["mask"]
            or "1" not in space.values["gqa"] or "on" not in space.values["det"]):
        return []
    name = _hd128(space)
    hd, hdv = space.hd[name]
    vals = _own_vals("wave_chain", space)
    elem = 1 if space.dtype == "fp8" else 2
    sk = facts.lpt_l2_bytes() // (3 * (hd + hdv) * elem)
    base = dict(arch=space.arch, dtype=space.dtype, head_dim=hd, head_dim_v=hdv, causal=True, batch=1,
                seqlens_q=(16,), seqlens_k=(sk,), seqlen_q=16, seqlen_k=sk, nheads=3, nheads_kv=3)
    out: list[tuple[str, Any, bool]] = []
    if "varlen" in forms:
        out.append(("causal_l2_sections_varlen", AttentionProblem(values=vals(), **base),
                    _runs_bwd(space, form="varlen", hd=name, gqa="1", mask="causal")))
    if "seqused_k" in forms:
        out.append(("causal_l2_sections_seqused", AttentionProblem(
            values=vals(), call=CallForm(seqused_k=True, kv_capacity=sk), **base),
            _runs_bwd(space, form="seqused_k", hd=name, gqa="1", mask="causal")))
    return out


def _padding_edges(space: FeatureSpace) -> list[tuple[str, Any, bool]]:
    """Note [Head dims padded apart]: FA4 pads head_dim and head_dim_v each to its own tile width
    and predicates the padded columns by two flags (Q/K's, O/V's). The head-dim classes' hd != hdv
    pairs are all multiples of 16, so no audit call had one side padded and the other not, where a
    flag taken from the wrong side writes O's padded columns over the next row's (the SM90 PackGQA
    cp.async O store) or sums them into D (the backward preprocess): ``packed_cpasync_hdv_pad``
    (14 query / 2 KV heads, a ratio that divides no SM90 tile_m: the cp.async store; hd 128, hdv 72)
    and ``packed_cpasync_hd_pad`` (the reverse, hd 72, hdv 128), forward only (FA4's SM90 backward
    does not build at (128, 72): an MLIRError, compile-only sm_90a); ``bwd_hdv_pad`` (MHA, hd 192,
    hdv 136), forward and, on SM90 where it builds, backward. Only where the space holds every
    head-dim class (no deployment's head dims)."""
    from fa4verify.coverage.space import head_dim_classes
    from fa4verify.problem import AttentionProblem
    if (space.lengths or space.heads or "none" not in space.values["mask"] or "dense" not in space.values["form"]
            or set(space.hd.values()) != set(head_dim_classes(space.arch, space.dtype).values())):
        return []
    vals = _own_vals("padding", space)
    out: list[tuple[str, Any, bool]] = []
    for edge, (hd, hdv), heads, (sq, sk), bwd in (
            ("packed_cpasync_hdv_pad", (128, 72), (14, 2), (40, 64), False),
            ("packed_cpasync_hd_pad", (72, 128), (14, 2), (40, 64), False),
            ("bwd_hdv_pad", (192, 136), (2, 2), (100, 100), space.arch == "sm90")):
        if not facts.head_dims_supported(space.arch, hd, hdv, space.dtype):
            continue
        out.append((edge, AttentionProblem(
            batch=1, seqlen_q=sq, seqlen_k=sk, nheads=heads[0], nheads_kv=heads[1], head_dim=hd, head_dim_v=hdv,
            arch=space.arch, dtype=space.dtype, values=vals()), bwd))
    return out


def _input_layout_edges(space: FeatureSpace) -> list[tuple[str, Any, bool]]:
    """Note [Input layouts] (``fa4verify.targets``): calls whose Q, K, V and dO are views, as models
    pass them; every other audit call hands FA4 contiguous inputs (the call sequences drew two
    strided MHA calls at seed 0). Forward and backward:

    * ``layout_qkv_packed_varlen``: Q, K and V sliced out of one fused QKV projection (token stride
      three rows of heads) on a packed varlen call, 4 query / 2 KV heads, causal, hd 128;
    * ``layout_strided_packed_cpasync``: rows twice as wide as the head dim under FA4's SM90
      cp.async PackGQA load and store (14 query / 2 KV heads: a ratio that divides no tile_m);
    * ``layout_transposed_gqa``: (b, h, s, d) storage, 4 / 2 heads, causal, hd 64 (a 192-row tile);
    * ``layout_qkv_packed_192``: the fused-QKV views at hd 192, MHA, no mask;
    * ``layout_broadcast_mqa``: stride 0 on every size-1 dim (batch 1, one KV head: FA4 keys and
      compiles such layouts apart, CuTe keeping a stride 0 static), MQA, causal, hd 128.

    Only where the space has the head dims, GQA ratios, masks and forms (no deployment's heads or
    lengths)."""
    from fa4verify.problem import AttentionProblem, CallForm
    if space.lengths or space.heads:
        return []
    vals = _own_vals("input_layout", space)
    by_dims = {v: n for n, v in space.hd.items()}
    out: list[tuple[str, Any, bool]] = []
    for edge, hd, gqa, mask, form, layout, shape in (
            ("layout_qkv_packed_varlen", 128, "2", "causal", "varlen", "qkv_packed", None),
            ("layout_strided_packed_cpasync", 128, "7", "none", "dense", "strided", (2, 100, 140)),
            ("layout_transposed_gqa", 64, "2", "causal", "dense", "transposed", (2, 200, 260)),
            ("layout_qkv_packed_192", 192, "1", "none", "dense", "qkv_packed", (2, 129, 129)),
            ("layout_broadcast_mqa", 128, "mqa", "causal", "dense", "broadcast", (1, 150, 150))):
        name = by_dims.get((hd, hd))
        if (name is None or gqa not in space.values["gqa"] or mask not in space.values["mask"]
                or form not in space.values["form"]):
            continue
        g = 8 if gqa == "mqa" else int(space.gqa_ratio(gqa))
        hk = 1 if layout == "broadcast" else 2         # a KV head dim of 1: stride 0 there
        heads = dict(nheads=hk * g, nheads_kv=hk)
        base = dict(arch=space.arch, dtype=space.dtype, head_dim=hd, head_dim_v=hd, causal=mask == "causal",
                    values=vals(), call=CallForm(input_layout=layout), **heads)
        if form == "varlen":
            lens = (37, 150, 5)
            prob = AttentionProblem(batch=3, seqlens_q=lens, seqlens_k=lens, seqlen_q=max(lens), seqlen_k=max(lens),
                                    **base)
        else:
            b, sq, sk = shape
            prob = AttentionProblem(batch=b, seqlen_q=sq, seqlen_k=sk, **base)
        out.append((edge, prob, _runs_bwd(space, form=form, hd=name, gqa=gqa, mask=mask)))
    return out


def _wide_group_edges(space: FeatureSpace) -> list[tuple[str, Any, bool]]:
    """Note [Wide query groups]: the plan's GQA classes hold at most 7 query heads per KV head (MQA
    over 3 to 14 heads), so FA4's PackGQA -- a tile's rows are (query row, query head) pairs, and
    ``qhead_per_kvhead`` divides the row index -- never ran with a group as wide as models use
    (red-team round 11: no ratio >= 16). Forward and backward, by rule:

    * ``gqa_16_causal``: 32 query / 2 KV heads, hd 128, causal, 70 queries over 300 keys (the
      causal diagonal crosses packed rows 16 apart);
    * ``gqa_64_packed``: 64 query heads over one KV head, hd 128, 5 queries over 129 keys: a packed
      tile of 128 rows holds two query positions;
    * ``gqa_71_cpasync``: Falcon-7B's 71 query heads over one KV head, hd 64, causal, 33 queries
      over 200 keys: a ratio that divides no tile_m (FA4 takes its cp.async PackGQA load and store).

    Only where the space has the head dims, GQA classes and masks (no deployment's heads or
    lengths)."""
    from fa4verify.problem import AttentionProblem
    if space.lengths or space.heads or "dense" not in space.values["form"]:
        return []
    vals = _own_vals("wide_group", space)
    by_dims = {v: n for n, v in space.hd.items()}
    out: list[tuple[str, Any, bool]] = []
    for edge, hd, (hq, hk), mask, (sq, sk) in (
            ("gqa_16_causal", 128, (32, 2), "causal", (70, 300)),
            ("gqa_64_packed", 128, (64, 1), "none", (5, 129)),
            ("gqa_71_cpasync", 64, (71, 1), "causal", (33, 200))):
        name = by_dims.get((hd, hd))
        gqa = "mqa" if hk == 1 else "4"
        if name is None or mask not in space.values["mask"] or gqa not in space.values["gqa"]:
            continue
        out.append((edge, AttentionProblem(
            batch=1, seqlen_q=sq, seqlen_k=sk, nheads=hq, nheads_kv=hk, head_dim=hd, head_dim_v=hd,
            causal=mask == "causal", arch=space.arch, dtype=space.dtype, values=vals()),
            _runs_bwd(space, form="dense", hd=name, gqa=gqa, mask=mask)))
    return out


def _score_head_edges(space: FeatureSpace) -> list[tuple[str, Any, bool]]:
    """``score_head_gqa``: a score pair that reads the head in its score_mod and its score_mod_bwd
    (``head_scale``, else ``alibi``) under GQA 8/4, causal, hd 128, forward and backward. FA4's SM90
    backward hands the pair head ``h g + r % g`` (known issue ``sm90_score_mod_gqa_bwd_indices``,
    judged against its model: Note [Known issues with a model]); the pair's aux covers every head
    that mapping reaches (Note [Aux for the mapped heads] in ``fa4verify.mods``), so every head's
    dQ and dK / dV are judged against the model. The plan's head-reading GQA rows sat where another
    defect shows (hd 72), and alibi's score_mod_bwd ignores the
    head, so a fault in the backward's head mapping (red-team round 12's
    ``score_mod_bwd_gqa_head_unscaled``, run on an H100 at 985b9b8 and, with alibi here, at
    c6d84c7: missed both times) had nothing to move. ``score_head_mha``: the same pair over 8 MHA
    heads (every head judged, each its own temperature); ``score_scalars_bwd``: ``scalar_bias``
    (runtime ``aux_scalars``) on an MHA backward (red-team round 16, ``docs/results/redteam16/``)."""
    from fa4verify.problem import AttentionProblem
    forms = space.values["form"]
    pair = next((p for p in ("head_scale", "alibi") if f"mod:{p}" in space.score_pairs), None)
    if (space.lengths or space.heads or "score_mod" not in forms or pair is None
            or "2" not in space.values["gqa"] or "causal" not in space.values["mask"]):
        return []
    name = _hd128(space)
    hd, hdv = space.hd[name]
    vals = _own_vals("score_head", space)
    out = [("score_head_gqa", AttentionProblem(
        batch=1, seqlen_q=150, seqlen_k=150, nheads=8, nheads_kv=4, head_dim=hd, head_dim_v=hdv, causal=True,
        mods=(pair,), arch=space.arch, dtype=space.dtype, values=vals()),
        _runs_bwd(space, form="score_mod", hd=name, gqa="2", mask="causal"))]
    # red-team round 16: every other head-reading backward sat under a known issue (GQA) or had 2
    # heads; MHA over 8 heads, each its own temperature, judges every head's score_mod_bwd
    if pair == "head_scale" and "1" in space.values["gqa"]:
        out.append(("score_head_mha", AttentionProblem(
            batch=1, seqlen_q=150, seqlen_k=150, nheads=8, nheads_kv=8, head_dim=hd, head_dim_v=hdv, causal=True,
            mods=(pair,), arch=space.arch, dtype=space.dtype, values=vals()),
            _runs_bwd(space, form="score_mod", hd=name, gqa="1", mask="causal")))
    # red-team round 16: runtime aux scalars reached one backward, under a known issue (GQA 3/1);
    # an MHA backward whose S recomputation reads them
    if "mod:scalar_bias" in space.score_pairs and "1" in space.values["gqa"]:
        out.append(("score_scalars_bwd", AttentionProblem(
            batch=2, seqlen_q=128, seqlen_k=128, nheads=2, nheads_kv=2, head_dim=hd, head_dim_v=hdv,
            mods=("scalar_bias",), arch=space.arch, dtype=space.dtype, values=vals()),
            _runs_bwd(space, form="score_mod", hd=name, gqa="1", mask="none")))
    return out


def _layout_edges(space: FeatureSpace, vals) -> list[tuple[str, Any, bool]]:
    """The call-layout and tile-scheduler edges of :func:`edge_problems`: causal MHA calls at
    :func:`_hd128` (free head counts and lengths only)."""
    from fa4verify.problem import AttentionProblem, CallForm
    out: list[tuple[str, Any, bool]] = []
    if space.lengths or space.heads or "causal" not in space.values["mask"] or "1" not in space.values["gqa"]:
        return out
    name = _hd128(space)
    hd, hdv = space.hd[name]
    base = dict(arch=space.arch, dtype=space.dtype, head_dim=hd, head_dim_v=hdv, causal=True)

    def runs_bwd(form: str) -> bool:
        return _runs_bwd(space, form=form, hd=name, gqa="1", mask="causal")
    if "paged_tile" in space.values["form"]:
        tn = facts.fwd_tile(space.arch, space.dtype, hd, hdv, True, False)[1]
        sqs, cap = (37, 2 * tn + 5), 2 * tn
        out.append(("paged_full_pages", AttentionProblem(
            batch=2, seqlens_q=sqs, seqlens_k=(cap, cap), seqlen_q=max(sqs), seqlen_k=cap, nheads=2, nheads_kv=2,
            values=vals(), call=CallForm(seqused_k=True, kv_capacity=cap, page_size=tn, page_seed=7, full_pages=True),
            **base), False))
    if "paged_small" in space.values["form"] and space.why_not({"form": "paged_small", "hd": name}) is None:
        # Note [Page sizes]: the plan's pages are 16 keys (divides every KV tile) or one KV tile;
        # a page of two KV tiles and one of 48 keys (dividing no tile) reach the page-table
        # arithmetic neither does: which page a tile starts in, the offset inside it
        tn = facts.fwd_tile(space.arch, space.dtype, hd, hdv, False, False)[1]
        for edge, page in (("paged_two_tiles", 2 * tn), ("paged_48", 48)):
            sqs, sks = (1, 37), (3 * tn + 9, 2 * tn - 5)
            cap = -(-(max(sks) + 7) // page) * page
            out.append((edge, AttentionProblem(
                batch=2, seqlens_q=sqs, seqlens_k=sks, seqlen_q=max(sqs), seqlen_k=max(sks), nheads=2, nheads_kv=2,
                values=vals(), call=CallForm(seqused_k=True, kv_capacity=cap, page_size=page, page_seed=11,
                                             spare_pages=1), **dict(base, causal=False)), False))
    if "paged_small" in space.values["form"] and space.why_not({"form": "paged_small", "hd": name}) is None:
        # decode with a paged KV cache as inference engines call it: Q batched (one token per
        # sequence), seqused_k the cache lengths, 16-key pages (the plan passes Q packed with
        # cu_seqlens; only the fuzz drew batched Q: the fifth red-team round)
        sks = (300, 17, 129)
        out.append(("decode_batched_q_paged", AttentionProblem(
            batch=3, seqlens_q=(1, 1, 1), seqlens_k=sks, seqlen_q=1, seqlen_k=max(sks), nheads=2, nheads_kv=2,
            values=vals(), call=CallForm(seqused_k=True, q_batched=True, kv_capacity=320, page_size=16,
                                         page_seed=5, spare_pages=1, inference=True), **base), False))
    if "seqused_k" in space.values["form"]:
        sqs, sks = (37, 150, 5), (90, 17, 0)
        cap = 160
        out.append(("seqused_k_packed", AttentionProblem(
            batch=3, seqlens_q=sqs, seqlens_k=sks, seqlen_q=max(sqs), seqlen_k=max(sks), nheads=2, nheads_kv=2,
            values=vals(), call=CallForm(seqused_k=True, kv_capacity=cap, kv_packed=True), **base),
            runs_bwd("seqused_k")))
    if "seqused_q" in space.values["form"]:
        # Q packed at capacity offsets with used lengths (cu_seqlens_q and seqused_q): FA4 must take
        # each sequence's length from seqused_q; the causal diagonal moves by the slack otherwise
        sqs, cap = (40, 71, 5), 96
        out.append(("seqused_q_packed", AttentionProblem(
            batch=3, seqlens_q=sqs, seqlens_k=(100,) * 3, seqlen_q=max(sqs), seqlen_k=100, nheads=2, nheads_kv=2,
            values=vals(), call=CallForm(seqused_q=True, q_capacity=cap, q_packed=True), **base),
            runs_bwd("seqused_q")))
    thresh = facts.varlen_batch_search_threshold()
    if "varlen" in space.values["form"] and (thresh is None or thresh >= 70):
        n = 70
        sqs = tuple(1 + (i * 5) % 9 for i in range(n))
        sks = tuple(1 + (i * 7) % 13 for i in range(n))
        out.append(("varlen_batch_groups", AttentionProblem(
            batch=n, seqlens_q=sqs, seqlens_k=sks, seqlen_q=max(sqs), seqlen_k=max(sks), nheads=2, nheads_kv=2,
            values=vals(), **base), runs_bwd("varlen")))
    if space.arch == "sm90" and "dense" in space.values["form"]:
        elem = 1 if space.dtype == "fp8" else 2
        sk = facts.lpt_l2_bytes() // (3 * (hd + hdv) * elem)     # L2 holds 3 heads: sections of 2
        out.append(("causal_l2_sections", AttentionProblem(
            batch=1, seqlen_q=16, seqlen_k=sk, nheads=3, nheads_kv=3, values=vals(), **base), runs_bwd("dense")))
        # the same section of 2 filled by two batch entries of one head: the section count must
        # count (batch, head) pairs, not heads
        out.append(("causal_l2_sections_batch", AttentionProblem(
            batch=2, seqlen_q=16, seqlen_k=sk, nheads=1, nheads_kv=1, values=vals(), **base), runs_bwd("dense")))
        if "none" in space.values["mask"]:
            # the deterministic backward's LPT scheduler: 17 heads over L2 sections of 16
            per_row = (hd + hdv) * elem + hd * 4
            sq = facts.lpt_l2_bytes() // (24 * per_row)
            if facts.lpt_bwd_swizzle(sq, hd, hdv, elem) == 16:
                out.append(("det_bwd_l2_sections", AttentionProblem(
                    batch=1, seqlen_q=sq, seqlen_k=128, nheads=17, nheads_kv=17, values=vals(),
                    **dict(base, causal=False)), _runs_bwd(space, form="dense", hd=name, gqa="1", mask="none")))
                # the same section of 16 filled by two batch entries of 8 heads: the section count
                # must count (batch, head) pairs (the sixth red-team round)
                out.append(("det_bwd_l2_sections_batch", AttentionProblem(
                    batch=2, seqlen_q=sq, seqlen_k=128, nheads=8, nheads_kv=8, values=vals(),
                    **dict(base, causal=False)), _runs_bwd(space, form="dense", hd=name, gqa="1", mask="none")))
    return out


#: edges whose backward runs without ``deterministic`` (the rest run it deterministic): with the
#: varlen batch lookup wrong, a deterministic backward waits for a dQ semaphore that never comes
#: (a hang the audit's deadline reports, after minutes); without, the misplaced tiles show in dQ.
#: FA4's sparse MLA backward has no deterministic mode (``_flash_attn_bwd_sparse_mla`` asserts it off)
NONDETERMINISTIC_EDGES = frozenset({"varlen_lookup_long_first", "varlen_lookup_chunks", "mla_gather_2cta",
                                    "mla_gather_wide", "mla_gather_1cta", "causal_key_past_tile",
                                    "right_window_key_past_tile", "block_sparse_per_head", "sparse_score_aux",
                                    "block_size_implicit"})


def _lookup_edges(space: FeatureSpace, vals) -> list[tuple[str, Any, bool]]:
    """The varlen batch-lookup edges of :func:`edge_problems` (more sequences than FA4's
    threshold; unmasked calls at :func:`_hd128`, free head counts and lengths only)."""
    from fa4verify.problem import AttentionProblem
    out: list[tuple[str, Any, bool]] = []
    thresh = facts.varlen_batch_search_threshold()
    if space.lengths or space.heads or thresh is None or "varlen" not in space.values["form"] \
            or "none" not in space.values["mask"]:
        return out
    name = _hd128(space)
    hd, hdv = space.hd[name]
    base = dict(arch=space.arch, dtype=space.dtype, head_dim=hd, head_dim_v=hdv)
    if "2" in space.values["gqa"]:
        n = thresh + 1
        tm = facts.fwd_tile(space.arch, space.dtype, hd, hdv, False, False)[0]
        tmb, tnb = facts.bwd_tile(space.arch, hd, hdv, False, False)
        # sequence 0: more packed M blocks of the forward (2 query heads per KV head) than unpacked
        # ones, at tile_m and at SM100's two-stage 2 tile_m, and its queries more backward M tiles
        # than N tiles (the Q side's lookup hint; the eighth red-team round); its keys two backward
        # M tiles and one N tile (where the tiles differ)
        q0 = tm + 5
        if tmb < tnb:
            q0 = max(q0, 2 * tmb + 5)
        sqs = (q0,) + tuple(1 + (i * 5) % 9 for i in range(1, n))
        sks = (min(tmb + 5, tnb - 1) if tmb < tnb - 5 else tmb + 5,) + tuple(1 + (i * 7) % 13 for i in range(1, n))
        out.append(("varlen_lookup_long_first", AttentionProblem(
            batch=n, seqlens_q=sqs, seqlens_k=sks, seqlen_q=max(sqs), seqlen_k=max(sks), nheads=4, nheads_kv=2,
            values=vals(), **base), _runs_bwd(space, form="varlen", hd=name, gqa="2", mask="none")))
    chunk = facts.cu_blocks_chunk()
    if chunk is not None and "1" in space.values["gqa"]:
        n = chunk + 76                      # a second chunk of the lookup's block count
        sqs = (1,) * n
        sks = tuple(1 + (i * 7) % 13 for i in range(n))
        out.append(("varlen_lookup_chunks", AttentionProblem(
            batch=n, seqlens_q=sqs, seqlens_k=sks, seqlen_q=1, seqlen_k=max(sks), nheads=2, nheads_kv=2,
            values=vals(), **base), _runs_bwd(space, form="varlen", hd=name, gqa="1", mask="none")))
    return out


def _mla_edges(space: FeatureSpace, vals) -> list[tuple[str, Any, bool]]:
    """The MLA edges of :func:`edge_problems` (Note [MLA as a call form]): FA4's MLA forward kernels,
    on the archs that have them, for 16-bit inputs, outside a deployment's space (its head dims
    are standard attention's), with the head dims the installed FA4 takes with ``qv``. The kernel
    each reaches (``_mla_1cta_route``'s one-wave rule: 1-CTA once two CTAs per token (gather) or
    per batch entry (dense decode) exceed the SMs, 148 on a B200; compile-only sm_100a,
    ``docs/results/features/mla_edges_compile_sm100a.json``):

    * ``mla_causal_tail`` (2-CTA): dense, causal, 16 query heads, fewer queries than keys, neither a
      multiple of a tile, with maxima that grow along the keys (``peaked_rescale``: the lazy
      rescale's stale maximum);
    * ``mla_short_keys`` (2-CTA): dense, no mask, more queries than keys (150 over 70);
    * ``mla_decode_kb64`` (1-CTA, 64-key blocks): dense decode, one query of 16 heads in each of
      100 batch entries (200 CTAs);
    * ``mla_decode_1cta`` (1-CTA, 128-key blocks): the same with two queries per entry (32 rows of a
      KV head: past what the 64-key kernel takes);
    * ``mla_gather_2cta`` (2-CTA sparse): a causal top-256 gather at 128 query heads, 18 tokens:
      slots holding keys past the causal limit, ``-1`` sentinels, rows with no slot and rows with
      every slot full (:meth:`CallForm.gather_indices`), with FA4's sparse MLA backward reading the
      bf16 P its training forward saved;
    * ``mla_gather_wide`` (2-CTA sparse): a causal top-512 gather over 130 keys at 16 query heads
      (padded to the kernel's head tile): slot tiles that hold only sentinels, forward and saved-P
      backward;
    * ``mla_gather_1cta`` (1-CTA sparse): a top-128 gather without the causal mask at 64 query
      heads and 100 tokens, with FA4's sparse MLA backward rebuilding P from the LSE
      (``recompute_p``; Note [The sparse MLA backward]).

    Both sparse backwards run without a deterministic mode (FA4 has none there:
    :data:`NONDETERMINISTIC_EDGES`); FA4 has no dense MLA backward. Not judged: the training
    forward (``for_backward``) that precedes a sparse backward (only its gradients are)."""
    from fa4verify.problem import AttentionProblem, CallForm, ValueSpec
    from fa4verify.problem.calls import MLA_ARCHS
    if space.arch not in MLA_ARCHS or space.dtype not in ("bf16", "fp16") or space.lengths or space.heads:
        return []
    rope, dv = facts.mla_head_dims()
    if not facts.head_dims_supported(space.arch, rope, dv, space.dtype):
        return []
    base = dict(arch=space.arch, dtype=space.dtype, head_dim=rope + dv, head_dim_v=dv, nheads_kv=1)
    dense = CallForm(qv_dim=dv)
    rng = random.Random(f"mla:{space.arch}:{space.dtype}")

    def gather(topk: int, **kw) -> Any:
        return CallForm(qv_dim=dv, gather_topk=topk, gather_seed=rng.randrange(2 ** 16), **kw)
    peaked = ValueSpec("peaked_rescale", rng.randrange(2 ** 31), _VALUE_PARAMS["peaked_rescale"])
    bwd = space.dtype == "bf16" or not facts.sparse_mla_bwd_bf16_only()     # FA4's sparse MLA dK: bf16 only
    return [
        ("mla_causal_tail", AttentionProblem(batch=2, seqlen_q=77, seqlen_k=203, nheads=16, causal=True, call=dense,
                                             values=peaked, **base), False),
        ("mla_short_keys", AttentionProblem(batch=1, seqlen_q=150, seqlen_k=70, nheads=16, call=dense,
                                            values=vals(), **base), False),
        ("mla_decode_kb64", AttentionProblem(batch=100, seqlen_q=1, seqlen_k=150, nheads=16, call=dense,
                                             values=vals(), **base), False),
        ("mla_decode_1cta", AttentionProblem(batch=100, seqlen_q=2, seqlen_k=150, nheads=16, call=dense,
                                             values=vals(), **base), False),
        ("mla_gather_2cta", AttentionProblem(batch=2, seqlen_q=9, seqlen_k=700, nheads=128, causal=True,
                                             call=gather(256), values=vals(), **base), bwd),
        ("mla_gather_wide", AttentionProblem(batch=1, seqlen_q=20, seqlen_k=130, nheads=16, causal=True,
                                             call=gather(512), values=vals(), **base), bwd),
        ("mla_gather_1cta", AttentionProblem(batch=1, seqlen_q=100, seqlen_k=300, nheads=64,
                                             call=gather(128, recompute_p=True), values=vals(), **base), bwd),
    ]


def varlen_mask_block_problem(space: FeatureSpace, hd_name: str, pair: str, values: Any) -> Any:
    """Note [Varlen mask blocks]
    ---------------------------
    FA4's varlen block sparsity keeps, besides full blocks, *mask* blocks in which the call's
    mask_mod decides: counts ``[heads, total Q blocks]`` and per-sequence index lists, read for
    sequence b's Q block m at global block ``cu_total_m_blocks[b] + m``
    (``block_sparse_utils.py``). A kernel reading the local block's entry (sequence 0's) or the
    sequence's first block's list keeps other blocks: visible only where two sequences' mask-block
    counts differ at one local block and a sequence's Q blocks differ in their lists (the tenth
    red-team round: fa4verify's varlen block sparsity listed full blocks only). The edge
    ``varlen_sparse_mask_blocks``: MHA at ``hd_name``, three sequences of 129, 256 and 300 queries
    (keys 200, 256, 300), FA4's varlen Q block, half the listed blocks mask blocks with ``pair``
    inside, the first of 256 block seeds where (a) some sequence b >= 1 has a local Q block whose
    mask-block count differs from the count at that global index, (b) some sequence has two Q
    blocks with different mask-block lists, (c) full blocks are listed; forward only (FA4 has no
    varlen block-sparse backward)."""
    from fa4verify.problem import AttentionProblem, CallForm
    hd, hdv = space.hd[hd_name]
    sqs, sks = (129, 256, 300), (200, 256, 300)
    block = varlen_sparse_block_size(space.arch, hd, hdv, max(sqs), 1, space.dtype)
    rng = random.Random(f"varlen_mask_blocks:{space.arch}:{space.dtype}")
    for _ in range(256):
        call = CallForm(block_size=block, block_seed=rng.randrange(2 ** 16), block_keep=0.75, block_partial=0.5)
        parts = [call.partial_blocks(lq, lk, seq=i) for i, (lq, lk) in enumerate(zip(sqs, sks))]
        lists = [call.block_mask(lq, lk, seq=i) for i, (lq, lk) in enumerate(zip(sqs, sks))]
        counts = np.concatenate([p.sum(axis=1) for p in parts])
        starts = np.cumsum([0] + [p.shape[0] for p in parts])
        local = any(counts[starts[b] + m] != counts[m] for b in range(1, len(parts)) for m in range(parts[b].shape[0]))
        rows = any(not np.array_equal(p[0], p[m]) for p in parts for m in range(1, p.shape[0]))
        full = any((lst & ~p).any() for lst, p in zip(lists, parts))
        if local and rows and full:
            return AttentionProblem(arch=space.arch, dtype=space.dtype, batch=3, seqlens_q=sqs, seqlens_k=sks,
                                    seqlen_q=max(sqs), seqlen_k=max(sks), nheads=2, nheads_kv=2, head_dim=hd,
                                    head_dim_v=hdv, mods=(pair,), call=call, values=values)
    raise ValueError(f"no block seed of 256 gives varlen mask blocks that differ by sequence (block {block})")


def _mod_edges(space: FeatureSpace, vals) -> list[tuple[str, Any, bool]]:
    """The pair edges of :func:`edge_problems` (each only where the space has its form, pair and
    head counts: free head counts and lengths, no deployment's)."""
    from fa4verify.problem import AttentionProblem
    out: list[tuple[str, Any, bool]] = []
    forms, gqas = space.values["form"], space.values["gqa"]
    if space.lengths or space.heads:
        return out
    name = _hd128(space)
    base = dict(arch=space.arch, dtype=space.dtype, head_dim=space.hd[name][0], head_dim_v=space.hd[name][1])

    def runs_bwd(form: str, gqa: str, seqlen: str) -> bool:
        return _runs_bwd(space, form=form, hd=name, gqa=gqa, mask="none", seqlen=seqlen)
    if "mask_mod" in forms and "mod:head_window" in space.mask_pairs and "4" in gqas:
        from fa4verify.kernels.mods import HEAD_SPAN
        tm = facts.fwd_tile(space.arch, space.dtype, space.hd[name][0], space.hd[name][1], False, False)[0]
        sq = max(2 * tm + 5, HEAD_SPAN[0] + HEAD_SPAN[1] * 8 + 9)      # past every head's span
        out.append(("head_mask_packgqa", AttentionProblem(
            batch=1, seqlen_q=sq, seqlen_k=sq, nheads=8, nheads_kv=2, mods=("head_window",), values=vals(), **base),
            runs_bwd("mask_mod", "4", "multi") and "mod:head_window" in space.mask_pairs_bwd))
    if "mask_mod" in forms and "mod:document" in space.mask_pairs and "1" in gqas:
        # Note [Aux indices by side]: a mask pair whose aux tensors are read at the query index
        # (documents of the queries) and at the key index (of the keys), with more keys than
        # queries and more queries than keys: an index wrapped at the other side's length reads
        # another entry (the tenth red-team round: every mask pair with aux tensors had run on
        # square calls only, where the two lengths coincide)
        tm, tn = facts.fwd_tile(space.arch, space.dtype, space.hd[name][0], space.hd[name][1], False, False)
        for edge, (sq, sk) in (("document_more_keys", (tm - 31, 2 * tn + 72)),
                               ("document_more_queries", (2 * tm + 72, tn - 31))):
            out.append((edge, AttentionProblem(batch=2, seqlen_q=sq, seqlen_k=sk, nheads=2, nheads_kv=2,
                                               mods=("document",), values=vals(), **base),
                        runs_bwd("mask_mod", "1", "multi") and "mod:document" in space.mask_pairs_bwd))
    mpair = next((m for m in ("causal", "sliding_window", "document") if f"mod:{m}" in space.block_mask_pairs), None)
    if "block_sparse_varlen" in forms and "block_sparse_mod" in forms and mpair is not None and "1" in gqas:
        out.append(("varlen_sparse_mask_blocks", varlen_mask_block_problem(space, name, mpair, vals()), False))
    pair = next((p for p in ("rel_bias", "alibi") if f"mod:{p}" in space.score_pairs), None)
    if "score_mod" in forms and "zero" in space.values["seqlen"] and pair is not None and "1" in gqas:
        tm, tn = facts.fwd_tile(space.arch, space.dtype, space.hd[name][0], space.hd[name][1], False, False)
        sqs, sks = (tm + 9, 17, 0, 5), (tn // 2 - 5, 2 * tn + 3, 4, 5)
        out.append(("varlen_score_aux_wrap", AttentionProblem(
            batch=4, seqlens_q=sqs, seqlens_k=sks, seqlen_q=max(sqs), seqlen_k=max(sks), nheads=2, nheads_kv=2,
            mods=(pair,), values=vals(), **base), runs_bwd("score_mod", "1", "zero")))
    from fa4verify.problem import CallForm
    # (MHA: on SM90 a GQA backward hands a score pair packed rows, known issue sm90_score_mod_gqa_bwd_indices)
    if "score_mod" in forms and "seqused_k" in forms and "seqused_q" in forms and pair is not None and "1" in gqas:
        # a score pair on the batched layout (Q and K/V batched with capacities, seqused_q and
        # seqused_k): the pair sees each sequence's logical rows, an empty one and a short one
        tm, tn = facts.fwd_tile(space.arch, space.dtype, space.hd[name][0], space.hd[name][1], False, False)
        sqs, sks = (tm - 7, 41, 9), (tn + 22, 33, 0)
        out.append(("seqused_score_aux", AttentionProblem(
            batch=3, seqlens_q=sqs, seqlens_k=sks, seqlen_q=max(sqs), seqlen_k=max(sks), nheads=2, nheads_kv=2,
            mods=(pair,), values=vals(),
            call=CallForm(seqused_q=True, q_capacity=tm + 8, seqused_k=True, kv_capacity=2 * tn), **base),
            runs_bwd("score_mod", "1", "zero") and _runs_bwd(space, form="seqused_q", hd=name, gqa="1", mask="none")))
    out += _seqlen_info_edges(space, name, vals, runs_bwd)
    if "score_mod" in forms and "block_sparse" in forms and "mod:alibi" in space.score_pairs and "1" in gqas:
        # a per-head aux score pair inside FA4's block sparsity (dense): the mod runs only on the
        # listed blocks, each at its own positions
        bq, bk = sparse_block_size(space.arch, space.hd[name][0], space.hd[name][1])
        out.append(("sparse_score_aux", AttentionProblem(
            batch=1, seqlen_q=2 * bq, seqlen_k=3 * bk, nheads=2, nheads_kv=2, mods=("alibi",), values=vals(),
            call=CallForm(block_size=(bq, bk), block_seed=41, block_keep=0.5), **base),
            runs_bwd("score_mod", "1", "multi") and _runs_bwd(space, form="block_sparse", hd=name, gqa="1", mask="none")))
    return out


#: (seqlens_q, seqlens_k) of the ``seqlen_info_varlen_*`` edges in tiles (tile_m, tile_n) and
#: rows: more queries than keys, more keys than queries, equal (each sequence past one tile)
_SEQLEN_INFO_VARLEN = (((1, 9), (0, 70)), ((0, 75), (2, 3)), ((1, 17), (1, 17)))


def _seqlen_info_edges(space: FeatureSpace, name: str, vals, runs_bwd) -> list[tuple[str, Any, bool]]:
    """The ``seqlen_info_*`` edges of :func:`edge_problems` (Note [Lengths the mods see])."""
    from fa4verify.problem import AttentionProblem, CallForm
    out: list[tuple[str, Any, bool]] = []
    forms, gqas = space.values["form"], space.values["gqa"]
    hd, hdv = space.hd[name]
    base = dict(arch=space.arch, dtype=space.dtype, head_dim=hd, head_dim_v=hdv)
    tm, tn = facts.fwd_tile(space.arch, space.dtype, hd, hdv, False, False)
    sqs = tuple(a * tm + b for (a, b), _ in _SEQLEN_INFO_VARLEN)
    sks = tuple(a * tn + b for _, (a, b) in _SEQLEN_INFO_VARLEN)
    varlen = dict(batch=len(sqs), seqlens_q=sqs, seqlens_k=sks, seqlen_q=max(sqs), seqlen_k=max(sks))
    score = "mod:seqlen_bias" in space.score_pairs and "score_mod" in forms
    mask = "mod:causal_aligned" in space.mask_pairs and "mask_mod" in forms
    varlen_ok = "zero" in space.values["seqlen"] or "many" in space.values["seqlen"]
    if score and varlen_ok and "1" in gqas:
        out.append(("seqlen_info_varlen_score", AttentionProblem(
            nheads=2, nheads_kv=2, mods=("seqlen_bias",), values=vals(), **varlen, **base),
            runs_bwd("score_mod", "1", "zero")))
    scale = "mod:batch_length_scale" in space.score_pairs and "score_mod" in forms
    if scale and varlen_ok and "1" in gqas:
        out.append(("seqlen_info_varlen_scale", AttentionProblem(
            nheads=2, nheads_kv=2, mods=("batch_length_scale",), values=vals(), **varlen, **base),
            runs_bwd("score_mod", "1", "zero")))
    if mask and varlen_ok and "4" in gqas:
        out.append(("seqlen_info_varlen_mask", AttentionProblem(
            nheads=8, nheads_kv=2, mods=("causal_aligned",), values=vals(), **varlen, **base),
            runs_bwd("mask_mod", "4", "zero") and "mod:causal_aligned" in space.mask_pairs_bwd))
    if score and "seqused_k" in forms and "seqused_q" in forms and "1" in gqas:
        lq, lk = (tm + 9, 33, 40), (2 * tn + 3, 70, 17)
        out.append(("seqlen_info_seqused", AttentionProblem(
            batch=3, seqlens_q=lq, seqlens_k=lk, seqlen_q=max(lq), seqlen_k=max(lk), nheads=2, nheads_kv=2,
            mods=("seqlen_bias",), values=vals(),
            call=CallForm(seqused_q=True, q_capacity=max(lq) + 16, seqused_k=True, kv_capacity=max(lk) + 29), **base),
            runs_bwd("score_mod", "1", "zero") and _runs_bwd(space, form="seqused_q", hd=name, gqa="1", mask="none")))
    # (dense: one key more for the temperature, whose index reads the lengths' difference mod 4 --
    # odd, so the two lengths swapped move it)
    for edge, pair, form, ok, sk in (("seqlen_info_dense_score", "seqlen_bias", "score_mod", score, 2 * tn + 3),
                                     ("seqlen_info_dense_mask", "causal_aligned", "mask_mod", mask, 2 * tn + 3),
                                     ("seqlen_info_dense_scale", "batch_length_scale", "score_mod", scale, 2 * tn + 4)):
        if ok and "1" in gqas:
            out.append((edge, AttentionProblem(
                batch=2, seqlen_q=tm + 9, seqlen_k=sk, nheads=2, nheads_kv=2, mods=(pair,), values=vals(),
                **base), runs_bwd(form, "1", "multi") and (form == "score_mod" or f"mod:{pair}" in space.mask_pairs_bwd)))
    return out


def _sm90_tile_edges(space: FeatureSpace, vals) -> list[tuple[str, Any, bool]]:
    """The SM90 edges of :func:`edge_problems` whose shape follows FA4's tiles (each only where the
    space has its mask, form and head counts: free head counts, no deployment's)."""
    from fa4verify.problem import AttentionProblem
    out: list[tuple[str, Any, bool]] = []
    masks, forms = space.values["mask"], space.values["form"]
    free = not space.lengths and not space.heads
    square = [n for n in space.values["hd"] if space.hd[n][0] == space.hd[n][1]]
    if not free or not square:
        return out
    # a head dim outside the SM90 dQ finding's (sm90_dq_accum_hdim_rounding: multiples of 8, not 16,
    # and 16/48): 128 first, where there is one
    plain = sorted((n for n in square if space.hd[n][0] % 32 == 0), key=lambda n: (space.hd[n][0] != 128, space.hd[n][0]))
    first = plain[0] if plain else square[0]
    base = dict(arch=space.arch, dtype=space.dtype)

    def hd_of(name):
        return dict(head_dim=space.hd[name][0], head_dim_v=space.hd[name][1])

    def runs_bwd(form: str, name: str, gqa: str, mask: str) -> bool:
        return _runs_bwd(space, form=form, hd=name, gqa=gqa, mask=mask)
    mask = "causal_left" if "causal_left" in masks else "causal"
    packed = [n for n in square if facts.fwd_tile("sm90", space.dtype, *space.hd[n], True, mask != "causal")[0] % 3]
    if "mqa" in space.values["gqa"] and "dense" in forms and mask in masks and packed:
        name = first if first in packed else packed[-1]
        tm, tn = facts.fwd_tile("sm90", space.dtype, *space.hd[name], True, mask != "causal")
        last = -(-tm // 3) - 1                       # the last logical row of M block 0
        d = (-last) % tn                             # seqlen_k - seqlen_q: its diagonal key opens a KV tile
        sq = last + 1 + 57
        out.append(("packed_causal_block_end", AttentionProblem(
            batch=1, seqlen_q=sq, seqlen_k=sq + d, nheads=3, nheads_kv=1, causal=mask == "causal",
            window_size=(4, 0) if mask == "causal_left" else (None, None), values=vals(), **hd_of(name), **base),
            runs_bwd("dense", name, "mqa", mask)))
        if mask == "causal_left":
            # the window's left bound of M block 1: its first packed row belongs to logical row
            # floor(tile_m / 3), whose leftmost key is the last key of a KV tile (FA4 must round
            # the packed row down, block_info.get_n_block_min_max)
            tm, tn = facts.fwd_tile("sm90", space.dtype, *space.hd[name], True, True)
            r0, wl = tm // 3, 7
            sq = max(100, r0 + 20)
            out.append(("packed_local_first_key", AttentionProblem(
                batch=1, seqlen_q=sq, seqlen_k=sq + (tn - 1 - r0 + wl) % tn, nheads=3, nheads_kv=1, causal=True,
                window_size=(wl, 0), values=vals(), **hd_of(name), **base), runs_bwd("dense", name, "mqa", mask)))
    wmask = "both" if "both" in masks else ("left" if "left" in masks else None)
    if wmask is not None and "dense" in forms:
        name = first
        tmb, tnb = facts.sm90_bwd_tile(*space.hd[name], False, True)
        wl = (1 - tnb) % tmb or tmb                  # m_idx_left = tnb + wl = 1 (mod tmb), n_block 0
        sq = tnb + wl + 40
        out.append(("bwd_window_left_mblock", AttentionProblem(
            batch=1, seqlen_q=sq, seqlen_k=sq, nheads=2, nheads_kv=2, window_size=(wl, 3 if wmask == "both" else None),
            values=vals(), **hd_of(name), **base), runs_bwd("dense", name, "1", wmask)))
    swap = [n for n in square if space.hd[n][0] <= 128]      # FA4's SM90 backward transposes S there
    swap = ([first] if first in swap else []) + swap
    if "score_mod" in forms and "mod:rel_scale" in space.score_pairs and "1" in space.values["gqa"] and swap:
        out.append(("score_bwd_indices", AttentionProblem(
            batch=1, seqlen_q=100, seqlen_k=150, nheads=2, nheads_kv=2, mods=("rel_scale",), values=vals(),
            **hd_of(swap[0]), **base), runs_bwd("score_mod", swap[0], "1", "none")))
    # red-team round 16: rel_scale's derivative reads kv - q only within its radius, and the edges
    # above run one or two backward M tiles: three tiles and a bit, MHA, so the band crosses tile
    # edges in both directions (a tile-local index in the backward moves it)
    if "score_mod" in forms and "mod:rel_scale" in space.score_pairs and "1" in space.values["gqa"] and swap:
        tmb = facts.sm90_bwd_tile(*space.hd[swap[0]], False, False)[0]
        out.append(("score_bwd_indices_tiles", AttentionProblem(
            batch=2, seqlen_q=3 * tmb + 5, seqlen_k=3 * tmb + 5, nheads=2, nheads_kv=2, mods=("rel_scale",),
            values=vals(), **hd_of(swap[0]), **base), runs_bwd("score_mod", swap[0], "1", "none")))
    # above head dim 128 FA4's SM90 backward does not transpose S: the score_mod (and its derivative)
    # positions come from the other branch of the tile offset (the sixth red-team round); one edge
    # per backward tile there
    wide: dict = {}
    for n in sorted(square, key=lambda n: (space.hd[n][0] % 64 != 0, space.hd[n][0])):    # 192, 256 first
        if space.hd[n][0] > 128 and runs_bwd("score_mod", n, "1", "none"):
            wide.setdefault(facts.sm90_bwd_tile(*space.hd[n], False, False), n)
    if "score_mod" in forms and "mod:rel_scale" in space.score_pairs and "1" in space.values["gqa"]:
        for tile, n in sorted(wide.items()):
            out.append((f"score_bwd_indices_{space.hd[n][0]}", AttentionProblem(
                batch=1, seqlen_q=100, seqlen_k=150, nheads=2, nheads_kv=2, mods=("rel_scale",), values=vals(),
                **hd_of(n), **base), True))
    if "varlen" in forms and "causal" in masks and "1" in space.values["gqa"]:
        name = first
        lens = (37, 64, 129)
        out.append(("varlen_head_sections", AttentionProblem(
            batch=3, seqlens_q=lens, seqlens_k=lens, seqlen_q=max(lens), seqlen_k=max(lens), nheads=20, nheads_kv=20,
            causal=True, values=vals(), **hd_of(name), **base), runs_bwd("varlen", name, "1", "causal")))
    return out


def _forward_layout_edges(space: FeatureSpace, vals) -> list[tuple[str, Any, bool]]:
    """The edges of :func:`edge_problems` from the seventh red-team round (the SM90 forward,
    ``docs/results/redteam7/``), each only where the space has its form, pair and head counts
    (free head counts and lengths, no deployment's):

    * ``score_unpacked_gqa``: an index-reading score pair (``rel_bias``, else ``alibi``) on GQA 4/2
      with ``pack_gqa=False``: the forward must hand the mod logical rows and query heads (FA4's
      SM90 backward hands packed ones there: known issue ``sm90_score_mod_gqa_bwd_indices``);
    * ``packed_cpasync_192`` (SM90, causal and not): 14 query / 2 KV heads at a head dim whose
      forward tile_m is 192 (hd <= 96), so PackGQA loads Q with cp.async and each producer thread
      keeps two row pointers (``pack_gqa.py`` ``compute_ptr``), past 128 packed rows;
    * ``seqused_k_packed_q_batched``: GQA 4/2, Q batched (no ``cu_seqlens_q``) over K/V packed at
      capacity offsets with ``seqused_k`` (causal: the diagonal follows each sequence's used keys);
    * ``mask_mod_causal_passed``: a mask pair (``document``, else ``sliding_window``) whose call also
      passes ``causal=True`` (FA4's forward drops it; the backward must too);
    * ``half_negative_window_left`` / ``_right``: windows (-2, 2) and (3, -1), one side negative
      (FA4 reads it literally; rows whose window holds no key are fully masked);
    * ``inference_varlen_sink``, ``inference_causal_gqa``, ``inference_widest_window``: the forward
      also called as inference (``CallForm.inference``: no LSE, no gradient), its O bitwise the
      training call's (forward only; ``decode_batched_q_paged`` asks for it too);
    * ``batched_empty_keys`` / ``_queries``: FA4's batched call (``q_batched`` alone) with no keys
      (GQA 4/2, a sink where the space has one: LSE = sink, dsink = the sum of dLSE; causal where
      the space has it) or no queries, forward and backward through FA4's early returns;
    * ``seqused_q_packed_many``: more sequences than FA4's batch-search threshold, Q packed at
      capacity offsets with ``seqused_q`` (the batch lookup over used rows);
    * ``paged_score_aux`` (SM90): an aux-tensor score pair on paged KV without ``seqused_k`` (full
      pages: FA4 takes each length from the table's width), forward only;
    * ``sparse_q256`` (SM90): a block mask of 256-row Q blocks, two forward tiles each (FA4's
      ``q_subtile_factor``, the block SM100's forward requires), forward only."""
    from fa4verify.problem import AttentionProblem, CallForm
    out: list[tuple[str, Any, bool]] = []
    forms, gqas = space.values["form"], space.values["gqa"]
    if space.lengths or space.heads:
        return out
    name = _hd128(space)
    d, dv = space.hd[name]
    base = dict(arch=space.arch, dtype=space.dtype)
    pair = next((p for p in ("rel_bias", "alibi") if f"mod:{p}" in space.score_pairs), None)
    if "score_mod" in forms and "2_unpacked" in gqas and pair is not None:
        out.append(("score_unpacked_gqa", AttentionProblem(
            batch=1, seqlen_q=128, seqlen_k=150, nheads=4, nheads_kv=2, head_dim=d, head_dim_v=dv, mods=(pair,),
            call=CallForm(pack_gqa=False), values=vals(), **base),
            _runs_bwd(space, form="score_mod", hd=name, gqa="2_unpacked", mask="none")))
    if "seqused_k" in forms and "2" in gqas:
        # Q batched (no cu_seqlens_q) over K/V packed at capacity offsets (cu_seqlens_k, seqused_k),
        # GQA (the other packed-K edges are MHA)
        sks = (90, 17, 0)
        out.append(("seqused_k_packed_q_batched", AttentionProblem(
            batch=3, seqlens_q=(70, 70, 70), seqlens_k=sks, seqlen_q=70, seqlen_k=max(sks), nheads=4, nheads_kv=2,
            head_dim=d, head_dim_v=dv, causal="causal" in space.values["mask"], values=vals(),
            call=CallForm(seqused_k=True, kv_capacity=160, kv_packed=True, q_batched=True), **base),
            _runs_bwd(space, form="seqused_k", hd=name, gqa="2",
                      mask="causal" if "causal" in space.values["mask"] else "none")))
    # a mask pair whose call also passes causal=True: FA4's forward drops causal for a mask_mod; its
    # backward resolves the window without the mask_mod (interface.py), so it may not (a prediction
    # of the eighth red-team round, not measured)
    mpair = next((m for m in ("document", "sliding_window", "prefix_lm") if f"mod:{m}" in space.mask_pairs_bwd), None)
    if "mask_mod" in forms and mpair is not None and "1" in gqas:
        out.append(("mask_mod_causal_passed", AttentionProblem(
            batch=1, seqlen_q=192, seqlen_k=192, nheads=2, nheads_kv=2, head_dim=d, head_dim_v=dv, mods=(mpair,),
            call=CallForm(mask_causal=True), values=vals(), **base),
            _runs_bwd(space, form="mask_mod", hd=name, gqa="1", mask="none")))
    # a window with one negative side (FA4 reads it literally: left -2 keeps keys i+2 on; the
    # eighth red-team round), each side once
    if "dense" in forms and "both" in space.values["mask"] and "1" in gqas:
        for tag, win in (("left", (-2, 2)), ("right", (3, -1))):
            out.append((f"half_negative_window_{tag}", AttentionProblem(
                batch=1, seqlen_q=100, seqlen_k=100, nheads=2, nheads_kv=2, head_dim=d, head_dim_v=dv,
                window_size=win, values=vals(), **base),
                _runs_bwd(space, form="dense", hd=name, gqa="1", mask="both")))
    # the inference call (no LSE, no gradient: FA4's kernel without the LSE store), O bitwise the
    # training call's: a varlen causal call with a sink (empty rows take the sink's LSE) and the
    # widest head dim with a left window (decode: decode_batched_q_paged)
    if "varlen" in forms and "causal" in space.values["mask"] and "1" in gqas:
        sink = [v for v in space.values["sink"] if v != "off"]
        lens_q, lens_k = (37, 0, 130), (200, 9, 130)
        out.append(("inference_varlen_sink", AttentionProblem(
            batch=3, seqlens_q=lens_q, seqlens_k=lens_k, seqlen_q=130, seqlen_k=200, nheads=2, nheads_kv=2,
            head_dim=d, head_dim_v=dv, causal=True, sink=bool(sink), sink_dtype=sink[-1] if sink else "fp32",
            values=vals(), call=CallForm(inference=True), **base), False))
    if "dense" in forms and "causal" in space.values["mask"] and "2" in gqas:
        # the commonest inference call: flash_attn_func(q, k, v, causal=True) under no_grad, GQA
        # (red-team round 15: the no-LSE forward ran only on varlen and windowed calls)
        out.append(("inference_causal_gqa", AttentionProblem(
            batch=2, seqlen_q=300, seqlen_k=300, nheads=4, nheads_kv=2, head_dim=d, head_dim_v=dv, causal=True,
            values=vals(), call=CallForm(inference=True), **base), False))
    widest = max(space.values["hd"], key=lambda n: space.hd[n])
    if "dense" in forms and "left" in space.values["mask"] and "2" in gqas:
        out.append(("inference_widest_window", AttentionProblem(
            batch=2, seqlen_q=150, seqlen_k=300, nheads=4, nheads_kv=2, head_dim=space.hd[widest][0],
            head_dim_v=space.hd[widest][1], window_size=(70, None), values=vals(), call=CallForm(inference=True),
            **base), False))
    # FA4's batched empty input (the call form q_batched alone: a varlen problem of equal lengths
    # called batched): no keys (O = 0, LSE the sink's, dsink from dLSE) and no queries, each through
    # FA4's early returns, forward and backward (the eighth red-team round's list, item 7)
    if "dense" in forms and "2" in gqas:
        sink = [v for v in space.values["sink"] if v != "off"]
        causal = "causal" in space.values["mask"]
        for tag, sq, sk in (("keys", 64, 0), ("queries", 0, 96)):
            out.append((f"batched_empty_{tag}", AttentionProblem(
                batch=2, seqlens_q=(sq, sq), seqlens_k=(sk, sk), seqlen_q=sq, seqlen_k=sk, nheads=4, nheads_kv=2,
                head_dim=d, head_dim_v=dv, causal=causal and tag == "keys", sink=bool(sink),
                sink_dtype=sink[0] if sink else "fp32", values=vals(), call=CallForm(q_batched=True), **base),
                _runs_bwd(space, form="dense", hd=name, gqa="2", mask="causal" if causal and tag == "keys" else "none",
                          sink=sink[0] if sink else "off")))
    thresh = facts.varlen_batch_search_threshold()
    if "seqused_q" in forms and "1" in gqas and thresh is not None:
        # more sequences than the batch-search threshold with Q packed at capacity offsets and
        # seqused_q: the varlen scheduler's batch lookup reads each sequence's used rows
        n = thresh + 44
        sqs = tuple(1 + (i * 5) % 7 for i in range(n))
        out.append(("seqused_q_packed_many", AttentionProblem(
            batch=n, seqlens_q=sqs, seqlens_k=(13,) * n, seqlen_q=max(sqs), seqlen_k=13, nheads=2, nheads_kv=2,
            head_dim=d, head_dim_v=dv, causal="causal" in space.values["mask"], values=vals(),
            call=CallForm(seqused_q=True, q_capacity=8, q_packed=True), **base),
            _runs_bwd(space, form="seqused_q", hd=name, gqa="1", seqlen="many",
                      mask="causal" if "causal" in space.values["mask"] else "none")))
    if space.arch != "sm90":
        return out
    wide = [n for n in space.values["hd"] if space.hd[n][0] == space.hd[n][1]
            and facts.fwd_tile("sm90", space.dtype, *space.hd[n], False, False)[0] == 192]
    if "7" in gqas and "dense" in forms and wide:
        n = min(wide, key=lambda x: (space.hd[x][0] != 64, space.hd[x][0]))
        for causal in (False, True):
            if ("causal" if causal else "none") in space.values["mask"]:
                out.append((f"packed_cpasync_192{'_causal' if causal else ''}", AttentionProblem(
                    batch=1, seqlen_q=200, seqlen_k=200, nheads=14, nheads_kv=2, head_dim=space.hd[n][0],
                    head_dim_v=space.hd[n][1], causal=causal, values=vals(), **base),
                    _runs_bwd(space, form="dense", hd=n, gqa="7", mask="causal" if causal else "none")))
    if "paged_tile" in forms and pair is not None and "1" in gqas:
        # a page table without seqused_k (every length from the table's width) and an aux mod:
        # the kv index FA4 hands the mod wraps at the sequence's length, not the page size
        tn = facts.fwd_tile("sm90", space.dtype, d, dv, False, False)[1]
        cap = 2 * tn
        out.append(("paged_score_aux", AttentionProblem(
            batch=2, seqlens_q=(37, 100), seqlens_k=(cap, cap), seqlen_q=100, seqlen_k=cap, nheads=2, nheads_kv=2,
            head_dim=d, head_dim_v=dv, mods=(pair,), values=vals(),
            call=CallForm(seqused_k=True, kv_capacity=cap, page_size=tn, page_seed=7, full_pages=True), **base),
            False))
    if "block_sparse" in forms and "1" in gqas and facts.sm90_fwd_fits_sparse_kv():
        tm = facts.fwd_tile("sm90", space.dtype, d, dv, False, False)[0]
        bk = sparse_block_size(space.arch, d, dv)[1]
        out.append(("sparse_q256", AttentionProblem(
            batch=1, seqlen_q=2 * 256 + 37, seqlen_k=3 * bk + 5, nheads=2, nheads_kv=2, head_dim=d, head_dim_v=dv,
            call=CallForm(block_size=(2 * tm if tm >= 128 else 256, bk), block_seed=7, block_keep=0.6),
            values=vals(), **base), False))
    return out
