"""``budgets.production.forward`` / ``budgets.production.backward`` without a GPU: the checks'
plumbing (inputs, oracle, budgets, verdict) is exercised with a stand-in adapter that computes
attention exactly in float64 on the CPU and rounds to bf16 (which must pass), and with faulty
stand-ins (which must fail).  On a GPU the same checks run production FA4 ("measured on H200")."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from fa4verify.audit.registry import CheckContext  # noqa: E402
from fa4verify.checks import budgets as B  # noqa: E402
from fa4verify.kernels import adapter  # noqa: E402
from fa4verify.run.engine import run_here  # noqa: E402


def _run(check, ctx):
    """The check on the engine, every case in this process (as an audit runs it, minus the pool)."""
    return run_here(check.__fa4verify_check__, ctx)


def _exact(q, k, v, causal):
    q64, k64, v64 = (t.double() for t in (q, k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q64, k64) / math.sqrt(q.shape[-1])
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return s


def _stand_in(monkeypatch, *, dq_scale=1.0, out_shift=0.0):
    cfg = SimpleNamespace(arch=90, tile_mn=(128, 128))

    def forward(q, k, v, *, causal=False, **kw):
        s = _exact(q, k, v, causal)
        o = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v.double()) + out_shift
        return SimpleNamespace(out=o.to(q.dtype), lse=torch.logsumexp(s, -1).float(), config=cfg)

    def backward(q, k, v, out, do, lse, *, causal=False, deterministic=True, **kw):
        qq, kk, vv = (t.double().requires_grad_(True) for t in (q, k, v))
        s = _exact(qq, kk, vv, causal)
        torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), vv).backward(do.double())
        return SimpleNamespace(dq=(qq.grad * dq_scale).to(q.dtype), dk=kk.grad.to(q.dtype),
                               dv=vv.grad.to(q.dtype), config=cfg)

    monkeypatch.setattr(adapter, "forward", forward)
    monkeypatch.setattr(adapter, "backward", backward)
    monkeypatch.setattr(B, "_DEVICE", "cpu")


@pytest.fixture()
def ctx():
    return CheckContext(profile="default", check_id="budgets.production", dtype="bf16")


def test_backward_check_passes_exact_then_rounded_gradients(ctx, monkeypatch):
    _stand_in(monkeypatch)
    r = _run(B.production_backward, ctx)
    assert r.status == "pass", r.summary
    assert 0 < r.tightness < 1 and len(r.details["table"]["rows"]) == 4


def test_backward_check_resolution(ctx, monkeypatch):
    """The composed budget is a worst-case bound: at seqlen 512 a systematic 5 % dQ error fails,
    a 1 % error stays inside it but multiplies the dQ tightness (what --baseline tracks)."""
    _stand_in(monkeypatch)
    base = [row[1] for row in _run(B.production_backward, ctx).details["table"]["rows"]]
    _stand_in(monkeypatch, dq_scale=1.01)
    r1 = _run(B.production_backward, ctx)
    one = [row[1] for row in r1.details["table"]["rows"]]
    assert all(b1 > 3 * b0 for b0, b1 in zip(base, one)), (base, one)
    _stand_in(monkeypatch, dq_scale=1.05)
    r = _run(B.production_backward, ctx)
    assert r.status == "fail" and "over budget" in r.summary and r.tightness > 1


def test_forward_check_passes_exact_then_rounded_and_fails_a_shift(ctx, monkeypatch):
    _stand_in(monkeypatch)
    assert _run(B.production_forward, ctx).status == "pass"
    _stand_in(monkeypatch, out_shift=0.01)
    assert _run(B.production_forward, ctx).status == "fail"


def test_forward_check_adds_two_huge_logit_cases_on_the_same_kernels(ctx, monkeypatch):
    """Note [Statistical tier at large logits]: the forward check runs its live cases and the first
    two again with huge logits (same shapes, so the same FA4 kernels); exact-then-rounded passes.
    (The exact stand-in cannot show the tier's power there: with exact one-hot weights O is a
    bf16 value of V, and 1 + 2^-9 times it rounds back to it. The twin, which rounds as FA4 does,
    shows it: the next test.)"""
    _stand_in(monkeypatch)
    r = _run(B.production_forward, ctx)
    rows = r.details["table"]["rows"]
    huge = [row for row in rows if row[0].endswith(" huge")]
    assert r.status == "pass" and len(rows) == 6 and len(huge) == 2, (r.summary, [row[0] for row in rows])
    assert all(row[4] == "pass" for row in huge), huge
    live = B._live_cases(ctx)
    extra = B._forward_live_cases(ctx)[len(live):]
    assert [p.replace(values=live[0].values) for p in extra] == live[:2]


@pytest.mark.parametrize("accumulation", ["sequential", "pairwise"])
@pytest.mark.parametrize("e_qk", [2.0, 6.0, 8.0])
def test_the_statistical_tier_at_large_logits_is_quiet_on_a_correct_kernel_and_sees_the_bias(accumulation, e_qk):
    """The evidence of Note [Statistical tier at large logits] on the CPU twin: a twin with perturbed
    MUFU and another accumulation order passes against the prediction; the planted 2^-9 1/rowsum
    bias fails, at hd 128 seqlen 512, causal and not."""
    from fa4verify import judge
    from fa4verify.judge import statistical as S
    from fa4verify.problem import AttentionProblem, ValueSpec
    from fa4verify.targets import TwinTarget
    alpha = S.alpha_per_test(S.DEFAULT_ALPHA, 6)
    pred = TwinTarget()
    for causal in (False, True):
        p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=512, seqlen_k=512, nheads=2, nheads_kv=2,
                             head_dim=128, head_dim_v=128, causal=causal,
                             values=ValueSpec("huge", 0, params=(("e_qk", e_qk), ("e_v", 4.0))))
        a = p.materialize()
        f0 = pred.forward(p, a)
        ref = judge.judge_forward(p, a, f0.out, f0.lse).ref_out.value
        for mut, want in (((), "pass"), (("recip_bias_2m9",), "fail")):
            f = TwinTarget(mut, mufu="perturbed", seed=1, accumulation=accumulation).forward(p, a)
            v = S.tier_on(p, {"out": f.out}, {"out": ref}, a, alpha_test=alpha, twin=pred)[0]
            assert v.status == want, (causal, mut, v.summary())
