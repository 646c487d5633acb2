"""Float64 attention oracle with a user score modification and keep-mask (FA4's ``score_mod`` /
``mask_mod``), forward and backward, dense (batch, seqlen, heads, dim) or varlen (packed
``(total, heads, dim)`` with ``cu_seqlens_q`` / ``cu_seqlens_k``) layouts.

Semantics (FA4 4.0.0b36, ``fa4verify/kernels/mods.py``)::

    x_ij = scale * (q_i . k_j)          the scaled score (what FA4 hands a score_mod)
    y_ij = score(x_ij; b, h, i, j)      identity without a score function; softcap > 0 (FA4's
                                        built-in, which FA4 refuses with a score_mod):
                                        y_ij = softcap * tanh(x_ij / softcap)
    y_ij = -inf where not keep_ij       keep = the mask (and FA4's causal / window when given)
    LSE = log(sum_j exp(y_ij) + exp(sink_h))   (no sink term without learnable_sink; -inf for
                                        a row that keeps nothing and has no sink, = sink_h with one)
    P = exp(y - LSE), O = P V           (O = 0 for a row that keeps nothing)
    dS^y = P (dP - D),  dP = dO V^T,  D = rowsum(dO * O)
    dS^x = dS^y * score'(x),  dQ = scale dS^x K,  dK = scale dS^x^T Q,  dV = P^T dO
    dsink_h = -sum_i exp(sink_h - LSE_i) D_i

The softcap and sink semantics are :mod:`oracles.semantics`' (FA4 applies both with a mask_mod:
Note [Mods with softcap and sink]).

The functions come as callables (``score(x, b, h) -> y``, ``grad(x, b, h) -> dy/dx`` on one
(q, kv) block; ``keep(b, h) -> bool (seqlen_q, seqlen_k)``, a mask may depend on the head), so
this module knows nothing of fa4verify's registry (the judge resolves pairs:
``fa4verify.judge.attention``). A varlen call is FA4's: ``b`` is the sequence's index and the
block's rows and columns are the positions inside the sequence (FA4 hands its mods the
sequence-local ``q_idx`` / ``kv_idx``: ``softmax.apply_score_mod_inner``); every sequence is
computed as its own batch entry, and no key is shared between sequences, so the packed results
are those entries' results side by side (``dsink`` the sum over sequences, its bound the sum of
the bounds: float64 sums of a handful of terms, whose rounding the doubled bounds absorb).

Accuracy
--------
Every value carries an elementwise absolute bound, **first order and a priori** (not interval
certified like :mod:`oracles.reference`): with ``u = 2^-53``, ``A = |q| |k|``,

* ``dx <= scale gamma(d) A + u |x|``;  ``dy <= L dx + E (|x| + |y|)`` (``L`` = ``lipschitz``,
  ``E = 8 u``: Assumption [score reference accuracy]);
* ``dlse <= max_j dy + gamma(n + 4) + u |lse|``;  ``dP/P <= dy + dlse + u |y - lse| + 4 u``;
* ``dO <= (max_j dP/P + gamma(n)) sum_j P |V|``, and the backward likewise through dP (gamma(dv)),
  D (the O bound), ``score'`` (``curvature * dx + E |score'|``) and the gamma of each sum.

Each bound is doubled (second-order terms; the bounds are ~1e-12 against bf16 budgets ~1e-3, so
the margin costs nothing). Possible issues: Assumption [score reference accuracy] -- a
reference evaluated in float64 with at most ``8 u (|x| + |y|)`` absolute error (true for
additive biases, ``cap * tanh(x / cap)`` with numpy's <= 4 ulp tanh); a reference that
cancels badly needs its own bound.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional

import numpy as np

from .attention import AttentionBackward, AttentionForward

__all__ = ["forward", "backward", "U64"]

U64 = 2.0 ** -53
E_REF = 8 * U64


def _g(n) -> float:
    nu = float(n) * U64
    return nu / (1 - nu)


def _block(q, k, v, b, h, hk, scale, score, keep):
    qb = q[b, :, h]
    kb = k[b, :, hk]
    S = qb @ kb.T
    A = np.abs(qb) @ np.abs(kb).T
    x = S * scale
    dx = scale * _g(q.shape[-1]) * A + U64 * np.abs(x)
    if score is not None:
        y = np.asarray(score(x, b, h), np.float64)
        y = np.broadcast_to(y, x.shape)
    else:
        y = x
    kp = np.ones(x.shape, bool) if keep is None else np.asarray(keep(b, h), bool)
    return x, dx, y, kp


def _softmax(y, kp, sink_h=None):
    """(P, LSE, rows that keep a key, P of the sink or None). The sink (a logit, ``sink_h``)
    joins the denominator only."""
    ym = np.where(kp, y, -np.inf)
    anyk = kp.any(axis=1)
    m = np.where(anyk, np.max(ym, axis=1, initial=-np.inf), 0.0)
    if sink_h is not None:
        m = np.where(anyk, np.maximum(m, sink_h), sink_h)
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        e = np.where(kp, np.exp(ym - m[:, None]), 0.0)
        s = e.sum(axis=1)
        if sink_h is None:
            lse = np.where(anyk, m + np.log(np.where(anyk, s, 1.0)), -np.inf)
            P = np.where(anyk[:, None], e / np.where(anyk, s, 1.0)[:, None], 0.0)
            return P, lse, anyk, None
        s = s + np.exp(sink_h - m)
        lse = m + np.log(s)
        P = e / s[:, None]
        return P, lse, anyk, np.exp(sink_h - m) / s


def _softcap(cap: float):
    """``(score, grad, curvature)`` of FA4's built-in softcap (:mod:`oracles.semantics`)."""
    c = float(cap)
    if not (c > 0 and np.isfinite(c)):
        raise ValueError(f"softcap must be finite and > 0, got {cap!r}")
    # |d^2/dx^2 c tanh(x/c)| = 2 sech^2 tanh / c <= (4 / (3 sqrt 3)) / c < 1 / c
    return (lambda x, b, h: c * np.tanh(x / c)), (lambda x, b, h: 1.0 / np.cosh(x / c) ** 2), 1.0 / c


