"""Note [Partial blocks] (fa4verify.problem.calls): block sparsity with mask blocks, inside which
the problem's mask pair decides. The keep-mask is FA4's FlexAttention formula, computed here
element by element from the block lists; the oracle, the production target's call, FA4's block
lists and the coverage plan all follow it, and the old call forms' blocks do not move."""
from __future__ import annotations

import json
import types

import numpy as np
import pytest

from fa4verify.problem import AttentionProblem, CallForm, ValueSpec


def _problem(pair="causal", *, sq=230, sk=230, block=(64, 64), seed=5, partial=0.5, nh=2, nk=2, sink=False):
    return AttentionProblem(arch="sm90", dtype="bf16", batch=2, seqlen_q=sq, seqlen_k=sk, nheads=nh, nheads_kv=nk,
                            head_dim=64, head_dim_v=64, values=ValueSpec("normal", 11), mods=(pair,), sink=sink,
                            call=CallForm(block_size=block, block_seed=seed, block_keep=0.75, block_partial=partial))


def _formula(problem, inner: np.ndarray) -> np.ndarray:
    """key j visible to query i iff full[i//bq, j//bk] or (mask[i//bq, j//bk] and inner[i, j])."""
    c = problem.call
    listed, part = c.block_mask(problem.seqlen_q, problem.seqlen_k), c.partial_blocks(problem.seqlen_q, problem.seqlen_k)
    bq, bk = c.block_size
    out = np.zeros((problem.seqlen_q, problem.seqlen_k), bool)
    for i in range(problem.seqlen_q):
        for j in range(problem.seqlen_k):
            r, col = i // bq, j // bk
            out[i, j] = (listed[r, col] and not part[r, col]) or (part[r, col] and inner[i, j])
    return out


def test_old_call_forms_keep_their_blocks_and_json():
    old = CallForm(block_size=(64, 64), block_seed=9, block_keep=0.6)
    new = CallForm(block_size=(64, 64), block_seed=9, block_keep=0.6, block_partial=0.4)
    assert np.array_equal(old.block_mask(300, 200), new.block_mask(300, 200))   # the partial draw comes after
    assert not old.partial_blocks(300, 200).any()
    part = new.partial_blocks(300, 200)
    assert part.any() and not (part & ~new.block_mask(300, 200)).any()
    assert "block_partial" not in old.to_dict()
    assert CallForm.from_dict(json.loads(json.dumps(new.to_dict()))) == new


@pytest.mark.parametrize("pair", ["causal", "sliding_window", "document", "checkerboard"])
def test_the_keep_mask_is_flexattentions_formula(pair):
    p = _problem(pair)
    inner = _problem(pair, partial=0.0).replace(call=None).keep_masks()
    keeps = p.keep_masks()
    assert len(keeps) == p.batch
    for b in range(p.batch):
        assert np.array_equal(keeps[b], _formula(p, inner[b]))
    # the mask pair matters inside mask blocks and nowhere else: the plan's draws are not trivial
    listed = p.call.block_mask(p.seqlen_q, p.seqlen_k)
    only_blocks = CallForm(block_size=p.call.block_size, block_seed=p.call.block_seed, block_keep=0.75)
    assert np.array_equal(only_blocks.block_mask(p.seqlen_q, p.seqlen_k), listed)


def test_validation():
    with pytest.raises(ValueError, match="block_partial needs block sparsity"):
        CallForm(block_partial=0.5)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        CallForm(block_size=(64, 64), block_partial=1.5)
    with pytest.raises(ValueError, match="needs a mask pair"):
        AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=70, seqlen_k=70, nheads=2, nheads_kv=2,
                         head_dim=64, head_dim_v=64, call=CallForm(block_size=(64, 64), block_partial=0.5))
    with pytest.raises(ValueError, match="mods combine with block sparsity only"):
        AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=70, seqlen_k=70, nheads=2, nheads_kv=2,
                         head_dim=64, head_dim_v=64, mods=("causal",), call=CallForm(mask_mod_fn="checkerboard_128"))
    # pack_gqa alone rides along with a pair (it moves no array)
    assert AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=70, seqlen_k=70, nheads=4, nheads_kv=2,
                            head_dim=64, head_dim_v=64, mods=("causal",), call=CallForm(pack_gqa=False)).call.pack_gqa is False
    with pytest.raises(ValueError, match="needs the mask pair"):
        CallForm(block_size=(64, 64), block_seed=5, block_keep=0.75, block_partial=0.5).keep_mask(200, 260)


def test_the_oracle_is_softmax_under_the_formula():
    """The oracle's O against float64 softmax over the formula's keys, computed here directly."""
    from fa4verify.judge.attention import oracle_forward
    p = _problem("sliding_window", sq=150, sk=170, block=(64, 64), sink=False)
    a = p.materialize()
    f = oracle_forward(p, a)
    inner = p.replace(call=None).keep_masks(a)
    q, k, v = (np.asarray(a[n], np.float64) for n in ("q", "k", "v"))
    for b in range(p.batch):
        keep = _formula(p, inner[b])
        for h in range(p.nheads):
            s = (q[b, :, h] @ k[b, :, h].T) * p.scale
            s = np.where(keep, s, -np.inf)
            m = np.max(s, axis=1, keepdims=True)
            e = np.where(keep, np.exp(s - np.where(np.isfinite(m), m, 0.0)), 0.0)
            z = e.sum(axis=1, keepdims=True)
            o = np.divide(e @ v[b, :, h], z, out=np.zeros((p.seqlen_q, p.head_dim_v)), where=z > 0)
            assert np.allclose(f.out[b, :, h], o, rtol=1e-12, atol=1e-12)


