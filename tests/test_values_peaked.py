"""The ``peaked_rescale`` values (fa4verify.problem.values): FA4's forward walks a row's KV tiles from
the last one down, so the scores fall from left to right and the running max grows at every tile
boundary the kernel crosses -- counted by the CPU twin's own block loop (the distribution grew to
the right before: no rescale at all without a mask, the ninth red-team round) -- and a skipped
rescale fails a plan row of these values."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify.checks.coverage import PLAN_PROPERTIES
from fa4verify.coverage.cases import _VALUE_PARAMS
from fa4verify.fuzz import check_problem
from fa4verify.fuzz.violation import Violation
from fa4verify.kernels.twin import forward as twin_forward
from fa4verify.problem import AttentionProblem, ValueSpec
from fa4verify.targets import TwinTarget


def _problem(arch, causal, sk=700, seed=5):
    return AttentionProblem(arch=arch, dtype="bf16", batch=1, seqlen_q=200, seqlen_k=sk, nheads=2, nheads_kv=2,
                            head_dim=64, head_dim_v=64, causal=causal,
                            values=ValueSpec("peaked_rescale", seed, _VALUE_PARAMS["peaked_rescale"]))


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
@pytest.mark.parametrize("causal", [False, True])
def test_every_row_rescales(arch, causal):
    p = _problem(arch, causal)
    a = p.materialize()
    r = twin_forward.forward(a["q"], a["k"], a["v"], arch=arch, causal=causal)
    n = np.asarray(r.stages["n_rescale"])
    assert (n >= 1).all()
    if arch == "sm90" and not causal:
        # SM90 rescales whenever the max grows: once per 128-key boundary (6 tiles of 128 over 700
        # keys: 5), whatever the kernel's own tile width
        assert n.min() >= 4


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_a_skipped_rescale_fails(arch):
    p = _problem(arch, False)
    check_problem(p, TwinTarget(), properties=PLAN_PROPERTIES, backward=False)
    with pytest.raises(Violation):
        check_problem(p, TwinTarget(["rescale_skipped"]), properties=PLAN_PROPERTIES, backward=False)
