"""FP8 descale semantics: FA4's ``q_descale`` / ``k_descale`` / ``v_descale`` as exact input scaling.

FA4 4.0.0b36 (``interface._flash_attn_fwd``, SM 10.x only; not in the public
``flash_attn_func``) takes fp32 descale tensors of shape (batch, nheads_kv) with fp8 (e4m3 / e5m2)
q, k, v and computes, for query head ``h`` of kv head ``hk = h // (nheads // nheads_kv)`` in batch
``b``::

    logit   x_ij = softmax_scale * (q_descale[b, hk] q_i) . (k_descale[b, hk] k_j)
    output  O_i  = sum_j P_ij (v_descale[b, hk] v_j)

(the same as ``flash_attn.cute.testing.attention_ref``, which multiplies q (and qv) by
``q_descale`` repeated over the heads of a group, k by ``k_descale`` and v by ``v_descale``; the
kernel folds ``q_descale * k_descale`` into the softmax scale and ``v_descale`` into the output
epilogue, which is the same real-number function). A missing descale is 1.

:func:`descaled` returns the scaled inputs as float64 arrays; for fp8 inputs (at most 4
significand bits) times fp32 descales (24 bits) every product has at most 28 significand bits, so
it is **exact** in float64 (no overflow or underflow: fp8 magnitudes are in [2^-9, 448] for
e4m3, [2^-16, 57344] for e5m2, and a finite fp32 descale keeps the product inside float64's
range), and the certified reference (``oracles.reference``) then bounds everything downstream.
:func:`descaled` checks exactness and raises if a product was rounded (bf16/fp32 inputs with
wide descales).

Possible issues
---------------
FA4 rounds nothing here in exact arithmetic, but its kernel applies the descales in fp32 to the
fp32 accumulators (``scale * qd * kd`` is one fp32 product), which the budgets, not the oracle,
account for. The oracle does not check that FA4 accepts the combination (it asserts fp8 inputs,
SM 10.x, and with MLA ``k_descale is v_descale``).
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .semantics import as_float64

__all__ = ["descaled", "descale_factors"]


def descale_factors(t: Any, name: str, batch: int, nheads_kv: int) -> Optional[np.ndarray]:
    """float64 (batch, nheads_kv) copy of a descale tensor (None stays None); ValueError naming
    ``name`` for a wrong shape or a non-finite entry."""
    if t is None:
        return None
    a, _ = as_float64(t, name)
    if a.shape != (batch, nheads_kv):
        raise ValueError(f"{name}: expected shape ({batch}, {nheads_kv}) (batch, nheads_kv), got {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name}: descale factors must be finite")
    return a


def _scale(x: np.ndarray, f: Optional[np.ndarray], name: str, group: int,
           seq: Optional[np.ndarray] = None) -> np.ndarray:
    """x (b, s, heads, d) times f[b, head // group] (``seq``: x is varlen (total, heads, d) and
    token t belongs to batch entry ``seq[t]``); raises if a product is not exact."""
    if f is None:
        return x
    fh = np.repeat(f, group, axis=1)
    fh = fh[seq][:, :, None] if seq is not None else fh[:, None, :, None]   # (total, heads, 1) / (b, 1, heads, 1)
    y = x * fh
    # a product of significands of a and b bits has at most a + b bits: exact if a + b <= 53
    # (and no over/underflow, which fp8/bf16 magnitudes times a finite fp32 factor cannot reach)
    if not (_bits(x) + _bits(fh) <= 53):
        raise ValueError(f"{name}: descaled values are not exact in float64 "
                         f"({_bits(x)} + {_bits(fh)} significand bits > 53)")
    return y


def _bits(x: np.ndarray) -> int:
    """Largest number of significand bits (leading to trailing one) of any finite nonzero entry."""
    a = np.abs(np.asarray(x, np.float64)).ravel()
    a = a[np.isfinite(a) & (a != 0)]
    if a.size == 0:
        return 0
    m, _ = np.frexp(a)                       # m in [0.5, 1): 53-bit integer significand below
    ints = (m * 2.0 ** 53).astype(np.uint64)
    tz = np.zeros(ints.shape, np.int64)
    v = ints.copy()
    for sh in (32, 16, 8, 4, 2, 1):          # trailing zeros by binary search
        low = (v & np.uint64((1 << sh) - 1)) == 0
        tz += np.where(low, sh, 0)
        v = np.where(low, v >> np.uint64(sh), v)
    return int((53 - tz).max())


def _sequence_of(cu: Any, name: str) -> np.ndarray:
    """The batch entry of every token of a varlen axis with offsets ``cu`` (length batch + 1)."""
    c = np.asarray(cu, np.int64).ravel()
    if c.size < 1 or c[0] != 0 or np.any(np.diff(c) < 0):
        raise ValueError(f"{name}: offsets must start at 0 and not decrease")
    return np.repeat(np.arange(c.size - 1), np.diff(c))


def descaled(q: Any, k: Any, v: Any, *, q_descale: Any = None, k_descale: Any = None,
             v_descale: Any = None, qv: Any = None, cu_seqlens_q: Any = None,
             cu_seqlens_k: Any = None) -> dict[str, Any]:
    """Batched q (b, s, h, d), k (b, sk, hk, d), v (b, sk, hk, dv) (and MLA's qv (b, s, h, dv),
    scaled by ``q_descale`` like q) with the descales applied exactly: ``{"q", "k", "v", "qv",
    "dtypes"}`` (float64 arrays; ``dtypes`` the source dtypes). ``q`` or ``k`` may be None (MLA
    without the rope part). With ``cu_seqlens_q`` and ``cu_seqlens_k`` the arrays are varlen
    (total, heads, d) and a descale's batch entry is the token's sequence."""
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen and (cu_seqlens_q is None or cu_seqlens_k is None):
        raise ValueError("varlen descales need both cu_seqlens_q and cu_seqlens_k")
    ref_q = q if q is not None else qv
    arrs = {}
    dts = {}
    for name, t in (("q", q), ("k", k), ("v", v), ("qv", qv)):
        if t is None:
            arrs[name] = None
            continue
        a, dt = as_float64(t, name)
        if a.ndim != (3 if varlen else 4):
            raise ValueError(f"{name}: descales need {'varlen 3-D' if varlen else 'batched 4-D'} tensors, "
                             f"got shape {a.shape}")
        arrs[name], dts[name] = a, dt
    if ref_q is None:
        raise ValueError("q or qv is required")
    sq = sk = None
    if varlen:
        sq, sk = _sequence_of(cu_seqlens_q, "cu_seqlens_q"), _sequence_of(cu_seqlens_k, "cu_seqlens_k")
        b = len(np.asarray(cu_seqlens_q).ravel()) - 1
        if len(np.asarray(cu_seqlens_k).ravel()) - 1 != b:
            raise ValueError("cu_seqlens_q and cu_seqlens_k name different batch sizes")
        for name, n_tok in (("q", sq.size), ("qv", sq.size), ("k", sk.size), ("v", sk.size)):
            if arrs[name] is not None and arrs[name].shape[0] != n_tok:
                raise ValueError(f"{name}: {arrs[name].shape[0]} tokens, the offsets say {n_tok}")
        h = arrs["q" if q is not None else "qv"].shape[1]
        hk = arrs["v"].shape[1]
    else:
        b, _, h, _ = arrs["q" if q is not None else "qv"].shape
        hk = arrs["v"].shape[2]
    if h % hk:
        raise ValueError(f"nheads {h} is not a multiple of nheads_kv {hk}")
    qd = descale_factors(q_descale, "q_descale", b, hk)
    kd = descale_factors(k_descale, "k_descale", b, hk)
    vd = descale_factors(v_descale, "v_descale", b, hk)
    g = h // hk
    out = {"q": None if arrs["q"] is None else _scale(arrs["q"], qd, "q", g, sq),
           "qv": None if arrs["qv"] is None else _scale(arrs["qv"], qd, "qv", g, sq),
           "k": None if arrs["k"] is None else _scale(arrs["k"], kd, "k", 1, sk),
           "v": _scale(arrs["v"], vd, "v", 1, sk), "dtypes": dts}
    return out
