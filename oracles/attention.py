"""Public attention oracle API, mirroring FA4's ``flash_attn_func`` / ``flash_attn_varlen_func``.

>>> import numpy as np
>>> from fa4verify.oracles import attention
>>> rng = np.random.default_rng(0)
>>> q, k, v = (rng.standard_normal((1, 4, 2, 8)).astype(np.float32) for _ in range(3))
>>> r = attention.forward(q, k, v, causal=True)
>>> r.out.shape, r.lse.shape
((1, 4, 2, 8), (1, 2, 4))
>>> bool((r.bound < 1e-12).all())
True

Two arithmetics evaluate the same function (:mod:`oracles.semantics`):

* ``precision="fast"`` (default): :mod:`oracles.reference`, vectorised float64 with a certified
  running error bound (``.bound`` etc. are rigorous under the stated libm assumption; see
  Note [Oracle error model] there).
* ``precision=<int bits>`` (>= 53, e.g. 80): :mod:`oracles.arbiter`, mpmath at p and 2p bits with
  an agreement check; small problems only.

Environment: ``FA4VERIFY_ORACLE_THREADS`` (int, default the CPU count) sets the fast reference's
worker threads; results do not depend on it.

Every result is float64 numpy (whatever the input type), in FA4's layouts: ``out`` like ``q`` with
headdim_v; ``lse`` natural log, (batch, nheads, seqlen_q), varlen (nheads, total_q); ``dq/dk/dv``
like ``q/k/v``; ``d`` (= rowsum(dO * O)) like ``lse``; ``dsink`` (nheads,). Every value has an
elementwise absolute bound ``|value - exact| <= value_bound`` in the same units as the value.

Note [Which O enters D]
-----------------------
FA4's backward computes ``D = rowsum(dO * O)`` from the *rounded* (bf16/fp16) output it returned
(``flash_bwd_preprocess.py``), not from the exact O. ``backward(q, k, v, out, dout)`` uses ``out``
as given by the caller, so the oracle reproduces what the kernel *should* compute from that O.
``backward(..., out=None)`` uses the oracle's own O (exact up to its bound, which is propagated into
the bound of D), i.e. the mathematically exact gradient. The two differ by
``P * (dO . (O_rounded - O))`` in dS, of the size of the bf16 rounding of O; choose explicitly.

Non-finite inputs: see Note [Oracle NaN policy] in :mod:`oracles.semantics` (NaN value, +inf bound
for everything that depends on a NaN/Inf input).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, Optional, Sequence, Union

import numpy as np

from . import arbiter as _arb
from . import reference as _ref
from .semantics import MANTISSA_BITS, Problem, check_like, nonfinite_rows, parse_problem, visible_mask

__all__ = ["AttentionForward", "AttentionBackward", "forward", "backward", "Precision"]

Precision = Union[Literal["fast"], int]


@dataclass(frozen=True)
class AttentionForward:
    """Oracle forward result (float64 numpy).

    ``out`` (..., nheads, headdim_v) like q; ``lse`` natural log, FA4 layout; ``bound`` and
    ``lse_bound`` elementwise absolute error bounds (same units, >= 0, +inf where not certified).
    ``method`` says which arithmetic produced them.
    """

    out: np.ndarray
    lse: np.ndarray
    bound: np.ndarray
    lse_bound: np.ndarray
    precision: Precision
    method: str
    softmax_scale: float
    window_size: tuple[Optional[int], Optional[int]]


@dataclass(frozen=True)
class AttentionBackward:
    """Oracle backward result (float64 numpy), each with an elementwise absolute bound.

    ``d`` = rowsum(dO * O) in the LSE layout, computed with the O named by ``out_source``
    ("caller" or "oracle"); ``out`` is that O. ``dsink`` is None without a learnable sink.
    ``forward`` is the oracle's own forward result (exact O and LSE with their bounds), computed
    in the same pass: one ``backward`` call gives forward and backward.
    """

    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    dsink: Optional[np.ndarray]
    d: np.ndarray
    dq_bound: np.ndarray
    dk_bound: np.ndarray
    dv_bound: np.ndarray
    dsink_bound: Optional[np.ndarray]
    d_bound: np.ndarray
    out: np.ndarray
    lse: np.ndarray
    out_source: Literal["caller", "oracle"]
    precision: Precision
    method: str
    forward: Optional[AttentionForward] = None


def backward_difference(whole: AttentionBackward, part: AttentionBackward) -> AttentionBackward:
    """Note [Gradients by linearity]: the backward of the cotangents ``whole``'s minus ``part``'s
    (``dO_w - dO_p``, ``dLSE_w - dLSE_p``) on the same inputs, from the two results alone.

    The exact gradients are linear in ``(dO, dLSE)`` jointly: ``dS = P (dO V^T - D + dLSE)`` with
    ``D = rowsum(dO O)`` (times the softcap or score_mod factor, which reads no cotangent),
    ``dV = P^T dO``, ``dQ``, ``dK`` and ``dsink`` linear in ``dS`` and ``D - dLSE``; so are
    ``d`` (D, or D' where an oracle records that). Values: the float64 differences; bounds:
    ``whole``'s plus ``part``'s (each certifies its own result) plus the difference's rounding,
    ``2^-52 |difference|`` (``|fl(x - y) - (x - y)| <= 2^-53 |x - y|``), times ``1 + 2^-50`` for the
    bound's own two additions and one product. Both results must hold the same forward (``out``,
    ``lse``, the same O source): a ValueError otherwise. A non-finite value (a tainted row) stays
    non-finite with an infinite bound. The judge's LSE-only pass (dO = 0) is the dLSE pass minus
    the driver's (fa4verify/fuzz/properties.py), one float64 backward fewer."""
    if whole.out_source != part.out_source or np.shape(whole.out) != np.shape(part.out) \
            or not np.array_equal(whole.out, part.out, equal_nan=True) \
            or not np.array_equal(whole.lse, part.lse, equal_nan=True):
        raise ValueError("backward_difference: the two results hold different forwards (out, lse or O source)")
    grow = 1.0 + 2.0 ** -50

    def pair(x, xb, y, yb):
        if x is None or y is None:
            if (x is None) != (y is None):
                raise ValueError("backward_difference: a sink gradient in one result only")
            return None, None
        with np.errstate(invalid="ignore", over="ignore"):
            v = np.subtract(x, y, dtype=np.float64)
            b = np.abs(v)
            b *= 2.0 ** -52
            b += xb
            b += yb
            b *= grow
            b[~np.isfinite(v) | np.isnan(b)] = np.inf
        return v, b
    out = {}
    for n in ("dq", "dk", "dv", "dsink", "d"):
        out[n], out[f"{n}_bound"] = pair(getattr(whole, n), getattr(whole, f"{n}_bound"),
                                         getattr(part, n), getattr(part, f"{n}_bound"))
    return dataclasses.replace(whole, **out, method=f"{whole.method}; by linearity (Note [Gradients by linearity])")


