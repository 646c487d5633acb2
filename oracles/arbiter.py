"""mpmath arbiter for FA4 attention: the same function as :mod:`oracles.semantics`, evaluated in
multiple precision on the exact input values, forward and backward.

Method
------
Each call owns a fresh ``mpmath.MPContext()`` (never the global ``mp``; safe under pytest-xdist)
and evaluates the whole problem twice, inside ``ctx.workprec(p)`` and ``ctx.workprec(2p)``.
Inputs enter as exact binary values (``ctx.mpf(float)`` of the exact float64 copies). Every
quantity is then checked: ``|v_p - v_2p| <= 2^-(p - AGREE_SLACK_BITS) * scale_v`` where
``scale_v`` is the quantity's natural magnitude (O: ``sum_j P_j |V_j|``; LSE: ``|m| + |log l| + 1``;
dQ: ``|scale| sum_j |dS|_ij |K_j|``; dK: ``|scale| sum_i |dS|_ij |Q_i|`` with
``|dS|_ij = P_ij (|dP_ij| + |D'|_i) f_ij`` (``f`` the softcap factor; ``dP - D'`` may cancel);
dV: ``sum_i P_ij |dO_i|``; D: ``sum |dO| |O|``; dsink: ``sum_i p_sink,i |D'|_i``; with
``|D'|_i = sum |dO||O| + |dlse| + |D'|``). Disagreement raises :class:`ArbiterDisagreement`,
naming the quantity, the index and both values; nothing unverified is returned.

Accuracy
--------
The returned float64 value is the 2p-bit value rounded to nearest. ``bound`` is
``|v_p - v_2p| + 2^-(2p - AGREE_SLACK_BITS) * scale_v + u |v|`` (u = 2^-53, the final rounding).
This is mpmath's ``autoprec`` argument (a 2p-bit evaluation is at least as accurate as a p-bit
one), a consistency check rather than an interval proof. With the default p = 80 the bound is
dominated by the float64 rounding ``u |v|``.

Possible issues
---------------
Pure Python: about 2e5-3e5 multiply-adds per second at 80 bits, both evaluations counted
(``benchmarks/bench_oracle.py``, CPU), so keep
problems small (seqlen, headdim <= ~64). Logits of magnitude ~2^(p - 40) and more make the p-bit
evaluation lose its margin and raise ArbiterDisagreement; raise ``bits``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import mpmath
import numpy as np

from .semantics import Problem, visible_mask

__all__ = ["DEFAULT_BITS", "AGREE_SLACK_BITS", "ArbiterDisagreement", "ArbiterForward",
           "ArbiterBackward", "forward", "backward"]

DEFAULT_BITS = 80
AGREE_SLACK_BITS = 32
U = 2.0 ** -53


class ArbiterDisagreement(ArithmeticError):
    """The p-bit and 2p-bit evaluations disagree beyond the allowed slack."""


@dataclass
class ArbiterForward:
    out: np.ndarray
    bound: np.ndarray
    lse: np.ndarray
    lse_bound: np.ndarray
    bits: int


@dataclass
class ArbiterBackward:
    dq: np.ndarray
    dq_bound: np.ndarray
    dk: np.ndarray
    dk_bound: np.ndarray
    dv: np.ndarray
    dv_bound: np.ndarray
    dsink: Optional[np.ndarray]
    dsink_bound: Optional[np.ndarray]
    d: np.ndarray
    d_bound: np.ndarray
    out: np.ndarray      # the O that entered D (caller's or the arbiter's own)
    lse: np.ndarray
    bits: int
    own_out: Optional[np.ndarray] = None       # the arbiter's own O and bounds
    own_out_bound: Optional[np.ndarray] = None
    lse_bound: Optional[np.ndarray] = None


def _mp_matrix(ctx, a: np.ndarray) -> list:
    return [[ctx.mpf(float(x)) for x in row] for row in a]


def _eval(p: Problem, ctx, want_bwd: bool, dout: Optional[np.ndarray], o_given: Optional[np.ndarray],
          dlse: Optional[np.ndarray]) -> dict:
    """One evaluation at ctx.prec. Returns object arrays of mpf (values) and float arrays (scales)."""
    Tq, H, d = p.q.shape
    Tk, Hk, dv = p.v.shape
    mpf = ctx.mpf
    zero = mpf(0)
    scale = mpf(p.scale)
    cap = mpf(p.softcap) if p.softcap > 0 else None
    out = np.empty((Tq, H, dv), dtype=object)
    out_sc = np.zeros((Tq, H, dv))
    lse = np.empty((H, Tq), dtype=object)
    lse_sc = np.zeros((H, Tq))
    if want_bwd:
        dq = np.empty((Tq, H, d), dtype=object)
        dq_sc = np.zeros((Tq, H, d))
        dk = np.full((Tk, Hk, d), zero, dtype=object)
        dk_sc = np.zeros((Tk, Hk, d))
        dvv = np.full((Tk, Hk, dv), zero, dtype=object)
        dv_sc = np.zeros((Tk, Hk, dv))
        Dv = np.empty((H, Tq), dtype=object)
        D_sc = np.zeros((H, Tq))
        dsink = [zero] * H
        dsink_sc = np.zeros(H)
    for seg in p.segments:
        mask = visible_mask(seg.q_len, seg.k_len, p.left, p.right)
        for hk in range(Hk):
            K = _mp_matrix(ctx, p.k[seg.k_start: seg.k_start + seg.k_len, hk])
            V = _mp_matrix(ctx, p.v[seg.k_start: seg.k_start + seg.k_len, hk])
            Vcols = [[V[j][c] for j in range(seg.k_len)] for c in range(dv)]
            absV = [[abs(x) for x in row] for row in V]
            absK = [[abs(x) for x in row] for row in K]
            cols: list = [[] for _ in range(seg.k_len)]
            for h in range(hk * p.group, (hk + 1) * p.group):
                sink = None if p.sink is None else mpf(float(p.sink[h]))
                sink_off = sink is not None and sink == mpf("-inf")    # Note [A sink of -inf]
                if sink_off:
                    sink = None
                for i in range(seg.q_len):
                    t = seg.q_start + i
                    qi = [mpf(float(x)) for x in p.q[t, h]]
                    js = [j for j in range(seg.k_len) if mask is None or mask[i, j]]
                    ys, ths = [], []
                    for j in js:
                        x = scale * ctx.fdot(qi, K[j])
                        if cap is not None:
                            z = x / cap
                            # softcap derivative 1 - tanh^2 = sech^2, without cancellation
                            ths.append(ctx.sech(z) ** 2 if want_bwd else None)
                            x = cap * ctx.tanh(z)
                        ys.append(x)
                    if not js and sink is None:
                        for c in range(dv):
                            out[t, h, c] = zero
                        lse[h, t] = mpf("-inf")
                        lse_sc[h, t] = 0.0
                        P = []
                        l = None
                    else:
                        m = max(ys + ([sink] if sink is not None else []))
                        es = [ctx.exp(y - m) for y in ys]
                        esink = ctx.exp(sink - m) if sink is not None else zero
                        l = ctx.fsum(es) + esink
                        P = [e / l for e in es]
                        for c in range(dv):
                            out[t, h, c] = ctx.fdot(P, [Vcols[c][j] for j in js])
                            out_sc[t, h, c] = float(ctx.fdot(P, [absV[j][c] for j in js]))
                        logl = ctx.log(l)
                        lse[h, t] = m + logl
                        lse_sc[h, t] = float(abs(m) + abs(logl) + 1)
                    if not want_bwd:
                        continue
                    do_i = [mpf(float(x)) for x in dout[t, h]]
                    o_i = ([mpf(float(x)) for x in o_given[t, h]] if o_given is not None
                           else list(out[t, h]))
                    Di = ctx.fdot(do_i, o_i)
                    Dv[h, t] = Di
                    D_sc[h, t] = float(ctx.fdot([abs(x) for x in do_i], [abs(x) for x in o_i]))
                    Dp = Di - (mpf(float(dlse[h, t])) if dlse is not None else zero)
                    # magnitude of D' including its cancellation-prone parts
                    Dmag = D_sc[h, t] + abs(Dp - Di) + abs(Dp)
                    if sink_off:        # the sink's whole mass on a row without a visible key
                        ps = zero if js else mpf(1)
                        term = -ps * Dp
                        dsink[h] += term
                        dsink_sc[h] += float(ps * Dmag)
                    elif sink is not None:
                        ps = esink / l if l is not None else zero
                        term = -ps * Dp
                        dsink[h] += term
                        dsink_sc[h] += float(ps * Dmag)
                    dSs, adSs = [], []
                    for n, j in enumerate(js):
                        dP = ctx.fdot(do_i, V[j])
                        dS = P[n] * (dP - Dp)
                        # scale of dS: P (|dP| + |D'|), since dP - D' may cancel
                        adS = P[n] * (abs(dP) + Dmag)
                        if cap is not None:
                            dS = dS * ths[n]
                            adS = adS * ths[n]
                        dSs.append(dS)
                        adSs.append(adS)
                        cols[j].append((dS, adS, qi, P[n], do_i))
                    for c in range(d):
                        dq[t, h, c] = scale * ctx.fdot(dSs, [K[j][c] for j in js])
                        dq_sc[t, h, c] = abs(p.scale) * float(ctx.fdot(adSs, [absK[j][c] for j in js]))
                # dK, dV: per key, over the rows (of every head of the group) that see it
                if want_bwd and h == (hk + 1) * p.group - 1:
                    for j in range(seg.k_len):
                        if not cols[j]:
                            continue
                        dSj = [e[0] for e in cols[j]]
                        adSj = [e[1] for e in cols[j]]
                        Pj = [e[3] for e in cols[j]]
                        for c in range(d):
                            qc = [e[2][c] for e in cols[j]]
                            dk[seg.k_start + j, hk, c] = scale * ctx.fdot(dSj, qc)
                            dk_sc[seg.k_start + j, hk, c] = abs(p.scale) * float(ctx.fdot(adSj, [abs(x) for x in qc]))
                        for c in range(dv):
                            doc = [e[4][c] for e in cols[j]]
                            dvv[seg.k_start + j, hk, c] = ctx.fdot(Pj, doc)
                            dv_sc[seg.k_start + j, hk, c] = float(ctx.fdot(Pj, [abs(x) for x in doc]))
    res = dict(out=(out, out_sc), lse=(lse, lse_sc))
    if want_bwd:
        res.update(dq=(dq, dq_sc), dk=(dk, dk_sc), dv=(dvv, dv_sc), d=(Dv, D_sc))
        if p.sink is not None:
            res["dsink"] = (np.array(dsink, dtype=object), dsink_sc)
    return res


def _agree(name: str, lo: tuple, hi: tuple, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Check agreement of the p-bit (lo) and 2p-bit (hi) values; return (float64 value, bound)."""
    vlo, _ = lo
    vhi, sc = hi
    val = np.empty(vhi.shape)
    bnd = np.empty(vhi.shape)
    tol_bits = bits - AGREE_SLACK_BITS
    for idx in np.ndindex(vhi.shape):
        a, b = vlo[idx], vhi[idx]
        fb = float(b)
        val[idx] = fb
        if fb == -np.inf and float(a) == -np.inf:
            bnd[idx] = 0.0
            continue
        diff = float(abs(a - b))
        if not diff <= 2.0 ** -tol_bits * sc[idx]:
            raise ArbiterDisagreement(
                f"{name}{list(idx)}: {bits}-bit value {mpmath.nstr(a, 20)} and {2 * bits}-bit value "
                f"{mpmath.nstr(b, 20)} differ by {diff:.3e} > 2^-{tol_bits} * scale {sc[idx]:.3e}; "
                f"raise the precision")
        bnd[idx] = diff + 2.0 ** -(2 * bits - AGREE_SLACK_BITS) * sc[idx] + U * abs(fb)
    return val, bnd


