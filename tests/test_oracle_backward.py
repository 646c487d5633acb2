"""Backward formulas equal the true gradient: oracle ``backward(out=None)`` against torch autograd
of an independent float64 implementation of the forward (masks, softcap, sink, GQA, dlse)."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify.oracles import attention
from fa4verify.oracles.semantics import resolve_window, visible_mask

torch = pytest.importorskip("torch")


def _torch_attention(q, k, v, sink, scale, causal, window, softcap):
    """(b, s, h, d) float64 torch forward: returns out, lse (b, h, sq)."""
    g = q.shape[2] // k.shape[2]
    kk, vv = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)
    x = torch.einsum("bthd,bshd->bhts", q, kk) * scale
    y = softcap * torch.tanh(x / softcap) if softcap > 0 else x
    left, right = resolve_window(causal, window)
    m = visible_mask(q.shape[1], k.shape[1], left, right)
    if m is not None:
        y = y.masked_fill(~torch.from_numpy(m), float("-inf"))
    if sink is not None:
        y = torch.cat([y, sink.reshape(1, -1, 1, 1).expand(y.shape[0], -1, y.shape[2], 1)], dim=-1)
    lse = torch.logsumexp(y, dim=-1)
    p = torch.exp(y - lse[..., None]).nan_to_num(0.0)
    if sink is not None:
        p = p[..., :-1]
    return torch.einsum("bhts,bshd->bthd", p, vv), lse


@pytest.mark.parametrize("kw", [
    dict(), dict(causal=True), dict(window_size=(1, 2)), dict(softcap=2.0, causal=True),
    dict(sink=True), dict(sink=True, causal=True, softcap=3.0), dict(dlse=True), dict(dlse=True, sink=True),
], ids=lambda kw: ",".join(kw) or "plain")
def test_backward_equals_torch_autograd_of_float64_attention(kw):
    gen = torch.Generator().manual_seed(len(str(kw)))
    b, sq, sk, h, hk, d = 2, 5, 6, 4, 2, 8
    mk = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64).to(torch.bfloat16)  # noqa: E731
    q, k, v, do = mk(b, sq, h, d), mk(b, sk, hk, d), mk(b, sk, hk, d), mk(b, sq, h, d)
    sink = mk(h) if kw.get("sink") else None
    dlse = mk(b, h, sq).double() if kw.get("dlse") else None
    causal, window, softcap = kw.get("causal", False), kw.get("window_size", (None, None)), kw.get("softcap", 0.0)
    scale = d ** -0.5
    tq, tk, tv = (t.double().requires_grad_() for t in (q, k, v))
    ts = sink.double().requires_grad_() if sink is not None else None
    out, lse = _torch_attention(tq, tk, tv, ts, scale, causal, window, softcap)
    loss = (out * do.double()).sum() + ((lse * dlse).sum() if dlse is not None else 0)
    loss.backward()
    r = attention.backward(q, k, v, None, do, causal=causal, window_size=window, softcap=softcap,
                           learnable_sink=sink, dlse=dlse)
    tol = 1e-13   # torch's own float64 rounding at these sizes
    for name, t in (("dq", tq), ("dk", tk), ("dv", tv)):
        got, bnd = getattr(r, name), getattr(r, name + "_bound")
        assert np.all(np.abs(got - t.grad.numpy()) <= bnd + tol), (name, np.abs(got - t.grad.numpy()).max())
    if sink is not None:
        assert np.all(np.abs(r.dsink - ts.grad.numpy()) <= r.dsink_bound + tol)
    assert np.all(np.abs(r.out - out.detach().numpy()) <= tol)


def test_caller_out_changes_d_exactly_by_do_dot_out_difference():
    """D uses the O the caller passes (FA4 uses its rounded bf16 O): d = rowsum(dO * out)."""
    gen = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(1, 4, 2, 8, generator=gen).to(torch.bfloat16) for _ in range(4))
    f = attention.forward(q, k, v)
    ob = torch.from_numpy(f.out).to(torch.bfloat16)
    rc = attention.backward(q, k, v, ob, do)
    ro = attention.backward(q, k, v, None, do)
    assert rc.out_source == "caller" and ro.out_source == "oracle"
    d_expect = torch.einsum("bthd,bthd->bht", do.double(), ob.double()).numpy()
    assert np.all(np.abs(rc.d - d_expect) <= rc.d_bound + 1e-15)
    assert not np.array_equal(rc.dq, ro.dq)
    assert np.array_equal(rc.dv, ro.dv)   # dV = P^T dO does not involve D


def test_backward_carries_the_same_forward_result_as_forward():
    gen = torch.Generator().manual_seed(9)
    q, k, v, do = (torch.randn(1, 5, 2, 8, generator=gen).to(torch.bfloat16) for _ in range(4))
    sink = torch.tensor([0.3, -0.7])
    for prec in ("fast", 80):
        f = attention.forward(q, k, v, causal=True, learnable_sink=sink, precision=prec)
        b = attention.backward(q, k, v, torch.from_numpy(f.out).to(torch.bfloat16), do, causal=True,
                               learnable_sink=sink, precision=prec)
        for n in ("out", "lse", "bound", "lse_bound"):
            assert np.array_equal(getattr(b.forward, n), getattr(f, n)), (prec, n)
