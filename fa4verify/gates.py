"""Gates for users' own tests: ``assert_attention_within_budget(out, q, k, v, ...)``.

The gate asks the judge core (:mod:`fa4verify.judge`) for a verdict on FA4's forward output:
the certified oracle (:func:`fa4verify.oracles.attention.forward`), the composed forward budget
(``fa4verify.error_budgets.load(dtype, arch).evaluate("forward_out", stats)``, statistics from
the one producer :class:`fa4verify.judge.BudgetStats`) and the one comparison
:func:`fa4verify.judge.compare`, elementwise

    |out - O_oracle| <= forward_out(stats) + oracle.bound          (absolute, units of V)

``oracle.bound`` is the oracle's own certified error, so a pass is never the oracle's doing.

* **fail** -- raises :class:`AssertionError` whose message gives the budget name and the
  inequality, the count and percentage of violating elements, the first five ``(b, h, m, d)``
  indices with kernel value, oracle value, error in ulps of the output format (bf16 ulps for
  bf16/fp8, fp16 ulps for fp16) and the bound, the maximum, and the case;
* **undecided** -- raises :class:`fa4verify.judge.UndecidedError` (an AssertionError: a test
  never passes on it) whose message contains "undecided" and the reason: NaN/inf inputs (the
  oracle is NaN: the budget defines nothing), an oracle bound the oracle could not certify
  (logits beyond what float64 resolves), a composed budget that is negative or non-finite for
  these statistics, or nothing compared;
* **pass** -- returns a :class:`GateSummary` (max error, max ulps, tightness = max |err| /
  bound, count over) so tests can log it.

Dense, fixed-length problems: causal and sliding windows, GQA/MQA, softcap, learnable sink.
Kernel constants (KV tile width, ``max_offset``, rescale threshold) are FA4's for ``arch``
(:func:`fa4verify.kernels.facts.kernel_constants`), the same as the audit's.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import numpy as np

from fa4verify.judge import UndecidedError, arrays_from, dense_problem, load_budgets
from fa4verify.kernels import facts

__all__ = ["assert_attention_within_budget", "GateSummary", "UndecidedError"]

_DTYPE_FROM_ARRAY = {"bfloat16": "bf16", "float16": "fp16", "float8_e4m3fn": "fp8",
                     "float32": None, "float64": None}


@dataclasses.dataclass(frozen=True)
class GateSummary:
    """What a gate measured (absolute errors in units of V; ulps of the output format)."""

    budget: str
    n: int                 #: elements compared
    count_over: int        #: elements over the bound
    max_abs_err: float
    max_ulp: float
    tightness: float       #: max over elements of |err| / bound (<= 1 within budget)
    skipped_nonfinite: int  #: elements the judge could not judge (0 on a pass)
    status: str = "pass"


def _to_f64(x: Any, name: str) -> tuple[np.ndarray, str]:
    from fa4verify.oracles.semantics import as_float64

    return as_float64(x, name)


def _bshd(x: np.ndarray, name: str) -> np.ndarray:
    if x.ndim != 4:
        raise ValueError(f"{name}: expected (batch, seqlen, nheads, headdim), got shape {x.shape}")
    return x


def _ulps(err: np.ndarray, ref: np.ndarray, fmt: str) -> np.ndarray:
    from fa4verify.oracles import binary32 as b32

    with np.errstate(invalid="ignore", over="ignore"):
        ref32 = np.clip(np.nan_to_num(ref, nan=0.0), -3.0e38, 3.0e38).astype(np.float32)
        return err / b32.ulp(ref32, fmt)


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def assert_attention_within_budget(out: Any, q: Any, k: Any, v: Any, *, dtype: str | None = None,
                                   arch: str = "sm90", causal: bool = False,
                                   softmax_scale: float | None = None,
                                   window_size: Sequence[int | None] = (None, None),
                                   softcap: float = 0.0, learnable_sink: Any = None,
                                   budget: Any = None, budget_name: str = "forward_out",
                                   tile_n: int | None = None, oracle: Any = None,
                                   mods: Sequence[str] = (), mod_aux: Any = None,
                                   msg: str = "") -> GateSummary:
    """Assert that FA4's forward output ``out`` is within the composed forward budget.

    out, q, k, v: torch tensors or numpy arrays, (batch, seqlen, nheads, headdim) as FA4
    (k/v may have fewer heads: GQA/MQA).  ``dtype`` "bf16"|"fp16"|"fp8" (default: from q);
    ``arch`` "sm90"|"sm100"|"sm103" selects the budget file.  ``budget``: a BudgetSet (e.g.
    ``fa4verify.error_budgets.load_file(path)``) or a path to a budget TOML, instead of the
    shipped ``load(dtype, arch)``; ``budget_name`` the entry (``forward_out``, or the
    probabilistic ``forward_out_prob``).  ``oracle``: a precomputed
    ``oracles.attention.forward`` result for these inputs (saves the oracle time).

    Inequality, elementwise: ``|out - O_oracle| <= budget(stats) + oracle.bound``.
    Raises AssertionError (violation), :class:`UndecidedError` (an AssertionError: the judge
    cannot decide, message with "undecided" and why) or ValueError (bad arguments).
    """
    __tracebackhide__ = True
    if arch not in facts.ARCHS:
        raise ValueError(f"arch {arch!r}: choose from {', '.join(facts.ARCHS)}")
    o64, _ = _to_f64(out, "out")
    q64, qdt = _to_f64(q, "q")
    k64, _ = _to_f64(k, "k")
    v64, _ = _to_f64(v, "v")
    for x, nm in ((o64, "out"), (q64, "q"), (k64, "k"), (v64, "v")):
        _bshd(x, nm)
    if dtype is None:
        dtype = _DTYPE_FROM_ARRAY.get(qdt)
        if dtype is None:
            raise ValueError(f"dtype: cannot infer from q of dtype {qdt}; pass dtype='bf16'|'fp16'|'fp8'")
    if dtype not in facts.DTYPES:
        raise ValueError(f"dtype {dtype!r}: choose from {', '.join(facts.DTYPES)}")
    exp_shape = q64.shape[:3] + (v64.shape[-1],)
    if o64.shape != exp_shape:
        raise ValueError(f"out: shape {o64.shape} does not match (batch, seqlen_q, nheads, headdim_v) "
                         f"= {exp_shape}")
    if softcap and not (math.isfinite(softcap) and softcap > 0):
        raise ValueError(f"softcap {softcap!r}: must be a finite number > 0 (or 0 = off)")
    sink = None if learnable_sink is None else _to_f64(learnable_sink, "learnable_sink")[0]
    problem = dense_problem(q64, k64, v64, arch=arch, dtype=dtype, causal=causal,
                            window_size=tuple(window_size), softmax_scale=softmax_scale,
                            softcap=float(softcap or 0.0), sink=sink is not None, mods=tuple(mods))
    a = arrays_from(q64, k64, v64, learnable_sink=sink)
    if mod_aux:
        a["mod_aux"] = dict(mod_aux)
    bset = load_budgets(dtype, arch, budget)
    if oracle is None and mods:
        from fa4verify.judge.attention import oracle_forward as _mod_oracle
        oracle = _mod_oracle(problem, a)
    if oracle is None:
        from fa4verify.oracles.attention import forward as oracle_forward

        oracle = oracle_forward(q, k, v, softmax_scale=softmax_scale, causal=causal,
                                window_size=tuple(window_size), softcap=float(softcap or 0.0),
                                learnable_sink=learnable_sink)
    if tile_n is not None and int(tile_n) != _tile(problem):
        raise ValueError(f"tile_n={tile_n}: FA4 runs this problem with tile_n={_tile(problem)} on {arch} "
                         f"(fa4verify.kernels.facts); the gate judges the kernel FA4 runs")
    from fa4verify.judge.attention import forward_allowances
    from fa4verify.judge.verdict import compare
    ref_out, _, st, _ = forward_allowances(problem, a, budgets=bset, oracle=oracle)
    if budget_name != "forward_out":
        with np.errstate(invalid="ignore", over="ignore"):
            bud = st.forward_out(budget_name)
    else:
        bud = ref_out.budget
    ref = ref_out.value
    verdict = compare("out", o64, ref, oracle_bound=ref_out.bound, budget=bud, all_indices=True)
    with np.errstate(invalid="ignore", over="ignore"):
        allowed = np.broadcast_to(ref_out.bound + bud, ref.shape)
        err = np.abs(o64 - ref)
    fmt = "f16" if dtype == "fp16" else "bf16"
    ulp_name = "fp16 ulps" if dtype == "fp16" else "bf16 ulps"
    judged = np.isfinite(ref) & np.isfinite(allowed) & (allowed >= 0)
    ulps = _ulps(np.where(judged, err, 0.0), ref, fmt)
    left, right = window_size
    case = (f"Case: dtype={dtype} arch={arch} batch={o64.shape[0]} seqlen_q={o64.shape[1]} "
            f"seqlen_k={k64.shape[1]} nheads={o64.shape[2]} nheads_k={k64.shape[2]} head_dim={q64.shape[3]} "
            f"head_dim_v={o64.shape[3]} causal={causal} window_size=({left}, {right}) "
            f"softmax_scale={problem.scale:.6g} softcap={float(softcap or 0.0):g} "
            f"learnable_sink={'yes' if learnable_sink is not None else 'no'} "
            f"tile_n={_tile(problem)}" + (f" mods={'+'.join(mods)}" if mods else ""))
    summary = GateSummary(budget=budget_name, n=verdict.n_compared, count_over=verdict.n_over,
                          max_abs_err=verdict.max_abs_err,
                          max_ulp=float(np.nanmax(np.where(judged, ulps, 0.0))) if verdict.n_compared else 0.0,
                          tightness=verdict.tightness, skipped_nonfinite=verdict.n_unjudged,
                          status=verdict.status)
    files = ', '.join(getattr(bset, 'files', ()) or ()) or 'custom budget'
    if verdict.status == "undecided":
        raise UndecidedError("\n".join([
            (msg + "\n" if msg else "") +
            f"Attention output verdict undecided under budget {budget_name!r} ({dtype}, {arch}; {files}): "
            f"{verdict.reason}",
            f"  judged {verdict.n_compared} of {o64.size} elements, none over; "
            f"{verdict.n_unjudged} could not be judged",
            case]), (verdict,))
    if verdict.status == "pass":
        return summary

    idx = verdict.over_indices  # rows of (b, m, h, d), C order
    order = np.lexsort((idx[:, 3], idx[:, 1], idx[:, 2], idx[:, 0]))
    lines = []
    for bi, mi, hi, di in idx[order][:5]:
        lines.append(f"  ({bi}, {hi}, {mi}, {di}): kernel {_fmt(o64[bi, mi, hi, di])}, oracle "
                     f"{_fmt(ref[bi, mi, hi, di])}, |err| {_fmt(err[bi, mi, hi, di])} "
                     f"({_fmt(ulps[bi, mi, hi, di])} {ulp_name}) > bound {_fmt(allowed[bi, mi, hi, di])}")
    wb, wm, wh, wd = verdict.worst.index if verdict.worst else (0, 0, 0, 0)
    count, n = verdict.n_over, verdict.n_compared
    text = "\n".join([
        (msg + "\n" if msg else "") +
        f"Attention output not within budget {budget_name!r} ({dtype}, {arch}; {files})",
        f"  |out - O_oracle| <= {budget_name}(stats) + oracle.bound   (elementwise, absolute)",
        f"Mismatched elements: {count} / {n} ({100.0 * count / max(n, 1):.4g}%)"
        + (f"; {verdict.n_unjudged} more could not be judged (undecided)" if verdict.n_unjudged else ""),
        f"First {len(lines)} violations at (b, h, m, d):",
        *lines,
        f"Max: |err| {_fmt(summary.max_abs_err)}, {_fmt(summary.max_ulp)} {ulp_name}; worst "
        f"|err|/bound {_fmt(summary.tightness)} at (b, h, m, d) = ({wb}, {wh}, {wm}, {wd})",
        case,
    ])
    raise AssertionError(text)


def _tile(problem) -> int:
    from fa4verify.judge.stats import kernel_constants_for
    return kernel_constants_for(problem).tile_n
