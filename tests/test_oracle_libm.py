"""The fast reference's libm assumption holds on this machine: numpy float64 exp, log, tanh and
cosh have relative error <= EPS_F = EPS_F_ULP * 2^-52 (Assumption [libm accuracy] in
``oracles.reference``).

Checked against x87 ``longdouble`` (64-bit significand, itself within ~1 ulp of 2^-63, i.e.
2^-11 float64 ulp) on 2e5 points per function over the ranges the oracle uses, and against
mpmath at 120 bits on 1500 points. Subnormal results are excluded (covered by the absolute tau).
"""
from __future__ import annotations

import mpmath
import numpy as np
import pytest

from fa4verify.oracles.reference import EPS_F, EPS_F_ULP

N = 200_000
FUNCS = {
    "exp": (np.exp, mpmath.exp, [(-745.0, 0.0), (0.0, 709.0), (-1e-6, 1e-6)]),
    "log": (np.log, mpmath.log, [(1.0, 2.0), (1.0, 1e6), (1e-300, 1e300)]),
    "tanh": (np.tanh, mpmath.tanh, [(-25.0, 25.0), (-1e-3, 1e-3), (-1e5, 1e5)]),
    "cosh": (np.cosh, mpmath.cosh, [(-709.0, 709.0), (-1.0, 1.0)]),
}


def _samples(lo: float, hi: float, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if lo > 0:   # log-uniform for wide positive ranges
        return np.exp(rng.uniform(np.log(lo), np.log(hi), n))
    return rng.uniform(lo, hi, n)


@pytest.mark.parametrize("name", sorted(FUNCS))
def test_numpy_float64_function_within_assumed_ulps_vs_longdouble(name):
    if np.finfo(np.longdouble).nmant < 63:
        pytest.skip("longdouble is not x87 extended precision on this platform")
    f, _, ranges = FUNCS[name]
    worst = 0.0
    for i, (lo, hi) in enumerate(ranges):
        x = _samples(lo, hi, N, i)
        ref = f(x.astype(np.longdouble))
        got = f(x)
        keep = np.abs(ref) >= 2.0 ** -1022
        rel = (np.abs((got[keep].astype(np.longdouble) - ref[keep]) / ref[keep])).astype(np.float64)
        worst = max(worst, float(rel.max()))
    assert worst <= EPS_F, f"np.{name}: max relative error {worst / 2**-52:.3f} x 2^-52 > {EPS_F_ULP}"


@pytest.mark.parametrize("name", sorted(FUNCS))
def test_numpy_float64_function_within_assumed_ulps_vs_mpmath(name):
    f, mf, ranges = FUNCS[name]
    ctx = mpmath.MPContext()
    ctx.prec = 120
    worst = 0.0
    for i, (lo, hi) in enumerate(ranges):
        x = _samples(lo, hi, 500, 100 + i)
        got = f(x)
        for xi, gi in zip(x, got):
            r = getattr(ctx, name)(ctx.mpf(float(xi)))
            if abs(r) < 2.0 ** -1022:
                continue
            worst = max(worst, float(abs((ctx.mpf(float(gi)) - r) / r)))
    assert worst <= EPS_F, f"np.{name}: max relative error {worst / 2**-52:.3f} x 2^-52 > {EPS_F_ULP}"
