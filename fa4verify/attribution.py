"""Per-stage error attribution and budget checks for FA4's forward/backward (the judge's side).

Figures from this module come from the **CPU twin** (``fa4verify.kernels.twin_attention``) unless a
caller passes production outputs (``check_forward_outputs``: "measured on H200").

* :class:`StageRecorder` -- a ``stage_probe`` for the twin: every application of every stage is
  compared with its *local* budget (``[stage.*]`` in ``error_budgets/<dtype>_<arch>.toml``):
  ``|fa4 - exact(same inputs)| <= budget(stats)`` elementwise; tightness = max ratio.
* :func:`problem_stats` -- fp64 statistics for the *composed* end-to-end budgets
  (``forward_out``, ``forward_lse``, ``backward_dq/dk/dv``), see ``loader.STATISTICS``.
* :func:`check_forward` / :func:`check_backward` -- run the twin with the recorder, compare its
  outputs with the oracle (``fa4verify.oracles.attention``) under the composed budgets.
* :func:`attribute_forward` -- which stage dominates the forward error: for each stage, the
  error of the twin with *only that stage* as FA4 (all others exact: "isolated") and the drop in
  error when *only that stage* is made exact ("ablation").
* :func:`fwd_bwd_p_mismatch` -- the SM100 forward (emulated) vs backward (hardware) P mismatch
  and its effect on dQ, dK, dV.

Every comparison is ``(actual, reference)`` with errors relative to the reference side.

Possible issues: :func:`problem_stats` (and so the end-to-end checks here) covers dense problems
with causal/window masks, GQA/MQA, softcap and learnable sinks (forward) and bf16/fp16/fp8;
softcap/sinks in the backward and varlen are not covered by the composed statistics -- the twin
itself supports sinks and softcap everywhere (local stage budgets through the stage probe).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

F64 = np.float64
LOG2E = math.log2(math.e)

__all__ = ["StageTally", "StageRecorder", "problem_stats", "check_forward", "check_backward",
           "check_forward_outputs", "check_backward_outputs", "attribute_forward",
           "fwd_bwd_p_mismatch", "ForwardCheck", "BackwardCheck", "ATTRIBUTION_STAGES",
           "gen_inputs", "DISTRIBUTIONS"]

ATTRIBUTION_STAGES: tuple[str, ...] = (
    "s_accum", "exp_arg", "exp2", "exp2_emu", "p_cast", "row_sum", "rescale", "pv_accum",
    "rcp", "normalize", "o_cast", "lse",
)
DISTRIBUTIONS: tuple[str, ...] = ("normal", "outliers", "negative", "peaked")


# =========================================================================== inputs
def gen_inputs(dist: str, *, batch: int, seqlen_q: int, seqlen_k: int, nheads: int, hdim: int,
               dtype: str = "bf16", seed: int = 0, with_dout: bool = False):
    """Test inputs (b, s, h, d) rounded to ``dtype`` (values as float32):

    * ``normal``: N(0, 1).
    * ``outliers``: N(0,1) + N(0,100) * Bernoulli(0.001) (FA3 paper §4.3 / anchors.md A.8).
    * ``negative``: deeply negative scores (cuDNN-frontend #744): q ~ N(0,1) + 2, k ~ N(0,1) - 2
      so every score sits around -4 hdim (all P tiny relative to 2^-126 before the max shift).
    * ``peaked``: rows whose max grows by ~6-10 log2 units from KV block to KV block (near the
      SM100 rescale threshold 8): k's first coordinate ramps with the key index.
    """
    from fa4verify import binary32 as b32
    rng = np.random.default_rng(seed)
    cast = {"bf16": b32.to_bf16, "fp16": b32.to_fp16,
            "fp8_e4m3": lambda x: b32.to_fp8_e4m3fn(x), "fp8": lambda x: b32.to_fp8_e4m3fn(x)}[dtype]
    sq = (batch, seqlen_q, nheads, hdim)
    sk = (batch, seqlen_k, nheads, hdim)

    def nrm(s):
        return rng.standard_normal(s)
    if dist == "normal":
        q, k, v = nrm(sq), nrm(sk), nrm(sk)
    elif dist == "outliers":
        def o(s):
            return nrm(s) + rng.normal(0, 10.0, s) * (rng.random(s) < 0.001)   # sd 10: var 100
        q, k, v = o(sq), o(sk), o(sk)
    elif dist == "negative":
        q, k, v = nrm(sq) * 0.5 + 2.0, nrm(sk) * 0.5 - 2.0, nrm(sk)
    elif dist == "peaked":
        q = nrm(sq) * 0.1
        q[..., 0] = 4.0
        k = nrm(sk) * 0.1
        # ~ +7 log2 units per 128-key block along the visiting order (last block first)
        ramp = (np.arange(seqlen_k)[::-1] / 128.0) * 7.0 / (4.0 * math.log2(math.e) / math.sqrt(hdim))
        k[..., 0] = (ramp[None, :, None] + rng.random((batch, seqlen_k, nheads)) * 0.5) / 1.0
        v = nrm(sk)
    else:
        raise ValueError(f"unknown distribution {dist!r}; expected {DISTRIBUTIONS}")
    out = [cast(np.asarray(a, np.float32)).astype(np.float32) for a in (q, k, v)]
    if with_dout:
        out.append(cast(nrm((batch, seqlen_q, nheads, hdim)).astype(np.float32)).astype(np.float32))
    return tuple(out)


# =========================================================================== local stage checks
@dataclass
class StageTally:
    """Local budget results of one stage over all its applications in a run."""
    stage: str
    n: int = 0
    max_err: float = 0.0
    max_ratio: float = 0.0      #: max |fa4 - exact| / budget (tightness; <= 1 within budget)
    n_over: int = 0
    worst: str = ""
    no_budget: bool = False


class StageRecorder:
    """``stage_probe`` for the twin: tallies every stage application against its local budget.

    Non-finite handling: elements where the exact value is not finite or masked out by the
    sample's ``where`` are skipped; an as-FA4 NaN/inf where the exact value is finite counts as
    over budget (ratio inf).
    """

    def __init__(self, budgets):
        self.budgets = budgets
        self.tallies: dict[str, StageTally] = {}

    def __call__(self, sample) -> None:
        t = self.tallies.setdefault(sample.stage, StageTally(sample.stage))
        if sample.stage not in self.budgets:
            t.no_budget = True
            return
        fa4 = np.asarray(sample.fa4, F64)
        ex = np.asarray(sample.exact, F64)
        fa4, ex = np.broadcast_arrays(fa4, ex)
        ok = np.isfinite(ex)
        if sample.where is not None:
            ok = ok & np.broadcast_to(np.asarray(sample.where, bool), ok.shape)
        if not ok.any():
            return
        stats = {k: (np.broadcast_to(np.asarray(v, F64), fa4.shape) if np.ndim(v) else v)
                 for k, v in sample.stats.items()}
        with np.errstate(invalid="ignore", over="ignore"):
            bound = np.broadcast_to(np.asarray(self.budgets.evaluate(sample.stage, stats), F64),
                                    fa4.shape)
            err = np.abs(fa4 - ex)
            err = np.where(np.isfinite(fa4), err, np.inf)
            ratio = np.where(err == 0, 0.0, err / np.where(bound > 0, bound, 0.0))
        err, ratio, bound_s = err[ok], ratio[ok], bound[ok]
        t.n += int(err.size)
        t.max_err = max(t.max_err, float(err.max()))
        i = int(np.argmax(ratio))
        if ratio[i] > t.max_ratio:
            t.max_ratio = float(ratio[i])
            t.worst = f"err {err[i]:.3g} vs budget {bound_s[i]:.3g}"
        t.n_over += int((ratio > 1).sum())


# =========================================================================== statistics
def _bhsd(x) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x, F64).transpose(0, 2, 1, 3))


def _visible(Sq, Sk, causal, window):
    wl, wr = window if window is not None else (None, None)
    if causal:
        wr = 0
    i = np.arange(Sq)[:, None]
    j = np.arange(Sk)[None]
    ok = np.ones((Sq, Sk), bool)
    if wr is not None:
        ok &= j <= i + Sk - Sq + wr
    if wl is not None:
        ok &= j >= i + Sk - Sq - wl
    return ok


def problem_stats(q, k, v, *, arch: str, dtype: str, softmax_scale: float | None = None,
                  causal: bool = False, window_size=(None, None), lse_true=None, o_true=None,
                  tile_n: int = 128, dout=None, fwd_budgets=None, row_chunk: int = 512,
                  rescale_threshold: float | None = None, max_offset: float | None = None,
                  softcap: float = 0.0, learnable_sink=None):
    """fp64 statistics of a dense problem for the composed budgets (``loader.STATISTICS``).

    Layout: (b, h, s, d) -- per-row statistics (b, h, s, 1), per-element (b, h, s, dv), dk/dv-like
    (b, hk, sk, d).  ``lse_true`` (b, h, sq) and ``o_true`` (b, sq, h, dv) come from the oracle
    (computed here in fp64 when not given).  With ``dout``, backward statistics are added; they
    need ``fwd_budgets`` (the BudgetSet) to bound the error of D (``derr``).  ``softcap``
    (forward statistics only): scores ``y = softcap tanh(S scale / softcap)``, ``c = log2 e``,
    and ``softcap_err`` = the per-row maximum of the softcap stage bound times log2 e.
    ``learnable_sink`` (hq,): its logit enters ``sc_max`` (the sink term's exponent argument);
    pass the oracle's ``lse_true`` (which includes the sink) so that the weights are right.
    """
    Q, K, V = _bhsd(q), _bhsd(k), _bhsd(v)
    B, H, Sq, D = Q.shape
    Hk, Sk, Dv = K.shape[1], K.shape[2], V.shape[-1]
    rep = H // Hk
    K = np.repeat(K, rep, axis=1)
    V = np.repeat(V, rep, axis=1)
    scale = float(np.float32(softmax_scale if softmax_scale is not None else 1 / math.sqrt(D)))
    c = float(np.float32(np.float32(scale) * np.float32(LOG2E)))
    fp8 = dtype in ("fp8", "fp8_e4m3")
    mo = max_offset if max_offset is not None else (8.0 if fp8 else 0.0)
    if rescale_threshold is None:
        rescale_threshold = 8.0 if (arch != "sm90" and not fp8) else 0.0
    vis = _visible(Sq, Sk, causal, window_size)
    st: dict[str, Any] = {}
    rows = {n: np.zeros((B, H, Sq, 1)) for n in ("qk_c_max", "sc_max", "mc_abs", "rowsum", "lse",
                                                  "softcap_err")}
    cap = float(softcap or 0.0)
    if cap and dout is not None:
        raise ValueError("problem_stats: backward statistics with softcap are not implemented")
    u32 = 2.0**-24
    g2 = 2 * u32 / (1 - 2 * u32)
    tanh_rel = 2.0**-10.987
    abs_pv = np.zeros((B, H, Sq, Dv))
    o_ex = np.zeros((B, H, Sq, Dv))
    sum_abs_v = np.zeros((B, H, Sq, Dv))
    absV = np.abs(V)
    for r0 in range(0, Sq, row_chunk):
        r1 = min(r0 + row_chunk, Sq)
        vm = vis[r0:r1]
        s = Q[:, :, r0:r1] @ K.swapaxes(-1, -2)
        aqk = np.abs(Q[:, :, r0:r1]) @ np.abs(K).swapaxes(-1, -2)
        with np.errstate(invalid="ignore"):
            rows["qk_c_max"][:, :, r0:r1, 0] = np.where(vm, aqk, 0).max(-1) * abs(scale * LOG2E)
            if cap:
                y = cap * np.tanh(s * scale / cap)
                rows["sc_max"][:, :, r0:r1, 0] = np.where(vm, np.abs(y) * LOG2E, 0).max(-1)
                rows["softcap_err"][:, :, r0:r1, 0] = np.where(
                    vm, ((tanh_rel + g2) * np.abs(y) + g2 * np.abs(s * scale)) * LOG2E, 0).max(-1)
                sm = np.where(vm, y, -np.inf)
            else:
                rows["sc_max"][:, :, r0:r1, 0] = np.where(vm, np.abs(s) * abs(c), 0).max(-1)
                sm = np.where(vm, s * scale, -np.inf)
            mx = sm.max(-1, keepdims=True)
            mxs = np.where(np.isfinite(mx), mx, 0.0)
            p = np.exp(sm - mxs)
            l = p.sum(-1, keepdims=True)
            rows["mc_abs"][:, :, r0:r1] = np.abs(mxs) * LOG2E
            rows["rowsum"][:, :, r0:r1] = l
            rows["lse"][:, :, r0:r1] = np.where(l > 0, mxs + np.log(np.where(l > 0, l, 1)), -np.inf)
            w = p / np.where(l > 0, l, 1)
        abs_pv[:, :, r0:r1] = w @ absV
        o_ex[:, :, r0:r1] = w @ V
        sum_abs_v[:, :, r0:r1] = vm.astype(F64) @ absV
    if learnable_sink is not None:
        sk_ = np.abs(np.asarray(learnable_sink, F64).reshape(1, H, 1, 1)) * LOG2E
        rows["sc_max"] = np.maximum(rows["sc_max"], sk_)
    lse = rows["lse"] if lse_true is None else np.asarray(lse_true, F64)[..., None]
    O = o_ex if o_true is None else _bhsd(o_true)
    first = np.where(vis.any(1), np.argmax(vis, axis=1), 0)
    last = np.where(vis.any(1), Sk - 1 - np.argmax(vis[:, ::-1], axis=1), 0)
    nb = np.where(vis.any(1), last // tile_n - first // tile_n + 1, 0).astype(F64)
    nb = nb[None, None, :, None]
    st.update({
        "qk_c_max": rows["qk_c_max"], "sc_max": rows["sc_max"], "mc_abs": rows["mc_abs"],
        "x_max": mo + rescale_threshold, "max_offset": mo, "softcap_err": rows["softcap_err"],
        "abs_pv": abs_pv, "abs_o": np.abs(O), "sum_abs_v": sum_abs_v,
        "seqlen_q": float(Sq), "seqlen_k": float(Sk), "d": float(D), "dv": float(Dv),
        "tile_n": float(tile_n), "n_blocks": nb, "n_rescale": nb,
        "lse_abs": np.where(np.isfinite(lse), np.abs(lse), 0.0),
        "lg2_l": mo + rescale_threshold + np.log2(np.maximum(rows["rowsum"], 1.0)),
    })
    if dout is None:
        return st
    if fwd_budgets is None:
        raise ValueError("problem_stats: backward statistics need fwd_budgets (to bound D)")
    dO = _bhsd(dout)
    Qd = _bhsd(q)
    fwd_bound = np.asarray(fwd_budgets.evaluate("forward_out", st), F64)
    fwd_bound = np.broadcast_to(fwd_bound, O.shape)
    gdv = (Dv + 1) * 2.0**-24 / (1 - (Dv + 1) * 2.0**-24)
    derr = (fwd_bound * np.abs(dO)).sum(-1, keepdims=True) + \
        gdv * ((np.abs(O) + fwd_bound) * np.abs(dO)).sum(-1, keepdims=True)
    Dtrue = (O * dO).sum(-1, keepdims=True)
    abs_dsk = np.zeros((B, H, Sq, D))
    abs_p_dov_k = np.zeros((B, H, Sq, D))
    abs_p_derr_k = np.zeros((B, H, Sq, D))
    abs_dsq = np.zeros((B, H, Sk, D))
    abs_p_dov_q = np.zeros((B, H, Sk, D))
    abs_p_derr_q = np.zeros((B, H, Sk, D))
    abs_pdo = np.zeros((B, H, Sk, Dv))
    sum_abs_do = np.zeros((B, H, Sk, Dv))
    sub_dsq = np.zeros((B, H, Sk, D))
    abs_dpd_k = np.zeros((B, H, Sq, D))     # ex2.ftz flush floor statistics (DERIVATIONS.md#ftz-floor)
    abs_dpd_q = np.zeros((B, H, Sk, D))
    absK = np.abs(K)
    for r0 in range(0, Sq, row_chunk):
        r1 = min(r0 + row_chunk, Sq)
        vm = vis[r0:r1]
        s = Q[:, :, r0:r1] @ K.swapaxes(-1, -2) * scale
        with np.errstate(invalid="ignore", over="ignore"):
            P = np.where(vm, np.exp(s - lse[:, :, r0:r1]), 0.0)
        P = np.nan_to_num(P, nan=0.0, posinf=0.0)
        dP = dO[:, :, r0:r1] @ V.swapaxes(-1, -2)
        dS = P * (dP - Dtrue[:, :, r0:r1])
        adov = np.abs(dO[:, :, r0:r1]) @ absV.swapaxes(-1, -2)
        aQ = np.abs(Qd[:, :, r0:r1])
        abs_dsk[:, :, r0:r1] = scale * (np.abs(dS) @ absK)
        abs_p_dov_k[:, :, r0:r1] = scale * ((P * adov) @ absK)
        abs_p_derr_k[:, :, r0:r1] = scale * derr[:, :, r0:r1] * (P @ absK)
        abs_dsq += scale * (np.abs(dS).swapaxes(-1, -2) @ aQ)
        abs_p_dov_q += scale * ((P * adov).swapaxes(-1, -2) @ aQ)
        abs_p_derr_q += scale * ((P * derr[:, :, r0:r1]).swapaxes(-1, -2) @ aQ)
        abs_pdo += P.swapaxes(-1, -2) @ np.abs(dO[:, :, r0:r1])
        vmf = vm.astype(F64)
        sum_abs_do += vmf.T @ np.abs(dO[:, :, r0:r1])
        sub_dsq += scale * (vmf.T @ aQ)
        R = np.abs(dP - Dtrue[:, :, r0:r1]) * vmf
        abs_dpd_k[:, :, r0:r1] = scale * (R @ absK)
        abs_dpd_q += scale * (R.swapaxes(-1, -2) @ aQ)

    def grp(a):  # GQA: sum the q heads of each kv group
        return a.reshape(B, Hk, rep, *a.shape[2:]).sum(2)
    st.update({
        "lse_log2_abs": np.where(np.isfinite(lse), np.abs(lse) * LOG2E, 0.0),
        "abs_dsk": abs_dsk, "abs_p_dov_k": abs_p_dov_k, "abs_p_derr_k": abs_p_derr_k,
        "abs_dsq": grp(abs_dsq), "abs_p_dov_q": grp(abs_p_dov_q),
        "abs_p_derr_q": grp(abs_p_derr_q), "abs_pdo": grp(abs_pdo),
        "seqlen_q_bwd": float(Sq * rep),
        "sum_abs_do": grp(sum_abs_do), "sub_dsq": grp(sub_dsq),
        "sub_dsk": scale * (vis.astype(F64) @ absK),
        "abs_dpd_k": abs_dpd_k, "abs_dpd_q": grp(abs_dpd_q),
    })
    return st


def _kv_rows(st: Mapping[str, Any], B, Hk, rep) -> dict:
    """Per-row statistics reduced (max) to the KV heads for dK/dV budgets: (b, hk, 1, 1)."""
    out = {}
    for n in ("qk_c_max", "sc_max", "mc_abs", "lse_abs", "lg2_l", "lse_log2_abs", "n_blocks",
              "n_rescale", "softcap_err"):
        a = np.asarray(st[n], F64)
        if a.ndim == 4:
            a = np.broadcast_to(a, (B, Hk * rep) + a.shape[2:])
            a = a.reshape(B, Hk, rep, *a.shape[2:]).max(axis=(2, 3), keepdims=False)[..., None, :]
        out[n] = a
    return out


# =========================================================================== checks
@dataclass
class ForwardCheck:
    """Local stage tallies + end-to-end results of one forward problem ("CPU twin" unless
    ``where`` says otherwise)."""
    where: str
    stages: dict[str, StageTally]
    out_ratio: float             #: max |out - O_oracle| / (forward_out + oracle.bound)
    out_over: int
    lse_ratio: float
    lse_over: int
    max_abs_err: float
    config: dict = field(default_factory=dict)
    out_ratio_prob: float = float("nan")   #: the same vs ``forward_out_prob`` (Higham-Mary)

    @property
    def stages_ok(self) -> bool:
        return all(t.n_over == 0 for t in self.stages.values())

    @property
    def ok(self) -> bool:
        return self.stages_ok and self.out_over == 0 and self.lse_over == 0


def _oracle_forward(q, k, v, *, softmax_scale, causal, window_size, softcap=0.0,
                    learnable_sink=None):
    from fa4verify.oracles import attention
    return attention.forward(q, k, v, softmax_scale=softmax_scale, causal=causal,
                             window_size=window_size, softcap=softcap,
                             learnable_sink=learnable_sink)


def check_forward_outputs(out, lse, q, k, v, *, arch: str, dtype: str, softmax_scale=None,
                          causal=False, window_size=(None, None), tile_n: int | None = None,
                          budgets=None, where: str = "measured on H200", oracle=None,
                          stats=None, softcap: float = 0.0, learnable_sink=None):
    """End-to-end check of given forward outputs (production or twin) against the oracle:
    ``|out - O_oracle| <= forward_out(stats) + oracle.bound`` and the same for the LSE."""
    from fa4verify import error_budgets as eb
    bs = budgets or eb.load(dtype, arch)
    D = np.asarray(q).shape[-1]
    Dv = np.asarray(v).shape[-1]
    if tile_n is None:
        from fa4verify.kernels.twin_fwd import sm90_tile
        tile_n = sm90_tile(D, Dv, causal, window_size not in (None, (None, None)))[1] \
            if arch == "sm90" else 128
    orc = oracle or _oracle_forward(q, k, v, softmax_scale=softmax_scale, causal=causal,
                                    window_size=window_size, softcap=softcap,
                                    learnable_sink=learnable_sink)
    st = stats or problem_stats(q, k, v, arch=arch, dtype=dtype, softmax_scale=softmax_scale,
                                causal=causal, window_size=window_size, lse_true=orc.lse,
                                o_true=orc.out, tile_n=tile_n, softcap=softcap,
                                learnable_sink=learnable_sink)
    ref = _bhsd(orc.out)
    got = _bhsd(out)
    bnd = np.broadcast_to(bs.evaluate("forward_out", st), ref.shape) + _bhsd(orc.bound)
    err = np.abs(got - ref)
    err = np.where(np.isnan(got) & np.isnan(ref), 0.0, err)
    ratio = np.where(err == 0, 0.0, err / bnd)
    lref = np.asarray(orc.lse, F64)[..., None]
    lgot = np.asarray(lse, F64)[..., None]
    lb = np.broadcast_to(bs.evaluate("forward_lse", st), lref.shape) + \
        np.asarray(orc.lse_bound, F64)[..., None]
    lerr = np.where(np.isneginf(lref) & np.isneginf(lgot), 0.0, np.abs(lgot - lref))
    lratio = np.where(lerr == 0, 0.0, lerr / lb)
    prob = float("nan")
    if "forward_out_prob" in bs:
        pb = np.broadcast_to(bs.evaluate("forward_out_prob", st), ref.shape) + _bhsd(orc.bound)
        prob = float(np.nan_to_num(np.where(err == 0, 0.0, err / pb), nan=np.inf).max(initial=0))
    return ForwardCheck(out_ratio_prob=prob, where=where, stages={}, out_ratio=float(np.nan_to_num(ratio, nan=np.inf).max(initial=0)),
                        out_over=int((~(ratio <= 1)).sum()),
                        lse_ratio=float(np.nan_to_num(lratio, nan=np.inf).max(initial=0)),
                        lse_over=int((~(lratio <= 1)).sum()),
                        max_abs_err=float(np.nan_to_num(err, nan=np.inf).max(initial=0)),
                        config={"arch": arch, "dtype": dtype, "tile_n": tile_n})


def check_forward(q, k, v, *, arch: str, dtype: str = "bf16", causal=False,
                  window_size=(None, None), softmax_scale=None, accumulation="exact-then-round",
                  mufu="correctly-rounded", seed=0, mutations=frozenset(), budgets=None,
                  e2e: bool = True, softcap: float = 0.0,
                  learnable_sink=None) -> ForwardCheck:
    """Run the CPU twin forward with a :class:`StageRecorder`, then the end-to-end check."""
    from fa4verify import error_budgets as eb
    from fa4verify.kernels import twin_attention as ta
    bs = budgets or eb.load(dtype, arch)
    rec = StageRecorder(bs)
    r = ta.forward(q, k, v, arch=arch, dtype=dtype if dtype != "fp8" else "fp8_e4m3",
                   causal=causal, window_size=window_size, softmax_scale=softmax_scale,
                   accumulation=accumulation, mufu=mufu, seed=seed, mutations=mutations,
                   softcap=softcap, learnable_sink=learnable_sink, stage_probe=rec)
    if e2e:
        fc = check_forward_outputs(r.out, r.lse, q, k, v, arch=arch, dtype=dtype,
                                   softmax_scale=softmax_scale, causal=causal,
                                   window_size=window_size, tile_n=r.config.tile_n, budgets=bs,
                                   where="CPU twin", softcap=softcap,
                                   learnable_sink=learnable_sink)
    else:
        fc = ForwardCheck("CPU twin", {}, 0.0, 0, 0.0, 0, 0.0)
    fc.stages = rec.tallies
    fc.config.update({"accumulation": accumulation, "mufu": mufu,
                      "emulated_fraction": r.stages["emulated_fraction"],
                      "p_max": float(np.max(r.stages["p_max"], initial=0.0))})
    return fc


@dataclass
class BackwardCheck:
    where: str
    stages: dict[str, StageTally]
    ratios: dict[str, float]     #: dq/dk/dv: max |g - g_oracle| / (budget + oracle bound)
    over: dict[str, int]
    rel_err: dict[str, float]    #: max |g - g_oracle| / max |g_oracle|


def check_backward_outputs(dq, dk, dv, q, k, v, dout, *, arch: str, dtype: str = "bf16",
                           causal=False, window_size=(None, None), softmax_scale=None,
                           tile_n: int = 128, budgets=None, where="measured on H200",
                           stats=None) -> BackwardCheck:
    """Gradients vs the oracle's exact gradient (``attention.backward(out=None)``) within the
    composed backward budgets."""
    from fa4verify import error_budgets as eb
    from fa4verify.oracles import attention
    bs = budgets or eb.load(dtype, arch)
    orf = attention.forward(q, k, v, softmax_scale=softmax_scale, causal=causal,
                            window_size=window_size)
    orb = attention.backward(q, k, v, None, dout, softmax_scale=softmax_scale, causal=causal,
                             window_size=window_size)
    st = stats or problem_stats(q, k, v, arch=arch, dtype=dtype, softmax_scale=softmax_scale,
                                causal=causal, window_size=window_size, lse_true=orf.lse,
                                o_true=orf.out, tile_n=tile_n, dout=dout, fwd_budgets=bs)
    B, H = _bhsd(q).shape[:2]
    Hk = _bhsd(k).shape[1]
    ratios, over, rel = {}, {}, {}
    for name, got, ref, refb in (("dq", dq, orb.dq, orb.dq_bound), ("dk", dk, orb.dk, orb.dk_bound),
                                 ("dv", dv, orb.dv, orb.dv_bound)):
        g, r_, rb = _bhsd(got), _bhsd(ref), _bhsd(refb)
        s2 = dict(st)
        s2["abs_" + name] = np.abs(r_)
        if name in ("dk", "dv"):
            s2.update(_kv_rows(st, B, Hk, H // Hk))
            s2["seqlen_q"] = st["seqlen_q_bwd"]
        bnd = np.broadcast_to(bs.evaluate("backward_" + name, s2), r_.shape) + rb
        err = np.abs(g - r_)
        ratio = np.where(err == 0, 0.0, err / bnd)
        ratios[name] = float(np.nan_to_num(ratio, nan=np.inf).max(initial=0))
        over[name] = int((~(ratio <= 1)).sum())
        rel[name] = float(err.max(initial=0) / max(np.abs(r_).max(initial=0), 1e-300))
    return BackwardCheck(where=where, stages={}, ratios=ratios, over=over, rel_err=rel)


def check_backward(q, k, v, dout, *, arch: str, dtype: str = "bf16", causal=False,
                   window_size=(None, None), softmax_scale=None, accumulation="exact-then-round",
                   mufu="correctly-rounded", seed=0, mutations=frozenset(), budgets=None,
                   deterministic=True) -> BackwardCheck:
    """CPU twin forward + backward, backward stage tallies, gradients vs the oracle."""
    from fa4verify import error_budgets as eb
    from fa4verify.kernels import twin_attention as ta
    bs = budgets or eb.load(dtype, arch)
    rec = StageRecorder(bs)
    kw = dict(arch=arch, dtype=dtype, causal=causal, window_size=window_size,
              softmax_scale=softmax_scale, accumulation=accumulation, mufu=mufu, seed=seed)
    fr = ta.forward(q, k, v, mutations=frozenset(mutations) & set(ta.FWD_MUTATIONS), **kw)
    g = ta.backward(q, k, v, fr.out, dout, lse=fr.lse, deterministic=deterministic,
                    mutations=mutations, stage_probe=rec, out_fp32=fr.stages["o_fp32"], **kw)
    bc = check_backward_outputs(g.dq, g.dk, g.dv, q, k, v, dout, arch=arch, dtype=dtype,
                                causal=causal, window_size=window_size,
                                softmax_scale=softmax_scale, tile_n=fr.config.tile_n,
                                budgets=bs, where="CPU twin")
    bc.stages = rec.tallies
    return bc


# =========================================================================== attribution
_ARCH_NAMES = {90: "sm90", 100: "sm100", 103: "sm103", 110: "sm100"}


def _torch_dtype(dtype: str):
    import torch
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]


def production_forward_case(adapter, dist: str, *, hdim: int, seqlen: int, causal: bool, nheads: int,
                            dtype: str = "bf16", seed: int = 0, device: str = "cuda",
                            where: str = "measured on H200") -> tuple[ForwardCheck, str]:
    """Run ``adapter.forward`` (production FA4, or a stand-in) on :func:`gen_inputs` data and check
    its output and LSE against the composed forward budget.  Returns ``(check, arch)``."""
    import torch
    q, k, v = gen_inputs(dist, batch=1, seqlen_q=seqlen, seqlen_k=seqlen, nheads=nheads, hdim=hdim,
                         dtype=dtype, seed=seed)
    tq, tk, tv = (torch.from_numpy(a).to(device, _torch_dtype(dtype)) for a in (q, k, v))
    r = adapter.forward(tq, tk, tv, causal=causal)
    arch = _ARCH_NAMES.get(getattr(r.config, "arch", 90), "sm90")
    tile_n = (r.config.tile_mn or (None, None))[1]
    fc = check_forward_outputs(r.out.float().cpu().numpy(), r.lse.float().cpu().numpy(), q, k, v, arch=arch,
                               dtype=dtype, causal=causal, tile_n=tile_n, where=where)
    return fc, arch


def production_backward_case(adapter, dist: str, *, hdim: int, seqlen: int, causal: bool, nheads: int,
                             dtype: str = "bf16", seed: int = 0, device: str = "cuda",
                             where: str = "measured on H200") -> tuple[BackwardCheck, str]:
    """Run ``adapter.forward`` then the deterministic ``adapter.backward`` on :func:`gen_inputs`
    data and check dQ, dK, dV against the exact gradient within the composed backward budgets.
    Returns ``(check, arch)``."""
    import torch

    from fa4verify.kernels.twin_bwd import sm90_bwd_tile
    q, k, v, do = gen_inputs(dist, batch=1, seqlen_q=seqlen, seqlen_k=seqlen, nheads=nheads, hdim=hdim,
                             dtype=dtype, seed=seed, with_dout=True)
    tq, tk, tv, tdo = (torch.from_numpy(a).to(device, _torch_dtype(dtype)) for a in (q, k, v, do))
    f = adapter.forward(tq, tk, tv, causal=causal)
    g = adapter.backward(tq, tk, tv, f.out, tdo, f.lse, causal=causal, deterministic=True)
    arch = _ARCH_NAMES.get(getattr(g.config, "arch", 90), "sm90")
    tile_n = sm90_bwd_tile(hdim, hdim, causal, False)[1] if arch == "sm90" else 128
    bc = check_backward_outputs(*(x.float().cpu().numpy() for x in (g.dq, g.dk, g.dv)), q, k, v, do,
                                arch=arch, dtype=dtype, causal=causal, tile_n=tile_n, where=where)
    return bc, arch


@dataclass(frozen=True)
class AttributionRow:
    """Forward error attributed to one stage ("CPU twin").

    ``isolated_rms``/``isolated_max``: error of the output with only this stage as FA4 (all
    others exact), absolute, vs the exact attention; ``ablation_drop_rms``: RMS error of the full
    as-FA4 run minus that with only this stage exact; ``lse_*`` the same for the LSE."""
    stage: str
    isolated_rms: float
    isolated_max: float
    ablation_drop_rms: float
    lse_isolated_max: float


def attribute_forward(q, k, v, *, arch: str, dtype: str = "bf16", causal=False,
                      window_size=(None, None), softmax_scale=None,
                      stages: Sequence[str] = ATTRIBUTION_STAGES,
                      accumulation="exact-then-round", mufu="correctly-rounded",
                      seed: int = 0) -> tuple[list[AttributionRow], dict]:
    """Stage attribution of the forward error by isolation and ablation (CPU twin).

    Returns the rows and a summary dict: ``full_rms``, ``full_max`` (the as-FA4 output error),
    ``dominant`` (stage with the largest isolated RMS) and ``emu_over_pcast`` (isolated RMS of
    ``exp2_emu`` divided by that of ``p_cast``; the expectation to test is < 1/40).
    """
    from fa4verify.kernels import twin_attention as ta
    ALL = frozenset(ta.FWD_STAGES)
    kw = dict(arch=arch, dtype=dtype if dtype != "fp8" else "fp8_e4m3", causal=causal,
              window_size=window_size, softmax_scale=softmax_scale, accumulation=accumulation,
              mufu=mufu, seed=seed)
    ref = ta.forward(q, k, v, exact_stages=ALL, **kw)
    ro, rl = np.asarray(ref.out, F64), np.asarray(ref.lse, F64)
    fin = np.isfinite(rl)

    def errs(r):
        e = np.abs(np.asarray(r.out, F64) - ro)
        le = np.abs(np.asarray(r.lse, F64) - rl)[fin]
        return float(np.sqrt(np.mean(e * e))), float(e.max(initial=0)), float(le.max(initial=0))
    full = ta.forward(q, k, v, **kw)
    f_rms, f_max, f_lmax = errs(full)
    rows = []
    for s in stages:
        iso = ta.forward(q, k, v, exact_stages=ALL - {s}, **kw)
        i_rms, i_max, i_lmax = errs(iso)
        abl = ta.forward(q, k, v, exact_stages={s}, **kw)
        a_rms, _, _ = errs(abl)
        rows.append(AttributionRow(s, i_rms, i_max, f_rms - a_rms, i_lmax))
    by = {r.stage: r for r in rows}
    dom = max(rows, key=lambda r: r.isolated_rms).stage if rows else ""
    pc = by.get("p_cast")
    em = by.get("exp2_emu")
    summary = {"full_rms": f_rms, "full_max": f_max, "full_lse_max": f_lmax, "dominant": dom,
               "emu_over_pcast": (em.isolated_rms / pc.isolated_rms)
               if (pc and em and pc.isolated_rms > 0) else float("nan"),
               "emulated_fraction": full.stages["emulated_fraction"]}
    return rows, summary


def fwd_bwd_p_mismatch(q, k, v, dout, *, arch: str = "sm100", dtype: str = "bf16",
                       causal=False, softmax_scale=None, seed: int = 0) -> dict:
    """SM100: the forward P (polynomial exp2 on emulated columns) vs the backward's recomputed P
    (hardware exp2 only), and the effect on the gradients ("CPU twin").

    * ``p_rel_max``: max over emulated columns of |P_fwd - P_bwd| / P_bwd, where both are
      computed from the same exponent argument (the backward's), i.e. the emulation error the
      backward does not see (<= ~8.8e-5 expected).
    * ``grad_effect_{dq,dk,dv}``: max |g(emulating forward) - g(non-emulating forward)| /
      max |g|: the gradient change caused by the forward's emulation (through LSE and O/D),
      on the fp32 gradients before the final cast.
    * ``grad_error_{dq,dk,dv}``: max |g(twin, fp32) - g(exact)| / max |g| for scale.
    * ``grad_effect_rms_share_{dq,dk,dv}``: rms of the effect / rms of the fp32 gradient error.
    * ``grad_effect_via_lse_rms_share_*`` / ``grad_effect_via_o_rms_share_*``: the same with only
      the LSE (resp. only the rounded O) taken from the emulating forward.
    """
    from fa4verify.kernels import twin_attention as ta
    from fa4verify.kernels.twin_fwd import emulated_exp2
    kw = dict(arch=arch, dtype=dtype, causal=causal, softmax_scale=softmax_scale, seed=seed)
    fr = ta.forward(q, k, v, **kw)
    emu = fr.stages["emulated_columns"]
    # P mismatch on the backward's own arguments
    cap = {}

    def probe(s):
        if s.stage == "bwd_exp2":
            cap.setdefault("x", []).append(np.asarray(s.fa4))
    xs = []

    def probe_x(s):
        if s.stage == "bwd_exp_arg":
            xs.append(np.asarray(s.fa4, np.float32))
    g = ta.backward(q, k, v, fr.out, dout, lse=fr.lse, stage_probe=probe_x, **kw)
    p_rel = 0.0
    n_cmp = 0
    tile = g.stages["tile_n"]
    for x in xs:
        ncol = x.shape[-1]
        em = np.resize(emu, ncol) if len(emu) == tile else np.zeros(ncol, bool)
        xe = np.ascontiguousarray(x[..., em])
        ok = np.isfinite(xe) & (xe > -126)
        if not ok.any():
            continue
        pf = emulated_exp2(xe).astype(F64)
        pb = ta.Mufu("correctly-rounded", 0).ex2(xe).astype(F64)
        rel = np.abs(pf - pb)[ok] / pb[ok]
        p_rel = max(p_rel, float(rel.max()))
        n_cmp += int(ok.sum())
    # effect on the gradients, measured on the fp32 gradients (final casts exact) so that bf16
    # rounding flips do not masquerade as an effect
    fr_noemu = ta.forward(q, k, v, exact_stages={"exp2_emu"}, **kw)
    gc = frozenset({"grad_cast"})
    g1 = ta.backward(q, k, v, fr.out, dout, lse=fr.lse, exact_stages=gc, **kw)
    g2 = ta.backward(q, k, v, fr_noemu.out, dout, lse=fr_noemu.lse, exact_stages=gc, **kw)
    allx = frozenset(ta.FWD_STAGES)
    fre = ta.forward(q, k, v, exact_stages=allx, **kw)
    ge = ta.backward(q, k, v, fre.out, dout, lse=fre.lse, exact_stages=frozenset(ta.BWD_STAGES), **kw)
    out = {"p_rel_max": p_rel, "n_emulated_compared": n_cmp,
           "emulated_fraction": fr.stages["emulated_fraction"]}
    for n in ("dq", "dk", "dv"):
        a, b, e = (np.asarray(getattr(x, n), F64) for x in (g1, g2, ge))
        scale = max(np.abs(e).max(initial=0), 1e-300)
        out[f"grad_effect_{n}"] = float(np.abs(a - b).max(initial=0) / scale)
        out[f"grad_error_{n}"] = float(np.abs(a - e).max(initial=0) / scale)
        err_rms = float(np.sqrt(np.mean((a - e) ** 2)))
        out[f"grad_effect_rms_share_{n}"] = float(np.sqrt(np.mean((a - b) ** 2)) / err_rms) \
            if err_rms > 0 else 0.0
    # decomposition: the emulation reaches the backward through the LSE (P recompute) and
    # through the rounded O (D = rowsum(dO * O))
    g_lse = ta.backward(q, k, v, fr_noemu.out, dout, lse=fr.lse, exact_stages=gc, **kw)
    g_o = ta.backward(q, k, v, fr.out, dout, lse=fr_noemu.lse, exact_stages=gc, **kw)
    for n in ("dq", "dk", "dv"):
        b, e = np.asarray(getattr(g2, n), F64), np.asarray(getattr(ge, n), F64)
        err_rms = float(np.sqrt(np.mean((np.asarray(getattr(g1, n), F64) - e) ** 2))) or 1.0
        for tag, gg in (("via_lse", g_lse), ("via_o", g_o)):
            d = np.asarray(getattr(gg, n), F64) - b
            out[f"grad_effect_{tag}_rms_share_{n}"] = float(np.sqrt(np.mean(d * d)) / err_rms)
    return out
