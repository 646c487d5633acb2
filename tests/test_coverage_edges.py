"""Note [Constructed edges] (fa4verify.coverage.cases.edge_problems): the FA4 paths no plan row
reaches are run by rule, inside the space, after the rows; an edge that does not run makes the
coverage check undecided, never a pass."""
from __future__ import annotations

from fa4verify import mods
from fa4verify.audit import registry
from fa4verify.checks import coverage as C
from fa4verify.coverage import cases
from fa4verify.coverage.space import space_for
from fa4verify.deployment import Deployment
from fa4verify.problem.masks import resolve_window
from fa4verify.run.engine import run_here
from fa4verify.targets import TwinTarget, Unsupported


def test_each_edge_is_the_path_it_names():
    trip = cases.edge_problems(space_for("sm90", "bf16"))
    got = {n: p for n, p, _b in trip}
    back = {n: b for n, _p, b in trip}
    assert back == {"empty_keys": True, "empty_keys_sink": True, "empty_queries": True, "negative_window": True,
                    "sparse_q64": False, "sparse_q64_causal": False, "packed_causal_block_end": True, "bwd_window_left_mblock": True,
                    "varlen_head_sections": True, "score_bwd_indices": True, "head_mask_packgqa": True,
                    "varlen_score_aux_wrap": True, "varlen_batch_groups": True, "causal_l2_sections": True,
                    "paged_full_pages": False, "seqused_k_packed": True, "causal_l2_sections_batch": True,
                    "det_bwd_l2_sections": True, "varlen_lookup_long_first": True, "varlen_lookup_chunks": True,
                    "packed_local_first_key": True, "seqused_q_packed": True, "causal_key_past_tile": True,
                    "right_window_key_past_tile": True, "block_sparse_per_head": True, "paged_two_tiles": False,
                    "paged_48": False, "tile_tail_192x128": True, "tile_tail_192x144": True,
                    "tile_tail_128x128": True, "tile_tail_128x112": True, "tile_tail_128x80": True,
                    "det_bwd_l2_sections_batch": True, "score_bwd_indices_192": True, "score_bwd_indices_256": True,
                    "decode_batched_q_paged": False, "score_unpacked_gqa": True, "packed_cpasync_192": True,
                    "packed_cpasync_192_causal": True, "paged_score_aux": False, "sparse_q256": False,
                    "seqused_k_packed_q_batched": True, "seqused_q_packed_many": False,
                    "inference_varlen_sink": False, "inference_widest_window": False,
                    "half_negative_window_left": True, "half_negative_window_right": True,
                    "mask_mod_causal_passed": True, "batched_empty_keys": True, "batched_empty_queries": True,
                    "seqused_score_aux": True, "sparse_score_aux": True, "empty_first_blocks_192x128": True,
                    "empty_first_blocks_128x112": True, "empty_first_blocks_128x80": True,
                    "empty_first_blocks_192x128_left": True, "empty_first_blocks_128x96_left": True,
                    "empty_first_blocks_128x64_left": True, "causal_key_past_tile_negative": True,
                    "document_more_keys": True, "document_more_queries": True, "varlen_sparse_mask_blocks": False,
                    "paged_kv_fused_16": False, "paged_hnd_16": False, "paged_kv_fused_tile": False,
                    "paged_hnd_tile": False, "causal_l2_sections_varlen": True, "causal_l2_sections_seqused": True,
                    "packed_cpasync_hdv_pad": False, "packed_cpasync_hd_pad": False, "bwd_hdv_pad": True,
                    "layout_qkv_packed_varlen": True, "layout_strided_packed_cpasync": True,
                    "layout_transposed_gqa": True, "layout_qkv_packed_192": True, "layout_broadcast_mqa": True,
                    "gqa_16_causal": True, "gqa_64_packed": True, "gqa_71_cpasync": True, "score_head_gqa": True,
                    "seqlen_info_varlen_score": True, "seqlen_info_varlen_mask": True, "seqlen_info_seqused": True,
                    "seqlen_info_dense_score": True, "seqlen_info_dense_mask": True,
                    "seqlen_info_varlen_scale": True, "seqlen_info_dense_scale": True,
                    "score_head_mha": True, "score_scalars_bwd": True, "score_bwd_indices_tiles": True,
                    "inference_causal_gqa": False, "block_size_implicit": True,
                    "sink_off_masked_rows": True}
    # score pairs on the batched layout (seqused_q and seqused_k) and inside block sparsity
    p = got["seqused_score_aux"]
    assert p.call.seqused_q and p.call.seqused_k and p.mod_pairs()[0] is not None and 0 in p.seqlens_k
    p = got["sparse_score_aux"]
    assert p.call.block_size is not None and p.mods == ("alibi",) and "sparse_score_aux" in cases.NONDETERMINISTIC_EDGES
    # FA4's batched empty input: the batched call form (no cu_seqlens, no seqused) of equal lengths,
    # no keys (a sink: LSE = sink, dsink from dLSE) or no queries
    for n, side in (("batched_empty_keys", "seqlens_k"), ("batched_empty_queries", "seqlens_q")):
        p = got[n]
        assert p.call.q_batched and not (p.call.seqused_k or p.call.seqused_q) and p.call.batched_layout
        assert set(getattr(p, side)) == {0} and p.batch == 2 and p.nheads > p.nheads_kv
    assert got["batched_empty_keys"].sink and min(got["batched_empty_keys"].seqlens_q) > 0
    assert got["empty_keys"].varlen and sum(got["empty_keys"].seqlens_k) == 0 < sum(got["empty_keys"].seqlens_q)
    assert got["empty_keys_sink"].sink and sum(got["empty_keys_sink"].seqlens_k) == 0
    assert sum(got["empty_queries"].seqlens_q) == 0 < sum(got["empty_queries"].seqlens_k)
    p = got["negative_window"]
    assert p.window_size == (-1, -1) and resolve_window(p.causal, p.window_size)[:2] == (False, False)
    assert got["sparse_q64"].call.block_size[0] == 64 and got["sparse_q64"].seqlen_q > 64
    # red-team round 13's F46: FA4's tile_m-64 forward (64-row sparse Q blocks) with its causal mask,
    # on the same lists (Note [Block lists with causal or a window])
    c64 = got["sparse_q64_causal"]
    assert c64.causal and c64.call == got["sparse_q64"].call and c64.values == got["sparse_q64"].values
    from fa4verify.coverage.variants import fwd_variant
    if fwd_variant(c64) is not None:           # FA4 installed: its own forward configuration
        from flash_attn.cute import interface
        cfg = interface._fit_sm90_fwd_tile_to_block_sparsity(
            interface._tile_size_fwd_sm90(c64.head_dim, c64.head_dim_v, True, False, sparse_block_size_q=64),
            64, c64.call.block_size[1])
        assert cfg.m_block_size == 64
    from fa4verify.kernels import facts
    # Note [The diagonal's block bounds]: one key past the square; the last row of a forward M tile
    # alone opens a KV tile, and the last row of a backward M tile alone sees a KV tile's first key
    for name, p in (("causal_key_past_tile", got["causal_key_past_tile"]),
                    ("right_window_key_past_tile", got["right_window_key_past_tile"])):
        causal = name.startswith("causal")
        tm, tn = facts.fwd_tile("sm90", "bf16", p.head_dim, p.head_dim_v, causal, not causal)
        tmb, tnb = facts.bwd_tile("sm90", p.head_dim, p.head_dim_v, causal, not causal)
        off = p.seqlen_k - p.seqlen_q + (0 if causal else p.window_size[1])
        assert p.nheads == p.nheads_kv and p.values.distribution == "edges" and off >= 1
        assert any(((m + 1) * tm + off) % tn == 1 for m in range(p.seqlen_q // tm))
        assert any(0 <= n * tnb - off < p.seqlen_q and (n * tnb - off) % tmb == tmb - 1 for n in range(1, 8))
        assert name in cases.NONDETERMINISTIC_EDGES
    assert got["causal_key_past_tile"].seqlen_k == got["causal_key_past_tile"].seqlen_q + 1   # at hd 128
    # the deterministic backward's LPT sections filled by (batch, head) pairs: two entries of 8 heads
    # make one full section of 16 that the heads alone (8) do not
    p = got["det_bwd_l2_sections_batch"]
    sw = facts.lpt_bwd_swizzle(p.seqlen_q, p.head_dim, p.head_dim_v)
    assert p.batch == 2 and (p.batch * p.nheads) // sw == 1 and p.nheads // sw == 0 and not p.causal
    # the SM90 backward without S transposed (hd > 128): the rel_scale pair's positions, per backward tile
    assert {got[n].head_dim for n in ("score_bwd_indices_192", "score_bwd_indices_256")} == {192, 256}
    assert all(got[n].mods == ("rel_scale",) and got[n].nheads == got[n].nheads_kv
               for n in ("score_bwd_indices_192", "score_bwd_indices_256"))
    # the seventh red-team round: a score pair on unpacked GQA; PackGQA's cp.async Q load at tile_m 192
    # past 128 packed rows (a ratio dividing neither 128 nor 192); a Q block of two forward tiles
    p = got["score_unpacked_gqa"]
    assert p.call.pack_gqa is False and p.nheads > p.nheads_kv and p.mod_pairs()[0] is not None
    for n in ("packed_cpasync_192", "packed_cpasync_192_causal"):
        p = got[n]
        g = p.nheads // p.nheads_kv
        tm = facts.fwd_tile("sm90", "bf16", p.head_dim, p.head_dim_v, p.causal, False)[0]
        assert tm == 192 and 192 % g and 128 % g and p.seqlen_q * g > 128 and p.nheads_kv >= 2
    p = got["sparse_q256"]
    tm = facts.fwd_tile("sm90", "bf16", p.head_dim, p.head_dim_v, False, False)[0]
    assert p.call.block_size[0] // tm >= 2 and p.seqlen_q > p.call.block_size[0]
    # decode with a paged KV cache: Q batched, one token per sequence
    p = got["decode_batched_q_paged"]
    assert p.call.q_batched and p.call.paged and set(p.seqlens_q) == {1} and p.causal and p.call.inference
    assert got["inference_varlen_sink"].call.inference and got["inference_varlen_sink"].sink
    assert got["inference_widest_window"].head_dim == 256 and got["inference_widest_window"].call.inference
    # Note [Page sizes]: a page of two KV tiles and one of 48 keys (dividing no tile)
    tn = facts.fwd_tile("sm90", "bf16", 128, 128, False, False)[1]
    assert got["paged_two_tiles"].call.page_size == 2 * tn and got["paged_48"].call.page_size == 48
    assert all(max(got[n].seqlens_k) > 2 * got[n].call.page_size or got[n].call.page_size > tn
               for n in ("paged_two_tiles", "paged_48"))
    # Note [Every forward tile's tail]: each distinct unmasked forward tile once, its last KV tile 56 keys
    for n in ("tile_tail_192x128", "tile_tail_192x144", "tile_tail_128x128", "tile_tail_128x112", "tile_tail_128x80"):
        p = got[n]
        tiles = facts.fwd_tile("sm90", "bf16", p.head_dim, p.head_dim_v, False, False)
        assert n == f"tile_tail_{tiles[0]}x{tiles[1]}" and p.seqlen_k % tiles[1] == 56 and p.head_dim % 32 == 0
    # Q packed at capacity offsets with used lengths, causal: the diagonal follows seqused_q
    p = got["seqused_q_packed"]
    assert p.call.q_packed and p.call.seqused_q and p.causal and max(p.seqlens_q) < p.call.q_capacity
    # PackGQA: 3 query heads per KV head do not divide tile_m; the last row of M block 0 has its
    # diagonal key (bottom-right causal) at the first key of a KV tile
    p = got["packed_causal_block_end"]
    tm, tn = facts.fwd_tile("sm90", "bf16", p.head_dim, p.head_dim_v, True, p.local)
    last = -(-tm // 3) - 1
    assert (p.nheads, p.nheads_kv) == (3, 1) and tm % 3 and p.seqlen_q > last
    assert (last + p.seqlen_k - p.seqlen_q) % tn == 0 and p.keep_masks()[0][last, last + p.seqlen_k - p.seqlen_q]
    # the backward's M block bound: the last row that sees KV tile 0's last key opens an M block
    p = got["bwd_window_left_mblock"]
    tmb, tnb = facts.sm90_bwd_tile(p.head_dim, p.head_dim_v, False, True)
    row = tnb - 1 + p.window_size[0]
    assert row % tmb == 0 and p.keep_masks()[0][row, tnb - 1] and not p.keep_masks()[0][row + 1, tnb - 1]
    # more heads than one L2 head section (16) of the varlen LPT scheduler, not a multiple of it
    p = got["varlen_head_sections"]
    assert p.varlen and p.causal and p.nheads == p.nheads_kv and p.nheads > 16 and p.nheads % 16
    # the index-reading score pair on an MHA call, seqlen_q != seqlen_k
    p = got["score_bwd_indices"]
    assert p.mods == ("rel_scale",) and p.nheads == p.nheads_kv and p.seqlen_q != p.seqlen_k
    # Note [Masks by head]: a window per query head, 4 packed query heads per KV head, two KV
    # heads, rows past every head's span: each head keeps its own set
    p = got["head_mask_packgqa"]
    assert p.mods == ("head_window",) and p.heads_differ and (p.nheads, p.nheads_kv) == (8, 2)
    assert p.call is None or p.call.pack_gqa is not False
    keeps = [p.keep_masks(head=h)[0] for h in range(p.nheads)]
    assert len({k.tobytes() for k in keeps}) == p.nheads and all(k[-1].sum() < k[-1].size for k in keeps)
    # an aux-reading score pair on a varlen call: a sequence with more queries than keys (FA4
    # wraps q_idx modulo the sequence's seqlen_q), one with more keys than queries, an empty one
    p = got["varlen_score_aux_wrap"]
    pair = mods.get(p.mods[0])
    assert p.varlen and pair.kind == "score" and pair.aux is not None
    assert any(q > k for q, k in zip(p.seqlens_q, p.seqlens_k)) and any(q < k for q, k in zip(p.seqlens_q, p.seqlens_k))
    assert 0 in p.seqlens_q
    # the varlen scheduler's batch search in three warp-scan groups (31 sequences each), under
    # FA4's batch-lookup threshold
    p = got["varlen_batch_groups"]
    assert p.varlen and 62 < p.batch < facts.varlen_batch_search_threshold()
    # FA4's LPT scheduler: its L2 section holds 2 of the 3 heads' K/V (one full section + a residual)
    p = got["causal_l2_sections"]
    per_head = p.seqlen_k * (p.head_dim + p.head_dim_v) * 2
    swizzle = 1 << (facts.lpt_l2_bytes() // per_head).bit_length() - 1
    assert p.causal and not p.varlen and swizzle == 2 and p.batch * p.nheads == 3
    # paged KV without seqused_k: every sequence fills its pages (FA4 reads the table's width)
    p = got["paged_full_pages"]
    assert p.call.full_pages and p.call.paged and set(p.seqlens_k) == {p.call.kv_capacity}
    # seqused_k over packed K/V: cu_seqlens_k at capacity offsets, shorter used lengths
    p = got["seqused_k_packed"]
    from fa4verify import call_layout
    c = call_layout.call_arrays(p, p.materialize())
    assert p.call.kv_packed and c["cu_seqlens_k"].tolist() == [0, 160, 320, 480] and c["k"].shape[0] == 480
    assert list(c["seqused_k"]) == list(p.seqlens_k) and max(p.seqlens_k) < p.call.kv_capacity
    # the same L2 section of 2 filled by two batch entries of one head (sections count (batch, head) pairs)
    p = got["causal_l2_sections_batch"]
    per_head = p.seqlen_k * (p.head_dim + p.head_dim_v) * 2
    swizzle = 1 << (facts.lpt_l2_bytes() // per_head).bit_length() - 1
    assert p.causal and (p.batch, p.nheads) == (2, 1) and swizzle == 2 and p.nheads < swizzle <= p.batch * p.nheads
    # the deterministic backward's LPT scheduler: a full section of 16 heads and a residual one
    p = got["det_bwd_l2_sections"]
    sw = facts.lpt_bwd_swizzle(p.seqlen_q, p.head_dim, p.head_dim_v)
    assert not p.causal and not p.varlen and p.batch * p.nheads > sw and (p.batch * p.nheads) % sw
    # more sequences than FA4's batch-lookup threshold; sequence 0 more packed M blocks of the forward
    # than unpacked (2 query heads per KV head; SM90's tile and SM100's two-stage one), its keys two
    # backward M tiles but one N tile
    p = got["varlen_lookup_long_first"]
    tm = facts.fwd_tile("sm90", "bf16", p.head_dim, p.head_dim_v, False, False)[0]
    tmb, tnb = facts.sm90_bwd_tile(p.head_dim, p.head_dim_v, False, False)
    q0, k0 = p.seqlens_q[0], p.seqlens_k[0]
    assert p.batch > facts.varlen_batch_search_threshold() and (p.nheads, p.nheads_kv) == (4, 2) and not p.causal
    assert all(-(-2 * q0 // t) != -(-q0 // t) for t in (tm, 2 * tm)) and -(-k0 // tmb) != -(-k0 // tnb)
    assert -(-q0 // tmb) > -(-q0 // tnb)          # the Q side's lookup hint counts backward M tiles
    assert cases.NONDETERMINISTIC_EDGES == {"varlen_lookup_long_first", "varlen_lookup_chunks", "mla_gather_2cta",
                                            "mla_gather_wide", "mla_gather_1cta", "causal_key_past_tile",
                                            "right_window_key_past_tile", "block_sparse_per_head",
                                            "sparse_score_aux", "block_size_implicit"}
    # more sequences than one chunk of FA4's block-count kernel
    p = got["varlen_lookup_chunks"]
    assert p.varlen and p.batch > facts.cu_blocks_chunk() + 32
    # PackGQA (3 per KV head) with a left window: M block 1's first row, floor(tile_m / 3), has its
    # leftmost key at the last key of a KV tile
    p = got["packed_local_first_key"]
    tm, tn = facts.fwd_tile("sm90", "bf16", p.head_dim, p.head_dim_v, True, True)
    r0, wl = tm // 3, p.window_size[0]
    left = r0 + p.seqlen_k - p.seqlen_q - wl
    assert (p.nheads, p.nheads_kv) == (3, 1) and tm % 3 and p.causal and left % tn == tn - 1
    keep = p.keep_masks()[0]
    assert keep[r0, left] and not keep[r0, left - 1] and keep[r0].sum() == wl + 1
    # SM100 has no sparse_q64 (its tile does not shrink to the Q block) nor the SM90 tile edges
    assert "sparse_q64" not in {n for n, _p, _b in cases.edge_problems(space_for("sm100", "bf16"))}


def test_edges_stay_inside_a_deployment():
    dep = Deployment.from_mapping({"name": "d", "head_dims": [128], "nheads": 4, "nheads_kv": 4,
                                   "masks": ["causal"], "seqlen_q": [64, 512], "seqlen_k": [64, 512],
                                   "distributions": ["normal"]}, "<test>")
    sp = space_for("sm90", "bf16", deployment=dep)
    got = cases.edge_problems(sp)
    # no empty sequence (its minimum is 64), no unmasked call (causal only), no free lengths
    assert not got


def test_an_edge_that_does_not_run_makes_the_check_undecided(monkeypatch):
    dep = Deployment.from_mapping({"name": "tiny", "head_dims": [16, 32], "nheads": 2, "nheads_kv": 1,
                                   "masks": ["none", "causal"], "seqlen_q": [1, 70], "seqlen_k": [1, 70],
                                   "distributions": ["normal"]}, "<test>")
    ctx = registry.CheckContext(arch="sm90", seed=0, profile="full", check_id="coverage.twin[sm90]",
                                deployment=dep.to_dict())
    whole = run_here(C.twin.__fa4verify_check__, ctx)
    assert whole.status == "pass", whole.summary
    assert whole.details["plan_coverage"]["edge_cases"] == {}       # none fits this deployment
    real = cases.edge_problems
    free = space_for("sm90", "bf16")
    monkeypatch.setattr(cases, "edge_problems", lambda space, *, seed=0: real(free, seed=seed)[:1])
    orig = TwinTarget.check_supported

    def refuse_empty_keys(self, problem):
        if problem.varlen and sum(problem.seqlens_k) == 0:
            raise Unsupported("stand-in refusal of the empty-keys edge")
        return orig(self, problem)
    monkeypatch.setattr(TwinTarget, "check_supported", refuse_empty_keys)
    r = run_here(C.twin.__fa4verify_check__, ctx)
    assert "plan_coverage" in r.details, (r.status, r.summary)
    assert r.details["plan_coverage"]["edge_cases"] == {"empty_keys": "unsupported"}, r.details["plan_coverage"]
    assert r.status == "undecided" and "constructed edge(s) not judged: empty_keys (unsupported)" in r.summary
