"""The one comparison of fa4verify: ``|actual - ref| <= oracle_bound + budget``, elementwise,
with a three-valued verdict.

Every verdict about a kernel output (audit checks, the public gate, fuzz properties, mutant
verifiers, attribution) comes from :func:`compare`; nothing else in fa4verify compares a kernel
output with an oracle under a budget.

Policy (Note [Undecided])
-------------------------
An element is *judged* when the oracle value ``ref`` is finite and its allowance
``oracle_bound + budget`` is a finite, non-negative number; then it is *over* when
``|actual - ref| > allowance`` (a NaN or infinite ``actual`` is over). A reference of ``+inf`` /
``-inf`` (e.g. the LSE of a fully masked row) is judged by equality. A reference NaN is judged
only under ``nan="match"`` (then ``actual`` must be non-finite there: poison must not be
swallowed); otherwise it is *unjudged*. Elements with a non-finite or negative oracle bound or
budget are always unjudged: the tool does not know the answer there.

The verdict:

* ``fail``      -- at least one judged element is over (a definite violation; unjudged
  elements elsewhere do not soften it);
* ``undecided`` -- nothing over, but some element is unjudged, or nothing at all was compared;
* ``pass``      -- every element judged and none over.

Undecided is never shown or counted as a pass: the audit maps it to exit 10, the gate raises
:class:`UndecidedError` whose message contains the word "undecided" and the reason.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Optional, Sequence

import numpy as np

__all__ = ["Verdict", "Element", "compare", "combine", "UndecidedError", "STATUSES", "worst_status"]

STATUSES = ("pass", "fail", "undecided")
_RANK = {"pass": 0, "undecided": 1, "fail": 2}


class UndecidedError(AssertionError):
    """Raised by gates when a comparison is undecided (the message says "undecided" and why).

    A subclass of AssertionError so that a test using the gate fails (never passes) on it."""

    def __init__(self, message: str, verdicts: Sequence["Verdict"] = ()):
        super().__init__(message)
        self.verdicts = tuple(verdicts)


@dataclasses.dataclass(frozen=True)
class Element:
    """One compared element: its index in the compared array and the figures."""

    index: tuple[int, ...]
    actual: float
    ref: float
    err: float
    allowed: float

    @property
    def ratio(self) -> float:
        if self.err == 0:
            return 0.0
        return self.err / self.allowed if self.allowed > 0 else math.inf

    def text(self) -> str:
        return (f"{self.index}: got {self.actual:.6g}, oracle {self.ref:.6g}, |err| {self.err:.3g} "
                f"{'>' if self.err > self.allowed or not math.isfinite(self.err) else '<='} allowed "
                f"{self.allowed:.3g}")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What :func:`compare` decided about one tensor."""

    name: str
    status: str
    n_compared: int          #: judged elements
    n_over: int              #: judged elements over their allowance
    n_unjudged: int          #: elements the tool cannot judge (see Note [Undecided])
    tightness: float         #: max over judged elements of |err| / allowed (0 if none; inf if over by NaN)
    max_abs_err: float       #: over judged finite-reference elements (inf for a NaN actual)
    worst: Optional[Element]
    violations: tuple[Element, ...] = ()
    reason: str = ""         #: why undecided (or fail), one line
    #: indices of every over element (C order), only with ``compare(..., all_indices=True)``
    over_indices: Optional[np.ndarray] = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.status == "pass"

    def summary(self) -> str:
        if self.status == "pass":
            return (f"{self.name}: {self.n_compared} elements within budget, tightness "
                    f"{self.tightness:.3g}")
        if self.status == "fail":
            return (f"{self.name}: {self.n_over} / {self.n_compared} elements over budget "
                    f"(tightness {self.tightness:.3g}); worst {self.worst.text() if self.worst else '?'}")
        return f"{self.name}: undecided: {self.reason}"

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "over_indices"}
        d["worst"] = None if self.worst is None else dataclasses.asdict(self.worst)
        d["violations"] = [dataclasses.asdict(v) for v in self.violations]
        return d


def worst_status(statuses: Iterable[str]) -> str:
    """fail > undecided > pass; ``pass`` for an empty iterable is NOT what callers want, so an
    empty input gives ``undecided``."""
    st = list(statuses)
    if not st:
        return "undecided"
    return max(st, key=lambda s: _RANK[s])


def combine(verdicts: Sequence[Verdict]) -> str:
    """The status of several verdicts together (fail > undecided > pass; none -> undecided)."""
    return worst_status(v.status for v in verdicts)


