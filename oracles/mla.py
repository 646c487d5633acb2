"""MLA (``qv``) and top-k gather (``gather_kv_indices``) semantics, as exact rewrites into the
standard attention the oracles already certify.

The function (FA4 ``flash_attn.cute``, flash-attn-4 4.0.0b36; SM 10.x/11.x only)
--------------------------------------------------------------------------------
Inputs (batched): ``q`` (b, s, h, d) the rope part (FA4 requires d = 64), ``k`` (b, sk, hk, d),
``v`` (b, sk, hk, dv) the latent cache (dv = 512), ``qv`` (b, s, h, dv). For query row ``i``,
head ``h`` (kv head ``hk = h // (nheads // nheads_kv)``) and key ``j``::

    logit   x_ij = softmax_scale * (q_i . k_j + qv_i . v_j)        (``interface._flash_attn_fwd``:
                                                                      Q@K^T and Qv@V^T share one
                                                                      accumulator)
    scale   default 1 / sqrt(d + dv)   (= 1/24 for 64 + 512); without q/k (FA4's "shared KV":
            ``flash_attn_func(q, kv, kv)`` with dv 512 passes q as qv) the logit is
            ``scale * qv_i . v_j`` with default scale 1 / sqrt(dv)
    LSE     lse_i = log sum_visible exp(x_ij)   (natural log; FA4's MLA layout is (b, s, h))
    output  O_i = sum_visible exp(x_ij - lse_i) v_j                 (dv = 512 columns)

This is ordinary attention on the concatenations ``q' = [q, qv]``, ``k' = [k, v]`` (head dim
d + dv) with value ``v`` (:func:`as_standard`; concatenation is exact, so the certified bound of
:mod:`oracles.reference` holds unchanged). Causal masking is FA4's bottom-right rule
(:mod:`oracles.semantics`); FA4 rejects local windows, softcap, score/mask mods and block
sparsity with qv.

Top-k gather (sparse MLA): ``gather_kv_indices`` (b, s, topk) int, FA4: one KV head, topk a
multiple of 128. Query token ``(b, i)`` attends to the key *slots* ``t = 0 .. topk-1`` holding
``j = idx[b, i, t]``; a slot is empty when ``j < 0`` (the ``-1`` sentinel), ``j >= seqlen_k``
(``seqused_k[b]`` when given), or, with ``causal``, ``j >= i + 1 + seqlen_k - seqlen_q``
(``flash_fwd_mla_sm100.py``: ``seqlen_k_limit = m_local_idx + 1 + seqlen_k - seqlen_q``;
``topk_gather_kv.py``: "Rows whose index is -1 or >= seqlen_k_limit are zero-filled ... and
cleared in the validity bitmask"). A token with no valid slot has O = 0, LSE = -inf.

Note [Gather duplicates]: the kernel loads one K/V row *per slot*, so an index listed twice is
two keys (it counts twice in the softmax): ``duplicates="slots"`` (default) is that reading of
the kernel's structure (compile-only reading of the source, not measured). FA4's reference
``flash_attn.cute.testing.attention_ref`` builds a key *mask* by scatter (each key at most once):
``duplicates="set"``. The two agree whenever a row's valid indices are distinct.

:func:`as_gathered` rewrites a gather problem as a varlen batch, one sequence per query token
with its valid slots as keys (exact: pure indexing); :func:`forward` / :func:`backward` run the
certified oracle on it and scatter the results back, with rigorous bounds (backward: dk/dv of a
key are sums over the copies of that key, plus, for dv, the score use ``qv . v``; the sums carry
``gamma_{n-1} sum |term|`` for their own rounding). Descales (fp8): :mod:`oracles.descale`.

Accuracy
--------
As :mod:`oracles.reference` (bound per element; ``2^-44`` to ``2^-40`` of the natural scale on
bf16 inputs), for the head dim d + dv = 576; the backward scatter adds at most
``gamma_{n-1} sum |term|`` with n the number of copies of a key.

Possible issues
---------------
``precision=<bits>`` (the mpmath arbiter) is fine for small problems only (576-wide dots). The
gather rewrite makes one varlen sequence per query token: fine for tests and audit-size problems,
slow for long top-k lists over many tokens.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Optional

import numpy as np

from . import attention as _att
from .descale import descaled
from .reference import SAFETY, gamma
from .semantics import as_float64

__all__ = ["MLAForward", "MLABackward", "as_standard", "as_gathered", "gather_slots", "default_scale",
           "forward", "backward"]

Duplicates = Literal["slots", "set"]


def default_scale(head_dim: Optional[int], head_dim_v: int) -> float:
    """FA4's default MLA softmax scale: ``1/sqrt(d + dv)`` with the rope part, ``1/sqrt(dv)``
    without (``head_dim=None``); the float64 value of ``1.0 / math.sqrt(...)`` as interface.py
    computes it."""
    return 1.0 / math.sqrt(head_dim_v if head_dim is None else head_dim + head_dim_v)


def as_standard(q: Optional[np.ndarray], k: Optional[np.ndarray], v: np.ndarray,
                qv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(q', k')`` = ``([q, qv], [k, v])`` concatenated on the head dim (exact), so that
    ``q'_i . k'_j = q_i . k_j + qv_i . v_j``; without the rope part ``(qv, v)``."""
    if (q is None) != (k is None):
        raise ValueError("q and k: give both (rope part) or neither")
    if qv.shape[-1] != v.shape[-1]:
        raise ValueError(f"qv: last dim {qv.shape[-1]} must equal head_dim_v {v.shape[-1]}")
    if q is None:
        return qv, v
    if q.shape[:-1] != qv.shape[:-1]:
        raise ValueError(f"q {q.shape} and qv {qv.shape}: all but the last dim must match")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"k {k.shape} and v {v.shape}: all but the last dim must match")
    return np.concatenate([q, qv], axis=-1), np.concatenate([k, v], axis=-1)


