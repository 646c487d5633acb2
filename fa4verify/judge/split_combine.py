"""Split-KV combine verdicts: the combine stage alone (local budget) and split forwards + combine
end to end (composed budget vs the full problem's oracle). Both through :func:`compare`.

* :func:`combine_statistics` -- the statistics of ``[stage.combine_out]`` / ``[stage.combine_lse]``
  from the exact combine of the given partials (``fa4verify.oracles.combine``);
* :func:`judge_combine_stage` -- a combine result (FA4's ``flash_attn_combine`` or the twin) versus
  the exact combine of the *same* partials, within the local budget;
* :func:`split_problems` -- the per-chunk problems of a dense non-causal problem whose keys are cut
  into contiguous chunks (what a split-KV forward computes per split);
* :func:`judge_split_combine` -- the combined output of per-chunk forwards versus the *full*
  problem's oracle, within the composition of error_budgets/DERIVATIONS.md#combine.

Layouts are FA4's: partial outputs ``(S, batch, seqlen_q, nheads, d)``, partial LSEs ``(S, batch,
seqlen_q, nheads)`` (``flash_attn_combine``'s), forward LSE ``(batch, nheads, seqlen_q)``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from fa4verify.problem import AttentionProblem
from fa4verify.judge.attention import forward_allowances, load_budgets
from fa4verify.judge.verdict import Verdict, compare

__all__ = ["combine_statistics", "judge_combine_stage", "split_problems", "SplitJudgement",
           "judge_split_combine"]


def combine_statistics(out_partial, lse_partial, ref=None) -> dict[str, Any]:
    """``n_splits``, ``cmb_lse_abs`` (per row, trailing axis 1), ``cmb_abs``, ``cmb_abs_o``."""
    from fa4verify.oracles import combine as oc
    ref = oc.combine(out_partial, lse_partial) if ref is None else ref
    L = np.asarray(lse_partial, np.float64)
    O = np.asarray(out_partial, np.float64)
    with np.errstate(invalid="ignore"):
        labs = np.where(np.isfinite(L), np.abs(L), 0.0).max(axis=0)
        pos = ref.weights > 0
        cabs = np.where(pos[..., None], ref.weights[..., None] * np.abs(O), 0.0).sum(axis=0)
    return {"n_splits": float(L.shape[0]), "cmb_lse_abs": labs[..., None], "cmb_abs": cabs,
            "cmb_abs_o": np.abs(ref.out)}


def judge_combine_stage(out_partial, lse_partial, out, lse, *, dtype: str, arch: str,
                        budgets: Any = None) -> tuple[Verdict, Verdict]:
    """(out, lse) verdicts of a combine result against the exact combine of the same partials
    within ``combine_out`` / ``combine_lse`` (``lse`` None: undecided)."""
    from fa4verify.oracles import combine as oc
    bs = load_budgets(dtype, arch, budgets)
    ref = oc.combine(out_partial, lse_partial)
    st = combine_statistics(out_partial, lse_partial, ref)
    with np.errstate(invalid="ignore", over="ignore"):
        bo = np.broadcast_to(bs.evaluate("combine_out", st), ref.out.shape)
        bl = np.broadcast_to(bs.evaluate("combine_lse", {**st, "cmb_lse_abs": st["cmb_lse_abs"][..., 0]}),
                             ref.lse.shape)
    vo = compare("combine_out", out, ref.out, oracle_bound=ref.bound, budget=bo)
    if lse is None:
        vl = Verdict("combine_lse", "undecided", 0, 0, int(ref.lse.size), 0.0, 0.0, None, (),
                     "the combine returned no LSE")
    else:
        vl = compare("combine_lse", lse, ref.lse, oracle_bound=ref.lse_bound, budget=bl)
    return vo, vl


def split_problems(problem: AttentionProblem, a: Mapping[str, Any], num_splits: int
                   ) -> list[tuple[AttentionProblem, dict[str, Any], tuple[int, int]]]:
    """``num_splits`` contiguous key chunks of a dense, non-causal, non-local, sink-free problem:
    ``(chunk problem, chunk arrays, (k0, k1))`` each (chunks as equal as possible, none empty)."""
    if problem.varlen or problem.causal or problem.local or problem.sink or problem.mask_mod is not None:
        raise ValueError("split_problems: dense, non-causal, non-local problems without sink or mask_mod only")
    n = problem.seqlen_k
    if not 1 <= num_splits <= n:
        raise ValueError(f"num_splits={num_splits} must be in [1, seqlen_k={n}]")
    edges = [round(i * n / num_splits) for i in range(num_splits + 1)]
    out = []
    for s in range(num_splits):
        k0, k1 = edges[s], edges[s + 1]
        p = dataclasses.replace(problem, seqlen_k=k1 - k0)
        aa = dict(a)
        aa["k"] = np.asarray(a["k"])[:, k0:k1]
        aa["v"] = np.asarray(a["v"])[:, k0:k1]
        out.append((p, aa, (k0, k1)))
    return out


@dataclasses.dataclass
class SplitJudgement:
    out: Verdict                   #: combined output vs the full oracle, composed budget
    stage: Verdict                 #: combine stage vs exact combine of the same partials
    stage_lse: Verdict
    partial_out: tuple[Verdict, ...]   #: each split's forward output vs its chunk oracle
    partial_lse: tuple[Verdict, ...]

    @property
    def verdicts(self) -> tuple[Verdict, ...]:
        return (self.out, self.stage, self.stage_lse) + self.partial_out + self.partial_lse


def judge_split_combine(problem: AttentionProblem, a: Mapping[str, Any], num_splits: int,
                        partial_out: Sequence[Any], partial_lse: Sequence[Any], out, lse=None, *,
                        budgets: Any = None, full_oracle: Any = None) -> SplitJudgement:
    """Judge ``out`` (batch, seqlen_q, nheads, d), the combine of per-chunk forwards
    ``partial_out[s]`` (b, sq, h, d) / ``partial_lse[s]`` (b, h, sq) over
    :func:`split_problems`' chunks, against the full problem's oracle (DERIVATIONS.md#combine)."""
    chunks = split_problems(problem, a, num_splits)
    if len(partial_out) != num_splits or len(partial_lse) != num_splits:
        raise ValueError("one partial output and LSE per split")
    Os, Ls, wstar_num, pv, lv = [], [], [], [], []
    allow, dL, Ostar = [], [], []
    for (p, aa, _), o, l in zip(chunks, partial_out, partial_lse):
        ro, rl, _, _ = forward_allowances(p, aa, budgets=budgets)
        pv.append(compare("partial_out", o, ro.value, oracle_bound=ro.bound, budget=ro.budget))
        lv.append(compare("partial_lse", l, rl.value, oracle_bound=rl.bound, budget=rl.budget))
        Os.append(np.asarray(o, np.float64))
        Ls.append(np.transpose(np.asarray(l, np.float64), (0, 2, 1)))       # (b, sq, h)
        allow.append(ro.budget + ro.bound)
        dL.append(np.transpose(rl.budget + rl.bound, (0, 2, 1)))
        Ostar.append(ro.value)
        wstar_num.append(np.transpose(rl.value, (0, 2, 1)))
    O = np.stack(Os)
    L = np.stack(Ls)
    vs, vsl = judge_combine_stage(O, L, out, None if lse is None else lse, dtype=problem.dtype,
                                  arch=problem.arch, budgets=budgets)
    bs = load_budgets(problem.dtype, problem.arch, budgets)
    from fa4verify.oracles import combine as oc
    st = combine_statistics(O, L)
    with np.errstate(invalid="ignore", over="ignore"):
        local = np.broadcast_to(bs.evaluate("combine_out", st), O.shape[1:])
        ex = oc.combine(np.stack(Ostar), np.stack(wstar_num))       # exact weights w*_s
        w = ex.weights[..., None]
        dmax = np.max(np.stack(dL), axis=0)[..., None]
        grow = np.exp(2 * dmax)
        prop = (w * grow * np.stack(allow)).sum(axis=0) + (grow - 1) * (w * np.abs(np.stack(Ostar))).sum(axis=0)
        total = local + prop
    if full_oracle is None:
        ro_full, _, _, _ = forward_allowances(problem, a, budgets=budgets)
        ref, bound = ro_full.value, ro_full.bound
    else:
        ref, bound = full_oracle
    vo = compare("split_out", out, ref, oracle_bound=bound, budget=total)
    return SplitJudgement(vo, vs, vsl, tuple(pv), tuple(lv))
