"""Float64 torch attention reference for the GPU tests and GPU benchmarks (not the project's
certified oracle, which is ``fa4verify.oracles.attention``).

``reference(q, k, v, ...)`` evaluates attention in float64 from the exact (bf16/fp16) inputs,
through torch autograd so that the backward is the exact derivative of the same expression.
Layout (batch, seqlen, nheads, headdim) as FA4, or varlen (total, nheads, headdim) with
``cu_seqlens_q/k``. Masks follow FA4: causal and ``window_size=(left, right)`` are aligned to the
bottom-right corner (query i may see key j iff ``i + sk - sq - left <= j <= i + sk - sq + right``).
A learnable sink adds ``exp(sink_h)`` to each row's denominator. Fully masked rows give O = 0 and
LSE = -inf (or the sink).

Accuracy: float64 throughout; for the shapes used here (K <= 8192 terms of size O(10)) the
reference error is below 1e-12 absolute, far under every bf16 figure it is compared with.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional


@dataclass
class Ref:
    out: "object"      # float64 (b, s, h, dv) or (total, h, dv)
    lse: "object"      # float64 (b, h, s) or (h, total), natural log
    dq: "object" = None
    dk: "object" = None
    dv: "object" = None
    dsink: "object" = None


def _mask(sq: int, sk: int, causal: bool, window_size, device):
    import torch
    left, right = window_size if window_size is not None else (None, None)
    if causal:
        right = 0
    if left is not None and right is not None and left + right < 0:
        left = right = None
    if left is None and right is None:
        return None
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    off = sk - sq
    allowed = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if right is not None:
        allowed &= j <= i + off + right
    if left is not None:
        allowed &= j >= i + off - left
    return allowed


def _dense(q, k, v, sink, *, scale, causal, window_size, softcap):
    import torch
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    g = h // hk
    k = k.repeat_interleave(g, dim=2)
    v = v.repeat_interleave(g, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    allowed = _mask(sq, sk, causal, window_size, q.device)
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    if sink is not None:
        sk_col = sink.view(1, h, 1, 1).expand(b, h, sq, 1)
        s_all = torch.cat([s, sk_col], dim=-1)
    else:
        s_all = s
    lse = torch.logsumexp(s_all, dim=-1)                         # (b, h, sq)
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    p = torch.exp(s - safe[..., None])
    out = torch.einsum("bhqk,bkhd->bqhd", p, v)
    return out, lse


def reference(q, k, v, *, dout=None, softmax_scale: Optional[float] = None, causal: bool = False,
              window_size=(None, None), softcap: float = 0.0, learnable_sink=None,
              cu_seqlens_q=None, cu_seqlens_k=None) -> Ref:
    """Float64 forward (and backward when ``dout`` is given) of attention."""
    import torch
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    need_grad = dout is not None
    q64, k64, v64 = (t.detach().double().requires_grad_(need_grad) for t in (q, k, v))
    sink64 = (learnable_sink.detach().double().requires_grad_(need_grad)
              if learnable_sink is not None else None)
    with torch.enable_grad():
        if cu_seqlens_q is None:
            out, lse = _dense(q64, k64, v64, sink64, scale=scale, causal=causal,
                              window_size=window_size, softcap=softcap)
        else:
            outs, lses = [], []
            cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
            for i in range(len(cq) - 1):
                qi = q64[cq[i]:cq[i + 1]][None]
                ki = k64[ck[i]:ck[i + 1]][None]
                vi = v64[ck[i]:ck[i + 1]][None]
                if qi.shape[1] == 0:
                    continue
                if ki.shape[1] == 0:
                    o = torch.zeros(qi.shape[1], q.shape[-2], v.shape[-1], dtype=torch.float64, device=q.device)
                    l = (sink64.view(-1, 1).expand(-1, qi.shape[1]) + 0 * qi.sum()) if sink64 is not None else \
                        torch.full((q.shape[-2], qi.shape[1]), float("-inf"), dtype=torch.float64, device=q.device)
                    outs.append(o + 0 * qi.sum())
                    lses.append(l)
                    continue
                o, l = _dense(qi, ki, vi, sink64, scale=scale, causal=causal,
                              window_size=window_size, softcap=softcap)
                outs.append(o[0])
                lses.append(l[0])
            out = torch.cat(outs, 0) if outs else torch.zeros(0, q.shape[-2], v.shape[-1],
                                                             dtype=torch.float64, device=q.device)
            lse = torch.cat(lses, 1) if lses else torch.zeros(q.shape[-2], 0, dtype=torch.float64,
                                                             device=q.device)
        r = Ref(out.detach(), lse.detach())
        if need_grad:
            grads = torch.autograd.grad(out, [q64, k64, v64] + ([sink64] if sink64 is not None else []),
                                        dout.double(), allow_unused=True)
            r.dq, r.dk, r.dv = (gr if gr is not None else torch.zeros_like(t)
                                for gr, t in zip(grads[:3], (q64, k64, v64)))
            if sink64 is not None:
                r.dsink = grads[3] if grads[3] is not None else torch.zeros_like(sink64)
    return r
