"""The arrays FA4 is called with for a problem's call form, and the way back to the problem's
layout (Note [Call forms keep the problem's meaning] in ``fa4verify.problem.calls``).

* :func:`call_arrays` -- a ``seqused_k`` / paged-KV / ``seqused_q`` call form: q packed, batched,
  or batched with a capacity and ``seqused_q``; K/V batched ``(batch, kv_capacity, hk, d)`` or as
  pages with a ``page_table``, and ``seqused_k``, or batched whole; the rows and pages no query or
  key of the problem uses hold finite filler (NaN pages with ``hostile_nan``).
* :func:`gather_kv` -- the keys a paged / seqused_k call reads, in the problem's packed
  layout (``fa4verify.oracles.paged_kv.contiguous_kv``); ``wrong_permutation`` plants a fault (the
  page table applied through the wrong permutation) for the fuzz's own mutation test.
* :func:`gather_q` -- the queries (and dO) such a call reads, in the problem's packed layout.
* :func:`to_problem_fwd` / :func:`to_problem_grads` -- outputs of such a call in the problem's
  varlen layout (rows past ``seqused_q`` / ``seqused_k`` dropped).

Exact: pure indexing; the filler is generated from the problem's value seed.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np

__all__ = ["call_arrays", "gather_kv", "gather_q", "to_problem_fwd", "to_problem_grads", "FILLER_SCALE"]

#: filler rows are standard normal times this, rounded to the dtype: finite and large enough that
#: a kernel reading a row it must not (a key past seqused_k) changes O visibly
FILLER_SCALE = 4.0


def _filler(problem, shape: tuple[int, ...], salt: int) -> np.ndarray:
    from fa4verify.problem import round_to_dtype
    rng = np.random.default_rng([problem.values.seed, salt, 0xF111])
    return np.asarray(round_to_dtype(rng.standard_normal(shape) * FILLER_SCALE, problem.dtype), np.float32)


def _batched(problem, x: np.ndarray, lengths, cap: int, salt: int) -> np.ndarray:
    """Packed ``(total, ...)`` rows of sequences of ``lengths`` as ``(batch, cap, ...)``, filler past each."""
    used = np.asarray(lengths, np.int64)
    off = np.concatenate([[0], np.cumsum(used)])
    out = _filler(problem, (len(used), cap) + x.shape[1:], salt)
    for i in range(len(used)):
        out[i, : used[i]] = x[off[i]: off[i + 1]]
    return out


def call_arrays(problem, a: Mapping[str, Any]) -> dict[str, Any]:
    """``{"q", "k", "v", "dout", "seqused_q", "seqused_k", "page_table", "cu_seqlens_q",
    "max_seqlen_q", "cu_seqlens_k", "max_seqlen_k"}`` of a seqused_k / paged / seqused_q call form
    (float32 holding exact dtype values; int32 index arrays; None where the call passes nothing).
    ``kv_packed``: K/V ``(batch * kv_capacity, hk, d)`` with ``cu_seqlens_k`` at capacity offsets."""
    call = problem.call
    b = problem.batch
    k = np.asarray(a["k"], np.float32)
    v = np.asarray(a["v"], np.float32)
    out: dict[str, Any] = {"seqused_k": None, "page_table": None, "seqused_q": None, "cu_seqlens_k": None,
                           "max_seqlen_k": None}
    if not call.seqused_k:          # seqused_q alone: K/V batched and whole (equal seqlens_k)
        sk = problem.seqlen_k
        out.update(k=k.reshape(b, sk, *k.shape[1:]), v=v.reshape(b, sk, *v.shape[1:]))
        return _q_side(problem, a, out)
    cap = call.kv_capacity
    used = np.asarray(problem.seqlens_k, np.int32)
    kb = _batched(problem, k, used, cap, 1)
    vb = _batched(problem, v, used, cap, 2)
    out["seqused_k"] = used
    if call.paged:
        from fa4verify.oracles.paged_kv import paginate
        P = call.page_size
        rng = None if call.page_seed is None else np.random.default_rng(call.page_seed)
        kp, vp, table = paginate(kb, vb, P, seqused_k=np.full(b, cap), rng=rng, spare_pages=call.spare_pages,
                                 unused_fill=0.0)
        # pages no key of the problem uses: filler, or NaN (a stale KV-cache pool) when asked
        live = np.zeros(kp.shape[0], bool)
        for i in range(b):
            live[table[i, : -(-int(used[i]) // P)]] = True
        dead = ~live
        if call.hostile_nan:
            kp[dead] = np.nan
            vp[dead] = np.nan
        else:
            kp[dead] = _filler(problem, (int(dead.sum()),) + kp.shape[1:], 3)
            vp[dead] = _filler(problem, (int(dead.sum()),) + vp.shape[1:], 4)
        out.update(k=kp, v=vp, page_table=table.astype(np.int32))
    elif call.kv_packed:
        out.update(k=kb.reshape((-1,) + kb.shape[2:]), v=vb.reshape((-1,) + vb.shape[2:]),
                   cu_seqlens_k=(np.arange(b + 1) * cap).astype(np.int32), max_seqlen_k=int(cap))
    else:
        out.update(k=kb, v=vb)
    return _q_side(problem, a, out)


def _q_side(problem, a: Mapping[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    call, b = problem.call, problem.batch
    q = np.asarray(a["q"], np.float32)
    do = None if a.get("dout") is None else np.asarray(a["dout"], np.float32)
    if call.seqused_q:
        used = np.asarray(problem.seqlens_q, np.int32)
        qb = _batched(problem, q, used, call.q_capacity, 5)
        dob = None if do is None else _batched(problem, do, used, call.q_capacity, 6)
        out.update(q=qb, dout=dob, seqused_q=used, cu_seqlens_q=None, max_seqlen_q=None)
        if call.q_packed:           # packed at capacity offsets, cu_seqlens_q with them
            out.update(q=qb.reshape((-1,) + qb.shape[2:]), dout=None if dob is None else dob.reshape((-1,) + dob.shape[2:]),
                       cu_seqlens_q=(np.arange(b + 1) * call.q_capacity).astype(np.int32),
                       max_seqlen_q=int(call.q_capacity))
    elif call.q_batched:
        sq = problem.seqlen_q
        out.update(q=q.reshape(b, sq, *q.shape[1:]), dout=None if do is None else do.reshape(b, sq, *do.shape[1:]),
                   cu_seqlens_q=None, max_seqlen_q=None)
    else:
        out.update(q=q, dout=do, cu_seqlens_q=np.asarray(a["cu_seqlens_q"], np.int32),
                   max_seqlen_q=problem.seqlen_q)
    return out


def gather_kv(problem, c: Mapping[str, Any], *, wrong_permutation: bool = False
              ) -> tuple[np.ndarray, np.ndarray]:
    """The packed (total_k, hk, d) K and V that the call ``c`` (:func:`call_arrays`) reads.
    ``wrong_permutation``: a planted fault (the table's rows read through its reversed page
    order), which only a non-identity page order with two or more pages per sequence exposes."""
    used = c["seqused_k"]
    if used is None:                                      # batched whole
        return (np.asarray(c["k"]).reshape((-1,) + c["k"].shape[2:]),
                np.asarray(c["v"]).reshape((-1,) + c["v"].shape[2:]))
    if c["page_table"] is None:
        kk, vv = np.asarray(c["k"]), np.asarray(c["v"])
        if c.get("cu_seqlens_k") is not None:              # packed at capacity offsets
            kk = kk.reshape((len(used), -1) + kk.shape[1:])
            vv = vv.reshape((len(used), -1) + vv.shape[1:])
        ks = [kk[i, : used[i]] for i in range(len(used))]
        vs = [vv[i, : used[i]] for i in range(len(used))]
    else:
        from fa4verify.oracles.paged_kv import contiguous_kv
        table = np.asarray(c["page_table"])
        if wrong_permutation:
            table = table[:, ::-1].copy() if problem.call.page_seed is not None else table
        pairs = contiguous_kv(c["k"], c["v"], table, used)
        ks, vs = [p[0] for p in pairs], [p[1] for p in pairs]
    hk = problem.nheads_kv
    k = np.concatenate(ks) if ks else np.zeros((0, hk, problem.head_dim), np.float32)
    v = np.concatenate(vs) if vs else np.zeros((0, hk, problem.head_dim_v), np.float32)
    return k, v


def gather_q(problem, c: Mapping[str, Any]) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """The packed (total_q, h, d) Q and dO that the call ``c`` (:func:`call_arrays`) reads."""
    q, do = np.asarray(c["q"]), c["dout"]
    if problem.call.seqused_q:
        used = c["seqused_q"]
        q, do = _capacity_rows(problem, q), None if do is None else _capacity_rows(problem, np.asarray(do))
        return _used_rows(q, used), None if do is None else _used_rows(do, used)
    if problem.call.q_batched:
        return q.reshape((-1,) + q.shape[2:]), None if do is None else np.asarray(do).reshape((-1,) + do.shape[2:])
    return q, do


def _capacity_rows(problem, x: np.ndarray) -> np.ndarray:
    """A seqused_q call's Q-side array as (batch, q_capacity, ...): packed at capacity offsets
    (``q_packed``) reshaped, batched as it is."""
    if problem.call.q_packed:
        return x.reshape((problem.batch, problem.call.q_capacity) + x.shape[1:])
    return x


def _used_rows(x: np.ndarray, used) -> np.ndarray:
    """(batch, cap, ...) -> the packed rows [0, used[b]) of each batch entry."""
    parts = [x[i, :n] for i, n in enumerate(used)]
    return np.concatenate(parts) if parts else x.reshape((0,) + x.shape[2:])


def to_problem_out(problem, out: np.ndarray) -> np.ndarray:
    """O of the call in the problem's varlen layout ``(total_q, h, dv)``."""
    out = np.asarray(out, np.float64)
    if problem.call.seqused_q:
        return _used_rows(_capacity_rows(problem, out), problem.seqlens_q)
    if problem.call.q_batched:
        return out.reshape(problem.batch * problem.seqlen_q, problem.nheads, out.shape[-1])
    return out


