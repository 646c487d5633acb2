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

The forward O budget handed in by :func:`fa4verify.judge.attention.forward_allowances` is already
the element-wise minimum of the valid bounds among the first-order ``forward_out`` and the
convex-hull fallback ``forward_out_hull`` (Note [Hull fallback]); elements the fallback bounds
are judged like any other and counted in :attr:`Verdict.n_hull` (``compare(..., fallback=)``).

Note [A bound without power]
----------------------------
With ``blind_above`` (the gradient comparisons pass the judge's per-element thresholds,
``BudgetStats.bwd_blind_above``), a comparison that would pass although its allowance admits the
zero tensor -- every judged ``|ref| <= allowance`` -- while some ``|ref|`` exceeds its threshold is
``undecided``, never ``pass``: a bound a zero output meets has no power against any wrong value up
to twice the exact one (a dropped accumulation, a 1.5x fault). The backward interval bound is that
wide for dV on bf16 "huge" draws with ``e_qk >= 8`` (DERIVATIONS.md#backward-interval: its S
rounding model admits P errors of ``2^2`` to ``2^30``, and one-hot rows make dV = dO of one query,
no cancellation): CPU twin, 2026-12-02, a zeroed dV passed ``bwd_budget`` there (tightness 0.55 at
``e_qk`` 8, 8.6e-8 at 10). The threshold keeps the
legitimate cases decided: a tensor whose exact values all lie below the largest rounding level
of its terms before they cancel (``u_p`` times their size plus the P / dS cast floor ``p_sub``;
one-hot rows: ``dP - D`` ~ 0, so dQ and dK are rounding noise of the terms; a sink that leaves
every P below the fp16 subnormals) is one a correct kernel may return as ~0; and below :data:`BLIND_FLOOR` (the
fp32 normal range, where FA4's ``ex2.approx.ftz`` flushes) a value is 0 to the kernel. A
violation is still a ``fail``.

Undecided is never shown or counted as a pass: the audit maps it to exit 10, the gate raises
:class:`UndecidedError` whose message contains the word "undecided" and the reason.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Optional, Sequence

import numpy as np

__all__ = ["Verdict", "Element", "compare", "combine", "UndecidedError", "STATUSES", "worst_status",
           "StreamedCompare", "BLIND_FLOOR"]

STATUSES = ("pass", "fail", "undecided")
#: Note [A bound without power]: references at or below this (2^-126, the smallest normal fp32)
#: are indistinguishable from 0 in FA4's flushing arithmetic
BLIND_FLOOR = 2.0 ** -126
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
    #: judged elements whose allowance is the convex-hull fallback (``compare(..., fallback=)``;
    #: Note [Hull fallback], error_budgets/DERIVATIONS.md#hull-fallback); JSON key ``n_hull``
    n_hull: int = 0

    def _hull_text(self) -> str:
        return f" ({self.n_hull} by the hull fallback)" if self.n_hull else ""

    @property
    def ok(self) -> bool:
        return self.status == "pass"

    def summary(self) -> str:
        if self.status == "pass":
            return (f"{self.name}: {self.n_compared} elements within budget, tightness "
                    f"{self.tightness:.3g}{self._hull_text()}")
        if self.status == "fail":
            return (f"{self.name}: {self.n_over} / {self.n_compared} elements over budget "
                    f"(tightness {self.tightness:.3g}){self._hull_text()}; worst "
                    f"{self.worst.text() if self.worst else '?'}")
        return f"{self.name}: undecided: {self.reason}{self._hull_text()}"

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
            nan: str = "unjudged", max_violations: int = 5, all_indices: bool = False,
            fallback=None, blind_above=None) -> Verdict:
    """Judge ``actual`` against ``ref`` elementwise (see the module docstring).

    ``oracle_bound`` (the oracle's certified error) and ``budget`` (the composed error budget)
    broadcast to ``ref``; ``select`` (bool, broadcastable) restricts the comparison to some
    elements (the rest are neither judged nor unjudged: e.g. the rows a known issue owns are
    judged by that issue, not here). ``nan``: "unjudged" (default) or "match" for a NaN
    reference (see Note [Undecided]). ``fallback`` (bool, broadcastable; optional): the elements
    whose ``budget`` is the convex-hull fallback (:meth:`BudgetStats.forward_out_decided`); it
    changes no verdict, the judged ones among them are counted in :attr:`Verdict.n_hull`.
    ``blind_above`` (broadcastable): Note [A bound without power] (undecided instead of pass
    when the allowance admits the zero tensor and some ``|ref|`` exceeds it).
    """
    if nan not in ("unjudged", "match"):
        raise ValueError(f"nan={nan!r}: expected 'unjudged' or 'match'")
    a = np.asarray(actual, np.float64)
    r = np.asarray(ref, np.float64)
    if a.shape != r.shape:
        return Verdict(name, "fail", 0, 0, 0, math.inf, math.inf, None, (),
                       f"shape {a.shape} != oracle shape {r.shape}")
    if select is None and r.ndim and r.size:
        v = _compare_all_judged(name, a, r, oracle_bound, budget, all_indices, fallback, blind_above)
        if v is not None:
            return v
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
        if blind_above is not None and n_cmp:
            reason = _blind(name, r, allowed, blind_above, judged_fin)
            status = "undecided" if reason else status
    n_hull = 0 if fallback is None else int((judged_fin & np.broadcast_to(np.asarray(fallback, bool), r.shape)).sum())
    return Verdict(name, status, n_cmp, n_over, n_unj, tight, maxerr, worst, viol, reason,
                   np.argwhere(over_all) if all_indices else None, n_hull)


