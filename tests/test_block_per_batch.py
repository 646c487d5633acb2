"""A dense problem's block mask drawn per batch entry (``CallForm.block_per_batch``): FA4 takes
``(batch, heads, ...)`` block lists, and a kernel that reads batch 0's lists for every entry (the
second red-team round's ``block_sparse_fwd_batch_index_dropped``) keeps another entry's blocks,
which a judge with one mask for every entry cannot see."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify.problem import AttentionProblem, CallForm


def _problem(per_batch=True):
    return AttentionProblem(arch="sm90", dtype="bf16", batch=3, seqlen_q=300, seqlen_k=400, nheads=2, nheads_kv=2,
                            head_dim=64, head_dim_v=64,
                            call=CallForm(block_size=(128, 128), block_seed=11, block_keep=0.6,
                                          block_per_batch=per_batch))


def test_each_entry_keeps_its_own_blocks_and_the_oracle_follows():
    from fa4verify.judge import attention as ja
    p = _problem()
    keeps = p.keep_masks()
    grids = [p.call.block_mask(p.seqlen_q, p.seqlen_k, seq=b) for b in range(p.batch)]
    assert any(not np.array_equal(grids[0], g) for g in grids[1:])
    for b, (k, g) in enumerate(zip(keeps, grids)):
        assert np.array_equal(k, np.kron(g, np.ones((128, 128), bool))[:300, :400]), b
    # the shared form: one grid, every entry the same
    shared = _problem(per_batch=False).keep_masks()
    assert all(np.array_equal(shared[0], k) for k in shared[1:])
    # the oracle (the keep-pattern rewrite) attends each entry's own keys: entry b's O from its keys
    a = p.materialize()
    o = ja.oracle_forward(p, a).out
    b = 2
    q, kk, v = (np.asarray(a[n], np.float64)[b, :, 0] for n in ("q", "k", "v"))
    s = np.where(keeps[b], q @ kk.T * p.scale, -np.inf)
    w = np.exp(s - s.max(axis=1, keepdims=True))
    w = np.where(keeps[b].any(axis=1)[:, None], w / np.where(w.sum(1) > 0, w.sum(1), 1)[:, None], 0)
    assert np.allclose(o[b, :, 0], w @ v, atol=1e-9)


def test_a_kernel_reading_entry_0s_blocks_fails_the_judge():
    """Every entry attending entry 0's blocks (the fault's output, computed here in float64 and
    rounded to bf16) fails ``forward_out``."""
    import ml_dtypes
    from fa4verify.judge import attention as ja
    p = _problem()
    a = p.materialize()
    keep0 = p.keep_masks()[0]
    bad = np.zeros((p.batch, p.seqlen_q, p.nheads, p.head_dim_v))
    for b in range(p.batch):
        for h in range(p.nheads):
            q, kk, v = (np.asarray(a[n], np.float64)[b, :, h] for n in ("q", "k", "v"))
            s = np.where(keep0, q @ kk.T * p.scale, -np.inf)
            w = np.exp(s - np.where(keep0.any(1), s.max(axis=1), 0)[:, None])
            w = np.where(keep0.any(axis=1)[:, None], w / np.where(w.sum(1) > 0, w.sum(1), 1)[:, None], 0)
            bad[b, :, h] = w @ v
    out = np.asarray(bad, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    f = ja.oracle_forward(p, a)
    assert ja.judge_forward(p, a, out, f.lse).out.status == "fail"
    assert ja.judge_forward(p, a, np.asarray(f.out, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64),
                            f.lse).out.status == "pass"


@pytest.mark.fa4
def test_the_adapter_lists_each_entrys_blocks():
    from fa4verify.kernels import adapter
    p = _problem()
    grids = np.stack([p.call.block_mask(p.seqlen_q, p.seqlen_k, seq=b) for b in range(p.batch)])
    t = adapter.block_sparse_tensors(grids, batch=p.batch, nheads=2, block_size=(128, 128), device="cpu")
    cnt = t.full_block_cnt.numpy()
    idx = t.full_block_idx.numpy()
    assert cnt.shape == (3, 2, grids.shape[1]) and idx.shape == (3, 2) + grids.shape[1:]
    for b in range(3):
        for r in range(grids.shape[1]):
            assert list(idx[b, 1, r, :cnt[b, 1, r]]) == list(np.flatnonzero(grids[b, r]))
    bwd = adapter.block_sparse_tensors(grids, batch=p.batch, nheads=2, block_size=(128, 128), device="cpu",
                                       direction="bwd")
    for b in range(3):
        assert list(bwd.full_block_cnt.numpy()[b, 0]) == list(grids[b].sum(axis=0))
