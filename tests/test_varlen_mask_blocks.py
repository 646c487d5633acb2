"""Note [Varlen mask blocks] (fa4verify.coverage.cases.varlen_mask_block_problem): FA4's varlen
block sparsity with mask blocks -- the edge's block lists as the adapter hands them to FA4 (mask
and full lists per sequence at FA4's global offsets), the oracle's keep-mask (full blocks, and
the mask pair inside mask blocks), and the sequences' mask-block counts differing where a kernel
reading another sequence's entry would keep other blocks."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify import mods
from fa4verify.coverage.cases import edge_problems
from fa4verify.coverage.space import space_for
from fa4verify.kernels import adapter
from fa4verify.oracles.block_sparse import dense_mask
from fa4verify.problem import AttentionProblem, CallForm, ValueSpec


@pytest.fixture(scope="module", params=["sm90", "sm100"])
def edge(request):
    got = {n: (p, b) for n, p, b in edge_problems(space_for(request.param, "bf16"))}
    return got["varlen_sparse_mask_blocks"]


def _grids(p):
    return [(lq, lk, i) for i, (lq, lk) in enumerate(zip(p.seqlens_q, p.seqlens_k))]


@pytest.mark.fa4          # FA4's BlockSparseTensorsTorch
def test_the_lists_fa4_gets(edge):
    p, bwd = edge
    assert not bwd and p.varlen and p.call.block_partial and p.mods and p.nheads == p.nheads_kv
    call = p.call
    listed = [call.block_mask(lq, lk, seq=i) for lq, lk, i in _grids(p)]
    part = [call.partial_blocks(lq, lk, seq=i) for lq, lk, i in _grids(p)]
    t = adapter.block_sparse_tensors_varlen(listed, nheads=2, block_size=call.block_size, device="cpu",
                                            partial=part)
    fc, fi = t.full_block_cnt.numpy(), t.full_block_idx.numpy()
    mc, mi = t.mask_block_cnt.numpy(), t.mask_block_idx.numpy()
    cu_m, cu_i = t.cu_total_m_blocks.numpy(), t.cu_block_idx_offsets.numpy()
    for b, (lst, prt) in enumerate(zip(listed, part)):
        nk = lst.shape[1]
        for m in range(lst.shape[0]):
            g = cu_m[b] + m                      # the global Q block FA4 reads
            row = slice(cu_i[b] + m * nk, cu_i[b] + (m + 1) * nk)
            assert (mc[:, g] == prt[m].sum()).all() and (fc[:, g] == (lst[m] & ~prt[m]).sum()).all()
            assert list(mi[0, row][: mc[0, g]]) == list(np.flatnonzero(prt[m]))
            assert list(fi[0, row][: fc[0, g]]) == list(np.flatnonzero(lst[m] & ~prt[m]))
    # by construction: a later sequence's local Q block counts other mask blocks than the global
    # block of that index (sequence 0's), and some sequence's Q blocks list different mask blocks
    counts = mc[0]
    assert any(counts[cu_m[b] + m] != counts[m] for b in range(1, len(part)) for m in range(part[b].shape[0]))
    assert any(not np.array_equal(q[0], q[m]) for q in part for m in range(1, q.shape[0]))


def test_the_oracle_keeps_full_blocks_and_the_pair_inside_mask_blocks(edge):
    p, _ = edge
    pair = mods.get(p.mods[0])
    keeps = p.keep_masks()
    differs = False
    for (lq, lk, i), keep in zip(_grids(p), keeps):
        listed = p.call.block_mask(lq, lk, seq=i)
        part = p.call.partial_blocks(lq, lk, seq=i)
        inner = np.broadcast_to(np.asarray(pair.ref(i, 0, np.arange(lq)[:, None], np.arange(lk)[None, :],
                                                    mods.aux_for(p, pair)), bool), (lq, lk))
        full = dense_mask(listed & ~part, p.call.block_size, lq, lk)
        inside = dense_mask(part, p.call.block_size, lq, lk)
        assert keep.shape == (lq, lk)
        assert np.array_equal(keep, full | (inside & inner))
        differs |= not np.array_equal(keep, full) and not np.array_equal(keep, full | inside)
    assert differs          # the mask blocks matter: neither dropped nor full


def test_varlen_block_sparsity_takes_a_mask_pair_but_not_a_named_pattern_or_a_score_pair():
    base = dict(arch="sm90", dtype="bf16", batch=2, seqlens_q=(100, 50), seqlens_k=(80, 60), seqlen_q=100,
                seqlen_k=80, nheads=2, nheads_kv=2, head_dim=128, head_dim_v=128,
                values=ValueSpec("normal", 1, ()))
    call = CallForm(block_size=(128, 128), block_seed=3, block_keep=0.9, block_partial=0.5)
    assert AttentionProblem(mods=("causal",), call=call, **base).varlen
    with pytest.raises(ValueError):
        AttentionProblem(mods=("alibi",), call=call, **base)
    with pytest.raises(ValueError):
        AttentionProblem(call=CallForm(mask_mod_fn="checkerboard_128"), **base)
