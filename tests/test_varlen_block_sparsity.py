"""FA4's varlen block sparsity (forward only): a packed (cu_seqlens) call whose sequences each have
their own block grid (``cu_total_m_blocks``, ``cu_block_idx_offsets``). The oracle, FA4's block
lists, the production target's call and the coverage plan's ``block_sparse_varlen`` rows follow
one rule: key j of sequence b is visible to its query i iff ``block_mask(b)[i // bq, j // bk]``."""
from __future__ import annotations

import types

import numpy as np
import pytest

from fa4verify.problem import AttentionProblem, CallForm, ValueSpec


def _problem(seqlens_q=(150, 0, 40, 97), seqlens_k=(130, 20, 0, 260), block=(64, 64), seed=7, nh=4, nk=2,
             sink=True, softcap=0.0):
    return AttentionProblem(arch="sm90", dtype="bf16", batch=len(seqlens_q), seqlens_q=seqlens_q,
                            seqlens_k=seqlens_k, seqlen_q=max(seqlens_q), seqlen_k=max(seqlens_k), nheads=nh,
                            nheads_kv=nk, head_dim=64, head_dim_v=64, sink=sink, softcap=softcap,
                            values=ValueSpec("normal", 3),
                            call=CallForm(block_size=block, block_seed=seed, block_keep=0.6))


def test_each_sequence_draws_its_own_grid_and_dense_draws_do_not_move():
    c = CallForm(block_size=(64, 64), block_seed=7, block_keep=0.6)
    grids = [c.block_mask(300, 300, seq=s) for s in range(4)]
    assert len({g.tobytes() for g in grids}) == 4
    # a dense call form draws from the seed alone, as before sequences had grids of their own
    want = np.random.default_rng(7).random((5, 5)) < 0.6
    assert np.array_equal(c.block_mask(300, 300), want)


