"""The adapter's MLA / gather / descale entry points: FA4's default MLA scale, and argument
errors raised before FA4 is called (no GPU, no compile)."""
from __future__ import annotations

import math

import pytest

import torch

from fa4verify.kernels import adapter

pytestmark = pytest.mark.fa4


def _t(*shape):
    return torch.empty(*shape)


def test_mla_default_scale_is_fa4s():
    q, qv, v = _t(1, 2, 4, 64), _t(1, 2, 4, 512), _t(1, 8, 1, 512)
    assert adapter._mla_scale(q, qv, v, None) == 1.0 / math.sqrt(576) == 1 / 24
    assert adapter._mla_scale(None, qv, v, None) == 1.0 / math.sqrt(512)
    assert adapter._mla_scale(q, qv, v, 0.3) == 0.3


def test_gather_without_qv_and_bad_num_splits_are_refused_before_fa4():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q = torch.empty(1, 128, 2, 64, dtype=torch.bfloat16, device="cuda")
        idx = torch.empty(1, 128, 128, dtype=torch.int32, device="cuda")
        kw = dict(softmax_scale=None, causal=False, window_size=(None, None), softcap=0.0, learnable_sink=None,
                  pack_gqa=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                  return_lse=True, page_table=None, seqused_q=None, seqused_k=None, block_sparse_tensors=None,
                  mask_mod=None, requires_grad=False, gather_bwd_recompute_p=False, q_descale=None,
                  k_descale=None, v_descale=None)
        with pytest.raises(ValueError, match="gather_kv_indices needs qv"):
            adapter._forward_private(q, q, q, None, num_splits=1, gather_kv_indices=idx, **kw)
        with pytest.raises(ValueError, match="num_splits"):
            adapter._forward_private(q, q, q, None, num_splits=-2, gather_kv_indices=None, **kw)
        with pytest.raises(ValueError, match="needs qv"):
            adapter.mla_forward(q, q, q, None)
