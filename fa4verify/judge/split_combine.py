"""Split-KV combine verdicts: the combine stage alone (local budget) and split forwards + combine
end to end (composed budget vs the full problem's oracle). Both through :func:`compare`.

* :func:`combine_statistics` -- the statistics of ``[stage.combine_out]`` / ``[stage.combine_lse]``
  from the exact combine of the given partials (``fa4verify.oracles.combine``);
* :func:`judge_combine_stage` -- a combine result (FA4's ``flash_attn_combine`` or the twin) versus
  the exact combine of the *same* partials, within the local budget;
* :func:`split_problems` -- the per-chunk problems of a dense problem whose keys are cut
  into contiguous chunks (what a split-KV forward computes per split);
* :func:`split_references` -- the chunks' oracle values and allowances and the composed budgets
  of the merged output and LSE (error_budgets/DERIVATIONS.md#combine), from the oracle's values,
  bounds and allowances only;
* :func:`judge_split_combine` -- the merged output and LSE versus the *full* problem's oracle
  within the composed budgets, and, where the partials are at hand, each partial against its
  chunk's oracle and the combine stage against the exact combine of those partials.

Note [Split-KV as a call form]
------------------------------
FA4's SM 10.x/11.x forward with ``num_splits > 1`` (``CallForm.num_splits``) cuts each row's keys
into ``num_splits`` ranges of whole KV tiles (:func:`fa4verify.kernels.facts.split_kv_key_ranges`,
FA4's ``BlockInfo.get_n_block_min_max``; at hd != hdv FA4 runs 64-key tiles and its heuristic's
split count instead, or the call unsplit: :func:`fa4verify.kernels.facts.split_kv_config`, the
chunk budgets then count 64-key tiles), writes an fp32 partial output and LSE per range (a
range with no tile: LSE -inf; the learnable sink belongs to the first split only,
``flash_fwd_sm100.py`` 'Only the first split owns the sink column') and merges them with its
combine kernel in the same call. The problem is the unsplit one, and its output is judged
against the unsplit oracle; the allowance is the composition of DERIVATIONS.md#combine over the
chunk problems' own forward budgets, formed from the oracle's chunk values, their certified bounds
and the allowances only (so it holds for any run of the call, not just the one whose partials it
saw; the oracle's weights are within ``e^(2 max lse bound)`` of the exact ones, a factor the
weights carry): with ``dL`` the largest LSE
allowance of a non-empty chunk, ``g = e^{2 dL}``, exact chunk values ``O*_s``, ``L*_s``, weights
``w*_s`` and output allowances ``b_s`` (budget + oracle bound),

    |O~ - O*| <= combine_out(stats) + sum_s w*_s g b_s + (g - 1) sum_s w*_s |O*_s|
    |LSE~ - LSE*| <= combine_lse(stats) + dL

where the combine's statistics are bounded the same way (``cmb_abs <= sum_s w*_s g (|O*_s| +
b_s)``, ``cmb_lse_abs <= max_s |L*_s| + dL_s``, ``cmb_abs_o <= |O*| + its bound + the
propagated term``; the combine budgets grow with each). A chunk's forward budget counts the
bf16 rounding of its output, which FA4's fp32 partials do not have: a margin, never a gap.
Where a target hands over its partials (production: captured at FA4's internal combine call,
``kernels.adapter``; the CPU twin: its own), each is judged against its chunk's oracle and the
combine stage against the exact combine of the same partials (``combine_out`` / ``combine_lse``).

Layouts are FA4's: partial outputs ``(S, batch, seqlen_q, nheads, d)``, partial LSEs ``(S, batch,
seqlen_q, nheads)`` (``flash_attn_combine``'s), forward LSE ``(batch, nheads, seqlen_q)``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import numpy as np

from fa4verify.problem import AttentionProblem
from fa4verify.judge.attention import forward_allowances, load_budgets
from fa4verify.judge.verdict import Verdict, compare

__all__ = ["combine_statistics", "judge_combine_stage", "equal_ranges", "split_problems", "SplitReferences",
           "split_references", "SplitJudgement", "judge_partials", "judge_split_combine"]


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
                        budgets: Any = None, all_indices: bool = False) -> tuple[Verdict, Verdict]:
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
    vo = compare("combine_out", out, ref.out, oracle_bound=ref.bound, budget=bo, all_indices=all_indices)
    if lse is None:
        vl = Verdict("combine_lse", "undecided", 0, 0, int(ref.lse.size), 0.0, 0.0, None, (),
                     "the combine returned no LSE")
    else:
        vl = compare("combine_lse", lse, ref.lse, oracle_bound=ref.lse_bound, budget=bl, all_indices=all_indices)
    return vo, vl


def equal_ranges(seqlen_k: int, num_splits: int) -> tuple[tuple[int, int], ...]:
    """``num_splits`` contiguous key ranges as equal as possible, none empty (the chunks a caller
    of ``flash_attn_combine`` may cut: ``production.combine``)."""
    if not 1 <= num_splits <= seqlen_k:
        raise ValueError(f"num_splits={num_splits} must be in [1, seqlen_k={seqlen_k}]")
    edges = [round(i * seqlen_k / num_splits) for i in range(num_splits + 1)]
    return tuple((edges[s], edges[s + 1]) for s in range(num_splits))


def _ranges(problem: AttentionProblem, splits) -> tuple[tuple[int, int], ...]:
    return equal_ranges(problem.seqlen_k, splits) if isinstance(splits, (int, np.integer)) else \
        tuple((int(a), int(b)) for a, b in splits)


def split_problems(problem: AttentionProblem, a: Mapping[str, Any], splits
                   ) -> list[tuple[Any, Any, tuple[int, int]]]:
    """``(chunk problem, chunk arrays, (k0, k1))`` per key range of a dense problem without
    mask_mod or mod pairs; ``splits``: a split count (:func:`equal_ranges`) or the ranges. A causal
    or local mask carries over in the chunk's own coordinates: with ``d = seqlen_k - k1`` the chunk
    has the window ``(left - d, right + d)`` (causal: right 0; a side None stays None), bottom-right
    aligned like every FA4 window -- the same keys of each row. The learnable sink is the first
    chunk's (FA4's first split owns it); an empty range gives ``(None, None, (k0, k1))``."""
    if problem.varlen or problem.mask_mod is not None or problem.mods:
        raise ValueError("split_problems: dense problems without mask_mod or mod pairs only")
    from fa4verify.problem.masks import resolve_window
    causal, local, left, right = resolve_window(problem.causal, problem.window_size)
    if causal:
        right = 0 if right is None else min(right, 0)
    masked = causal or local
    out = []
    plain = None
    if problem.call is not None and problem.call.pack_gqa is not None:
        from fa4verify.problem import CallForm
        plain = CallForm(pack_gqa=problem.call.pack_gqa)
    for s, (k0, k1) in enumerate(_ranges(problem, splits)):
        if not 0 <= k0 <= k1 <= problem.seqlen_k:
            raise ValueError(f"key range {(k0, k1)} outside [0, {problem.seqlen_k}]")
        if k1 == k0:
            out.append((None, None, (k0, k1)))
            continue
        sink = problem.sink and s == 0
        mask = {}
        if masked:
            d = problem.seqlen_k - k1
            mask = dict(causal=False, window_size=(None if left is None else left - d,
                                                   None if right is None else right + d))
        p = problem.replace(seqlen_k=k1 - k0, sink=sink, sink_dtype=problem.sink_dtype if sink else "fp32",
                            call=plain, **mask)
        aa = dict(a)
        aa["k"] = np.asarray(a["k"])[:, k0:k1]
        aa["v"] = np.asarray(a["v"])[:, k0:k1]
        if not sink:
            aa["learnable_sink"] = None
        out.append((p, aa, (k0, k1)))
    return out


@dataclasses.dataclass
class SplitReferences:
    """The chunks' references and the composed budgets (Note [Split-KV as a call form]).
    Chunk arrays are stacked on a leading split axis in FA4's partial layouts: outputs ``(S, b,
    sq, h, dv)``, LSEs ``(S, b, sq, h)``; an empty chunk holds O* = 0, L* = -inf."""
    ranges: tuple[tuple[int, int], ...]
    out_refs: tuple[Any, ...]      #: per chunk: its out Reference, None for an empty one
    lse_refs: tuple[Any, ...]
    out_budget: np.ndarray         #: (b, sq, h, dv): the merged output's composed budget
    lse_budget: np.ndarray         #: (b, h, sq): the merged LSE's


def split_references(problem: AttentionProblem, a: Mapping[str, Any], splits, *, budgets: Any = None,
                     full: Any = None, tile_n: Optional[int] = None) -> SplitReferences:
    """:class:`SplitReferences` of ``problem`` cut at ``splits`` (a count or the ranges); ``full``:
    the unsplit oracle forward (``.out``, ``.bound``), computed when None; ``tile_n``: the KV tile
    the splits run with where not the forward's own (FA4's split-KV at hd != hdv: 64)."""
    from fa4verify.oracles import combine as oc
    from fa4verify.judge.attention import oracle_forward
    chunks = split_problems(problem, a, splits)
    if full is None:
        full = oracle_forward(problem, a)
    b, sq, h, dv = problem.batch, problem.seqlen_q, problem.nheads, problem.head_dim_v
    S = len(chunks)
    Ostar = np.zeros((S, b, sq, h, dv))
    Lstar = np.full((S, b, sq, h), -np.inf)
    allow = np.zeros((S, b, sq, h, dv))
    obound = np.zeros((S, b, sq, h, dv))
    dL = np.zeros((S, b, sq, h))
    lbound = np.zeros((S, b, sq, h))
    out_refs, lse_refs = [], []
    with np.errstate(invalid="ignore", over="ignore"):
        for s, (p, aa, _) in enumerate(chunks):
            if p is None:
                out_refs.append(None)
                lse_refs.append(None)
                continue
            ro, rl, _, _ = forward_allowances(p, aa, budgets=budgets, tile_n=tile_n)
            out_refs.append(ro)
            lse_refs.append(rl)
            Ostar[s] = ro.value
            Lstar[s] = np.transpose(rl.value, (0, 2, 1))
            allow[s] = ro.budget + ro.bound
            obound[s] = ro.bound
            dL[s] = np.transpose(np.broadcast_to(rl.budget + rl.bound, rl.value.shape), (0, 2, 1))
            lbound[s] = np.transpose(np.broadcast_to(rl.bound, rl.value.shape), (0, 2, 1))
        bs = load_budgets(problem.dtype, problem.arch, budgets)
        ex = oc.combine(Ostar, Lstar)
        # the weights of the oracle's chunk LSEs: the exact ones are within e^(2 max lse bound) of
        # them (and of the float64 combine's, ~2^-52 relative: inside the same factor's margin)
        wf = np.exp(2 * lbound.max(axis=0) + 2.0 ** -40)[..., None]
        w = ex.weights[..., None] * wf
        dmax = dL.max(axis=0)
        g = np.exp(2 * dmax)[..., None]
        wsum = lambda x: np.where(w > 0, w * x, 0.0).sum(axis=0)       # noqa: E731 (0 * inf = 0)
        absO = np.abs(Ostar) + obound                                  # |O*_s| of the exact chunk values
        prop = g * wsum(allow) + (g - 1) * wsum(absO)
        fo = np.asarray(full.out, np.float64)
        fb = np.broadcast_to(np.asarray(full.bound, np.float64), fo.shape)
        labs = np.where(np.isfinite(Lstar), np.abs(Lstar) + dL, 0.0).max(axis=0)
        st = {"n_splits": float(S), "cmb_lse_abs": labs[..., None], "cmb_abs": g * wsum(absO + allow),
              "cmb_abs_o": np.abs(fo) + fb + prop}
        local = np.broadcast_to(bs.evaluate("combine_out", st), fo.shape)
        local_l = bs.evaluate("combine_lse", {**st, "cmb_lse_abs": labs})
        lse_budget = np.transpose(np.broadcast_to(local_l + dmax, dmax.shape), (0, 2, 1))
    return SplitReferences(tuple(c[2] for c in chunks), tuple(out_refs), tuple(lse_refs), local + prop,
                           np.ascontiguousarray(lse_budget))


@dataclasses.dataclass
class SplitJudgement:
    out: Verdict                   #: merged output vs the full oracle, composed budget
    lse: Verdict                   #: merged LSE vs the full oracle LSE (undecided without one)
    stage: Optional[Verdict]       #: combine stage vs exact combine of the same partials (None: no partials)
    stage_lse: Optional[Verdict]
    partial_out: tuple[Verdict, ...]   #: each non-empty split's output vs its chunk oracle
    partial_lse: tuple[Verdict, ...]   #: each split's LSE vs its chunk oracle (-inf exactly when empty)

    @property
    def verdicts(self) -> tuple[Verdict, ...]:
        stage = tuple(v for v in (self.stage, self.stage_lse) if v is not None)
        return (self.out, self.lse) + stage + self.partial_out + self.partial_lse


def judge_partials(refs: SplitReferences, partial_out, partial_lse, *, dtype: str, arch: str, out=None, lse=None,
                   budgets: Any = None) -> tuple[tuple[Verdict, ...], tuple[Verdict, ...], Optional[Verdict],
                                                 Optional[Verdict]]:
    """(partial_out verdicts, partial_lse verdicts, stage, stage_lse) of partials in FA4's partial
    layouts (``(S, b, sq, h, dv)``, ``(S, b, sq, h)``); ``out``/``lse`` (the merged result, LSE in
    ``(b, h, sq)``): the combine stage, judged when ``out`` is given. An empty split's output
    is not read by FA4's combine (its weight is 0): not judged, and zeroed for the stage."""
    O = np.array(partial_out, np.float64)
    L = np.asarray(partial_lse, np.float64)
    S = len(refs.ranges)
    if O.shape[0] != S or L.shape[0] != S:
        raise ValueError(f"{O.shape[0]} partial outputs / {L.shape[0]} LSEs for {S} splits")
    pv, lv = [], []
    for s, (ro, rl) in enumerate(zip(refs.out_refs, refs.lse_refs)):
        if ro is None:
            O[s] = 0.0
            lv.append(compare("partial_lse", L[s], np.full(L[s].shape, -np.inf), all_indices=True))
            continue
        pv.append(compare("partial_out", O[s], ro.value, oracle_bound=ro.bound, budget=ro.budget, all_indices=True))
        lv.append(compare("partial_lse", L[s], np.transpose(rl.value, (0, 2, 1)),
                          oracle_bound=np.transpose(np.broadcast_to(rl.bound, rl.value.shape), (0, 2, 1)),
                          budget=np.transpose(np.broadcast_to(rl.budget, rl.value.shape), (0, 2, 1)), all_indices=True))
    vs = vsl = None
    if out is not None:
        vs, vsl = judge_combine_stage(O, L, out, None if lse is None else np.transpose(np.asarray(lse), (0, 2, 1)),
                                      dtype=dtype, arch=arch, budgets=budgets, all_indices=True)
    return tuple(pv), tuple(lv), vs, vsl