def _run(p: Problem, bits: int, want_bwd: bool, dout=None, o_given=None, dlse=None) -> dict:
    if bits < 53:
        raise ValueError(f"precision: arbiter needs at least 53 bits, got {bits}")
    ctx = mpmath.MPContext()
    with ctx.workprec(bits):
        lo = _eval(p, ctx, want_bwd, dout, o_given, dlse)
    with ctx.workprec(2 * bits):
        hi = _eval(p, ctx, want_bwd, dout, o_given, dlse)
    return {name: _agree(name, lo[name], hi[name], bits) for name in hi}


def forward(p: Problem, bits: int = DEFAULT_BITS) -> ArbiterForward:
    """Arbiter forward on a parsed, finite problem. Values are float64 (flat layout)."""
    r = _run(p, bits, False)
    return ArbiterForward(out=r["out"][0], bound=r["out"][1], lse=r["lse"][0], lse_bound=r["lse"][1],
                          bits=bits)


def backward(p: Problem, dout: np.ndarray, o_given: Optional[np.ndarray], dlse: Optional[np.ndarray],
             bits: int = DEFAULT_BITS) -> ArbiterBackward:
    """Arbiter backward. ``o_given`` None means D uses the arbiter's own O (same precision)."""
    r = _run(p, bits, True, dout, o_given, dlse)
    ds = r.get("dsink")
    return ArbiterBackward(
        dq=r["dq"][0], dq_bound=r["dq"][1], dk=r["dk"][0], dk_bound=r["dk"][1], dv=r["dv"][0],
        dv_bound=r["dv"][1], dsink=None if ds is None else ds[0],
        dsink_bound=None if ds is None else ds[1], d=r["d"][0], d_bound=r["d"][1],
        out=r["out"][0] if o_given is None else o_given, lse=r["lse"][0], bits=bits,
        own_out=r["out"][0], own_out_bound=r["out"][1], lse_bound=r["lse"][1])
