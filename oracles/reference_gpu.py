"""Streamed float64 attention reference with an a-priori error bound, on any torch device.

For long contexts (32k-128k keys) the certified CPU reference (:mod:`oracles.reference`) is too
slow; this module evaluates the same function (:mod:`oracles.semantics`: dense batches, causal
or not, GQA/MQA; no window, softcap, sink or mask_mod) in float64 on a torch device (CUDA on
the H200, CPU in the tests), blocked over query rows and keys so that no (seqlen_q, seqlen_k)
matrix ever exists: at most ``(nheads, block_q, block_k)`` per temporary.

>>> import torch
>>> from fa4verify.oracles import reference_gpu as rg
>>> g = torch.Generator().manual_seed(0)
>>> q, k, v = (torch.randn(1, 64, 2, 16, generator=g).bfloat16() for _ in range(3))
>>> f = rg.forward(q, k, v, causal=True, block=32)
>>> tuple(f.out.shape), tuple(f.lse.shape), bool((f.bound <= 1e-12).all())
((1, 64, 2, 16), (1, 2, 64), True)

Every bound is a priori: it follows from float64's unit roundoff and the stated accuracy of
torch's float64 ``exp``/``log``, and needs no exact arithmetic. Derivation: Note [Streamed
oracle error model] below (and ``error_budgets/DERIVATIONS.md#streamed-oracle``).

Note [Streamed oracle error model]
----------------------------------
``u = 2^-53``; ``gamma_n = n u / (1 - n u)`` bounds any float64 dot product / sum of ``n`` terms
in any order, with or without FMA and however split over blocks (Higham, ch. 3: a summation tree
of height <= n - 1); inputs are bf16/fp16 values, exact in float64. ``EPS_F`` = 4 ulp relative
(``2^-50``) is the assumed error of torch's float64 ``exp`` and ``log`` for normal results
(CUDA's math library documents 1 ulp for both, torch's CPU kernels are SLEEF / libm with <= 1
ulp); ``tests/test_oracle_gpu_reference.py`` measures the device's exp/log against mpmath and
fails if the assumption is wrong. Per query row ``i`` (head index dropped), visible keys ``j``
(``n_k`` of them):

1. ``s_ij = fl(scale * fl(q_i . k_j))``: ``|s^ - s| <= gamma_D scale A_ij + u |s^|`` with
   ``A_ij = |q_i| . |k_j|``; row constant ``e_s = gamma_D scale max_j A_ij + u max_j |s^_ij|``.
2. Two passes over the keys: pass 1 takes ``m = max_j s^_ij`` (an exact float64 shift that cancels
   in softmax), pass 2 ``t = fl(s^ - m)`` (rounding ``u |t|``), ``p^ = exp(t)``. The exponent
   argument error is ``Delta <= e_s + u max_j |t_ij|``, so ``|p^ - p| <= rho p + TAU`` with
   ``rho = (1 + EPS_F) expm1(Delta) + EPS_F`` and ``TAU = 2^-1060`` for underflow
   (``p = exp(s - m)``, the exact values).
3. ``l = sum_j p^``: ``|l^ - l| <= E_l = ((1 + rho)(1 + gamma_nk) - 1) l^ / (1 - rho_l) + n_k TAU``.
   ``N_d = sum_j p^_j V_jd``: ``|N^ - N| <= E_N = ((1 + rho)(1 + gamma_nk) - 1) (1 + 2 rho_a)
   sum_j p^ |V_jd| + n_k TAU max|V|``.
4. ``O = fl(N^ / l^)``: ``|O^ - O| <= E_N / l^ + (|N^| + E_N) / l^ * E_l / (l^ - E_l) + u |O^|``.
   ``LSE = fl(m + fl(log l^))``: ``|LSE^ - LSE| <= E_l / (l^ - E_l) + EPS_F |log l^| + u |LSE^|``.
5. Backward (the exact gradient: D from the exact O, Note [Which O enters D] in
   :mod:`oracles.attention`): ``P^ = exp(fl(s^ - LSE^))`` with argument error ``e_s + beta +
   u |t|`` (``beta`` the LSE bound) -> relative ``rho_P``; ``dP = fl(dO_i . V_j)``:
   ``gamma_Dv (|dO||V|)_ij``; ``D^ = fl(sum_d O^ dO)``: ``eps_D = sum_d bound_O |dO| + gamma_Dv
   sum_d |O^||dO|``; ``G = fl(dP^ - D^)``, ``dS^ = fl(P^ G)``:
   ``|dS^ - dS| <= E_ij = P^ / (1 - rho_P) [(rho_P + 2u) |G| + gamma_Dv (|dO||V|)_ij + eps_D]
   + TAU (|G| + (|dO||V|)_ij + eps_D)``.
   ``dQ = fl(scale fl(dS^ K))``: ``scale (E |K| + gamma_nk |dS^| |K|) (1 + u) + u |dQ^|``;
   ``dK`` the same with ``Q`` and ``gamma_nq`` (plus ``gamma_g`` sum |dK_h| for summing a GQA
   group's heads); ``dV = fl(P^T dO)``: ``(rho_P/(1 - rho_P) + gamma_nq) P^T |dO| + n_q TAU
   max|dO|`` (``rho_P`` its per-head maximum over rows for the key-side sums).
6. Every bound is the first-order expression times ``SAFETY = 1 + 2^-20``, which covers the
   second-order terms and the bound arithmetic's own rounding as long as every relative term
   (``rho``, ``rho_P``, ``gamma_n``) is below ``RHO_MAX = 2^-24``; where one is not (|logits|
   ~ 2^29, or non-finite inputs), the bound is ``+inf``: the judge then reports *undecided*.

Accuracy
--------
On random bf16 inputs the output bound is ~1e-14 relative to ``sum_j P |V|`` at seqlen 4096
(gamma_n grows linearly in n: ~2e-12 at 131072), i.e. 10^8-10^10 times below the bf16
budgets. Where it is looser than :mod:`oracles.reference`: no exactness certificate for
``q . k`` (so ``gamma_D`` always), plain ``gamma_n`` instead of blocked summation.

Possible issues
---------------
The gamma bounds assume the device GEMM computes each dot product by *some* ordering of fp64
multiply-adds (cuBLAS DGEMM and CPU BLAS do; a Strassen-like or reduced-precision GEMM would
void the bound: TF32 never applies to float64). The exp/log assumption is tested on the
device the tests run on.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

__all__ = ["U", "EPS_F", "TAU", "SAFETY", "RHO_MAX", "StreamedForward", "StreamedBackward",
           "TileObserver", "forward", "backward", "gamma"]

U = 2.0 ** -53
EPS_F = 4 * 2.0 ** -52      #: assumed float64 exp/log error: 4 ulp, relative
TAU = 2.0 ** -1060          #: absolute error of an exp that underflows
SAFETY = 1.0 + 2.0 ** -20   #: covers second-order terms and the bound arithmetic (item 6)
RHO_MAX = 2.0 ** -24        #: relative terms above this make the bound +inf (undecided)


def gamma(n: float) -> float:
    """Higham's gamma_n for float64 (+inf where n u >= 1)."""
    nu = float(n) * U
    return nu / (1 - nu) if nu < 1 else math.inf


