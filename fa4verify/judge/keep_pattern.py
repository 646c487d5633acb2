"""The oracle of a dense problem under a keep-pattern its call form adds (block sparsity, a CuTe
``mask_mod``; Note [Call forms keep the problem's meaning] in ``fa4verify.problem.calls``).

The certified oracle has no keep-mask argument; a keep-pattern is rewritten exactly as a varlen
batch (``fa4verify.oracles.block_sparse``): one sequence per (sequence, query block) holding
the keys that block keeps (blocks of the call's block size; a mask_mod pattern: the coarsest
square block grid it is constant on, down to 1 x 1, one sequence per query row). A sequence is a
batch entry of a dense problem, or a sequence of a varlen one (its own block grid). The varlen
oracle's results are mapped back to the problem's layout: O, LSE and dQ row for row; dK and dV are the *sums* of the copies of a key over the
sequences that see it (their bounds add, plus the float64 rounding of that sum); the learnable
sink's gradient sums over sequences.

Indices are into the problem's *token view*: ``(batch, row)`` of a dense problem's arrays, and
``(0, token)`` of a varlen problem's packed arrays read as one batch entry (:func:`view`).

Accuracy: exactly the oracle's (the rewrite is pure indexing), with dK/dV/dsink bounds widened by
``n * 2^-52 * sum |partials|`` for their float64 sums.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

__all__ = ["rewrite", "oracle_forward", "oracle_backward", "view"]

_EPS = 2.0 ** -52


def view(problem, x):
    """``x`` (a problem array with a token axis) in the token view: a varlen problem's packed
    ``(total, ...)`` as ``(1, total, ...)``; a dense problem's as it is."""
    x = np.asarray(x)
    return x[None] if problem.varlen else x


def _unview(problem, x):
    return x[0] if problem.varlen else x