def _nan_to_inf(b: np.ndarray) -> np.ndarray:
    """A bound that came out NaN (inf * 0 where the error model does not apply) is +inf."""
    b = np.array(b, dtype=np.float64)
    b[np.isnan(b)] = np.inf
    return b


def _check_precision(precision: Any) -> Precision:
    if precision == "fast":
        return "fast"
    if isinstance(precision, (int, np.integer)) and not isinstance(precision, bool):
        if precision < 53:
            raise ValueError(f"precision: an arbiter precision must be >= 53 bits, got {precision}")
        return int(precision)
    raise ValueError(f"precision: expected 'fast' or an int number of bits (>= 53), got {precision!r}")


class _Taint:
    """Non-finite input bookkeeping (Note [Oracle NaN policy])."""

    def __init__(self, p: Problem):
        self.qbad = nonfinite_rows(p.q)
        self.kvbad = nonfinite_rows(p.k) | nonfinite_rows(p.v)
        # Note [A sink of -inf]: -inf is a value (exp(-inf) = 0), +inf and NaN taint the head
        self.sinkbad = (np.isnan(p.sink) | (p.sink == np.inf)) if p.sink is not None else np.zeros(p.nheads, bool)
        self.any = bool(self.qbad.any() or self.kvbad.any() or self.sinkbad.any())
        if self.any:
            p.q = np.where(np.isfinite(p.q), p.q, 0.0)
            p.k = np.where(np.isfinite(p.k), p.k, 0.0)
            p.v = np.where(np.isfinite(p.v), p.v, 0.0)
            if p.sink is not None:
                p.sink = np.where(self.sinkbad, 0.0, p.sink)
        self.p = p

    def rows(self, extra: Optional[np.ndarray] = None) -> np.ndarray:
        """(Tq, H) rows whose forward (and, with ``extra``, backward) values are tainted."""
        p = self.p
        bad = self.qbad | self.sinkbad[None, :]
        if extra is not None:
            bad = bad | extra
        if self.kvbad.any():
            for seg in p.segments:
                m = visible_mask(seg.q_len, seg.k_len, p.left, p.right)
                for h in range(p.nheads):
                    kb = self.kvbad[seg.k_start: seg.k_start + seg.k_len, h // p.group]
                    if not kb.any():
                        continue
                    hit = (m[:, kb] if m is not None else np.ones((seg.q_len, int(kb.sum())), bool)).any(1)
                    bad[seg.q_start: seg.q_start + seg.q_len, h] |= hit
        return bad

    def keys(self, rowbad: np.ndarray) -> np.ndarray:
        """(Tk, Hk) keys whose dK/dV are tainted: bad themselves or seen by a tainted row."""
        p = self.p
        bad = self.kvbad.copy()
        if rowbad.any():
            for seg in p.segments:
                m = visible_mask(seg.q_len, seg.k_len, p.left, p.right)
                for h in range(p.nheads):
                    rb = rowbad[seg.q_start: seg.q_start + seg.q_len, h]
                    if not rb.any():
                        continue
                    hit = (m[rb] if m is not None else np.ones((int(rb.sum()), seg.k_len), bool)).any(0)
                    bad[seg.k_start: seg.k_start + seg.k_len, h // p.group] |= hit
        return bad


def forward(q: Any, k: Any, v: Any, *, softmax_scale: Optional[float] = None, causal: bool = False,
            window_size: Sequence[Optional[int]] = (None, None), softcap: float = 0.0,
            learnable_sink: Any = None, cu_seqlens_q: Any = None, cu_seqlens_k: Any = None,
            precision: Precision = "fast") -> AttentionForward:
    """Exact-semantics FA4 attention forward with a certified elementwise error bound.

    Arguments mirror ``flash_attn.cute.flash_attn_func`` / ``flash_attn_varlen_func``
    (``window_size`` None = unbounded side; ``softcap`` 0 = off; ``learnable_sink`` (nheads,)).
    Inputs: torch tensors (any device; copied to CPU) or numpy arrays of bfloat16 (ml_dtypes),
    float16, float32 or float64; values are taken exactly. Bad shapes/dtypes/cu_seqlens raise
    ValueError naming the argument.

    Accuracy: ``|out - O_exact| <= bound`` and ``|lse - LSE_exact| <= lse_bound`` elementwise.
    For the fast reference on well-scaled bf16 inputs bound ~ 2^-45 * sum_j P_j |V_j|; see
    :mod:`oracles.reference` for where it is looser.
    """
    prec = _check_precision(precision)
    p = parse_problem(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                      softcap=softcap, learnable_sink=learnable_sink, cu_seqlens_q=cu_seqlens_q,
                      cu_seqlens_k=cu_seqlens_k)
    taint = _Taint(p)
    if prec == "fast":
        r = _ref.forward(p)
        method = "reference: certified float64 (oracles.reference)"
    else:
        r = _arb.forward(p, prec)
        method = f"arbiter: mpmath {prec}/{2 * prec} bits (oracles.arbiter)"
    out, bound, lse, lse_bound = r.out, _nan_to_inf(r.bound), r.lse, _nan_to_inf(r.lse_bound)
    if taint.any:
        bad = taint.rows()
        out[bad] = np.nan
        bound[bad] = np.inf
        lse[bad.T] = np.nan
        lse_bound[bad.T] = np.inf
    return AttentionForward(out=p.out_from_flat(out), lse=p.lse_from_flat(lse),
                            bound=p.out_from_flat(bound), lse_bound=p.lse_from_flat(lse_bound),
                            precision=prec, method=method, softmax_scale=p.scale,
                            window_size=(p.left, p.right))


def backward(q: Any, k: Any, v: Any, out: Any, dout: Any, *, softmax_scale: Optional[float] = None,
             causal: bool = False, window_size: Sequence[Optional[int]] = (None, None),
             softcap: float = 0.0, learnable_sink: Any = None, cu_seqlens_q: Any = None,
             cu_seqlens_k: Any = None, dlse: Any = None,
             precision: Precision = "fast") -> AttentionBackward:
    """Gradients of FA4 attention w.r.t. q, k, v (and the sink), with certified bounds.

    ``out``: the O that enters ``D = rowsum(dout * out)`` (FA4 uses its rounded bf16 output), or
    None for the oracle's own exact O (Note [Which O enters D]). ``dout`` like ``out``;
    ``dlse`` (optional) the gradient w.r.t. the returned LSE, in the LSE layout (FA4's
    differentiable LSE: ``D' = D - dlse``). Formulas: ``dP = dO V^T``, ``dS = P (dP - D')``
    (times ``1 - tanh^2`` with softcap), ``dQ = scale dS K``, ``dK = scale dS^T Q``,
    ``dV = P^T dO``, ``dsink_h = -sum_rows exp(sink_h - lse) D'``. Fully masked rows have zero
    gradients. GQA/MQA: dK/dV are summed over the q heads of each kv head.

    Accuracy: ``|x - x_exact| <= x_bound`` elementwise for x in dq, dk, dv, dsink, d.
    """
    return backwards(q, k, v, out, dout, dlses=(dlse,), softmax_scale=softmax_scale, causal=causal,
                     window_size=window_size, softcap=softcap, learnable_sink=learnable_sink,
                     cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, precision=precision)[0]


def backwards(q: Any, k: Any, v: Any, out: Any, dout: Any, *, dlses: Sequence[Any],
              softmax_scale: Optional[float] = None, causal: bool = False,
              window_size: Sequence[Optional[int]] = (None, None), softcap: float = 0.0,
              learnable_sink: Any = None, cu_seqlens_q: Any = None, cu_seqlens_k: Any = None,
              precision: Precision = "fast") -> list[AttentionBackward]:
    """:func:`backward` once per entry of ``dlses`` (each a gradient through the LSE or None) on
    the same inputs and ``dout``, each result the one :func:`backward` gives with that ``dlse``,
    bit for bit. The fast reference computes them in one pass (Note [Variants share a pass],
    oracles/reference.py: the forward, P, dP and dV once); a variant whose dLSE holds a
    non-finite value (rows of its own to taint) and the arbiter run one pass each."""
    prec = _check_precision(precision)
    p = parse_problem(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                      softcap=softcap, learnable_sink=learnable_sink, cu_seqlens_q=cu_seqlens_q,
                      cu_seqlens_k=cu_seqlens_k)
    Tq, H, _ = p.q.shape
    dvd = p.headdim_v
    do, do_dt = check_like(dout, "dout", p.out_shape)
    do = do.reshape(Tq, H, dvd)
    o_given = None
    if out is not None:
        o_given, _ = check_like(out, "out", p.out_shape)
        o_given = o_given.reshape(Tq, H, dvd)
        o_caller = o_given.copy()
    dls = []
    for dlse in dlses:
        dl = None
        if dlse is not None:
            dl, _ = check_like(dlse, "dlse", p.lse_shape())
            dl = p.lse_to_flat(dl)
        dls.append(dl)
    if len(dls) > 1 and (prec != "fast" or any(dl is not None and not np.all(np.isfinite(dl)) for dl in dls)):
        return [x for dlse in dlses for x in backwards(q, k, v, out, dout, dlses=(dlse,), softmax_scale=softmax_scale,
                                                       causal=causal, window_size=window_size, softcap=softcap,
                                                       learnable_sink=learnable_sink, cu_seqlens_q=cu_seqlens_q,
                                                       cu_seqlens_k=cu_seqlens_k, precision=precision)]
    taint = _Taint(p)
    extra = nonfinite_rows(do)
    if o_given is not None:
        extra |= nonfinite_rows(o_given)
    for dl in dls:
        if dl is not None:
            extra |= ~np.isfinite(dl.T)
    rowbad = taint.rows(extra)
    anybad = bool(rowbad.any() or taint.kvbad.any())
    if anybad:
        do = np.where(np.isfinite(do), do, 0.0)
        if o_given is not None:
            o_given = np.where(np.isfinite(o_given), o_given, 0.0)
        dls = [None if dl is None else np.where(np.isfinite(dl), dl, 0.0) for dl in dls]
    if prec == "fast":
        f, bs = _ref.backward(p, do, MANTISSA_BITS[do_dt], o_given, dls)
        o_used = f.out if o_given is None else o_given
        lse_flat = f.lse
        fwd_arrays = (f.out, f.bound, f.lse, f.lse_bound)
        method = "reference: certified float64 (oracles.reference)"
    else:
        bs = [_arb.backward(p, do, o_given, dls[0], prec)]
        b = bs[0]
        o_used = b.out
        lse_flat = b.lse
        fwd_arrays = (b.own_out, b.own_out_bound, b.lse, b.lse_bound)
        method = f"arbiter: mpmath {prec}/{2 * prec} bits (oracles.arbiter)"
    fwd_arrays = (fwd_arrays[0], _nan_to_inf(fwd_arrays[1]), fwd_arrays[2], _nan_to_inf(fwd_arrays[3]))
    o_used = np.array(o_used, dtype=np.float64)
    lse_flat = np.array(lse_flat, dtype=np.float64)
    if anybad:
        keybad = taint.keys(rowbad)
        fwdbad = taint.rows()
        if o_given is None:
            o_used[fwdbad] = np.nan
        else:
            o_used = o_caller          # the caller's values, non-finite ones included
        lse_flat[fwdbad.T] = np.nan
    fo, fb, fl, flb = (np.array(x, dtype=np.float64) for x in fwd_arrays)
    if anybad:
        fo[fwdbad] = np.nan
        fb[fwdbad] = np.inf
        fl[fwdbad.T] = np.nan
        flb[fwdbad.T] = np.inf
    fwd_res = AttentionForward(out=p.out_from_flat(fo), lse=p.lse_from_flat(fl), bound=p.out_from_flat(fb),
                               lse_bound=p.lse_from_flat(flb), precision=prec, method=method,
                               softmax_scale=p.scale, window_size=(p.left, p.right))
    results = []
    for b in bs:
        vals = dict(dq=b.dq, dk=b.dk, dv=b.dv, dsink=b.dsink, d=b.d, dq_bound=b.dq_bound,
                    dk_bound=b.dk_bound, dv_bound=b.dv_bound, dsink_bound=b.dsink_bound,
                    d_bound=b.d_bound)
        for key in ("dq_bound", "dk_bound", "dv_bound", "dsink_bound", "d_bound"):
            if vals[key] is not None:
                vals[key] = _nan_to_inf(vals[key])
        if anybad:
            vals["dq"][rowbad] = np.nan
            vals["dq_bound"][rowbad] = np.inf
            vals["dk"][keybad] = np.nan
            vals["dk_bound"][keybad] = np.inf
            vals["dv"][keybad] = np.nan
            vals["dv_bound"][keybad] = np.inf
            vals["d"][rowbad.T] = np.nan
            vals["d_bound"][rowbad.T] = np.inf
            if vals["dsink"] is not None:
                hb = rowbad.any(axis=0)
                vals["dsink"][hb] = np.nan
                vals["dsink_bound"][hb] = np.inf
        results.append(AttentionBackward(
            dq=vals["dq"].reshape(p.out_shape[:-1] + (p.headdim,)),
            dk=vals["dk"].reshape(p.k_shape), dv=vals["dv"].reshape(p.v_shape),
            dsink=vals["dsink"], d=p.lse_from_flat(vals["d"]),
            dq_bound=vals["dq_bound"].reshape(p.out_shape[:-1] + (p.headdim,)),
            dk_bound=vals["dk_bound"].reshape(p.k_shape), dv_bound=vals["dv_bound"].reshape(p.v_shape),
            dsink_bound=vals["dsink_bound"], d_bound=p.lse_from_flat(vals["d_bound"]),
            out=p.out_from_flat(o_used), lse=p.lse_from_flat(lse_flat),
            out_source="oracle" if out is None else "caller", precision=prec, method=method,
            forward=fwd_res))
    return results
