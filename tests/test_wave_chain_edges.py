"""Note [Chains longer than a wave] and Note [Head dims padded apart] on the CPU: the constructed
edges' shapes reach what they are built for (a deterministic causal backward on FA4's varlen
scheduler whose KV-block chain outgrows one wave of CTAs; one head-dim side padded and the other
not, on the PackGQA cp.async store and in an MHA backward), they stay out of a deployment's space,
and the edges built before them keep their problems."""
from __future__ import annotations

import dataclasses

from fa4verify.coverage import cases as C
from fa4verify.coverage.space import space_for
from fa4verify.kernels import facts

SMS_SM90 = 132          # an H100 SXM / H200: one SM90 backward CTA per SM at its shared-memory size


def _edges(arch="sm90", dtype="bf16"):
    return {n: (p, b) for n, p, b in C.edge_problems(space_for(arch, dtype))}


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def test_the_varlen_chain_edges_outgrow_a_wave_of_ctas_with_one_chain():
    e = _edges()
    for n, form in (("causal_l2_sections_varlen", "varlen"), ("causal_l2_sections_seqused", "seqused_k")):
        p, bwd = e[n]
        assert bwd and n not in C.NONDETERMINISTIC_EDGES          # the deterministic backward runs
        assert p.varlen and p.causal and p.batch == 1 and (p.call is not None) == (form == "seqused_k")
        tm, tn = facts.sm90_bwd_tile(p.head_dim, p.head_dim_v, True, False)
        n_blocks = -(-p.seqlens_k[0] // tn)
        assert p.nheads * n_blocks > 2 * SMS_SM90                   # CTAs: more than a wave
        # the 16 queries sit at the keys' end (causal, bottom-right): every KV block adds to M block 0
        assert p.seqlens_q[0] <= tm and p.seqlens_k[0] - p.seqlens_q[0] >= (n_blocks - 1) * tn
    # the dense sibling keeps its shape: one scheduler each
    assert e["causal_l2_sections"][0].seqlen_k == e["causal_l2_sections_varlen"][0].seqlen_k


def test_the_padding_edges_pad_one_side_only_where_the_faults_read_the_other_flag():
    e = _edges()
    p, bwd = e["packed_cpasync_hdv_pad"]
    assert p.head_dim % 16 == 0 and _round_up(p.head_dim_v, 16) != _round_up(p.head_dim_v, 32) and not bwd
    g = p.nheads // p.nheads_kv
    assert facts.sm90_fwd_tile(p.head_dim, p.head_dim_v, False, False)[0] % g != 0    # the cp.async store
    p, bwd = e["packed_cpasync_hd_pad"]
    assert p.head_dim_v % 16 == 0 and p.head_dim % 16 != 0 and not bwd
    p, bwd = e["bwd_hdv_pad"]
    assert bwd and p.nheads == p.nheads_kv and p.head_dim % 32 == 0 and p.head_dim_v % 32 != 0
    # none of the head-dim classes has one side padded and the other not: the plan never reaches it
    sp = space_for("sm90", "bf16")
    assert all((a % 16 == 0) == (b % 16 == 0) for a, b in sp.hd.values())


def test_a_deployment_gets_no_padding_or_chain_edges_and_earlier_edges_keep_their_problems():
    sp = space_for("sm90", "bf16")
    one_hd = dataclasses.replace(sp, hd={"128": (128, 128)}, values=dict(sp.values, hd=("128",)))
    assert not C._padding_edges(one_hd)
    assert not C._wave_chain_edges(dataclasses.replace(sp, heads={"h:8/2": (8, 2)}))
    assert not C._wave_chain_edges(space_for("sm100", "bf16"))
    # the new groups come last, each drawing values from a seed stream of its own (the edges before
    # them keep the values they were measured with)
    names = [n for n, _p, _b in C.edge_problems(sp)]
    new = {"paged_kv_fused_16", "paged_hnd_16", "paged_kv_fused_tile", "paged_hnd_tile", "causal_l2_sections_varlen",
           "causal_l2_sections_seqused", "packed_cpasync_hdv_pad", "packed_cpasync_hd_pad", "bwd_hdv_pad",
           "layout_qkv_packed_varlen", "layout_strided_packed_cpasync", "layout_transposed_gqa", "layout_qkv_packed_192",
           "layout_broadcast_mqa", "gqa_16_causal", "gqa_64_packed", "gqa_71_cpasync", "score_head_gqa",
           "score_head_mha", "score_scalars_bwd", "block_size_implicit", "sink_off_masked_rows"}
    assert set(names[-len(new):]) == new
