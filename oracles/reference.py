"""Fast certified float64 reference for FA4 attention, forward and backward.

Every returned value comes with an elementwise bound ``|value - exact| <= bound`` on its distance
from the exact real-number result of the function defined in :mod:`oracles.semantics`, evaluated
on the exact input values. The bound is a running error bound: each float64 step carries its own
rigorous a-priori bound (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., ch. 2-3:
``|fl(a op b) - a op b| <= u |fl(a op b)|`` with ``u = 2^-53`` for round-to-nearest, and
``|fl(x^T y) - x^T y| <= gamma_n |x|^T |y|``, ``gamma_n = n u / (1 - n u)``, for *any* summation
order with or without FMA), and the bounds are propagated through every stage.

Note [Oracle error model]
-------------------------
Per query row (index i dropped), visible key j:

* ``S = Q K^T`` by BLAS. Products of bf16/fp16/fp32 values are exact in float64 (<= 48 bits).
  If every product of the row pair is a multiple of ``Qq * Qk`` (the input quanta, from the
  smallest exponent in each row) and ``||q|| ||k|| < 2^53 Qq Qk`` then every partial sum is exact
  and ``S`` is exact in any order (certificate, typical for bf16). Otherwise
  ``|dS| <= gamma_D ||q||_2 ||k||_2`` (Cauchy-Schwarz bound on ``sum |q||k|``), used as a row
  constant (max over the row's keys). Uncertified rows are recomputed with an exact magnitude
  split (``products_with_error``): their error drops by ~2^-12 to about ``2 u max_j |S_ij|``.
* ``x = fl(scale S)``, ``t = fl(x / softcap)``, ``th = tanh(t)``, ``y = fl(softcap th)``: each
  step adds ``u |result|``; tanh is 1-Lipschitz and has relative error ``eps_f``.
* ``a = fl(y - m)``: ``m`` (the row max, including the sink) is an exact float64 shift and
  cancels in softmax; only the rounding ``u |a|`` counts. The total absolute error of ``a_j`` is
  ``Delta_j <= c + 2.0001 u |a_j|`` with a row constant ``c`` (score error, ``u |m|`` for the
  rounding of ``scale S``, softcap steps). ``e_j = exp(a_j)`` satisfies
  ``|e_j - e*_j| <= eta_j e*_j + tau`` with ``eta_j = Delta_j (1+2^-9)(1+eps_f) + eps_f`` when
  ``Delta_j <= 2^-10`` for every ``|a_j| <= 746`` (guaranteed by ``c <= 2^-11``; rows where that
  fails get bound = +inf, it needs |logits| ~ 2^42), and ``tau = 2^-1060`` covers underflow
  (``a_j < -745``: ``e_j = 0`` and ``e*_j < tau``).
* ``[N, l] = e [V, 1]`` with the key axis split in blocks of ``b`` and the block products summed
  in order: ``gamma_{b + nb - 1}`` (blocked summation) instead of ``gamma_sk``. The same blocked
  product of the nonnegative ``(gamma e + E)`` with ``[|V|, 1]`` gives the rigorous error of
  ``N`` and ``l`` (inflated by ``1 + 2 gamma`` for its own rounding).
* ``O = fl(N / l)``; ``|O - O*| <= u|O| + errN/l + (|N| + errN)/l * E_l/(l - E_l)``;
  ``LSE = m + log(l)`` with ``|dLSE| <= E_l/(l - E_l) + eps_f |log l| + u |LSE|``.
* Backward follows the same pattern element by element: ``P = e / l``, ``dP = dO V^T``
  (certificate or Cauchy-Schwarz), ``D = rowsum(dO * O)`` (``gamma_Dv``, plus the oracle's own
  bound on O when ``out=None``), ``dS = P (dP - D + dLSE)``, softcap factor
  ``1 - tanh^2 = sech^2(x/softcap)`` computed as ``1/cosh^2`` (no cancellation; relative error
  ``2 |dt| + 2 eps_f + 2u``), and the
  products ``dV = P^T dO``, ``dQ = scale dS K``, ``dK = scale dS^T Q`` with blocked ``gamma``
  times the per-element error arrays multiplied by ``|K|``, ``|Q|``, ``|dO|``. GQA sums over the
  heads of a group and row blocks add ``u |partial sum|`` per addition.
* All bounds are finally multiplied by ``1 + 2^-30`` to cover the rounding of the bound
  arithmetic itself (a few dozen float64 operations on nonnegative numbers, relative error
  < 2^-45).

Assumption [libm accuracy]: ``np.exp``, ``np.log``, ``np.tanh`` and ``np.cosh`` on float64 are
within ``EPS_F_ULP = 4`` ulp (relative error ``eps_f = 4 * 2^-52 = 2^-50``) for normal results.
Source: numpy's own accuracy suite (``numpy/_core/tests/test_umath_accuracy.py`` with the data
files ``numpy/_core/tests/data/umath-validation-set-{exp,log,tanh,cosh}.csv`` shipped in the
installed numpy 2.4) asserts float64 maximum errors of 1 ulp for exp, log and cosh and 2 ulp for
tanh, on the SIMD (AVX512F/AVX2) paths this machine takes; we allow 4 ulp as margin.
``tests/test_oracle_libm.py`` measures the actual error of this numpy against x87 ``longdouble``
and mpmath and fails if it exceeds the assumption (measured here: max 0.58 ulp exp, 0.52 log,
0.80 tanh, 0.75 cosh, in units of 2^-52 relative). Subnormal results are covered by the absolute
``tau``.

Accuracy
--------
Figures (CPU, ``benchmarks/bench_oracle.py``): on random bf16 inputs, 1 x 8 heads x 4096 x 128
causal, the output bound is 2^-44.8 (median) and at worst 2^-43.9 times ``sum_j P_j |V_j|`` (the
natural scale of O: with mixed-sign V, O itself can be ~0, so a bound *relative to |O|* is
unbounded; errors are stated relative to ``sum |P||V|``); LSE bound <= 2^-41.9 absolute. On small
problems (hypothesis, ``tests/test_oracle_agreement.py``) the bound is <= 2^-40 x sum |P||V|
always and about 2^-45 typically, and the observed |fast - arbiter| reaches 0.3-0.75 of it.
Where it is looser: (1) rows whose ``S = q.k`` cannot be certified exact even after the split
(fp32 inputs: products of 24-bit significands) keep ``gamma_D ||q|| max_j ||k_j||`` for the whole
row; (2) large logits: the exponent argument's rounding ``u |logit|`` becomes a relative error of
P (bound = inf once ``u |logit| > 2^-11``); (3) long rows: blocked summation grows as
``gamma_{256 + n/256}``; (4) backward bounds are relative to ``P (|dO||V| + |dO||O| + |dlse|)``
(``stats.sum_pg_k``) rather than to ``|dS|``, so they are loose where ``dP - D'`` cancels.

Execution
---------
Work is split into independent (segment, kv head) tasks, each running forward and (for
backward) backward row block by row block (512 query rows, keys limited to the block's visible
range), on ``FA4VERIFY_ORACLE_THREADS`` worker threads (default: the CPU count); each worker
limits numpy's OpenBLAS to one thread (``openblas_set_num_threads_local``, thread-local).
Tasks write disjoint outputs, so results are bit-identical for any thread count.

Possible issues
---------------
The gamma bounds assume a BLAS that computes each dot product by *some* ordering of fp64
multiply-adds (OpenBLAS does; a Strassen-like GEMM would void the bound). The libm assumption is
validated on this machine only by the tests.
"""
from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from .semantics import MANTISSA_BITS, Problem, visible_key_range, visible_mask

