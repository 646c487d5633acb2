"""Block-sparsity semantics (fa4verify.oracles.block_sparse) against an independent float64
attention with the dense element mask."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fa4verify.oracles import attention as orc
from fa4verify.oracles.block_sparse import as_varlen, dense_mask


def _masked_attention(q, k, v, keep):
    s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    s = np.where(keep[None, None], s, -np.inf)
    with np.errstate(invalid="ignore"):
        m = s.max(-1, keepdims=True)
        e = np.where(np.isfinite(s), np.exp(s - np.where(np.isfinite(m), m, 0)), 0.0)
        l_ = e.sum(-1)
        o = np.einsum("bhqk,bkhd->bqhd", np.where(l_[..., None] > 0, e / np.where(l_ > 0, l_, 1)[..., None], 0), v)
        lse = np.where(l_ > 0, np.log(np.where(l_ > 0, l_, 1)) + m[..., 0], -np.inf)
    return o, lse


@pytest.mark.parametrize("blocks", [(32, 32), (32, 16), (48, 64)])
def test_varlen_rewrite_oracle_equals_masked_float64_attention(blocks):
    rng = np.random.default_rng(sum(blocks))
    b, sq, sk, h, d = 2, 96, 128, 2, 16
    bf = ml_dtypes.bfloat16
    q, k, v = (rng.standard_normal((b, n, h, d)).astype(bf).astype(np.float64) for n in (sq, sk, sk))
    bq, bk = blocks
    bm = rng.random((-(-sq // bq), -(-sk // bk))) < 0.5
    bm[0] = False                                   # a fully masked query block
    keep = dense_mask(bm, blocks, sq, sk)
    vr = as_varlen(q, k, v, bm, blocks)
    r = orc.forward(vr["q"].astype(bf), vr["k"].astype(bf), vr["v"].astype(bf),
                    cu_seqlens_q=vr["cu_seqlens_q"], cu_seqlens_k=vr["cu_seqlens_k"],
                    softmax_scale=1 / np.sqrt(d))
    o_ref, lse_ref = _masked_attention(q, k, v, keep)
    bi, row = vr["q_index"].T
    assert np.all(np.abs(r.out - o_ref[bi, row]) <= r.bound + 1e-14)
    lse_dense = lse_ref.transpose(0, 2, 1)[bi, row].T           # (h, total_q)
    fin = np.isfinite(lse_dense)
    assert np.array_equal(fin, np.isfinite(r.lse))
    assert np.all(np.abs(r.lse[fin] - lse_dense[fin]) <= 1e-12)
    assert np.all(r.out[: bq] == 0)                              # the masked block: O = 0


def test_dense_mask_shape_is_checked():
    with pytest.raises(ValueError, match="does not tile"):
        dense_mask(np.ones((2, 2), bool), (32, 32), 100, 64)