def test_the_production_target_lists_mask_blocks_and_hands_fa4_the_mask_pair():
    seen = []

    def bst(block_mask, *, batch, nheads, block_size, direction, device, deterministic, partial=None):
        seen.append((direction, None if partial is None else np.asarray(partial).copy()))
        return "tensors"
    from fa4verify.targets import ProductionTarget
    stand_in = types.SimpleNamespace(block_sparse_tensors=bst, sm90_bwd_sparse_block_size=lambda d, dv: (64, 64))
    t = ProductionTarget(adapter=stand_in, device="cpu")
    p = _problem("causal")
    a = p.materialize()
    _q, _k, _v, _do, kw = t._call_kw(p, a)
    assert kw["block_sparse_tensors"] == "tensors" and kw.get("mask_mod") is not None
    _q, _k, _v, _do, kwb = t._call_kw(p, a, backward=True)
    assert kwb.get("mask_mod") is not None
    want = p.call.partial_blocks(p.seqlen_q, p.seqlen_k)
    assert [d for d, _ in seen] == ["fwd", "bwd"] and all(np.array_equal(x, want) for _, x in seen)


@pytest.mark.fa4
def test_fa4_block_lists_hold_full_and_mask_blocks_in_both_directions():
    from fa4verify.kernels.adapter import block_sparse_tensors
    listed = np.array([[1, 1, 0, 1], [0, 1, 1, 0], [1, 0, 0, 0]], bool)
    part = np.array([[1, 0, 0, 1], [0, 0, 1, 0], [0, 0, 0, 0]], bool)
    for direction, lm, pm in (("fwd", listed, part), ("bwd", listed.T, part.T)):
        t = block_sparse_tensors(listed, batch=2, nheads=1, block_size=(64, 64), direction=direction,
                                 device="cpu", partial=part)
        mc, mi, fc, fi = (x.numpy()[1, 0] for x in (t.mask_block_cnt, t.mask_block_idx, t.full_block_cnt,
                                                     t.full_block_idx))
        for r in range(lm.shape[0]):
            assert list(mi[r, : mc[r]]) == list(np.flatnonzero(pm[r]))
            assert list(fi[r, : fc[r]]) == list(np.flatnonzero(lm[r] & ~pm[r]))
    with pytest.raises(ValueError, match="inside the block mask"):
        block_sparse_tensors(listed, batch=1, nheads=1, block_size=(64, 64), device="cpu", partial=~listed)


def test_the_plan_runs_both_block_lists_by_construction():
    """Every block_sparse_mod row of the production plan lists a mask block, a full block where
    its grid has two blocks, and a Q block with two mask blocks where there is room; every mask
    pair of fa4verify.mods runs inside mask blocks on some row."""
    from fa4verify.checks.coverage import build
    from fa4verify.targets import ProductionTarget
    sp, pl, problems = build(types.SimpleNamespace(deploy=None, seed=0), arch="sm90", dtype="bf16",
                             features=ProductionTarget(fake=True).features())
    rows = [(r, p) for r, p in zip(pl.rows, problems) if r["form"] == "block_sparse_mod"]
    assert rows and "block_sparse_mod" in sp.values["form"]
    for r, p in rows:
        c = p.call
        listed, part = c.block_mask(p.seqlen_q, p.seqlen_k), c.partial_blocks(p.seqlen_q, p.seqlen_k)
        nq, nk = listed.shape
        assert part.any(), r
        if nq * nk >= 2:
            assert (listed & ~part).any(), r
        if nk >= 3 or (nk == 2 and nq >= 2):
            assert part.sum(axis=1).max() >= 2, r
        assert p.mods and p.mod_pairs()[1] is not None
    assert {f"mod:{p.mods[0]}" for _r, p in rows} == set(sp.block_mask_pairs)
    # the twin runs no mod pairs: its space has no block_sparse_mod form
    twin = build(types.SimpleNamespace(deploy=None, seed=0), arch="sm90", dtype="bf16",
                 features=("causal", "local", "block_sparse", "mask_mod_fn"))[0]
    assert "block_sparse_mod" not in twin.values["form"]


@pytest.mark.fa4
@pytest.mark.slow
def test_sm90_partial_block_rows_compile_forward_and_backward_compile_only():
    """The plan's block_sparse_mod call (mask blocks, a mask_mod with aux tensors) compiles on
    SM90, forward and backward, and FA4's compile key says block sparsity with a mask_mod."""
    from fa4verify.compile.production import CompileCase, run_cases
    p = _problem("document", sq=260, sk=260, block=(128, 128))
    res = run_cases("sm_90a", [CompileCase("forward", problem_json=p.to_json()),
                               CompileCase("backward", problem_json=p.to_json())])
    for r in res["results"]:
        assert r["ok"], r["error"]
        key = r["forward_config"]["compile_key"]
        assert key["use_block_sparsity"] and key["mask_mod_hash"]