__all__ = ["U", "EPS_F", "EPS_F_ULP", "TAU", "SAFETY", "gamma", "ForwardArrays", "forward", "backward",
           "ROW_BLOCK"]

U = 2.0 ** -53
EPS_F_ULP = 4
EPS_F = EPS_F_ULP * 2.0 ** -52
TAU = 2.0 ** -1060
TAU_F = 2.0 ** -1020           # absolute error floor of the softcap derivative sech^2
SAFETY = 1.0 + 2.0 ** -30
LIN = 1.0 + 2.0 ** -9          # e^D - 1 <= D * LIN and e^D <= LIN for D <= 2^-10
DELTA_MAX = 2.0 ** -10
ROW_BLOCK = 512


def gamma(n: int) -> float:
    """Higham's gamma_n = n u / (1 - n u) for u = 2^-53."""
    return n * U / (1.0 - n * U)


def _block_size(n: int) -> int:
    """Inner-dimension block of :func:`blocked_matmul`: 256 (large enough for BLAS efficiency;
    ``gamma_{256 + n/256 - 1}`` instead of ``gamma_n``: 2^-44.9 instead of 2^-41 for n = 4096)."""
    return max(1, min(n, 256))


def blocked_gamma(n: int) -> float:
    """Error constant of :func:`blocked_matmul` for inner dimension ``n``."""
    if n <= 0:
        return 0.0
    b = _block_size(n)
    nb = -(-n // b)
    return gamma(b + nb - 1)


def blocked_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` with the inner axis split into blocks summed in order.

    ``|result - exact| <= blocked_gamma(n) * (|a| @ |b|)`` (gamma_b per block product plus
    gamma_{nb-1} for the ordered sum of the nb partial results).
    """
    n = a.shape[1]
    bs = _block_size(n)
    if n <= bs:
        return a @ b
    acc = a[:, :bs] @ b[:bs]
    for s in range(bs, n, bs):
        acc += a[:, s:s + bs] @ b[s:s + bs]
    return acc


def _norm_up(x: np.ndarray) -> np.ndarray:
    """Upper bound on the row 2-norms of a (n, d) array."""
    d = x.shape[1]
    return np.sqrt(np.einsum("ij,ij->i", x, x)) * (1.0 + gamma(d + 4))


def _quantum_log2(x: np.ndarray, bits: int) -> np.ndarray:
    """log2 of the quantum of each row: every entry of the row is a multiple of 2^result (the
    smallest ``frexp`` exponent of its nonzero entries, minus ``bits``; a row of zeros: int32 max).
    ``x`` finite. On a large array the exponent of the row's smallest nonzero magnitude instead
    (the exponent is monotone in ``|x|``: the same value, in a third of the time at 34k keys)."""
    big = np.iinfo(np.int32).max
    if not x.shape[1]:
        return np.full(x.shape[0], big).astype(np.float64) - bits
    if x.size < 16384:
        mant, ex = np.frexp(x)
        ex = np.where(x != 0, ex, big)
        return ex.min(axis=1).astype(np.float64) - bits
    ax = np.abs(x)
    mn = np.minimum.reduce(ax, axis=1, where=ax != 0, initial=np.inf)
    return np.where(mn == np.inf, big, np.frexp(mn)[1]).astype(np.float64) - bits


def dot_error_rows(a: np.ndarray, b: np.ndarray, bits_a: int, bits_b: int) -> np.ndarray:
    """Row constants ``err_i >= max_j |fl(a_i . b_j) - a_i . b_j|`` for BLAS dot products.

    A pair (i, j) is exact (certificate) when the products are exact in float64
    (``bits_a + bits_b <= 53``), all are multiples of the product quantum ``Qa_i Qb_j`` (from the
    smallest exponent in each row) and ``||a_i|| ||b_j|| < 2^53 Qa_i Qb_j``: then every partial
    sum is representable, in any order. Otherwise ``gamma_d ||a_i|| ||b_j||`` (Cauchy-Schwarz).
    Computed without forming the (na, nb) matrix: keys sorted by their certificate margin,
    prefix maxima of ``||b_j||``, one binary search per row.
    """
    d = a.shape[1]
    na = _norm_up(a)
    nb = _norm_up(b)
    if a.shape[0] == 0 or b.shape[0] == 0:
        return np.zeros(a.shape[0])
    g = gamma(d)
    if not (bits_a + bits_b <= 53 and d > 0):
        return g * na * nb.max()
    qa = _quantum_log2(a, bits_a)
    qb = _quantum_log2(b, bits_b)
    with np.errstate(divide="ignore"):
        ca = np.log2(na) - qa      # zero rows: -inf -> exact
        cb = np.log2(nb) - qb
    # pair (i, j) uncertified iff ca_i + cb_j >= 53 - 1e-6 (margin covers log2 rounding) or the
    # product quantum is below 2^-1074 (qa_i + qb_j < -1074); zero rows are always exact.
    out = np.zeros(a.shape[0])
    nzb = nb > 0
    if not nzb.any():
        return out
    order = np.argsort(-cb[nzb], kind="stable")
    cbs = cb[nzb][order]
    nbs = np.maximum.accumulate(nb[nzb][order])           # prefix max of ||b|| over largest cb
    # keys with cb_j >= 53 - 1e-6 - ca_i are the first k_i in this order
    thr = 53.0 - 1e-6 - ca
    kcount = np.searchsorted(-cbs, -thr, side="right")   # number of j with cbs_j >= thr_i
    has = kcount > 0
    out[has] = g * na[has] * nbs[kcount[has] - 1]
    # quantum underflow (rare: values below ~2^-500 in both rows): fall back to all keys
    qlow = qa + qb[nzb].min() < -1074
    if qlow.any():
        out[qlow] = g * na[qlow] * nb.max()
    out[na == 0] = 0.0
    return out


def products_with_error(a: np.ndarray, b: np.ndarray, bits_a: int, bits_b: int) -> tuple[np.ndarray, np.ndarray]:
    """``S = a @ b.T`` and row constants ``err_i >= max_j |S_ij - a_i . b_j|``.

    Rows that :func:`dot_error_rows` cannot certify exact are recomputed by an exact magnitude
    split: ``x = x_hi + x_lo`` with ``x_lo`` the entries below ``2^-t max|x_row|`` (t chosen so that
    ``x_hi . y_hi`` passes the certificate), ``S = (a_hi b_hi + a_hi b_lo) + a_lo b``; the two
    small products carry ``2^-t`` of the original error, and the two additions ``u |S|``.
    """
    S = a @ b.T
    err = dot_error_rows(a, b, bits_a, bits_b)
    d = a.shape[1]
    if bits_a + bits_b > 53 or d == 0 or not err.any():
        return S, err
    t = int((53 - (math.log2(d) + 2 + bits_a + bits_b)) // 2) - 1
    if t < 2:
        return S, err
    unc = np.nonzero(err > 0)[0]

    def split(x):
        mx = np.abs(x).max(axis=1, keepdims=True)
        hi = np.where(np.abs(x) >= mx * 2.0 ** -t, x, 0.0)
        return hi, x - hi            # exact: x_lo is x or 0 entrywise

    ah, al = split(a[unc])
    bh, bl = split(b)
    A = ah @ bh.T
    B = ah @ bl.T
    C = al @ b.T
    S1 = A + B
    S2 = S1 + C
    e2 = (dot_error_rows(ah, bh, bits_a, bits_b) + dot_error_rows(ah, bl, bits_a, bits_b)
          + dot_error_rows(al, b, bits_a, bits_b)
          + U * (np.abs(S1).max(axis=1, initial=0.0) + np.abs(S2).max(axis=1, initial=0.0)) * (1 + 4 * U))
    better = e2 < err[unc]
    rows = unc[better]
    S[rows] = S2[better]
    err[rows] = e2[better]
    return S, err


MASKED = -(2.0 ** 1000)   # logit of a masked key (finite, so that |a| * e = 0 there)
LOGIT_MAX = 2.0 ** 900


def _fwd_rowblock(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: Optional[np.ndarray],
                  scale: float, cap: float, sink: Optional[float], bits: int,
                  keep: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Optional[dict]]:
    """One row block of one head. Error model: Note [Oracle error model] (row-constant form).

    The absolute error of the exponent argument ``a_ij = y_ij - m_i`` is bounded by
    ``Delta_ij <= c_i + ALPHA |a_ij|`` with the row constant ``c_i`` collecting the score error
    (``|scale| gamma_D ||q_i|| max_j ||k_j||`` unless certified exact), the rounding of
    ``scale * S`` (``u |x| <= u (|m| + |a|)`` without softcap, ``u max_j |x_ij|`` with it) and
    the softcap steps (``softcap (u + eps_f)`` plus the division's ``u |x|``).
    """
    rows, d = q.shape
    cols = k.shape[0]
    dv = v.shape[1]
    S, es_row = products_with_error(q, k, bits, bits)
    x = np.multiply(S, scale, out=S)
    xmax = np.maximum(x.max(axis=1, initial=0.0), -x.min(axis=1, initial=0.0)) if cols else np.zeros(rows)
    if not np.all(xmax <= LOGIT_MAX):
        raise ValueError(f"logits up to {xmax.max():.3e} exceed the oracle's range 2^900")
    c = abs(scale) * es_row
    th = eth = None
    if cap > 0:
        t = x / cap
        th = np.tanh(t)
        # |t - x*/cap| <= dt = (|scale| es + u|x|)/cap + u|t|; tanh is 1-Lipschitz, rel. error eps_f
        dt = (c + 2.0001 * U * xmax) / cap
        eth = dt + EPS_F / (1 - EPS_F)
        if keep:
            # softcap derivative f = 1 - tanh^2 = sech^2(t), computed without cancellation:
            # |log f - log f*| <= 2 |tanh| dt, cosh rel. error eps_f, two roundings (square, 1/.)
            # cosh^2 = inf (|t| > 355.2) -> f = 0 while the true f < 4 e^-710 < 2^-1020 = TAU_F:
            # the backward uses |f - f*| <= frel f + TAU_F
            with np.errstate(over="ignore"):
                f = np.cosh(t)
                np.multiply(f, f, out=f)
            np.divide(1.0, f, out=f)
            th = f
            eth = 2 * dt * LIN + 2.001 * EPS_F + 2.001 * U
            bad_cap = 2 * dt > DELTA_MAX
        del t
        y = np.multiply(np.tanh(x / cap) if keep else th, cap, out=x)
        c = cap * (dt + EPS_F / (1 - EPS_F)) + U * cap * (1 + U)   # + u |y|, |y| <= cap
    else:
        y = x
    nmask = None if mask is None else ~mask
    vis = mask.any(axis=1) if mask is not None else np.full(rows, cols > 0)
    if nmask is not None:
        np.copyto(y, MASKED, where=nmask)
    m = y.max(axis=1) if cols else np.full(rows, MASKED)
    full = m <= MASKED                       # no visible key
    if sink is not None:
        m = np.where(full, sink, np.maximum(m, sink))
        full = np.zeros(rows, bool)
    m = np.where(full, 0.0, m)
    if cap == 0:
        c = c + U * np.abs(m) * (1 + 2 * U)      # u |x| <= u (|m| + |a|) (1 + u)
    alpha = 2.0001 * U
    bad = c > 2.0 ** -11                     # then Delta <= 2^-10 for every |a| <= 746
    if cap > 0 and keep:
        bad |= bad_cap
    a = np.subtract(y, m[:, None], out=y)
    e = np.exp(a)
    g = blocked_gamma(cols)
    # E_ij = eta_ij e*_ij + tau  with  eta <= Delta LIN (1 + eps_f) + eps_f,  e* <= (e + tau) LIN,
    # plus g * e for the blocked product below (stored together: B = g e + E).
    # Underflowed entries (a < -745): e = 0, e* < tau.  Masked: e = 0, a*e = 0.
    k1 = LIN * (1 + EPS_F) * LIN
    B = np.abs(a, out=a)
    B *= alpha * k1
    B += ((c * k1 + EPS_F * LIN) + g)[:, None]
    B *= e
    # masked entries: e = 0 and |a| ~ 2^1000 is finite, so B = 0 there. The 2 tau per visible entry
    # (underflow) is added after the product below, as 2 tau sum_j |V_j|.
    ext = np.empty((cols, dv + 1))
    ext[:, :dv] = v
    ext[:, dv] = 1.0
    Nl = blocked_matmul(e, ext) if cols else np.zeros((rows, dv + 1))
    np.abs(ext, out=ext)
    errNl = blocked_matmul(B, ext) * (1 + 2 * g) if cols else np.zeros((rows, dv + 1))
    if cols:
        errNl += 2 * TAU * ext.sum(axis=0)[None, :] * (1 + 2 * g)
        errNl[~vis] = 0.0                    # rows without a visible key: N = l_keys = 0 exactly
    N = Nl[:, :dv]
    lsum = Nl[:, dv]
    errN = errNl[:, :dv]
    El = errNl[:, dv].copy()
    esink = Esink = None
    if sink is not None:
        asink = sink - m
        dsink = U * np.abs(asink)
        esink = np.exp(asink)
        Esink = (dsink * LIN * (1 + EPS_F) + EPS_F) * (esink + TAU) * LIN + TAU
        bad |= dsink > DELTA_MAX
        lsum = lsum + esink
        El += Esink
    El += U * lsum
    l = np.where(full, 1.0, lsum)
    El = np.where(full, 0.0, El)
    with np.errstate(divide="ignore", invalid="ignore"):
        rl = np.where(l - El > 0, El / (l - El), np.inf)
        out = N / l[:, None]
        bound = U * np.abs(out) + errN / l[:, None] + (np.abs(N) + errN) / l[:, None] * rl[:, None]
        logl = np.log(l)
        lse = m + logl
        lse_bound = rl + (EPS_F / (1 - EPS_F)) * np.abs(logl) + U * np.abs(lse)
    bound *= SAFETY
    lse_bound *= SAFETY
    out[full] = 0.0
    bound[full] = 0.0
    lse = np.where(full, -np.inf, lse)
    lse_bound = np.where(full, 0.0, lse_bound)
    bound[bad] = np.inf
    lse_bound[bad] = np.inf
    state = None
    if keep:
        # with softcap: f = sech^2(x/softcap) (the softcap derivative) and its relative error per row
        state = dict(e=e, E=B, l=l, vis=vis, El=El, rl=rl, esink=esink, Esink=Esink, f=th if cap > 0 else None,
                     frel=eth if cap > 0 else None, bad=bad)
    return out, bound, lse, lse_bound, state


@dataclass
class ForwardArrays:
    """Flat forward results: out/bound (Tq, H, Dv), lse/lse_bound (H, Tq)."""

    out: np.ndarray
    bound: np.ndarray
    lse: np.ndarray
    lse_bound: np.ndarray


def _row_blocks(seg_q: int, seg_k: int, left, right):
    for r0 in range(0, seg_q, ROW_BLOCK):
        r1 = min(seg_q, r0 + ROW_BLOCK)
        c0, c1 = visible_key_range(seg_q, seg_k, left, right, r0, r1)
        yield r0, r1, c0, c1


def _threads() -> int:
    """Worker threads for independent (segment, kv head) tasks: ``FA4VERIFY_ORACLE_THREADS``
    (default: the number of CPUs). Each worker limits OpenBLAS to one thread (thread-local)."""
    env = os.environ.get("FA4VERIFY_ORACLE_THREADS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"FA4VERIFY_ORACLE_THREADS: expected an int, got {env!r}") from None
    return max(1, os.cpu_count() or 1)


_BLAS_LOCAL = None


def _blas_local_threads():
    """``openblas_set_num_threads_local`` of numpy's bundled OpenBLAS, or None."""
    global _BLAS_LOCAL
    if _BLAS_LOCAL is None:
        fn = False
        try:
            import ctypes
            import glob
            libdir = os.path.dirname(np.__file__) + ".libs"
            for path in glob.glob(os.path.join(libdir, "*openblas*.so*")):
                lib = ctypes.CDLL(path)
                if hasattr(lib, "openblas_set_num_threads_local"):
                    fn = lib.openblas_set_num_threads_local
                    fn.restype = ctypes.c_int
                    fn.argtypes = [ctypes.c_int]
                    break
        except OSError:  # pragma: no cover - unusual BLAS
            fn = False
        _BLAS_LOCAL = fn
    return _BLAS_LOCAL or None


#: the mean work of a problem's tasks (query rows x keys x query heads per kv head x (d + dv)) below
#: which they run in the calling thread: a task that small is Python bookkeeping, serialised by
#: the GIL, and a pool only adds its hand-offs (1,100 one-query sequences x 2 heads: 3.7 s per
#: oracle call on 16 threads in the H100's profiled warm audit; on a 2-core CPU 0.94 s on 16
#: threads, 0.67 s in one)
_THREAD_MIN_WORK = 1 << 20


def _task_work(p: Problem, tasks: list) -> float:
    """Mean multiply-adds of a (sequence, kv head) task of ``p``."""
    if not tasks:
        return 0.0
    per = p.group * (p.q.shape[-1] + p.headdim_v)
    return sum(p.segments[si].q_len * p.segments[si].k_len for si, _ in tasks) * per / len(tasks)


def _run_tasks(fn, tasks: list, p: Optional[Problem] = None) -> list:
    """Run ``fn(task)`` for every task; in worker threads when there are several (and, given the
    problem ``p``, when they are large enough: :data:`_THREAD_MIN_WORK`). Results are returned
    in task order (every task writes disjoint output slices).

    Note [One BLAS thread]: every task's products run on one OpenBLAS thread, in the calling
    thread as in the pool's: a multithreaded OpenBLAS product can differ in the last bits from a
    single-threaded one (seen on a (90, 72) x (72, 90) product), so the oracle's values would
    depend on the thread count and on whatever set it last. numpy's OpenBLAS applies
    ``openblas_set_num_threads_local`` to the whole process in some builds and to the calling
    thread in others: it is set here, before any task, and again in each pool thread (then a
    no-op where it is process-wide), and restored once all have finished."""
    n = min(_threads(), len(tasks))
    if p is not None and _task_work(p, tasks) < _THREAD_MIN_WORK:
        n = 1
    setter = _blas_local_threads()
    _blas_enter(setter)
    try:
        if n <= 1:
            return [fn(t) for t in tasks]

        def wrapped(t):
            old = setter(1) if setter is not None else None
            try:
                return fn(t)
            finally:
                if setter is not None:
                    setter(old)

        with ThreadPoolExecutor(max_workers=n) as ex:
            return list(ex.map(wrapped, tasks))
    finally:
        _blas_exit(setter)


#: Note [One BLAS thread]: callers of :func:`_run_tasks` running at once (threads of one process)
#: share the process-wide setting: the first to enter saves the count, the last to leave restores it
#: (where the setting is per thread instead, a later concurrent caller's thread keeps one BLAS
#: thread afterwards: slower, never different bits)
_BLAS_LOCK = threading.Lock()
_BLAS_STATE = {"depth": 0, "saved": None}


def _blas_enter(setter) -> None:
    if setter is None:
        return
    with _BLAS_LOCK:
        old = setter(1)
        if _BLAS_STATE["depth"] == 0:
            _BLAS_STATE["saved"] = old
        _BLAS_STATE["depth"] += 1


def _blas_exit(setter) -> None:
    if setter is None:
        return
    with _BLAS_LOCK:
        _BLAS_STATE["depth"] -= 1
        if _BLAS_STATE["depth"] == 0 and _BLAS_STATE["saved"] is not None:
            setter(_BLAS_STATE["saved"])
            _BLAS_STATE["saved"] = None


def _tasks(p: Problem) -> list[tuple[int, int]]:
    return [(si, hk) for si, seg in enumerate(p.segments) if seg.q_len > 0 for hk in range(p.nheads_kv)]


def forward(p: Problem) -> ForwardArrays:
    """Certified float64 forward on a parsed, finite problem (see module docstring)."""
    Tq, H, _ = p.q.shape
    dv = p.headdim_v
    fw = ForwardArrays(np.zeros((Tq, H, dv)), np.zeros((Tq, H, dv)), np.full((H, Tq), -np.inf),
                       np.zeros((H, Tq)))
    _run_tasks(lambda t: _task(p, t, fw, None), _tasks(p), p)
    return fw


@dataclass
class BackwardArrays:
    dq: np.ndarray
    dq_bound: np.ndarray
    dk: np.ndarray
    dk_bound: np.ndarray
    dv: np.ndarray
    dv_bound: np.ndarray
    dsink: Optional[np.ndarray]
    dsink_bound: Optional[np.ndarray]
    d: np.ndarray          # (H, Tq)
    d_bound: np.ndarray


@dataclass
class _BwdIn:
    dout: np.ndarray
    dout_bits: int
    o_given: Optional[np.ndarray]
    #: the gradients through the LSE of the variants computed together (None: no dLSE)
    dlses: tuple[Optional[np.ndarray], ...]
    outs: list[BackwardArrays]


def backward(p: Problem, dout: np.ndarray, dout_bits: int, o_given: Optional[np.ndarray],
             dlses: Sequence[Optional[np.ndarray]] = (None,)) -> tuple[ForwardArrays, list[BackwardArrays]]:
    """Certified float64 forward and backward in one pass (row block by row block).

    ``o_given`` (Tq, H, Dv): the O that enters ``D = rowsum(dO * O)`` (caller's values, taken as
    exact), or None for the oracle's own O (its forward bound then enters the bound of D).
    ``dlses``: one backward per entry, each an (H, Tq) gradient through the LSE or None.

    Note [Variants share a pass]: the variants differ only in ``D' = D - dLSE``; the forward, P
    and its error, ``dP = dO V^T``, D and ``dV = P^T dO`` read no dLSE and are computed once per
    row block, then ``dS = P (dP - D')`` and dQ, dK per variant -- each variant's values and bounds
    the ones a pass of its own gives, bit for bit (the same operations on the same operands:
    ``tests/test_oracle_variants.py``).
    """
    Tq, H, d = p.q.shape
    Tk, Hk, dv = p.v.shape
    fw = ForwardArrays(np.zeros((Tq, H, dv)), np.zeros((Tq, H, dv)), np.full((H, Tq), -np.inf),
                       np.zeros((H, Tq)))
    bws = [BackwardArrays(np.zeros((Tq, H, d)), np.zeros((Tq, H, d)), np.zeros((Tk, Hk, d)),
                          np.zeros((Tk, Hk, d)), np.zeros((Tk, Hk, dv)), np.zeros((Tk, Hk, dv)),
                          None, None, np.zeros((H, Tq)), np.zeros((H, Tq))) for _ in dlses]
    bi = _BwdIn(dout, dout_bits, o_given, tuple(dlses), bws)
    tasks = _tasks(p)
    sink_lists = _run_tasks(lambda t: _task(p, t, fw, bi), tasks, p)
    for vi, bw in enumerate(bws):
        if p.sink is not None:
            dsink = np.zeros(H)
            dsink_b = np.zeros(H)
            for h in range(H):
                ts = [t for lst in sink_lists for hh, t, _ in lst[vi] if hh == h]
                es_ = [e for lst in sink_lists for hh, _, e in lst[vi] if hh == h]
                if ts:
                    allt = np.concatenate(ts)
                    dsink[h] = allt.sum()
                    dsink_b[h] = gamma(max(allt.size - 1, 0)) * np.abs(allt).sum() * (1 + 2 * U) \
                        + np.concatenate(es_).sum() * (1 + gamma(allt.size))
            bw.dsink = dsink
            bw.dsink_bound = dsink_b * SAFETY
        bw.dq_bound *= SAFETY
        bw.dk_bound *= SAFETY
        bw.dv_bound *= SAFETY
        bw.d_bound *= SAFETY
    return fw, bws


def _task(p: Problem, task: tuple[int, int], fw: ForwardArrays, bi: Optional[_BwdIn]) -> list:
    # inf * 0 in bound arithmetic of rows whose error model does not apply gives NaN bounds;
    # attention.py turns NaN bounds into +inf
    with np.errstate(invalid="ignore", over="ignore"):
        return _task_body(p, task, fw, bi)


def _task_body(p: Problem, task: tuple[int, int], fw: ForwardArrays, bi: Optional[_BwdIn]) -> list:
    """All heads of kv head ``hk`` in segment ``si``: forward, and backward when ``bi`` is given.
    Returns the sink-gradient terms per variant: ``[[(h, terms, bounds)] for each of bi.dlses]``.

    Note [A group's heads as rows]: the query heads of one KV head read the same keys, values and
    mask, and every forward quantity is row by row; on a small segment (at most
    :data:`_HEAD_STACK_PAIRS` pairs for the whole group) they are evaluated as one block of
    ``group x rows`` rows (head-major), so a varlen call of 257 short sequences and 7 query heads
    per KV head is 514 blocks, not 3,598. dK and dV then sum the group's rows in one product,
    whose error the blocked gamma of the stacked row count bounds (in place of one product and
    one float64 addition per head); every other value is the one a head alone gives, up to the
    order of BLAS's sums. Heads with a sink of -inf (Note [A sink of -inf]) are taken one by one."""
    si, hk = task
    seg = p.segments[si]
    heads = tuple(range(hk * p.group, (hk + 1) * p.group))
    sink_all = None if p.sink is None else [float(p.sink[h]) for h in heads]
    stack = (p.group > 1 and seg.q_len * seg.k_len * p.group <= _HEAD_STACK_PAIRS
             and (sink_all is None or -math.inf not in sink_all))
    sink_terms: list = [[] for _ in (bi.dlses if bi is not None else ())]
    for hs in ([heads] if stack else [(h,) for h in heads]):
        for blk in _row_blocks(seg.q_len, seg.k_len, p.left, p.right):
            _block(p, seg, hk, hs, blk, fw, bi, sink_terms)
    return sink_terms


#: Note [A group's heads as rows]: the largest (query rows x keys x query heads) of a segment whose
#: KV head's query heads are stacked into one block
_HEAD_STACK_PAIRS = 1 << 16


def _rows(x: np.ndarray, rs: slice, hs: tuple) -> np.ndarray:
    """Rows ``rs`` of heads ``hs`` of a token-major (T, H, ...) array, head-major: (len(hs) nr, ...)."""
    if len(hs) == 1:
        return x[rs, hs[0]]
    y = x[rs, hs[0]:hs[-1] + 1]
    return np.swapaxes(y, 0, 1).reshape((-1,) + y.shape[2:])


def _put(dst: np.ndarray, rs: slice, hs: tuple, y: np.ndarray) -> None:
    """``dst[rs, h] = `` each head's rows of ``y`` (as :func:`_rows` gives them)."""
    if len(hs) == 1:
        dst[rs, hs[0]] = y
    else:
        dst[rs, hs[0]:hs[-1] + 1] = np.swapaxes(y.reshape((len(hs), rs.stop - rs.start) + y.shape[1:]), 0, 1)


def _put_hm(dst: np.ndarray, rs: slice, hs: tuple, y: np.ndarray) -> None:
    """``dst[h, rs] = `` each head's rows of ``y``, ``dst`` head-major (H, T)."""
    if len(hs) == 1:
        dst[hs[0], rs] = y
    else:
        dst[hs[0]:hs[-1] + 1, rs] = y.reshape(len(hs), rs.stop - rs.start)


def _block(p: Problem, seg, hk: int, hs: tuple, blk: tuple, fw: ForwardArrays, bi: Optional[_BwdIn],
           sink_terms: list) -> None:
    """One row block of the query heads ``hs`` (one, or a whole group as rows: Note [A group's
    heads as rows]) of KV head ``hk`` in segment ``seg``."""
    r0, r1, c0, c1 = blk
    bits = MANTISSA_BITS[p.dtypes["q"]]
    bits_v = MANTISSA_BITS[p.dtypes["v"]]
    dv = p.headdim_v
    scale = p.scale
    sabs = abs(scale)
    nh, nr0 = len(hs), r1 - r0
    sink = None if p.sink is None else float(p.sink[hs[0]])
    sink_off = sink == -math.inf      # Note [A sink of -inf] (one head alone)
    if sink_off:
        sink = None
    elif sink is not None and nh > 1:
        sink = np.repeat(p.sink[hs[0]:hs[-1] + 1].astype(np.float64), nr0)
    rs = slice(seg.q_start + r0, seg.q_start + r1)
    ksl = slice(seg.k_start + c0, seg.k_start + c1)
    qs = _rows(p.q, rs, hs)
    ks = p.k[ksl, hk]
    vs = p.v[ksl, hk]
    mask = visible_mask(seg.q_len, seg.k_len, p.left, p.right, (r0, r1), (c0, c1))
    if mask is not None and mask.all():
        mask = None
    if mask is not None and nh > 1:
        mask = np.tile(mask, (nh, 1))
    o, b, ls, lb, st = _fwd_rowblock(qs, ks, vs, mask, scale, p.softcap, sink, bits, bi is not None)
    _put(fw.out, rs, hs, o)
    _put(fw.bound, rs, hs, b)
    _put_hm(fw.lse, rs, hs, ls)
    _put_hm(fw.lse_bound, rs, hs, lb)
    if bi is None:
        return
    st["mask"] = mask
    dos = _rows(bi.dout, rs, hs)
    # D = rowsum(dO * O): gamma_dv sum|dO||O| (+ sum |dO| bound(O) for the oracle's own O)
    if bi.o_given is None:
        ou, ob = o, b
    else:
        ou, ob = _rows(bi.o_given, rs, hs), None
    adO = np.abs(dos)
    D0 = np.einsum("id,id->i", dos, ou)
    eD0 = gamma(dv) * np.einsum("id,id->i", adO, np.abs(ou))
    if ob is not None:
        eD0 += np.einsum("id,id->i", adO, ob)
    for bw in bi.outs:
        _put_hm(bw.d, rs, hs, D0)
        _put_hm(bw.d_bound, rs, hs, eD0)
    dout_bits = bi.dout_bits
    l = st["l"]
    rl = st["rl"]
    bad = st["bad"]
    if sink_off:            # the sink holds a row's whole mass where no key is visible
        ps = np.where(st["vis"], 0.0, 1.0)
        eps = np.zeros_like(ps)
    elif p.sink is not None:
        ps = st["esink"] / l
        eps = (st["Esink"] + (st["esink"] + st["Esink"]) * rl) / l + U * ps

    def dlse_rows(dl):
        return None if dl is None else dl[hs[0]:hs[-1] + 1, rs].reshape(-1)

    def add_sink_terms(vi, Dr, eDr):
        for j, h in enumerate(hs):
            r = slice(j * nr0, (j + 1) * nr0)
            sink_terms[vi].append(_sink_term(h, ps[r], eps[r], Dr[r], eDr[r], bad[r]))

    if c1 <= c0:
        for vi, dl in enumerate(bi.dlses):
            Dr, eDr = _d_prime(D0, eD0, dlse_rows(dl))
            if p.sink is not None:
                add_sink_terms(vi, Dr, eDr)
        return
    e, E = st["e"], st["E"]
    nr = nh * nr0
    nc = c1 - c0
    gr = blocked_gamma(nr)
    gc = blocked_gamma(nc)
    gm = max(gr, gc)
    # P = fl(e / l), e/l <= P (1 + u).  Error of P, with the blocked-product gamma of
    # dV = P^T dO folded in:  EP = E (1 + rl)/l + P (rl (1 + u) + u + gr) >= |P - P*| + gr P
    P = e / l[:, None]
    EP = E * ((1 + rl) / l)[:, None]
    EP += P * (rl * (1 + U) + U + gr)[:, None]
    # G = dP - D' = dO V^T - D';  eG = u|G| + eD' (+ edP when not certified exact)
    dP, edP = products_with_error(dos, vs, dout_bits, bits_v)   # edP: row constants
    vis = st["vis"]
    last = len(bi.dlses) - 1
    for vi, dl in enumerate(bi.dlses):
        Dr, eDr = _d_prime(D0, eD0, dlse_rows(dl))
        if p.sink is not None:
            add_sink_terms(vi, Dr, eDr)
        # the last variant takes dP's array itself (one copy fewer)
        G = dP if vi == last else dP.copy()
        G -= Dr[:, None]
        # W >= e_dS + gm |dS| for dS = fl(P G):
        #   e_dS <= EP |G| + (P + EP) eG + u |dS|,  |dS| <= P |G| (1 + u)
        #   => W = (1 + u) [ |G| (EP + P (2.0001 u + gm)) + (P + EP) c ],  c = eD' (+ edP)
        W = P * (2.0001 * U + gm)
        W += EP
        A = np.abs(G)
        W *= A
        # underflowed entries carry an extra 2 tau on e (not in E): their effect on dS is
        # <= 4 tau / l (|G| + c) per entry, added to dQ/dK below through wt (row weights)
        wt = np.where(vis, 4 * TAU / l * (A.max(axis=1, initial=0.0) + eDr + edP) * (1 + 2 * gm), 0.0)
        T = EP + P
        T *= (eDr + edP)[:, None]
        W += T
        del T
        # (1 + u) of the W formula is applied to the products W |K|, W^T |Q| below
        dS = np.multiply(P, G, out=G)
        if p.softcap > 0:
            # dX = dS f with |f - f*| <= frel f + TAU_F:
            # e_dX + gm |dX| <= f (W (1 + frel) + |dS| (frel + 3u)) + TAU_F (|dS| + W)
            f, frel = st["f"], st["frel"][:, None]
            np.abs(dS, out=A)
            T = A + W
            T *= TAU_F
            A *= frel + 3 * U
            W *= 1 + frel
            W += A
            W *= f
            W += T
            del T
            dS *= f
        del A
        _dqk(bi.outs[vi], p, dS, W, wt, qs, ks, rs, ksl, hs, hk, bad, gm, scale, sabs)
        del dS, W
    # masked entries: P = E = 0 and every other factor is finite, so dS = W = 0 there
    # dV_j += sum_i P_ij dO_i, bound (gr P + |P - P*|)^T |dO| = EP^T |dO| (no dLSE: once)
    part = blocked_matmul(P.T, dos)
    epart = blocked_matmul(EP.T, np.abs(dos))
    epart *= 1 + 2 * gr
    epart += np.where(vis, 4 * TAU / l, 0.0) @ np.abs(dos)
    del EP, P
    if bad.any():
        epart[:] = np.inf
    for bw in bi.outs:
        acc = bw.dv[ksl, hk]
        acc += part
        bw.dv_bound[ksl, hk] += epart + U * np.abs(acc)


def _d_prime(D0: np.ndarray, eD0: np.ndarray, dl: Optional[np.ndarray]):
    """(D', its bound) of one row block: ``D - dLSE`` (one rounding; ``dl`` the block's dLSE
    rows) or D itself."""
    if dl is None:
        return D0, eD0
    Dr = D0 - dl
    return Dr, eD0 + U * np.abs(Dr)


def _sink_term(h: int, ps, eps, Dr, eDr, bad) -> tuple:
    """The learnable sink's gradient terms of one row block, ``-P_sink D'``, with their bounds."""
    term = -ps * Dr
    eterm = eps * np.abs(Dr) + (ps + eps) * eDr + U * np.abs(term)
    eterm[bad] = np.inf
    return h, term, eterm


def _dqk(bw: BackwardArrays, p: Problem, dS, W, wt, qs, ks, rs: slice, ksl: slice, hs: tuple, hk: int, bad,
         gm: float, scale: float, sabs: float) -> None:
    """dQ_i = scale sum_j dX_ij K_j and dK_j += scale sum_i dX_ij Q_i of one row block, both bounded by W."""
    dqs = blocked_matmul(dS, ks)
    dqs *= scale
    edq = blocked_matmul(W, np.abs(ks))
    edq *= sabs * (1 + 2 * gm) * (1 + U)
    edq += sabs * wt[:, None] * np.abs(ks).sum(axis=0)[None, :]
    edq += U * np.abs(dqs)
    edq[bad] = np.inf
    _put(bw.dq, rs, hs, dqs)
    _put(bw.dq_bound, rs, hs, edq)
    dks = blocked_matmul(dS.T, qs)
    dks *= scale
    edk = blocked_matmul(W.T, np.abs(qs))
    edk *= sabs * (1 + 2 * gm) * (1 + U)
    edk += sabs * (wt @ np.abs(qs))[None, :]
    edk += U * np.abs(dks)
    if bad.any():
        edk[:] = np.inf
    acck = bw.dk[ksl, hk]
    acck += dks
    bw.dk_bound[ksl, hk] += edk + U * np.abs(acck)