def _blocks(problem, seq: int, lq: int, lk: int, keeps: list, head: int = 0,
            lists: bool = False) -> tuple[np.ndarray, tuple[int, int]]:
    """The block grid of sequence ``seq`` (lengths ``lq``, ``lk``) and its block size (query head
    ``head``'s with a block mask per head); ``keeps``: a one-element cache of the problem's
    keep-masks (computed at the first sequence needing them); ``lists``: the call's block lists
    even under a causal or window rule (:func:`rewrite`)."""
    call = problem.call
    if call.block_size is not None and not call.block_partial and (lists or not problem.masked_lists):
        return call.block_mask(lq, lk, seq=call.grid_seq(problem, seq), head=head), tuple(call.block_size)
    # block lists under a causal or window rule (Note [Block lists with causal or a window]): the
    # rule cuts blocks, so the grid of the whole keep-mask (on the diagonal, row by row)
    if not keeps:
        keeps.append(problem.keep_masks(head=head))
    keep = keeps[0][seq]
    sq, sk = keep.shape
    for blk in (128, 64, 32, 16, 8, 4, 2):   # the coarsest block grid the pattern is constant on
        pad = np.zeros((-(-sq // blk) * blk, -(-sk // blk) * blk), bool)
        pad[:sq, :sk] = keep
        tiles = pad.reshape(pad.shape[0] // blk, blk, pad.shape[1] // blk, blk)
        bm = tiles[:, 0, :, 0]
        if np.array_equal(np.kron(bm, np.ones((blk, blk), bool))[:sq, :sk], keep):
            return bm, (blk, blk)
    return keep, (1, 1)


def rewrite(problem, head: int = 0, *, lists: bool = False, walk: str = "index",
            cut_blocks_full: bool = False) -> dict[str, Any]:
    """Index maps of the varlen rewrite into the token view (:func:`view`): ``q_index`` (total_q,
    2) = (batch, row) and ``k_index`` (total_k, 2) = (batch, key) of each packed token;
    ``seqlens_q/k``; ``seq``: the problem's sequence (batch entry) of each rewritten sequence.
    ``head``: the query head whose keep-pattern is rewritten (one serves every head unless the
    problem's masks differ by head: ``heads_differ``).

    ``lists``: block lists under a causal or window rule keep the call's own block grid -- a
    rewritten sequence per query block holding its listed blocks, as FA4 walks them -- and
    ``keep`` holds each sequence's keep-mask ``(lq, lk)`` (the rule at the problem's own indices),
    which the CPU twin applies inside each tile (its ``keep`` argument); without ``lists`` the
    rule's cuts give the finest grid the keep-mask is constant on (the oracle, which has no
    keep-mask argument). ``keep`` is None where the rewrite needs none.

    ``walk``: the order of a rewritten sequence's blocks: ``"index"`` (ascending), or
    ``"sm100_forward"``: where FA4's SM 10.x forward gets the rule-cut blocks as mask blocks
    (:attr:`AttentionProblem.rule_blocks_in_mask_lists`), the full blocks, then the mask blocks,
    each ascending: the twin walks a sequence's tiles from the last down, as FA4 walks the mask list,
    then the full list (Note [Rule-cut blocks in the mask lists] in ``fa4verify.problem.calls``);
    ``keep`` then masks as that kernel does: the rule inside the mask blocks and the first full block
    it walks, no mask in the other full blocks. ``cut_blocks_full``: every listed block full, as
    fa4verify passed the lists before (the twin's planted fault ``rule_cut_blocks_listed_full``),
    walked and masked the same way."""
    if walk not in ("index", "sm100_forward"):
        raise ValueError(f"walk={walk!r}: expected 'index' or 'sm100_forward'")
    split = lists and walk == "sm100_forward" and problem.rule_blocks_in_mask_lists
    qi, ki, lq, lk, seq = [], [], [], [], []
    inner = [] if lists and problem.masked_lists else None
    keeps = [problem.keep_masks(head=head)] if inner is not None else []
    for s, (q0, sq, k0, sk) in enumerate(problem._seq_bounds()):
        b = 0 if problem.varlen else s
        bm, (bq, bk) = _blocks(problem, s, sq, sk, keeps, head, lists=lists)
        mask_blocks = np.zeros_like(bm)
        if split and not cut_blocks_full:
            mask_blocks = problem.rule_mask_blocks(bm, sq, sk)
        for r in range(bm.shape[0]):
            rows = q0 + np.arange(r * bq, min((r + 1) * bq, sq))
            full_cols = np.flatnonzero(bm[r] & ~mask_blocks[r])
            cols = np.concatenate([full_cols, np.flatnonzero(mask_blocks[r])])
            keys = k0 + np.concatenate([np.arange(c * bk, min((c + 1) * bk, sk)) for c in cols]
                                       or [np.zeros(0, np.int64)])
            if inner is not None:
                kr = keeps[0][s][np.ix_(rows - q0, keys - k0)]
                if split and len(full_cols) > 1:
                    # FA4's SM 10.x forward masks the first full block it walks (the highest) only
                    n_unmasked = sum(min(bk, sk - c * bk) for c in full_cols[:-1])
                    kr = kr.copy()
                    kr[:, :n_unmasked] = True
                inner.append(kr)
            qi.append(np.stack([np.full(len(rows), b), rows], axis=1).reshape(-1, 2))
            ki.append(np.stack([np.full(len(keys), b), keys], axis=1).reshape(-1, 2))
            lq.append(len(rows))
            lk.append(len(keys))
            seq.append(s)
    if not qi:
        z = np.zeros((0, 2), np.int64)
        return {"q_index": z, "k_index": z, "seqlens_q": (), "seqlens_k": (), "seq": (), "keep": None}
    return {"q_index": np.concatenate(qi).astype(np.int64), "k_index": np.concatenate(ki).astype(np.int64),
            "seqlens_q": tuple(lq), "seqlens_k": tuple(lk), "seq": tuple(seq), "keep": inner}


def _packed(problem, a: Mapping[str, Any], rw: Mapping[str, Any]):
    from fa4verify.judge.attention import as_input_dtype, effective_inputs
    a = effective_inputs(problem, a)       # Note [FP8 descales]: the descaled values, exact in float64
    cast = ((lambda x: np.asarray(x, np.float64)) if a.get("descaled")
            else (lambda x: as_input_dtype(x, problem.dtype)))
    qb, qr = rw["q_index"].T
    kb, kr = rw["k_index"].T
    cq = np.concatenate([[0], np.cumsum(rw["seqlens_q"])]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(rw["seqlens_k"])]).astype(np.int32)
    q = cast(view(problem, a["q"])[qb, qr])
    k = cast(view(problem, a["k"])[kb, kr])
    v = cast(view(problem, a["v"])[kb, kr])
    kw = {"softmax_scale": problem.softmax_scale, "softcap": float(problem.softcap),
          "learnable_sink": a.get("learnable_sink") if problem.sink else None,
          "cu_seqlens_q": cq, "cu_seqlens_k": ck}
    return q, k, v, kw


def _tokens(problem) -> tuple[int, int, int]:
    """(batch, query tokens, key tokens) of the token view."""
    if problem.varlen:
        return 1, sum(problem.seqlens_q), sum(problem.seqlens_k)
    return problem.batch, problem.seqlen_q, problem.seqlen_k


def _dense_rows(problem, x_packed: np.ndarray, rw, fill: float) -> np.ndarray:
    """Rows of the rewrite's packed result in the problem's layout (dense, or varlen packed)."""
    qb, qr = rw["q_index"].T
    nb, tq, _ = _tokens(problem)
    out = np.full((nb, tq) + x_packed.shape[1:], fill)
    out[qb, qr] = x_packed
    return _unview(problem, out)


def _dense_lse(problem, x_packed: np.ndarray, rw, fill: float) -> np.ndarray:
    """LSE-like (heads, tokens) results in FA4's layout: (batch, heads, seqlen_q) dense,
    (heads, total_q) varlen."""
    qb, qr = rw["q_index"].T
    nb, tq, _ = _tokens(problem)
    out = np.full((nb, problem.nheads, tq), fill)
    out[qb, :, qr] = x_packed.T
    return _unview(problem, out)


def oracle_forward(problem, a: Mapping[str, Any]):
    """The oracle forward of ``problem`` (dense, with a keep-pattern) in the dense layout."""
    from fa4verify.oracles import attention as orc
    rw = rewrite(problem)
    q, k, v, kw = _packed(problem, a, rw)
    f = orc.forward(q, k, v, **kw)
    return dataclasses.replace(
        f, out=_dense_rows(problem, np.asarray(f.out, np.float64), rw, 0.0),
        bound=_dense_rows(problem, np.asarray(f.bound, np.float64), rw, 0.0),
        lse=_dense_lse(problem, np.asarray(f.lse, np.float64), rw, -np.inf),
        lse_bound=_dense_lse(problem, np.asarray(f.lse_bound, np.float64), rw, 0.0))


def _sum_keys(problem, x: np.ndarray, bound: np.ndarray, rw) -> tuple[np.ndarray, np.ndarray]:
    kb, kr = rw["k_index"].T
    nb, _, tk = _tokens(problem)
    shape = (nb, tk) + x.shape[1:]
    s = np.zeros(shape)
    sa = np.zeros(shape)
    sb = np.zeros(shape)
    n = np.zeros(shape[:2])
    np.add.at(s, (kb, kr), x)
    np.add.at(sa, (kb, kr), np.abs(x))
    np.add.at(sb, (kb, kr), bound)
    np.add.at(n, (kb, kr), 1.0)
    return _unview(problem, s), _unview(problem, sb + n.reshape(n.shape + (1,) * (x.ndim - 1)) * _EPS * sa)


def oracle_backward(problem, a: Mapping[str, Any], dlse: Any = None):
    """The exact gradient of ``problem`` (dense, with a keep-pattern) in the dense layouts;
    ``dlse``: a gradient through the returned LSE, in FA4's LSE layout (each packed row reads its
    own row's)."""
    from fa4verify.judge.attention import as_input_dtype
    from fa4verify.oracles import attention as orc
    rw = rewrite(problem)
    q, k, v, kw = _packed(problem, a, rw)
    qb, qr = rw["q_index"].T
    do = as_input_dtype(view(problem, a["dout"])[qb, qr], problem.dtype)
    if dlse is not None:
        dl = np.asarray(dlse, np.float64)
        kw["dlse"] = (dl[None] if problem.varlen else dl)[qb, :, qr].T      # (heads, packed rows)
    g = orc.backward(q, k, v, None, do, **kw)
    dk, dkb = _sum_keys(problem, np.asarray(g.dk, np.float64), np.asarray(g.dk_bound, np.float64), rw)
    dv, dvb = _sum_keys(problem, np.asarray(g.dv, np.float64), np.asarray(g.dv_bound, np.float64), rw)
    fwd = None
    if g.forward is not None:
        f = g.forward
        fwd = dataclasses.replace(
            f, out=_dense_rows(problem, np.asarray(f.out, np.float64), rw, 0.0),
            bound=_dense_rows(problem, np.asarray(f.bound, np.float64), rw, 0.0),
            lse=_dense_lse(problem, np.asarray(f.lse, np.float64), rw, -np.inf),
            lse_bound=_dense_lse(problem, np.asarray(f.lse_bound, np.float64), rw, 0.0))
    return dataclasses.replace(
        g, dq=_dense_rows(problem, np.asarray(g.dq, np.float64), rw, 0.0),
        dq_bound=_dense_rows(problem, np.asarray(g.dq_bound, np.float64), rw, 0.0),
        dk=dk, dk_bound=dkb, dv=dv, dv_bound=dvb,
        d=_dense_lse(problem, np.asarray(g.d, np.float64), rw, 0.0),
        d_bound=_dense_lse(problem, np.asarray(g.d_bound, np.float64), rw, 0.0),
        out=_dense_rows(problem, np.asarray(g.out, np.float64), rw, 0.0),
        lse=_dense_lse(problem, np.asarray(g.lse, np.float64), rw, -np.inf), forward=fwd)
