"""float64 model of FA4 (flash-attn-4 4.0.0b36) SM90 paged-KV forward defect `sm90_paged_tile144_fwd`.

Mechanism (see README.md for file:line citations):
  PagedKVManager.load_KV (cp.async path, page_size != tile_n) copies the KV tile in waves of
  rows_per_wave = 128 / threads_per_row rows; tile_n = 144 is not a multiple of rows_per_wave
  (64 at hd 80, 32 at hd 96), so the last wave covers rows 144..191 (hd 80) / 144..159 (hd 96).
  Those J = 48 / 16 extra rows are only predicated on `key < seqlen_k`, never on `row < tile_n`,
  and a false predicate zero-fills, so for every block n, extra row j is written with
  physical page 0 (page index forced to 0 for invalid rows), in-page offset ((n+1)*144 + j) % page_size
  when (n+1)*144 + j < seqlen_k, and with zeros otherwise; destination = linear smem
  offset (144+j)*W + ..., which aliases
      same stage  (row j, col c+W)             for c <  D-W   (D-W == 64 for hd 80 and 96)
      next region (row j, col c-(D-W))          for c >= D-W
  where W is the swizzle-atom width (16 at hd 80, 32 at hd 96) and "next region" is stage 1 of the
  same buffer for stage 0, and for stage 1 the buffer that follows in SharedStorageQKV:
  sV -> sQ, sK -> sP.

Conventions (dense, float64):
  q          (batch, seqlen_q, nheads, d)
  k_cache    (num_pages, page_size, nheads_kv, d)   physical paged cache, exactly FA4's input
  v_cache    (num_pages, page_size, nheads_kv, d)
  page_table (batch, max_pages_per_seq) int
  seqlens_k  (batch,) int   (seqused_k; None -> max_pages_per_seq * page_size)
  returns out (batch, seqlen_q, nheads, d), lse (batch, nheads, seqlen_q) (natural log, FA4's).
  Non-causal, non-local, no softcap, no split; learnable_sink (nheads,) optional; pack_gqa as FA4
  (default qhead_per_kvhead > 1); one CTA per (m_block, head, batch) (is_persistent=False).

Things a GPU decides (model parameters; the defaults fit the H200 triage best, see README):
  oob_wins   : in-tile race inside one cp.async group between the correct write of (j, c+W) [wave 0,
               thread tpr*j+..] and the stray write [last wave, thread tpr*(16+j)+..]. True = stray lands last (fits
               hd 80 and every single-block sequence measured), False = correct data lands last (fit
               the 2-block sequence at hd 96 in most runs), "zeros"/"data" = only zero-filled / only
               page-0 strays win, or a callable (kind, n_block, j, stray_is_zero) -> bool.
  schedule   : 'eager' (default) = every load lands as soon as the pipeline lets the producer issue
                         it: the V stray of stage-1 block n is in sQ when QK(n) runs (measured), the
                         stray of stage-0 block n-1 overwrites K/V rows 0..J-1, cols 0..W-1 of
                         stage-1 block n before its QK/PV (not measured), no sP corruption.
               'lazy'  = producer-bound: a load lands only when its full barrier is first waited:
                         sQ corrupted from QK(n+1) on (rejected by the triage data), no cross-stage,
                         K stray of block n-1 overwrites P(n) in sP before PV(n).
               'none'  = in-tile aliasing only.
               Overrides: cross(kind, n, j, zero)->bool, sq(m, n)->bool, sp(n)->bool.
  zero_fill  : a cp.async with pred=False zero-fills: the DSL lowers the predicate to
               `cp.async.cg.shared.global [dst], [src], 16, (pred ? 16 : 0)` (checked: probe_pred.py,
               ptx/). Default True; False would be CuTe C++ copy_if (skip) semantics.
Elements that read never-written (uninitialised) smem come back as NaN.
"""
import math
import numpy as np

NUM_LOAD_THREADS = 128  # flash_fwd_sm90.py:742 num_threads_per_warp_group


def fa4_sm90_tile(head_dim, causal=False, local=False):
    """interface.py:160-183 _tile_size_fwd_sm90 -> (tile_m, tile_n, mma_pv_is_rs)."""
    if head_dim <= 64:
        return 192, 128, True
    if head_dim <= 96:
        return (192, 128, False) if (causal or local) else (192, 144, False)
    if head_dim <= 128:
        return 128, 128, True
    if head_dim <= 192:
        return 128, 128, True
    return 128, 80, True


def atom_width(d_pad, elem_bytes=2):
    """Columns per swizzle atom row (quack sm90_utils.make_smem_layout; verified in probe2.py)."""
    row_bytes = d_pad * elem_bytes
    for w_bytes in (128, 64, 32):
        if row_bytes % w_bytes == 0:
            return w_bytes // elem_bytes
    return 16 // elem_bytes


def swizzle(x, b, m, s):
    """CuTe Swizzle<B,M,S> on element offsets."""
    yyy = ((1 << b) - 1) << (m + s)
    return x ^ ((x & yyy) >> s)


SWZ = {128: (3, 4, 3), 64: (2, 4, 3), 32: (1, 4, 3), 16: (0, 4, 3)}  # by atom row bytes


