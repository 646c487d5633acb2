"""The statistical tier of the judge: error *distributions* in ulps, beside the worst-case tier.

The worst-case tier (:func:`fa4verify.judge.verdict.compare`) bounds every element; a systematic
bias of a fraction of an ulp stays far inside any per-element bound but is obvious in a mean over
10^4-10^6 elements. This module measures, per output tensor, the **signed error in units of the
reference's ulp in the audited dtype**

    e_i = (actual_i - ref_i) / ulp_dtype(ref_i)                       (signed ulp error)
    r_i = sign(ref_i) e_i                                             (radial: > 0 = too large in magnitude)

(``ulp_dtype(x)`` = spacing of the dtype's grid at ``|x|``: ``2^(floor(log2|x|) - p + 1)`` with
``p`` the dtype's precision, 8 for bf16, 11 for fp16, 24 for fp32; elements with ``|ref|`` below the
dtype's smallest normal, non-finite ``ref`` or non-finite ``actual`` are not in the statistics and
are counted) and summarises it as an :class:`ErrorDistribution` (n, mean with a confidence interval,
RMS, quantiles 50/99/99.9/max of ``|e|``, a histogram).

Note [Statistical tier]
-----------------------
*What is compared.* Production's error against the error the CPU twin predicts **on the same
inputs** (both against the same oracle). The twin models FA4's roundings (P cast, dS cast, output
cast, FTZ) bit-exactly where hardware is modelable; it does not model the tensor cores' fp32
accumulation order (SM90 WGMMA, SM100 UMMA) nor MUFU's exact ex2/rcp (it rounds correctly or
perturbs within MUFU's bound). Those un-modelled differences are fp32-level (relative
``~n 2^-24``), i.e. ``~n 2^-16`` bf16 ulp per element in the worst case and far less on average;
they are absorbed by a **bias margin** ``margin_ulp`` (default ``2^-8`` ulp): a bias counts only
when its confidence interval lies entirely outside ``[-margin, margin]``. A relative output bias of
``2^-12`` is ``2^-5 .. 2^-4`` bf16 ulp, 8-16x the margin.

*Independence assumption.* Elements of one row vector (one query/key token and head, along the
head dim) share that row's softmax statistics and their errors are correlated, so no test here
treats elements as independent. The sampling unit is the **row block** (the last axis): each test
reads one number per row (its mean signed / radial error, or its mean ``|e|``), and rows are
assumed independent (their roundings are distinct operations; the inputs are i.i.d.). The
false-alarm rate of that assumption is verified empirically by the null test
(``tests/test_statistical_tier.py``: twin against twin with two MUFU seeds).

*Tests* (per tensor; :func:`stat_compare`), at ``alpha_test = alpha / n_tests`` (Bonferroni:
``n_tests`` = tensors x cases x 3 tests per tensor; the audit's ``alpha`` is the false-alarm
probability of a whole clean audit, default ``1e-6``):

1. *signed bias* and 2. *radial bias*: paired over rows, ``d_b = mean_b(actual) - mean_b(predicted)``;
   Student t interval of ``mean(d)`` at level ``1 - alpha_test``; fail when it lies outside
   ``[-margin, margin]``;
3. *distribution*: one-sided two-sample Kolmogorov-Smirnov (``scipy.stats.ks_2samp``,
   ``alternative="less"``) on the rows' mean ``|e|`` of actual vs predicted: fail when ``p <
   alpha_test`` for the alternative "actual's row errors are stochastically larger" (a kernel more
   accurate than FA4's rounding model, e.g. exact-then-rounded, is not a fault).

The verdict is three-valued like :func:`~fa4verify.judge.verdict.compare`: **undecided** when fewer
than ``min_rows`` rows have usable statistics, or a tensor has no finite element to judge, never a
pass.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional, Any, Mapping, Sequence

import numpy as np

__all__ = ["ErrorDistribution", "StatVerdict", "ulp_of", "ulp_errors", "distribution", "stat_compare",
           "alpha_per_test", "DEFAULT_ALPHA", "DEFAULT_MARGIN_ULP", "HIST_EDGES", "TESTS_PER_TENSOR",
           "rate_bound_zero_events"]

#: false-alarm probability of one clean audit (all statistical tests together)
DEFAULT_ALPHA = 1e-6
#: bias margin for un-modelled fp32-level differences (Note [Statistical tier]), in ulps
DEFAULT_MARGIN_ULP = 2.0 ** -8
#: statistical tests per tensor (signed bias, radial bias, KS)
TESTS_PER_TENSOR = 3
#: histogram bin edges of the signed ulp error (for the report)
HIST_EDGES = np.linspace(-2.0, 2.0, 81)
_MIN_ROWS = 20

#: (precision bits p, smallest normal) per dtype
_FORMATS = {"bf16": (8, 2.0 ** -126), "fp16": (11, 2.0 ** -14), "fp32": (24, 2.0 ** -126),
            "fp8": (4, 2.0 ** -6)}


def alpha_per_test(alpha: float, n_tensors_x_cases: int, tests_per_tensor: int = TESTS_PER_TENSOR) -> float:
    """Bonferroni: the level of each test so that a clean audit of ``n_tensors_x_cases`` tensors
    raises a false alarm with probability at most ``alpha``."""
    return float(alpha) / max(1, int(n_tensors_x_cases) * int(tests_per_tensor))


def rate_bound_zero_events(n: int, confidence: float = 0.95) -> float:
    """Clopper-Pearson upper bound on an event rate after 0 events in ``n`` independent trials:
    ``1 - (1 - confidence)^(1/n)`` (about ``3/n`` at 95 %, the rule of three)."""
    if n <= 0:
        return 1.0
    return float(1.0 - (1.0 - confidence) ** (1.0 / n))


def ulp_of(ref, dtype: str) -> np.ndarray:
    """Spacing of ``dtype``'s grid at ``|ref|`` (float64), ``2^(floor(log2|ref|) - p + 1)``; NaN
    where ``|ref|`` is below the smallest normal or not finite (those elements are not judged
    statistically)."""
    if dtype not in _FORMATS:
        raise ValueError(f"dtype={dtype!r}: expected one of {sorted(_FORMATS)}")
    p, tiny = _FORMATS[dtype]
    r = np.abs(np.asarray(ref, np.float64))
    ok = np.isfinite(r) & (r >= tiny)
    with np.errstate(divide="ignore", invalid="ignore"):
        _, e = np.frexp(np.where(ok, r, 1.0))      # r = m 2^e, m in [0.5, 1): floor(log2 r) = e - 1
    return np.where(ok, np.ldexp(1.0, (e - 1) - (p - 1)), np.nan)


def ulp_errors(actual, ref, dtype: str, *, ulp: Optional[np.ndarray] = None) -> tuple[np.ndarray, np.ndarray]:
    """(signed, radial) ulp errors, NaN where not judged (see the module docstring); ``ulp``:
    :func:`ulp_of` ``(ref, dtype)`` where the caller has it (two tensors against one reference)."""
    a = np.asarray(actual, np.float64)
    r = np.asarray(ref, np.float64)
    if a.shape != r.shape:
        raise ValueError(f"shape {a.shape} != reference shape {r.shape}")
    u = ulp_of(r, dtype) if ulp is None else ulp
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.where(np.isfinite(a), (a - r) / u, np.nan)
    return e, np.sign(r) * e


@dataclasses.dataclass(frozen=True)
class ErrorDistribution:
    """Signed error of one tensor in ulps of the reference in the audited dtype.

    ``mean``/``ci``: mean signed ulp error and its confidence interval (Student t over row means,
    level ``confidence``); ``radial_mean``/``radial_ci`` the same for ``sign(ref) e``;
    ``rms``: root mean square of ``e``; ``q50/q99/q999/max``: quantiles of ``|e|``; ``n``: judged
    elements, ``n_rows`` rows, ``n_excluded`` elements outside the statistics (tiny or non-finite
    reference, non-finite actual); ``hist``: counts of ``e`` on :data:`HIST_EDGES` (outside values
    clipped into the end bins)."""

    name: str
    dtype: str
    n: int
    n_rows: int
    n_excluded: int
    mean: float
    ci: tuple[float, float]
    radial_mean: float
    radial_ci: tuple[float, float]
    rms: float
    q50: float
    q99: float
    q999: float
    max: float
    confidence: float
    hist: tuple[int, ...] = dataclasses.field(default=(), repr=False)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["ci"], d["radial_ci"], d["hist"] = list(self.ci), list(self.radial_ci), list(self.hist)
        return d


def _rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return x.reshape(-1, x.shape[-1]) if x.ndim >= 2 else x.reshape(-1, 1)


def _row_means(x: np.ndarray) -> np.ndarray:
    """Per-row mean over the row's judged (non-NaN) elements; NaN for a row with none."""
    R = _rows(x)
    cnt = np.sum(np.isfinite(R), axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(cnt > 0, np.nansum(R, axis=1) / np.maximum(cnt, 1), np.nan)


def _t_interval(x: np.ndarray, confidence: float) -> tuple[float, float, float]:
    from scipy import stats
    x = x[np.isfinite(x)]
    n = x.size
    if n < 2:
        return math.nan, math.nan, math.nan
    m = float(x.mean())
    se = float(x.std(ddof=1)) / math.sqrt(n)
    if se == 0.0:
        return m, m, m
    h = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * se
    return m, m - h, m + h


def distribution(name: str, actual, ref, dtype: str, *, confidence: float = 0.99,
                 errors: Optional[tuple[np.ndarray, np.ndarray]] = None) -> ErrorDistribution:
    """The :class:`ErrorDistribution` of ``actual`` against ``ref`` (rows = the last axis);
    ``errors``: :func:`ulp_errors` ``(actual, ref, dtype)`` where the caller has them."""
    e, rad = ulp_errors(actual, ref, dtype) if errors is None else errors
    fin = np.isfinite(e)
    n = int(fin.sum())
    ev = e[fin]
    e_rows = _row_means(e)
    m, lo, hi = _t_interval(e_rows, confidence)
    rm, rlo, rhi = _t_interval(_row_means(rad), confidence)
    if n:
        ae = np.abs(ev)
        q50, q99, q999 = (float(x) for x in np.quantile(ae, [0.5, 0.99, 0.999]))
        mx, rms = float(ae.max()), float(np.sqrt(np.mean(ev * ev)))
        hist = np.histogram(np.clip(ev, HIST_EDGES[0], HIST_EDGES[-1]), HIST_EDGES)[0]
    else:
        q50 = q99 = q999 = mx = rms = math.nan
        hist = np.zeros(HIST_EDGES.size - 1, int)
    n_rows = int(np.sum(np.isfinite(e_rows)))
    return ErrorDistribution(name, dtype, n, n_rows, int(e.size - n), m, (lo, hi), rm, (rlo, rhi), rms,
                             q50, q99, q999, mx, confidence, tuple(int(c) for c in hist))


@dataclasses.dataclass(frozen=True)
class StatVerdict:
    """What :func:`stat_compare` decided about one tensor (``status`` pass | fail | undecided, so
    :func:`fa4verify.judge.verdict.combine` takes it beside the worst-case verdicts)."""

    name: str
    status: str
    actual: ErrorDistribution
    predicted: ErrorDistribution
    bias_diff: float                       #: mean over rows of (actual - predicted) signed ulp error
    bias_ci: tuple[float, float]           #: its interval at level 1 - alpha_test
    radial_diff: float
    radial_ci: tuple[float, float]
    ks_stat: float
    ks_p: float
    alpha_test: float
    margin_ulp: float
    n_rows: int                            #: rows in the paired tests
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "pass"

    @property
    def bias_significance(self) -> float:
        """How far outside the margin the bias interval lies, in margin units (> 0: beyond it);
        the statistical tier's analogue of tightness: 1 + distance / margin, <= 1 inside."""
        far = max(self.bias_ci[0], -self.bias_ci[1], self.radial_ci[0], -self.radial_ci[1])
        if not math.isfinite(far):
            return math.nan
        return 1.0 + far / self.margin_ulp

    def summary(self) -> str:
        head = (f"{self.name}: bias {self.bias_diff:+.2e} ulp [{self.bias_ci[0]:+.2e}, {self.bias_ci[1]:+.2e}], "
                f"radial {self.radial_diff:+.2e} [{self.radial_ci[0]:+.2e}, {self.radial_ci[1]:+.2e}] "
                f"vs twin; KS p {self.ks_p:.2g} (alpha/test {self.alpha_test:.2g}, margin {self.margin_ulp:.2g} ulp)")
        if self.status == "pass":
            return head
        return f"{head}: {self.status}: {self.reason}"

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["actual"], d["predicted"] = self.actual.to_dict(), self.predicted.to_dict()
        d["bias_ci"], d["radial_ci"] = list(self.bias_ci), list(self.radial_ci)
        return d


def stat_compare(name: str, actual, predicted, ref, dtype: str, *, alpha_test: float,
                 margin_ulp: float = DEFAULT_MARGIN_ULP, min_rows: int = _MIN_ROWS) -> StatVerdict:
    """Statistical verdict on ``actual`` (production) against ``predicted`` (the twin on the same
    inputs), both against the oracle ``ref`` (see Note [Statistical tier])::

        fail  <=>  CI_{1-alpha_test}(mean_rows(e_actual - e_pred)) outside [-margin, margin]  (signed or radial)
                   or  KS_less(row mean |e_actual|, row mean |e_pred|).pvalue < alpha_test

    ``undecided`` when fewer than ``min_rows`` rows are usable in both (too few samples, or
    non-finite values / tiny references everywhere)."""
    from scipy import stats
    if not (0 < alpha_test < 1):
        raise ValueError(f"alpha_test={alpha_test!r}: expected 0 < alpha_test < 1")
    conf = 1.0 - alpha_test
    r = np.asarray(ref, np.float64)
    u = ulp_of(r, dtype)           # one reference: its ulps once for both tensors
    ea, ra = ulp_errors(actual, r, dtype, ulp=u)
    ep, rp = ulp_errors(predicted, r, dtype, ulp=u)
    da = distribution(name, actual, r, dtype, errors=(ea, ra))
    dp = distribution(name, predicted, r, dtype, errors=(ep, rp))
    both = np.isfinite(ea) & np.isfinite(ep)
    ea, ep, ra, rp = (np.where(both, x, np.nan) for x in (ea, ep, ra, rp))
    d_signed = _row_means(ea) - _row_means(ep)
    d_radial = _row_means(ra) - _row_means(rp)
    ok_rows = np.isfinite(d_signed)
    n_rows = int(ok_rows.sum())
    nan2 = (math.nan, math.nan)
    if n_rows < min_rows:
        why = (f"{n_rows} usable rows < {min_rows} (too few samples, or non-finite outputs / references "
               f"below the dtype's smallest normal)")
        return StatVerdict(name, "undecided", da, dp, math.nan, nan2, math.nan, nan2, math.nan, math.nan,
                           alpha_test, margin_ulp, n_rows, why)
    bm, blo, bhi = _t_interval(d_signed, conf)
    rm, rlo, rhi = _t_interval(d_radial, conf)
    aa, ap = _row_means(np.abs(ea))[ok_rows], _row_means(np.abs(ep))[ok_rows]
    if np.array_equal(aa, ap):
        ks, ksp = 0.0, 1.0
    else:
        import warnings
        with warnings.catch_warnings():   # "exact calculation unsuccessful": scipy falls back to asymp
            warnings.simplefilter("ignore", RuntimeWarning)
            r = stats.ks_2samp(aa, ap, alternative="less")   # H1: actual's |err| stochastically larger
        ks, ksp = float(r.statistic), float(r.pvalue)
    reasons = []
    if blo > margin_ulp or bhi < -margin_ulp:
        reasons.append(f"signed bias {bm:+.3g} ulp, interval [{blo:+.3g}, {bhi:+.3g}] outside +-{margin_ulp:.3g}")
    if rlo > margin_ulp or rhi < -margin_ulp:
        reasons.append(f"radial bias {rm:+.3g} ulp, interval [{rlo:+.3g}, {rhi:+.3g}] outside +-{margin_ulp:.3g}")
    if ksp < alpha_test:
        reasons.append(f"row mean |err| distributions differ (KS D {ks:.3g}, p {ksp:.3g} < {alpha_test:.3g})")
    status = "fail" if reasons else "pass"
    return StatVerdict(name, status, da, dp, bm, (blo, bhi), rm, (rlo, rhi), ks, ksp, alpha_test,
                       margin_ulp, n_rows, "; ".join(reasons))


def judge_tensors(pairs: Mapping[str, tuple[Any, Any, Any]], dtype: str, *, alpha_test: float,
                  margin_ulp: float = DEFAULT_MARGIN_ULP) -> dict[str, StatVerdict]:
    """:func:`stat_compare` for several tensors: ``pairs[name] = (actual, predicted, ref)``."""
    return {n: stat_compare(n, a, p, r, dtype, alpha_test=alpha_test, margin_ulp=margin_ulp)
            for n, (a, p, r) in pairs.items()}


def summarize(verdicts: Sequence[StatVerdict]) -> dict[str, Any]:
    """Counts per status and the largest bias significance (for check metrics)."""
    st = [v.status for v in verdicts]
    sig = [v.bias_significance for v in verdicts if math.isfinite(v.bias_significance)]
    return {"n": len(st), "fail": st.count("fail"), "undecided": st.count("undecided"),
            "pass": st.count("pass"), "max_bias_significance": max(sig) if sig else math.nan,
            "min_ks_p": min((v.ks_p for v in verdicts if math.isfinite(v.ks_p)), default=math.nan)}


__all__ += ["judge_tensors", "summarize"]


def twin_prediction(problem, a: Mapping[str, Any], *, backward: bool = True, twin: Any = None) -> dict:
    """The CPU twin's outputs on the same inputs (``out`` and, with ``backward``, ``dq, dk, dv``):
    the prediction the statistical tier compares a target against."""
    from fa4verify.targets import TwinTarget
    tw = twin if twin is not None else TwinTarget()
    f = tw.forward(problem, a)
    d = {"out": f.out}
    if backward:
        g = tw.backward(problem, a, f, deterministic=True)
        d.update(dq=g.dq, dk=g.dk, dv=g.dv)
    return d


def tier_on(problem, got: Mapping[str, Any], refs: Mapping[str, Any], a: Mapping[str, Any], *,
            alpha_test: float, twin: Any = None) -> list:
    """Statistical verdicts of the tensors in ``got`` (names among out, dq, dk, dv) against the
    twin's prediction on the same inputs, with oracle values ``refs``."""
    pred = twin_prediction(problem, a, backward=any(n in got for n in ("dq", "dk", "dv")), twin=twin)
    dt = problem.dtype
    return [stat_compare(n, got[n], pred[n], refs[n], dt, alpha_test=alpha_test) for n in got]


__all__ += ["twin_prediction", "tier_on"]
