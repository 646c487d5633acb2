"""FA4's batched call of a varlen problem of equal lengths (``CallForm(q_batched=True)`` alone,
Note [Call forms keep the problem's meaning]), and with it FA4's batched empty input: no keys
(O = 0, LSE the sink's or -inf; zero gradients, dsink = the sum of dLSE) or no queries. CPU: the
twin, and the production target's own call code through a stand-in adapter that has FA4's
empty-input contract (``interface.py``'s early returns, 4.0.0b36), with planted faults it must see."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from fa4verify import call_layout
from fa4verify.fuzz import check_problem
from fa4verify.fuzz.violation import Violation
from fa4verify.problem import AttentionProblem, CallForm, ValueSpec
from fa4verify.targets import ProductionTarget, TwinTarget

torch = pytest.importorskip("torch")

JUDGED = ("runs", "finite", "fwd_budget", "bwd_budget", "masked_rows")


def _problem(sq: int, sk: int, *, sink: bool = True, causal: bool = False, sink_dtype: str = "fp32"):
    return AttentionProblem(arch="sm90", dtype="bf16", batch=2, seqlens_q=(sq, sq), seqlens_k=(sk, sk),
                            seqlen_q=sq, seqlen_k=sk, nheads=4, nheads_kv=2, head_dim=32, head_dim_v=32,
                            causal=causal, sink=sink, sink_dtype=sink_dtype, values=ValueSpec("normal", 5),
                            call=CallForm(q_batched=True))


def test_the_batched_form_needs_a_varlen_problem_of_equal_lengths():
    p = _problem(6, 9)
    with pytest.raises(ValueError, match="equal seqlens_q and equal seqlens_k"):
        p.replace(seqlens_k=(9, 4))
    with pytest.raises(ValueError, match="varlen problem"):
        AttentionProblem(arch="sm90", dtype="bf16", batch=2, seqlen_q=6, seqlen_k=9, nheads=2, nheads_kv=2,
                         head_dim=32, head_dim_v=32, call=CallForm(q_batched=True))
    with pytest.raises(ValueError, match="batched call form"):
        p.replace(call=CallForm(q_batched=True, block_size=(64, 64)))
    assert AttentionProblem.from_json(p.to_json()) == p and "batched" in p.describe()


@pytest.mark.parametrize("sq,sk", [(6, 9), (6, 0), (0, 9)])
def test_the_call_gets_batched_arrays_and_nothing_else_and_they_come_back_exactly(sq, sk):
    p = _problem(sq, sk)
    a = p.materialize()
    c = call_layout.call_arrays(p, a)
    assert c["q"].shape == (2, sq, 4, 32) and c["k"].shape == (2, sk, 2, 32) and c["v"].shape == (2, sk, 2, 32)
    assert all(c[n] is None for n in ("seqused_k", "seqused_q", "page_table", "cu_seqlens_q", "cu_seqlens_k"))
    q, do = call_layout.gather_q(p, c)
    k, v = call_layout.gather_kv(p, c)
    assert np.array_equal(q, np.asarray(a["q"], np.float32)) and np.array_equal(k, np.asarray(a["k"], np.float32))
    o, lse = call_layout.to_problem_fwd(p, np.zeros((2, sq, 4, 32)), np.zeros((2, 4, sq)))
    assert o.shape == (2 * sq, 4, 32) and lse.shape == (4, 2 * sq)


@pytest.mark.parametrize("sq,sk", [(6, 9), (6, 0), (0, 9)])
def test_the_twin_runs_the_form_as_the_problem_it_describes(sq, sk):
    p = _problem(sq, sk, causal=sk > 0)
    a = p.materialize()
    t = TwinTarget()
    f, f0 = t.forward(p, a), t.forward(p.replace(call=None), a)
    assert np.array_equal(f.out, f0.out) and np.array_equal(f.lse, f0.lse, equal_nan=True)
    check_problem(p, t, properties=JUDGED)


class _EmptyFA4:
    """FA4's batched contract where either length is 0 (interface.py 4.0.0b36: ``_flash_attn_fwd``
    ``if seqlen_k == 0 or total_q == 0``, ``_flash_attn_bwd`` ``if q.numel() == 0 or
    k.numel() == 0``). Planted faults: ``sink_ignored`` (empty rows' LSE -inf despite a sink),
    ``dsink_zero`` (the backward's dsink 0 despite a dLSE)."""

    def __init__(self, fault: str = ""):
        self.fault = fault
        self.calls: list[tuple[str, dict]] = []

    def forward(self, q, k, v, return_lse=True, learnable_sink=None, **kw):
        self.calls.append(("fwd", dict(kw, q_shape=tuple(q.shape), k_shape=tuple(k.shape))))
        assert q.shape[1] == 0 or k.shape[1] == 0, "the stand-in runs empty input only"
        out = torch.zeros(q.shape[:3] + (v.shape[-1],), dtype=q.dtype)
        lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("-inf"))
        if learnable_sink is not None and self.fault != "sink_ignored":
            lse.copy_(learnable_sink.float()[:, None].expand_as(lse))
        return SimpleNamespace(out=out, lse=lse, config={"op": "fwd"})

    def backward(self, q, k, v, out, dout, lse, deterministic=True, dlse=None, learnable_sink=None, **kw):
        self.calls.append(("bwd", dict(kw, dlse=dlse is not None)))
        dsink = None
        if learnable_sink is not None:
            dsink = (torch.zeros_like(learnable_sink) if dlse is None or self.fault == "dsink_zero"
                     else dlse.sum(dim=(0, 2)).to(learnable_sink.dtype))
        return SimpleNamespace(dq=torch.zeros_like(q), dk=torch.zeros_like(k), dv=torch.zeros_like(v), dsink=dsink,
                               config={"op": "bwd"})


@pytest.mark.parametrize("sq,sk", [(6, 0), (0, 9)])
def test_production_hands_fa4_the_batched_empty_call_and_judges_its_answer(sq, sk):
    ad = _EmptyFA4()
    out = check_problem(_problem(sq, sk), ProductionTarget(adapter=ad, device="cpu"),
                        properties=JUDGED + ("bwd_stages",))
    assert not out.undecided, out
    (f, fk) = ad.calls[0]
    assert f == "fwd" and fk["q_shape"] == (2, sq, 4, 32) and fk["k_shape"] == (2, sk, 2, 32)
    assert not {"cu_seqlens_q", "cu_seqlens_k", "seqused_q", "seqused_k"} & set(fk)
    assert any(c == "bwd" and kw["dlse"] for c, kw in ad.calls), ad.calls      # the dLSE pass ran


@pytest.mark.parametrize("fault", ["sink_ignored", "dsink_zero"])
def test_an_empty_row_that_forgets_the_sink_fails(fault):
    with pytest.raises(Violation) as ei:
        check_problem(_problem(6, 0), ProductionTarget(adapter=_EmptyFA4(fault), device="cpu"),
                      properties=JUDGED + ("bwd_stages",))
    assert ei.value.prop in ("finite", "fwd_budget", "bwd_budget", "bwd_stages"), ei.value