def defect_geometry(head_dim, tile_n):
    d = int(math.ceil(head_dim / 16) * 16)
    tpr = math.gcd(d, d, 64) // 8            # paged_kv.py:69-75
    rpw = NUM_LOAD_THREADS // tpr            # rows per copy wave (thr_layout, paged_kv.py:82-85)
    waves = -(-tile_n // rpw)                # cute.size(tXsX, mode=[1]) (paged_kv.py:233)
    J = waves * rpw - tile_n                 # rows written past the tile
    W = atom_width(d)
    return dict(d=d, tpr=tpr, rpw=rpw, waves=waves, J=J, W=W, spill=d - W)


def _sp_target(j, cc, W_kv, tile_n):
    """Stray sK stage-1 element (row j, col cc<W) -> logical (row, col) of sP (192 x tile_n)."""
    e = j * W_kv + cc                              # linear offset past the end of sK == offset in sP
    phys = swizzle(e, *SWZ[W_kv * 2])
    Wp = atom_width(tile_n)
    lin = swizzle(phys, *SWZ[Wp * 2])              # sP swizzle is an involution
    col_block_stride = 192 * Wp
    cb, rem = divmod(lin, col_block_stride)
    r, c = divmod(rem, Wp)
    return r, cb * Wp + c


def paged_tile144_forward(q, k, v, page_size, page_table, seqlens_k, softmax_scale, head_dim,
                          *, schedule="eager", oob_wins=True, zero_fill=True, pack_gqa=None,
                          causal=False, learnable_sink=None, intile=None, cross=None, sq=None,
                          sp=None):
    if causal:
        raise NotImplementedError("causal uses tile 192x128 -> no defect; use a reference")
    q = np.asarray(q, np.float64); k = np.asarray(k, np.float64); v = np.asarray(v, np.float64)
    B, Sq, H, D = q.shape
    Hk = k.shape[2]
    qpk = H // Hk
    if pack_gqa is None:
        pack_gqa = qpk > 1                          # interface.py:1000-1001
    page_table = np.asarray(page_table)
    if seqlens_k is None:
        seqlens_k = [page_table.shape[1] * page_size] * B
    tile_m, tile_n, _ = fa4_sm90_tile(head_dim)
    geo = defect_geometry(head_dim, tile_n)
    J, W, spill = geo["J"], geo["W"], geo["spill"]
    tma = page_size == tile_n                     # interface.py:1652 paged_kv_non_tma
    defect = (not tma) and J > 0
    out = np.zeros_like(q)
    lse = np.zeros((B, H, Sq))

    for b in range(B):
        sk = int(seqlens_k[b])
        keys = np.arange(sk)
        pg = page_table[b, keys // page_size]
        K = k[pg, keys % page_size]                # (sk, Hk, D) logical
        V = v[pg, keys % page_size]
        N = -(-sk // tile_n)
        for hk in range(Hk):
            Kp0, Vp0 = k[0, :, hk], v[0, :, hk]   # page forced to 0: paged_kv.py:153
            if pack_gqa:
                rows = [(qi, hk * qpk + g) for qi in range(Sq) for g in range(qpk)]
                groups = [rows]
            else:
                groups = [[(qi, h) for qi in range(Sq)] for h in range(hk * qpk, (hk + 1) * qpk)]
            for rows in groups:
                for m0 in range(0, len(rows), tile_m):
                    tr = rows[m0:m0 + tile_m]
                    Qt = np.zeros((tile_m, D))
                    for r, (qi, h) in enumerate(tr):
                        Qt[r] = q[b, qi, h]
                    sinks = None
                    if learnable_sink is not None:
                        sinks = np.array([learnable_sink[h] for (_, h) in tr] + [0.0] * (tile_m - len(tr)))
                    o, l = _tile(Qt, K[:, hk], V[:, hk], Kp0, Vp0, sk, N, tile_n, page_size,
                                 softmax_scale, defect, J, W, spill, schedule, oob_wins,
                                 zero_fill, sinks, intile, cross, sq, sp)
                    for r, (qi, h) in enumerate(tr):
                        out[b, qi, h] = o[r]
                        lse[b, h, qi] = l[r]
    return out, lse


def _stray(n, j, sk, tile_n, page_size, X0, zero_fill):
    """Row that the stray copy of block n, extra row j, writes (None = not written)."""
    key = (n + 1) * tile_n + j                     # row_valid test, paged_kv.py:230-236
    if key < sk:
        return X0[key % page_size]                 # page 0, offset from divmod paged_kv.py:148
    return np.zeros(X0.shape[1]) if zero_fill else None


def _resolve(schedule, oob_wins, intile, cross, sq, sp):
    """Turn a preset + overrides into four predicates (see module docstring)."""
    if intile is None:
        if callable(oob_wins):
            intile = oob_wins
        elif oob_wins in ("zeros", "data"):
            intile = (lambda kind, n, j, zero, _w=oob_wins: zero == (_w == "zeros"))
        else:
            intile = (lambda kind, n, j, zero, _w=bool(oob_wins): _w)
    if cross is None:
        cross = (lambda kind, n, j, zero, _e=(schedule == "eager"): _e)
    if sq is None:
        sq = {"lazy": lambda m, n: m >= n + 1, "eager": lambda m, n: m >= n,
              "none": lambda m, n: False}[schedule]
    if sp is None:
        sp = (lambda n, _l=(schedule == "lazy"): _l)
    return intile, cross, sq, sp


def _tile(Qt, K, V, Kp0, Vp0, sk, N, tn, P, scale, defect, J, W, spill, schedule, oob_wins,
          zero_fill, sinks=None, intile=None, cross=None, sq=None, sp=None):
    D = Qt.shape[1]
    M = Qt.shape[0]
    stage = lambda n: (N - 1 - n) % 2              # block N-1 -> stage 0, alternating (flash_fwd_sm90.py:786-826)
    intile, cross, sq, sp = _resolve(schedule, oob_wins, intile, cross, sq, sp)
    m_run = np.full(M, -np.inf); l_run = np.zeros(M); O = np.zeros((M, D))

    def eff(X, X0, n, kind):
        blk = np.full((tn, D), np.nan)             # never-written smem rows = NaN
        lo, hi = n * tn, min((n + 1) * tn, sk)
        blk[: hi - lo] = X[lo:hi]
        if zero_fill:
            blk[hi - lo:] = 0.0                    # rows >= seqlen_k: pred false -> zero-filled
        if not defect:
            return blk
        for j in range(J):                         # in-tile alias: (j, c+W) <- stray[c], c < D-W
            row = _stray(n, j, sk, tn, P, X0, zero_fill)
            if row is not None and intile(kind, n, j, (n + 1) * tn + j >= sk):
                blk[j, W:] = row[:D - W]
        if stage(n) == 1 and n - 1 >= 0:           # cross-stage: stray of block n-1 (stage 0)
            for j in range(J):
                row = _stray(n - 1, j, sk, tn, P, X0, zero_fill)
                if row is not None and cross(kind, n, j, n * tn + j >= sk):
                    blk[j, :W] = row[spill:]
        return blk

    def q_for(n):
        Qe = Qt.copy()
        if not defect:
            return Qe
        for mm in range(N - 1, n - 1, -1):         # program order: V(N-1), V(N-2), ...
            if stage(mm) == 1 and sq(mm, n):       # V stage-1 stray lands in sQ (struct order sV, sQ)
                for j in range(J):
                    row = _stray(mm, j, sk, tn, P, Vp0, zero_fill)
                    if row is not None:
                        Qe[j, :W] = row[spill:]
        return Qe

    for n in range(N - 1, -1, -1):
        Ke, Ve = eff(K, Kp0, n, "K"), eff(V, Vp0, n, "V")
        S = scale * (q_for(n) @ np.nan_to_num(Ke, nan=0.0).T)
        if np.isnan(Ke).any():
            S[:, np.isnan(Ke).any(1)] = np.nan
        ncols = min(tn, sk - n * tn)
        S[:, ncols:] = -np.inf                     # seqlen mask by logical key (last block only)
        m_new = np.maximum(m_run, S.max(1))
        Pm = np.exp(S - m_new[:, None])
        l_run = l_run * np.exp(m_run - m_new) + Pm.sum(1)
        O *= np.exp(m_run - m_new)[:, None]
        Pu = Pm.copy()
        if defect and stage(n) == 0 and n - 1 >= 0 and sp(n):
            for j in range(J):                     # K(n-1) stray (stage 1 -> sP) lands after P(n) store
                row = _stray(n - 1, j, sk, tn, P, Kp0, zero_fill)
                if row is None:
                    continue
                for cc in range(W):
                    r, c = _sp_target(j, cc, W, tn)
                    Pu[r, c] = row[spill + cc]
        Vz = np.where(np.isnan(Ve), 0.0, Ve)
        O += Pu @ Vz
        bad = (Pu != 0) & np.isnan(Ve).any(1)[None, :]
        O[bad.any(1)] = np.nan
        m_run = m_new
    if sinks is not None:                          # softmax.py:267-274 (finalize)
        l_run = l_run + np.exp(sinks - m_run)
    return O / l_run[:, None], m_run + np.log(l_run)


def reference_forward(q, k, v, page_size, page_table, seqlens_k, softmax_scale):
    q = np.asarray(q, np.float64)
    B, Sq, H, D = q.shape
    Hk = k.shape[2]
    out = np.zeros_like(q); lse = np.zeros((B, H, Sq))
    for b in range(B):
        sk = int(seqlens_k[b]); keys = np.arange(sk)
        pg = np.asarray(page_table)[b, keys // page_size]
        K = np.asarray(k, np.float64)[pg, keys % page_size]
        V = np.asarray(v, np.float64)[pg, keys % page_size]
        for h in range(H):
            S = softmax_scale * q[b, :, h] @ K[:, h // (H // Hk)].T
            m = S.max(1); Pm = np.exp(S - m[:, None]); l = Pm.sum(1)
            out[b, :, h] = Pm @ V[:, h // (H // Hk)] / l[:, None]
            lse[b, h] = m + np.log(l)
    return out, lse