def test_the_keep_masks_are_the_sequences_grids():
    p = _problem()
    keeps = p.keep_masks()
    for s, (lq, lk) in enumerate(zip(p.seqlens_q, p.seqlens_k)):
        g = p.call.block_mask(lq, lk, seq=s)
        want = np.array([[g[i // 64, j // 64] for j in range(lk)] for i in range(lq)], bool).reshape(lq, lk)
        assert np.array_equal(keeps[s], want)


@pytest.mark.parametrize("softcap", [0.0, 20.0])
def test_the_oracle_is_per_sequence_softmax_over_kept_blocks(softcap):
    """O and LSE of the oracle against float64 softmax per sequence and head over the keys the
    sequence's grid keeps (the learnable sink in the normaliser), written out here."""
    from fa4verify.judge.attention import oracle_forward
    p = _problem(softcap=softcap)
    a = p.materialize()
    f = oracle_forward(p, a)
    q, k, v = (np.asarray(a[n], np.float64) for n in ("q", "k", "v"))
    sink = np.asarray(a["learnable_sink"], np.float64)
    cq = np.concatenate([[0], np.cumsum(p.seqlens_q)])
    ck = np.concatenate([[0], np.cumsum(p.seqlens_k)])
    g = p.nheads // p.nheads_kv
    assert f.out.shape == (cq[-1], p.nheads, p.head_dim_v) and f.lse.shape == (p.nheads, cq[-1])
    for s in range(p.batch):
        lq, lk = p.seqlens_q[s], p.seqlens_k[s]
        grid = p.call.block_mask(lq, lk, seq=s)
        keep = np.kron(grid, np.ones((64, 64), bool))[:lq, :lk]
        for h in range(p.nheads):
            sc = q[cq[s]:cq[s + 1], h] @ k[ck[s]:ck[s + 1], h // g].T * p.scale
            if softcap:
                sc = softcap * np.tanh(sc / softcap)
            sc = np.where(keep, sc, -np.inf)
            m = np.maximum(sc.max(axis=1, initial=-np.inf), sink[h])
            e = np.where(keep, np.exp(sc - m[:, None]), 0.0)
            z = e.sum(axis=1) + np.exp(sink[h] - m)
            o = (e @ v[ck[s]:ck[s + 1], h // g]) / z[:, None]
            assert np.allclose(f.out[cq[s]:cq[s + 1], h], o, rtol=1e-12, atol=1e-13)
            assert np.allclose(f.lse[h, cq[s]:cq[s + 1]], m + np.log(z), rtol=1e-12, atol=1e-12)


def test_the_production_target_passes_sequence_grids_and_cu_seqlens_forward_only():
    seen = {}

    def bstv(block_masks, *, nheads, block_size, device, partial=None):
        seen.update(masks=[np.asarray(m).copy() for m in block_masks], nheads=nheads, block=block_size,
                    partial=partial)
        return "tensors"
    from fa4verify.targets import ProductionTarget, Unsupported
    t = ProductionTarget(adapter=types.SimpleNamespace(block_sparse_tensors_varlen=bstv), device="cpu")
    p = _problem()
    a = p.materialize()
    _q, _k, _v, _do, kw = t._call_kw(p, a)
    assert kw["block_sparse_tensors"] == "tensors" and kw["max_seqlen_q"] == p.seqlen_q
    assert kw["cu_seqlens_q"] is not None and kw["cu_seqlens_k"] is not None
    assert seen["nheads"] == 1 and seen["block"] == (64, 64)     # GQA: broadcast over heads
    for s, m in enumerate(seen["masks"]):
        assert np.array_equal(m, p.call.block_mask(p.seqlens_q[s], p.seqlens_k[s], seq=s))
    assert seen["partial"] is None          # full blocks only: no mask lists
    assert "varlen backward with block sparsity" in t.backward_unsupported(p)
    with pytest.raises(Unsupported):
        t._call_kw(p, a, backward=True)


@pytest.mark.fa4
def test_fa4s_varlen_block_lists_follow_its_offsets():
    """The lists read back through FA4's own offset rule (seqlen_info.py: the Q block m of
    sequence b lists from cu_block_idx_offsets[b] + m * n_kv_blocks_b; its count at
    cu_total_m_blocks[b] + m) are each sequence's grid."""
    from fa4verify.kernels.adapter import block_sparse_tensors_varlen
    grids = [np.array([[1, 0, 1], [0, 1, 1]], bool), np.zeros((0, 2), bool), np.array([[0], [1], [1]], bool),
             np.array([[1, 1]], bool)]
    t = block_sparse_tensors_varlen(grids, nheads=2, block_size=(64, 64), device="cpu")
    cu_m, cu_i = t.cu_total_m_blocks.numpy(), t.cu_block_idx_offsets.numpy()
    assert list(cu_m) == [0, 2, 2, 5, 6] and list(cu_i) == [0, 6, 6, 9, 11]
    assert t.mask_block_cnt.shape == (2, 6) and not t.mask_block_cnt.numpy().any()
    fc, fi = t.full_block_cnt.numpy()[1], t.full_block_idx.numpy()[1]
    for b, g in enumerate(grids):
        nq, nk = g.shape
        for m in range(nq):
            start = cu_i[b] + m * nk
            got = fi[start:start + fc[cu_m[b] + m]]
            assert list(got) == list(np.flatnonzero(g[m]))


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_the_plan_has_forward_only_varlen_block_sparse_rows_with_empty_and_many_sequences(arch):
    from fa4verify.checks.coverage import build
    from fa4verify.targets import ProductionTarget
    sp, pl, problems = build(types.SimpleNamespace(deploy=None, seed=0), arch=arch, dtype="bf16",
                             features=ProductionTarget(fake=True).features())
    rows = [(r, p) for r, p in zip(pl.rows, problems) if r["form"] == "block_sparse_varlen"]
    assert rows and {r["seqlen"] for r, _p in rows} >= {"zero", "many"}
    for r, p in rows:
        assert p.varlen and p.call.block_size is not None and not p.call.batched_layout
        assert sp.passes(r) == ("fwd",), r
        assert any(p.call.block_mask(lq, lk, seq=s).any()
                   for s, (lq, lk) in enumerate(zip(p.seqlens_q, p.seqlens_k)))


@pytest.mark.fa4
@pytest.mark.slow
@pytest.mark.parametrize("arch, target", [("sm90", "sm_90a"), ("sm100", "sm_100a")])
def test_the_plans_varlen_block_sparse_rows_compile_compile_only(arch, target):
    """Every block_sparse_varlen row of the plan passes FA4's own validation (the Q block equals
    q_stage * tile_m: FA4 raises otherwise) and compiles, forward."""
    from fa4verify.checks.coverage import build
    from fa4verify.compile.production import CompileCase, run_cases
    from fa4verify.targets import ProductionTarget
    _sp, pl, problems = build(types.SimpleNamespace(deploy=None, seed=0), arch=arch, dtype="bf16",
                              features=ProductionTarget(fake=True).features())
    cases = [CompileCase("forward", problem_json=p.to_json())
             for r, p in zip(pl.rows, problems) if r["form"] == "block_sparse_varlen"]
    res = run_cases(target, cases)
    for r in res["results"]:
        assert r["ok"], r["error"]
        key = r["forward_config"]["compile_key"]
        assert key["use_block_sparsity"]
        assert key["block_sparse_tensors is None or block_sparse_tensors.cu_total_m_blocks is None"] is False
