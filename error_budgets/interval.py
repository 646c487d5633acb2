"""The backward interval bound: FA4's gradients bounded on the actual inputs, valid at any finite
logit scale (error_budgets/DERIVATIONS.md#backward-interval, Note [Backward interval bound]).

The composed budgets ``backward_dq/dk/dv`` (``_base.toml``) are first order: past
``first_order``'s limit they are ``+inf``. This module bounds the same quantities without any
smallness assumption: it encloses every value the kernel model admits (each stage within its
*local* budget of ``_base.toml``: ``bwd_s_accum``, ``softcap``, ``bwd_exp_arg``, ``dp_accum``,
``d_pre``, ``ds``, ``ds_cast``, ``bwd_p_cast``; the MUFU ex2 bound and its flush, the fp32
accumulations, the ``scale`` multiply and the output cast) in midpoint-radius intervals,
evaluated per (query, key) pair on the actual inputs: Q, K, V, dO and the forward outputs the
backward reads (FA4's own O and LSE, or the oracle's with their allowances). The budget of an
element is ``|mid - ref| + rad`` for the oracle value ``ref``: the largest distance from ``ref``
to a value the model admits.

Everything is float64 on numpy arrays, every radius rounded outward (Note [Directed float64]
below); nothing here imports the judge. The caller (``fa4verify.judge.stats.BudgetStats``) loops
over segments and heads and hands (segment, query head) blocks to :func:`pair_intervals`, one
at a time or stacked along leading axes (every function here reads a block's rows and keys on
its last two axes: Note [Blocks in stacks] in fa4verify/judge/stats.py), then sums the blocks
with :func:`accumulate`.

Note [Directed float64]: each float64 operation here rounds to nearest, with relative error
``2^-53``; a chain of ``n`` of them is inside ``gamma(n, 2^-53)``. Every radius is a sum of
non-negative terms evaluated in float64, and the matrix products over ``n <= 2^20`` terms err by
at most ``gamma(n, 2^-53) <= 2^-32`` relative; the final factor :data:`WIDEN` (``1 + 2^-30``) and
the absolute slack :data:`SLACK` times the magnitudes involved cover them (the fp32 terms they
widen are ``>= 2^-24`` relative, so the widening changes no verdict measurably).

Note [Same S in both passes]
----------------------------
The rigorous S model (``bwd_s_accum``: ``gamma(d, u) sum |q||k|``) lets the backward's recomputed
scores differ from the forward's by up to twice that, independently per pair: at bf16 ``e_qk``
10 that is 90 to 260 log2 units, so P = 2^(S~ c - L c) is bounded only to 2^+-90 and the bound
admits a zero dV (Note [A bound without power]). FA4 recomputes S with the same MMA on the same
operands in the same order as the forward; if it does so bit for bit, the forward's LSE ``L`` is
the log-sum-exp of the very scores ``y~`` the backward exponentiates, up to the forward's own
arithmetic ``eta`` (``forward_lse`` without its S-accumulation term: ``d = 0``), and

    P~ = 2^(x~),  x~ within rx of (y~ - L) c,  y~ - L = log softmax(y~) - eta,

bounded over the box ``y~ in [y_mid - y_rad, y_mid + y_rad]`` by its corners (the key's own score
at one end, every other key's and the sink at the other: :func:`_loo_lse`). The result is
intersected with the rigorous interval. Where the budgets carry ``bwd_same_s = 1`` (sm90: measured
on an H200, ``kernels/evidence/golden/bwd_same_s_h200.json``: the backward's P on 2,040 one-hot keys
at ``e_qk`` 10 read back within 2^0.44 of 1, one ulp of ``S c``, where independent roundings
could put it anywhere in 2^+-90) and the LSE is the kernel's own (``lse_self``), the judge passes
it. An intersection only narrows: a kernel that breaks the assumption can only be reported as a
failure it did not earn, never pass a fault the rigorous bound would have caught; a pass under it
is inside the rigorous enclosure too. What it buys: bf16 ``e_qk`` 8 decided (a zero dV fails);
at ``e_qk`` 10 the forward LSE's worst-case fp32 roundings at ``|S c| ~ 2^22`` (``eta`` ~ 8 log2
units) still admit a zero dV.

Note [One-hot LSE chain]
------------------------
Those roundings are not free: on a one-hot row they are functions of one unknown fp32 number, the
dominant key's score ``m``, and FA4's own fp32 LSE ``L`` is known. :func:`one_hot_chain` runs
FA4's SM90 chain (``L = RN(RN(RN(m k) + lg2.approx(l)) RN(ln 2))``, ``lse_log2 = RN(L
RN(log2 e))``, ``x = fma(m, k, -lse_log2)``; the fused and unfused forms FA4's source admits)
exactly in float64 for every fp32 candidate ``m`` near ``L / (ln 2 k)`` and keeps those that
reproduce ``L`` bit for bit; the dominant key's P is enclosed by the backward's arguments of the
consistent candidates (DERIVATIONS.md#one-hot-chain). Where the budgets carry ``fwd_lse_chain =
1`` (sm90) and the LSE is the kernel's own, the result is intersected with the bounds above (only
narrowing): bf16 ``e_qk`` 9..12 one-hot dV decided on the CPU twin, a zero dV fails.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

__all__ = ["PairIntervals", "PairP", "pair_intervals", "pair_p", "one_hot_chain", "chain_kappa", "accumulate", "finish",
           "WIDEN", "SLACK"]

#: outward factor on every radius (Note [Directed float64])
WIDEN = 1.0 + 2.0 ** -30
#: relative slack for the float64 evaluation of the midpoints (S, dP, D, exponent arguments)
SLACK = 2.0 ** -40
_LOG2E = math.log2(math.e)
_FTZ = 2.0 ** -126


def _gamma(n, u):
    nu = np.asarray(n, np.float64) * u
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(nu < 1, nu / (1 - nu), np.inf)


def _mul_iv(alo, ahi, blo, bhi):
    """The product of two intervals (corner products, float64; widened by the caller)."""
    with np.errstate(invalid="ignore", over="ignore"):
        c = np.stack([alo * blo, alo * bhi, ahi * blo, ahi * bhi])
    return np.min(c, axis=0), np.max(c, axis=0)


def _loo_lse(a: np.ndarray, sink: Any) -> np.ndarray:
    """``log(sum_{k != j} e^{a_ik} + e^sink)`` for every ``(i, j)`` over the last axis of ``a``
    (..., lk) (float64; ``-inf`` entries are absent keys; no sink: ``sink`` None, else a logit per
    row, broadcast to ``a.shape[:-1]``). The row's largest entry is left out directly; every other
    ``j`` as ``M + log1p(-e^{a_ij - M})`` with ``M`` the row's full sum, where ``e^{a_ij - M} <= 1/2``
    (no cancellation)."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        cols = a if sink is None else np.concatenate(
            [a, np.broadcast_to(np.asarray(sink, np.float64), a.shape[:-1])[..., None]], axis=-1)
        M = np.logaddexp.reduce(cols, axis=-1)[..., None]
        out = M + np.log1p(-np.exp(a - M))
        j = np.argmax(a, axis=-1)[..., None]
        b = cols.copy()
        np.put_along_axis(b, j, -np.inf, axis=-1)
        np.put_along_axis(out, j, np.logaddexp.reduce(b, axis=-1)[..., None], axis=-1)
    return out