def forward(q: Any, k: Any, v: Any, *, softmax_scale: Optional[float] = None,
            score: Optional[Callable] = None, keep: Optional[Callable] = None,
            lipschitz: float = 1.0, window_size=(None, None), softcap: float = 0.0,
            learnable_sink: Any = None, cu_seqlens_q: Any = None, cu_seqlens_k: Any = None) -> AttentionForward:
    """O and LSE (FA4 layouts: out like q with headdim_v, lse (batch, heads, seqlen_q), varlen
    (heads, total_q)) with their bounds; inputs (batch, seqlen, heads, dim), or packed (total,
    heads, dim) with ``cu_seqlens_q`` / ``cu_seqlens_k``; GQA by ``heads % heads_kv == 0``;
    ``softcap`` (0 = off; not with ``score``) and ``learnable_sink`` (nheads,) as FA4's."""
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        return _varlen(q, k, v, None, cu_seqlens_q, cu_seqlens_k, softmax_scale, score, None, keep, lipschitz,
                       0.0, softcap, learnable_sink)[0]
    fw, _ = _run(q, k, v, None, softmax_scale, score, None, keep, lipschitz, 0.0, softcap, learnable_sink)
    return fw


def backward(q: Any, k: Any, v: Any, dout: Any, *, softmax_scale: Optional[float] = None,
             score: Optional[Callable] = None, grad: Optional[Callable] = None,
             keep: Optional[Callable] = None, lipschitz: float = 1.0,
             curvature: float = 0.0, softcap: float = 0.0, learnable_sink: Any = None,
             cu_seqlens_q: Any = None, cu_seqlens_k: Any = None, dlse: Any = None) -> AttentionBackward:
    """The exact gradient (the oracle's own O enters D, ``out_source="oracle"``) with bounds;
    ``grad`` is required with ``score``; ``dsink`` with ``learnable_sink``; layouts as
    :func:`forward`'s. ``dlse``: a gradient through the returned LSE, in the LSE's layout
    ((b, h, s), varlen (h, total)): ``D' = D - dLSE`` enters dS and dsink (``d`` holds D')."""
    if score is not None and grad is None:
        raise ValueError("backward with a score function needs its derivative (grad)")
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        return _varlen(q, k, v, dout, cu_seqlens_q, cu_seqlens_k, softmax_scale, score, grad, keep, lipschitz,
                       curvature, softcap, learnable_sink, dlse)[1]
    fw, bw = _run(q, k, v, dout, softmax_scale, score, grad, keep, lipschitz, curvature, softcap, learnable_sink,
                  dlse)
    return bw


