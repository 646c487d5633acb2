"""Gates for users' own tests: ``assert_attention_within_budget(out, q, k, v, ...)``.

The gate computes the certified oracle (:func:`fa4verify.oracles.attention.forward`), the
statistics of the problem in float64, and the composed forward budget
(``fa4verify.error_budgets.load(dtype, arch).evaluate("forward_out", stats)``), then checks
elementwise

    |out - O_oracle| <= forward_out(stats) + oracle.bound          (absolute, units of V)

``oracle.bound`` is the oracle's own certified error, so a pass is never the oracle's doing.
On failure it raises :class:`AssertionError` whose message gives the budget name and the
inequality, the count and percentage of violating elements, the first five ``(b, h, m, d)``
indices with kernel value, oracle value, error in ulps of the output format (bf16 ulps for
bf16/fp8, fp16 ulps for fp16) and the bound, the maximum, and the case.  On success it returns
a :class:`GateSummary` (max error, max ulps, tightness = max |err| / bound, count over) so tests
can log it.

Statistics (see ``error_budgets/loader.py:STATISTICS``) are computed here for the dense,
fixed-length case (causal and sliding windows, GQA/MQA, learnable sink); softcap and varlen are
not supported by this gate yet (ValueError).  The statistics are the judge's
(``fa4verify.attribution.problem_stats``); conventions: KV tile width FA4's (SM90 ``_tile_size_fwd_sm90``, 128 on
SM100/SM103) unless ``tile_n`` is given; ``n_blocks`` = tiles spanned by a row's visible keys;
``x_max = max_offset + rescale threshold`` (8 for 16-bit inputs on SM100/SM103, 0 on SM90 and
for fp8); ``max_offset`` = 8 for fp8, else 0.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import numpy as np

__all__ = ["assert_attention_within_budget", "GateSummary"]

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
    skipped_nonfinite: int  #: oracle entries that are NaN (non-finite inputs), not compared


def _to_f64(x: Any, name: str) -> tuple[np.ndarray, str]:
    from fa4verify.oracles.semantics import as_float64

    return as_float64(x, name)


def _bshd(x: np.ndarray, name: str) -> np.ndarray:
    if x.ndim != 4:
        raise ValueError(f"{name}: expected (batch, seqlen, nheads, headdim), got shape {x.shape}")
    return x


def _default_tile_n(d: int, dv: int, causal: bool, window_size: Sequence[int | None], arch: str) -> int:
    """FA4's KV tile width: ``_tile_size_fwd_sm90`` on SM90 (via the twin), 128 on SM100/103."""
    if arch != "sm90":
        return 128
    try:
        from fa4verify.kernels.twin_fwd import sm90_tile
    except ImportError:  # pragma: no cover - twin missing
        return 128
    local = tuple(window_size) != (None, None)
    return int(sm90_tile(d, dv, causal, local)[1])


def _budget_bound(bset: Any, name: str, q64: np.ndarray, k64: np.ndarray, v64: np.ndarray, *,
                  scale: float, causal: bool, window_size: Sequence[int | None], lse: np.ndarray,
                  ref: np.ndarray, dtype: str, arch: str, tile_n: int,
                  rescale_threshold: float) -> np.ndarray:
    """The budget entry evaluated elementwise, shaped like the output (b, m, h, dv).

    Uses the judge's statistics (``fa4verify.attribution.problem_stats``, layout (b, h, m, .))."""
    from fa4verify.attribution import problem_stats

    lse0 = np.nan_to_num(lse, nan=0.0)
    ref0 = np.nan_to_num(ref, nan=0.0)
    st = problem_stats(q64, k64, v64, arch=arch, dtype=dtype, softmax_scale=scale,
                       causal=causal, window_size=tuple(window_size), lse_true=lse0,
                       o_true=ref0, tile_n=tile_n, rescale_threshold=rescale_threshold)
    b, m, h, dv = ref.shape
    bnd = np.broadcast_to(np.asarray(bset.evaluate(name, st), dtype=np.float64), (b, h, m, dv))
    return np.transpose(bnd, (0, 2, 1, 3))


