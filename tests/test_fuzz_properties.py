"""Each fuzz property fails on a target that breaks it (and passes on the CPU twin)."""
from __future__ import annotations

import importlib

import numpy as np
import pytest

from fa4verify import fuzz
from fa4verify.fuzz import TwinTarget, Violation, check_problem
from fa4verify.problem import AttentionProblem, ValueSpec

importlib.import_module("fa4verify.kernels.twin.attention")


def _needs_oracle():
    import fa4verify.oracles.attention  # noqa: F401
    fuzz._budget(AttentionProblem("sm90", "bf16", 1, 1, 1, 1, 1, 8, 8))


class Broken(TwinTarget):
    """The twin with one property deliberately broken after the fact."""

    deterministic_by_construction = False   # so deterministic_bwd actually runs twice

    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.calls = 0

    def forward(self, problem, a):
        self.calls += 1
        f = super().forward(problem, a)
        if self.how == "nan" and f.out.size:
            f.out.flat[0] = np.nan
        if self.how == "masked_nonzero":
            f.out[...] = np.where(f.out == 0, 1.0, f.out)
        if self.how == "lse_finite_on_masked":
            f.lse[...] = np.where(np.isneginf(f.lse), 0.0, f.lse)
        if self.how == "batch_dependent" and problem.batch > 1:
            f.out[-1] = f.out[-1] + 2.0 ** -7 * np.sign(f.out[-1] + 1e-30)
        if self.how == "permutation_sensitive" and self.calls > 1:
            f.out[...] = f.out * (1 + 2.0 ** -6)
        if self.how == "gqa_dependent" and problem.nheads_kv < problem.nheads:
            f.out[...] = np.nextafter(f.out, np.inf)
        return f

    def backward(self, problem, a, fwd, *, deterministic=True):
        g = super().backward(problem, a, fwd, deterministic=deterministic)
        if self.how == "nondeterministic_bwd":
            g.dq[...] = g.dq + np.random.default_rng().integers(0, 2, g.dq.shape) * 2.0 ** -20
        if self.how == "dq_masked_nonzero":
            g.dq[...] = g.dq + 1.0
        return g


CAUSAL_MASKED = AttentionProblem("sm90", "bf16", 1, 5, 3, 1, 1, 16, 16, causal=True)
PLAIN_B2 = AttentionProblem("sm90", "bf16", 2, 7, 9, 2, 2, 16, 16)
GQA = AttentionProblem("sm90", "bf16", 1, 7, 9, 4, 2, 16, 16)


@pytest.mark.parametrize("how, problem, prop", [
    ("masked_nonzero", CAUSAL_MASKED, "masked_rows"),
    ("lse_finite_on_masked", CAUSAL_MASKED, "masked_rows"),
    ("dq_masked_nonzero", CAUSAL_MASKED, "masked_rows"),
    ("batch_dependent", PLAIN_B2, "batch_invariance"),
    ("gqa_dependent", GQA, "gqa_repeat"),
    ("nondeterministic_bwd", PLAIN_B2, "deterministic_bwd"),
])
def test_property_fails_on_a_target_that_breaks_it(how, problem, prop):
    with pytest.raises(Violation) as ei:
        check_problem(problem, Broken(how), properties=[prop])
    assert ei.value.prop == prop
    check_problem(problem, TwinTarget(), properties=[prop])   # and the twin itself passes


@pytest.mark.parametrize("how, problem, prop", [
    ("nan", PLAIN_B2, "finite"),
    ("permutation_sensitive", PLAIN_B2, "key_permutation"),
    ("batch_dependent", PLAIN_B2, "fwd_budget"),
])
def test_oracle_properties_fail_on_a_target_that_breaks_them(how, problem, prop):
    _needs_oracle()
    with pytest.raises(Violation) as ei:
        check_problem(problem, Broken(how), properties=[prop])
    assert ei.value.prop == prop
    out = check_problem(problem, TwinTarget(), properties=[prop])
    assert prop in out.ran


def test_violation_message_names_worst_elements_and_case():
    _needs_oracle()
    with pytest.raises(Violation) as ei:
        check_problem(PLAIN_B2, Broken("batch_dependent"), properties=["fwd_budget"])
    msg = str(ei.value)
    assert "exceed |out - oracle| <= oracle_bound + budget" in msg and "worst: (1, " in msg
    assert "case: sm90 bf16 b=2 sq=7 sk=9" in msg
    assert ei.value.metrics["tightness_out"] > 1


def test_twin_meets_every_property_on_a_gqa_varlen_sink_problem():
    _needs_oracle()
    p = AttentionProblem("sm100", "bf16", 3, 129, 65, 4, 2, 64, 64, causal=True, sink=True,
                         seqlens_q=(129, 0, 3), seqlens_k=(64, 65, 0),
                         values=ValueSpec("normal", 3, (("sigma", 1.0), ("sink_scale", 1.0), ("sink_shift", 0.0))))
    out = check_problem(p, TwinTarget())
    assert {"runs", "masked_rows", "finite", "fwd_budget"} <= set(out.ran)
    assert 0 <= out.metrics["tightness_out"] <= 1 and out.metrics["masked_rows"] > 0


def test_known_issue_sink_overflow_is_recognised_only_when_it_applies():
    _needs_oracle()
    mk = lambda shift: AttentionProblem(  # noqa: E731
        "sm90", "bf16", 1, 3, 5, 1, 1, 64, 64, sink=True,
        values=ValueSpec("negative_scores", 0, (("shift", shift), ("sink_scale", 1.0), ("sink_shift", 0.0))))
    with pytest.raises(Violation) as ei:
        check_problem(mk(200.0), TwinTarget(), properties=["finite"])
    assert fuzz.match_known_issue(mk(200.0), ei.value).name == "sink_rowsum_overflow"
    check_problem(mk(50.0), TwinTarget(), properties=["finite", "fwd_budget"])