#: FA4's fp32 constants of the SM90 LSE chain (softmax.py ``finalize``: ``LN2 = math.log(2.0)``;
#: flash_bwd_preprocess.py ``LOG2_E = math.log2(math.e)``: Python floats, Float32 in the kernel)
LN2_F32 = float(np.float32(math.log(2.0)))
LOG2E_F32 = float(np.float32(_LOG2E))
#: candidates of the dominant key's fp32 score tried on each side of L / (LN2 kappa)
_CHAIN_K = 32
#: the others' weight (times their worst mismatch) below which a row counts as one-hot
_CHAIN_W = -8.0


def chain_kappa(scale: float, mod: bool) -> tuple[float, ...]:
    """The fp32 multipliers of the score FA4's exponent may use: ``compute_softmax_scale_log2``
    inside the kernel on the Float32 ``softmax_scale`` gives ``RN(RN(scale) RN(LOG2_E))`` (the
    twin's model), a product formed on the host ``RN(scale LOG2_E)``; both are tried (they differ
    by at most an ulp). ``RN(LOG2_E)`` with a score_mod or the softcap (the scale is applied
    before the mod)."""
    if mod:
        return (LOG2E_F32,)
    return tuple(sorted({float(np.float32(np.float32(scale) * np.float32(LOG2E_F32))),
                         float(np.float32(scale * _LOG2E))}))


def _f32(x):
    return np.asarray(x, np.float64).astype(np.float32).astype(np.float64)


def _f32_step(x, up: bool):
    x32 = np.asarray(x, np.float64).astype(np.float32)
    return np.nextafter(x32, np.float32(np.inf if up else -np.inf)).astype(np.float64)


def _rn32_set(x):
    """The fp32 values ``RN(t)`` may take for a real ``t`` whose float64 evaluation is ``x`` (float64
    arrays, the evaluation's own error < 2^-40 |x| assumed): ``RN(x)``, widened to both fp32
    neighbours where ``x`` lies within that error of a rounding boundary (a double rounding
    could have gone either way there)."""
    f = _f32(x)
    up, dn = _f32_step(f, True), _f32_step(f, False)
    tol = 2.0 ** -40 * np.abs(x)
    near_hi = np.abs(x - (f + up) / 2) <= tol
    near_lo = np.abs(x - (f + dn) / 2) <= tol
    return np.where(near_lo, dn, f), np.where(near_hi, up, f)


