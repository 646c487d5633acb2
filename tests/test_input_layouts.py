"""Note [Input layouts] on the CPU: each view :func:`fa4verify.targets.input_view` makes holds the
contiguous tensor's values with the layout's strides (3-D varlen and 4-D batched inputs); the
production target hands a problem's ``input_layout`` to Q, K, V and dO and to nothing else; the
call form refuses it where the inputs are not FA4's plain tensors; the constructed edges put the
views where FA4 computes addresses itself."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify.coverage import cases as C
from fa4verify.coverage.space import space_for
from fa4verify.kernels import facts
from fa4verify.problem import AttentionProblem, CallForm, ValueSpec

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("shape", [(2, 5, 3, 8), (7, 3, 8)])
def test_every_view_keeps_the_values_with_its_strides(shape):
    from fa4verify.targets import INPUT_LAYOUTS, input_view
    t = torch.arange(int(np.prod(shape)), dtype=torch.float32).reshape(shape)
    *lead, h, d = shape
    for layout in INPUT_LAYOUTS:
        v = input_view(t, layout)
        assert torch.equal(v, t) and v.shape == t.shape and v.stride()[-1] in (0, 1), layout
        if layout == "contiguous":
            assert v is t
        elif layout == "strided":
            assert v.stride()[-2] == 2 * d                         # rows twice as wide
        elif layout == "transposed":
            assert v.stride()[-2] == lead[-1] * d and v.stride()[-3] == d       # (.., heads, seqlen, d) storage
        elif layout == "qkv_packed":
            assert v.stride()[-3] == 3 * h * d and v.stride()[-2] == d          # a fused QKV's token stride
        elif layout == "broadcast":
            assert all(s == 0 for n, s in zip(v.shape, v.stride()) if n == 1)
    with pytest.raises(ValueError, match="layout 'nhwc'"):
        input_view(t, "nhwc")


def test_the_call_form_validates_the_input_layout():
    with pytest.raises(ValueError, match="input_layout='nhwc'"):
        CallForm(input_layout="nhwc")
    with pytest.raises(ValueError, match="paged pools take pool_layout"):
        CallForm(seqused_k=True, kv_capacity=32, page_size=16, input_layout="strided")
    assert "input_layout" not in CallForm().to_dict()
    c = CallForm(input_layout="qkv_packed")
    assert CallForm.from_dict(c.to_dict()) == c and "inputs=qkv_packed" in c.describe()


def test_the_target_lays_out_the_inputs_it_hands_fa4_and_restores_the_layout():
    """Through a stand-in adapter that records what FA4 would get: Q, K, V (and dO) in the
    problem's layout, the sink and the cu_seqlens as they are; the target's layout back to
    contiguous after the call."""
    from fa4verify.kernels import adapter
    from fa4verify.targets import ProductionTarget
    got = {}

    class Stop(Exception):
        pass

    class Recording:
        def __getattr__(self, name):
            return getattr(adapter, name)

        @staticmethod
        def forward(q, k, v, **kw):
            got.update(q=q, k=k, v=v, kw=kw)
            raise Stop

    t = ProductionTarget(adapter=Recording(), device="cpu")
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=3, seqlens_q=(5, 9, 2), seqlens_k=(5, 9, 2), seqlen_q=9,
                         seqlen_k=9, nheads=4, nheads_kv=2, head_dim=64, head_dim_v=64, causal=True, sink=True,
                         values=ValueSpec("normal", 1), call=CallForm(input_layout="qkv_packed"))
    with pytest.raises(Exception):
        t.forward(p, p.materialize())
    q, k = got["q"], got["k"]
    assert q.stride() == (3 * 4 * 64, 64, 1) and k.stride() == (3 * 2 * 64, 64, 1)
    assert got["kw"]["learnable_sink"].is_contiguous() and got["kw"]["cu_seqlens_q"].is_contiguous()
    assert t.layout == "contiguous"


def test_the_layout_edges_put_views_where_fa4_computes_addresses():
    e = {n: (p, b) for n, p, b in C.edge_problems(space_for("sm90", "bf16"))}
    names = {"layout_qkv_packed_varlen", "layout_strided_packed_cpasync", "layout_transposed_gqa",
             "layout_qkv_packed_192", "layout_broadcast_mqa"}
    assert names <= set(e) and all(e[n][1] for n in names)           # forward and backward
    p = e["layout_strided_packed_cpasync"][0]
    g = p.nheads // p.nheads_kv
    assert facts.sm90_fwd_tile(p.head_dim, p.head_dim_v, p.causal, False)[0] % g != 0    # the cp.async path
    assert e["layout_qkv_packed_varlen"][0].varlen and e["layout_qkv_packed_varlen"][0].nheads != 2
    assert {e[n][0].call.input_layout for n in names} == {"qkv_packed", "strided", "transposed", "broadcast"}
    p = e["layout_broadcast_mqa"][0]
    assert p.batch == 1 and p.nheads_kv == 1          # size-1 dims: stride 0 there
