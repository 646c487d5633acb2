"""CPU twin of FA4's attention *backward* (SM90 and SM100 paths).

Public entry: :func:`fa4verify.kernels.twin.attention.backward`.  Labelled "CPU twin".

What is modelled (flash_attn/cute/flash_bwd_preprocess.py / flash_bwd_postprocess.py; FA4 ``flash_attn/cute/{flash_bwd_preprocess.py,
flash_bwd_sm90.py, flash_bwd_sm100.py, flash_bwd_postprocess.py}``)
--------------------------------------------------------------------------------------
* Preprocess: ``D_i = sum_d fp32(O_bf16) * fp32(dO)`` from the **rounded** O; each of the
  ``threads_per_row = gmem_k_block/8`` threads sums its 8-element chunks sequentially, then a
  butterfly ``warp_reduce`` (pairwise over thread index).  ``lse_log2 = lse * log2 e`` (0 if
  ``lse == -inf``). With a gradient through the returned LSE (``dlse``), ``D'_i = RN(D_i - dLSE_i)``
  (fp32), which everything below reads as D.
* Per KV block: ``S = Q K^T`` (fp32 MMA), softcap, mask, ``P = ex2(fma(S, c, -lse_log2))``
  (hardware exp2 only -- FA4's backward never emulates), ``P -> dtype`` (RNE) for dV,
  ``dP = dO V^T`` (fp32 MMA), ``dS = RN(P * RN(dP - D))`` (fp32), softcap chain rule
  ``dS *= 1 - tanh^2`` (MUFU tanh), ``dS -> dtype`` (RNE).
* ``dV += P^T dO`` and ``dK += dS^T Q``: fp32 accumulators over the Q blocks of the KV block,
  ascending ``m_block`` (one MMA per ``tile_m`` rows).
* ``dQ``: each KV block's ``dS K`` partial (one MMA per row over ``tile_n`` keys) is reduce-added
  (fp32) into ``dq_accum``.  ``deterministic=True``: ascending ``n_block`` (the semaphore order),
  descending for causal/local (SPT).  ``deterministic=False``: an arbitrary order, modelled as a
  permutation drawn from ``seed`` (reproducible for the twin; the GPU's order is not).
* Epilogue/postprocess: MHA ``dK = RN_out(RN(dK_acc * scale))``, ``dV = RN_out(dV_acc)``;
  GQA sums the per-head fp32 accumulators in head order first (``dk_accum``), then scales and
  casts; ``dQ = RN_out(RN(dq_accum * scale))``.
* Tiles: SM90 ``_tile_size_bwd_sm90`` (hd<=64: 128x128, <=96: 64x128, <=128: 64 causal-local /
  80 x 128, <=192: 64x96, 256: 64x48); SM100 128x128.

Stage switches :data:`BWD_STAGES`; mutations ``d_from_fp32_o`` (D from the fp32 O),
``dq_shuffled_order`` (an unseeded shuffled dQ order even with ``deterministic=True``: two runs
differ) and ``dpsum_bias_2m10`` (D times 1 + 2^-10, the production source mutant's fault).  Model parameters ``accumulation`` and ``mufu`` as in the forward (``twin/forward.py``).

Possible issues
---------------
* Learnable-sink gradient (dsink), varlen and GQA dK/dV cross-head *ordering* beyond
  "ascending head" are not modelled; the preprocess per-thread order is an assumption (the
  budget covers any order).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from fa4verify.oracles import binary32 as b32
from fa4verify.kernels import facts as _facts
from fa4verify.kernels.twin import forward as tf
from fa4verify.kernels.twin.forward import Mufu, StageSample
# the fp32 building blocks shared with the forward (public in fp32.py; aliased here)
from fa4verify.kernels.twin.fp32 import (F32, F64, LOG2_E, add as _add, cast_to,
                                         check_representable, div as _div, fma as _fma,
                                         infer_dtype, mma, mul as _mul, rn32 as _rn32, sub as _sub)

BWD_STAGES: tuple[str, ...] = (
    "d_pre", "bwd_s_accum", "bwd_exp_arg", "bwd_exp2", "bwd_p_cast", "dp_accum", "ds", "ds_cast",
    "dv_accum", "dk_accum", "dq_accum", "dq_post", "dk_post", "grad_cast",
)
BWD_MUTATIONS: tuple[str, ...] = ("d_from_fp32_o", "dq_shuffled_order", "dpsum_bias_2m10")


@dataclass
class TwinBackwardResult:
    """``dq`` (b, sq, hq, d), ``dk``/``dv`` (b, sk, hk, d/dv): dtype-rounded values in float32
    (float64 where the cast stage is exact).  ``stages``: ``D`` (b,h,sq), ``lse_log2``,
    ``dq_accum`` (fp32, unscaled), ``dq_order`` (the KV-block order of the dQ reduce-adds),
    ``p_max_bwd``."""
    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    stages: dict[str, Any]
    config: dict[str, Any]


sm90_bwd_tile = _facts.sm90_bwd_tile   # FA4's table, once, in fa4verify.kernels.facts


def _acc_blocks(acc0, A_, B_, tile_m: int, exact: bool, probe, stage: str, stat: str):
    """``acc = RN32(acc + A_m^T B_m)`` over the m-blocks of ``tile_m`` rows, in ascending order
    ("exact-then-round" MMAs); ``A_`` (b,h,sq,n), ``B_`` (b,h,sq,d) -> (b,h,n,d)."""
    A64, B64 = np.asarray(A_, F64), np.asarray(B_, F64)
    Sq = A64.shape[2]
    mb = -(-Sq // tile_m)
    full = Sq // tile_m

    def blocks(f):
        """f(A block^T, B block) per m-block, stacked on axis 2: the full blocks as one batched
        product, a last partial block on its own rows (no zero rows padded in: a short sequence's
        block was mostly padding)."""
        n = full * tile_m
        Ab = A64[:, :, :n].reshape(A64.shape[:2] + (full, tile_m) + A64.shape[3:])
        Bb = B64[:, :, :n].reshape(B64.shape[:2] + (full, tile_m) + B64.shape[3:])
        out = f(np.swapaxes(Ab, -1, -2), Bb)
        if full < mb:
            tail = f(np.swapaxes(A64[:, :, n:], -1, -2), B64[:, :, n:])[:, :, None]
            out = tail if full == 0 else np.concatenate([out, tail], 2)
        return out
    with np.errstate(invalid="ignore", over="ignore"):
        # (a batched BLAS product where einsum ran its own loops; the float64 sum of a block's
        # products is the model's exact value either way, its order inside float64's rounding)
        parts = blocks(np.matmul)
        if exact:
            return np.asarray(acc0, F64) + parts.sum(2)
        abs_parts = blocks(lambda a, b: np.matmul(np.abs(a), np.abs(b))) if probe else None
    acc = np.asarray(acc0)
    outs, exs, sabs = [], [], []
    for m in range(mb):
        prev = acc
        with np.errstate(invalid="ignore", over="ignore"):
            ex = np.asarray(prev, F64) + parts[:, :, m]
            acc = _rn32(ex)
        if probe:
            outs.append(acc)
            exs.append(ex)
            sabs.append(np.abs(np.asarray(prev, F64)) + abs_parts[:, :, m])
    if probe and outs:
        n_rows = np.minimum(tile_m, Sq - tile_m * np.arange(mb)).astype(F64) + 1.0
        probe(StageSample(stage, np.stack(outs), np.stack(exs),
                          {stat: np.stack(sabs),
                           "n_acc": n_rows.reshape((mb,) + (1,) * np.asarray(acc).ndim)}))
    return acc


def _d_preprocess(o, do, exact: bool):
    """D = sum_d O*dO: per-thread sequential over 8-element chunks, butterfly over threads."""
    o64, do64 = np.asarray(o, F64), np.asarray(do, F64)
    ex = (o64 * do64).sum(-1)
    if exact:
        return ex
    dv = o.shape[-1]
    dvp = -(-dv // 32) * 32
    gk = 128 if dvp % 128 == 0 else (64 if dvp % 64 == 0 else (32 if dvp % 32 == 0 else 16))
    tpr = max(gk // 8, 1)
    prod = _rn32(o64 * do64)                    # exact for 16-bit inputs (fp32 O: rounded)
    if dvp != dv:
        prod = np.concatenate([prod, np.zeros(prod.shape[:-1] + (dvp - dv,), F32)], -1)
    chunks = prod.reshape(prod.shape[:-1] + (dvp // 8, 8))
    parts = []
    for t in range(tpr):
        acc = None
        for ch in range(t, dvp // 8, tpr):
            for e in range(8):
                acc = chunks[..., ch, e] if acc is None else _add(acc, chunks[..., ch, e])
        parts.append(acc if acc is not None else np.zeros(prod.shape[:-1], F32))
    while len(parts) > 1:
        parts = [_add(parts[i], parts[i + 1]) for i in range(0, len(parts), 2)]
    return parts[0]


def backward(q, k, v, out, dout, *, lse=None, arch: str = "sm90",
             softmax_scale: float | None = None, causal: bool = False,
             window_size=(None, None), softcap: float = 0.0, learnable_sink=None,
             deterministic: bool = True, exact_stages=frozenset(), mutations=frozenset(),
             dtype: str | None = None, accumulation: str = "exact-then-round",
             mufu: str = "correctly-rounded", seed: int = 0,
             stage_probe: Callable[[StageSample], None] | None = None,
             out_fp32=None, dlse=None, keep=None, keep_rule=None, sparse_q=None) -> TwinBackwardResult:
    """CPU twin of FA4's backward.  ``out`` is the forward output (dtype-rounded), ``lse`` the
    forward LSE (natural log, (b, h, sq)); when ``lse`` is None (or ``d_from_fp32_o`` needs the
    fp32 O and ``out_fp32`` is not given) the twin forward is run with the same settings.
    ``dlse``: a gradient through the returned LSE ((b, h, sq), fp32 values); the preprocess then
    writes ``D' = RN(D - dLSE)`` and the main kernel reads it as D (FA4's
    ``flash_bwd_preprocess.py``, the only place dLSE enters).  ``keep``: the forward's
    elementwise keep-mask (:func:`fa4verify.kernels.twin.forward.forward`), applied with the
    causal / window rule in every KV tile; ``keep_rule``: (causal, local) of the kernel FA4
    compiled where ``keep`` carries that rule (block lists under it): on SM90 the deterministic dQ
    order follows it, on SM 10.x the lists' ascending ranks do; with ``sparse_q`` (a block-sparse
    call's Q block, FA4's ``sparse_block_size_q``) the SM90 tile is FA4's for block sparsity under
    that rule (:func:`~fa4verify.kernels.facts.sm90_bwd_tile`)."""
    exact = frozenset(exact_stages)
    muts = frozenset(mutations)
    bad = exact - set(BWD_STAGES) - set(tf.FWD_STAGES)
    if bad:
        raise ValueError(f"unknown backward stage(s) {sorted(bad)}; known: {BWD_STAGES}")
    bad = muts - set(BWD_MUTATIONS) - set(tf.FWD_MUTATIONS)
    if bad:
        raise ValueError(f"unknown mutation(s) {sorted(bad)}; known: {BWD_MUTATIONS}")
    if arch not in ("sm90", "sm100", "sm103"):
        raise ValueError(f"arch={arch!r}: expected 'sm90', 'sm100' or 'sm103'")
    qa, qd = infer_dtype(q)
    ka, _ = infer_dtype(k)
    va, _ = infer_dtype(v)
    oa = (np.asarray(out) if isinstance(out, np.ndarray) and out.dtype == F64
          else infer_dtype(out)[0])     # float64: an exact-forward output (stage ablation)
    doa, _ = infer_dtype(dout)
    dt = dtype or qd or "bf16"
    if dt not in ("bf16", "fp16"):
        raise ValueError(f"backward supports bf16/fp16 only (FA4 interface.py), got {dt!r}")
    for a, n in ((qa, "q"), (ka, "k"), (va, "v"), (doa, "dout")):
        check_representable(a, dt, n)
    fwd_kw = dict(arch=arch, softmax_scale=softmax_scale, causal=causal,
                  window_size=window_size, softcap=softcap, learnable_sink=learnable_sink,
                  dtype=dt, accumulation=accumulation, mufu=mufu, seed=seed, keep=keep)
    if lse is None or ("d_from_fp32_o" in muts and out_fp32 is None):
        fr = tf.forward(q, k, v, **fwd_kw)
        if lse is None:
            lse = fr.lse
        if out_fp32 is None:
            out_fp32 = fr.stages["o_fp32"]
    lse = np.asarray(infer_dtype(lse)[0] if not isinstance(lse, np.ndarray) else lse)
    lse = lse.astype(F32) if lse.dtype != F64 else lse

    B, Sq, Hq, D = qa.shape
    _, Sk, Hk, _ = ka.shape
    Dv = va.shape[-1]
    rep = Hq // Hk
    is_causal, local, wl, wr = tf.resolve_causal_local_window(causal, window_size)
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(D)
    scale32 = F32(softmax_scale)
    has_softcap = softcap is not None and softcap != 0.0
    c = F32(LOG2_E) if has_softcap else F32(b32.mul(np.array(scale32), np.array(F32(LOG2_E)))[()])
    c_true = LOG2_E if has_softcap else float(scale32) * LOG2_E
    if arch == "sm90":
        rc, rl = keep_rule if keep_rule is not None else (is_causal, local)
        tile_m, tile_n = sm90_bwd_tile(D, Dv, rc, rl, sparse_q)
    else:
        tile_m, tile_n = 128, 128
    mf = Mufu(mufu, seed, arch=arch)
    probe = stage_probe

    Q = qa.transpose(0, 2, 1, 3)
    K = np.repeat(ka.transpose(0, 2, 1, 3), rep, axis=1)
    V = np.repeat(va.transpose(0, 2, 1, 3), rep, axis=1)
    O = oa.transpose(0, 2, 1, 3)
    dO = doa.transpose(0, 2, 1, 3)

    # ---- preprocess
    O_for_d = np.asarray(out_fp32, F32).transpose(0, 2, 1, 3) if "d_from_fp32_o" in muts else O
    Dpre = _d_preprocess(O_for_d, dO, "d_pre" in exact)
    if "dpsum_bias_2m10" in muts:
        # the production source mutant of the same name (fa4verify.mutants.source): the
        # preprocess's D times (1 + 2^-10), one fp32 multiply
        Dpre = (np.asarray(Dpre, F32) * F32(1.0 + 2.0 ** -10)).astype(np.asarray(Dpre).dtype)
    if probe and "d_pre" not in exact:
        o64, do64 = np.asarray(O_for_d, F64), dO.astype(F64)
        probe(StageSample("d_pre", Dpre, (o64 * do64).sum(-1),
                          {"abs_od": np.abs(o64 * do64).sum(-1), "dv": float(Dv)}))
    if dlse is not None:      # after the d_pre probe: the stage it samples is D, before dLSE
        dl = np.asarray(dlse, F32)
        if dl.shape != (B, Hq, Sq):
            raise ValueError(f"dlse: expected shape {(B, Hq, Sq)} (batch, nheads, seqlen_q), got {dl.shape}")
        Dpre = np.asarray(Dpre, F64) - dl if "d_pre" in exact else _sub(Dpre, dl)
    lse_arr = np.asarray(lse)
    if lse_arr.dtype == F64:
        lse_log2 = np.where(np.isneginf(lse_arr), 0.0, lse_arr * LOG2_E)
    else:
        lse_log2 = np.where(np.isneginf(lse_arr), F32(0), _mul(lse_arr, np.array(F32(LOG2_E))))

    # ---- KV-block order of the dQ reduce-adds
    n_blocks = -(-Sk // tile_n) if Sk else 0
    order = list(range(n_blocks))
    # SPT (descending n_block) where the kernel has a rule; block lists under a rule keep the order of
    # the lists' ranks on SM 10.x (fa4verify's calls pass ascending ranks, spt off: FA4's
    # interface.py and flash_bwd_sm100.py take the order from them); SM90 has no deterministic
    # block-sparse backward (its order is the prediction's)
    rule_spt = keep_rule is not None and any(keep_rule) and arch == "sm90"
    if deterministic and (is_causal or local or rule_spt):
        order = order[::-1]
    if not deterministic:
        order = list(np.random.default_rng(seed + 7919).permutation(n_blocks))
    if "dq_shuffled_order" in muts:
        order = list(np.random.default_rng().permutation(n_blocks))
    pad = n_blocks * tile_n - Sk
    if pad:
        K = np.concatenate([K, np.zeros(K.shape[:2] + (pad, D), F32)], axis=2)
        V = np.concatenate([V, np.zeros(V.shape[:2] + (pad, Dv), F32)], axis=2)
    keep_p = tf.keep_padded(keep, B, Hq, Sq, Sk, n_blocks * tile_n)

    offset = Sk - Sq
    rows = np.arange(Sq)
    dq_ex = "dq_accum" in exact
    dq_acc = np.zeros((B, Hq, Sq, D), F64 if dq_ex else F32)
    dK_acc = np.zeros((B, Hq, n_blocks * tile_n, D), F32)
    dV_acc = np.zeros((B, Hq, n_blocks * tile_n, Dv), F32)
    p_max = np.zeros((B, Hq, Sq), F32)
    mblocks = -(-Sq // tile_m) if Sq else 0
    for nb in order:
        cols = nb * tile_n + np.arange(tile_n)
        kt = K[:, :, nb * tile_n:(nb + 1) * tile_n]
        vt = V[:, :, nb * tile_n:(nb + 1) * tile_n]
        S = mma(Q, kt, None, accumulation, exact="bwd_s_accum" in exact)
        if probe and "bwd_s_accum" not in exact:
            probe(StageSample("bwd_s_accum", S, mma(Q, kt, None, accumulation, exact=True),
                              {"abs_qk": np.matmul(np.abs(Q.astype(F64)),
                                                   np.swapaxes(np.abs(kt.astype(F64)), -1, -2)),
                               "d": float(D)}))
        tanh_t = None
        if has_softcap:
            S64 = np.asarray(S, F64)
            if "softcap" in exact:
                tanh_t = np.tanh(S64 * float(scale32) / float(softcap))
                S = float(softcap) * tanh_t
            else:
                sc = _mul(S, np.array(scale32)) if np.asarray(S).dtype == F32 else _rn32(S64 * float(scale32))
                t = _div(sc, np.array(F32(softcap)))
                tanh_t = mf.tanh(t)
                S = _mul(np.array(F32(softcap)), tanh_t)
        allowed = cols[None, :] < Sk
        ri = rows[:, None]
        if is_causal or wr is not None:
            allowed = allowed & (cols[None, :] <= ri + offset + (0 if is_causal else wr))
        if wl is not None:
            allowed = allowed & (cols[None, :] >= ri + offset - wl)
        allowed = allowed[None, None] if keep_p is None else allowed & keep_p[..., nb * tile_n:(nb + 1) * tile_n]
        S = np.where(allowed, S, np.array(-np.inf, np.asarray(S).dtype))
        # P = ex2(fma(S, c, -lse_log2))
        S64 = np.asarray(S, F64)
        with np.errstate(invalid="ignore", over="ignore"):
            x_ex = S64 * c_true - np.asarray(lse_arr, F64)[..., None] * LOG2_E
        if "bwd_exp_arg" in exact:
            x = np.where(np.isneginf(S64), -np.inf, x_ex)
        else:
            x = _fma(S, np.array(c), -np.asarray(lse_log2)[..., None])
            if probe:
                fin = np.isfinite(x_ex)
                probe(StageSample("bwd_exp_arg", x, np.where(fin, x_ex, 0.0),
                                  {"abs_sc": np.abs(S64 * c_true),
                                   "abs_lse2": np.abs(np.asarray(lse_arr, F64) * LOG2_E)[..., None],
                                   "abs_x": np.abs(x_ex)}, where=fin))
        with np.errstate(over="ignore", invalid="ignore"):
            if "bwd_exp2" in exact:
                P = np.exp2(np.asarray(x, F64))
            else:
                P = mf.ex2(x)
                if probe:
                    x64 = np.asarray(x, F64)
                    probe(StageSample("bwd_exp2", P, np.exp2(x64), {"p_exact": np.exp2(x64)},
                                      where=np.isfinite(x64)))
        with np.errstate(invalid="ignore"):
            p_max = np.fmax(p_max, np.fmax.reduce(np.asarray(P, F32), axis=-1))
        if "bwd_p_cast" in exact:
            Pc = P
        else:
            Pc = cast_to(P, dt)
            if probe:
                probe(StageSample("bwd_p_cast", Pc, np.asarray(P, F64),
                                  {"p": np.abs(np.asarray(P, F64))}))
        dP = mma(dO, vt, None, accumulation, exact="dp_accum" in exact)
        if probe and "dp_accum" not in exact:
            probe(StageSample("dp_accum", dP, mma(dO, vt, None, accumulation, exact=True),
                              {"abs_dov": np.matmul(np.abs(dO.astype(F64)),
                                                    np.swapaxes(np.abs(vt.astype(F64)), -1, -2)),
                               "dv": float(Dv)}))
        Dn = np.asarray(Dpre)[..., None]
        with np.errstate(invalid="ignore", over="ignore"):
            ds_ex = np.asarray(P, F64) * (np.asarray(dP, F64) - np.asarray(Dn, F64))
            if "ds" in exact:
                dS = ds_ex
            else:
                dS = _mul(P, _sub(dP, Dn))
                if probe:
                    probe(StageSample("ds", dS, ds_ex, {"abs_ds": np.abs(ds_ex)},
                                      where=np.isfinite(ds_ex)))
            if has_softcap:
                tt = np.asarray(tanh_t, F64)
                if "softcap" in exact:
                    dS = np.asarray(dS, F64) * (1.0 - tt * tt)
                else:
                    tt32 = np.asarray(tanh_t)
                    dS = _mul(dS, _sub(np.array(F32(1.0)), _mul(tt32, tt32)))
            dS = np.where(allowed, dS, np.zeros((), np.asarray(dS).dtype))
        if "ds_cast" in exact:
            dSc = dS
        else:
            dSc = cast_to(dS, dt)
            if probe:
                probe(StageSample("ds_cast", dSc, np.asarray(dS, F64),
                                  {"abs_ds": np.abs(np.asarray(dS, F64))}))
        # dV, dK: one MMA per tile_m rows, ascending m_block
        sl = slice(nb * tile_n, (nb + 1) * tile_n)
        if accumulation == "exact-then-round":
            # vectorised: every m-block's exact partial in one batched product, then the
            # sequence of fp32 roundings acc = RN(acc + partial_m) in m-block order
            for name, A_, B_, acc_name in (("dv_accum", Pc, dO, "v"), ("dk_accum", dSc, Q, "k")):
                acc = dV_acc if acc_name == "v" else dK_acc
                new_acc = _acc_blocks(acc[:, :, sl], A_, B_, tile_m, name in exact,
                                      probe if name not in exact else None, name,
                                      "sum_abs_dv" if acc_name == "v" else "sum_abs_dk")
                if new_acc.dtype == F64 and acc.dtype == F32:
                    acc = acc.astype(F64)
                acc[:, :, sl] = new_acc
                if acc_name == "v":
                    dV_acc = acc
                else:
                    dK_acc = acc
        else:
            for mbk in range(mblocks):
                r0, r1 = mbk * tile_m, min((mbk + 1) * tile_m, Sq)
                pT = np.swapaxes(Pc[:, :, r0:r1], -1, -2)
                dsT = np.swapaxes(dSc[:, :, r0:r1], -1, -2)
                doT = np.swapaxes(dO[:, :, r0:r1], -1, -2)
                qT = np.swapaxes(Q[:, :, r0:r1], -1, -2)
                new_v = mma(pT, doT, dV_acc[:, :, sl], accumulation, exact="dv_accum" in exact)
                new_k = mma(dsT, qT, dK_acc[:, :, sl], accumulation, exact="dk_accum" in exact)
                if probe:
                    if "dv_accum" not in exact:
                        probe(StageSample("dv_accum", new_v, mma(pT, doT, dV_acc[:, :, sl], "", exact=True),
                                          {"sum_abs_dv": np.abs(np.asarray(dV_acc[:, :, sl], F64))
                                           + np.matmul(np.abs(np.asarray(pT, F64)), np.abs(doT.astype(F64)).swapaxes(-1, -2)),
                                           "n_acc": float(r1 - r0 + 1)}))
                    if "dk_accum" not in exact:
                        probe(StageSample("dk_accum", new_k, mma(dsT, qT, dK_acc[:, :, sl], "", exact=True),
                                          {"sum_abs_dk": np.abs(np.asarray(dK_acc[:, :, sl], F64))
                                           + np.matmul(np.abs(np.asarray(dsT, F64)), np.abs(qT.astype(F64)).swapaxes(-1, -2)),
                                           "n_acc": float(r1 - r0 + 1)}))
                if new_v.dtype == F64 and dV_acc.dtype == F32:
                    dV_acc = dV_acc.astype(F64)
                if new_k.dtype == F64 and dK_acc.dtype == F32:
                    dK_acc = dK_acc.astype(F64)
                dV_acc[:, :, sl] = new_v
                dK_acc[:, :, sl] = new_k
        # dQ partial (one MMA over the tile's keys), then the fp32 reduce-add
        ktT = np.swapaxes(kt, -1, -2)
        part = mma(dSc, ktT, None, accumulation, exact=dq_ex)
        if dq_ex:
            dq_acc = dq_acc + np.asarray(part, F64)
        else:
            new = _add(dq_acc, part)
            if probe:
                ex = np.asarray(dq_acc, F64) + mma(dSc, ktT, None, "", exact=True)
                probe(StageSample("dq_accum", new, ex,
                                  {"sum_abs_dq": np.abs(np.asarray(dq_acc, F64))
                                   + np.matmul(np.abs(np.asarray(dSc, F64)), np.abs(kt.astype(F64))),
                                   "n_acc": float(tile_n + 1)}))
            dq_acc = new
    # ---- postprocess / epilogues
    sc_arr = np.array(scale32)
    if "dq_post" in exact:
        dq_s = np.asarray(dq_acc, F64) * float(scale32)
    else:
        dq_s = _mul(dq_acc, sc_arr)
    dq = dq_s if "grad_cast" in exact else cast_to(dq_s, dt)
    dK_acc = dK_acc[:, :, :Sk]
    dV_acc = dV_acc[:, :, :Sk]
    if rep > 1:   # GQA: fp32 dk/dv_accum, heads of a group added in head order
        def group(a):
            a = a.reshape(B, Hk, rep, *a.shape[2:])
            acc = a[:, :, 0]
            for r in range(1, rep):
                acc = _add(acc, a[:, :, r]) if acc.dtype == F32 and a.dtype == F32 else \
                    np.asarray(acc, F64) + np.asarray(a[:, :, r], F64)
            return acc
        dK_acc, dV_acc = group(dK_acc), group(dV_acc)
    if "dk_post" in exact:
        dk_s = np.asarray(dK_acc, F64) * float(scale32)
    else:
        dk_s = _mul(dK_acc, sc_arr)
    dk = dk_s if "grad_cast" in exact else cast_to(dk_s, dt)
    dv = dV_acc if "grad_cast" in exact else cast_to(dV_acc, dt)
    stages = {"D": Dpre, "lse_log2": lse_log2, "dq_accum": dq_acc, "dq_order": tuple(order),
              "p_max_bwd": p_max, "tile_m": tile_m, "tile_n": tile_n}
    cfg = dict(arch=arch, dtype=dt, tile_m=tile_m, tile_n=tile_n, deterministic=deterministic,
               accumulation=accumulation, mufu=mufu, seed=seed, exact_stages=exact,
               mutations=muts, scale_log2=float(c))
    return TwinBackwardResult(dq=np.ascontiguousarray(np.swapaxes(dq, 1, 2)),
                              dk=np.ascontiguousarray(np.swapaxes(dk, 1, 2)),
                              dv=np.ascontiguousarray(np.swapaxes(dv, 1, 2)),
                              stages=stages, config=cfg)