def _compare_all_judged(name: str, a: np.ndarray, r: np.ndarray, oracle_bound, budget, all_indices: bool,
                        fallback, blind_above) -> Optional[Verdict]:
    """Note [The common verdict]: :func:`compare` where every element is judged and none is over
    -- a finite ``actual`` and ``ref``, every allowance finite and non-negative, nothing
    selected away -- in a third of the general path's array passes (the judge's largest cost on
    the audit's long rows: 34k-key dK / dV, eight comparisons each); None otherwise (the general
    path decides then). The figures are the general path's bit for bit (``tests/test_judge_verdict.py``
    compares the two on random and edge inputs)."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        ob = np.asarray(oracle_bound, np.float64)
        bu = np.asarray(budget, np.float64)
        if not (ob.size and bu.size and ob.min() >= 0 and bu.min() >= 0):    # a NaN min fails too
            return None
        allowed = np.broadcast_to(ob + bu, r.shape)
        if not np.isfinite(allowed).all():
            return None
        err = np.subtract(a, r)
        np.abs(err, out=err)
        if not np.isfinite(err).all():               # a non-finite actual or ref, or |a - r| overflows
            return None
        if np.count_nonzero(err > allowed):          # a violation: the general path names it
            return None
        ratio = np.divide(err, allowed)              # a zero allowance has a zero error here (else over)
        tight = float(ratio.max())
        if math.isnan(tight):                        # 0 / 0: the general path's exact element, ratio 0
            np.copyto(ratio, 0.0, where=np.isnan(ratio))
            tight = float(ratio.max())
        maxerr = float(err.max())
        wi = tuple(int(x) for x in np.unravel_index(int(np.argmax(ratio)), r.shape))
        worst = Element(wi, float(a[wi]), float(r[wi]), float(err[wi]), float(allowed[wi]))
        reason = "" if blind_above is None else _blind(name, r, allowed, blind_above)
        status = "undecided" if reason else "pass"
    n_hull = 0 if fallback is None else int(np.count_nonzero(np.broadcast_to(np.asarray(fallback, bool), r.shape)))
    return Verdict(name, status, int(r.size), 0, 0, tight, maxerr, worst, (), reason,
                   np.empty((0, r.ndim), np.intp) if all_indices else None, n_hull)


def _blind(name: str, r: np.ndarray, allowed: np.ndarray, blind_above, judged: Optional[np.ndarray] = None) -> str:
    """Note [A bound without power]: why a comparison that passes is undecided -- its allowance
    admits the zero tensor (every judged ``|ref| <= allowed``) while some judged ``|ref|`` exceeds
    ``blind_above`` -- or "" when it is not. ``judged``: the judged elements (None: all)."""
    with np.errstate(invalid="ignore"):
        ar = np.abs(r)
        big = ar > np.broadcast_to(np.asarray(blind_above, np.float64), r.shape)
        over = ar > allowed
    if judged is not None:
        big, over = big & judged, over & judged
    if not big.any() or over.any():
        return ""
    i = np.unravel_index(int(np.argmax(np.where(big, ar, -1.0))), r.shape)
    return (f"impossible question at this precision: the bound admits a zero {name}: every |exact| is within its "
            f"allowance (largest |exact| {abs(float(r[i])):.3g}, allowed {float(allowed[i]):.3g} there), so a kernel "
            f"that skipped it would pass too: no power against a wrong gradient at this logit scale (Note [A bound "
            f"without power])")


def _undecided_reason(n_cmp, sel, fin, isnan_ref, ob, bu, nan) -> str:
    if not sel.any():
        return _undecided_text(n_cmp, False, 0, 0, 0, 0)
    n_nan = int((sel & isnan_ref).sum()) if nan != "match" else 0
    bad_ob = sel & fin & ~(np.isfinite(ob) & (ob >= 0))
    bad_bu = sel & fin & ~(np.isfinite(bu) & (bu >= 0))
    nneg = int((sel & fin & np.isfinite(bu) & (bu < 0)).sum())
    return _undecided_text(n_cmp, True, n_nan, int(bad_ob.sum()), int(bad_bu.sum()), nneg)


def _undecided_text(n_cmp: int, any_sel: bool, n_nan: int, n_bad_ob: int, n_bad_bu: int, nneg: int) -> str:
    """The undecided reason from its counts (shared by :func:`compare` and :class:`StreamedCompare`)."""
    if not any_sel:
        return "nothing compared (no element selected)"
    parts = []
    if n_nan:
        parts.append(f"{n_nan} oracle value(s) NaN (non-finite inputs: the budget defines nothing there)")
    if n_bad_ob:
        parts.append(f"{n_bad_ob} oracle bound(s) non-finite or negative (the oracle could not certify)")
    if n_bad_bu:
        parts.append(f"{n_bad_bu} budget value(s) non-finite or negative"
                     + (f" ({nneg} negative)" if nneg else "") + " (the composed budget is not valid here)")
    if n_cmp == 0:
        parts.append("nothing compared")
    return "; ".join(parts) or "nothing compared"


#: upper edges of the tightness histogram bins of :class:`StreamedCompare` (the last bin: > 1, over)
HIST_EDGES = (0.0, 1e-3, 1e-2, 0.1, 0.25, 0.5, 0.75, 1.0)


class StreamedCompare:
    """:func:`compare`'s policy (Note [Undecided]) accumulated over chunks of torch tensors on any
    device, so that a long-context judgement moves only scalars to the host: counts, the
    maximum tightness and error, the worst element and the first ``max_violations`` violations
    (the same elements :func:`compare` picks: largest ratio, ties by C order), the oracle-bound
    share and a tightness histogram.

    ``shape``: the whole compared array's shape; each :meth:`add` passes a slab of it along axis
    ``axis`` starting at ``start`` (any order, each element once). :meth:`verdict` equals
    ``compare(name, whole actual, whole ref, oracle_bound=..., budget=...)`` on the concatenation
    (``tests/test_long_context_device.py`` checks it, NaN/inf/negative budgets included).

    Elementwise arithmetic is IEEE float64 in torch as in numpy (``|a - r|``, ``err / allowed``),
    so the figures are bitwise those of :func:`compare`."""

    def __init__(self, name: str, shape: Sequence[int], axis: int, *, nan: str = "unjudged",
                 max_violations: int = 5):
        if nan not in ("unjudged", "match"):
            raise ValueError(f"nan={nan!r}: expected 'unjudged' or 'match'")
        self.name, self.shape, self.axis, self.nan, self.k = name, tuple(int(x) for x in shape), int(axis), nan, max_violations
        self.n_cmp = self.n_over = self.n_unj = self.n_sel = 0
        self.n_nan = self.n_bad_ob = self.n_bad_bu = self.n_neg = 0
        self.tight, self.maxerr, self.share = 0.0, 0.0, -math.inf
        self.worst: Optional[tuple] = None        # (ratio, flat index, Element)
        self.viol: list = []                      # [(ratio, flat index, Element)]
        self.hist = [0] * (len(HIST_EDGES) + 1)   # bins (.., 0], (0, e_1], ..., (0.75, 1], (1, inf]
        self.shape_error = ""

    def _flat(self, local_shape, start: int, li: int) -> tuple[int, tuple[int, ...]]:
        idx = list(np.unravel_index(li, local_shape))
        idx[self.axis] += start
        idx = tuple(int(x) for x in idx)
        return int(np.ravel_multi_index(idx, self.shape)), idx

    def add(self, actual, ref, oracle_bound, budget, start: int = 0) -> None:
        """Judge one slab (torch tensors, broadcastable ``oracle_bound`` and ``budget``)."""
        import torch
        f64 = torch.float64
        r = ref.to(f64)
        a = actual.to(device=r.device, dtype=f64)
        if tuple(a.shape) != tuple(r.shape):
            self.shape_error = f"shape {tuple(a.shape)} != oracle shape {tuple(r.shape)}"
            return
        ob = torch.as_tensor(oracle_bound, dtype=f64, device=r.device).expand(r.shape)
        bu = torch.as_tensor(budget, dtype=f64, device=r.device).expand(r.shape)
        allowed = ob + bu
        valid_allow = torch.isfinite(ob) & torch.isfinite(bu) & (ob >= 0) & (bu >= 0)
        fin = torch.isfinite(r)
        isinf_ref = torch.isinf(r)
        isnan_ref = torch.isnan(r)
        judged_fin = fin & valid_allow
        judged_nan = isnan_ref if self.nan == "match" else torch.zeros_like(fin)
        judged = judged_fin | isinf_ref | judged_nan
        zero = torch.zeros((), dtype=f64, device=r.device)
        inf = torch.full((), math.inf, dtype=f64, device=r.device)
        err = torch.where(judged_fin, (a - r).abs(), zero)
        err = torch.where(judged_fin & ~torch.isfinite(err), inf, err)
        ratio = torch.where(judged_fin, torch.where(err == 0, zero, err / torch.where(allowed > 0, allowed, zero)), zero)
        ratio = torch.where(judged_fin & torch.isnan(ratio), inf, ratio)
        over = judged_fin & ((err > allowed) | ~torch.isfinite(a))
        bad = (isinf_ref & (a != r)) | (judged_nan & torch.isfinite(a))
        ratio = torch.where(bad, inf, ratio)
        over_all = over | bad
        # the scalars that come back
        cnt = torch.stack([judged.sum(), over_all.sum(), (~judged).sum(),
                           (isnan_ref.sum() if self.nan != "match" else torch.zeros((), dtype=torch.long, device=r.device)),
                           (fin & ~(torch.isfinite(ob) & (ob >= 0))).sum(), (fin & ~(torch.isfinite(bu) & (bu >= 0))).sum(),
                           (fin & torch.isfinite(bu) & (bu < 0)).sum()]).tolist()
        n_cmp, n_over = int(cnt[0]), int(cnt[1])
        self.n_cmp += n_cmp
        self.n_over += n_over
        self.n_unj += int(cnt[2])
        self.n_nan += int(cnt[3])
        self.n_bad_ob += int(cnt[4])
        self.n_bad_bu += int(cnt[5])
        self.n_neg += int(cnt[6])
        self.n_sel += r.numel()
        if r.numel():
            mx = torch.stack([ratio.max(), err.max()]).tolist()
            self.tight, self.maxerr = max(self.tight, mx[0]), max(self.maxerr, mx[1])
            edges = torch.tensor(HIST_EDGES, dtype=f64, device=r.device)
            # bucketize: bin i holds edges[i-1] < x <= edges[i]; bin 0: x <= 0; the last: x > 1
            h = torch.bincount(torch.bucketize(ratio[judged_fin], edges), minlength=len(HIST_EDGES) + 1).tolist()
            for i, c in enumerate(h):
                self.hist[i] += int(c)
            sh = ob / (ob + bu)
            sh = sh[torch.isfinite(sh)]
            if sh.numel():
                self.share = max(self.share, float(sh.max()))
        if n_cmp:
            flat = torch.where(judged, ratio, torch.full((), -1.0, dtype=f64, device=r.device)).reshape(-1)
            li = int(torch.argmax(flat))
            self._offer_worst(self._elem(a, r, err, ratio, allowed, judged_fin, li, start))
        if n_over:
            oi = torch.nonzero(over_all.reshape(-1)).reshape(-1)
            rv = ratio.reshape(-1)[oi]
            order = torch.sort(rv, descending=True, stable=True).indices[: self.k]
            for li in oi[order].tolist():
                self.viol.append(self._elem(a, r, err, ratio, allowed, judged_fin, int(li), start))
            self.viol.sort(key=lambda t: (-t[0], t[1]))
            del self.viol[self.k:]

    def _elem(self, a, r, err, ratio, allowed, judged_fin, li: int, start: int):
        """(ratio, flat index in the whole array, Element) of local flat index ``li``."""
        shp = tuple(r.shape)
        loc = tuple(int(x) for x in np.unravel_index(li, shp))
        gf, gidx = self._flat(shp, start, li)
        av, rv, ev, al, rt = (float(x[loc]) for x in (a, r, err, allowed, ratio))
        e = ev if bool(judged_fin[loc]) else (0.0 if av == rv else math.inf)
        return (rt, gf, Element(gidx, av, rv, e, al))

    def _offer_worst(self, t) -> None:
        if self.worst is None or (t[0], -t[1]) > (self.worst[0], -self.worst[1]):
            self.worst = t

    def verdict(self) -> Verdict:
        """The :class:`Verdict` of everything added (as :func:`compare` on the whole array)."""
        name = self.name
        if self.shape_error:
            return Verdict(name, "fail", 0, 0, 0, math.inf, math.inf, None, (), self.shape_error)
        worst = self.worst[2] if (self.worst is not None and self.n_cmp) else None
        viol = tuple(t[2] for t in self.viol) if self.n_over else ()
        if self.n_over:
            status, reason = "fail", f"{self.n_over} of {self.n_cmp} judged elements over oracle bound + budget"
        elif self.n_unj or self.n_cmp == 0:
            status = "undecided"
            reason = _undecided_text(self.n_cmp, self.n_sel > 0, self.n_nan, self.n_bad_ob, self.n_bad_bu, self.n_neg)
        else:
            status, reason = "pass", ""
        return Verdict(name, status, self.n_cmp, self.n_over, self.n_unj, float(self.tight), float(self.maxerr),
                       worst, viol, reason)

    @property
    def oracle_bound_share(self) -> float:
        """max over elements of oracle_bound / (oracle_bound + budget) (finite ones; NaN if none)."""
        return self.share if self.share > -math.inf else math.nan

    def histogram(self) -> dict:
        """Judged elements by tightness |err| / allowed: bin upper edges and counts (last: > 1)."""
        return {"edges": list(HIST_EDGES) + [math.inf], "counts": list(self.hist)}
