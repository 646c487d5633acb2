"""Note [Block lists without a size] (fa4verify/problem/calls.py): the call form that hands FA4 its
block lists with ``block_size=None`` (red-team round 15 #3: FA4's inference of the Q block and its
SM90 backward's default of 128 rows were lines no audit call ran), and the edge that carries it."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify.coverage import cases as C
from fa4verify.coverage.space import space_for
from fa4verify.problem import AttentionProblem, CallForm


def _p(**kw):
    base = dict(arch="sm90", dtype="bf16", batch=2, seqlen_q=128, seqlen_k=391, nheads=2, nheads_kv=2, head_dim=128,
                head_dim_v=128, call=CallForm(block_size=(128, 128), block_seed=3, block_size_implicit=True))
    base.update(kw)
    return AttentionProblem(**base)


def test_the_form_holds_only_where_fa4_takes_the_problems_block():
    p = _p()
    assert "size not passed" in p.call.describe()
    assert AttentionProblem.from_json(p.to_json()) == p
    # more than one Q block: FA4's forward cannot infer the size ("require explicit sparse_block_size[0]")
    with pytest.raises(ValueError, match="block_size_implicit"):
        _p(seqlen_q=261)
    # hd 64: the forward tile fa4verify reads (facts.fwd_tile, without the inferred block) is 192 rows;
    # FA4 would fit 128 x 128 to the inferred block there, but the form is kept to where both agree
    with pytest.raises(ValueError, match="block_size_implicit"):
        _p(head_dim=64, head_dim_v=64)
    with pytest.raises(ValueError, match="dense SM90"):
        _p(arch="sm100")
    with pytest.raises(ValueError, match="needs block sparsity"):
        CallForm(block_size_implicit=True)
    # the JSON of a call form without it is unchanged (the field is written only where set)
    assert "block_size_implicit" not in CallForm(block_size=(128, 128)).to_dict()


def test_the_edge_is_planned_after_every_other_and_lists_a_dropped_block():
    got = {n: (p, b) for n, p, b in C.edge_problems(space_for("sm90", "bf16"))}
    # FA4's SM90 refuses a deterministic block-sparse backward ("Deterministic not implemented for
    # block-sparse backward": this edge's first run on the H200, 2026-12-06, was refused so): every
    # block-sparse edge with a backward runs it without deterministic
    assert all(n in C.NONDETERMINISTIC_EDGES for n, (q, b) in got.items()
               if b and q.call is not None and q.call.block_size is not None)
    p, bwd = got["block_size_implicit"]
    assert bwd and p.call.block_size_implicit and p.seqlen_q == 128
    m = p.call.block_mask(p.seqlen_q, p.seqlen_k)
    assert m.shape == (1, 4) and m.any() and not m.all() and m[0, -1]      # a dropped block, the tail kept
    assert "block_size_implicit" not in {n for n, _p, _b in C.edge_problems(space_for("sm100", "bf16"))}


@pytest.mark.fa4
def test_fa4_gets_the_lists_without_a_size():
    from fa4verify.kernels import adapter
    m = np.array([[True, True, False, True]])
    got = adapter.block_sparse_tensors(m, batch=2, nheads=2, block_size=(128, 128), device="cpu", pass_size=False)
    assert got.block_size is None
    assert adapter.block_sparse_tensors(m, batch=2, nheads=2, block_size=(128, 128), device="cpu").block_size == (128, 128)
