"""Problem statistics that error budgets need (``fa4verify.error_budgets`` consumes them).

All statistics are computed in plain float64 (row blocks of 512 queries, the oracle's thread
pool) from the exact input values with the semantics of
:mod:`oracles.semantics` (masks, GQA, varlen, softcap, sink). They are magnitudes for scaling
budgets, not certified values: relative accuracy ~1e-13 or better for well-scaled inputs.

Layouts follow FA4: "row" statistics use the LSE layout ((batch, nheads, seqlen_q), varlen
(nheads, total_q)); "out-like" ones the layout of ``out`` (like q, with headdim_v); "dq-like",
"dk-like", "dv-like" the layouts of q, k, v.

Definitions (row i, head h, visible keys j; ``s_ij = q_i . k_j``; ``x = scale s``;
``y = softcap tanh(x / softcap)`` or ``x``; ``m_i = max_j y_ij``; ``P_ij = exp(y_ij - lse_i)``
including the sink in lse).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from . import reference as _ref
from .semantics import Problem, check_like, parse_problem, visible_mask

__all__ = ["ForwardStats", "BackwardStats", "forward_stats", "backward_stats"]


@dataclass(frozen=True)
class ForwardStats:
    """Forward statistics.

    Fields (units in brackets):

    * ``sum_abs_pv`` out-like: ``sum_j P_ij |V_jd|`` [units of V]. The natural scale of O
      (|O| <= this); bounds on O are stated relative to it.
    * ``max_abs_score`` row: ``max_j |s_ij|`` [q units x k units], raw Q.K^T before scaling.
    * ``max_sum_abs_qk`` row: ``max_j sum_d |q_id||k_jd|`` [q x k units], the scale of the
      accumulation error of S = QK^T (gamma_D times this).
    * ``max_abs_logit`` row: ``max_j |x_ij|`` [nats], scaled logits before softcap.
    * ``row_max`` row: ``m_i = max_j y_ij`` [nats] after softcap, sink excluded; -inf if no key.
    * ``row_sum`` row: ``sum_j exp(y_ij - m_i)`` [dimensionless, >= 1 if any key visible],
      the softmax denominator before normalisation, sink excluded.
    * ``sink_term`` row or None: ``exp(sink_h - m_i)`` [dimensionless] (the sink's share of the
      denominator relative to row_sum; ``m_i`` = sink when no key is visible).
    * ``sum_p`` row: ``sum_j P_ij`` [dimensionless] (1 without a sink, 0 for fully masked rows).
    * ``max_p`` row: ``max_j P_ij`` [dimensionless].
    * ``n_visible`` row (int64): number of visible (unmasked) keys.
    * ``lse`` row: natural-log LSE [nats] (float64, not certified; use the oracle for truth).
    """

    sum_abs_pv: np.ndarray
    max_abs_score: np.ndarray
    max_sum_abs_qk: np.ndarray
    max_abs_logit: np.ndarray
    row_max: np.ndarray
    row_sum: np.ndarray
    sink_term: Optional[np.ndarray]
    sum_p: np.ndarray
    max_p: np.ndarray
    n_visible: np.ndarray
    lse: np.ndarray


@dataclass(frozen=True)
class BackwardStats:
    """Backward statistics (``dS`` = gradient w.r.t. the scaled logit x, softcap factor included,
    so that ``dQ = scale dS K``).

    * ``d`` row: ``D_i = sum_d dO_id O_id`` [dO units x O units] with the O given (or the exact O).
    * ``sum_abs_do_o`` row: ``sum_d |dO_id||O_id|`` [same units] (accumulation scale of D).
    * ``max_abs_dp`` row: ``max_j |dP_ij|`` with ``dP = dO V^T`` [dO x V units].
    * ``max_sum_abs_dov`` row: ``max_j sum_d |dO_id||V_jd|`` [dO x V units] (accumulation scale of dP).
    * ``max_abs_dp_minus_d`` row: ``max_j |dP_ij - D_i|`` [dO x V units].
    * ``sum_abs_ds_k`` dq-like: ``sum_j |dS_ij||K_jd|`` [dO x V x K units] (dQ / scale scale).
    * ``sum_abs_ds_q`` dk-like: ``sum_{i, heads of group} |dS_ij||Q_id|`` [dO x V x Q units].
    * ``sum_abs_p_do`` dv-like: ``sum_{i, heads of group} P_ij |dO_id|`` [dO units].
    * ``sum_abs_ds`` row: ``sum_j |dS_ij|`` [dO x V units].
    * ``sum_pg_k`` dq-like: ``sum_j P_ij g_ij f_ij |K_jd|`` [dO x V x K units] with the
      cancellation-free magnitude ``g_ij = sum_d |dO_id||V_jd| + sum_d |dO_id||O_id| + |dlse_i|``
      of ``dP_ij - D'_i`` (``D' = D - dlse``; ``f`` the softcap factor ``1 - tanh^2``, 1 without
      softcap): the natural scale of dQ/scale errors, since ``dS = P (dP - D') f`` may cancel.
    * ``sum_pg_q`` dk-like: ``sum_{i, heads of group} P_ij g_ij f_ij |Q_id|``.
    """

    d: np.ndarray
    sum_abs_do_o: np.ndarray
    max_abs_dp: np.ndarray
    max_sum_abs_dov: np.ndarray
    max_abs_dp_minus_d: np.ndarray
    sum_abs_ds_k: np.ndarray
    sum_abs_ds_q: np.ndarray
    sum_abs_p_do: np.ndarray
    sum_abs_ds: np.ndarray
    sum_pg_k: np.ndarray
    sum_pg_q: np.ndarray


def _softmax_parts(p: Problem, seg, h: int, r0: int, r1: int, c0: int, c1: int):
    """Softmax pieces of rows [r0, r1) of one sequence and head against keys [c0, c1) (which
    contain every visible key of those rows)."""
    hk = h // p.group
    qs = p.q[seg.q_start + r0: seg.q_start + r1, h]
    ks = p.k[seg.k_start + c0: seg.k_start + c1, hk]
    S = qs @ ks.T
    mask = visible_mask(seg.q_len, seg.k_len, p.left, p.right, (r0, r1), (c0, c1))
    if mask is None:
        mask = np.ones(S.shape, bool)
    x = S * p.scale
    if p.softcap > 0:
        th = np.tanh(x / p.softcap)
        y = p.softcap * th
        with np.errstate(over="ignore"):
            f = 1.0 / np.cosh(x / p.softcap) ** 2      # 1 - tanh^2 without cancellation
    else:
        th = f = None
        y = x.copy()
    y[~mask] = -np.inf
    m = y.max(axis=1, initial=-np.inf)
    mm = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(y - mm[:, None])
    rs = e.sum(axis=1)
    sink_t = None
    if p.sink is not None:
        # (a row without a visible key: e is 0 there and m_i = sink, exp(0) = 1, also for a sink
        # of -inf, Note [A sink of -inf])
        ref = np.where(np.isfinite(m), m, p.sink[h])
        sink_t = np.where(ref == p.sink[h], 1.0, np.exp(p.sink[h] - ref))
        rs_all = e.sum(axis=1) + sink_t
        mm = ref
        rs_scaled = rs_all
    else:
        rs_scaled = rs
    with np.errstate(divide="ignore", invalid="ignore"):
        P = np.where(rs_scaled[:, None] > 0, e / rs_scaled[:, None], 0.0)
        lse = np.where(rs_scaled > 0, mm + np.log(rs_scaled), -np.inf)
    return dict(S=S, x=x, th=th, f=f, mask=mask, m=m, rowsum=rs, sink=sink_t, P=P, lse=lse, qs=qs, ks=ks,
                vs=p.v[seg.k_start + c0: seg.k_start + c1, hk])


def _blocks(p: Problem, fn) -> None:
    """Call ``fn(seg, h, r0, r1, c0, c1)`` for every row block of every head, on the oracle's
    thread pool (tasks per (sequence, kv head) write disjoint outputs)."""

    def task(t):
        si, hk = t
        seg = p.segments[si]
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            for h in range(hk * p.group, (hk + 1) * p.group):
                for r0, r1, c0, c1 in _ref._row_blocks(seg.q_len, seg.k_len, p.left, p.right):
                    fn(seg, h, r0, r1, c0, c1)

    _ref._run_tasks(task, _ref._tasks(p), p)


def _parse(q, k, v, kw) -> Problem:
    return parse_problem(q, k, v, softmax_scale=kw.get("softmax_scale"), causal=kw.get("causal", False),
                         window_size=kw.get("window_size", (None, None)), softcap=kw.get("softcap", 0.0),
                         learnable_sink=kw.get("learnable_sink"), cu_seqlens_q=kw.get("cu_seqlens_q"),
                         cu_seqlens_k=kw.get("cu_seqlens_k"))


def forward_stats(q: Any, k: Any, v: Any, *, softmax_scale: Optional[float] = None, causal: bool = False,
                  window_size: Sequence[Optional[int]] = (None, None), softcap: float = 0.0,
                  learnable_sink: Any = None, cu_seqlens_q: Any = None,
                  cu_seqlens_k: Any = None) -> ForwardStats:
    """Forward statistics of an FA4 attention problem (arguments as ``attention.forward``)."""
    kw = dict(softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
              learnable_sink=learnable_sink, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    p = _parse(q, k, v, kw)
    Tq, H, _ = p.q.shape
    dv = p.headdim_v
    sapv = np.zeros((Tq, H, dv))
    rows = {n: np.zeros((H, Tq)) for n in ("max_abs_score", "max_sum_abs_qk", "max_abs_logit",
                                            "sum_p", "max_p")}
    row_max = np.full((H, Tq), -np.inf)
    row_sum = np.zeros((H, Tq))
    lse = np.full((H, Tq), -np.inf)
    nvis = np.zeros((H, Tq), np.int64)
    sink_t = np.zeros((H, Tq)) if p.sink is not None else None
    def block(seg, h, r0, r1, c0, c1):
        r = _softmax_parts(p, seg, h, r0, r1, c0, c1)
        sl = slice(seg.q_start + r0, seg.q_start + r1)
        mk = r["mask"]
        sapv[sl, h] = r["P"] @ np.abs(r["vs"])
        absqk = np.abs(r["qs"]) @ np.abs(r["ks"]).T
        rows["max_abs_score"][h, sl] = np.where(mk, np.abs(r["S"]), 0).max(axis=1, initial=0.0)
        rows["max_sum_abs_qk"][h, sl] = np.where(mk, absqk, 0).max(axis=1, initial=0.0)
        rows["max_abs_logit"][h, sl] = np.where(mk, np.abs(r["x"]), 0).max(axis=1, initial=0.0)
        rows["sum_p"][h, sl] = r["P"].sum(axis=1)
        rows["max_p"][h, sl] = r["P"].max(axis=1, initial=0.0)
        row_max[h, sl] = r["m"]
        row_sum[h, sl] = r["rowsum"] if p.sink is None else np.where(np.isfinite(r["m"]), r["rowsum"], 0.0)
        lse[h, sl] = r["lse"]
        nvis[h, sl] = mk.sum(axis=1)
        if sink_t is not None:
            sink_t[h, sl] = r["sink"]

    _blocks(p, block)
    L = p.lse_from_flat
    return ForwardStats(sum_abs_pv=p.out_from_flat(sapv), max_abs_score=L(rows["max_abs_score"]),
                        max_sum_abs_qk=L(rows["max_sum_abs_qk"]), max_abs_logit=L(rows["max_abs_logit"]),
                        row_max=L(row_max), row_sum=L(row_sum),
                        sink_term=None if sink_t is None else L(sink_t), sum_p=L(rows["sum_p"]),
                        max_p=L(rows["max_p"]), n_visible=L(nvis), lse=L(lse))


def backward_stats(q: Any, k: Any, v: Any, out: Any, dout: Any, *, softmax_scale: Optional[float] = None,
                   causal: bool = False, window_size: Sequence[Optional[int]] = (None, None),
                   softcap: float = 0.0, learnable_sink: Any = None, cu_seqlens_q: Any = None,
                   cu_seqlens_k: Any = None, dlse: Any = None) -> BackwardStats:
    """Backward statistics (arguments as ``attention.backward``; ``out=None`` uses the float64 O)."""
    kw = dict(softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
              learnable_sink=learnable_sink, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    p = _parse(q, k, v, kw)
    Tq, H, d = p.q.shape
    Tk, Hk, dv = p.v.shape
    do = check_like(dout, "dout", p.out_shape)[0].reshape(Tq, H, dv)
    og = None if out is None else check_like(out, "out", p.out_shape)[0].reshape(Tq, H, dv)
    dl = None if dlse is None else p.lse_to_flat(check_like(dlse, "dlse", p.lse_shape())[0])
    rows = {n: np.zeros((H, Tq)) for n in ("d", "sum_abs_do_o", "max_abs_dp", "max_sum_abs_dov",
                                            "max_abs_dp_minus_d", "sum_abs_ds")}
    sdk = np.zeros((Tq, H, d))
    sdq = np.zeros((Tk, Hk, d))
    pgk = np.zeros((Tq, H, d))
    pgq = np.zeros((Tk, Hk, d))
    spdo = np.zeros((Tk, Hk, dv))
    def block(seg, h, r0, r1, c0, c1):
        hk = h // p.group
        r = _softmax_parts(p, seg, h, r0, r1, c0, c1)
        sl = slice(seg.q_start + r0, seg.q_start + r1)
        ksl = slice(seg.k_start + c0, seg.k_start + c1)
        dos = do[sl, h]
        o = r["P"] @ r["vs"] if og is None else og[sl, h]
        D = np.einsum("id,id->i", dos, o)
        Dp = D - (dl[h, sl] if dl is not None else 0.0)
        dP = dos @ r["vs"].T
        G = dP - Dp[:, None]
        dS = r["P"] * G
        absdov = np.abs(dos) @ np.abs(r["vs"]).T
        sdo = np.einsum("id,id->i", np.abs(dos), np.abs(o))
        PG = r["P"] * (absdov + (sdo + (np.abs(dl[h, sl]) if dl is not None else 0.0))[:, None])
        if r["f"] is not None:
            dS = dS * r["f"]
            PG = PG * r["f"]
        mk = r["mask"]
        rows["d"][h, sl] = D
        rows["sum_abs_do_o"][h, sl] = sdo
        rows["max_abs_dp"][h, sl] = np.where(mk, np.abs(dP), 0).max(axis=1, initial=0.0)
        rows["max_sum_abs_dov"][h, sl] = np.where(mk, absdov, 0).max(axis=1, initial=0.0)
        rows["max_abs_dp_minus_d"][h, sl] = np.where(mk, np.abs(G), 0).max(axis=1, initial=0.0)
        rows["sum_abs_ds"][h, sl] = np.abs(dS).sum(axis=1)
        sdk[sl, h] = np.abs(dS) @ np.abs(r["ks"])
        sdq[ksl, hk] += np.abs(dS).T @ np.abs(r["qs"])
        spdo[ksl, hk] += r["P"].T @ np.abs(dos)
        pgk[sl, h] = PG @ np.abs(r["ks"])
        pgq[ksl, hk] += PG.T @ np.abs(r["qs"])

    _blocks(p, block)
    L = p.lse_from_flat
    return BackwardStats(d=L(rows["d"]), sum_abs_do_o=L(rows["sum_abs_do_o"]), max_abs_dp=L(rows["max_abs_dp"]),
                         max_sum_abs_dov=L(rows["max_sum_abs_dov"]),
                         max_abs_dp_minus_d=L(rows["max_abs_dp_minus_d"]),
                         sum_abs_ds_k=sdk.reshape(p.out_shape[:-1] + (d,)), sum_abs_ds_q=sdq.reshape(p.k_shape),
                         sum_abs_p_do=spdo.reshape(p.v_shape), sum_abs_ds=L(rows["sum_abs_ds"]),
                         sum_pg_k=pgk.reshape(p.out_shape[:-1] + (d,)), sum_pg_q=pgq.reshape(p.k_shape))
