"""Paged KV semantics (fa4verify.oracles.paged_kv): a page table is only an indexing of K/V.

Checked against an independent per-token loop and an independent float64 attention computed
straight from the pages (no gather helper), including partially filled last pages, seqused_k,
NaN in unused pages and the inverse :func:`paginate`."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify.oracles import attention as orc
from fa4verify.oracles.paged_kv import contiguous_kv, paginate


def _loop_gather(k_pages, page_table, seqused):
    P = k_pages.shape[1]
    return [np.stack([k_pages[page_table[b][j // P]][j % P] for j in range(n)]) if n else
            np.zeros((0,) + k_pages.shape[2:]) for b, n in enumerate(seqused)]


@pytest.mark.parametrize("page_size", [1, 16, 64, 128])
def test_gather_equals_per_token_loop(page_size):
    rng = np.random.default_rng(page_size)
    batch, max_pages, h, d = 3, 4, 2, 8
    num_pages = batch * max_pages + 3
    kp = rng.standard_normal((num_pages, page_size, h, d))
    vp = rng.standard_normal((num_pages, page_size, h, d))
    table = rng.permutation(num_pages)[: batch * max_pages].reshape(batch, max_pages).astype(np.int32)
    used = np.array([max_pages * page_size, 1, max(0, (max_pages - 1) * page_size - 1)], np.int32)
    got = contiguous_kv(kp, vp, table, used)
    want_k = _loop_gather(kp, table, used)
    want_v = _loop_gather(vp, table, used)
    for b in range(batch):
        assert got[b][0].shape == (used[b], h, d)
        assert np.array_equal(got[b][0], want_k[b]) and np.array_equal(got[b][1], want_v[b])


@pytest.mark.parametrize("permute", [False, True])
def test_paginate_round_trips_with_partial_last_pages(permute):
    rng = np.random.default_rng(7)
    k = rng.standard_normal((3, 100, 2, 8)).astype(np.float32)
    v = rng.standard_normal((3, 100, 2, 8)).astype(np.float32)
    used = np.array([100, 37, 0])
    kp, vp, table = paginate(k, v, 16, seqused_k=used, rng=rng if permute else None, spare_pages=2)
    assert table.shape == (3, 7) and kp.shape == (3 * 7 + 2, 16, 2, 8)
    got = contiguous_kv(kp, vp, table, used)
    for b in range(3):
        assert np.array_equal(got[b][0], k[b, : used[b]]) and np.array_equal(got[b][1], v[b, : used[b]])
    # rows past seqused in a used page are finite filler; unused pages NaN
    used_pages = {int(table[b, p]) for b in range(3) for p in range(-(-int(used[b]) // 16))}
    assert all(np.isfinite(kp[p]).all() for p in used_pages)
    assert all(np.isnan(kp[p]).all() for p in set(range(kp.shape[0])) - used_pages)
    if permute:
        assert not np.array_equal(table.ravel(), np.arange(table.size))


def test_out_of_range_page_is_an_error():
    kp = np.zeros((2, 4, 1, 2))
    with pytest.raises(ValueError, match="outside"):
        contiguous_kv(kp, kp, np.array([[0, 5]], np.int32), np.array([8]))
    with pytest.raises(ValueError, match="seqused_k"):
        contiguous_kv(kp, kp, np.array([[0, 1]], np.int32), np.array([9]))


def test_paged_attention_oracle_equals_float64_attention_from_pages():
    """Oracle of the gathered K/V (what a paged call means) vs a float64 softmax computed by
    indexing the pages directly, per query row; unused pages hold NaN and must not matter."""
    import ml_dtypes
    rng = np.random.default_rng(11)
    bf = ml_dtypes.bfloat16
    b, sq, h, d, P = 2, 5, 2, 16, 16
    k = rng.standard_normal((b, 70, h, d)).astype(bf).astype(np.float32)
    v = rng.standard_normal((b, 70, h, d)).astype(bf).astype(np.float32)
    q = rng.standard_normal((b, sq, h, d)).astype(bf).astype(np.float32)
    used = np.array([70, 21])
    kp, vp, table = paginate(k, v, P, seqused_k=used, rng=rng, spare_pages=1)
    scale = 1 / np.sqrt(d)
    for bi, (kb, vb) in enumerate(contiguous_kv(kp, vp, table, used)):
        r = orc.forward(q[bi:bi + 1].astype(bf), kb[None].astype(bf), vb[None].astype(bf))
        for hi in range(h):
            for i in range(sq):
                idx = [(table[bi, j // P], j % P) for j in range(used[bi])]
                s = np.array([q[bi, i, hi].astype(np.float64) @ kp[pg, sl, hi].astype(np.float64)
                              for pg, sl in idx]) * scale
                w = np.exp(s - s.max())
                o = (w[:, None] * np.array([vp[pg, sl, hi] for pg, sl in idx], np.float64)).sum(0) / w.sum()
                assert np.all(np.abs(r.out[0, i, hi] - o) <= r.bound[0, i, hi] + 1e-14)
                assert abs(r.lse[0, hi, i] - (np.log(w.sum()) + s.max())) <= 1e-13
