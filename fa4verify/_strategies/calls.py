"""Strategies for the call forms of a problem (:class:`~fa4verify.problem.calls.CallForm`, Note
[Call forms keep the problem's meaning]): paged KV, ``seqused_k``, block sparsity, a CuTe
``mask_mod``.
"""
from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import DrawFn

from fa4verify.kernels.facts import fwd_tile
from fa4verify.problem.calls import CALL_FEATURES, CallForm, mask_mod_pairs
from fa4verify.problem.masks import resolve_window

#: page sizes drawn by default: 16 (FA4's cp.async path) and the forward tile_n (its TMA path:
#: ``interface.py`` ``paged_kv_tma = page_size == tile_n``), the two measured on the H200
DEFAULT_PAGE_SIZES: tuple[int, ...] = (16, -1)     # -1 = the head dim's tile_n


def _used_lengths(draw: DrawFn, batch: int, cap: int, lo: int = 0) -> tuple[int, ...]:
    """Per-sequence seqused_k in [lo, cap]: biased to 0 (an empty sequence), cap and a page edge."""
    lo = min(lo, cap)
    edge = st.sampled_from(sorted({max(x, lo) for x in (0, cap, max(cap - 1, 0), min(1, cap))}))
    return tuple(draw(st.one_of(edge, st.integers(lo, cap))) for _ in range(batch))