def _ulps(err: np.ndarray, ref: np.ndarray, fmt: str) -> np.ndarray:
    from fa4verify import binary32 as b32

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
    Raises AssertionError (violation) or ValueError (bad or unsupported arguments).
    """
    __tracebackhide__ = True
    if softcap:
        raise ValueError("assert_attention_within_budget: softcap is not supported by this gate yet")
    if arch not in ("sm90", "sm100", "sm103"):
        raise ValueError(f"arch {arch!r}: choose from sm90, sm100, sm103")
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
    if dtype not in ("bf16", "fp16", "fp8"):
        raise ValueError(f"dtype {dtype!r}: choose from bf16, fp16, fp8")
    exp_shape = q64.shape[:3] + (v64.shape[-1],)
    if o64.shape != exp_shape:
        raise ValueError(f"out: shape {o64.shape} does not match (batch, seqlen_q, nheads, headdim_v) "
                         f"= {exp_shape}")
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(q64.shape[-1])

    if oracle is None:
        from fa4verify.oracles.attention import forward as oracle_forward

        oracle = oracle_forward(q, k, v, softmax_scale=softmax_scale, causal=causal,
                                window_size=tuple(window_size), learnable_sink=learnable_sink)
    if softmax_scale is None and getattr(oracle, "softmax_scale", None) is not None:
        scale = float(oracle.softmax_scale)  # the oracle's reading of FA4's default scale
    ref = np.asarray(oracle.out, dtype=np.float64)
    obound = np.asarray(oracle.bound, dtype=np.float64)
    lse = np.asarray(oracle.lse, dtype=np.float64)

    if budget is None:
        from fa4verify.error_budgets import load

        bset = load(dtype, arch)
    elif isinstance(budget, (str, bytes)) or hasattr(budget, "__fspath__"):
        from fa4verify.error_budgets import load_file

        bset = load_file(budget)
    else:
        bset = budget
    try:
        from fa4verify.kernels.fa4_params import load_params

        thr = float(load_params().rescale_threshold_16bit)
    except Exception:  # pragma: no cover - params loader missing: FA4's documented 8.0
        thr = 8.0
    if tile_n is None:
        tile_n = _default_tile_n(q64.shape[-1], v64.shape[-1], causal, window_size, arch)
    bnd = _budget_bound(bset, budget_name, q64, k64, v64, scale=scale, causal=causal,
                        window_size=window_size, lse=lse, ref=ref, dtype=dtype, arch=arch,
                        tile_n=tile_n, rescale_threshold=thr)
    allowed = bnd + obound

    comparable = np.isfinite(ref)
    err = np.abs(o64 - ref)
    bad = comparable & ~(err <= allowed)  # NaN in out counts as a violation
    n = int(comparable.sum())
    count = int(bad.sum())
    fmt = "f16" if dtype == "fp16" else "bf16"
    ulp_name = "fp16 ulps" if dtype == "fp16" else "bf16 ulps"
    ulps = _ulps(np.where(comparable, err, 0.0), ref, fmt)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(comparable, err / allowed, 0.0)
    ratio = np.where(np.isnan(ratio) & comparable, np.inf, ratio)
    errc = np.where(comparable, err, 0.0)
    summary = GateSummary(budget=budget_name, n=n, count_over=count,
                          max_abs_err=float(np.nanmax(np.where(np.isnan(errc), np.inf, errc))) if n else 0.0,
                          max_ulp=float(np.nanmax(ulps)) if n else 0.0,
                          tightness=float(np.max(ratio)) if n else 0.0,
                          skipped_nonfinite=int((~comparable).sum()))
    if count == 0:
        return summary

    b_, m_, h_, d_ = o64.shape
    idx = np.argwhere(bad)  # rows of (b, m, h, d), C order
    # report (b, h, m, d) order, first five in that order
    order = np.lexsort((idx[:, 3], idx[:, 1], idx[:, 2], idx[:, 0]))
    lines = []
    for bi, mi, hi, di in idx[order][:5]:
        lines.append(f"  ({bi}, {hi}, {mi}, {di}): kernel {_fmt(o64[bi, mi, hi, di])}, oracle "
                     f"{_fmt(ref[bi, mi, hi, di])}, |err| {_fmt(err[bi, mi, hi, di])} "
                     f"({_fmt(ulps[bi, mi, hi, di])} {ulp_name}) > bound {_fmt(allowed[bi, mi, hi, di])}")
    worst = np.unravel_index(int(np.argmax(np.where(bad, ratio, -1.0))), ratio.shape)
    wb, wm, wh, wd = (int(x) for x in worst)
    left, right = window_size
    text = "\n".join([
        (msg + "\n" if msg else "") +
        f"Attention output not within budget {budget_name!r} ({dtype}, {arch}; "
        f"{', '.join(getattr(bset, 'files', ()) or ()) or 'custom budget'})",
        f"  |out - O_oracle| <= {budget_name}(stats) + oracle.bound   (elementwise, absolute)",
        f"Mismatched elements: {count} / {n} ({100.0 * count / max(n, 1):.4g}%)",
        f"First {len(lines)} violations at (b, h, m, d):",
        *lines,
        f"Max: |err| {_fmt(summary.max_abs_err)}, {_fmt(summary.max_ulp)} {ulp_name}; worst "
        f"|err|/bound {_fmt(summary.tightness)} at (b, h, m, d) = ({wb}, {wh}, {wm}, {wd})",
        f"Case: dtype={dtype} arch={arch} batch={b_} seqlen_q={m_} seqlen_k={k64.shape[1]} "
        f"nheads={h_} nheads_k={k64.shape[2]} head_dim={q64.shape[3]} head_dim_v={d_} "
        f"causal={causal} window_size=({left}, {right}) softmax_scale={scale:.6g} "
        f"learnable_sink={'yes' if learnable_sink is not None else 'no'} tile_n={tile_n}",
    ])
    raise AssertionError(text)