def one_hot_chain(m_lo: np.ndarray, m_hi: np.ndarray, keep: np.ndarray, kappas: tuple, lse: np.ndarray,
                  sink: Optional[float], n_blocks: np.ndarray, C: Any):
    """Note [One-hot LSE chain]: the P of the dominant key of each one-hot row, modelled through
    FA4's SM90 LSE chain with every rounding explicit (DERIVATIONS.md#one-hot-chain).

    ``m_lo..m_hi`` (lq, lk): where the kernel's fp32 score of each pair lies (the raw ``S`` without
    a mod, the mod's output with one); ``kappas``: the fp32 multipliers of that score in the
    exponent the kernel may use (:func:`chain_kappa`; every one is tried, the union kept); ``lse`` (lq,):
    FA4's own fp32 LSE of the row (natural log) that the backward reads; ``sink``: the head's sink
    logit (natural; a float, or one per row) or None; ``n_blocks`` (lq,): KV blocks of the row. Returns ``(rows, cols, lo,
    hi)``: the rows where the chain decides, their dominant key, and the enclosure of that
    key's backward P (before its cast). Rows it does not decide (no dominant key, the others'
    weight too large, no fp32 score consistent with the LSE, or one at the search window's edge)
    are left out: the caller keeps its other bounds there."""
    u, mufu = float(C["u_fp32"]), float(C["mufu_ex2_rel"])
    lg2_abs, lg2_rel = float(C["lg2_abs"]), float(C["lg2_rel"])
    lq = keep.shape[0]
    none = (np.zeros(0, int), np.zeros(0, int), np.zeros(0), np.zeros(0))
    if lq == 0 or not keep.any():
        return none
    lse = np.asarray(lse, np.float64)
    kmax = max(kappas)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        mid = np.where(keep, (m_lo + m_hi) / 2, -np.inf)
        js = np.argmax(mid, axis=1)
        r = np.arange(lq)
        # log2 of the others' weight relative to the dominant term (the sink one of them), at the
        # largest multiplier (the gaps are positive: the largest makes the weight largest)
        zs_lo = m_lo[r, js] * kmax
        zo = np.where(keep, m_hi * kmax, -np.inf)
        zo[r, js] = -np.inf
        lw = np.logaddexp2.reduce(zo - zs_lo[:, None], axis=1)
        zmax = np.max(np.where(keep, np.maximum(np.abs(m_lo), np.abs(m_hi)) * kmax, 0.0), axis=1)
        if sink is not None:
            s2 = np.broadcast_to(np.asarray(sink, np.float64), (lq,)) * _LOG2E
            lw = np.logaddexp2(lw, s2 - m_lo[r, js] * min(kappas))
            zmax = np.maximum(zmax, np.where(np.isneginf(s2), 0.0, np.abs(s2)))   # -inf: no term
        nb = np.maximum(np.asarray(n_blocks, np.float64), 1.0)
        # the worst mismatch of another key's term (log2 units): its own exponent bias and
        # argument roundings at up to 2 zmax, one rescale factor per block after it (argument
        # (m_prev - m_cur) c, two roundings), the MUFU and the rescale products
        e_o = (8 + 4 * nb) * u * 2 * zmax * (1 + 2 ** -20) + (nb + 3) * (mufu + 2 * u) * _LOG2E * 1.01
        lwe = lw + e_o
        ok = keep.any(axis=1) & np.isfinite(lse) & (lwe <= _CHAIN_W) & np.isfinite(zs_lo)
    rows = np.nonzero(ok)[0]
    if rows.size == 0:
        return none
    js = js[rows]
    L = lse[rows]
    lam = _f32(_f32(L) * LOG2E_F32)                     # the preprocess's lse_log2 = RN(L LOG2_E)
    n_keys = keep[rows].sum(axis=1)
    gam = _gamma(n_keys + 2 * nb[rows] + 8, u)
    w = np.exp2(lwe[rows])
    # the dominant term: one ex2.approx, then per later block a rescale factor ex2.approx(0) and
    # the product row_sum * row_scale (each within mufu + u of exact)
    nbr = nb[rows] + 1
    rho_hi = (1 + gam) * (1 + mufu + u) ** nbr * (1 + w) - 1
    rho_lo = (1 - gam) * (1 - mufu - u) ** nbr - 1
    Lc, lamc = L[:, None], lam[:, None]
    box_lo, box_hi = m_lo[rows, js][:, None], m_hi[rows, js][:, None]
    x_lo = np.full(rows.size, np.inf)
    x_hi = np.full(rows.size, -np.inf)
    edge = np.zeros(rows.size, bool)
    for kappa in sorted(set(kappas)):
        # candidates m (fp32) around L / (LN2 kappa), inside the rigorous box of the dominant score
        m0 = _f32(L / (LN2_F32 * kappa))
        cand = [m0]
        lo_, hi_ = m0, m0
        for _ in range(_CHAIN_K):
            lo_, hi_ = _f32_step(lo_, False), _f32_step(hi_, True)
            cand = [lo_] + cand + [hi_]
        M = np.stack(cand, axis=1)                                       # (R, 2K + 1)
        Z = M * kappa                                                    # exact: two fp32 factors
        A1 = _f32(Z)
        R_ = Z - A1                                                      # exact rounding error
        consistent = np.zeros(M.shape, bool)
        for theta in (0.0, 1.0):   # the forward's dominant argument: RN(S c) - RN(m c) (0) or fused (r)
            base = theta * R_
            e_lg2 = lg2_abs + lg2_rel * (np.abs(base) + 0.01)
            g_lo = base + np.log2(1 + rho_lo)[:, None] - e_lg2 - 2.0 ** -40
            g_hi = base + np.log2(1 + rho_hi)[:, None] + e_lg2 + 2.0 ** -40
            for A in (A1, Z):      # finalize: RN(RN(m c) + lg2 l), or contracted RN(m c + lg2 l)
                t_lo, _ = _rn32_set(A + g_lo)
                _, t_hi = _rn32_set(A + g_hi)
                t = t_lo
                for _ in range(8):  # every fp32 L2 in [t_lo, t_hi]: does RN(L2 LN2) give FA4's L?
                    live = t <= t_hi
                    consistent |= live & (_f32(t * LN2_F32) == Lc)
                    t = _f32_step(t, True)
                consistent |= t <= t_hi                                  # more than 8: admit
        consistent &= (M >= box_lo) & (M <= box_hi)
        edge |= consistent[:, 0] | consistent[:, -1]
        # the backward's argument for each consistent score: fma(m, kappa, -lse_log2) or
        # RN(RN(m kappa) - lse_log2), then ex2.approx (float64 evaluation error widened)
        x1, x0 = Z - lamc, A1 - lamc
        slack = 2.0 ** -50 * (np.abs(Z) + np.abs(lamc))
        xs_lo = np.minimum(_rn32_set(x1 - slack)[0], _rn32_set(x0)[0])
        xs_hi = np.maximum(_rn32_set(x1 + slack)[1], _rn32_set(x0)[1])
        x_lo = np.minimum(x_lo, np.min(np.where(consistent, xs_lo, np.inf), axis=1))
        x_hi = np.maximum(x_hi, np.max(np.where(consistent, xs_hi, -np.inf), axis=1))
    good = np.isfinite(x_lo) & np.isfinite(x_hi) & ~edge
    m_e = mufu + u
    p_lo = np.exp2(x_lo) * (1 - m_e) / WIDEN
    p_hi = np.exp2(x_hi) * (1 + m_e) * WIDEN
    p_lo = np.where(p_lo >= _FTZ, p_lo, 0.0)
    return rows[good], js[good], p_lo[good], p_hi[good]


def _round_iv(lo, hi, rel, floor=0.0):
    """An interval after a rounding with relative error ``rel`` and absolute floor ``floor``
    (a monotone rounding moves each end outward by at most ``rel |end| + floor``)."""
    return lo - rel * np.abs(lo) - floor, hi + rel * np.abs(hi) + floor


@dataclass
class PairIntervals:
    """Per (query row, key) of one block: the kernel's cast P (the dV operand) and its cast dS
    (the dQ/dK operand, softcap / score-mod factor included) as ``[lo, hi]``; masked pairs are
    exactly 0 (FA4 masks them)."""
    p_lo: np.ndarray
    p_hi: np.ndarray
    ds_lo: np.ndarray
    ds_hi: np.ndarray
    #: with ``exact``: the exact P and the cancellation-free size of the exact dS,
    #: ``P (|dO| |V| + |O| |dO|) |f|`` (Note [A bound without power] in fa4verify/judge/verdict.py)
    p_ex: Optional[np.ndarray] = None
    ds_mag: Optional[np.ndarray] = None
    #: with ``exact``: the size of the exact dS the model lets a correct kernel return as 0 (pairs
    #: whose factor interval holds 0: a saturated softcap, a score_mod gradient near 0), else 0
    ds_drop: Optional[np.ndarray] = None


