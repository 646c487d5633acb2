"""FA4 finding ``seqused_q_many_bwd`` (compile-only; the refusal is FA4's Python interface, the same on
any GPU): the backward of a ``seqused_q`` call (K/V batched whole) with more sequences than FA4's
batch-search threshold asserts in ``_compute_tile_cumsum`` -- ``_flash_attn_bwd`` builds the K side's
batch lookup from ``cu_seqlens_k`` / ``seqused_k``, both None there -- while the same call with as
many sequences as the threshold builds. The coverage plan reads the fact from the installed source
(``facts.bwd_refuses_many_seqused_q``) and runs such a row forward only, naming why."""
from __future__ import annotations

import pytest

from fa4verify.kernels import facts

_GUARDED = """
    if is_varlen and batch_size > BIN_BATCH_SEARCH_THRESH:
        if cu_seqlens_k is not None or seqused_k is not None:
            cu_total_m_blocks_k, _ = _compute_tile_cumsum(
                cu_seqlens=cu_seqlens_k,
"""
_UNGUARDED = """
    if is_varlen and batch_size > BIN_BATCH_SEARCH_THRESH and not use_dedicated_hd256_kernel:
        cu_total_m_blocks_q, _ = _compute_tile_cumsum(
            cu_seqlens=cu_seqlens_q,
        )
        cu_total_m_blocks_k, _ = _compute_tile_cumsum(
            cu_seqlens=cu_seqlens_k,
"""


def test_the_source_reading_tells_a_guarded_k_lookup_from_an_unguarded_one():
    assert facts.bwd_k_lookup_unguarded(_UNGUARDED) is True
    assert facts.bwd_k_lookup_unguarded(_GUARDED) is False
    assert facts.bwd_k_lookup_unguarded("def _flash_attn_bwd():\n    pass\n") is False


@pytest.mark.fa4
def test_fa4_refuses_the_backward_past_the_threshold_and_the_plan_runs_it_forward_only():
    from fa4verify.compile.production import CompileCase, run_cases
    from fa4verify.coverage.planner import plan
    from fa4verify.coverage.space import space_for
    from fa4verify.problem import AttentionProblem, CallForm
    n0 = facts.varlen_batch_search_threshold()
    assert n0 == 256 and facts.bwd_refuses_many_seqused_q()           # 4.0.0b36, read from its source

    def case(n):
        sqs = tuple(1 + (i * 5) % 9 for i in range(n))
        p = AttentionProblem(arch="sm90", dtype="bf16", batch=n, seqlen_q=max(sqs), seqlen_k=13, nheads=2,
                             nheads_kv=2, head_dim=64, head_dim_v=64, seqlens_q=sqs, seqlens_k=(13,) * n,
                             call=CallForm(seqused_q=True, q_capacity=max(sqs) + 5))
        return CompileCase("backward", problem_json=p.to_json())
    res = run_cases("sm_90a", [case(n0), case(n0 + 1)], timeout=900)
    at, past = res["results"]
    assert at["ok"], at["error"]
    assert not past["ok"] and "_compute_tile_cumsum requires num_m_blocks, cu_seqlens, or seqused" in past["error"]
    assert past["forward_config"] is not None           # the forward of the same call builds
    sp = space_for("sm90", "bf16")
    row = next(r for r in plan(sp, seed=0).rows if r["form"] == "seqused_q" and r["seqlen"] == "many")
    assert sp.passes(row) == ("fwd",) and "seqused_q_many_bwd" in sp.no_backward(row)