def judge_split_combine(problem: AttentionProblem, a: Mapping[str, Any], splits, partial_out=None,
                        partial_lse=None, out=None, lse=None, *, budgets: Any = None, full_oracle: Any = None,
                        refs: Optional[SplitReferences] = None) -> SplitJudgement:
    """Judge the merged ``out`` (b, sq, h, dv) and ``lse`` (b, h, sq; None: undecided) of ``problem``
    cut at ``splits`` (a count or the key ranges) against the full problem's oracle within the
    composed budgets (Note [Split-KV as a call form]), and the partials where given: a sequence of
    per-split outputs (b, sq, h, dv) and LSEs (b, h, sq) -- the layouts of per-chunk forwards -- or
    arrays in FA4's partial layouts (S, b, sq, h, dv) / (S, b, sq, h)."""
    if full_oracle is None:
        from fa4verify.judge.attention import oracle_forward
        full_oracle = oracle_forward(problem, a)
    if refs is None:
        refs = split_references(problem, a, splits, budgets=budgets, full=full_oracle)
    vo = compare("split_out", out, full_oracle.out, oracle_bound=full_oracle.bound, budget=refs.out_budget)
    if lse is None:
        vl = Verdict("split_lse", "undecided", 0, 0, int(np.size(full_oracle.lse)), 0.0, 0.0, None, (),
                     "the target returned no LSE")
    else:
        vl = compare("split_lse", lse, full_oracle.lse, oracle_bound=full_oracle.lse_bound, budget=refs.lse_budget)
    pv = lv = ()
    vs = vsl = None
    if partial_out is not None:
        O, L = partial_out, partial_lse
        if not (isinstance(O, np.ndarray) and O.ndim == 5):      # per-chunk forwards' layouts
            O = np.stack([np.asarray(o, np.float64) for o in O])
            L = np.stack([np.transpose(np.asarray(x, np.float64), (0, 2, 1)) for x in L])
        pv, lv, vs, vsl = judge_partials(refs, O, L, dtype=problem.dtype, arch=problem.arch, out=out, lse=lse,
                                         budgets=budgets)
    return SplitJudgement(vo, vl, vs, vsl, pv, lv)