def pair_intervals(bs: Any, *, q: np.ndarray, k: np.ndarray, v: np.ndarray, dout: np.ndarray,
                   o_mid: np.ndarray, o_rad: np.ndarray, lse_mid: np.ndarray, lse_rad: np.ndarray,
                   keep: np.ndarray, scale: float, softcap: float = 0.0,
                   score: Optional[tuple[Callable, Callable, Callable, float, float]] = None,
                   exact: Optional[tuple[np.ndarray, np.ndarray]] = None,
                   lse_self: Optional[np.ndarray] = None, sink: Any = None,
                   n_blocks: Optional[np.ndarray] = None, s_kernel: Optional[np.ndarray] = None,
                   dlse: Optional[np.ndarray] = None, p_part: Optional["PairP"] = None) -> PairIntervals:
    """Intervals of the kernel's cast P and cast dS for one (segment, query head) block, or for a
    stack of them (every array with the same leading axes; ``sink`` then one per block).

    ``q`` (lq, d), ``k`` (lk, d), ``v`` (lk, dv), ``dout`` (lq, dv): the exact inputs (float64
    holding input-dtype values). ``o_mid +- o_rad`` (lq, dv): the forward output the backward's
    ``D = rowsum(dO O)`` reads (FA4's own rounded O: radius 0). ``lse_mid +- lse_rad`` (lq,): the
    forward LSE it reads (natural log; FA4's own: radius 0; ``-inf`` rows have no visible key).
    ``keep`` (lq, lk): the visible pairs. ``softcap``: FA4's built-in softcap (0: none).
    ``score``: a score_mod pair as ``(ref(x), grad(x), err(x, y), lipschitz, curvature)`` on this
    block's ``x = S scale`` (DERIVATIONS.md#score-mod). ``bs``: the BudgetSet (its stage budgets
    and constants are the model). ``exact``: the exact ``(O, LSE)`` of the block; then also the
    exact P and the magnitudes of the exact dS's terms (``p_ex``, ``ds_mag``). ``lse_self``
    (lq,): Note [Same S in both passes]: the LSE is the kernel's own and lies within
    ``lse_self`` (natural log) of the log-sum-exp of the very scores the backward recomputes
    (with ``sink``, the head's learnable sink logit, in its sum); then P is also bounded through
    the softmax of those scores. ``n_blocks`` (lq,): the forward's KV blocks per row; with it and
    ``lse_self``, where the budgets carry ``fwd_lse_chain = 1``, the dominant key of a one-hot row
    is also bounded through FA4's LSE chain (Note [One-hot LSE chain], :func:`one_hot_chain`).
    ``s_kernel`` (lq, lk): the kernel's own fp32 scores ``Q K^T`` computed with the tensor core's
    arithmetic (Note [SM90 MMA model], ``kernels/twin/tensor_core.py``); where a score lies inside
    the rigorous enclosure it is that point: a verdict then rests on the model (recorded bit for bit
    on an H200, re-measured by the audit's ``tensor_core.mma``), not on the worst case alone.
    ``dlse`` (lq,): a gradient through the returned LSE: the kernel reads ``D' = RN(D - dLSE)``
    as D (Note [The composed budgets with dLSE], fa4verify/judge/stats.py).

    Note [P before dO]: everything up to the cast P (the scores, the factor of a softcap or
    score_mod, P and its cast, the exact P) reads neither ``dout``, ``o_mid``, ``o_rad`` nor
    ``dlse``: :func:`pair_p` computes that part, and ``p_part`` (its result for the same block,
    LSE and mask) lets the passes of one call that differ only in dO or dLSE (the driver's, the
    dLSE pass, a loss through the LSE alone) share it instead of computing it again."""
    pp = p_part if p_part is not None else pair_p(
        bs, q=q, k=k, lse_mid=lse_mid, lse_rad=lse_rad, keep=keep, scale=scale, softcap=softcap, score=score,
        exact=exact, lse_self=lse_self, sink=sink, n_blocks=n_blocks, s_kernel=s_kernel)
    return _pair_ds(bs, pp, v=v, dout=dout, o_mid=o_mid, o_rad=o_rad, exact=exact, dlse=dlse)


@dataclass
class PairP:
    """The part of :func:`pair_intervals` before dO enters (Note [P before dO]): per pair the
    kernel's P ``[p_lo, p_hi]`` and its cast ``[pc_lo, pc_hi]`` (both 0 on pairs FA4 masks or
    whose LSE is +inf: ``vis`` False), the softcap / score_mod factor ``[f_lo, f_hi]`` (None
    without), and with ``exact``: the exact P ``p_ex``, the factor's size ``f_abs`` and, with a
    factor, ``f_drop = (where, |f_ex|)``: the pairs whose factor interval holds 0 (a correct kernel
    may drop them) and the exact factor's size."""
    p_lo: np.ndarray
    p_hi: np.ndarray
    pc_lo: np.ndarray
    pc_hi: np.ndarray
    vis: np.ndarray
    f_lo: Optional[np.ndarray] = None
    f_hi: Optional[np.ndarray] = None
    p_ex: Optional[np.ndarray] = None
    f_abs: Any = 1.0
    f_drop: Optional[tuple[np.ndarray, np.ndarray]] = None

    @property
    def nbytes(self) -> int:
        parts = (self.p_lo, self.p_hi, self.pc_lo, self.pc_hi, self.vis, self.f_lo, self.f_hi, self.p_ex, self.f_abs,
                 *(self.f_drop or ()))
        return int(sum(x.nbytes for x in parts if isinstance(x, np.ndarray)))


