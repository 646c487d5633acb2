"""The certified sup-norm enclosure of FA4's exp2 polynomials contains the true maximum."""
from __future__ import annotations

import pytest

from fa4verify.kernels.fa4_params import load_params
from fa4verify.oracles.poly_bound import certified_sup_rel_error

mpmath = pytest.importorskip("mpmath")


def sampled_max(coeffs, n: int = 2001) -> tuple[float, float]:
    """max |p(f)/2^f - 1| over a uniform grid of n points, at 60 digits (independent of iv)."""
    mp = mpmath.mp
    with mp.workdps(60):
        cs = [mp.mpf(float(c)) for c in coeffs]
        best, arg = mp.mpf(0), 0.0
        for k in range(n):
            f = mp.mpf(k) / (n - 1)
            v = abs(mp.polyval(cs[::-1], f) / mp.power(2, f) - 1)
            if v > best:
                best, arg = v, float(f)
    return float(best), arg


@pytest.mark.parametrize("degree", [1, 2, 3, 4, 5])
def test_enclosure_contains_dense_sample_maximum(degree):
    coeffs = load_params().poly_ex2[degree]
    b = certified_sup_rel_error(coeffs, rel_tol=1e-5)
    s, arg = sampled_max(coeffs)
    assert b.converged and b.lower <= b.upper <= b.lower * (1 + 1e-5) + 1e-300
    assert s <= b.upper, (s, b)
    # the sample is dense: its max is within 0.5% of the certified bound
    assert s >= b.lower * 0.995, (s, b)


def test_known_magnitudes_of_fa4_polynomials():
    """Orders of magnitude published for these polynomials (FA4 paper Table 2 reports fp32
    measurements 8.77e-5 / 3.05e-6 / 1.44e-7, which add the fp32 rounding of the result)."""
    exp = {3: (8.7e-5, 8.8e-5), 4: (2.9e-6, 3.06e-6), 5: (8.0e-8, 1.45e-7)}
    for d, (lo, hi) in exp.items():
        b = certified_sup_rel_error(load_params().poly_ex2[d], rel_tol=1e-4)
        assert lo <= b.lower <= b.upper <= hi, (d, b)


def test_perturbed_polynomial_gets_a_larger_certified_bound():
    c = list(load_params().poly_ex2[3])
    base = certified_sup_rel_error(c, rel_tol=1e-4)
    c[2] += 1e-3
    worse = certified_sup_rel_error(c, rel_tol=1e-4)
    assert worse.lower > base.upper


def test_exact_exponential_series_truncation_has_known_error():
    """p(f) = 1 + f ln2 (not minimax): error at f = 1 is 1 - (1 + ln2)/2 = 0.15342640972..."""
    import math
    b = certified_sup_rel_error((1.0, math.log(2)), rel_tol=1e-8)
    exact = 1 - (1 + math.log(2)) / 2
    assert b.lower <= exact * (1 + 1e-15) and b.upper >= exact * (1 - 1e-15)
    assert b.upper - b.lower <= 1e-8 * exact