def _results(scale, out, ob, lse, lb, grads=None):
    """(forward, backward or None) of the oracle's arrays; ``grads``: ``(dq, dq_bound, dk,
    dk_bound, dv, dv_bound, d, d_bound, dsink, dsink_bound)``."""
    fw = AttentionForward(out=out, lse=lse, bound=ob, lse_bound=lb, precision="fast",
                          method="oracles.mods float64 (first-order a-priori bound)", softmax_scale=scale,
                          window_size=(None, None))
    if grads is None:
        return fw, None
    dq, dqb, dk, dkb, dv, dvb, dd, ddb, dsink, dsinkb = grads
    bw = AttentionBackward(dq=dq, dk=dk, dv=dv, dsink=dsink, d=dd, dq_bound=dqb, dk_bound=dkb, dv_bound=dvb,
                           dsink_bound=dsinkb, d_bound=ddb, out=out, lse=lse, out_source="oracle",
                           precision="fast", method=fw.method, forward=fw)
    return fw, bw


def _varlen(q, k, v, dout, cu_q, cu_k, softmax_scale, score, grad, keep, lipschitz, curvature, softcap,
            learnable_sink, dlse=None):
    """Forward (and backward) of a packed call: each sequence as batch entry ``b`` of its own,
    results side by side in the packed layouts."""
    if cu_q is None or cu_k is None:
        raise ValueError("a varlen call needs both cu_seqlens_q and cu_seqlens_k")
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    cq, ck = (np.asarray(c, np.int64).reshape(-1) for c in (cu_q, cu_k))
    if cq.shape != ck.shape or cq[0] != 0 or ck[0] != 0 or np.any(np.diff(cq) < 0) or np.any(np.diff(ck) < 0) \
            or cq[-1] != q.shape[0] or ck[-1] != k.shape[0]:
        raise ValueError("cu_seqlens_q / cu_seqlens_k must be non-decreasing from 0 to the packed lengths, "
                         "one entry per sequence plus one")
    tq, H, D = q.shape
    Dv = v.shape[2]
    scale = float(softmax_scale) if softmax_scale is not None else D ** -0.5
    bwd = dout is not None
    do = np.asarray(dout, np.float64) if bwd else None
    out, ob = np.zeros((tq, H, Dv)), np.zeros((tq, H, Dv))
    lse, lb = np.full((H, tq), -np.inf), np.zeros((H, tq))
    sink = None if learnable_sink is None else np.asarray(learnable_sink, np.float64).reshape(-1)
    dl = None if dlse is None or not bwd else _dlse(dlse, (H, tq))
    if sink is not None:
        lse[:] = sink[:, None]          # a row with no key: LSE = the sink's logit (FA4's)
    if bwd:
        dq, dqb = np.zeros_like(q), np.zeros_like(q)
        dk, dkb = np.zeros_like(k), np.zeros_like(k)
        dv, dvb = np.zeros_like(v), np.zeros_like(v)
        dd, ddb = np.zeros((H, tq)), np.zeros((H, tq))
        dsink = None if sink is None else np.zeros(H)
        dsinkb = None if sink is None else np.zeros(H)
    for i in range(len(cq) - 1):
        qs, ks = slice(int(cq[i]), int(cq[i + 1])), slice(int(ck[i]), int(ck[i + 1]))
        if qs.stop == qs.start:
            continue
        one = {n: (lambda f, j=i: (lambda x, b, h: f(x, j, h)))(f) if f is not None else None
               for n, f in (("score", score), ("grad", grad))}
        kp = None if keep is None else (lambda b, h, j=i: keep(j, h))
        if ks.stop == ks.start:   # no key: O = 0, D = 0 (no gradient, no dsink); LSE -inf, or the sink
            if bwd and dl is not None:
                # D' = -dLSE; with a sink each row's P_sink is exactly 1 (LSE = the sink's logit), so
                # dsink_h gains -sum_i D'_i = sum_i dLSE_i (one float64 sum: its rounding in the bound)
                dd[:, qs] = -dl[:, qs]
                if dsink is not None:
                    dsink += dl[:, qs].sum(axis=1)
                    dsinkb += 2 * _g(qs.stop - qs.start) * np.abs(dl[:, qs]).sum(axis=1)
            continue
        fw, bw = _run(q[qs][None], k[ks][None], v[ks][None], None if not bwd else do[qs][None], scale,
                      one["score"], one["grad"], kp, lipschitz, curvature, softcap, learnable_sink,
                      None if dl is None else dl[:, qs][None])
        out[qs], ob[qs] = fw.out[0], fw.bound[0]
        lse[:, qs], lb[:, qs] = fw.lse[0], fw.lse_bound[0]
        if bwd:
            dq[qs], dqb[qs] = bw.dq[0], bw.dq_bound[0]
            dk[ks], dkb[ks] = bw.dk[0], bw.dk_bound[0]
            dv[ks], dvb[ks] = bw.dv[0], bw.dv_bound[0]
            dd[:, qs], ddb[:, qs] = bw.d[0], bw.d_bound[0]
            if dsink is not None:
                dsink += bw.dsink
                dsinkb += bw.dsink_bound
    return _results(scale, out, ob, lse, lb,
                    (dq, dqb, dk, dkb, dv, dvb, dd, ddb, dsink, dsinkb) if bwd else None)


