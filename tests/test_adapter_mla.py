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


def test_plain_varlen_refuses_cu_seqlens_k_without_cu_seqlens_q_before_fa4():
    """Without seqused_k, cu_seqlens_k alone is refused before FA4 (a plain varlen call packs both
    sides); with seqused_k it is FA4's batched-Q call over K/V packed at capacity offsets, passed on
    (edge ``seqused_k_packed_q_batched``)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q = torch.empty(1, 128, 2, 64, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(1, 2, 128, dtype=torch.float32, device="cuda")
        cu = torch.empty(2, dtype=torch.int32, device="cuda")
        with pytest.raises(ValueError, match="needs both cu_seqlens_q and cu_seqlens_k"):
            adapter.backward(q, q, q, q, q, lse, cu_seqlens_k=cu)


def test_a_refusal_by_the_adapter_is_not_reported_as_fa4s():
    """Note [Blame]: the adapter's own refusal is fa4verify's (an AdapterRefusal raised in the
    adapter); a ValueError raised in a flash_attn frame is FA4's."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fa4verify import blame
    with FakeTensorMode():
        q = torch.empty(1, 128, 2, 64, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(1, 2, 128, dtype=torch.float32, device="cuda")
        cu = torch.empty(2, dtype=torch.int32, device="cuda")
        try:
            adapter.backward(q, q, q, q, q, lse, cu_seqlens_k=cu)
        except ValueError as e:
            assert isinstance(e, adapter.AdapterRefusal)
            assert blame.origin(e) == blame.FA4VERIFY and not blame.fa4_refusal(e)
        else:
            raise AssertionError("the adapter did not refuse")
    ns: dict = {}
    exec(compile("def refuse():\n    raise ValueError('FA4 says no')\n",
                 "/site-packages/flash_attn/cute/interface.py", "exec"), ns)
    try:
        ns["refuse"]()
    except ValueError as e:
        assert blame.origin(e) == blame.FA4 and blame.fa4_refusal(e)


def test_a_typeerror_of_an_operation_inside_fa4_is_a_crash_not_a_refusal(tmp_path):
    """Note [Blame]: FA4's `raise TypeError(...)` refuses a call; a TypeError an operation raises in
    FA4's own code (a subscript of an int while it traces a kernel: the fp8 PackGQA load at head dim
    16, compile-only) is FA4's crash, judged by the runs property, not "FA4 rejected the call"."""
    from fa4verify import blame
    d = tmp_path / "site-packages" / "flash_attn" / "cute"
    d.mkdir(parents=True)
    src = d / "pack_gqa.py"
    src.write_text("def load_q(layout):\n    threads = layout[0][0]\n    return threads\n\n"
                   "def check(n):\n    if n < 0:\n        raise TypeError('FA4 says no')\n")
    ns: dict = {}
    exec(compile(src.read_text(), str(src), "exec"), ns)
    try:
        ns["load_q"](5)
    except TypeError as e:
        assert blame.origin(e) == blame.FA4 and not blame.deliberate(e) and not blame.fa4_refusal(e)
    try:
        ns["check"](-1)
    except TypeError as e:
        assert blame.deliberate(e) and blame.fa4_refusal(e)


def test_a_library_raise_under_fa4s_kernel_code_is_a_crash(tmp_path):
    """Note [Blame]: the CuTe DSL raising ValueError on a layout FA4's kernel code handed it is FA4's
    crash (it traced a kernel it cannot build), not FA4 refusing the call."""
    from fa4verify import blame
    lib = tmp_path / "cutlass_like"
    lib.mkdir()
    (lib / "layout.py").write_text("def partition(shape):\n    raise ValueError('cannot partition')\n")
    d = tmp_path / "site-packages" / "flash_attn" / "cute"
    d.mkdir(parents=True)
    kern = d / "kernel.py"
    kern.write_text("def build(partition):\n    return partition((128, 80))\n")
    ns_lib: dict = {}
    exec(compile((lib / "layout.py").read_text(), str(lib / "layout.py"), "exec"), ns_lib)
    ns: dict = {}
    exec(compile(kern.read_text(), str(kern), "exec"), ns)
    try:
        ns["build"](ns_lib["partition"])
    except ValueError as e:
        assert blame.origin(e) == blame.FA4 and not blame.deliberate(e) and not blame.fa4_refusal(e)