def gather_slots(idx: np.ndarray, seqlen_q: int, seqlen_k: int, *, causal: bool,
                 seqused_k: Optional[np.ndarray] = None, duplicates: Duplicates = "slots"
                 ) -> list[list[np.ndarray]]:
    """Per batch ``b`` and query row ``i``: the key indices that query sees (valid slots, in slot
    order; Note [Gather duplicates] for ``duplicates``)."""
    if duplicates not in ("slots", "set"):
        raise ValueError(f"duplicates={duplicates!r}: expected 'slots' or 'set'")
    b = idx.shape[0]
    out = []
    for bi in range(b):
        sk = int(seqused_k[bi]) if seqused_k is not None else seqlen_k
        rows = []
        for i in range(seqlen_q):
            lim = min(sk, i + 1 + sk - seqlen_q) if causal else sk
            r = idx[bi, i]
            r = r[(r >= 0) & (r < lim)]
            if duplicates == "set":
                _, first = np.unique(r, return_index=True)
                r = r[np.sort(first)]
            rows.append(r.astype(np.int64))
        out.append(rows)
    return out


def as_gathered(qp: np.ndarray, kp: np.ndarray, v: np.ndarray, slots: list[list[np.ndarray]]
                ) -> dict[str, Any]:
    """One varlen sequence per query token ``(b, i)``: its single query row and, as keys, the rows
    of its valid slots. ``{"q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "key_index"}`` with
    ``key_index`` (total_k, 2) = (batch, key) of each packed key row (to scatter gradients)."""
    b, s = qp.shape[:2]
    qs = qp.reshape(b * s, *qp.shape[2:])
    ks, vs, kidx, lk = [], [], [], []
    for bi in range(b):
        for i in range(s):
            r = slots[bi][i]
            ks.append(kp[bi, r])
            vs.append(v[bi, r])
            kidx.append(np.stack([np.full(r.size, bi), r], axis=1))
            lk.append(r.size)
    ck = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
    cq = np.arange(b * s + 1, dtype=np.int32)
    return {"q": qs, "k": np.concatenate(ks), "v": np.concatenate(vs), "cu_seqlens_q": cq,
            "cu_seqlens_k": ck, "key_index": np.concatenate(kidx).reshape(-1, 2)}


@dataclass(frozen=True)
class MLAForward:
    """``out`` (b, s, h, dv), ``lse`` (b, s, h) (FA4's MLA layout), with elementwise absolute
    bounds; ``softmax_scale`` as used; ``method`` the arithmetic."""

    out: np.ndarray
    lse: np.ndarray
    bound: np.ndarray
    lse_bound: np.ndarray
    softmax_scale: float
    method: str


@dataclass(frozen=True)
class MLABackward:
    """Gradients with elementwise absolute bounds: ``dq``/``dk`` (None without the rope part),
    ``dv`` (both uses of V: score ``qv . v`` and value), ``dqv``."""

    dq: Optional[np.ndarray]
    dk: Optional[np.ndarray]
    dv: np.ndarray
    dqv: np.ndarray
    dq_bound: Optional[np.ndarray]
    dk_bound: Optional[np.ndarray]
    dv_bound: np.ndarray
    dqv_bound: np.ndarray
    forward: MLAForward


