"""Note [A statistical verdict per kernel variant]: the plan's selection (one call per kernel
variant, the cheapest the twin runs) and the ``stat_tier`` property on a CPU stand-in for
production (the twin under another accumulation order and MUFU seed, named apart from the twin):
quiet on a correct kernel, failing a dK scaled by 1 + 2^-7 (round 13's variant-confined fault,
1-2 bf16 ulp, inside every per-element bound)."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify.fuzz import Violation
from fa4verify.fuzz.properties import check_problem
from fa4verify.problem import AttentionProblem, CallForm, ValueSpec
from fa4verify.targets import TwinTarget

PROPS = ("runs", "fwd_budget", "bwd_budget", "stat_tier")


class StandIn(TwinTarget):
    """The twin as a target other than the tier's prediction: sequential accumulation, perturbed
    MUFU; ``dk_scale`` plants the fault in dK (rounded back to bf16 as FA4 stores it)."""
    name = "standin"

    def __init__(self, dk_scale: float = 1.0):
        super().__init__(accumulation="sequential", mufu="perturbed", seed=1)
        self.dk_scale = dk_scale

    def backward(self, problem, a, fwd, *, deterministic=True):
        import torch
        g = super().backward(problem, a, fwd, deterministic=deterministic)
        if self.dk_scale != 1.0:
            dk = torch.from_numpy(np.asarray(g.dk, np.float32) * np.float32(self.dk_scale))
            g.dk = dk.bfloat16().float().numpy()
        return g


def _problem(**kw):
    base = dict(arch="sm90", dtype="bf16", batch=1, seqlen_q=192, seqlen_k=200, nheads=2, nheads_kv=2, head_dim=64,
                head_dim_v=64, causal=True, values=ValueSpec("normal", 3))
    base.update(kw)
    return AttentionProblem(**base)


def test_the_tier_is_quiet_on_a_correct_kernel():
    out = check_problem(_problem(), StandIn(), properties=PROPS)
    assert "stat_tier" in out.ran, out.skipped
    assert not any(k.startswith("stat_tier") for k in out.undecided), out.undecided
    assert all(out.metrics[f"stat_bias_{n}"] <= 1.0 for n in ("out", "dq", "dk", "dv")), out.metrics


@pytest.mark.parametrize("kw", [dict(), dict(nheads=4, nheads_kv=2, causal=False),
                                # block lists under a window (Note [Block lists with causal or a
                                # window]): the variants no twin call reached until the twin ran them
                                dict(causal=False, window_size=(40, 0), seqlen_q=384, seqlen_k=384,
                                     call=CallForm(block_size=(128, 128), block_seed=7, block_keep=0.7))])
def test_the_tier_fails_a_dk_scaled_by_1_plus_2_to_the_minus_7(kw):
    p = _problem(**kw)
    # the per-element tier passes it: only the statistical one sees the bias
    check_problem(p, StandIn(1.0078125), properties=("runs", "fwd_budget", "bwd_budget"))
    with pytest.raises(Violation) as e:
        check_problem(p, StandIn(1.0078125), properties=PROPS)
    assert e.value.prop == "stat_tier" and e.value.metrics["quantity"] == "dk", e.value.message


def test_the_tier_is_not_formed_on_the_twin_itself_nor_where_a_known_issue_covers_the_tensor():
    out = check_problem(_problem(), TwinTarget(), properties=PROPS)
    assert "stat_tier" not in out.ran and "twin" in out.skipped["stat_tier"]
    # a softcap: the twin models tanh.approx by its bound, not bit for bit
    out = check_problem(_problem(softcap=20.0), StandIn(), properties=PROPS)
    assert "stat_tier" not in out.ran and "tanh.approx" in out.skipped["stat_tier"]
    # huge scores: the tensor core's truncated S against the twin's rounded one
    out = check_problem(_problem(values=ValueSpec("huge", 3, params=(("e_qk", 6.0), ("e_v", 4.0)))), StandIn(),
                        properties=PROPS)
    assert "stat_tier" not in out.ran and "huge" in out.skipped["stat_tier"]
    # the SM90 dQ accumulator issue covers dQ at head dim 72 past the first rows (Note [Pinned roundings])
    class AsProduction(StandIn):       # the known issues name the targets they hold for
        name = "production"
    out = check_problem(_problem(head_dim=72, head_dim_v=72), AsProduction(), properties=PROPS)
    assert "sm90_dq_accum" in out.skipped.get("stat_tier.dq", ""), out.skipped
    assert "stat_bias_dk" in out.metrics


def test_a_call_whose_rows_see_one_key_each_gets_a_forward_verdict_and_no_undecided_backward():
    """Window (-2, 2) is one visible key a row: P = 1, dS = 0, the exact dQ and dK are 0 (the
    H100 audit at a17a0cf: its forward's call for the statistical tier had stat_tier.dq / .dk
    undecided, "0 usable rows"). Its O is judged; its backward is skipped with the reason, as the
    selection counts it (not eligible for the backward variant)."""
    from fa4verify.coverage.variants import STAT_ROWS, stat_rows
    p = _problem(seqlen_q=100, seqlen_k=100, head_dim=128, head_dim_v=128, causal=False, window_size=(-2, 2))
    assert stat_rows(p)[1] < STAT_ROWS
    out = check_problem(p, StandIn(), properties=PROPS)
    assert "stat_tier" in out.ran and "stat_bias_out" in out.metrics, (out.skipped, out.undecided)
    assert not any(k.startswith("stat_tier") for k in out.undecided), out.undecided
    assert "one visible key" in out.skipped["stat_tier.backward"]


def test_the_plan_judges_every_variant_the_twin_runs_once_on_its_cheapest_call():
    from fa4verify.coverage.variants import _twin_cost, _twin_runs, bwd_variant, fwd_variant, statistical_calls
    ps = [_problem(seqlen_q=s, seqlen_k=s) for s in (300, 150)] + [_problem(head_dim=128, head_dim_v=128),
                                                                  _problem(causal=False)]
    cases = [(p, True, True) for p in ps]
    chosen, unjudged = statistical_calls(cases, limit=8)
    assert not unjudged
    # the hd-64 causal variants: on the cheaper of the two calls that reach them, not the first
    assert 0 not in chosen and 1 in chosen and 2 in chosen and 3 in chosen
    want = {v for p, b, d in cases for v in (fwd_variant(p), bwd_variant(p, d))}
    assert sum(len(t) for t in chosen.values()) == len(want)
    assert _twin_runs(ps[1], True) == (True, True) and _twin_cost(ps[1]) < _twin_cost(ps[0])
    with pytest.raises(ValueError, match="more than its level"):
        statistical_calls(cases, limit=2)


def test_the_coverage_plan_asks_the_tier_of_one_call_per_variant_and_names_the_rest():
    """``coverage.production``'s cases (fake H200, no GPU): the plan's details name the calls the
    statistical tier judges, every variant the calls compile is judged or named unjudged, and the
    runner asks for the property on exactly those calls."""
    import os
    from fa4verify.audit.registry import CheckContext
    from fa4verify.checks.coverage import _cases
    from fa4verify.coverage.variants import _twin_runs, bwd_variant, fwd_variant
    from fa4verify.targets import production_features
    ctx = CheckContext(dtype="bf16", arch="sm90", device="cuda", profile="default", seed=0,
                       check_id="coverage.production", archs=("sm90",))
    os.environ["FA4VERIFY_FAKE_DEVICE"] = "h200"
    try:
        cs = _cases(ctx, target="production", features=production_features(), arch="sm90", dtype="bf16",
                    where="x")
    finally:
        del os.environ["FA4VERIFY_FAKE_DEVICE"]
    plan = cs[0].head["extra"]["plan"]
    stat, unjudged = plan["stat_calls"], plan["stat_unjudged"]
    assert 50 < len(stat) <= 512

    def variants(c, twin_only):
        fwd_ok, bwd_ok = _twin_runs(c.problem, c.backward) if twin_only else (True, True)
        out = {fwd_variant(c.problem)} if fwd_ok else set()
        if c.backward and bwd_ok:
            out.add(bwd_variant(c.problem, c.deterministic))
        return out - {None}
    judged = set().union(*(variants(cs[int(i)], True) for i in stat))
    assert sum(len(t) for t in stat.values()) == len(judged)
    every = set().union(*(variants(c, False) for c in cs))
    # a variant without a statistical call: no call that compiles it runs on the twin
    missing = every - judged
    assert not missing & set().union(*(variants(c, True) for c in cs))
    assert len(unjudged) <= len(missing) and bool(unjudged) == bool(missing)
    # on SM90 none: the twin runs every call form the plan's variants need (block lists under
    # causal / a window included, Note [Block lists with causal or a window])
    assert not missing and not unjudged, unjudged


def test_no_verdict_on_a_tensor_whose_violation_a_known_issue_absorbed():
    """A known issue that absorbed a dK violation of the call (a defect it documents there): the
    tier forms no dK verdict (it would fail on the documented defect); the other tensors keep theirs."""
    from fa4verify.fuzz import violation
    token = violation._ABSORB.set(lambda v: v.metrics.get("quantity") == "dk")
    try:
        out = check_problem(_problem(), StandIn(1.5), properties=PROPS)
    finally:
        violation._ABSORB.reset(token)
    assert "absorbed a violation of dk" in out.skipped["stat_tier.dk"], out.skipped
    assert "stat_bias_dk" not in out.metrics and "stat_bias_dq" in out.metrics



def test_the_cheapest_call_is_the_twins_cheapest_not_the_fewest_pairs():
    """The twin walks a varlen call a sequence at a time in 128-key blocks: 257 sequences of at
    most 9 x 13 pairs cost it 2.9 s on the CPU where a dense call of 389 x 439 costs 1.4 s, though
    the pairs are 45 times fewer. Of two calls of one kernel variant, the selection takes the
    dense one (fa4verify/coverage/variants.py ``_twin_cost``)."""
    from fa4verify.coverage.variants import bwd_variant, fwd_variant, statistical_calls
    sq = tuple([1, 6, 2, 7, 3, 8, 4, 9, 5] * 28 + [1, 6, 2, 7, 3])[:257]
    sk = tuple(min(13, q + 4) for q in sq)
    vs = ValueSpec("normal", 5, (("sigma", 1.0),))
    many = AttentionProblem(arch="sm90", dtype="bf16", batch=257, seqlen_q=max(sq), seqlen_k=max(sk), seqlens_q=sq,
                            seqlens_k=sk, nheads=4, nheads_kv=2, head_dim=64, head_dim_v=64, causal=True, values=vs)
    dense = AttentionProblem(arch="sm90", dtype="bf16", batch=2, seqlen_q=389, seqlen_k=439, nheads=4, nheads_kv=2,
                             head_dim=64, head_dim_v=64, causal=True, values=vs)
    assert fwd_variant(many) == fwd_variant(dense) and bwd_variant(many, True) == bwd_variant(dense, True)
    pairs = lambda p: sum(a * b for a, b in zip(p.seqlens_q, p.seqlens_k)) if p.varlen else p.batch * 389 * 439  # noqa: E731
    assert pairs(many) * 20 < pairs(dense)          # the pair count alone would take the varlen call
    chosen, unjudged = statistical_calls([(many, True, True), (dense, True, True)], limit=8)
    assert list(chosen) == [1] and not unjudged, chosen
