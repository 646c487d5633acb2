"""Mask-edge values: the ``"edges"`` value distribution and its self-check.

Note [Edge values]
------------------
A one-key error at a mask edge (the causal diagonal, a window side, the seqlen_k tail, a varlen
sequence boundary, a block-sparse block edge, a mask_mod transition, a page boundary) changes O
only by that key's share of the row. With random values that share is 1/(keys seen), which a
long row hides and a seed may never draw at the edge that is wrong. The ``"edges"``
distribution plants the error where it shows, by construction:

* target rows: per sequence, the query rows at tile boundaries (0, tile_m - 1, tile_m,
  tile_m + 1, the middle, the last row), at most ``head_dim`` rows in all;
* target keys of a row: the two keys on each side of every keep / drop transition of the row's
  keep-mask (one just inside, one just outside), the last key of the row's sequence (and, in a
  packed varlen batch, the neighbouring sequences' nearest keys, which lie just outside in
  memory), and the two keys on each side of a page boundary (paged KV), at most 8 per row;
* each target row r gets its own direction ``u_r`` (orthonormal columns): ``q_r += A u_r`` and
  every target key of r gets ``k += A u_r``, with ``A^2 * scale = score`` (default 6 nats), so
  each target key scores about ``score`` nats above the row's other keys. A kernel that drops a
  kept target key or keeps a dropped one moves O_r by a large fraction of |V|.

The self-check (:func:`edge_sensitivity`): for every target key, the reference row with that one
key's keep bit flipped (the edge shifted by one key, computed in float64 here) must differ from
the kernel's O row by more than the judge's allowance on at least one element. A target key whose
flip the allowance hides is reported as a blind edge, so a boundary property never claims a
one-key error it could not have seen.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["EDGE_SCORE", "edge_targets", "plant_edges", "edge_sensitivity"]

#: target keys score this many nats above the row's others (ValueSpec param ``score``)
EDGE_SCORE = 6.0
_MAX_KEYS = 8


def edge_targets(problem: Any) -> list[dict[str, Any]]:
    """The target rows and keys of ``problem`` (Note [Edge values]): a list of
    ``{"b", "i", "keys": [(j, kept)]}`` with ``i`` the row and ``j`` the key index within batch entry
    ``b``'s sequence (``j = -1`` / ``j = len_k`` name the neighbouring sequences' keys in a packed
    varlen batch)."""
    from fa4verify.kernels.facts import fwd_tile
    tm, tn = fwd_tile(problem.arch, problem.dtype, problem.head_dim, problem.head_dim_v, problem.causal,
                      problem.local)
    keeps = problem.keep_masks()
    bounds = problem._seq_bounds()
    page = problem.call.page_size if problem.call is not None and problem.call.paged else None
    out: list[dict[str, Any]] = []
    budget = int(problem.head_dim)
    for b, ((_, lq, k0, lk), keep) in enumerate(zip(bounds, keeps)):
        if lq == 0:
            continue
        rows = []
        for i in (0, tm - 1, tm, tm + 1, lq // 2, lq - 1, 1):
            if 0 <= i < lq and i not in rows:
                rows.append(i)
        for i in rows:
            if len(out) >= budget:
                return out
            keys: list[tuple[int, bool]] = []

            def add(j: int) -> None:
                if len(keys) >= _MAX_KEYS or any(j == x for x, _ in keys):
                    return
                inside = 0 <= j < lk and bool(keep[i, j])
                keys.append((j, inside))

            row = np.asarray(keep[i, :lk], bool) if lk else np.zeros(0, bool)
            trans = np.flatnonzero(row[1:] != row[:-1]) if lk > 1 else np.zeros(0, int)
            for t in trans:
                add(int(t))
                add(int(t) + 1)
            if lk:
                add(lk - 1)
                for j in (0, lk - 1):      # a diagonal / window edge on row 0 or the last row
                    if row[j]:
                        add(j)
            if problem.varlen:
                if k0 > 0:
                    add(-1)
                if k0 + lk < sum(problem.seqlens_k):
                    add(lk)
            if page:
                for edge in range(page, lk, page):
                    add(edge - 1)
                    add(edge)
            if keys:
                out.append({"b": b, "i": i, "keys": keys})
    return out


def _k_token(problem: Any, b: int, j: int) -> tuple:
    """Index of key j of batch entry b along k's leading axes (dense (b, j), varlen (token,))."""
    if problem.varlen:
        k0 = problem._seq_bounds()[b][2]
        return (k0 + j,)
    return (b, j)


def _q_token(problem: Any, b: int, i: int) -> tuple:
    if problem.varlen:
        return (problem._seq_bounds()[b][0] + i,)
    return (b, i)