class TileObserver(Protocol):
    """Receives the backward's tiles (used by the judge's streamed statistics; the oracle does
    not depend on what it does). Tensors are float64, (nheads, rows, keys) unless noted; masked
    elements of ``p`` are 0 and of ``keep`` False."""

    def backward_tile(self, b: int, r0: int, r1: int, c0: int, c1: int, *, p: Any, g: Any,
                      dov: Any, keep: Any) -> None: ...


@dataclass
class StreamedForward:
    """Forward result (torch float64 on the computing device), FA4 layouts: ``out`` (b, sq, h,
    dv), ``lse`` (b, h, sq); ``bound`` / ``lse_bound`` elementwise absolute bounds (+inf: not
    certified). ``rows`` holds per-row by-products in (b, h, sq): ``m`` (row max of the
    computed logits), ``l`` (row sum at that shift), ``amax`` (max_j scale |q||k|), ``smax``
    (max_j |s_ij|), ``e_s`` (logit error constant); ``pav`` (b, sq, h, dv) = sum_j w_ij |V_jd|
    (exact softmax weights w, computed)."""

    out: Any
    lse: Any
    bound: Any
    lse_bound: Any
    rows: dict = field(default_factory=dict)
    pav: Any = None
    softmax_scale: float = 0.0
    causal: bool = False