def _prepare(q, k, v, qv, q_descale, k_descale, v_descale, softmax_scale):
    if any(t is not None for t in (q_descale, k_descale, v_descale)):
        d = descaled(q, k, v, qv=qv, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
        qa, ka, va, qva = d["q"], d["k"], d["v"], d["qv"]
        dts = set(d["dtypes"].values())
    else:
        conv = {nm: (None if t is None else as_float64(t, nm)) for nm, t in
                (("q", q), ("k", k), ("v", v), ("qv", qv))}
        qa, ka, va, qva = (None if conv[nm] is None else conv[nm][0] for nm in ("q", "k", "v", "qv"))
        dts = {c[1] for c in conv.values() if c is not None}
    for nm, a in (("q", qa), ("k", ka), ("v", va), ("qv", qva)):
        if a is not None and a.ndim != 4:
            raise ValueError(f"{nm}: expected 4-D (batch, seqlen, heads, dim), got shape {a.shape}")
    scale = (default_scale(None if qa is None else qa.shape[-1], va.shape[-1]) if softmax_scale is None
             else float(softmax_scale))
    qp, kp = as_standard(qa, ka, va, qva)
    if len(dts) == 1 and next(iter(dts)) in ("bfloat16", "float16") and not any(
            t is not None for t in (q_descale, k_descale, v_descale)):
        # keep the narrow dtype (exact: the values came from it), so the reference's exact-dot
        # certificate applies (Note [Oracle error model])
        import ml_dtypes
        nt = ml_dtypes.bfloat16 if next(iter(dts)) == "bfloat16" else np.float16
        qp, kp, va = qp.astype(nt), kp.astype(nt), va.astype(nt)
    return qa, ka, va, qva, qp, kp, scale


def _slots(gather_kv_indices, qp, kp, causal, seqused_k, duplicates):
    idx = np.asarray(gather_kv_indices.detach().cpu().numpy() if hasattr(gather_kv_indices, "detach")
                     else gather_kv_indices)
    if idx.shape[:2] != qp.shape[:2] or idx.ndim != 3:
        raise ValueError(f"gather_kv_indices: expected shape (batch, seqlen_q, topk) = "
                         f"{qp.shape[:2]} + (topk,), got {idx.shape}")
    if not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(f"gather_kv_indices: must be an integer tensor, got {idx.dtype}")
    su = None if seqused_k is None else np.asarray(
        seqused_k.detach().cpu().numpy() if hasattr(seqused_k, "detach") else seqused_k).astype(np.int64)
    return gather_slots(idx, qp.shape[1], kp.shape[1], causal=causal, seqused_k=su, duplicates=duplicates)


def _fwd_from(r, b, s, h, dv, scale, method) -> MLAForward:
    # varlen result: out (T, h, dv), lse (h, T) -> (b, s, h, dv), (b, s, h)
    return MLAForward(out=r.out.reshape(b, s, h, dv), lse=r.lse.T.reshape(b, s, h),
                      bound=r.bound.reshape(b, s, h, dv), lse_bound=r.lse_bound.T.reshape(b, s, h),
                      softmax_scale=scale, method=method)


def forward(q: Any, k: Any, v: Any, qv: Any, *, softmax_scale: Optional[float] = None,
            causal: bool = False, gather_kv_indices: Any = None, seqused_k: Any = None,
            q_descale: Any = None, k_descale: Any = None, v_descale: Any = None,
            duplicates: Duplicates = "slots", precision: _att.Precision = "fast") -> MLAForward:
    """FA4's MLA forward (module docstring), certified: ``|out - O_exact| <= bound``,
    ``|lse - LSE_exact| <= lse_bound`` elementwise. Batched inputs only; ``q``/``k`` may be None
    (no rope part). ``gather_kv_indices`` (b, s, topk): sparse MLA (Note [Gather duplicates]).
    ``seqused_k`` (b,): keys ``>= seqused_k[b]`` are invisible (gather) -- the dense path takes it
    as the sequence length. Descales as in :mod:`oracles.descale`."""
    qa, ka, va, qva, qp, kp, scale = _prepare(q, k, v, qv, q_descale, k_descale, v_descale, softmax_scale)
    b, s, h, _ = qp.shape
    dv = va.shape[-1]
    if gather_kv_indices is None:
        if seqused_k is None:
            r = _att.forward(qp, kp, va, softmax_scale=scale, causal=causal, precision=precision)
            return MLAForward(out=r.out, lse=r.lse.transpose(0, 2, 1), bound=r.bound,
                              lse_bound=r.lse_bound.transpose(0, 2, 1), softmax_scale=scale, method=r.method)
        su = np.asarray(seqused_k.detach().cpu().numpy() if hasattr(seqused_k, "detach") else seqused_k)
        slots = [[np.arange(int(su[bi])) for _ in range(s)] for bi in range(b)]
        if causal:
            slots = [[np.arange(max(0, min(int(su[bi]), i + 1 + int(su[bi]) - s))) for i in range(s)]
                     for bi in range(b)]
    else:
        slots = _slots(gather_kv_indices, qp, kp, causal, seqused_k, duplicates)
    g = as_gathered(qp, kp, va, slots)
    r = _att.forward(g["q"], g["k"], g["v"], softmax_scale=scale, cu_seqlens_q=g["cu_seqlens_q"],
                     cu_seqlens_k=g["cu_seqlens_k"], precision=precision)
    return _fwd_from(r, b, s, h, dv, scale, r.method)


def _scatter(vals: np.ndarray, bounds: np.ndarray, key_index: np.ndarray, shape: tuple,
             extra: Optional[tuple[np.ndarray, np.ndarray]] = None) -> tuple[np.ndarray, np.ndarray]:
    """Sum packed per-copy gradients (total_k, hk, dim) into ``shape`` (b, sk, hk, dim) by
    ``key_index``, plus ``extra`` (value, bound) of that shape; bound = sum of the terms' bounds
    + gamma_{n-1} sum |term| (n = the most terms any element gets), times SAFETY."""
    out = np.zeros(shape)
    bnd = np.zeros(shape)
    mag = np.zeros(shape)
    cnt = np.zeros(shape[:2])
    bi, kj = key_index[:, 0], key_index[:, 1]
    np.add.at(out, (bi, kj), vals)
    np.add.at(bnd, (bi, kj), bounds)
    np.add.at(mag, (bi, kj), np.abs(vals))
    np.add.at(cnt, (bi, kj), 1)
    n = int(cnt.max(initial=0))
    if extra is not None:
        out += extra[0]
        bnd += extra[1]
        mag += np.abs(extra[0])
        n += 1
    return out, (bnd + gamma(max(n - 1, 0)) * mag) * SAFETY


def backward(q: Any, k: Any, v: Any, qv: Any, out: Any, dout: Any, *,
             softmax_scale: Optional[float] = None, causal: bool = False, gather_kv_indices: Any = None,
             duplicates: Duplicates = "slots", precision: _att.Precision = "fast") -> MLABackward:
    """Gradients of FA4's (sparse) MLA with certified bounds: ``dq``, ``dk``, ``dv``, ``dqv``.
    ``out``: the O in ``D = rowsum(dO * O)`` (Note [Which O enters D] in :mod:`oracles.attention`;
    FA4's sparse backward uses its bf16 O plus the saved fp32 residual ``o_lo``, i.e. nearly the
    fp32 O) or None for the exact O. FA4 has a backward for the gather path only; the dense
    formula here is the same function (the gather path with every key in every slot list)."""
    qa, ka, va, qva, qp, kp, scale = _prepare(q, k, v, qv, None, None, None, softmax_scale)
    b, s, h, dp = qp.shape
    hk, dv = va.shape[2], va.shape[-1]
    d = dp - dv
    sk = kp.shape[1]
    do = as_float64(dout, "dout")[0]
    oo = None if out is None else as_float64(out, "out")[0]
    if gather_kv_indices is None:
        slots = [[(np.arange(max(0, min(sk, i + 1 + sk - s))) if causal else np.arange(sk)) for i in range(s)]
                 for _ in range(b)]
    else:
        slots = _slots(gather_kv_indices, qp, kp, causal, None, duplicates)
    g = as_gathered(qp, kp, va, slots)
    T = b * s
    r = _att.backward(g["q"], g["k"], g["v"], None if oo is None else oo.reshape(T, h, dv),
                      do.reshape(T, h, dv), softmax_scale=scale, cu_seqlens_q=g["cu_seqlens_q"],
                      cu_seqlens_k=g["cu_seqlens_k"], precision=precision)
    dqp = r.dq.reshape(b, s, h, dp)
    dqp_b = r.dq_bound.reshape(b, s, h, dp)
    # dk' = [dk, dv_score]: sum the copies; dv = dv_score + dv_value
    dv_val, dv_val_b = _scatter(r.dv, r.dv_bound, g["key_index"], (b, sk, hk, dv))
    dkp_sum, dkp_b = _scatter(r.dk, r.dk_bound, g["key_index"], (b, sk, hk, dp))
    dv_tot = dkp_sum[..., d:] + dv_val
    dv_tot_b = (dkp_b[..., d:] + dv_val_b + gamma(1) * np.abs(dv_tot)) * SAFETY
    fw = _fwd_from(r.forward, b, s, h, dv, scale, r.method)
    has_qk = qa is not None
    return MLABackward(dq=dqp[..., :d] if has_qk else None, dk=dkp_sum[..., :d] if has_qk else None,
                       dv=dv_tot, dqv=dqp[..., d:],
                       dq_bound=dqp_b[..., :d] if has_qk else None,
                       dk_bound=dkp_b[..., :d] if has_qk else None, dv_bound=dv_tot_b,
                       dqv_bound=dqp_b[..., d:], forward=fw)
