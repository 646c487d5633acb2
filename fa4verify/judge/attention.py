"""Attention outputs against the certified oracle under the composed budgets: the judge's only
path from (problem, inputs, kernel outputs) to verdicts.

* :func:`oracle_forward` / :func:`oracle_backward` -- the certified float64 references
  (``fa4verify.oracles.attention``) for a problem's arrays;
* :func:`forward_allowances` -- oracle, its bounds and the composed budgets, elementwise
  (:class:`Reference`), from the one statistics producer :class:`~fa4verify.judge.stats.BudgetStats`;
* :func:`judge_forward` -- ``out`` and ``lse`` verdicts;
* :func:`judge_backward` -- ``dq``, ``dk``, ``dv`` verdicts against the exact gradient (the
  budgets' D term covers D computed from the kernel's rounded O,
  error_budgets/DERIVATIONS.md#bwd-composition);
* :func:`dense_problem` -- the problem type for arrays given by a caller (the public gate,
  attribution, mutants, production cases).

Every verdict comes from :func:`fa4verify.judge.verdict.compare`.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping, Optional

import numpy as np

from fa4verify.problem import AttentionProblem
from fa4verify.judge.stats import BudgetStats
from fa4verify.judge.verdict import Verdict, compare

__all__ = ["Reference", "ForwardJudgement", "BackwardJudgement", "dense_problem", "arrays_from",
           "oracle_forward", "oracle_backward", "forward_allowances", "judge_forward",
           "judge_backward", "load_budgets", "as_input_dtype", "effective_inputs"]


def load_budgets(dtype: str, arch: str, budgets: Any = None):
    """The composed budget set: ``budgets`` itself (a BudgetSet), a path to a TOML, or the shipped
    ``error_budgets.load(dtype, arch)``."""
    from fa4verify import error_budgets as eb
    if budgets is None:
        return eb.load(dtype, arch)
    if isinstance(budgets, (str, bytes)) or hasattr(budgets, "__fspath__"):
        return eb.load_file(budgets)
    return budgets


def as_input_dtype(x: np.ndarray, dtype: str):
    """float32 holding exact ``dtype`` values -> an array of that dtype (exact), so the oracle
    reads the input dtype (its NaN/format checks)."""
    x = np.asarray(x, np.float32)
    if dtype == "fp16":
        return x.astype(np.float16)
    import ml_dtypes
    if dtype == "fp8":
        return x.astype(ml_dtypes.float8_e4m3fn)
    return x.astype(ml_dtypes.bfloat16)


def dense_problem(q, k, v, *, arch: str, dtype: str, causal: bool = False, window_size=(None, None),
                  softmax_scale: Optional[float] = None, softcap: float = 0.0, sink: bool = False,
                  mask_mod=None, mods=(), mod_seed: int = 0) -> AttentionProblem:
    """The :class:`AttentionProblem` describing dense arrays (b, s, h, d) given by a caller
    (``dtype``: "bf16", "fp16" or "fp8", fa4verify's one spelling)."""
    b, sq, h, d = np.shape(q)
    _, sk, hk, _ = np.shape(k)
    dv = np.shape(v)[-1]
    return AttentionProblem(arch=arch, dtype=dtype, batch=int(b), seqlen_q=int(sq), seqlen_k=int(sk),
                            nheads=int(h), nheads_kv=int(hk), head_dim=int(d), head_dim_v=int(dv),
                            causal=bool(causal), window_size=tuple(window_size), softcap=float(softcap or 0.0),
                            sink=bool(sink), softmax_scale=softmax_scale, mask_mod=mask_mod, mods=tuple(mods),
                            mod_seed=int(mod_seed))


def arrays_from(q, k, v, dout=None, learnable_sink=None, mask=None, cu_seqlens_q=None,
                cu_seqlens_k=None) -> dict[str, Any]:
    """The arrays dict the judge reads (float64 copies; None where absent)."""
    f = (lambda x: None if x is None else np.asarray(x, np.float64))
    return {"q": f(q), "k": f(k), "v": f(v), "dout": f(dout), "learnable_sink": f(learnable_sink),
            "mask": mask, "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k}


def effective_inputs(problem: AttentionProblem, a: Mapping[str, Any]) -> Mapping[str, Any]:
    """The arrays the problem's function reads: with :attr:`AttentionProblem.descales`, q, k and v
    descaled exactly in float64 (Note [FP8 descales]; marked ``"descaled"`` so a second call is
    the identity); otherwise ``a`` itself."""
    if not problem.descales or a.get("descaled"):
        return a
    from fa4verify.oracles import descale
    d = descale.descaled(a["q"], a["k"], a["v"], q_descale=a.get("q_descale"), k_descale=a.get("k_descale"),
                         v_descale=a.get("v_descale"),
                         cu_seqlens_q=a.get("cu_seqlens_q") if problem.varlen else None,
                         cu_seqlens_k=a.get("cu_seqlens_k") if problem.varlen else None)
    return dict(a, q=d["q"], k=d["k"], v=d["v"], descaled=True)


def _inputs(problem: AttentionProblem, a: Mapping[str, Any], *names: str) -> list:
    """The named arrays as the oracle reads them: in the input dtype (its format checks), or the
    exact float64 descaled values (Note [FP8 descales])."""
    if a.get("descaled"):
        return [np.asarray(a[n], np.float64) for n in names]
    return [as_input_dtype(a[n], problem.dtype) for n in names]


def oracle_window(problem: AttentionProblem) -> tuple[bool, tuple]:
    """``(causal, window_size)`` for the oracle: the problem's window as the installed FA4 release
    resolves it.

    Note [The oracle's window is the release's]
    -------------------------------------------
    FA4's ``_resolve_causal_local_window`` changed at 4.0.0b30: before, ``causal`` came first and a
    window whose sides sum below zero was dropped (``(-98, 53)``: no window); from b30 only a
    both-negative pair is dropped (``(-98, 53)``: a window, empty rows). The twin, the budgets'
    key counts and the keep-masks read the installed release's rule
    (``fa4verify.kernels.facts.resolve_causal_local_window``), but the oracle (which never imports
    the subject) applies the b30 rule to what it is given; handed the raw window, it judged b20..b29
    against another release's semantics (``fuzz.twin`` failed on 4.0.0b25..b29 with a
    ``window=(-98, 53)`` problem). So the oracle gets the window in the release's canonical form,
    on which its own rule is the identity."""
    from fa4verify.problem import resolve_window
    causal, local, left, right = resolve_window(problem.causal, problem.window_size)
    if local:
        return False, (left, right)
    return bool(causal), (None, None)


def _oracle_kwargs(problem: AttentionProblem, a: Mapping[str, Any]) -> dict[str, Any]:
    causal, window = oracle_window(problem)
    kw: dict[str, Any] = {"softmax_scale": problem.softmax_scale, "causal": causal,
                          "window_size": window, "softcap": float(problem.softcap),
                          "learnable_sink": a.get("learnable_sink") if problem.sink else None}
    if problem.varlen:
        kw["cu_seqlens_q"] = a["cu_seqlens_q"]
        kw["cu_seqlens_k"] = a["cu_seqlens_k"]
    if problem.mask_mod is not None:
        # the certified oracle has no user keep-pattern yet (issue 16): say so instead of
        # passing an argument it does not take (no target runs mask_mod problems today)
        raise NotImplementedError("the certified oracle does not model mask_mod keep-patterns yet "
                                  "(issue 16); rewrite the mask as varlen/window or block sparsity")
    return kw


def _mod_callables(problem: AttentionProblem, a: Mapping[str, Any]) -> dict[str, Any]:
    """The float64 oracle's arguments for a problem with ``mods`` (``fa4verify.oracles.mods``):
    the pairs' references on each (batch entry, head) block, with the aux arrays of
    :func:`fa4verify.mods.aux_for`, and the problem's softcap and sink.

    Note [Mods with softcap and sink]
    ---------------------------------
    The production target hands FA4 the problem's ``softcap`` and ``learnable_sink`` with the
    pair's CuTe function (``targets.ProductionTarget._kw``), and FA4 applies both with a
    mask_mod (it refuses softcap only with a score_mod), so the mod oracle must too: without
    them it judged FA4's correct softcapped, sink-normalised output against plain attention
    (the coverage plan puts mask pairs on softcap / sink rows; the fuzz draws never did). The
    budgets (:class:`fa4verify.judge.stats.BudgetStats`) already counted both."""
    from fa4verify import mods as _mods
    score, _ = problem.mod_pairs()
    keeps: dict[int, list] = {}         # per query head, computed once (Note [Masks by head])

    def keep(b: int, h: int):
        hh = h if problem.heads_differ else 0
        if hh not in keeps:
            keeps[hh] = problem.keep_masks(a, head=hh)
        return keeps[hh][b]

    def idx(x):     # the block's sequence-local positions (a varlen call's, FA4's, too)
        return np.arange(x.shape[0])[:, None], np.arange(x.shape[1])[None, :]

    kw: dict[str, Any] = {"softmax_scale": problem.scale, "keep": keep,
                          "softcap": float(problem.softcap),
                          "learnable_sink": a.get("learnable_sink") if problem.sink else None}
    if problem.varlen:
        kw["cu_seqlens_q"], kw["cu_seqlens_k"] = a["cu_seqlens_q"], a["cu_seqlens_k"]
    if score is not None:
        aux = _mods.aux_for(problem, score, a)
        kw["score"] = lambda x, b, h: score.ref(x, b, h, *idx(x), aux)
        kw["grad"] = lambda x, b, h: score.grad(x, b, h, *idx(x), aux)
        kw["lipschitz"] = float(score.lipschitz)
        kw["curvature"] = float(score.curvature)
    return kw


def _keep_pattern(problem: AttentionProblem) -> bool:
    """A call form that adds a keep-pattern (block sparsity, a CuTe mask_mod) to a problem without
    mod pairs: the oracle runs on its exact varlen rewrite (:mod:`fa4verify.judge.keep_pattern`).
    With mod pairs, a block mask per head (one varlen rewrite serves every head, Note [Block
    masks by head]) or block lists under a causal / window rule (the rule cuts the blocks: the
    rewrite would be a sequence per query row, Note [Block lists with causal or a window]), the
    mods oracle takes the problem's keep-masks whole, per (batch, head)."""
    call = getattr(problem, "call", None)
    return call is not None and call.keep_pattern and not _keep_by_head(problem)


def _keep_by_head(problem: AttentionProblem) -> bool:
    """Whether the oracle is the mods oracle's ``keep(b, h)`` (mod pairs, block masks by head,
    block lists under a causal / window rule)."""
    call = problem.call
    return bool(problem.mods) or (call is not None and call.block_per_head) or problem.masked_lists


def oracle_forward(problem: AttentionProblem, a: Mapping[str, Any]):
    from fa4verify.oracles import attention as orc
    a = effective_inputs(problem, a)
    if _keep_pattern(problem):
        from fa4verify.judge import keep_pattern
        return keep_pattern.oracle_forward(problem, a)
    if _keep_by_head(problem):
        from fa4verify.oracles import mods as om
        kw = _mod_callables(problem, a)
        kw.pop("grad", None)
        kw.pop("curvature", None)
        return om.forward(*_inputs(problem, a, "q", "k", "v"), **kw)
    return orc.forward(*_inputs(problem, a, "q", "k", "v"), **_oracle_kwargs(problem, a))


def oracle_backward(problem: AttentionProblem, a: Mapping[str, Any], dlse: Any = None):
    """The exact gradient (the oracle's own O enters D); ``dlse``: a gradient through the
    returned LSE (FA4's LSE layout), ``D' = D - dLSE``."""
    from fa4verify.oracles import attention as orc
    if _keep_pattern(problem):
        from fa4verify.judge import keep_pattern
        return keep_pattern.oracle_backward(problem, a, dlse=dlse)
    dt = problem.dtype
    if _keep_by_head(problem):
        from fa4verify.oracles import mods as om
        return om.backward(as_input_dtype(a["q"], dt), as_input_dtype(a["k"], dt), as_input_dtype(a["v"], dt),
                           as_input_dtype(a["dout"], dt), dlse=dlse, **_mod_callables(problem, a))
    return orc.backward(as_input_dtype(a["q"], dt), as_input_dtype(a["k"], dt), as_input_dtype(a["v"], dt), None,
                        as_input_dtype(a["dout"], dt), dlse=dlse, **_oracle_kwargs(problem, a))


def oracle_pass(problem: AttentionProblem, a: Mapping[str, Any], dlses: Any) -> tuple[Any, list]:
    """``(oracle_forward(problem, a), oracle_backwards(problem, a, dlses))`` in as few passes as
    the oracle allows. Note [One oracle pass]: the plain oracle's backward computes the forward
    in the same row blocks (``AttentionBackward.forward``), bit for bit what ``oracle_forward``
    gives (``tests/test_oracle_variants.py``), so a problem whose backward is judged takes its
    forward from there; the keep-pattern, by-head, descaled and MLA problems compute both."""
    if _keep_pattern(problem) or _keep_by_head(problem) or problem.descales \
            or (problem.call is not None and problem.call.mla):
        return oracle_forward(problem, a), oracle_backwards(problem, a, dlses)
    bs = oracle_backwards(problem, a, dlses)
    return bs[0].forward, bs


def oracle_backwards(problem: AttentionProblem, a: Mapping[str, Any], dlses: Any) -> list:
    """:func:`oracle_backward` once per entry of ``dlses`` (a gradient through the LSE or None),
    the same results; the plain oracle computes them in one pass (Note [Variants share a pass],
    oracles/reference.py), the keep-pattern and by-head oracles one call each."""
    from fa4verify.oracles import attention as orc
    if _keep_pattern(problem) or _keep_by_head(problem):
        return [oracle_backward(problem, a, dlse=dl) for dl in dlses]
    dt = problem.dtype
    return orc.backwards(as_input_dtype(a["q"], dt), as_input_dtype(a["k"], dt), as_input_dtype(a["v"], dt), None,
                         as_input_dtype(a["dout"], dt), dlses=tuple(dlses), **_oracle_kwargs(problem, a))


@dataclasses.dataclass
class Reference:
    """Oracle values, their certified bounds and the composed budget, elementwise."""
    value: np.ndarray
    bound: np.ndarray
    budget: np.ndarray
    #: elements whose budget is the convex-hull fallback (Note [Hull fallback]); None: none
    fallback: Optional[np.ndarray] = None


@dataclasses.dataclass
class ForwardJudgement:
    out: Verdict
    lse: Verdict
    ref_out: Reference
    ref_lse: Reference
    stats: BudgetStats
    oracle: Any
    prob: Optional[Verdict] = None     #: against ``forward_out_prob`` when the budget set has it

    @property
    def verdicts(self) -> tuple[Verdict, ...]:
        return (self.out, self.lse)


@dataclasses.dataclass
class BackwardJudgement:
    dq: Verdict
    dk: Verdict
    dv: Verdict
    oracle: Any
    budgets: dict[str, np.ndarray]
    ftz_floor: dict[str, np.ndarray]
    #: against ``backward_{dq,dk,dv}_prob`` (the sharper probabilistic tier) when the set has them
    prob: Optional[dict[str, Verdict]] = None

    @property
    def verdicts(self) -> tuple[Verdict, ...]:
        return (self.dq, self.dk, self.dv)


def forward_allowances(problem: AttentionProblem, a: Mapping[str, Any], *, budgets: Any = None,
                       oracle: Any = None, tile_n: Optional[int] = None
                       ) -> tuple[Reference, Reference, BudgetStats, Any]:
    """(out reference, lse reference, statistics, oracle forward) of a problem; ``tile_n``: the KV
    tile FA4 runs it with where not the forward's own (:class:`BudgetStats`)."""
    bs = load_budgets(problem.dtype, problem.arch, budgets)
    a = effective_inputs(problem, a)
    ofwd = oracle if oracle is not None else oracle_forward(problem, a)
    with np.errstate(invalid="ignore", over="ignore"):
        st = BudgetStats(problem, a, ofwd, bs, tile_n=tile_n)
        # Note [Hull fallback]: per element the smaller valid bound of forward_out (first order) and
        # forward_out_hull (rigorous for any logit size; DERIVATIONS.md#hull-fallback)
        out_budget, hull = st.forward_out_decided()
        ref_out = Reference(np.asarray(ofwd.out, np.float64), np.asarray(ofwd.bound, np.float64), out_budget, hull)
        lse_ref = np.asarray(ofwd.lse, np.float64)
        # a budget set without forward_lse (a user's fixture) leaves the LSE unjudged: NaN budget
        lse_budget = st.forward_lse() if "forward_lse" in bs else np.full(lse_ref.shape, np.nan)
        ref_lse = Reference(lse_ref, np.asarray(ofwd.lse_bound, np.float64), lse_budget)
    return ref_out, ref_lse, st, ofwd


def judge_forward(problem: AttentionProblem, a: Mapping[str, Any], out, lse, *, budgets: Any = None,
                  oracle: Any = None, nan: str = "unjudged", select_rows=None) -> ForwardJudgement:
    """Verdicts on a kernel's forward ``out`` (FA4 layout) and ``lse`` (``None``: not judged,
    reported undecided) against the oracle within ``forward_out`` / ``forward_lse``."""
    ref_out, ref_lse, st, ofwd = forward_allowances(problem, a, budgets=budgets, oracle=oracle)
    vo = compare("out", out, ref_out.value, oracle_bound=ref_out.bound, budget=ref_out.budget, nan=nan,
                 fallback=ref_out.fallback)
    if lse is None:
        vl = Verdict("lse", "undecided", 0, 0, int(np.size(ref_lse.value)), 0.0, 0.0, None, (),
                     "the target returned no LSE")
    else:
        vl = compare("lse", lse, ref_lse.value, oracle_bound=ref_lse.bound, budget=ref_lse.budget, nan=nan)
    prob = None
    if "forward_out_prob" in st.budget:
        with np.errstate(invalid="ignore", over="ignore"):
            pb, pb_hull = st.forward_out_decided("forward_out_prob")
        prob = compare("out_prob", out, ref_out.value, oracle_bound=ref_out.bound, budget=pb, nan=nan,
                       fallback=pb_hull)
    return ForwardJudgement(vo, vl, ref_out, ref_lse, st, ofwd, prob)


def _with_reason(v: Verdict, why: Optional[str]) -> Verdict:
    """An undecided gradient verdict whose budget is not valid names the cause (the backward's
    one-line reason, :meth:`BudgetStats.backward`) instead of the generic budget text."""
    if v.status == "undecided" and why and "budget value(s) non-finite" in v.reason:
        return dataclasses.replace(v, reason=v.reason.replace(
            "(the composed budget is not valid here)", f"({why})"))
    return v


def tie_mla(problem: AttentionProblem, ob: Any, allow: Mapping[str, np.ndarray], stats: BudgetStats
            ) -> tuple[Any, dict[str, np.ndarray]]:
    """Note [The sparse MLA backward]: the oracle gradients and the allowances ``stats.backward``
    formed for an MLA problem's untied q', k', v, in FA4's MLA layout: v is both the latent half of
    k' and the value, so FA4's dv is ``dv + dk'[..., rope:]`` (its exact value, oracle bound,
    allowance, FTZ floor and power limit the sums of the two; the float64 sum adds ``2^-52 |sum|``)
    and dk' keeps the rope columns (the latent ones compare 0 with 0). Other problems unchanged."""
    if problem.call is None or not problem.call.mla:
        return ob, dict(allow)
    fold = functools.partial(problem.call.fold_latent, problem)
    dk, dv = fold(ob.dk, ob.dv)
    dkb, dvb = fold(ob.dk_bound, ob.dv_bound)
    ob = dataclasses.replace(ob, dk=dk, dv=dv, dk_bound=dkb, dv_bound=dvb + 2.0 ** -52 * np.abs(dv))
    allow = dict(allow)
    for sfx in ("", "_prob"):
        if f"dk{sfx}" in allow:
            allow[f"dk{sfx}"], allow[f"dv{sfx}"] = fold(allow[f"dk{sfx}"], allow[f"dv{sfx}"])
    stats.ftz_floor["dk"], stats.ftz_floor["dv"] = fold(stats.ftz_floor["dk"], stats.ftz_floor["dv"])
    stats.bwd_blind_above["dk"], stats.bwd_blind_above["dv"] = fold(stats.bwd_blind_above["dk"],
                                                                    stats.bwd_blind_above["dv"])
    return ob, allow


def judge_backward(problem: AttentionProblem, a: Mapping[str, Any], dq, dk, dv, *, budgets: Any = None,
                   forward: Optional[ForwardJudgement] = None, oracle_bwd: Any = None,
                   probabilistic: bool = True, kernel_fwd: Optional[tuple] = None,
                   tensor_core: Optional[str] = None) -> BackwardJudgement:
    """Verdicts on dQ, dK, dV (FA4 layouts) against the exact gradient within
    ``backward_dq/dk/dv``. ``forward``: a :func:`judge_forward` result of the same problem
    (reuses its oracle and statistics). ``kernel_fwd``: the ``(out, lse)`` the kernel's backward
    read (its own forward outputs): the interval bound where the first-order budgets do not hold
    is then evaluated on them (Note [Backward interval fallback] in fa4verify/judge/stats.py);
    without it, on the oracle's O and LSE widened by their forward allowances. ``tensor_core``:
    the arithmetic of the kernel's ``S = Q K^T`` where it is modelled bit for bit (the target's
    ``tensor_core``; Note [SM90 MMA model] in kernels/twin/tensor_core.py)."""
    if forward is None:
        ref_out, _, st, _ = forward_allowances(problem, a, budgets=budgets)
    else:
        ref_out, st = forward.ref_out, forward.stats
    obwd = oracle_bwd if oracle_bwd is not None else oracle_backward(problem, a)
    with np.errstate(invalid="ignore", over="ignore"):
        allow = st.backward(obwd, ref_out.budget, ref_out.bound, probabilistic=probabilistic,
                            kernel_fwd=kernel_fwd, tensor_core=tensor_core)
    obwd, allow = tie_mla(problem, obwd, allow, st)
    vs = {}
    for n, got in (("dq", dq), ("dk", dk), ("dv", dv)):
        # Note [A bound without power]: a gradient bound a zero output meets is undecided
        vs[n] = _with_reason(compare(n, got, getattr(obwd, n), oracle_bound=getattr(obwd, f"{n}_bound"),
                                     budget=allow[n], blind_above=st.bwd_blind_above[n]), st.bwd_undecided_reason)
    prob = None
    if all(f"{n}_prob" in allow for n in ("dq", "dk", "dv")):
        prob = {n: compare(f"{n}_prob", got, getattr(obwd, n), oracle_bound=getattr(obwd, f"{n}_bound"),
                           budget=allow[f"{n}_prob"]) for n, got in (("dq", dq), ("dk", dk), ("dv", dv))}
    return BackwardJudgement(vs["dq"], vs["dk"], vs["dv"], obwd, allow, st.ftz_floor, prob)