def pair_p(bs: Any, *, q: np.ndarray, k: np.ndarray, lse_mid: np.ndarray, lse_rad: np.ndarray, keep: np.ndarray,
           scale: float, softcap: float = 0.0, score: Optional[tuple[Callable, Callable, Callable, float, float]] = None,
           exact: Optional[tuple[np.ndarray, np.ndarray]] = None, lse_self: Optional[np.ndarray] = None,
           sink: Any = None, n_blocks: Optional[np.ndarray] = None,
           s_kernel: Optional[np.ndarray] = None) -> PairP:
    """The P part of :func:`pair_intervals` (Note [P before dO]); its arguments are that
    function's, with the same meaning."""
    C = bs.constants
    u = C["u_fp32"]
    d = q.shape[-1]
    keep = np.asarray(keep, bool)
    # the sink logit of each row (a stack's blocks may be of different heads)
    sink_r = None if sink is None else np.broadcast_to(np.asarray(sink, np.float64)[..., None], keep.shape[:-1])
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        # ---- S = Q K^T (fp32 MMA, any order): bwd_s_accum, plus the float64 evaluation
        S_ex = q @ np.swapaxes(k, -1, -2)
        A = np.abs(q) @ np.swapaxes(np.abs(k), -1, -2)
        rS = np.asarray(bs.evaluate("bwd_s_accum", {"d": float(d), "abs_qk": A}), np.float64) + SLACK * A
        S = S_ex
        if s_kernel is not None:
            # Note [SM90 MMA model]: the scores the kernel's tensor core computes, a point each
            # where inside the rigorous enclosure (as the model's always are; outside it the model
            # cannot be the hardware's, and the enclosure stays)
            sk = np.asarray(s_kernel, np.float64)
            inside = np.abs(sk - S_ex) <= rS
            S = np.where(inside, sk, S_ex)
            rS = np.where(inside, SLACK * np.abs(sk), rS)
        # ---- the exponent argument's operand y (natural-log units) and the derivative factor f
        f_lo = f_hi = sat = gm = None
        if softcap > 0:
            cap = float(softcap)
            xs_lo, xs_hi = (S - rS) * scale, (S + rS) * scale
            t_lo, t_hi = np.tanh(xs_lo / cap), np.tanh(xs_hi / cap)
            y_lo, y_hi = cap * t_lo, cap * t_hi
            y_abs = np.maximum(np.abs(y_lo), np.abs(y_hi))
            x_abs = np.maximum(np.abs(xs_lo), np.abs(xs_hi))
            e_sc = np.asarray(bs.evaluate("softcap", {"abs_out": y_abs, "abs_score": x_abs}), np.float64)
            # (+ u |x|: RN(scale) in the argument; |d(cap tanh(x / cap))/dx| <= 1)
            y_mid, y_rad = (y_lo + y_hi) / 2, (y_hi - y_lo) / 2 + e_sc + u * x_abs + SLACK * y_abs
            # f = RN(1 - RN(th^2)), th = tanh.approx(RN(RN(S RN(scale)) / cap)) (FA4's
            # create_softcap_scoremod_bwd on the pre-mod scores): the argument's roundings, the
            # scale's and the division's (gamma(4): room for an approximate division), MUFU tanh
            # (tanh_rel), then two fp32 roundings
            g2 = float(_gamma(4, u))
            arg_lo = np.minimum(xs_lo * (1 - g2), xs_lo * (1 + g2)) / cap
            arg_hi = np.maximum(xs_hi * (1 - g2), xs_hi * (1 + g2)) / cap
            a_lo, a_hi = np.tanh(arg_lo), np.tanh(arg_hi)
            # (not clipped at 1: a relative tanh_rel error may carry a saturated tanh past 1)
            th_max = np.maximum(np.abs(a_lo), np.abs(a_hi)) * (1 + C["tanh_rel"])
            straddle = (a_lo <= 0) & (a_hi >= 0)
            th_min = np.where(straddle, 0.0, np.minimum(np.abs(a_lo), np.abs(a_hi)) * (1 - C["tanh_rel"]))
            if "tanh_abs1" in C and "tanh_sat" in C:
                # Note [MUFU tanh envelope] (kernels/probes/probe_mufu_tanh.py): the GPU's tanh
                # measured on every fp32 input (the audit's mufu.tanh re-measures it): |th| <= 1,
                # |th - tanh(a)| <= tanh_abs1 at |a| >= 1, th = +-1 exactly at |a| >= tanh_sat,
                # where f = 1 - th th is 0 exactly
                amin = np.where(straddle, 0.0, np.minimum(np.abs(arg_lo), np.abs(arg_hi)))
                amax = np.maximum(np.abs(arg_lo), np.abs(arg_hi))
                big = amin >= 1.0
                th_max = np.minimum(np.where(big, np.minimum(th_max, np.tanh(amax) + C["tanh_abs1"]), th_max), 1.0)
                th_min = np.where(big, np.maximum(th_min, np.tanh(amin) - C["tanh_abs1"]), th_min)
                sat = amin >= C["tanh_sat"]
            # (gamma(2) on each side, not u: room for an implementation that forms th^2 from the
            # rounded softcapped score, (y / cap)^2, with two more fp32 roundings)
            g2r = float(_gamma(2, u))
            f_lo = (1 - th_max * th_max * (1 + g2r)) * (1 - g2r) - SLACK
            f_hi = (1 - th_min * th_min * (1 - g2r)) * (1 + g2r) + SLACK
            if sat is not None:
                f_lo, f_hi = np.where(sat, 0.0, f_lo), np.where(sat, 0.0, f_hi)
                # the softcapped score itself: th = +-1 exactly, so y~ = RN(cap) th = +-RN(cap)
                # exactly (FA4: softcap_val * tanh(scores), the cap a Float32 constant)
                cap32 = float(np.float32(cap))
                y_mid = np.where(sat, np.sign(arg_lo) * cap32, y_mid)
                y_rad = np.where(sat, 0.0, y_rad)
        elif score is not None:
            ref, grad, err, lip, curv = score
            xm, xr = S * scale, rS * scale
            y_mid = np.broadcast_to(np.asarray(ref(xm), np.float64), S.shape)
            y_rad = lip * xr + u * np.abs(xm) * lip + np.asarray(err(xm, y_mid), np.float64) \
                + SLACK * (np.abs(y_mid) + lip * np.abs(xm))
            gm = np.broadcast_to(np.asarray(grad(xm), np.float64), S.shape)
            gr = curv * (xr + u * np.abs(xm)) + SLACK * np.abs(gm)
            f_lo, f_hi = gm - gr, gm + gr
        else:
            y_mid, y_rad = S * scale, (rS + SLACK * np.abs(S)) * scale
        # the exact scores (of the exact S) for p_ex below
        if softcap > 0:
            y_ex = float(softcap) * np.tanh(S_ex * scale / float(softcap))
        elif score is not None:
            y_ex = np.broadcast_to(np.asarray(score[0](S_ex * scale), np.float64), S.shape)
        else:
            y_ex = S_ex * scale
        c = _LOG2E
        # ---- x = fma(y, c, -RN(lse RN(log2 e))): bwd_exp_arg (its gamma(3)|S c| covers c = RN(...)).
        # FA4's preprocess writes lse_log2 = 0 where lse = -inf; lse = +inf gives x = -inf, P = 0
        # exactly (FA4 computes the same); a NaN LSE leaves NaN (the budget defines nothing there)
        lse_mid = np.asarray(lse_mid, np.float64)
        pos = np.isposinf(lse_mid)[..., None]
        L = np.where(np.isneginf(lse_mid) | np.isposinf(lse_mid), 0.0, lse_mid)[..., None]
        Lr = np.where(np.isinf(lse_mid), 0.0, lse_rad)[..., None]
        x_mid = y_mid * c - L * c
        x_rad0 = y_rad * c + Lr * c
        rx = np.asarray(bs.evaluate("bwd_exp_arg", {
            "abs_sc": (np.abs(y_mid) + y_rad) * c, "abs_lse2": (np.abs(L) + Lr) * c,
            "abs_x": np.abs(x_mid) + x_rad0}), np.float64)
        x_rad = x_rad0 + rx + SLACK * (np.abs(y_mid) + np.abs(L)) * c
        # ---- P = ex2.approx.ftz(x): relative (mufu_ex2_rel + u) on normal results, 0 below 2^-126
        m = C["mufu_ex2_rel"] + u
        p_hi = np.exp2(x_mid + x_rad) * (1 + m) * WIDEN
        p_lo = np.exp2(x_mid - x_rad) * (1 - m) / WIDEN
        if lse_self is not None:
            # Note [Same S in both passes]: x~ = (y~ - L) c within rx, L = LSE(y~) + eta, |eta| <=
            # lse_self, y~ in [y_mid - y_rad, y_mid + y_rad] (the same y~ in L's sum): y~ - LSE(y~)
            # is the log-softmax of y~, bounded over that box by its corners
            a_lo = np.where(keep, y_mid - y_rad, -np.inf)
            a_hi = np.where(keep, y_mid + y_rad, -np.inf)
            with np.errstate(invalid="ignore", over="ignore"):
                ls_hi = a_hi - np.logaddexp(a_hi, _loo_lse(a_lo, sink_r))
                ls_lo = a_lo - np.logaddexp(a_lo, _loo_lse(a_hi, sink_r))
                eta = np.asarray(lse_self, np.float64)[..., None]
                sink_abs = 0.0 if sink_r is None else np.where(np.isneginf(sink_r), 0.0, np.abs(sink_r))[..., None]
                slack = SLACK * (np.abs(y_mid) + y_rad + np.abs(L) + sink_abs)
                s_hi = np.exp2((ls_hi + eta + slack) * c + rx) * (1 + m) * WIDEN
                s_lo = np.exp2((ls_lo - eta - slack) * c - rx) * (1 - m) / WIDEN
            use = keep & np.isfinite(eta) & ~np.isnan(s_hi) & ~np.isnan(s_lo)
            p_hi = np.where(use, np.minimum(p_hi, s_hi), p_hi)
            p_lo = np.where(use, np.maximum(p_lo, s_lo), p_lo)
            if C.get("fwd_lse_chain") == 1 and n_blocks is not None:
                # Note [One-hot LSE chain]: the dominant key of a one-hot row through FA4's SM90
                # LSE chain, every rounding explicit (only where the LSE is the kernel's own)
                mod = softcap > 0 or score is not None
                if mod:
                    mb_lo, mb_hi = y_mid - y_rad, y_mid + y_rad
                else:
                    rs_ = rS + SLACK * np.abs(S)
                    mb_lo, mb_hi = S - rs_, S + rs_
                kappas = chain_kappa(scale, mod)
                own = np.isfinite(np.asarray(lse_self, np.float64)) & (np.asarray(lse_rad) == 0) & ~np.isinf(lse_mid)
                # (the chain is row by row: a stack of blocks is one block of all their rows)
                lk_, rows_ = keep.shape[-1], keep.shape[:-1]
                flat2 = lambda x: np.ascontiguousarray(np.broadcast_to(x, keep.shape)).reshape(-1, lk_)  # noqa: E731
                rr, cc, c_lo, c_hi = one_hot_chain(
                    flat2(mb_lo), flat2(mb_hi), flat2(keep & own[..., None]), kappas,
                    np.broadcast_to(lse_mid, rows_).reshape(-1),
                    None if sink_r is None else sink_r.reshape(-1),
                    np.broadcast_to(np.asarray(n_blocks, np.float64), rows_).reshape(-1), C)
                p_lo, p_hi = np.ascontiguousarray(p_lo), np.ascontiguousarray(p_hi)
                plo2, phi2 = p_lo.reshape(-1, lk_), p_hi.reshape(-1, lk_)
                fits = (c_lo <= phi2[rr, cc]) & (c_hi >= plo2[rr, cc])
                rr, cc = rr[fits], cc[fits]
                plo2[rr, cc] = np.maximum(plo2[rr, cc], c_lo[fits])
                phi2[rr, cc] = np.minimum(phi2[rr, cc], c_hi[fits])
        p_lo = np.where(p_lo >= _FTZ, p_lo, 0.0)
        vis = keep & ~pos
        p_lo = np.where(vis, p_lo, 0.0)
        p_hi = np.where(vis, p_hi, 0.0)
        # ---- the dV operand RN_p(P): bwd_p_cast (monotone, >= 0)
        pc_lo = np.maximum(p_lo - np.asarray(bs.evaluate("bwd_p_cast", {"p": p_lo}), np.float64), 0.0)
        pc_hi = p_hi + np.asarray(bs.evaluate("bwd_p_cast", {"p": p_hi}), np.float64)
        p_ex = f_drop = None
        f_abs: Any = 1.0
        if exact is not None:
            # the exact softmax of the exact scores (y_ex: of the exact S)
            lse_ex = np.asarray(exact[1], np.float64)
            ok = keep & np.isfinite(lse_ex)[..., None]
            p_ex = np.where(ok, np.exp(np.where(ok, y_ex - np.where(np.isfinite(lse_ex), lse_ex, 0.0)[..., None],
                                                -np.inf)), 0.0)
            f_abs = 1.0 if f_lo is None else np.abs(f_lo + f_hi) / 2
            if f_lo is not None:
                # where the model admits a factor of 0 (a saturated softcap: the GPU's tanh is +-1,
                # or within its error of it; a score_mod whose gradient interval holds 0), a
                # correct kernel may drop the pair's exact dS, whose factor is f at the exact scores
                # (1 - tanh^2 = sech^2 = 4 e^-2|a| / (1 + e^-2|a|)^2: no cancellation where tanh ~ 1;
                # a score_mod: its gradient at the exact scores)
                if softcap > 0:
                    e2 = np.exp(-2 * np.abs(S_ex * scale / float(softcap)))
                    f_ex = 4 * e2 / (1 + e2) ** 2
                else:
                    f_ex = np.broadcast_to(np.asarray(score[1](S_ex * scale), np.float64), S.shape)
                f_drop = ((f_lo <= 0) & (f_hi >= 0), np.abs(f_ex))
    return PairP(p_lo, p_hi, pc_lo, pc_hi, vis, f_lo, f_hi, p_ex, f_abs, f_drop)


