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