def compare(name: str, actual, ref, *, oracle_bound=0.0, budget=0.0, select=None,
            nan: str = "unjudged", max_violations: int = 5, all_indices: bool = False) -> Verdict:
    """Judge ``actual`` against ``ref`` elementwise (see the module docstring).

    ``oracle_bound`` (the oracle's certified error) and ``budget`` (the composed error budget)
    broadcast to ``ref``; ``select`` (bool, broadcastable) restricts the comparison to some
    elements (the rest are neither judged nor unjudged: e.g. the rows a known issue owns are
    judged by that issue, not here). ``nan``: "unjudged" (default) or "match" for a NaN
    reference (see Note [Undecided]).
    """
    if nan not in ("unjudged", "match"):
        raise ValueError(f"nan={nan!r}: expected 'unjudged' or 'match'")
    a = np.asarray(actual, np.float64)
    r = np.asarray(ref, np.float64)
    if a.shape != r.shape:
        return Verdict(name, "fail", 0, 0, 0, math.inf, math.inf, None, (),
                       f"shape {a.shape} != oracle shape {r.shape}")
    with np.errstate(invalid="ignore", over="ignore"):
        ob = np.broadcast_to(np.asarray(oracle_bound, np.float64), r.shape)
        bu = np.broadcast_to(np.asarray(budget, np.float64), r.shape)
        allowed = ob + bu
    sel = np.ones(r.shape, bool) if select is None else np.broadcast_to(np.asarray(select, bool), r.shape)
    valid_allow = np.isfinite(ob) & np.isfinite(bu) & (ob >= 0) & (bu >= 0)
    fin = np.isfinite(r)
    isinf_ref = np.isinf(r)
    isnan_ref = np.isnan(r)
    judged_fin = sel & fin & valid_allow
    judged_inf = sel & isinf_ref
    judged_nan = sel & isnan_ref if nan == "match" else np.zeros(r.shape, bool)
    unjudged = sel & ~(judged_fin | judged_inf | judged_nan)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        err = np.where(judged_fin, np.abs(a - r), 0.0)
        err = np.where(judged_fin & ~np.isfinite(err), np.inf, err)
        ratio = np.where(judged_fin, np.where(err == 0, 0.0, err / np.where(allowed > 0, allowed, 0.0)), 0.0)
    ratio = np.where(judged_fin & np.isnan(ratio), np.inf, ratio)
    over = judged_fin & (err > allowed)
    over |= judged_fin & ~np.isfinite(a)
    inf_bad = judged_inf & (a != r)
    nan_bad = judged_nan & np.isfinite(a)
    ratio = np.where(inf_bad | nan_bad, np.inf, ratio)
    over_all = over | inf_bad | nan_bad
    n_cmp = int((judged_fin | judged_inf | judged_nan).sum())
    n_over = int(over_all.sum())
    n_unj = int(unjudged.sum())
    tight = float(ratio.max()) if ratio.size else 0.0
    maxerr = float(err.max()) if err.size else 0.0

    def elem(flat_i: int) -> Element:
        idx = tuple(int(x) for x in np.unravel_index(flat_i, r.shape))
        e = float(err[idx]) if judged_fin[idx] else (0.0 if a[idx] == r[idx] else math.inf)
        return Element(idx, float(a[idx]), float(r[idx]), e, float(allowed[idx]))

    judged = judged_fin | judged_inf | judged_nan
    worst = elem(int(np.argmax(np.where(judged, ratio, -1.0)))) if n_cmp else None   # a judged element
    viol: tuple[Element, ...] = ()
    if n_over:
        order = np.argsort(-np.where(over_all, ratio, -1.0), axis=None, kind="stable")[:max_violations]
        viol = tuple(elem(int(i)) for i in order if over_all.flat[int(i)])
    if n_over:
        status, reason = "fail", f"{n_over} of {n_cmp} judged elements over oracle bound + budget"
    elif n_unj or n_cmp == 0:
        status = "undecided"
        reason = _undecided_reason(n_cmp, sel, fin, isnan_ref, ob, bu, nan)
    else:
        status, reason = "pass", ""
    return Verdict(name, status, n_cmp, n_over, n_unj, tight, maxerr, worst, viol, reason,
                   np.argwhere(over_all) if all_indices else None)


def _undecided_reason(n_cmp, sel, fin, isnan_ref, ob, bu, nan) -> str:
    parts = []
    if not sel.any():
        return "nothing compared (no element selected)"
    n_nan = int((sel & isnan_ref).sum()) if nan != "match" else 0
    if n_nan:
        parts.append(f"{n_nan} oracle value(s) NaN (non-finite inputs: the budget defines nothing there)")
    bad_ob = sel & fin & ~(np.isfinite(ob) & (ob >= 0))
    if bad_ob.any():
        parts.append(f"{int(bad_ob.sum())} oracle bound(s) non-finite or negative (the oracle could not certify)")
    bad_bu = sel & fin & ~(np.isfinite(bu) & (bu >= 0))
    if bad_bu.any():
        nneg = int((sel & fin & np.isfinite(bu) & (bu < 0)).sum())
        parts.append(f"{int(bad_bu.sum())} budget value(s) non-finite or negative"
                     + (f" ({nneg} negative)" if nneg else "") + " (the composed budget is not valid here)")
    if n_cmp == 0:
        parts.append("nothing compared")
    return "; ".join(parts) or "nothing compared"