def _dlse(dlse: Any, shape: tuple) -> np.ndarray:
    dl = np.asarray(dlse, np.float64)
    if dl.shape != shape:
        raise ValueError(f"dlse: expected shape {shape} (the LSE's layout), got {dl.shape}")
    return dl


def _run(q, k, v, dout, softmax_scale, score, grad, keep, lipschitz, curvature, softcap=0.0, learnable_sink=None,
         dlse=None):
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, sq, H, D = q.shape
    _, sk, Hk, Dv = v.shape
    dl = None if dlse is None or dout is None else _dlse(dlse, (B, H, sq))
    if H % Hk:
        raise ValueError(f"nheads {H} must be a multiple of nheads_kv {Hk}")
    if softcap:
        if score is not None:
            raise ValueError("softcap with a score function: FA4 refuses the combination (write the cap "
                             "into the score_mod)")
        score, grad, curvature = _softcap(softcap)
        lipschitz = 1.0
    sink = None
    if learnable_sink is not None:
        sink = np.asarray(learnable_sink, np.float64).reshape(-1)
        if sink.shape != (H,):
            raise ValueError(f"learnable_sink: expected shape ({H},) (nheads), got {sink.shape}")
    g = H // Hk
    scale = float(softmax_scale) if softmax_scale is not None else D ** -0.5
    L = float(lipschitz)
    out = np.zeros((B, sq, H, Dv))
    ob = np.zeros_like(out)
    lse = np.zeros((B, H, sq))
    lb = np.zeros_like(lse)
    bwd = dout is not None
    if bwd:
        do = np.asarray(dout, np.float64)
        dq, dqb = np.zeros_like(q), np.zeros_like(q)
        dk, dkb = np.zeros_like(k), np.zeros_like(k)
        dv, dvb = np.zeros_like(v), np.zeros_like(v)
        dd, ddb = np.zeros((B, H, sq)), np.zeros((B, H, sq))
        dsink = None if sink is None else np.zeros(H)
        dsinkb = None if sink is None else np.zeros(H)
    for b in range(B):
        for h in range(H):
            hk = h // g
            x, dx, y, kp = _block(q, k, v, b, h, hk, scale, score, keep)
            sh = None if sink is None else float(sink[h])
            # Note [A sink of -inf] (oracles/semantics.py): the values without a sink; P_sink is 1
            # exactly on a row no key reaches, 0 elsewhere
            off = sh == -math.inf
            P, ls, anyk, Ps = _softmax(y, kp, None if off else sh)
            if off:
                Ps = np.where(anyk, 0.0, 1.0)
            dy = (L * dx + E_REF * (np.abs(x) + np.abs(y))) if score is not None else dx
            dy = np.where(kp, dy, 0.0)
            # the sink is one more exact term of the sum (its logit carries no error)
            n = max(int(kp.sum(axis=1).max(initial=0)), 1) + (sh is not None and not off)
            fin = anyk if sh is None or off else np.ones_like(anyk)
            dls = np.where(fin, dy.max(axis=1, initial=0.0) + _g(n + 4) + U64 * np.abs(np.where(fin, ls, 0.0)), 0.0)
            with np.errstate(invalid="ignore"):
                rel = np.where(kp, dy + dls[:, None] + U64 * np.abs(np.where(kp, y, 0.0) - np.where(anyk, ls, 0.0)[:, None])
                               + 4 * U64, 0.0)
            vb = v[b, :, hk]
            o = P @ vb
            pv = P @ np.abs(vb)
            obd = 2 * ((rel * P) @ np.abs(vb) + _g(n) * pv)
            out[b, :, h], ob[b, :, h] = o, obd
            lse[b, h], lb[b, h] = ls, 2 * dls
            if not bwd:
                continue
            dob = do[b, :, h]
            dP = dob @ vb.T
            dPb = _g(Dv) * (np.abs(dob) @ np.abs(vb).T)
            Dh = np.sum(dob * o, axis=-1)
            Db = np.sum(np.abs(dob) * obd, axis=-1) + _g(Dv) * np.sum(np.abs(dob * o), axis=-1)
            if dl is not None:      # D' = D - dLSE, one more float64 rounding
                Db = Db + U64 * (np.abs(Dh) + Db + np.abs(dl[b, h]))
                Dh = Dh - dl[b, h]
            R = dP - Dh[:, None]
            dSy = P * R
            dSyb = rel * np.abs(dSy) + P * (dPb + Db[:, None]) + 2 * U64 * np.abs(dSy)
            if score is not None:
                fp = np.broadcast_to(np.asarray(grad(x, b, h), np.float64), x.shape)
                fpb = float(curvature) * dx + E_REF * np.abs(fp)
                dSx = np.where(kp, dSy * fp, 0.0)
                dSxb = np.where(kp, dSyb * np.abs(fp) + np.abs(dSy) * fpb + U64 * np.abs(dSx), 0.0)
            else:
                dSx, dSxb = dSy, dSyb
            kb_, qb_ = k[b, :, hk], q[b, :, h]
            dq[b, :, h] = scale * dSx @ kb_
            dqb[b, :, h] = 2 * scale * (dSxb @ np.abs(kb_) + _g(sk + 1) * np.abs(dSx) @ np.abs(kb_))
            dk[b, :, hk] += scale * dSx.T @ qb_
            dkb[b, :, hk] += 2 * scale * (dSxb.T @ np.abs(qb_) + _g(sq * g + 1) * np.abs(dSx).T @ np.abs(qb_))
            dv[b, :, hk] += P.T @ dob
            dvb[b, :, hk] += 2 * ((rel * P).T @ np.abs(dob) + _g(sq * g) * P.T @ np.abs(dob))
            dd[b, h], ddb[b, h] = Dh, 2 * Db
            if Ps is not None:
                # relative bound of P_sink (exact for a sink of -inf)
                rs = 0.0 if off else dls + U64 * np.abs(sh - ls) + 4 * U64
                dsink[h] -= np.sum(Ps * Dh)
                dsinkb[h] += 2 * (np.sum(Ps * (rs * np.abs(Dh) + Db)) + _g(sq + 1) * np.sum(np.abs(Ps * Dh)))
    return _results(scale, out, ob, lse, lb,
                    (dq, dqb, dk, dkb, dv, dvb, dd, ddb, dsink, dsinkb) if bwd else None)
