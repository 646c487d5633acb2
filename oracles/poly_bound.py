"""Certified sup-norm of the relative error of FA4's exp2 polynomials on [0, 1].

For coefficients ``c`` (exact binary32 numbers, ``POLY_EX2[d]``), ``p(f) = sum c_i f^i`` with exact
real arithmetic, and

    E(p) = max_{f in [0, 1]} |p(f) / 2^f - 1|.

``certified_sup_rel_error(coeffs)`` returns an enclosure ``[lower, upper]`` of ``E(p)``: ``lower`` is
``|g(f*)|`` at the best point found (its interval's lower end), ``upper`` is certified by branch and
bound with ``mpmath.iv`` interval arithmetic: on every subinterval ``I`` with midpoint ``m``,
``g(I)`` lies in the second-order Taylor form ``g(m) + g'(m) h + g''(I) h^2 / 2`` (h = I - m,
Lagrange remainder) where ``g(f) = p(f) 2^-f - 1``, ``g'(f) = (p'(f) - ln2 p(f)) 2^-f`` and
``g''(f) = (p'' - 2 ln2 p' + ln2^2 p) 2^-f`` are enclosed with interval arithmetic; intervals whose bound
cannot exceed the current lower bound are discarded, the others are bisected until
``upper <= lower * (1 + rel_tol)``. This is the rigorous counterpart of Sollya's ``supnorm``.

This is the *mathematical* error of the polynomial (exact coefficients, exact evaluation); the
fp32 Horner rounding and the range reduction are measured by ``fa4verify exp2`` (the sweep).

Accuracy
--------
``lower <= E(p) <= upper`` rigorously (outward-rounded interval arithmetic at ``prec`` bits);
``upper / lower - 1 <= rel_tol`` on return unless ``max_intervals`` was hit (then
``converged=False``).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

__all__ = ["PolyBound", "certified_sup_rel_error"]


@dataclass(frozen=True)
class PolyBound:
    """Enclosure of ``max_{[0,1]} |p(f)/2^f - 1|``. ``argmax`` is the point giving ``lower``."""
    lower: float
    upper: float
    argmax: float
    converged: bool
    intervals: int
    prec: int
    degree: int

    def as_dict(self) -> dict:
        return {"lower": self.lower, "upper": self.upper, "argmax": self.argmax,
                "converged": self.converged, "intervals": self.intervals, "prec_bits": self.prec,
                "degree": self.degree}


def certified_sup_rel_error(coeffs, *, rel_tol: float = 1e-6, prec: int = 80,
                            initial_pieces: int = 64, max_intervals: int = 20000) -> PolyBound:
    """Certified ``[lower, upper]`` of ``max_{f in [0,1]} |p(f)/2^f - 1|`` (see module docstring).

    ``coeffs = (c0, c1, ..., cd)``, each a float (taken exactly).
    """
    import mpmath
    iv = mpmath.iv
    old = iv.prec
    iv.prec = prec
    try:
        cs = [iv.mpf(float(c)) for c in coeffs]
        dcs = [cs[i] * i for i in range(1, len(cs))]
        ddcs = [dcs[i] * i for i in range(1, len(dcs))]
        ln2 = iv.log(2)

        def horner(poly, x):
            acc = poly[-1] if poly else iv.mpf(0)
            for c in reversed(poly[:-1]):
                acc = acc * x + c
            return acc

        def g(x):
            return horner(cs, x) * iv.exp(-x * ln2) - 1

        def dg(x):
            return (horner(dcs, x) - ln2 * horner(cs, x)) * iv.exp(-x * ln2)

        def d2g(x):
            return (horner(ddcs, x) - 2 * ln2 * horner(dcs, x) + ln2 * ln2 * horner(cs, x)) * iv.exp(-x * ln2)

        def absmax(v) -> float:                 # upper end of |v|
            return float(max(abs(mpmath.mpf(v.a)), abs(mpmath.mpf(v.b))))

        def absmin(v) -> float:                 # lower end of |v|
            a, b = mpmath.mpf(v.a), mpmath.mpf(v.b)
            if a <= 0 <= b:
                return 0.0
            return float(min(abs(a), abs(b)))

        best_lo, best_x = 0.0, 0.0

        def bound(a: float, b: float) -> float:
            nonlocal best_lo, best_x
            m = (a + b) / 2
            gm = g(iv.mpf(m))
            lo_m = absmin(gm)
            if lo_m > best_lo:
                best_lo, best_x = lo_m, m
            for e in (a, b):
                ge = g(iv.mpf(e))
                le = absmin(ge)
                if le > best_lo:
                    best_lo, best_x = le, e
            I = iv.mpf([a, b])
            h = I - m
            # second-order Taylor form with Lagrange remainder: g(I) in g(m) + g'(m) h + g''(I) h^2 / 2
            enc = gm + dg(iv.mpf(m)) * h + d2g(I) * (h ** 2) / 2
            return absmax(enc)

        heap: list[tuple[float, float, float]] = []
        n_eval = 0
        for k in range(initial_pieces):
            a, b = k / initial_pieces, (k + 1) / initial_pieces
            heapq.heappush(heap, (-bound(a, b), a, b))
            n_eval += 1
        converged = False
        while heap:
            ub = -heap[0][0]
            if ub <= best_lo * (1 + rel_tol):
                converged = True
                break
            if n_eval >= max_intervals:
                break
            _, a, b = heapq.heappop(heap)
            m = (a + b) / 2
            for lo_, hi_ in ((a, m), (m, b)):
                u = bound(lo_, hi_)
                n_eval += 1
                if u > best_lo:
                    heapq.heappush(heap, (-u, lo_, hi_))
        upper = max(-heap[0][0], best_lo) if heap else best_lo
        return PolyBound(lower=best_lo, upper=upper, argmax=best_x, converged=converged or not heap,
                         intervals=n_eval, prec=prec, degree=len(coeffs) - 1)
    finally:
        iv.prec = old
