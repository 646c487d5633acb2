"""The upstream verifiers of the mutant suite: FlashAttention's accuracy rule and
``torch.testing.assert_close`` defaults, reimplemented on the CPU (fa4verify/mutants.py,
Note [Upstream rule, reimplemented])."""
from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fa4verify import mutants as M  # noqa: E402
from fa4verify.mutants import problems, upstream  # noqa: E402


def _upstream_attention_ref():
    try:
        from flash_attn.cute.testing import attention_ref
    except Exception as exc:  # pragma: no cover - flash-attn-4 missing or broken
        pytest.skip(f"flash_attn.cute.testing not importable: {type(exc).__name__}: {exc}")
    return attention_ref


@pytest.mark.parametrize("name", [p.name for p in M.battery("quick")])
@pytest.mark.parametrize("low_precision", [False, True], ids=["ref", "pt"])
def test_attention_ref_port_is_bit_identical_to_upstream(name, low_precision):
    """Our port of ``attention_ref`` gives the same bits as the installed upstream function
    (both the fp32 reference and the bf16 reorder_ops reference), NaN positions included."""
    attention_ref = _upstream_attention_ref()
    p = next(x for x in M.battery("quick") if x.name == name)
    d = M.make_inputs(p, seed=3)
    q, k, v = upstream._ref_inputs(d)
    kw = dict(upcast=False, reorder_ops=True) if low_precision else {}
    if low_precision and p.dtype == "fp8":
        kw["intermediate_dtype"] = torch.float8_e4m3fn
    ours, _ = M.attention_ref_torch(q, k, v, causal=p.causal, **kw)
    theirs, _ = attention_ref(q, k, v, causal=p.causal, **kw)
    assert ours.dtype == theirs.dtype == torch.bfloat16
    nan_o, nan_t = torch.isnan(ours), torch.isnan(theirs)
    assert torch.equal(nan_o, nan_t)
    assert torch.equal(ours[~nan_o], theirs[~nan_t])


def test_attention_ref_port_matches_upstream_with_window_sink_softcap():
    """The features the port keeps (local window, learnable sink, softcap) match upstream."""
    attention_ref = _upstream_attention_ref()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 37, 2, 32, generator=g).to(torch.bfloat16) for _ in range(3))
    sink = torch.randn(2, generator=g).to(torch.bfloat16)
    for kw in (dict(window_size=(5, 3)), dict(window_size=(None, -2)), dict(window_size=(4, None)),
               dict(learnable_sink=sink), dict(softcap=15.0), dict(causal=True, softcap=15.0)):
        for lp in (False, True):
            extra = dict(upcast=False, reorder_ops=True) if lp else {}
            ours, _ = M.attention_ref_torch(q, k, v, **kw, **extra)
            theirs, _ = attention_ref(q, k, v, **kw, **extra)
            assert torch.equal(ours.nan_to_num(7.0), theirs.nan_to_num(7.0)), (kw, lp)


def test_fa_rule_passes_the_reference_itself_and_fails_a_shifted_output():
    """out == out_ref passes with ratio 0; shifting one element by more than the threshold
    fails, by exactly the amount predicted from the rule's numbers."""
    p = M.battery("quick")[0]
    d = M.make_inputs(p, seed=1)
    refs = M.upstream_refs(d, with_grads=False)
    ref32 = refs.out_ref.float().numpy()
    v = M.fa_rule_forward(ref32, refs)
    assert v.status == "pass" and v.figure == 0.0
    r = M.fa_rule(refs.out_ref, refs.out_ref, refs.out_pt)
    bumped = ref32.copy()
    bumped.flat[17] += np.float32(2.0 * r.threshold + 0.25)
    bumped = problems._round_dtype(bumped, "bf16")
    v2 = M.fa_rule_forward(bumped, refs)
    assert v2.status == "fail" and v2.figure > 1.0


def test_fa_rule_atol_is_two_bf16_roundings_at_ref_plus_point_three():
    """atol = 2 max|(ref + 0.3 - 0.3) - ref| evaluated in bf16 (test_flash_attn.py:462): for a
    reference of ones it is 2 * |bf16(bf16(1.3) - 0.3) - 1|."""
    ref = torch.ones(4, dtype=torch.bfloat16)
    r = M.fa_rule(ref, ref, ref)
    x = torch.tensor(1.3, dtype=torch.float32).to(torch.bfloat16).float() - 0.3
    expect = 2 * abs(float(x.to(torch.bfloat16).float()) - 1.0)
    assert r.atol == pytest.approx(expect, abs=0)
    assert r.atol > 0


def test_fa_rule_fails_on_nan_as_upstream_does():
    """A NaN in the kernel output makes max|out-ref| NaN and the upstream `<=` false."""
    ref = torch.zeros(3, dtype=torch.bfloat16)
    out = torch.tensor([0.0, float("nan"), 0.0], dtype=torch.bfloat16)
    r = M.fa_rule(out, ref, ref)
    assert not r.passed and math.isnan(r.diff_max)


def test_upstream_backward_gate_follows_test_flash_attn():
    """Gradients are checked only for 16-bit inputs and not for causal with seqlen_k < seqlen_q."""
    ps = {p.name: p for p in M.battery("full")}
    assert M.upstream_bwd_applies(ps["tile_edge"])
    assert M.upstream_bwd_applies(ps["causal_sq_lt_sk"])
    assert not M.upstream_bwd_applies(ps["causal_sq_gt_sk"])
    assert not M.upstream_bwd_applies(ps["fp8_peaked"])


def test_fa_rule_backward_passes_reference_gradients():
    p = next(x for x in M.battery("quick") if x.name == "causal_sq_lt_sk")
    d = M.make_inputs(p, seed=0)
    refs = M.upstream_refs(d, with_grads=True)
    grads = [g.float().numpy() for g in refs.grads_ref]
    v = M.fa_rule_backward(grads, refs)
    assert v.status == "pass" and v.figure == 0.0
    grads[1] = grads[1] * np.float32(1.5)
    grads[1] = problems._round_dtype(grads[1], "bf16")
    assert M.fa_rule_backward(grads, refs).status == "fail"


@pytest.mark.parametrize("scale", [1.0, 1.0 + 2.0**-7, 1.02, 1.5])
def test_assert_close_verdict_is_torchs_and_figure_agrees(scale):
    """The verdict is torch's own assert_close with defaults; the figure
    max|a-e|/(atol+rtol|e|) is > 1 exactly when torch fails."""
    e = torch.linspace(-3, 3, 101).to(torch.bfloat16)
    a = (e.float() * scale).to(torch.bfloat16)
    v = M.assert_close_verdict(a.float().numpy(), e)
    try:
        torch.testing.assert_close(a, e)
        torch_ok = True
    except AssertionError:
        torch_ok = False
    assert (v.status == "pass") == torch_ok
    assert (v.figure <= 1.0) == torch_ok


def test_assert_close_defaults_are_torchs():
    from torch.testing._comparison import default_tolerances
    rtol, atol = default_tolerances(torch.bfloat16)
    assert (rtol, atol) == M.ASSERT_CLOSE_DEFAULTS["bf16"]
