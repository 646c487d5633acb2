"""The arrays FA4 is called with for a problem's call form, and the way back to the problem's
layout (Note [Call forms keep the problem's meaning] in ``fa4verify.problem.calls``).

* :func:`kv_call_arrays` -- a ``seqused_k`` / paged-KV call form: q packed or batched, K/V
  batched ``(batch, kv_capacity, hk, d)`` or as pages with a ``page_table``, ``seqused_k``;
  the rows and pages no key of the problem uses hold finite filler (NaN with ``hostile_nan``).
* :func:`gather_kv` -- the keys a paged / seqused_k call reads, in the problem's packed
  layout (``fa4verify.oracles.paged_kv.contiguous_kv``); ``wrong_permutation`` plants a fault (the
  page table applied through the wrong permutation) for the fuzz's own mutation test.
* :func:`to_problem_fwd` / :func:`to_problem_grads` -- outputs of such a call in the problem's
  varlen layout (rows past ``seqused_k`` dropped).

Exact: pure indexing; the filler is generated from the problem's value seed.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np

__all__ = ["kv_call_arrays", "gather_kv", "to_problem_fwd", "to_problem_grads", "FILLER_SCALE"]

#: filler rows are standard normal times this, rounded to the dtype: finite and large enough that
#: a kernel reading a row it must not (a key past seqused_k) changes O visibly
FILLER_SCALE = 4.0


def _filler(problem, shape: tuple[int, ...], salt: int) -> np.ndarray:
    from fa4verify.problem import round_to_dtype
    rng = np.random.default_rng([problem.values.seed, salt, 0xF111])
    return np.asarray(round_to_dtype(rng.standard_normal(shape) * FILLER_SCALE, problem.dtype), np.float32)


def kv_call_arrays(problem, a: Mapping[str, Any]) -> dict[str, Any]:
    """``{"q", "k", "v", "dout", "seqused_k", "page_table", "cu_seqlens_q", "max_seqlen_q"}`` of a
    seqused_k / paged call form (float32 holding exact dtype values; int32 index arrays)."""
    call = problem.call
    b, cap = problem.batch, call.kv_capacity
    hk, d, dv = problem.nheads_kv, problem.head_dim, problem.head_dim_v
    used = np.asarray(problem.seqlens_k, np.int32)
    ck = np.concatenate([[0], np.cumsum(used)]).astype(np.int64)
    kb = _filler(problem, (b, cap, hk, d), 1)
    vb = _filler(problem, (b, cap, hk, dv), 2)
    k = np.asarray(a["k"], np.float32)
    v = np.asarray(a["v"], np.float32)
    for i in range(b):
        kb[i, : used[i]] = k[ck[i]: ck[i + 1]]
        vb[i, : used[i]] = v[ck[i]: ck[i + 1]]
    out: dict[str, Any] = {"seqused_k": used, "page_table": None}
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
    else:
        out.update(k=kb, v=vb)
    q = np.asarray(a["q"], np.float32)
    do = None if a.get("dout") is None else np.asarray(a["dout"], np.float32)
    if call.q_batched:
        sq = problem.seqlen_q
        out.update(q=q.reshape(b, sq, *q.shape[1:]), dout=None if do is None else do.reshape(b, sq, *do.shape[1:]),
                   cu_seqlens_q=None, max_seqlen_q=None)
    else:
        out.update(q=q, dout=do, cu_seqlens_q=np.asarray(a["cu_seqlens_q"], np.int32),
                   max_seqlen_q=problem.seqlen_q)
    return out


def gather_kv(problem, c: Mapping[str, Any], *, wrong_permutation: bool = False
              ) -> tuple[np.ndarray, np.ndarray]:
    """The packed (total_k, hk, d) K and V that the call ``c`` (:func:`kv_call_arrays`) reads.
    ``wrong_permutation``: a planted fault (the table's rows read through its reversed page
    order), which only a non-identity page order with two or more pages per sequence exposes."""
    used = c["seqused_k"]
    if c["page_table"] is None:
        ks = [c["k"][i, : used[i]] for i in range(len(used))]
        vs = [c["v"][i, : used[i]] for i in range(len(used))]
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


def to_problem_fwd(problem, out: np.ndarray, lse: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """O and LSE of the call in the problem's varlen layout ((total_q, h, dv), (h, total_q))."""
    out = np.asarray(out, np.float64)
    lse = np.asarray(lse, np.float64)
    if problem.call.q_batched:
        b, sq, h = problem.batch, problem.seqlen_q, problem.nheads
        return out.reshape(b * sq, h, -1), lse.transpose(1, 0, 2).reshape(h, b * sq)
    return out, lse


def to_problem_grads(problem, dq: np.ndarray, dk: np.ndarray, dv: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dQ, dK, dV of a (non-paged) seqused_k call in the problem's varlen layout: dK/dV rows
    past ``seqused_k`` are not part of the problem and are dropped."""
    dq = np.asarray(dq, np.float64)
    if problem.call.q_batched:
        dq = dq.reshape((-1,) + dq.shape[2:])
    used = problem.seqlens_k
    dk = np.concatenate([np.asarray(dk, np.float64)[i, :n] for i, n in enumerate(used)]) if used else dk
    dv = np.concatenate([np.asarray(dv, np.float64)[i, :n] for i, n in enumerate(used)]) if used else dv
    return dq, dk, dv


def keep_call_extra(problem) -> Optional[dict[str, Any]]:
    """``{"block_mask", "block_size"}`` or ``{"mask_mod_fn"}`` of a keep-pattern call form."""
    call = problem.call
    if call is None or not call.keep_pattern:
        return None
    if call.block_size is not None:
        return {"block_mask": call.block_mask(problem.seqlen_q, problem.seqlen_k), "block_size": call.block_size}
    return {"mask_mod_fn": call.mask_mod_fn}