def plant_edges(problem: Any, arrays: dict, *, score: float = EDGE_SCORE, seed: int = 0) -> dict:
    """``arrays`` (float64 q, k; problem layout) with the edge spikes added (Note [Edge values]);
    records the targets in ``arrays["edges"]``. The caller rounds to the dtype afterwards."""
    targets = edge_targets(problem)
    d = int(problem.head_dim)
    if not targets:
        arrays["edges"] = []
        return arrays
    rng = np.random.default_rng(seed ^ 0xED6E)
    basis, _ = np.linalg.qr(rng.standard_normal((d, len(targets))))
    amp = math.sqrt(score / problem.scale)
    q, k = arrays["q"], arrays["k"]
    # the target rows and keys lose their random part along the planted directions first: a key
    # shared by several target rows carries each one's direction, and a row's random part along
    # another row's direction moved that key's score by amp times a normal draw per direction (at
    # head dim 16, key 0 of a row scored 8 nats low: a blind edge)
    proj = basis @ basis.T
    for r, t in enumerate(targets):
        tok = _q_token(problem, t["b"], t["i"])
        q[tok] -= q[tok] @ proj
        for j, _ in t["keys"]:
            kt = _k_token(problem, t["b"], j)
            k[kt] -= k[kt] @ proj
    for r, t in enumerate(targets):
        u = amp * basis[:, r]
        q[_q_token(problem, t["b"], t["i"])] += u
        for j, _ in t["keys"]:
            k[_k_token(problem, t["b"], j)] += u
    arrays["edges"] = targets
    return arrays


def _row_reference(problem: Any, a: Mapping[str, Any], b: int, i: int, keep_row: np.ndarray, h: int,
                   extra: Sequence[int] = ()) -> np.ndarray:
    """float64 O of row (b, i), head h, over the keys ``keep_row`` marks in its sequence plus the
    packed neighbours' keys ``extra`` (j = -1 or len_k)."""
    g = problem.nheads // problem.nheads_kv
    q = np.asarray(a["q"], np.float64)[_q_token(problem, b, i) + (h,)]
    js = [int(j) for j in np.flatnonzero(keep_row)] + [int(j) for j in extra]
    if not js:
        return np.zeros(problem.head_dim_v)
    k = np.stack([np.asarray(a["k"], np.float64)[_k_token(problem, b, j) + (h // g,)] for j in js])
    v = np.stack([np.asarray(a["v"], np.float64)[_k_token(problem, b, j) + (h // g,)] for j in js])
    s = problem.scale * (k @ q)
    if problem.softcap:
        s = problem.softcap * np.tanh(s / problem.softcap)
    m = float(np.max(s))
    sink = None
    if problem.sink and a.get("learnable_sink") is not None:
        sink = float(np.asarray(a["learnable_sink"], np.float64)[h])
        m = max(m, sink)
    w = np.exp(s - m)
    den = float(w.sum()) + (math.exp(sink - m) if sink is not None else 0.0)
    return (w @ v) / den


def edge_sensitivity(problem: Any, a: Mapping[str, Any], out: np.ndarray, allowance: np.ndarray
                     ) -> dict[str, Any]:
    """The self-check of Note [Edge values]: for each target key, whether the kernel's O row
    (``out``, problem layout) differs from the reference with that key's keep bit flipped by more
    than ``allowance`` (same shape as ``out``). Returns ``{"edges": n, "seen": m, "blind": [..]}``;
    ``applicable`` False (with ``why``) where the float64 row model here does not describe the
    problem (score_mod pairs)."""
    targets = a.get("edges") or []
    if problem.mods:
        return {"applicable": False, "why": "score/mask mod pairs: the row model has no mod", "edges": 0,
                "seen": 0, "blind": []}
    heads = range(problem.nheads) if problem.heads_differ else (0,)     # Note [Masks by head]
    keeps_of = {h: problem.keep_masks(a, head=h) if problem.heads_differ else problem.keep_masks() for h in heads}
    from fa4verify.judge.attention import effective_inputs
    a = effective_inputs(problem, a)          # Note [FP8 descales]: the descaled inputs
    # float64 once: converting the whole of q / k / v per key and head cost 21 s of a 24 s row
    # on the H200 (a GQA-4 causal+window row with 42 reference rows)
    a = dict(a, **{n: np.asarray(a[n], np.float64) for n in ("q", "k", "v") if n in a})
    out = np.asarray(out, np.float64)
    allowance = np.asarray(allowance, np.float64)
    n = seen = 0
    blind: list[str] = []
    for t in targets:
        b, i = t["b"], t["i"]
        oi = out[_q_token(problem, b, i)]           # (h, dv)
        al = allowance[_q_token(problem, b, i)]
        for j, inside in t["keys"]:
            n += 1
            hit = False
            for h in range(problem.nheads):
                row = np.asarray(keeps_of[h if problem.heads_differ else 0][b][i], bool)
                flipped = row.copy()
                extra: list[int] = []
                if 0 <= j < row.size:
                    flipped[j] = not flipped[j]
                else:
                    extra = [j]                      # a neighbour's key read by mistake
                ref = _row_reference(problem, a, b, i, flipped, h, extra)
                with np.errstate(invalid="ignore"):
                    if np.any(np.abs(oi[h] - ref) > al[h]):
                        hit = True
                        break
            if hit:
                seen += 1
            else:
                blind.append(f"b{b} row {i} key {j} ({'inside' if inside else 'outside'})")
    return {"applicable": True, "edges": n, "seen": seen, "blind": blind}