def _pair_ds(bs: Any, pp: PairP, *, v: np.ndarray, dout: np.ndarray, o_mid: np.ndarray, o_rad: np.ndarray,
             exact: Optional[tuple[np.ndarray, np.ndarray]], dlse: Optional[np.ndarray]) -> PairIntervals:
    """The dO part of :func:`pair_intervals` from its P part ``pp`` (Note [P before dO])."""
    C = bs.constants
    u = C["u_fp32"]
    dv = v.shape[-1]
    p_lo, p_hi, vis, f_lo, f_hi = pp.p_lo, pp.p_hi, pp.vis, pp.f_lo, pp.f_hi
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        # ---- t = RN(dP - D): dp_accum, d_pre (D from the given O), one fp32 rounding
        dP = dout @ np.swapaxes(v, -1, -2)
        DOV = np.abs(dout) @ np.swapaxes(np.abs(v), -1, -2)
        rdP = np.asarray(bs.evaluate("dp_accum", {"dv": float(dv), "abs_dov": DOV}), np.float64) + SLACK * DOV
        Dm = np.sum(o_mid * dout, axis=-1)
        abs_od = np.sum((np.abs(o_mid) + o_rad) * np.abs(dout), axis=-1)
        rD = np.sum(o_rad * np.abs(dout), axis=-1) \
            + np.asarray(bs.evaluate("d_pre", {"dv": float(dv), "abs_od": abs_od}), np.float64) + SLACK * abs_od
        adl = 0.0
        if dlse is not None:
            # a gradient through the LSE: the preprocess's D' = RN(D - dLSE) (dLSE an exact fp32
            # value), one more fp32 rounding of a value within |D| + rD + |dLSE|
            dl = np.asarray(dlse, np.float64)
            adl = np.abs(dl)
            rD = rD + u * (abs_od + rD + adl) + SLACK * adl
            Dm = Dm - dl
        t_mid = dP - Dm[..., None]
        t_rad = rdP + rD[..., None] + SLACK * (DOV + abs_od[..., None])
        t_lo, t_hi = _round_iv(t_mid - t_rad, t_mid + t_rad, u)
        # ---- dS = RN(P t) (stage ds: the product's rounding; t's is above), times f, cast
        ds_lo, ds_hi = _mul_iv(p_lo, p_hi, t_lo, t_hi)
        ds_lo, ds_hi = _round_iv(ds_lo, ds_hi, u, C["sub_fp32"])
        if f_lo is not None:
            ds_lo, ds_hi = _mul_iv(ds_lo, ds_hi, f_lo, f_hi)
            ds_lo, ds_hi = _round_iv(ds_lo, ds_hi, u, C["sub_fp32"])
        ds_lo, ds_hi = _round_iv(ds_lo, ds_hi, C["u_p"], C["p_sub"])
        ds_lo, ds_hi = ds_lo - SLACK * np.abs(ds_lo), ds_hi + SLACK * np.abs(ds_hi)
        ds_lo = np.where(vis, ds_lo, 0.0)
        ds_hi = np.where(vis, ds_hi, 0.0)
        p_ex = ds_mag = ds_drop = None
        if exact is not None:
            # the size of the exact dS = P (dP - D) f before anything cancels (dP = dO V and D =
            # O dO in absolute values)
            o_ex = np.asarray(exact[0], np.float64)
            p_ex = pp.p_ex
            terms = p_ex * (DOV + (np.sum(np.abs(o_ex * dout), axis=-1) + adl)[..., None])
            ds_mag = terms * pp.f_abs
            ds_drop = (np.zeros_like(terms) if pp.f_drop is None
                       else np.where(pp.f_drop[0], terms * pp.f_drop[1], 0.0))
    return PairIntervals(pp.pc_lo, pp.pc_hi, ds_lo, ds_hi, p_ex, ds_mag, ds_drop)


