"""A learnable sink in bf16 / fp16 (FA4 4.0.0b26+ takes fp16, bf16 and fp32 sinks; the dtype is in
its compile key and dsink is written in it): the problem carries ``sink_dtype``, its sink values
are exact there, the production target hands FA4 a tensor of that dtype, the plan covers every sink
dtype value against every other dimension, and dsink is judged with the store in that dtype
(``tests/test_dsink.py``)."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify.problem import AttentionProblem, ValueSpec

torch = pytest.importorskip("torch")


def _p(**kw):
    base = dict(arch="sm90", dtype="bf16", batch=1, seqlen_q=9, seqlen_k=11, nheads=4, nheads_kv=2, head_dim=64,
                head_dim_v=64, sink=True, values=ValueSpec("normal", 3, (("sink_scale", 1e-3),)))
    base.update(kw)
    return AttentionProblem(**base)


@pytest.mark.parametrize("dt, tdt", [("bf16", "bfloat16"), ("fp16", "float16")])
def test_sink_values_are_exact_in_the_sink_dtype_and_round_trip(dt, tdt):
    p = _p(sink_dtype=dt)
    s = p.materialize()["learnable_sink"]
    assert np.array_equal(torch.as_tensor(s).to(getattr(torch, tdt)).float().numpy(), s)
    assert AttentionProblem.from_dict(p.to_dict()) == p and f"sink[{dt}]" in p.describe()
    assert "sink_dtype" not in _p().to_dict()          # an fp32 sink's JSON (and digest) is unchanged


def test_a_sink_dtype_without_a_sink_or_unknown_is_refused():
    with pytest.raises(ValueError, match="without a sink"):
        _p(sink=False, sink_dtype="bf16")
    with pytest.raises(ValueError, match="sink_dtype='fp8'"):
        _p(sink_dtype="fp8")


@pytest.mark.parametrize("dt, want", [("fp32", "float32"), ("bf16", "bfloat16"), ("fp16", "float16")])
def test_the_production_target_hands_fa4_the_sink_in_its_dtype(dt, want):
    from fa4verify.targets import ProductionTarget
    p = _p(sink_dtype=dt)
    tgt = ProductionTarget(fake=True)
    with tgt._mode():
        t = tgt._sink(p, p.materialize())
    assert t.dtype == getattr(torch, want) and tuple(t.shape) == (4,)


def test_the_plan_runs_bf16_sinks_with_a_backward_on_both_archs():
    from fa4verify.coverage import planner
    from fa4verify.coverage.cases import problem_for
    from fa4verify.coverage.space import space_for
    for arch in ("sm90", "sm100"):
        sp = space_for(arch, "bf16")
        pl = planner.plan(sp)
        rows = [(i, r) for i, r in enumerate(pl.rows) if r["sink"] == "bf16"]
        assert any("bwd" in sp.passes(r) for _, r in rows), arch
        i, r = rows[0]
        p = problem_for(sp, r, i)
        assert p.sink and p.sink_dtype == "bf16"