def to_problem_fwd(problem, out: np.ndarray, lse: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """O and LSE of the call in the problem's varlen layout ((total_q, h, dv), (h, total_q))."""
    lse = np.asarray(lse, np.float64)
    if problem.call.seqused_q:
        if problem.call.q_packed:              # (h, batch * cap) -> (batch, h, cap)
            lse = lse.reshape(lse.shape[0], problem.batch, -1).transpose(1, 0, 2)
        lse = _used_rows(lse.transpose(0, 2, 1), problem.seqlens_q).T
    elif problem.call.q_batched:
        lse = lse.transpose(1, 0, 2).reshape(problem.nheads, problem.batch * problem.seqlen_q)
    return to_problem_out(problem, out), lse


def to_call_lse(problem, x: np.ndarray) -> np.ndarray:
    """A per-row quantity in the problem's varlen LSE layout ``(h, total_q)`` (a gradient through
    the LSE) in the call's own LSE layout, the inverse of :func:`to_problem_fwd`'s: ``(batch, h,
    q_capacity)`` with ``seqused_q`` (``(h, batch * q_capacity)`` packed at capacity offsets),
    ``(batch, h, seqlen_q)`` with Q batched, else unchanged. Rows the problem does not have (past
    ``seqused_q``) are 0 (float32)."""
    x = np.asarray(x, np.float32)
    call, b, h = problem.call, problem.batch, problem.nheads
    if call.seqused_q:
        cap = call.q_capacity
        z = np.zeros((b, cap, h), np.float32)
        off = 0
        for i, n in enumerate(problem.seqlens_q):
            z[i, :n] = x[:, off:off + n].T
            off += n
        if call.q_packed:
            return np.ascontiguousarray(z.transpose(2, 0, 1).reshape(h, b * cap))
        return np.ascontiguousarray(z.transpose(0, 2, 1))
    if call.q_batched:
        return np.ascontiguousarray(x.reshape(h, b, problem.seqlen_q).transpose(1, 0, 2))
    return np.ascontiguousarray(x)


def to_problem_grads(problem, dq: np.ndarray, dk: np.ndarray, dv: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dQ, dK, dV of a (non-paged) seqused_k / seqused_q call in the problem's varlen layout: dQ
    rows past ``seqused_q`` and dK/dV rows past ``seqused_k`` are not part of the problem and are
    dropped."""
    call = problem.call
    dq, dk, dv = (np.asarray(x, np.float64) for x in (dq, dk, dv))
    if call.seqused_q:
        dq = _used_rows(_capacity_rows(problem, dq), problem.seqlens_q)
    elif call.q_batched:
        dq = dq.reshape((-1,) + dq.shape[2:])
    if call.seqused_k:
        if call.kv_packed:                                # packed at capacity offsets
            dk, dv = (x.reshape((problem.batch, -1) + x.shape[1:]) for x in (dk, dv))
        dk, dv = _used_rows(dk, problem.seqlens_k), _used_rows(dv, problem.seqlens_k)
    else:                                                 # batched whole
        dk, dv = dk.reshape((-1,) + dk.shape[2:]), dv.reshape((-1,) + dv.shape[2:])
    return dq, dk, dv
