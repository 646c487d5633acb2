"""Model of FA4 (flash-attn-4 4.0.0b36) SM90 backward fp32-accumulator misread
(known issue `sm90_dq_accum_hdim_rounding`).

Derivation (see README.md for file:line):
  Both the SM90 main backward kernel (writer, flash_bwd_sm90.py) and the postprocess (reader,
  flash_bwd_postprocess.py) store/load a (tile_m x D) fp32 tile per m-block as

      F_D(G, c) = 64*D*(G // 64) + 512*(c // 8) + phi(G % 64, c % 8)                       (1)
      phi(rr, cc) = 4*(32*(rr // 16) + 4*(rr % 8) + cc // 2) + (cc % 2) + 2*((rr % 16) // 8)

  (flat fp32 index inside one (batch, head) buffer, or inside one head's packed varlen buffer
  with G = padded_offset_b + row, padded_offset_b = (cu_seqlens[b] + b*tile) // tile * tile).
  I.e. 64-row slabs of 64*D floats; inside a slab, column-octet-major chunks of 512 floats;
  inside a chunk the fixed WGMMA-accumulator permutation phi of the 64x8 sub-tile.
  The writer uses D = Dw = round_up(hd, 16) (flash_bwd_sm90.py:80-81), the reader
  D = Dr = round_up(hd, 32) (interface.py:2609, flash_bwd_postprocess.py:166).  (1) was
  checked element-by-element against CuTe's own layout algebra (cute_maps.py / cute_maps.npz).

  Gather (phi identical on both sides, so row%64 and col%8 are preserved):
      O      = (G // 64) * (Dr // 8) + c // 8            # reader's octet index
      s', j' = divmod(O, Dw // 8)
      G'     = 64*s' + G % 64,   c' = 8*j' + c % 8        # what the writer stored there
  out[G, c] = scale * acc[G', c']  if (G', c') was written (a real row of some sequence,
  c' < head_dim), else 0 (memset by the preprocess / padded rows & cols have dS = 0 / K = 0).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np


def phi(rr, cc):
    """Position (0..511) of element (row rr in 0..63, col cc in 0..7) of a 64x8 sub-tile inside its
    512-float chunk: WGMMA C-fragment (thread t = 32*warp + 4*(rr%8) + cc//2, register
    v0 + 2*v1 with v0 = cc%2, v1 = (rr%16)//8) written as float4 at 4*t."""
    rr = np.asarray(rr)
    cc = np.asarray(cc)
    return 4 * (32 * (rr // 16) + 4 * (rr % 8) + cc // 2) + (cc % 2) + 2 * ((rr % 16) // 8)


def accum_offset(G, c, D):
    """Eq. (1): flat fp32 index of (padded row G, column c) for tile_hdim D (any tile_m that is a
    multiple of 64 with WGs stacked on M, or tile_m = 64 with 1 or 2 WGs split on N)."""
    G = np.asarray(G)
    c = np.asarray(c)
    return 64 * D * (G // 64) + 512 * (c // 8) + phi(G % 64, c % 8)


def round_up(x, m):
    return (x + m - 1) // m * m


def sm90_hdims(head_dim: int, dKV_swapAB: bool = False):
    """(Dw, Dr): writer tile_hdim (flash_bwd_sm90.py:80-81) and reader/alloc tile_hdim
    (interface.py:2609-2610, flash_bwd_postprocess.py:166)."""
    if dKV_swapAB:
        return round_up(head_dim, 64), round_up(head_dim, 64)
    return round_up(head_dim, 16), round_up(head_dim, 32)


def sm90_bwd_tiles(head_dim: int, causal: bool = False, local: bool = False):
    """(tile_m, tile_n, dKV_swapAB, dQ_swapAB) from interface._tile_size_bwd_sm90 (interface.py:216-290),
    no block sparsity."""
    if head_dim <= 64:
        return 128, 128, False, False
    if head_dim <= 96:
        return 64, 128, False, False
    if head_dim <= 128:
        tm = 64 if (causal or local) else 80
        return tm, 128, False, tm % 64 != 0
    if head_dim <= 192:
        return 64, 96, True, False
    return 64, 48, True, False


def _gather_core(acc_list, lens, head_dim, Dw, Dr, tile, varlen_packed, scale):
    """acc_list: list of per-sequence arrays (len_b, H, head_dim) (true accumulator values).
    Returns list of per-sequence arrays as the postprocess outputs them."""
    nseq = len(lens)
    if varlen_packed:
        cu = np.concatenate([[0], np.cumsum(lens)])
        P = np.array([(cu[b] + b * tile) // tile * tile for b in range(nseq)], dtype=np.int64)
    else:
        P = np.zeros(nseq, dtype=np.int64)
    nwritten = np.array([round_up(L, tile) for L in lens], dtype=np.int64)  # rows the writer covers
    outs = []
    for b in range(nseq):
        L = lens[b]
        H = acc_list[b].shape[1]
        out = np.zeros((L, H, head_dim), dtype=np.float64)
        if L == 0:
            outs.append(out.astype(np.float32))
            continue
        r = np.arange(L)[:, None]
        c = np.arange(head_dim)[None, :]
        G = P[b] + r
        O = (G // 64) * (Dr // 8) + c // 8
        s2, j2 = np.divmod(O, Dw // 8)
        G2 = 64 * s2 + G % 64
        c2 = 8 * j2 + c % 8
        G2b, c2b = np.broadcast_arrays(G2, c2)
        for bb in (range(nseq) if varlen_packed else [b]):
            lo = P[bb]
            # written block range of sequence bb, and only real rows / real columns carry data
            inblk = (G2b >= lo) & (G2b < lo + nwritten[bb])
            real = inblk & (G2b - lo < lens[bb]) & (c2b < head_dim)
            if not real.any():
                continue
            rr, cc = np.nonzero(real)
            out[rr, :, cc] = acc_list[bb][G2b[rr, cc] - lo, :, c2b[rr, cc]]
        outs.append((scale * out).astype(np.float32))
    return outs


def sm90_dq_misread(
    dq_true_scaled_fp32: np.ndarray,
    head_dim: Optional[int] = None,
    seqlen_q_list: Optional[Sequence[int]] = None,
    varlen_packed: bool = False,
    tile_m: Optional[int] = None,
    causal: bool = False,
    scale: float = 1.0,
    out_dtype=None,
) -> np.ndarray:
    """What FA4 SM90 returns as dQ, given the true dQ.

    dq_true_scaled_fp32: the true gradient in FA's dq layout, fp32:
        non-varlen: (batch, seqlen_q, nheads, head_dim); varlen_packed: (total_q, nheads, head_dim).
        Pass the true dQ (= softmax_scale * dS @ K) with scale=1.0 (default), or the raw main-kernel
        accumulator (dS @ K, unscaled) with scale=softmax_scale: the postprocess multiplies by
        softmax_scale (interface.py:3118, flash_bwd_postprocess.py:706) and the gather is linear.
    head_dim: defaults to the last dim.
    seqlen_q_list: varlen sequence lengths (cu_seqlens_q diffs); required if varlen_packed.
    tile_m: m_block_size; default from interface._tile_size_bwd_sm90 (128 for hd<=64, 64 for
        65..96, 64 for 97..128 causal; 80 non-causal hd 97..128 (dQ_swapAB) does not build when
        Dw != Dr, see README).
    out_dtype: None -> fp32 result; torch.bfloat16 / torch.float16 -> rounded like the postprocess.
    Returns: same shape; zeros where the postprocess reads memory the main kernel never wrote.
    Scope: no seqused_q, no pack_gqa (disabled in bwd, interface.py:2577), no block sparsity
    (same gdQaccum layout, but not modelled), hd <= 128 (above, Dw == Dr).
    """
    x = np.asarray(dq_true_scaled_fp32, dtype=np.float64)
    head_dim = x.shape[-1] if head_dim is None else head_dim
    assert x.shape[-1] == head_dim and head_dim % 8 == 0
    tm_default, _, dKV_swapAB, dQ_swapAB = sm90_bwd_tiles(head_dim, causal)
    tile_m = tm_default if tile_m is None else tile_m
    Dw, Dr = sm90_hdims(head_dim, dKV_swapAB)
    if Dw != Dr and tile_m % 64 != 0:
        raise NotImplementedError(
            "tile_m=%d (dQ_swapAB) with Dw=%d != Dr=%d: the SM90 kernel fails to build "
            "(tiled MMA cannot partition (Dw, tile_m))" % (tile_m, Dw, Dr))
    if varlen_packed:
        assert seqlen_q_list is not None and sum(seqlen_q_list) == x.shape[0]
        lens = [int(v) for v in seqlen_q_list]
        cu = np.concatenate([[0], np.cumsum(lens)])
        accs = [x[cu[b]:cu[b + 1]] for b in range(len(lens))]
        outs = _gather_core(accs, lens, head_dim, Dw, Dr, tile_m, True, scale)
        res = np.concatenate(outs, axis=0) if outs else np.zeros_like(x, dtype=np.float32)
    else:
        B, S = x.shape[:2]
        if seqlen_q_list is not None:
            assert all(int(v) == S for v in seqlen_q_list)
        outs = _gather_core([x[b] for b in range(B)], [S] * B, head_dim, Dw, Dr, tile_m, False, scale)
        res = np.stack(outs, axis=0)
    if out_dtype is not None:
        import torch
        res = torch.from_numpy(res).to(out_dtype)
    return res


def sm90_dkv_misread(
    dk_true_fp32: np.ndarray,
    head_dim: Optional[int] = None,
    seqlen_k_list: Optional[Sequence[int]] = None,
    varlen_packed: bool = False,
    tile_n: Optional[int] = None,
    scale: float = 1.0,
    out_dtype=None,
):
    """GQA (qhead_per_kvhead > 1) dK or dV as FA4 SM90 returns it. Same gather as dQ with rows =
    key positions and tile = tile_n (writer: flash_bwd_sm90.py:1724-1799, tile_n x Dw per n_block,
    2 WGs stacked on N via AtomLayoutNdKV=2; reader: the same postprocess class with
    tile_m=n_block_size, AtomLayoutNdKV, dKV_swapAB, Dr (interface.py:3134-3157)).
    dk_true_fp32: true dK (or dV) in FA's layout (batch, seqlen_k, nheads_kv, hd) or
    (total_k, nheads_kv, hd); already summed over the q heads of each group. scale as for dQ
    (postprocess multiplies dK accum by softmax_scale, dV accum by 1.0). hd <= 128 only
    (above, dKV_swapAB makes Dw == Dr == round_up(hd, 64)). With qhead_per_kvhead == 1 dK/dV are
    stored directly (bf16 TMA), unaffected."""
    x = np.asarray(dk_true_fp32, dtype=np.float64)
    head_dim = x.shape[-1] if head_dim is None else head_dim
    _, tn_default, dKV_swapAB, _ = sm90_bwd_tiles(head_dim)
    tile_n = tn_default if tile_n is None else tile_n
    Dw, Dr = sm90_hdims(head_dim, dKV_swapAB)
    if varlen_packed:
        lens = [int(v) for v in seqlen_k_list]
        assert sum(lens) == x.shape[0]
        cu = np.concatenate([[0], np.cumsum(lens)])
        outs = _gather_core([x[cu[b]:cu[b + 1]] for b in range(len(lens))], lens, head_dim, Dw, Dr,
                            tile_n, True, scale)
        res = np.concatenate(outs, axis=0)
    else:
        B, S = x.shape[:2]
        outs = _gather_core([x[b] for b in range(B)], [S] * B, head_dim, Dw, Dr, tile_n, False, scale)
        res = np.stack(outs, axis=0)
    if out_dtype is not None:
        import torch
        res = torch.from_numpy(res).to(out_dtype)
    return res


def gather_table(head_dim: int, rows: int, tile: Optional[int] = None):
    """Human-readable gather for one non-varlen (batch, head): for each output (r, c) the true
    (r', c') it holds, or (-1, -1) for zero."""
    tm, _, sw, _ = sm90_bwd_tiles(head_dim, causal=True)
    tile = tm if tile is None else tile
    Dw, Dr = sm90_hdims(head_dim, sw)
    r = np.arange(rows)[:, None]
    c = np.arange(head_dim)[None, :]
    s2, j2 = np.divmod((r // 64) * (Dr // 8) + c // 8, Dw // 8)
    r2 = 64 * s2 + r % 64
    c2 = 8 * j2 + c % 8
    r2, c2 = np.broadcast_arrays(r2, c2)
    bad = (r2 >= rows) | (c2 >= head_dim)
    return np.where(bad, -1, r2), np.where(bad, -1, c2)