@st.composite
def kv_call_forms(draw: DrawFn, problem: Any, *, paged: bool, page_sizes: tuple[int, ...] = DEFAULT_PAGE_SIZES,
                  hostile_nan: bool = False, min_used: int = 0) -> Any:
    """A problem with a ``seqused_k`` (``paged=False``) or paged-KV call form, derived from
    ``problem``: a dense problem becomes varlen with ``seqlens_q = (seqlen_q,) * batch`` (batched q)
    and drawn ``seqused_k`` (at least ``min_used``: a deployment's shortest context); a varlen
    problem keeps its lengths (packed q). ``page_sizes``: -1 means the head dim's tile_n (FA4's
    TMA path). Shrinks toward identity page order, no spare pages."""
    if problem.mask_mod is not None:
        return problem                      # a boolean mask_mod pattern is dense-only
    if problem.varlen:
        sq_list, sk_list = problem.seqlens_q, problem.seqlens_k
        cap = max(sk_list) + draw(st.sampled_from((0, 0, 1, 7)))
        q_batched = False
    else:
        cap = problem.seqlen_k
        sq_list = (problem.seqlen_q,) * problem.batch
        sk_list = _used_lengths(draw, problem.batch, cap, min_used)
        q_batched = True
    base = problem.replace(seqlens_q=tuple(sq_list), seqlens_k=tuple(sk_list), seqlen_q=max(sq_list),
                           seqlen_k=max(sk_list), call=None)
    cap = max(cap, 1)
    if not paged:
        return base.replace(call=CallForm(seqused_k=True, q_batched=q_batched, kv_capacity=cap))
    causal, local, _, _ = resolve_window(problem.causal, problem.window_size)
    tn = fwd_tile(problem.arch, problem.dtype, problem.head_dim, problem.head_dim_v, causal, local)[1]
    sizes = sorted({tn if p == -1 else int(p) for p in page_sizes})
    P = draw(st.sampled_from(sizes))
    perm = draw(st.one_of(st.none(), st.integers(0, 2 ** 16)))
    spare = draw(st.sampled_from((0, 0, 1, 3)))
    cap = -(-cap // P) * P
    return base.replace(call=CallForm(seqused_k=True, q_batched=q_batched, kv_capacity=cap, page_size=P,
                                      page_seed=perm, spare_pages=spare, hostile_nan=bool(hostile_nan)))


@st.composite
def q_call_forms(draw: DrawFn, problem: Any, *, min_used: int = 0) -> Any:
    """A problem with a ``seqused_q`` call form (Note [Call forms keep the problem's meaning]),
    derived from ``problem``: a dense problem becomes varlen with drawn ``seqused_q`` (at least
    ``min_used``) and K/V batched whole; a varlen problem keeps its lengths, and its K/V come
    through ``seqused_k`` unless every sequence has the same keys. Shrinks toward no extra
    capacity."""
    if problem.mask_mod is not None:
        return problem                      # a boolean mask_mod pattern is dense-only
    if problem.varlen:
        sq_list, sk_list = problem.seqlens_q, problem.seqlens_k
        cap = max(max(sq_list), 1) + draw(st.sampled_from((0, 0, 1, 7)))
        kv_used = len(set(sk_list)) > 1 or max(sk_list) == 0
    else:
        if problem.seqlen_k == 0:
            return problem
        cap = max(problem.seqlen_q, 1)
        sq_list = _used_lengths(draw, problem.batch, cap, min_used)
        sk_list = (problem.seqlen_k,) * problem.batch
        kv_used = False
    base = problem.replace(seqlens_q=tuple(sq_list), seqlens_k=tuple(sk_list), seqlen_q=max(sq_list),
                           seqlen_k=max(sk_list), call=None)
    return base.replace(call=CallForm(seqused_q=True, q_capacity=cap, seqused_k=kv_used,
                                      kv_capacity=max(max(sk_list), 1) if kv_used else 0))


def with_pack_gqa(problem: Any, pack_gqa: Any) -> Any:
    """``problem`` whose call passes FA4 ``pack_gqa`` (None: FA4 chooses), a mod pair's too."""
    if pack_gqa is None:
        return problem
    import dataclasses
    call = problem.call if problem.call is not None else CallForm()
    return problem.replace(call=dataclasses.replace(call, pack_gqa=bool(pack_gqa)))


@st.composite
def keep_call_forms(draw: DrawFn, problem: Any, *, block_sparse: bool, mask_mod_fn: bool) -> Any:
    """A non-causal problem with a block-sparse or mask_mod call form (causal/window are
    dropped; a boolean-mask_mod problem is returned unchanged). SM90 block sizes: q block 64 or 128 (a
    multiple of tile_m, or 64 with tile_m 64), kv block 64 or tile_n (FA4 shrinks tile_n to a
    smaller multiple of 16; a larger one must equal tile_n); SM100: the plan's block
    (:func:`fa4verify.coverage.cases.sparse_block_size`). A varlen problem gets FA4's varlen block
    sparsity (forward only; its Q block is the forward's ``q_stage * tile_m``:
    :func:`fa4verify.coverage.cases.varlen_sparse_block_size`), never a mask_mod."""
    if problem.mask_mod is not None:
        return problem
    if problem.varlen:
        from fa4verify.kernels import facts
        if not block_sparse or not facts.varlen_block_sparsity():
            return problem
        from fa4verify.coverage.cases import varlen_sparse_block_size
        problem = problem.replace(causal=False, window_size=(None, None))
        block = varlen_sparse_block_size(problem.arch, problem.head_dim, problem.head_dim_v, problem.seqlen_q,
                                         problem.nheads // problem.nheads_kv, problem.dtype)
        return problem.replace(call=CallForm(block_size=block, block_seed=draw(st.integers(0, 2 ** 16)),
                                             block_keep=draw(st.sampled_from((0.5, 0.75, 0.25, 1.0)))))
    if problem.causal or problem.window_size != (None, None):
        # the family was drawn: FA4 takes causal/local masking here only inside a mask_mod
        problem = problem.replace(causal=False, window_size=(None, None))
    kinds = ([("block", None)] if block_sparse else []) + (
        [("mm", n) for n in sorted(mask_mod_pairs())] if mask_mod_fn else [])
    if not kinds:
        return problem
    kind, name = draw(st.sampled_from(kinds))
    if kind == "mm":
        return problem.replace(call=CallForm(mask_mod_fn=name))
    tn = fwd_tile(problem.arch, problem.dtype, problem.head_dim, problem.head_dim_v, False, False)[1]
    if problem.arch == "sm90":
        bq = draw(st.sampled_from((128, 64)))
        bk = draw(st.sampled_from(sorted({min(64, tn), tn})))
    else:           # SM100: Q blocks of q_stage * tile_m
        from fa4verify.coverage.cases import sparse_block_size
        bq, bk = sparse_block_size(problem.arch, problem.head_dim, problem.head_dim_v)
    return problem.replace(call=CallForm(block_size=(bq, bk), block_seed=draw(st.integers(0, 2 ** 16)),
                                         block_keep=draw(st.sampled_from((0.5, 0.75, 0.25, 1.0)))))


def check_call_features(features: Any) -> None:
    bad = set(features) - set(CALL_FEATURES)
    if bad:
        raise InvalidArgument(f"unknown call feature(s) {sorted(bad)} (known: {CALL_FEATURES})")