@dataclass
class StreamedBackward:
    """Backward result (torch float64), FA4 layouts, each with an elementwise absolute bound;
    ``d`` = rowsum(dO * O) (b, h, sq) with the oracle's O; ``forward`` the forward it used."""

    dq: Any
    dk: Any
    dv: Any
    dq_bound: Any
    dk_bound: Any
    dv_bound: Any
    d: Any
    d_bound: Any
    forward: StreamedForward
    #: by-products (the judge's statistics): ``dsk_abs`` (b, sq, h, d) = scale sum_j |dS||K|,
    #: ``dsq_abs`` (b, sk, hk, d) = scale sum_i |dS||Q|, ``pdo_abs`` (b, sk, hk, dv) = sum_i P |dO|
    aux: dict = field(default_factory=dict)


def _torch():
    import torch
    return torch


def _check(q, k, v, causal: bool):
    torch = _torch()
    for n, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            raise ValueError(f"{n}: expected a 4-d torch tensor (batch, seqlen, heads, dim)")
    b, sq, h, d = q.shape
    bk, sk, hk, dk = k.shape
    if bk != b or tuple(v.shape[:3]) != (b, sk, hk) or dk != d:
        raise ValueError(f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not match")
    if hk == 0 or h % hk:
        raise ValueError(f"nheads {h} is not a multiple of nheads_kv {hk}")
    return b, sq, sk, h, hk, d, v.shape[-1]


def _key_end(causal: bool, sq: int, sk: int, r1: int) -> int:
    """Keys [0, end) cover every key visible to rows [.., r1) (FA4's bottom-right causal)."""
    if not causal:
        return sk
    return max(0, min(sk, r1 - 1 + (sk - sq) + 1))


def _keep(causal: bool, sq: int, sk: int, r0: int, r1: int, c0: int, c1: int, device):
    torch = _torch()
    if not causal or c1 - 1 <= r0 + (sk - sq):     # the whole tile is visible
        return None
    i = torch.arange(r0, r1, device=device)[:, None]
    j = torch.arange(c0, c1, device=device)[None, :]
    return j <= i + (sk - sq)


def _n_visible(causal: bool, sq: int, sk: int, device):
    """Visible keys per query row, (sq,) float64."""
    torch = _torch()
    i = torch.arange(sq, device=device, dtype=torch.float64)
    if not causal:
        return torch.full((sq,), float(sk), device=device, dtype=torch.float64)
    return torch.clamp(i + (sk - sq) + 1, 0, sk)


def _heads(x, h: int):
    """(s, hk, d) -> (h, s, d) float64, GQA heads repeated."""
    x = x.to(_torch().float64).permute(1, 0, 2)
    g = h // x.shape[0]
    return x.repeat_interleave(g, dim=0) if g > 1 else x


def forward(q, k, v, *, softmax_scale: Optional[float] = None, causal: bool = False,
            block: int = 1024, block_k: Optional[int] = None) -> StreamedForward:
    """Attention forward in float64 with the a-priori bound (Note [Streamed oracle error
    model]); ``q, k, v`` torch tensors (b, s, h, d) of exact bf16/fp16/fp32 values on any
    device; computed where they live. ``block`` query rows and ``block_k`` keys per tile."""
    torch = _torch()
    b, sq, sk, H, Hk, D, Dv = _check(q, k, v, causal)
    scale = 1.0 / math.sqrt(D) if softmax_scale is None else float(softmax_scale)
    bk_ = block_k or block
    dev = q.device
    f64 = torch.float64
    out = torch.zeros((b, sq, H, Dv), dtype=f64, device=dev)
    bound = torch.zeros_like(out)
    pav_all = torch.zeros_like(out)
    lse = torch.full((b, H, sq), -math.inf, dtype=f64, device=dev)
    lse_bound = torch.zeros((b, H, sq), dtype=f64, device=dev)
    rows = {n: torch.zeros((b, H, sq), dtype=f64, device=dev) for n in ("m", "l", "amax", "smax", "e_s", "tmax")}
    gD = gamma(D)
    nvis = _n_visible(causal, sq, sk, dev)
    for bi in range(b):
        Q, K, V = _heads(q[bi], H), _heads(k[bi], H), _heads(v[bi], H)
        aQ, aK, aV = Q.abs(), K.abs(), V.abs()
        vmax = aV.amax(dim=1, keepdim=True) if sk else torch.zeros((H, 1, Dv), dtype=f64, device=dev)
        for r0 in range(0, sq, block):
            r1 = min(sq, r0 + block)
            ce = _key_end(causal, sq, sk, r1)
            nr = r1 - r0
            m = torch.full((H, nr), -math.inf, dtype=f64, device=dev)
            amax = torch.zeros((H, nr), dtype=f64, device=dev)
            smax = torch.zeros((H, nr), dtype=f64, device=dev)
            # pass 1: row maxima of the computed logits, of scale |q||k| and of |s|
            for c0 in range(0, ce, bk_):
                c1 = min(ce, c0 + bk_)
                S = torch.matmul(Q[:, r0:r1], K[:, c0:c1].transpose(1, 2)) * scale
                A = torch.matmul(aQ[:, r0:r1], aK[:, c0:c1].transpose(1, 2)) * scale
                kp = _keep(causal, sq, sk, r0, r1, c0, c1, dev)
                if kp is not None:
                    S = S.masked_fill(~kp, -math.inf)
                    A = A.masked_fill(~kp, 0.0)
                m = torch.maximum(m, S.amax(dim=2))
                amax = torch.maximum(amax, A.amax(dim=2))
                smax = torch.maximum(smax, torch.where(torch.isfinite(S), S.abs(), torch.zeros_like(S)).amax(dim=2))
            has = torch.isfinite(m)
            msh = torch.where(has, m, torch.zeros_like(m))
            l = torch.zeros((H, nr), dtype=f64, device=dev)
            N = torch.zeros((H, nr, Dv), dtype=f64, device=dev)
            Pv = torch.zeros((H, nr, Dv), dtype=f64, device=dev)
            tmax = torch.zeros((H, nr), dtype=f64, device=dev)
            # pass 2: p = exp(s - m), row sums and P V, P |V|
            for c0 in range(0, ce, bk_):
                c1 = min(ce, c0 + bk_)
                S = torch.matmul(Q[:, r0:r1], K[:, c0:c1].transpose(1, 2)) * scale
                T = S - msh[:, :, None]
                kp = _keep(causal, sq, sk, r0, r1, c0, c1, dev)
                if kp is not None:
                    T = T.masked_fill(~kp, -math.inf)
                P = torch.exp(T)
                tmax = torch.maximum(tmax, torch.where(torch.isfinite(T), T.abs(), torch.zeros_like(T)).amax(dim=2))
                l += P.sum(dim=2)
                N += torch.matmul(P, V[:, c0:c1])
                Pv += torch.matmul(P, aV[:, c0:c1])
            nk = nvis[r0:r1][None, :]
            e_s = gD * amax + U * smax
            delta = e_s + U * tmax
            rho = (1 + EPS_F) * torch.expm1(delta) + EPS_F
            gk = nk * U / (1 - nk * U)
            rho_l = (1 + rho) * (1 + gk) - 1
            E_l = rho_l * l / (1 - rho_l) + nk * TAU
            E_N = (rho_l * (1 + 2 * rho_l))[:, :, None] * Pv + (nk * TAU)[:, :, None] * vmax
            lpos = torch.where(has, l, torch.ones_like(l))
            O = N / lpos[:, :, None]
            O = torch.where(has[:, :, None], O, torch.zeros_like(O))
            ratio = (E_l / (lpos - E_l))[:, :, None]
            bO = SAFETY * (E_N / lpos[:, :, None] + (N.abs() + E_N) / lpos[:, :, None] * ratio + U * O.abs())
            logl = torch.log(lpos)
            L = torch.where(has, msh + logl, torch.full_like(m, -math.inf))
            bL = SAFETY * (E_l / (lpos - E_l) + EPS_F * logl.abs() + U * L.abs())
            bL = torch.where(has, bL, torch.zeros_like(bL))
            bad = ~((rho_l <= RHO_MAX) & torch.isfinite(bO).all(dim=2) & torch.isfinite(bL)) & has
            bO = torch.where(bad[:, :, None], torch.full_like(bO, math.inf), bO)
            bL = torch.where(bad, torch.full_like(bL, math.inf), bL)
            bO = torch.where(torch.isnan(bO), torch.full_like(bO, math.inf), bO)
            out[bi, r0:r1] = O.permute(1, 0, 2)
            bound[bi, r0:r1] = bO.permute(1, 0, 2)
            pav_all[bi, r0:r1] = (Pv / lpos[:, :, None]).permute(1, 0, 2)
            lse[bi, :, r0:r1] = L
            lse_bound[bi, :, r0:r1] = bL
            for n, x in (("m", m), ("l", l), ("amax", amax), ("smax", smax), ("e_s", e_s), ("tmax", tmax)):
                rows[n][bi, :, r0:r1] = x
    return StreamedForward(out, lse, bound, lse_bound, rows, pav_all, scale, bool(causal))


def backward(q, k, v, dout, *, softmax_scale: Optional[float] = None, causal: bool = False,
             block: int = 1024, block_k: Optional[int] = None, fwd: Optional[StreamedForward] = None,
             observer: Optional[TileObserver] = None) -> StreamedBackward:
    """The exact gradient (D from the oracle's own O) in float64 with the a-priori bound (Note
    [Streamed oracle error model], item 5). ``fwd``: a :func:`forward` of the same inputs
    (computed if None). ``observer.backward_tile`` sees every tile (the judge's statistics)."""
    torch = _torch()
    b, sq, sk, H, Hk, D, Dv = _check(q, k, v, causal)
    g = H // Hk
    if fwd is None:
        fwd = forward(q, k, v, softmax_scale=softmax_scale, causal=causal, block=block, block_k=block_k)
    scale = fwd.softmax_scale
    bk_ = block_k or block
    dev = q.device
    f64 = torch.float64
    gDv = gamma(Dv)
    dq = torch.zeros((b, sq, H, D), dtype=f64, device=dev)
    dq_b = torch.zeros_like(dq)
    dk = torch.zeros((b, sk, Hk, D), dtype=f64, device=dev)
    dk_b = torch.zeros_like(dk)
    dv = torch.zeros((b, sk, Hk, Dv), dtype=f64, device=dev)
    dv_b = torch.zeros_like(dv)
    dd = torch.zeros((b, H, sq), dtype=f64, device=dev)
    dd_b = torch.zeros_like(dd)
    aux = {"dsk_abs": torch.zeros_like(dq), "dsq_abs": torch.zeros_like(dk), "pdo_abs": torch.zeros_like(dv)}
    nvis = _n_visible(causal, sq, sk, dev)
    # queries that see key j: rows i >= j - (sk - sq) (causal)
    jj = torch.arange(sk, device=dev, dtype=f64)
    nq_vis = torch.clamp(sq - torch.clamp(jj - (sk - sq), min=0), 0, sq) if causal else torch.full((sk,), float(sq), dtype=f64, device=dev)
    for bi in range(b):
        Q, K, V = _heads(q[bi], H), _heads(k[bi], H), _heads(v[bi], H)
        dO = _heads(dout[bi], H)
        aQ, aK, aV, adO = Q.abs(), K.abs(), V.abs(), dO.abs()
        O = fwd.out[bi].permute(1, 0, 2)
        bO = fwd.bound[bi].permute(1, 0, 2)
        L = fwd.lse[bi]
        bL = fwd.lse_bound[bi]
        e_s = fwd.rows["e_s"][bi]
        Dh = (O * dO).sum(dim=2)
        eD = (bO * adO).sum(dim=2) + gDv * (O.abs() * adO).sum(dim=2)
        dd[bi] = Dh
        dd_b[bi] = SAFETY * (eD + U * Dh.abs())
        has = torch.isfinite(L)
        Lsh = torch.where(has, L, torch.zeros_like(L))
        # |fl(s - LSE)| <= (|s - m| + |m - LSE|)(1 + u): the forward's max |s - m| and its LSE
        # give the row maximum without another pass over the keys (the (1 + u) is in SAFETY)
        m_f = fwd.rows["m"][bi]
        t2max = fwd.rows["tmax"][bi] + torch.where(has & torch.isfinite(m_f), (L - m_f).abs(), torch.zeros_like(L))
        rhoP = (1 + EPS_F) * torch.expm1(e_s + bL + U * t2max) + EPS_F
        rhoP = torch.where(has, rhoP, torch.zeros_like(rhoP))
        rhoP_h = rhoP.amax(dim=1) if sq else torch.zeros((H,), dtype=f64, device=dev)   # (H,)
        dQ = torch.zeros((H, sq, D), dtype=f64, device=dev)
        EQ = torch.zeros_like(dQ)
        AQ = torch.zeros_like(dQ)
        dKh = torch.zeros((H, sk, D), dtype=f64, device=dev)
        EK = torch.zeros_like(dKh)
        AK = torch.zeros_like(dKh)
        dVh = torch.zeros((H, sk, Dv), dtype=f64, device=dev)
        PdO = torch.zeros_like(dVh)
        for r0 in range(0, sq, block):
            r1 = min(sq, r0 + block)
            ce = _key_end(causal, sq, sk, r1)
            rp = rhoP[:, r0:r1, None]
            ed = eD[:, r0:r1, None]
            for c0 in range(0, ce, bk_):
                c1 = min(ce, c0 + bk_)
                T = torch.matmul(Q[:, r0:r1], K[:, c0:c1].transpose(1, 2)) * scale - Lsh[:, r0:r1, None]
                kp = _keep(causal, sq, sk, r0, r1, c0, c1, dev)
                if kp is not None:
                    T = T.masked_fill(~kp, -math.inf)
                P = torch.exp(T)
                P = torch.where(has[:, r0:r1, None], P, torch.zeros_like(P))
                dP = torch.matmul(dO[:, r0:r1], V[:, c0:c1].transpose(1, 2))
                DOV = torch.matmul(adO[:, r0:r1], aV[:, c0:c1].transpose(1, 2))
                G = dP - Dh[:, r0:r1, None]
                if kp is not None:
                    G = G.masked_fill(~kp, 0.0)
                    DOVm = DOV.masked_fill(~kp, 0.0)
                else:
                    DOVm = DOV
                dS = P * G
                aG = G.abs()
                E = P / (1 - rp) * ((rp + 2 * U) * aG + gDv * DOVm + ed) + TAU * (aG + DOVm + ed)
                if kp is not None:
                    E = E.masked_fill(~kp, 0.0)
                adS = dS.abs()
                dQ[:, r0:r1] += torch.matmul(dS, K[:, c0:c1])
                EQ[:, r0:r1] += torch.matmul(E, aK[:, c0:c1])
                AQ[:, r0:r1] += torch.matmul(adS, aK[:, c0:c1])
                dSt, Et, adSt, Pt = dS.transpose(1, 2), E.transpose(1, 2), adS.transpose(1, 2), P.transpose(1, 2)
                dKh[:, c0:c1] += torch.matmul(dSt, Q[:, r0:r1])
                EK[:, c0:c1] += torch.matmul(Et, aQ[:, r0:r1])
                AK[:, c0:c1] += torch.matmul(adSt, aQ[:, r0:r1])
                dVh[:, c0:c1] += torch.matmul(Pt, dO[:, r0:r1])
                PdO[:, c0:c1] += torch.matmul(Pt, adO[:, r0:r1])
                if observer is not None:
                    observer.backward_tile(bi, r0, r1, c0, c1, p=P, g=G, dov=DOVm, keep=kp)
        gk = (nvis * U / (1 - nvis * U))[None, :, None]
        gq = (nq_vis * U / (1 - nq_vis * U))[None, :, None]
        dQs = dQ * scale
        bq = SAFETY * (scale * (EQ + gk * AQ) * (1 + U) + U * dQs.abs())
        dKs = dKh * scale
        bk = SAFETY * (scale * (EK + gq * AK) * (1 + U) + U * dKs.abs())
        rph = rhoP_h[:, None, None]
        bv = SAFETY * ((rph / (1 - rph) + gq) * PdO + (nq_vis[None, :, None] * TAU) * adO.amax(dim=1, keepdim=True))
        # GQA: a kv head's gradient is the sum of its g query heads' (g - 1 more additions)
        dKg = dKs.reshape(Hk, g, sk, D)
        dVg = dVh.reshape(Hk, g, sk, Dv)
        gg = gamma(g - 1) if g > 1 else 0.0
        dK_ = dKg.sum(dim=1)
        dV_ = dVg.sum(dim=1)
        bK_ = SAFETY * (bk.reshape(Hk, g, sk, D).sum(dim=1) + gg * dKg.abs().sum(dim=1))
        bV_ = SAFETY * (bv.reshape(Hk, g, sk, Dv).sum(dim=1) + gg * dVg.abs().sum(dim=1))
        relbad = (rhoP_h > RHO_MAX) | ~torch.isfinite(rhoP_h)            # (H,)
        rowbad = ((rhoP > RHO_MAX) | ~torch.isfinite(rhoP)) & has         # (H, sq)
        rowbad = rowbad | (~torch.isfinite(bO).all(dim=2) & has)
        bq = torch.where(rowbad[:, :, None], torch.full_like(bq, math.inf), bq)
        kvbad = relbad.reshape(Hk, g).any(dim=1) | (rowbad.reshape(Hk, g, sq).any(dim=(1, 2)))
        bK_ = torch.where(kvbad[:, None, None], torch.full_like(bK_, math.inf), bK_)
        bV_ = torch.where(kvbad[:, None, None], torch.full_like(bV_, math.inf), bV_)
        dq[bi] = dQs.permute(1, 0, 2)
        dq_b[bi] = torch.nan_to_num(bq, nan=math.inf).permute(1, 0, 2)
        dk[bi] = dK_.permute(1, 0, 2)
        dk_b[bi] = torch.nan_to_num(bK_, nan=math.inf).permute(1, 0, 2)
        dv[bi] = dV_.permute(1, 0, 2)
        dv_b[bi] = torch.nan_to_num(bV_, nan=math.inf).permute(1, 0, 2)
        aux["dsk_abs"][bi] = (AQ * scale).permute(1, 0, 2)
        aux["dsq_abs"][bi] = (AK * scale).reshape(Hk, g, sk, D).sum(dim=1).permute(1, 0, 2)
        aux["pdo_abs"][bi] = PdO.reshape(Hk, g, sk, Dv).sum(dim=1).permute(1, 0, 2)
    return StreamedBackward(dq, dk, dv, dq_b, dk_b, dv_b, dd, dd_b, fwd, aux)
