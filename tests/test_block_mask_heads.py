"""Note [Block masks broadcast over heads] (fa4verify.targets.block_mask_heads): a GQA call's block
mask goes to FA4 with head extent 1 (FA4 packs GQA only then), an MHA call's or a pack_gqa=False
call's per head; the production target builds what the rule says, in both directions."""
from __future__ import annotations

import types

import numpy as np
import pytest

from fa4verify.problem import AttentionProblem, CallForm, ValueSpec
from fa4verify.targets import ProductionTarget, block_mask_heads


def _problem(nh, nk, pack=None):
    return AttentionProblem(arch="sm100", dtype="bf16", batch=2, seqlen_q=130, seqlen_k=200, nheads=nh,
                            nheads_kv=nk, head_dim=64, head_dim_v=64, values=ValueSpec("normal", 0),
                            call=CallForm(block_size=(128, 128), block_seed=3, block_keep=0.6, pack_gqa=pack))


@pytest.mark.parametrize("nh, nk, pack, want", [(4, 2, None, 1), (3, 1, None, 1), (4, 2, True, 1),
                                                (4, 2, False, 4), (2, 2, None, 2), (2, 2, False, 2)])
def test_the_rule(nh, nk, pack, want):
    assert block_mask_heads(_problem(nh, nk, pack)) == want


@pytest.mark.parametrize("nh, nk, pack, want", [(4, 2, None, 1), (4, 2, False, 4), (2, 2, None, 2)])
def test_the_production_target_passes_that_head_extent_forward_and_backward(nh, nk, pack, want):
    seen = []

    def bst(block_mask, *, batch, nheads, block_size, direction, device, deterministic, partial=None):
        seen.append((direction, nheads))
        return "tensors"
    stand_in = types.SimpleNamespace(block_sparse_tensors=bst, sm90_bwd_sparse_block_size=lambda d, dv: (128, 128))
    t = ProductionTarget(adapter=stand_in, device="cpu")
    p = _problem(nh, nk, pack)
    a = {k: np.zeros(1, np.float32) for k in ("q", "k", "v", "dout")}
    a["learnable_sink"] = None
    t._call_kw(p, a)
    t._call_kw(p, a, backward=True)
    assert seen == [("fwd", want), ("bwd", want)]


@pytest.mark.fa4
@pytest.mark.slow
def test_sm100_block_masks_pass_fa4s_q_stage_rule_compile_only():
    """SM100 (compile-only, FA4's own validation): the plan's Q block (sparse_block_size) is
    accepted where FA4 runs two Q stages (MHA at seqlen_q 300; packed GQA 4/2 at 100, whose
    broadcast mask packs the heads), and a 128-row block is refused there: the rule is FA4's."""
    import json

    from fa4verify.compile.production import CompileCase, run_cases
    from fa4verify.coverage.cases import sparse_block_size
    bq, bk = sparse_block_size("sm100", 128, 128)
    cases = []
    for block in ((bq, bk), (128, 128)):
        for nh, nk, sq in ((2, 2, 300), (4, 2, 100)):
            p = AttentionProblem(arch="sm100", dtype="bf16", batch=2, seqlen_q=sq, seqlen_k=280, nheads=nh,
                                 nheads_kv=nk, head_dim=128, head_dim_v=128, values=ValueSpec("normal", 0),
                                 call=CallForm(block_size=block, block_seed=1, block_keep=0.6))
            cases.append(CompileCase(op="forward", problem_json=json.dumps(p.to_dict())))
    res = run_cases("sm_100a", cases, timeout=1200)["results"]
    assert [r["ok"] for r in res[:2]] == [True, True], res[:2]
    assert not any(r["ok"] for r in res[2:]) and all("multiple of 256" in str(r["error"]) for r in res[2:]), res[2:]
