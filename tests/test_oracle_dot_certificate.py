"""The score-error row constants of the fast reference are rigorous: for every row i and key j,
``|BLAS(a_i . b_j) - exact(a_i . b_j)| <= dot_error_rows(a, b)[i]``, with exact values from
Python fractions; rows the certificate calls exact are exact."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from fa4verify.oracles.reference import dot_error_rows

ml_dtypes = pytest.importorskip("ml_dtypes")


def _exact_dots(a: np.ndarray, b: np.ndarray) -> list[list[Fraction]]:
    return [[sum((Fraction(float(x)) * Fraction(float(y)) for x, y in zip(ai, bj)), Fraction(0))
             for bj in b] for ai in a]


@pytest.mark.parametrize("dtype,bits", [("bf16", 8), ("fp16", 11), ("fp32", 24)])
@pytest.mark.parametrize("spread", [0.0, 12.0, 40.0])
def test_dot_error_rows_bound_the_blas_error_against_exact_fractions(dtype, bits, spread):
    rng = np.random.default_rng(int(spread) * 7 + bits)
    dt = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16, "fp32": np.float32}[dtype]
    n, m, d = 12, 15, 24
    # magnitudes spread over 2^spread: some pairs cannot be certified exact
    def draw(shape):
        x = rng.standard_normal(shape) * 2.0 ** rng.uniform(-spread, 0, shape)
        return x.astype(np.float32).astype(dt).astype(np.float64)
    a, b = draw((n, d)), draw((m, d))
    a[3] = 0.0
    err = dot_error_rows(a, b, bits, bits)
    fl = a @ b.T
    ex = _exact_dots(a, b)
    for i in range(n):
        for j in range(m):
            assert abs(Fraction(float(fl[i, j])) - ex[i][j]) <= Fraction(float(err[i])), (i, j)
        if err[i] == 0:
            assert all(Fraction(float(fl[i, j])) == ex[i][j] for j in range(m))
    assert err[3] == 0.0
    if spread == 0.0 and dtype == "bf16":
        assert np.all(err == 0.0)          # typical bf16 rows are certified exact
    if spread == 40.0 and dtype == "fp32":
        assert np.all(err[np.arange(n) != 3] > 0)   # fp32 products cannot all be certified


@pytest.mark.parametrize("dtype,bits", [("bf16", 8), ("fp16", 11)])
def test_split_products_bound_the_error_and_improve_uncertified_rows(dtype, bits):
    from fa4verify.oracles.reference import products_with_error

    rng = np.random.default_rng(bits)
    dt = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16}[dtype]
    n, m, d = 10, 12, 32
    a = rng.standard_normal((n, d))
    b = rng.standard_normal((m, d))
    a[:, 0] *= 2.0 ** -24        # tiny entries in every row: the plain certificate fails
    b[:, 1] *= 2.0 ** -24
    a, b = (x.astype(np.float32).astype(dt).astype(np.float64) for x in (a, b))
    S, err = products_with_error(a, b, bits, bits)
    plain = dot_error_rows(a, b, bits, bits)
    ex = _exact_dots(a, b)
    for i in range(n):
        for j in range(m):
            assert abs(Fraction(float(S[i, j])) - ex[i][j]) <= Fraction(float(err[i]))
    assert np.all(plain > 0) and np.all(err < plain * 2.0 ** -4)


@pytest.mark.parametrize("shape", [(200, 128), (20000, 1), (1, 40000)])
def test_the_row_quantum_of_a_large_array_is_the_smallest_exponent_of_its_nonzero_entries(shape):
    """``_quantum_log2`` takes the exponent of each row's smallest nonzero magnitude on large
    arrays: it must equal the definition (the smallest ``frexp`` exponent over the row's nonzero
    entries), subnormals, zeros and rows of zeros included."""
    from fa4verify.oracles.reference import _quantum_log2
    rng = np.random.default_rng(shape[0])
    x = rng.standard_normal(shape) * 2.0 ** rng.integers(-1070, 1000, size=shape)
    x[rng.random(shape) < 0.2] = 0.0
    x[0] = 0.0
    x.flat[-1] = 5e-324
    assert x.size >= 16384        # the large path
    ex = np.where(x != 0, np.frexp(x)[1], np.iinfo(np.int32).max).min(axis=1)
    assert np.array_equal(_quantum_log2(x, 8), ex.astype(np.float64) - 8)