def accumulate(lo: np.ndarray, hi: np.ndarray, B: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``sum_j X_ij B_jd`` for ``X`` in ``[lo, hi]`` (exact arithmetic): (midpoint, radius,
    magnitude ``sum_j max|X_ij| |B_jd|``) in float64, the radius outward (Rump's
    midpoint-radius product; the float64 error of the products is inside :data:`SLACK`)."""
    with np.errstate(invalid="ignore", over="ignore"):
        mid = (lo + hi) / 2
        rad = (hi - lo) / 2
        aB = np.abs(B)
        mag = (np.abs(mid) + rad) @ aB
        return mid @ B, rad @ aB + SLACK * mag, mag


def finish(mid: np.ndarray, rad: np.ndarray, mag: np.ndarray, n_terms, bs: Any, *, scale: Optional[float],
           cast: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's gradient as an interval ``(mid, rad)`` from the exact sum's enclosure: the fp32
    accumulation of ``n_terms`` terms (``gamma(n_terms, u) * mag``, any order), then
    ``RN(acc * RN(scale))`` (``gamma(2, u)``; none when ``scale`` is None: dV) and the cast to the
    output dtype (``u_out``, ``out_sub``) when ``cast``."""
    C = bs.constants
    u = C["u_fp32"]
    with np.errstate(invalid="ignore", over="ignore"):
        rad = rad + _gamma(n_terms, u) * mag
        if scale is not None:
            mid = mid * scale
            rad = rad * scale + _gamma(2, u) * (np.abs(mid) + rad * scale)
        if cast:
            rad = rad + C["u_out"] * (np.abs(mid) + rad) + C["out_sub"]
        return mid, rad * WIDEN


#: the learnable sink's dtype -> (unit roundoff, half the smallest subnormal spacing) of dsink's store
SINK_STORE: dict[str, tuple[float, float]] = {"fp32": (2.0 ** -24, 0.0), "bf16": (2.0 ** -8, 0.0),
                                             "fp16": (2.0 ** -11, 2.0 ** -25)}


def dsink_given_forward(sink: np.ndarray, lse: np.ndarray, dout: np.ndarray, out: np.ndarray,
                        C: Any, dlse: Optional[np.ndarray] = None, sink_dtype: str = "fp32"
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Note [dsink given the forward] (DERIVATIONS.md#dsink): the learnable sink's gradient FA4's
    backward must return, from the forward outputs it read, and a rigorous allowance.

    FA4 (``flash_bwd_postprocess.py`` ``dsink_row_term``; 4.0.0b36) sums, per query head ``h`` in
    fp32 over every query row ``i`` of every sequence, ``-p_i D_i`` with ``p_i =
    ex2.approx.ftz(RN(RN(sink_h - lse_i) RN(log2 e)))`` (1 exactly where ``lse_i = -inf``) and ``D_i``
    the preprocess's fp32 ``rowsum(dO * O)``. ``lse`` and ``out`` are the LSE (natural log, fp32)
    and O FA4's forward returned and its backward read, ``dout`` the upstream gradient; layouts
    FA4's: ``lse`` (B, H, S) with ``out``/``dout`` (B, S, H, d), or varlen ``lse`` (H, T) with
    (T, H, d). Returns ``(ref, allow)`` per head: ``ref_h = -sum_i exp(sink_h - lse_i) D_i`` in
    float64 with ``D_i = sum_d dO O`` exact (bf16 products, float64 sums of at most 2^16 terms:
    their error is in ``allow``), and ``allow_h`` bounding ``|dsink_h - ref_h|`` for every order of
    FA4's fp32 sums. ``dlse`` (the LSE's layout, fp32 values): a gradient through the returned
    LSE; FA4's ``D_i`` is then the preprocess's ``RN(D_i - dLSE_i)``. ``sink_dtype``: the dtype of
    the learnable sink, which FA4 writes dsink in (``torch.empty_like(learnable_sink)``): the fp32
    sum's store rounds to it (:data:`SINK_STORE`). ``ValueError`` when the layouts do not fit; NaN
    in ``allow`` where an LSE is NaN (nothing defined)."""
    if sink_dtype not in SINK_STORE:
        raise ValueError(f"dsink: sink dtype {sink_dtype!r} (expected one of {sorted(SINK_STORE)})")
    u_store, sub_store = SINK_STORE[sink_dtype]
    u, mufu, tiny = float(C["u_fp32"]), float(C["mufu_ex2_rel"]), float(C["f32_min_normal"])
    lse = np.asarray(lse, np.float64)
    o = np.asarray(out, np.float64)
    do = np.asarray(dout, np.float64)
    if lse.ndim == 3 and o.ndim == 4 and o.shape[:3] == (lse.shape[0], lse.shape[2], lse.shape[1]):
        H = lse.shape[1]                              # rows of head h in (batch, row) order
        L = np.moveaxis(lse, 1, 0).reshape(H, -1)
        O, dO = (np.moveaxis(x, 2, 0).reshape(H, -1, x.shape[-1]) for x in (o, do))
    elif lse.ndim == 2 and o.ndim == 3 and o.shape[:2] == (lse.shape[1], lse.shape[0]):
        L = lse
        O, dO = (np.moveaxis(x, 1, 0) for x in (o, do))
    else:
        raise ValueError(f"dsink: LSE {lse.shape} and O {o.shape} are not FA4 layouts of one problem")
    sink = np.asarray(sink, np.float64).reshape(-1)
    if sink.shape[0] != L.shape[0] or dO.shape != O.shape:
        raise ValueError(f"dsink: {sink.shape[0]} sinks for {L.shape[0]} heads, dO {dO.shape} vs O {O.shape}")
    d = O.shape[-1]
    D = np.einsum("hnd,hnd->hn", dO, O)
    Dmag = np.einsum("hnd,hnd->hn", np.abs(dO), np.abs(O))
    # FA4's D_i: an fp32 sum of d exact products (16-bit x 16-bit) in some order. (FA4's O residual,
    # D from O + O_lo, runs only where the caller passes o_lo -- its sparse-KV MLA path, never
    # fa4verify's calls: a release that formed D from its fp32 O by default would fail here.)
    dD = float(_gamma(d, u)) * Dmag + float(_gamma(2 * d, 2.0 ** -53)) * Dmag
    if dlse is not None:
        dl = np.asarray(dlse, np.float64)
        if dl.shape != lse.shape:
            raise ValueError(f"dsink: dLSE {dl.shape} is not the LSE's layout {lse.shape}")
        dl = np.moveaxis(dl, 1, 0).reshape(L.shape) if dl.ndim == 3 else dl
        # D' = RN(D - dLSE) in fp32 (and the float64 reference's own subtraction)
        dD = dD + (u + 2.0 ** -53) * (np.abs(D) + dD + np.abs(dl))
        D = D - dl
    with np.errstate(over="ignore", invalid="ignore"):
        arg = sink[:, None] - L                       # natural-log units
        p = np.where(L == -np.inf, 1.0, np.exp(arg))  # exp(-inf) = 0 where lse = +inf
        x = np.where(np.isfinite(arg), np.abs(arg) * (1.0 / math.log(2.0)), 0.0)    # |exponent| in log2 units
        # three fp32 roundings in the exponent (sub, RN(log2 e), mul) and MUFU's relative error
        eps = np.where(L == -np.inf, 0.0, (1 + mufu) * np.exp2(float(_gamma(3, u)) * x) - 1)
        p_hi = p * (1 + eps)
        Dhi = np.abs(D) + dD
        term = (p * np.abs(D) * eps + p_hi * dD          # |p^ D^ - p D|
                + tiny * Dhi                             # ftz of p^ below 2^-126
                + u * p_hi * Dhi + tiny)                 # the product's rounding (and its ftz)
        n = L.shape[1]
        absum = (p_hi * Dhi * (1 + u) + tiny).sum(axis=1)
        g_sum = float(_gamma(max(n - 1, 1), u))
        allow = term.sum(axis=1) + g_sum * absum + float(_gamma(n + 1, 2.0 ** -53)) * absum \
            + u_store * (1 + g_sum) * absum + sub_store        # fp32 sum; float64 ref; the store in the sink's dtype
        ref = -np.array([math.fsum(r) for r in (p * D)])
    allow = np.where(np.isnan(L).any(axis=1), np.nan, allow)
    return ref, allow
