"""Paged KV semantics: a page table is only an indexing of K/V, so the oracle of a paged call is
the oracle of the contiguous K/V it indexes.

FA4 (``flash_attn_varlen_func(..., page_table=, seqused_k=)``, flash-attn-4 4.0.0b36,
``interface.py`` docstring of ``flash_attn_varlen_func`` and ``paged_kv.py``): ``k``/``v`` hold
pages ``(num_pages, page_size, nheads_kv, d)``; ``page_table`` (int32, ``(batch,
max_pages_per_seq)``) lists the pages of each sequence in order; ``seqused_k[b]`` (int32) is the
number of keys sequence ``b`` uses (default: ``max_pages_per_seq * page_size``). Key ``j`` of
sequence ``b`` (``0 <= j < seqused_k[b]``) is::

    k_b[j] = k[page_table[b, j // page_size], j % page_size]

Entries of ``page_table`` past a sequence's last used page, rows past ``seqused_k[b]`` in its last
page and pages no sequence uses never enter the result (exact semantics). FA4 itself requires the
rows past ``seqused_k`` in a *used* page to be finite when pages load by TMA (P = 0 times a NaN V
row is NaN; its docstring), so :func:`paginate` fills them with finite filler.

:func:`contiguous_kv` is the gather (the semantics); :func:`paginate` builds a paged layout of given
contiguous K/V under a page permutation (the inverse, for tests and GPU drivers). Both are exact
(pure indexing, no arithmetic).

Accuracy
--------
Exact: values are copied, never computed.

Possible issues
---------------
Page indices are not bounds-checked by FA4 on the device; :func:`contiguous_kv` raises on an
index outside ``[0, num_pages)`` for a used page instead of reading garbage.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

__all__ = ["contiguous_kv", "paginate", "token_index"]


def token_index(page_table: np.ndarray, page_size: int, b: int, j: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(page, slot) of keys ``j`` of sequence ``b``."""
    j = np.asarray(j, np.int64)
    return np.asarray(page_table, np.int64)[b, j // page_size], j % page_size


def contiguous_kv(k_pages: np.ndarray, v_pages: np.ndarray, page_table: np.ndarray,
                  seqused_k: Optional[np.ndarray] = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per sequence ``b``, the contiguous ``(k_b, v_b)`` of shape ``(seqused_k[b], nheads_kv, d)``
    that a paged call reads. Raises ValueError on a page index out of range or a ``seqused_k``
    larger than the table covers."""
    k_pages = np.asarray(k_pages)
    v_pages = np.asarray(v_pages)
    pt = np.asarray(page_table)
    if pt.ndim != 2:
        raise ValueError(f"page_table must be (batch, max_pages_per_seq), got shape {pt.shape}")
    num_pages, page_size = k_pages.shape[:2]
    if v_pages.shape[:2] != (num_pages, page_size):
        raise ValueError(f"k pages {k_pages.shape[:2]} and v pages {v_pages.shape[:2]} differ")
    batch, max_pages = pt.shape
    used = (np.full(batch, max_pages * page_size, np.int64) if seqused_k is None
            else np.asarray(seqused_k, np.int64))
    if used.shape != (batch,):
        raise ValueError(f"seqused_k must be (batch,) = ({batch},), got {used.shape}")
    out = []
    for b in range(batch):
        n = int(used[b])
        if n < 0 or n > max_pages * page_size:
            raise ValueError(f"seqused_k[{b}] = {n} outside [0, {max_pages * page_size}]")
        page, slot = token_index(pt, page_size, b, np.arange(n))
        if n and (page.min() < 0 or page.max() >= num_pages):
            raise ValueError(f"page_table[{b}] indexes a page outside [0, {num_pages})")
        out.append((k_pages[page, slot], v_pages[page, slot]))
    return out


def paginate(k: np.ndarray, v: np.ndarray, page_size: int, *, seqused_k: Optional[np.ndarray] = None,
             rng: Optional[np.random.Generator] = None, spare_pages: int = 0,
             filler: float = 0.0, unused_fill: float = float("nan")) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A paged layout ``(k_pages, v_pages, page_table)`` of batched ``k``/``v`` ``(batch,
    seqlen_k, nheads_kv, d)`` whose :func:`contiguous_kv` is ``k[b, :seqused_k[b]]``.

    Sequence ``b`` gets ``ceil(seqlen_k / page_size)`` table entries; its used pages are drawn
    from a random permutation of all pages (``rng``; ``None``: identity order, pages in sequence
    order). ``spare_pages`` extra pages are never referenced. Rows past ``seqused_k[b]`` of a used
    page get ``filler`` (finite: FA4's TMA path loads them); pages no sequence uses, and table
    entries past a sequence's last used page, point at / hold ``unused_fill`` (NaN by default:
    FA4 must not read them). The dtype of ``k``/``v`` is kept.
    """
    k = np.asarray(k)
    v = np.asarray(v)
    batch, seqlen_k = k.shape[:2]
    per_seq = -(-seqlen_k // page_size)
    used = (np.full(batch, seqlen_k, np.int64) if seqused_k is None else np.asarray(seqused_k, np.int64))
    if used.shape != (batch,) or used.min(initial=0) < 0 or used.max(initial=0) > seqlen_k:
        raise ValueError(f"seqused_k must be (batch,) within [0, {seqlen_k}]")
    num_pages = batch * per_seq + int(spare_pages)
    order = np.arange(num_pages) if rng is None else rng.permutation(num_pages)
    k_pages = np.full((num_pages, page_size) + k.shape[2:], unused_fill, dtype=k.dtype)
    v_pages = np.full((num_pages, page_size) + v.shape[2:], unused_fill, dtype=v.dtype)
    table = np.zeros((batch, per_seq), np.int32)
    for b in range(batch):
        n = int(used[b])
        for p in range(per_seq):
            page = int(order[b * per_seq + p])
            table[b, p] = page
            lo = p * page_size
            if lo >= n:
                continue          # an unused table entry: its page stays unused_fill
            hi = min(lo + page_size, n)
            k_pages[page, : hi - lo] = k[b, lo:hi]
            v_pages[page, : hi - lo] = v[b, lo:hi]
            k_pages[page, hi - lo:] = filler
            v_pages[page, hi - lo:] = filler
    return k_pages, v_pages, table
