"""Judging FA4's backward stage by stage on production (the subject side is
``fa4verify.kernels.stage_taps``).

Each tapped buffer is judged against its own budget by :func:`fa4verify.judge.compare`
(error_budgets/DERIVATIONS.md#dq-accum-tap):

* ``D`` (preprocess ``dpsum``) -- stage ``d_pre`` against the exact ``rowsum(dO * O)`` of FA4's
  rounded forward output;
* ``D'`` with a gradient through the returned LSE (``dlse``) -- stage ``d_pre_dlse`` against the
  exact ``rowsum(dO * O) - dLSE`` (:func:`judge_dlse_tap`; FA4 applies dLSE there and nowhere
  else: the main kernel reads D' as D);
* ``lse_log2`` -- stage ``lse_log2`` against ``lse * log2 e`` of FA4's own fp32 LSE (0 where
  the LSE is -inf);
* ``dq_accum_zeroed`` -- the preprocess's zeroing, exactly;
* ``dq_accum`` -- ``backward_dq_accum / scale`` against the oracle ``dQ / scale``;
* ``dq_post`` -- the output dQ against ``dq_accum * RN(scale)`` (stage ``dq_post``).

Arrays are numpy, FA4 layouts: out (b, s, h, dv), lse/dpsum/lse_log2 (b, h, s[_rounded]),
dq_accum (b, s, h, d) as decoded by ``BackwardTaps.dq_accum_logical``. Dense (non-varlen) only.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from fa4verify.judge.verdict import Verdict, compare

__all__ = ["tap_references", "judge_taps", "judge_dlse_tap", "TAP_TENSORS"]

TAP_TENSORS = ("D", "lse_log2", "dq_accum_zeroed", "dq_accum", "dq_post")
_U64 = 2.0 ** -53


def _gamma(n: float, u: float) -> float:
    return n * u / (1 - n * u)


def tap_references(problem, a: Mapping[str, Any], out, lse, *, budgets, backward) -> dict[str, tuple]:
    """``{tensor: (reference, oracle_bound, budget)}`` for the tapped tensors. ``out``/``lse``:
    FA4's forward outputs (the stage-local inputs of D and lse_log2); ``backward``: a
    :class:`fa4verify.judge.BackwardJudgement` of the same problem (its oracle and allowances);
    ``budgets``: the BudgetSet."""
    dv = int(np.shape(out)[-1])
    O = np.asarray(out, np.float64)
    dO = np.asarray(a["dout"], np.float64)
    prod = O * dO
    d_ref = np.transpose(prod.sum(-1), (0, 2, 1))           # (b, h, s)
    abs_od = np.transpose(np.abs(prod).sum(-1), (0, 2, 1))
    d_budget = budgets.evaluate("d_pre", {"dv": float(dv), "abs_od": abs_od})
    refs: dict[str, tuple] = {"D": (d_ref, _gamma(dv, _U64) * abs_od, d_budget)}
    lse64 = np.asarray(lse, np.float64)
    with np.errstate(invalid="ignore"):
        l2 = np.where(np.isneginf(lse64), 0.0, lse64 * math.log2(math.e))
    refs["lse_log2"] = (l2, 2 * _U64 * np.abs(l2), budgets.evaluate("lse_log2", {"abs_lse2": np.abs(l2)}))
    scale = problem.softmax_scale if problem.softmax_scale is not None else 1.0 / math.sqrt(problem.head_dim)
    ob = backward.oracle
    refs["dq_accum"] = (np.asarray(ob.dq, np.float64) / scale, np.asarray(ob.dq_bound, np.float64) / scale,
                        np.asarray(backward.budgets["dq_accum"], np.float64) / scale)
    return refs


def judge_dlse_tap(problem, a: Mapping[str, Any], out, dpsum, dlse, *, budgets) -> Verdict:
    """``D_dlse``: the tapped ``dpsum`` of a backward given ``dlse`` ((b, h, s) fp32 values)
    against ``rowsum(dO * O) - dLSE`` within ``d_pre_dlse`` (DERIVATIONS.md#dq-accum-tap); ``out``:
    FA4's forward output the backward read."""
    dv = int(np.shape(out)[-1])
    prod = np.asarray(out, np.float64) * np.asarray(a["dout"], np.float64)
    dl = np.asarray(dlse, np.float64)
    ref = np.transpose(prod.sum(-1), (0, 2, 1)) - dl
    abs_od = np.transpose(np.abs(prod).sum(-1), (0, 2, 1))
    bound = _gamma(dv + 1, _U64) * (abs_od + np.abs(dl))
    budget = budgets.evaluate("d_pre_dlse", {"dv": float(dv), "abs_od": abs_od, "abs_dlse": np.abs(dl)})
    if dpsum is None:
        return Verdict("D_dlse", "undecided", 0, 0, int(np.size(ref)), 0.0, 0.0, None, (), "not captured")
    got = np.asarray(dpsum, np.float64)[..., :int(problem.seqlen_q)]
    return compare("D_dlse", got, ref, oracle_bound=bound, budget=budget)


def judge_taps(problem, a: Mapping[str, Any], out, lse, taps: Mapping[str, Any], *, budgets,
               backward, dq=None) -> dict[str, Verdict]:
    """Verdicts on the tapped buffers (``taps``: "dpsum", "lse_log2", "dq_accum_zeroed",
    "dq_accum" numpy arrays; a missing one is undecided). With the call's output ``dq`` (FA4
    layout (b, s, h, d)) also ``dq_post``: dQ against ``dq_accum * RN(scale)`` of the tapped
    accumulator (DERIVATIONS.md#dq-accum-tap)."""
    refs = tap_references(problem, a, out, lse, budgets=budgets, backward=backward)
    s = int(problem.seqlen_q)
    got = {"D": taps.get("dpsum"), "lse_log2": taps.get("lse_log2"), "dq_accum": taps.get("dq_accum")}
    vs: dict[str, Verdict] = {}
    for n in ("D", "lse_log2", "dq_accum"):
        g = got[n]
        ref, ob, bu = refs[n]
        if g is None:
            vs[n] = Verdict(n, "undecided", 0, 0, int(np.size(ref)), 0.0, 0.0, None, (), "not captured")
            continue
        g = np.asarray(g, np.float64)
        if n != "dq_accum":
            g = g[..., :s]
        vs[n] = compare(n, g, ref, oracle_bound=ob, budget=bu)
    if dq is not None:
        acc = got["dq_accum"]
        if acc is None:
            vs["dq_post"] = Verdict("dq_post", "undecided", 0, 0, int(np.size(dq)), 0.0, 0.0, None, (),
                                    "dq_accum not captured")
        else:
            scale = problem.softmax_scale if problem.softmax_scale is not None else 1.0 / math.sqrt(problem.head_dim)
            ref = np.asarray(acc, np.float64) * float(np.float32(scale))
            # the reference is the kernel's own accumulator: where it is NaN the postprocess
            # must give NaN (nan="match"), not an undecided "oracle NaN" (seen on the H200: an
            # accumulator a known FA4 issue filled with NaN made the whole audit undecided)
            vs["dq_post"] = compare("dq_post", dq, ref, nan="match",
                                    budget=budgets.evaluate("dq_post", {"abs_sdq": np.abs(ref)}))
    z = taps.get("dq_accum_zeroed")
    if z is None:
        vs["dq_accum_zeroed"] = Verdict("dq_accum_zeroed", "undecided", 0, 0, 0, 0.0, 0.0, None, (),
                                        "not captured")
    else:
        z = np.asarray(z, np.float64)
        vs["dq_accum_zeroed"] = compare("dq_accum_zeroed", z, np.zeros_like(z), budget=0.0)
    return vs
