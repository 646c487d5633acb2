"""Note [Page pool layouts] on the CPU: the call form's ``pool_layout``, the views the production
target hands FA4 (same values, other strides), the constructed edges on both of FA4's paged paths,
and a model of the catalogued fault (``paged_cpasync_page_address_from_row_index``: a page's
address as row ``page * page_size + offset`` of the pool) showing that the edges' pools see it and
a compact pool cannot."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify.coverage import cases as C
from fa4verify.coverage.space import space_for
from fa4verify.kernels import facts
from fa4verify.problem import AttentionProblem, CallForm

POOL_EDGES = ("paged_kv_fused_16", "paged_hnd_16", "paged_kv_fused_tile", "paged_hnd_tile")


def _edges(arch="sm90"):
    return {n: (p, b) for n, p, b in C.edge_problems(space_for(arch, "bf16"))}


def test_the_pool_layout_is_validated():
    with pytest.raises(ValueError, match="pool_layout='nhd'"):
        CallForm(seqused_k=True, kv_capacity=32, page_size=16, pool_layout="nhd")
    with pytest.raises(ValueError, match="needs paged KV"):
        CallForm(seqused_k=True, kv_capacity=32, pool_layout="hnd")
    with pytest.raises(ValueError, match="head_dim == head_dim_v"):
        AttentionProblem(arch="sm90", dtype="bf16", nheads=2, nheads_kv=2,
                         batch=1, seqlens_q=(1,), seqlens_k=(20,), seqlen_q=1, seqlen_k=20, head_dim=128,
                         head_dim_v=64, call=CallForm(seqused_k=True, kv_capacity=32, page_size=16,
                                                      pool_layout="kv_fused"))
    # the default is not written: every problem's JSON before the field is unchanged
    assert "pool_layout" not in CallForm(seqused_k=True, kv_capacity=32, page_size=16).to_dict()
    c = CallForm(seqused_k=True, kv_capacity=32, page_size=16, pool_layout="hnd")
    assert CallForm.from_dict(c.to_dict()) == c and "hnd pool" in c.describe()


def test_every_pool_edge_runs_its_paged_path_with_permuted_pages():
    """cp.async (16-key pages, not the forward's tile_n) and TMA (a page of one KV tile), each pool
    layout, forward only, pages permuted with spares, 2 KV heads."""
    e = _edges()
    assert set(POOL_EDGES) <= set(e)
    for n in POOL_EDGES:
        p, bwd = e[n]
        c = p.call
        tn = facts.fwd_tile("sm90", "bf16", p.head_dim, p.head_dim_v, False, False)[1]
        assert not bwd and c.page_seed is not None and c.spare_pages >= 1 and p.nheads_kv == 2
        assert c.pool_layout == ("kv_fused" if "kv_fused" in n else "hnd")
        assert (c.page_size == tn) == n.endswith("_tile") and (c.page_size == 16) == n.endswith("_16")
        assert max(p.seqlens_k) > 2 * c.page_size                 # keys on several pages


def test_a_deployment_space_without_free_heads_gets_no_pool_edges():
    sp = space_for("sm90", "bf16")
    import dataclasses
    narrowed = dataclasses.replace(sp, heads={"h:8/2": (8, 2)})
    assert not C._pool_layout_edges(narrowed)


@pytest.fixture()
def target():
    pytest.importorskip("torch")
    from fa4verify.kernels import adapter
    from fa4verify.targets import ProductionTarget
    return ProductionTarget(adapter=adapter, device="cpu")      # a stand-in: no CUDA check, CPU tensors


def test_the_target_hands_fa4_the_same_pages_with_the_layouts_strides(target):
    """The views FA4 gets hold the compact pools' values: the halves of one (pages, 2, page, hk,
    d) cache (a page stride of two pages), or (pages, page, hk, d) views of (pages, hk, page, d)
    storage (row stride d, head stride page x d)."""
    e = _edges()
    for n in ("paged_kv_fused_16", "paged_hnd_16"):
        p = e[n][0]
        a = p.materialize()
        _q, k, v, _do, kw = target._call_kw(p, a)
        plain = target._call_kw(p.replace(call=__import__("dataclasses").replace(p.call, pool_layout="separate")), a)
        P, page, hk, d = k.shape
        assert np.array_equal(k.float().numpy(), plain[1].float().numpy())
        assert np.array_equal(v.float().numpy(), plain[2].float().numpy())
        assert not k.is_contiguous() and k.stride()[-1] == 1
        if n.startswith("paged_kv_fused"):
            assert k.stride() == (2 * page * hk * d, hk * d, d, 1)
            assert v.data_ptr() - k.data_ptr() == page * hk * d * k.element_size()     # one cache
        else:
            assert k.stride() == (hk * page * d, d, page * d, 1)
        assert np.array_equal(kw["page_table"].numpy(), plain[4]["page_table"].numpy())


def _faulty_gather(x, table, seqlen: int) -> np.ndarray:
    """The keys of one sequence as the fault reads them: page ``p``'s row ``o`` at storage row
    ``p * page_size + o`` past the pool's start (row stride and head stride as they are)."""
    P, page, hk, d = x.shape
    import torch
    buf = torch.empty(0, dtype=x.dtype).set_(x.untyped_storage()).float().numpy()     # the storage
    s_row, s_head = x.stride()[1], x.stride()[2]
    off = x.storage_offset()
    out = np.empty((seqlen, hk, d))
    for j in range(seqlen):
        p, o = int(table[j // page]), j % page
        for h in range(hk):
            i0 = off + (o + p * page) * s_row + h * s_head
            out[j, h] = buf[i0:i0 + d]
    return out


def _right_gather(x, table, seqlen: int) -> np.ndarray:
    xs = x.float().numpy()
    page = x.shape[1]
    return np.stack([xs[int(table[j // page]), j % page] for j in range(seqlen)])


def test_the_fault_reads_other_pages_of_the_edges_pools_and_the_same_of_a_compact_one(target):
    """Model of ``paged_cpasync_page_address_from_row_index``: on a compact pool the faulty address
    is the right one for every key (why no earlier paged call could see it); on the edges' fused and
    HND pools the keys of every page but one come from elsewhere, and the decode row's output
    moves by O(1) -- far outside any budget."""
    e = _edges()
    for n, expect_same in (("paged_kv_fused_16", False), ("paged_hnd_16", False)):
        p = e[n][0]
        a = p.materialize()
        _q, k, v, _do, kw = target._call_kw(p, a)
        table = kw["page_table"].numpy()[0]
        L = p.seqlens_k[0]
        for x in (k, v):
            wrong, right = _faulty_gather(x, table, L), _right_gather(x, table, L)
            assert (not np.array_equal(wrong, right)) is not expect_same, n
        # the decode row (sequence 0's one query, head 0) under the fault
        q = _q.float().numpy()[0, 0]
        kr, vr = _right_gather(k, table, L)[:, 0], _right_gather(v, table, L)[:, 0]
        kw_, vw = _faulty_gather(k, table, L)[:, 0], _faulty_gather(v, table, L)[:, 0]

        def attend(kk, vv):
            s = kk @ q * (p.softmax_scale or 1 / np.sqrt(p.head_dim))
            w = np.exp(s - s.max())
            return (w / w.sum()) @ vv
        assert np.abs(attend(kw_, vw) - attend(kr, vr)).max() > 0.1, n
    # a compact pool: the faulty address is the right one
    p = e["paged_kv_fused_16"][0]
    import dataclasses
    plain = p.replace(call=dataclasses.replace(p.call, pool_layout="separate"))
    a = plain.materialize()
    _q, k, v, _do, kw = target._call_kw(plain, a)
    table = kw["page_table"].numpy()[0]
    for x in (k, v):
        assert np.array_equal(_faulty_gather(x, table, plain.seqlens_k[0]), _right_gather(x, table, plain.seqlens_k[0]))
