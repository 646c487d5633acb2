"""Split-KV combine semantics and its certified float64 reference.

FA4 splits the keys of a row into ``S`` chunks, runs the forward on each (partial output ``O_s``,
natural-log ``L_s``) and merges them (``flash_fwd_combine.py``; public ``flash_attn_combine``)::

    M      = max_s L_s                      (M = -inf when every split is empty)
    LSE    = M + log sum_s exp(L_s - M)
    O      = sum_s exp(L_s - LSE) O_s        (0 when M = -inf)

For exact per-split attention (``O_s``, ``L_s`` of the keys of chunk ``s``) this *is* full
attention over all keys: ``exp(L_s - LSE)`` is the softmax mass of chunk ``s``. An empty split has
``L_s = -inf`` and weight 0 (its ``O_s`` never matters, even NaN).

:func:`combine` evaluates it in float64 with a rigorous elementwise bound
``|value - exact| <= bound`` on the exact combine of the *given* partials.

Accuracy
--------
Per row (Higham ch. 2-3, ``u = 2^-53``): ``a_s = fl(L_s - M)`` (``u |a_s|``), ``e_s = exp(a_s)``
(relative ``|a_s| u + eps_f``, ``eps_f`` = the libm assumption of :mod:`oracles.reference`),
``Z = sum e_s`` (``gamma_S``), ``w_s = fl(e_s / Z)`` (``u``), ``O = sum w_s O_s`` (``gamma_S``): the
relative error of every weight is ``<= eta = 2 (max_s |a_s| u + eps_f) + gamma_S + u`` and
``|O - O*| <= (eta + gamma_S)(1 + eta) sum_s w_s |O_s|``; ``|LSE - LSE*| <= eta + eps_f |log Z| +
u |LSE|``; everything times ``1 + 2^-30`` (bound arithmetic). Typical bound: 2^-50 x sum w|O|.

Possible issues
---------------
Non-finite ``O_s`` of a split with positive weight gives NaN with bound +inf; a NaN ``L_s`` makes
the row NaN (undefined).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .reference import EPS_F, SAFETY, U, gamma

__all__ = ["CombineResult", "combine", "combine_mp"]


@dataclass(frozen=True)
class CombineResult:
    out: np.ndarray          #: (..., d) float64
    lse: np.ndarray          #: (...,) float64
    bound: np.ndarray        #: (..., d) absolute bound on out
    lse_bound: np.ndarray    #: (...,) absolute bound on lse
    weights: np.ndarray      #: (S, ...) float64 softmax mass of each split


def combine(out_partial, lse_partial) -> CombineResult:
    """Exact-combine reference of ``out_partial`` (S, ..., d) and ``lse_partial`` (S, ...)
    (any float dtype, read exactly as float64)."""
    O = np.asarray(out_partial, np.float64)
    L = np.asarray(lse_partial, np.float64)
    if O.shape[:-1] != L.shape:
        raise ValueError(f"out_partial {O.shape} and lse_partial {L.shape} disagree")
    S = L.shape[0]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        M = L.max(axis=0)
        empty = ~(M > -np.inf)
        Ms = np.where(empty, 0.0, M)
        a = L - Ms
        e = np.exp(a)
        Z = e.sum(axis=0)
        w = np.where(empty, 0.0, e / np.where(empty, 1.0, Z))
        amax = np.where(np.isfinite(a), np.abs(a), 0.0).max(axis=0)
        eta = 2 * (amax * U + EPS_F) + gamma(S) + U
        pos = w > 0
        contrib = np.where(pos[..., None], w[..., None] * O, 0.0)
        out = contrib.sum(axis=0)
        sw = np.where(pos[..., None], w[..., None] * np.abs(O), 0.0).sum(axis=0)
        bound = (eta + gamma(S))[..., None] * (1 + eta[..., None]) * sw * SAFETY
        lse = np.where(empty, -np.inf, Ms + np.log(Z))
        lse_bound = np.where(empty, 0.0, (eta + EPS_F * np.abs(np.log(Z)) + U * np.abs(lse)) * SAFETY)
        bad = ~np.isfinite(out)
        bound = np.where(bad, np.inf, bound)
        nanrow = np.isnan(L).any(axis=0)
        lse = np.where(nanrow, np.nan, lse)
        out = np.where(nanrow[..., None], np.nan, out)
    return CombineResult(out, lse, bound, lse_bound, w)


def combine_mp(out_partial, lse_partial, bits: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """The same combine in mpmath at ``bits`` working precision (tests: the arbiter), rounded to
    float64. Slow: small arrays only."""
    import mpmath
    ctx = mpmath.MPContext()
    ctx.prec = bits
    O = np.asarray(out_partial, np.float64)
    L = np.asarray(lse_partial, np.float64)
    S = L.shape[0]
    rows = L.reshape(S, -1)
    Ov = O.reshape(S, rows.shape[1], -1)
    out = np.zeros((rows.shape[1], Ov.shape[2]))
    lse = np.zeros(rows.shape[1])
    for r in range(rows.shape[1]):
        Ls = [ctx.mpf(float(x)) if np.isfinite(x) else None for x in rows[:, r]]
        fin = [x for x in Ls if x is not None]
        if not fin:
            lse[r] = -np.inf
            continue
        M = max(fin)
        Z = ctx.fsum(ctx.exp(x - M) for x in fin)
        LSE = M + ctx.log(Z)
        lse[r] = float(LSE)
        for d in range(Ov.shape[2]):
            out[r, d] = float(ctx.fsum(ctx.exp(x - LSE) * ctx.mpf(float(Ov[s, r, d]))
                                       for s, x in enumerate(Ls) if x is not None))
    return out.reshape(O.shape[1:]), lse.reshape(L.shape[1:])
