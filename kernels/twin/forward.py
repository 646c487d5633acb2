"""CPU twin of FA4's attention *forward* (SM90 and SM100 paths): the numbers, stage by stage.

Public entry: :func:`fa4verify.kernels.twin.attention.forward` (this module is its body); the fp32
building blocks it shares with the backward are in :mod:`fa4verify.kernels.twin.fp32`.
Labelled "CPU twin" everywhere: nothing here ran on a GPU.

Why one module of ~900 lines (a module above ~800 lines needs a reason): it is FA4's forward
softmax pipeline in FA4's own order -- tile loop, row max with lazy rescale, exp2 split between
MUFU and the polynomial, P cast, PV accumulation, normaliser, output cast -- with one stage hook
per step; each step reads state the previous one left (running max, row sum, emulated columns),
and splitting the loop across modules would scatter that state. Its reusable fp32 pieces are
already in :mod:`fa4verify.kernels.twin.fp32` and the exp2 model in ``twin/exp2.py``.

What is modelled (flash_attn/cute/softmax.py; FA4 source ``flash_attn/cute/{softmax.py,
flash_fwd_sm100.py,flash_fwd_sm90.py,utils.py}``)
------------------------------------------------------------------------------------------
* Tiles: SM90 ``_tile_size_fwd_sm90`` (hd<=64: 192x128, hd<=96: 192x144 / 192x128 causal-local,
  hd<=128: 128x128, hd<=192: 128x{96 local,128,112}, hd 256: 128x{64 local, 80}); SM100 128x128.
  KV blocks are visited from ``n_block_max-1`` down to ``n_block_min`` (``block_info.py``), with
  FA4's per-M-block ranges for causal (bottom-right) and local windows.
* Row max: ``fmax`` (PTX semantics: NaN ignored).  SM100 lazy rescale: keep the old max while
  ``(m_old - m_new) * c >= -rescale_threshold`` (8 for 16-bit, 0 = off for fp8); SM90 and the
  dedicated SM100 hd-256 forward always update.  The dedicated hd-256 forward
  (``sm100_hd256_2cta_fmha_forward.py``) exists in FA4 4.0.0b20..b33 only
  (``facts.sm100_hd256_dedicated``); from 4.0.0b34 on, the pinned 4.0.0b36 included, (256, 256)
  runs the generic SM100 forward and is modelled as "sm100".
* Exponent argument, one fused FMA (bit-exact via ``binary32.fma``):
  SM100 ``x = fma(S, c, max_offset - m*c)``; SM90 and hd256 ``x = fma(S, c, -(m*c))`` where
  ``c = RN32(RN32(softmax_scale) * RN32(log2 e))`` (``compute_softmax_scale_log2``).
* exp2: MUFU ``ex2.approx.ftz`` on hardware columns (model parameter ``mufu``), FA4's polynomial
  (``twin.exp2.ex2_emulation``, bit-exact) on ``twin.exp2.emulated_columns`` (SM100 only).
* P cast RNE to bf16/fp16 (fp8 e4m3: satfinite); row sum from the *unrounded* fp32 P:
  SM100 ``fadd_reduce`` (8 lanes, 16 sequential adds each, init in lane 0, combine (0+1)(2+3)),
  SM90 per-thread sequential sum over the thread's N/4 columns (WGMMA layout ``8j+2q+{0,1}``),
  quad butterfly at the end.
* O rescale: SM100 only when some row of the 32-row warp has scale < 1 (warp vote), rows with
  scale 1 multiplied by exactly 1; SM90 every block.
* Normaliser ``rcp.approx.ftz`` (model parameter), fp32 multiply, RNE cast; hd256 uses IEEE 1/l.
* LSE: SM100 ``(m*c + (lg2(l) - max_offset)) * LN2``; SM90 ``(m*c + lg2(l)) * LN2``;
  hd256 ``scale*m + ln(l)``.  Learnable sink folded in as ``apply_learnable_sink`` /
  ``Softmax.finalize`` do.  Softcap ``softcap * tanh(S*scale / softcap)`` with MUFU tanh.

Model parameters (hardware that is not bit-modelable; budgets must cover every setting)
-------------------------------------------------------------------------------------
``accumulation`` -- tensor-core fp32 accumulation of S = QK^T and O += PV:
  ``"exact-then-round"`` (each MMA result = RN32(init + exact dot); the dot is formed in fp64,
  error <= K * 2^-53 * sum|terms| before the one fp32 rounding), ``"sequential"`` (fp32 RN add in
  k order), ``"pairwise"`` (fp32 RN pairwise tree over k, then + init), ``"sm90-tensor-core"``
  (the SM90 tensor core bit for bit, for bf16 / fp16 inputs: Note [SM90 MMA model] in
  ``kernels/twin/tensor_core.py``; the judge then takes each score as a point).
``mufu`` -- ``ex2``/``rcp``/``lg2``/``tanh`` approximations: ``"correctly-rounded"`` (fp32 RN of
  the exact value, .ftz on inputs/outputs) or ``"perturbed"`` (the exact value times
  ``1 + delta``, ``|delta| <=`` the bound in :data:`MUFU_BOUNDS`, uniform, seeded by ``seed``;
  exact at integer ex2 arguments, as the hardware is).

Stage switches
--------------
Every stage in :data:`FWD_STAGES` runs "as FA4" unless named in ``exact_stages``; an exact stage
computes its real-valued result in fp64 and passes the fp64 value on (the next as-FA4 stage
applies FA4's rounding to its exact result on those fp64 inputs). This makes a stage's
contribution measurable by ablation. ``stage_probe`` (optional callable) receives, for every
stage application, the as-FA4 value, the exact value computed *from the same inputs*, and the
problem statistics the budgets use (see :class:`StageSample`).

Mutations (:data:`FWD_MUTATIONS`): named faults for mutation testing and fuzzing.

Possible issues
---------------
* Varlen (``cu_seqlens_*``) runs each sequence as its own batch (FA4's tiles never cross
  sequences; ``varlen_q`` selects FA4's varlen emulation setting); ``seqused_*``, split-KV,
  paged KV and score_mod/mask_mod are not modelled; q/k/v descales are, on the SM 10.x kernel
  without softcap (Note [FP8 descales] in ``fa4verify/problem/__init__.py``).  pack_gqa only changes the
  emulated-column set.
* SM90 per-thread row-sum order assumes ``TensorSSA.reduce(ADD)`` lowers to a sequential
  reduction in register order (not confirmed in SASS); budgets use the worst-case depth.
* The dedicated SM100 hd-256 forward (4.0.0b20..b33) is modelled with the SM100 ``fadd_reduce``
  order (unverified).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping, Optional

import numpy as np

from fa4verify.oracles import binary32 as b32
from fa4verify.kernels import facts as _facts
# the fp32 building blocks shared with the backward (public in fp32.py; aliased here)
from fa4verify.kernels.twin.fp32 import (  # noqa: F401
    ACCUMULATIONS, DTYPES as _DTYPES, F32, F64, LN2, LOG2_E, cast_to, infer_dtype, mma,
    add as _add, check_representable as _check_representable, div as _div, fma as _fma,
    is32 as _is32, mul as _mul, rn32 as _rn32, sub as _sub,
)

Arch = Literal["sm90", "sm100", "sm103"]
Accumulation = Literal["exact-then-round", "sequential", "pairwise", "sm90-tensor-core"]
MufuMode = Literal["correctly-rounded", "perturbed"]


FWD_STAGES: tuple[str, ...] = (
    "s_accum", "softcap", "exp_arg", "exp2", "exp2_emu", "p_cast", "row_sum", "rescale",
    "pv_accum", "sink", "rcp", "normalize", "o_cast", "lse",
)
FWD_MUTATIONS: tuple[str, ...] = (
    "poly_degree_2", "poly_coeff_ulp", "p_cast_rz", "rescale_skipped", "fp8_old_threshold",
    "nan_to_zero_emulated", "causal_top_left", "causal_off_by_one", "tail_tile_dropped",
    "row_sum_rounded_p", "rcp_low_precision", "recip_bias_2m9",
    "qk_descale_query_head", "v_descale_dropped", "nblock_max_row_exclusive", "check_inf_dropped_causal",
    "max_stored_after_inf_guard",
)
MUFU_MODES: tuple[str, ...] = ("correctly-rounded", "perturbed")

#: Relative (ex2, rcp, tanh) / absolute (lg2) error bounds of the MUFU model "perturbed".
#: ex2: 2^-22 (the FA4 paper measured 1.41e-7 = 2^-22.76 max relative on B200, FA4 paper Table 2;
#: CUDA documents exp2f at 2 ulp); rcp: 1 fp32 ulp = 2^-23 relative; lg2: 2^-22 absolute
#: (CUDA ``__log2f`` on [0.5, 2]) plus 2 ulp relative elsewhere; tanh: 2^-10.987 (PTX
#: ``tanh.approx.f32``; CUDA ``__tanhf`` 2^-11).  The budgets use the same constants
#: (error_budgets/*.toml, ``mufu_ex2_rel`` ...), see DERIVATIONS.md §M.
MUFU_BOUNDS: dict[str, float] = {
    "ex2": 2.0**-22, "rcp": 2.0**-23, "lg2_abs": 2.0**-22, "lg2_rel": 2.0**-22,
    "tanh": 2.0**-10.987,
}


@functools.lru_cache(maxsize=None)
def mufu_tanh_envelope(arch: str) -> Optional[dict[str, float]]:
    """The GPU's ``tanh.approx`` measured on every fp32 input for ``arch`` (Note [MUFU tanh
    envelope], kernels/probes/probe_mufu_tanh.py; ``evidence/golden/mufu_tanh.json``):
    ``{"sat", "abs1"}`` -- exactly +-1 from ``|x| >= sat``, ``|th - tanh x| <= abs1`` at
    ``|x| >= 1``, ``|th| <= 1`` -- or None where it was not measured."""
    import json
    from fa4verify.kernels.evidence import evidence_path
    f = evidence_path("golden/mufu_tanh.json")
    if not f.is_file():
        return None
    rec = json.loads(f.read_text()).get("archs", {}).get(arch)
    if not rec:
        return None
    return {"sat": float(rec["sat"]), "abs1": float(rec["max_abs_from_1"])}


# =========================================================================== data classes
@dataclass(frozen=True)
class StageSample:
    """One application of a stage, handed to ``stage_probe``.

    ``fa4`` and ``exact`` have the same shape; ``exact`` is the stage's real-valued result on the
    *same inputs* ``fa4`` was computed from (fp64).  ``stats`` maps budget statistic names
    (see error_budgets/*.toml) to arrays broadcastable to ``fa4``.  ``where`` is a bool mask of
    the elements that count (finite inputs, active rows), or None for all.
    """
    stage: str
    fa4: np.ndarray
    exact: np.ndarray
    stats: Mapping[str, Any]
    where: np.ndarray | None = None


@dataclass(frozen=True)
class TwinConfig:
    """Everything that determines the twin's arithmetic for one call."""
    arch: str
    kernel: str                  # "sm90", "sm100", "sm100_hd256"
    dtype: str                   # "bf16" | "fp16" | "fp8"
    out_dtype: str               # "bf16" | "fp16"
    tile_m: int
    tile_n: int
    head_dim: int
    head_dim_v: int
    softmax_scale: float         # the fp32 value the kernel receives
    scale_log2: float            # c, fp32
    rescale_threshold: float
    max_offset: float
    emulated_columns: tuple[int, ...]
    causal: bool
    window_size: tuple[int | None, int | None]
    softcap: float
    accumulation: str
    mufu: str
    seed: int
    exact_stages: frozenset
    mutations: frozenset
    params_source: str


@dataclass
class TwinForwardResult:
    """Result of the CPU twin forward.

    ``out``: (batch, seqlen_q, nheads, head_dim_v), the dtype-rounded output held in float32
    (float64 if ``o_cast`` is exact).  ``lse``: (batch, nheads, seqlen_q) natural-log LSE, fp32
    (float64 if ``lse`` is exact).  ``stages``: intermediate data -- ``m`` (final unscaled row
    max, (b,h,q)), ``row_sum`` (final l, after the sink), ``o_acc`` (unnormalised fp32 O,
    (b,h,q,dv)), ``rcp``, ``p_max`` (largest fp32 P seen per row), ``p_cast_max`` (largest cast P),
    ``n_rescale`` (O rescales per row), ``emulated_fraction``, ``scale_log2``, ``o_fp32`` (the
    normalised fp32 output before the cast, in ``out``'s layout).
    """
    out: np.ndarray
    lse: np.ndarray
    stages: dict[str, Any]
    config: TwinConfig


class Mufu:
    """Model of the MUFU approximations (``ex2/rcp/lg2/tanh.approx``), see module docstring."""

    def __init__(self, mode: str, seed: int, bounds: Mapping[str, float] = MUFU_BOUNDS,
                 arch: Optional[str] = None):
        if mode not in MUFU_MODES:
            raise ValueError(f"mufu={mode!r}: expected one of {MUFU_MODES}")
        self.mode = mode
        self.bounds = dict(bounds)
        self.rng = np.random.default_rng(seed)
        #: the arch's measured tanh (None: PTX's relative bound only)
        self.tanh_envelope = mufu_tanh_envelope(arch) if arch else None

    def _delta(self, shape, bound) -> np.ndarray | float:
        if self.mode == "correctly-rounded":
            return 0.0
        return self.rng.uniform(-bound, bound, size=shape)

    @staticmethod
    def _ftz_out(y32: np.ndarray) -> np.ndarray:
        return b32.ftz(y32)

    def ex2(self, x) -> np.ndarray:
        """``ex2.approx.ftz.f32``: 2^x, subnormal inputs/outputs flushed; NaN -> NaN."""
        x = np.asarray(x)
        x64 = (b32.ftz(x) if x.dtype == F32 else x).astype(F64)
        with np.errstate(over="ignore", invalid="ignore"):
            y = np.exp2(x64)
            d = self._delta(y.shape, self.bounds["ex2"])
            if not np.isscalar(d):
                d = np.where(x64 == np.round(x64), 0.0, d)
            y = y * (1.0 + d)
        return self._ftz_out(_rn32(y))

    def rcp(self, x) -> np.ndarray:
        """``rcp.approx.ftz.f32``."""
        x = np.asarray(x)
        x64 = (b32.ftz(x) if x.dtype == F32 else x).astype(F64)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            y = 1.0 / x64
            y = y * (1.0 + self._delta(y.shape, self.bounds["rcp"]))
        return self._ftz_out(_rn32(y))

    def lg2(self, x) -> np.ndarray:
        """``lg2.approx.ftz.f32`` (absolute error model 2^-22 near 1, relative elsewhere)."""
        x = np.asarray(x)
        x64 = (b32.ftz(x) if x.dtype == F32 else x).astype(F64)
        with np.errstate(divide="ignore", invalid="ignore"):
            y = np.log2(x64)
            if self.mode == "perturbed":
                y = y + self._delta(y.shape, self.bounds["lg2_abs"]) \
                    + y * self._delta(y.shape, self.bounds["lg2_rel"])
        return _rn32(y)

    def tanh(self, x) -> np.ndarray:
        """``tanh.approx.f32``: relative error up to ``tanh_rel``; on an arch with a measured
        envelope (:func:`mufu_tanh_envelope`), inside it: absolute error up to ``abs1`` at
        ``|x| >= 1``, ``|th| <= 1``, exactly +-1 from ``|x| >= sat``."""
        x64 = np.asarray(x, F64)
        y = np.tanh(x64)
        env = self.tanh_envelope
        if env is None:
            return _rn32(y * (1.0 + self._delta(y.shape, self.bounds["tanh"])))
        big = np.abs(x64) >= 1.0
        rel = y * (1.0 + self._delta(y.shape, self.bounds["tanh"]))
        ab = y + self._delta(y.shape, env["abs1"])
        y = np.clip(np.where(big, ab, rel), -1.0, 1.0)
        y = np.where(np.abs(x64) >= env["sat"], np.sign(x64), y)
        return _rn32(y)


# =========================================================================== configuration
# FA4's window rule and SM90 tile table live once, in fa4verify.kernels.facts
resolve_causal_local_window = _facts.resolve_causal_local_window
sm90_tile = _facts.sm90_fwd_tile


def _params():
    from fa4verify.kernels.fa4_params import load_params
    return load_params()


# =========================================================================== forward
def forward(q, k, v, *, arch: str = "sm90", softmax_scale: float | None = None,
            causal: bool = False, window_size=(None, None), softcap: float = 0.0,
            learnable_sink=None, exact_stages=frozenset(), mutations=frozenset(),
            dtype: str | None = None, accumulation: str = "exact-then-round",
            mufu: str = "correctly-rounded", seed: int = 0, pack_gqa: bool | None = None,
            use_2cta: bool | None = None, emulated_columns=None,
            stage_probe: Callable[[StageSample], None] | None = None,
            cu_seqlens_q=None, cu_seqlens_k=None, _varlen_q: bool = False, mla: bool = False,
            q_descale=None, k_descale=None, v_descale=None, tile_n: int | None = None,
            keep=None) -> TwinForwardResult:
    """CPU twin of FA4's forward ("CPU twin"; see the module docstring for what is modelled).

    ``q`` (b, sq, hq, d), ``k``/``v`` (b, sk, hk, d/dv): torch tensors or numpy arrays of
    bf16/fp16/fp8-e4m3 values (float32 arrays are taken as bf16 values unless ``dtype`` says
    otherwise; values not representable in ``dtype`` raise ValueError).  ``arch``: "sm90" (H100/
    H200 kernel), "sm100" (B200; emulated exp2, lazy rescale; hd (256,256) uses the dedicated
    kernel model where the installed FA4 has one), "sm103" (no emulation in the main kernel).  ``softmax_scale`` defaults to
    1/sqrt(d) and is rounded to fp32 as the kernel receives it.  ``causal`` is bottom-right
    aligned; ``window_size`` = (left, right), None = unbounded; ``softcap`` 0 = off;
    ``learnable_sink`` (hq,) logits.  ``exact_stages`` / ``mutations``: see :data:`FWD_STAGES`,
    :data:`FWD_MUTATIONS`.  ``accumulation`` / ``mufu`` / ``seed``: hardware model parameters.
    ``pack_gqa`` / ``use_2cta`` / ``emulated_columns`` / ``tile_n`` override FA4's config derivation
    (which columns of the 128-wide KV tile use the polynomial; the KV tile: FA4's split-KV at hd !=
    hdv on SM 10.x, a block-sparse call's tile fitted to its KV block on SM90).  ``mla``: q and k are the concatenations
    of an MLA call (rope part, then qv / v; ``fa4verify.oracles.mla``), run with the constants of
    FA4's MLA kernels (:func:`fa4verify.kernels.facts.mla_fwd_constants`: MUFU exp2 only, no
    ``max_offset``, the lazy-rescale threshold; at head dim 576 the standard SM100 model's own) on
    the standard SM100 pipeline: a stand-in for the MLA kernels' arithmetic, not their 2-CTA
    row-sum order.  ``q_descale`` / ``k_descale`` / ``v_descale``: fp32 (b, hk) factors of fp8
    inputs (FA4's ``_load_effective_descales``): the exponent scale of KV head ``hk`` is
    ``RN(c RN(qd kd))`` and the normaliser ``RN(rcp(l) vd)`` (not with softcap, MLA or the
    dedicated hd-256 kernel).  ``keep``: a boolean keep-mask, (b, sq, sk) or (b, hq, sq, sk),
    applied with the causal / window rule inside every KV tile the call walks -- FA4's ``mask_fn``
    in the listed tiles of a block-sparse call under a causal or window rule (Note [Block lists
    with causal or a window]): a score it drops is -inf like a masked one, and no tile is skipped
    for it (dense calls only).  ``stage_probe(StageSample)`` is called
    for every stage application with the as-FA4 value, the exact value from the same inputs and
    the budget statistics.

    Returns :class:`TwinForwardResult`: ``out`` (b, sq, hq, dv) dtype-rounded values as float32
    (bf16 for fp8 inputs), ``lse`` (b, hq, sq) natural log fp32 (-inf for rows that see no key),
    ``stages`` (intermediates), ``config`` (:class:`TwinConfig`).
    Accuracy: bit-exact to FA4 for every modelled operation under the chosen hardware model;
    with every stage exact, equal to exact attention up to fp64 rounding (~1e-15 relative).
    """
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        if keep is not None:
            raise ValueError("keep takes a dense call (run a varlen one a sequence at a time)")
        return _forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, dict(
            arch=arch, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
            softcap=softcap, learnable_sink=learnable_sink, exact_stages=exact_stages,
            mutations=mutations, dtype=dtype, accumulation=accumulation, mufu=mufu, seed=seed,
            pack_gqa=pack_gqa, use_2cta=use_2cta, emulated_columns=emulated_columns,
            stage_probe=stage_probe, mla=mla, q_descale=q_descale, k_descale=k_descale,
            v_descale=v_descale))
    exact = frozenset(exact_stages)
    muts = frozenset(mutations)
    bad = exact - set(FWD_STAGES)
    if bad:
        raise ValueError(f"unknown forward stage(s) {sorted(bad)}; known: {FWD_STAGES}")
    from fa4verify.kernels.twin.backward import BWD_MUTATIONS     # (backward imports this module)
    bad = muts - set(FWD_MUTATIONS) - set(BWD_MUTATIONS)
    if bad:
        raise ValueError(f"unknown mutation(s) {sorted(bad)}; known: {FWD_MUTATIONS}")
    if arch not in ("sm90", "sm100", "sm103"):
        raise ValueError(f"arch={arch!r}: expected 'sm90', 'sm100' or 'sm103'")
    if accumulation not in ACCUMULATIONS:
        raise ValueError(f"accumulation={accumulation!r}: expected one of {ACCUMULATIONS}")

    qa, qd = infer_dtype(q)
    ka, kd = infer_dtype(k)
    va, vd = infer_dtype(v)
    dt = dtype or qd or "bf16"   # float32 arrays holding bf16 values (checked below)
    if dt not in _DTYPES:
        raise ValueError(f"dtype={dt!r}: expected one of {_DTYPES}")
    for a, n in ((qa, "q"), (ka, "k"), (va, "v")):
        _check_representable(a, dt, n)
    if dt == "fp8" and arch == "sm90":
        raise ValueError("fp8 forward exists only on SM100 (flash_attn/cute/interface.py)")
    out_dtype = "bf16" if dt == "fp8" else dt

    B, Sq, Hq, D = qa.shape
    Bk, Sk, Hk, Dk = ka.shape
    Dv = va.shape[-1]
    if Bk != B or Dk != D or va.shape[:3] != (B, Sk, Hk) or Hq % Hk:
        raise ValueError(f"shape mismatch: q {qa.shape}, k {ka.shape}, v {va.shape}")
    if pack_gqa is None:
        pack_gqa = Hq // Hk > 1
    is_causal, local, wl, wr = resolve_causal_local_window(causal, window_size)

    params = _params()
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(D)
    scale32 = F32(softmax_scale)
    has_softcap = softcap is not None and softcap != 0.0
    if has_softcap:
        c = F32(LOG2_E)
    else:
        c = b32.mul(np.array(scale32, F32), np.array(F32(LOG2_E), F32))[()]
    c = F32(c)
    c_true = float(scale32) * LOG2_E if not has_softcap else LOG2_E
    c_base = c
    descales = (q_descale, k_descale, v_descale)
    vd_rows = None
    if any(t is not None for t in descales):
        if dt != "fp8":
            raise ValueError("q/k/v descales take fp8 inputs (FA4 asserts)")
        if has_softcap or mla:
            raise ValueError("the twin models descales without softcap and MLA")
        qk32, vd32, qk64 = _descale_factors(descales, qa.shape[0], ka.shape[2])
        rep_h = qa.shape[2] // ka.shape[2]
        heads = np.arange(qa.shape[2]) // rep_h
        if "qk_descale_query_head" in muts:      # the factor of KV head h % hk, not h // group
            heads = np.arange(qa.shape[2]) % ka.shape[2]
        qk_h = qk32[:, heads][:, :, None]                          # (b, hq, 1), fp32
        # FA4: softmax_scale_log2_eff = RN(c * qk_descale), per (batch, KV head)
        c = b32.mul(np.broadcast_to(np.asarray(c, F32), qk_h.shape).copy(), qk_h)
        c_true = c_true * qk64[:, heads][:, :, None]               # the exact product qd kd
        vd_rows = np.repeat(vd32, rep_h, axis=1)[:, :, None]        # (b, hq, 1)

    # --- kernel variant, tiles, thresholds
    if arch == "sm90" and mla:
        raise ValueError("MLA (qv) runs on SM 10.x/11.x only")
    if arch == "sm90":
        kernel = "sm90"
        tile_m, tile_n = sm90_tile(D, Dv, is_causal, local)[0], (sm90_tile(D, Dv, is_causal, local)[1]
                                                                 if tile_n is None else int(tile_n))
        threshold, max_offset = 0.0, 0.0
    else:
        kernel = "sm100_hd256" if (D == 256 and Dv == 256 and _facts.sm100_hd256_dedicated("fwd")) else "sm100"
        # tile_n: FA4's own choice of another KV tile (its split-KV at hd != hdv runs 64 keys a tile)
        tile_m, tile_n = 128, 128 if tile_n is None else int(tile_n)
        if dt == "fp8":
            max_offset = float(params.max_offset_fp8)
            threshold = float(params.rescale_threshold_other)
            if "fp8_old_threshold" in muts:
                threshold, max_offset = 4.0, 8.0   # FA #2577: threshold 4 with max_offset 8
        else:
            max_offset = float(params.max_offset_other)
            threshold = float(params.rescale_threshold_16bit)
        if kernel == "sm100_hd256":
            threshold = 0.0
        if mla:
            if dt == "fp8":
                raise ValueError("the twin's MLA stand-in takes 16-bit inputs")
            mc = _facts.mla_fwd_constants()
            kernel, max_offset, threshold = "sm100_mla", float(mc["max_offset"]), float(mc["rescale_threshold"])
            if emulated_columns is None:
                emulated_columns = ()
    if vd_rows is not None and kernel != "sm100":
        raise ValueError(f"descales run on FA4's SM 10.x forward, not the {kernel} kernel model")
    if emulated_columns is None:
        if kernel == "sm90":
            emu = np.zeros(tile_n, bool)
        else:
            from fa4verify.kernels.twin.exp2 import emulated_columns as _emcols
            emu = _emcols(head_dim=D, head_dim_v=Dv, causal=is_causal, local=local,
                          pack_gqa=bool(pack_gqa), varlen_q=_varlen_q, use_2cta=use_2cta,
                          is_sm103=(arch == "sm103"), fp8=(dt == "fp8"), n_block_size=tile_n)
    else:
        emu = np.zeros(tile_n, bool)
        emu[np.asarray(list(emulated_columns), int)] = True
    cfg = TwinConfig(arch=arch, kernel=kernel, dtype=dt, out_dtype=out_dtype, tile_m=tile_m,
                     tile_n=tile_n, head_dim=D, head_dim_v=Dv, softmax_scale=float(scale32),
                     scale_log2=float(c_base), rescale_threshold=threshold, max_offset=max_offset,
                     emulated_columns=tuple(int(i) for i in np.flatnonzero(emu)),
                     causal=bool(is_causal), window_size=(wl, wr),
                     softcap=float(softcap or 0.0), accumulation=accumulation, mufu=mufu,
                     seed=int(seed), exact_stages=exact, mutations=muts,
                     params_source=params.source)
    mf = Mufu(mufu, seed, arch=arch)
    probe = stage_probe

    # --- layouts (b, h, s, d); GQA by head repetition
    rep = Hq // Hk
    Q = np.ascontiguousarray(qa.transpose(0, 2, 1, 3))
    K = np.repeat(ka.transpose(0, 2, 1, 3), rep, axis=1)
    V = np.repeat(va.transpose(0, 2, 1, 3), rep, axis=1)
    n_blocks = -(-Sk // tile_n) if Sk > 0 else 0
    pad = n_blocks * tile_n - Sk
    if pad:
        K = np.concatenate([K, np.zeros(K.shape[:2] + (pad, D), F32)], axis=2)
        V = np.concatenate([V, np.zeros(V.shape[:2] + (pad, Dv), F32)], axis=2)
    keep_p = keep_padded(keep, B, Hq, Sq, Sk, n_blocks * tile_n)

    # --- masking geometry (bottom-right alignment unless mutated)
    offset = Sk - Sq
    if "causal_top_left" in muts:
        offset = 0
    if "causal_off_by_one" in muts:
        offset = Sk - Sq + 1
    rows = np.arange(Sq)
    mb = rows // tile_m
    nmax = np.full(Sq, n_blocks)
    nmin = np.zeros(Sq, int)
    if is_causal or (wr is not None):
        n_idx = (mb + 1) * tile_m + offset + (0 if is_causal else wr)
        if "nblock_max_row_exclusive" in muts and not pack_gqa:   # source mutant fwd_causal_nblock_max_inclusive_row
            n_idx = n_idx - 1                                       # (unpacked calls: packed rows round it away)
        nmax = np.minimum(nmax, -(-n_idx // tile_n))
    if wl is not None:
        n_idx = mb * tile_m + offset - wl
        nmin = np.maximum(n_idx // tile_n, 0)
    if "tail_tile_dropped" in muts and pad:
        nmax = np.minimum(nmax, n_blocks - 1)

    # --- state
    shp = (B, Hq, Sq)
    m_dt = F64 if ({"s_accum", "softcap"} & exact) else F32
    l_dt = F64 if "row_sum" in exact else F32
    m = np.full(shp, -np.inf, m_dt)
    started = np.zeros(Sq, bool)
    O = np.zeros(shp + (Dv,), F32)
    if kernel == "sm90":
        l_part = np.zeros(shp + (4,), l_dt)   # per-thread partial sums (quad)
    l = np.zeros(shp, l_dt)
    p_max = np.zeros(shp, F32)
    pc_max = np.zeros(shp, F32)
    n_rescale = np.zeros(shp, np.int64)
    n_emu = 0
    n_tot = 0
    s_ex = "s_accum" in exact

    for nb in range(n_blocks - 1, -1, -1):
        act = (nb >= nmin) & (nb < nmax)
        if not act.any():
            continue
        ridx = np.flatnonzero(act)
        first = ~started[ridx]
        Qr = Q[:, :, ridx]
        kt = K[:, :, nb * tile_n:(nb + 1) * tile_n]
        vt = V[:, :, nb * tile_n:(nb + 1) * tile_n]
        cols = nb * tile_n + np.arange(tile_n)
        # S = Q K^T
        S = mma(Qr, kt, None, accumulation, exact=s_ex)
        if probe:
            probe(StageSample("s_accum", S, mma(Qr, kt, None, accumulation, exact=True),
                              {"abs_qk": np.matmul(np.abs(Qr.astype(F64)),
                                                   np.swapaxes(np.abs(kt.astype(F64)), -1, -2)),
                               "d": float(D)}))
        if has_softcap:
            S = _softcap(S, scale32, softcap, mf, "softcap" in exact, probe)
        # mask
        allowed = (cols[None, :] < Sk)
        ri = rows[ridx][:, None]
        if is_causal or wr is not None:
            allowed = allowed & (cols[None, :] <= ri + offset + (0 if is_causal else wr))
        if wl is not None:
            allowed = allowed & (cols[None, :] >= ri + offset - wl)
        allowed = allowed[None, None] if keep_p is None else allowed & keep_p[:, :, ridx, nb * tile_n:(nb + 1) * tile_n]
        neg_inf = np.array(-np.inf, dtype=S.dtype)
        S = np.where(allowed, S, neg_inf)
        # row max (fmax: NaN ignored)
        with np.errstate(invalid="ignore"):
            tmax = np.fmax.reduce(S, axis=-1)
        m_old = m[:, :, ridx]
        m_new = np.where(first, tmax, np.fmax(m_old, tmax)).astype(S.dtype)
        m_safe = np.where(m_new == -np.inf, np.zeros((), m_new.dtype), m_new)
        if "check_inf_dropped_causal" in muts and is_causal and wl is None and not pack_gqa:
            # source mutant causal_loop_check_inf_local_only: the causal masking loop's tiles (after
            # an M tile's first) keep a running max of -inf in the exponent (Note [Rows empty in
            # the first blocks])
            masking = nb >= (mb[ridx] * tile_m + offset) // tile_n
            m_safe = np.where(masking & ~first, m_new, m_safe).astype(m_new.dtype)
        # rescale factor
        scale_fac, m_use, m_safe = _rescale_factor(kernel, m_old, m_new, m_safe, first, c,
                                                   c_true, threshold, mf, exact, muts, probe)
        if "max_stored_after_inf_guard" in muts and kernel == "sm90":
            # the running max stored after its -inf -> 0 guard (a row fully masked in its first
            # tile then starts from 0, not from its first real score)
            m_use = np.where(m_use == -np.inf, np.zeros((), np.asarray(m_use).dtype), m_use)
        m[:, :, ridx] = m_use
        # exponent argument
        x = _exp_arg(kernel, S, m_safe, c, c_true, max_offset, "exp_arg" in exact, probe)
        # exp2
        emu_t = emu[:tile_n]
        P = _exp2(x, emu_t, mf, exact, muts, probe)
        n_emu += int(emu_t.sum()) * len(ridx)
        n_tot += tile_n * len(ridx)
        with np.errstate(invalid="ignore"):
            p_max[:, :, ridx] = np.fmax(p_max[:, :, ridx], np.fmax.reduce(P, axis=-1).astype(F32))
        # P cast
        if "p_cast" in exact:
            Pc = P
        else:
            Pc = cast_to(P, dt, rz=("p_cast_rz" in muts))
            if probe:
                fin = np.isfinite(P)
                probe(StageSample("p_cast", Pc, np.asarray(P, F64),
                                  {"p": np.abs(np.asarray(P, F64))}, where=fin))
        with np.errstate(invalid="ignore"):
            pc_max[:, :, ridx] = np.fmax(pc_max[:, :, ridx], np.fmax.reduce(Pc, axis=-1).astype(F32))
        Psum = Pc if "row_sum_rounded_p" in muts else P
        # row sum and O update
        if kernel == "sm90":
            lp = l_part[:, :, ridx]
            lp_init = np.where(first[..., None], np.zeros((), F32), lp)
            l_part[:, :, ridx] = _row_sum_sm90(Psum, lp_init, scale_fac, first, tile_n,
                                               "row_sum" in exact, "rescale" in exact, probe)
            Oi = O[:, :, ridx]
            Os = _scale_rows(Oi, scale_fac, np.ones_like(first), "rescale" in exact)
            n_rescale[:, :, ridx] += np.where(first, 0, np.asarray(scale_fac) != 1.0)
            Os = np.where(first[..., None], np.zeros((), Os.dtype), Os)
        else:
            li = l[:, :, ridx]
            l[:, :, ridx] = _store(_row_sum_sm100(Psum, li, scale_fac, first,
                                                  "row_sum" in exact, "rescale" in exact, probe))
            Oi = O[:, :, ridx]
            # warp vote: 32 consecutive rows of the 128-row tile share the decision
            sc = np.asarray(scale_fac, F64)
            need = np.where(first, False, sc < 1.0)
            grp = rows[ridx] // 32                       # non-decreasing (ridx is sorted)
            starts = np.concatenate([[0], np.flatnonzero(np.diff(grp)) + 1])
            anyg = np.logical_or.reduceat(need, starts, axis=-1)
            vote = np.repeat(anyg, np.diff(np.concatenate([starts, [len(grp)]])), axis=-1)
            if kernel == "sm100_hd256":
                vote = np.where(first, False, True)
            Os = _scale_rows(Oi, scale_fac, vote, "rescale" in exact)
            n_rescale[:, :, ridx] += np.where(vote & (sc != 1.0), 1, 0)
            Os = np.where(first[..., None], np.zeros((), Os.dtype), Os)
        Onew = mma(Pc, np.swapaxes(vt, -1, -2), Os, accumulation, exact=("pv_accum" in exact))
        if probe and "pv_accum" not in exact:
            Pc64, vt64 = np.asarray(Pc, F64), vt.astype(F64)
            with np.errstate(invalid="ignore"):
                sabs = np.abs(np.asarray(Os, F64)) + np.matmul(np.abs(Pc64), np.abs(vt64))
            probe(StageSample("pv_accum", Onew, np.asarray(Os, F64) + np.matmul(Pc64, vt64),
                              {"sum_abs_pv": sabs, "n_acc": float(tile_n + 1)}))
        O = O.astype(F64) if (Onew.dtype == F64 and O.dtype == F32) else O
        O[:, :, ridx] = Onew
        started[ridx] = True

    # --- finalize
    if kernel == "sm90":
        l = _quad_reduce(l_part, "row_sum" in exact, probe)
    if not started.all():
        pass  # rows without any KV block keep m=-inf, l=0, O=0 (FA4: O=0, lse=-inf)
    m_fin = m
    mc = _mul(m_fin, np.array(c)) if "lse" not in exact else np.asarray(m_fin, F64) * c_true
    if learnable_sink is not None:
        l, mc = _sink(kernel, l, m_fin, mc, learnable_sink, Hq, c, c_true, max_offset, mf,
                      "sink" in exact)
    l_arr = np.asarray(l)
    zero_nan = (l_arr == 0) | np.isnan(l_arr)
    l_safe = np.where(zero_nan, np.ones((), l_arr.dtype), l_arr)
    if "rcp" in exact:
        r = 1.0 / np.asarray(l_safe, F64)
    elif kernel == "sm100_hd256":
        r = _div(np.array(1.0, F32), l_safe)
    else:
        r = mf.rcp(l_safe)
        if "rcp_low_precision" in muts:
            r = b32.from_bits(b32.bits(r) & np.uint32(0xFFFFE000))   # 10-bit mantissa (RZ)
    if "recip_bias_2m9" in muts:
        # the production source mutant of the same name (fa4verify.mutants.source): the
        # finalize's 1 / row_sum times (1 + 2^-9), one fp32 multiply
        r = (np.asarray(r, F32) * F32(1.0 + 2.0 ** -9)).astype(F32)
    if probe and "rcp" not in exact:
        probe(StageSample("rcp", np.asarray(r), 1.0 / np.asarray(l_safe, F64),
                          {"rcp_exact": np.abs(1.0 / np.asarray(l_safe, F64))}))
    if vd_rows is not None and "v_descale_dropped" not in muts:      # FA4: scale = RN(rcp(l) * v_descale)
        r = r * vd_rows.astype(F64) if "rcp" in exact else b32.mul(np.asarray(r, F32), vd_rows)
    r_b = np.asarray(r)[..., None]
    if "normalize" in exact:
        y = np.asarray(O, F64) * np.asarray(r_b, F64)
    else:
        y = _mul(O, r_b)
        if probe:
            y64 = np.asarray(O, F64) * np.asarray(r_b, F64)
            probe(StageSample("normalize", y, y64, {"abs_or": np.abs(y64)}))
    if "o_cast" in exact:
        out = np.asarray(y, F64)
    else:
        out = cast_to(y, out_dtype)
        if probe:
            probe(StageSample("o_cast", out, np.asarray(y, F64),
                              {"abs_y": np.abs(np.asarray(y, F64))}))
    lse = _lse(kernel, m_fin, mc, l_safe, zero_nan, c_true, scale32, max_offset, mf,
               "lse" in exact, probe)
    stages = {"m": m_fin, "row_sum": l_arr, "o_acc": O, "rcp": np.asarray(r), "p_max": p_max,
              "o_fp32": np.ascontiguousarray(np.swapaxes(np.asarray(y), 1, 2)),
              "p_cast_max": pc_max, "n_rescale": n_rescale,
              "emulated_fraction": (n_emu / n_tot) if n_tot else 0.0,
              "scale_log2": float(c_base), "emulated_columns": emu.copy()}
    return TwinForwardResult(out=np.ascontiguousarray(np.swapaxes(out, 1, 2)), lse=lse,
                             stages=stages, config=cfg)


def keep_padded(keep, B: int, Hq: int, Sq: int, Sk: int, width: int):
    """A ``keep`` argument as (b, 1 or hq, sq, ``width``) booleans, False past ``Sk`` (None stays
    None); a shape that is neither (b, sq, sk) nor (b, hq, sq, sk) raises ValueError."""
    if keep is None:
        return None
    kp = np.asarray(keep, bool)
    if kp.ndim == 3:
        kp = kp[:, None]
    if kp.ndim != 4 or kp.shape[0] != B or kp.shape[1] not in (1, Hq) or kp.shape[2:] != (Sq, Sk):
        raise ValueError(f"keep: expected shape ({B}, {Sq}, {Sk}) or ({B}, {Hq}, {Sq}, {Sk}), got {np.shape(keep)}")
    out = np.zeros(kp.shape[:3] + (width,), bool)
    out[..., :Sk] = kp
    return out


def _store(x):
    return x


def _descale_factors(descales, batch: int, nheads_kv: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FA4's ``_load_effective_descales``: ``(RN(RN(1 * qd) * kd), vd)`` as fp32 (batch,
    nheads_kv) arrays, a missing descale 1.0, and the exact float64 product ``qd kd``."""
    out = []
    for t, name in zip(descales, ("q_descale", "k_descale", "v_descale")):
        if t is None:
            out.append(np.ones((batch, nheads_kv), F32))
            continue
        a = np.asarray(infer_dtype(t)[0], F64)
        if a.shape != (batch, nheads_kv) or not np.all(np.isfinite(a)) or np.any(a != a.astype(F32)):
            raise ValueError(f"{name}: expected finite fp32 values of shape ({batch}, {nheads_kv}), "
                             f"got {a.shape}")
        out.append(a.astype(F32))
    return b32.mul(out[0], out[1]), out[2], out[0].astype(F64) * out[1].astype(F64)


def _forward_varlen(q, k, v, cu_q, cu_k, kw) -> TwinForwardResult:
    """Varlen: FA4 processes each sequence with its own tiles (tiles never cross sequences), so
    the twin runs each sequence as a batch of one (``varlen_q=True`` for the emulated-column
    rule, i.e. FA4's ``cu_seqlens_q`` tuning).  Layouts: q (total_q, h, d), k/v (total_k, hk, d);
    ``out`` (total_q, h, dv), ``lse`` (h, total_q).  Empty sequences give out = 0, lse = -inf."""
    qa, qd = infer_dtype(q)
    ka, _ = infer_dtype(k)
    va, _ = infer_dtype(v)
    cq = np.asarray(infer_dtype(cu_q)[0] if not isinstance(cu_q, (list, tuple, np.ndarray))
                    else cu_q, np.int64).reshape(-1)
    ck = np.asarray(infer_dtype(cu_k)[0] if not isinstance(cu_k, (list, tuple, np.ndarray))
                    else cu_k, np.int64).reshape(-1)
    if qa.ndim != 3 or len(cq) != len(ck) or cq[-1] != qa.shape[0] or ck[-1] != ka.shape[0]:
        raise ValueError(f"varlen: q {qa.shape}, k {ka.shape}, cu_seqlens_q {cq.tolist()}, "
                         f"cu_seqlens_k {ck.tolist()} are inconsistent")
    if kw.get("dtype") is None:
        kw = {**kw, "dtype": qd or "bf16"}
    H, Dv = qa.shape[1], va.shape[-1]
    out = np.zeros((qa.shape[0], H, Dv), F32)
    lse = np.full((H, qa.shape[0]), -np.inf, F32)
    stages: dict[str, Any] = {"per_sequence": []}
    cfg = None
    for i in range(len(cq) - 1):
        a, b_ = int(cq[i]), int(cq[i + 1])
        c0, c1 = int(ck[i]), int(ck[i + 1])
        if b_ == a:
            continue
        if c1 == c0:
            if kw.get("learnable_sink") is not None:
                s_arr = np.asarray(infer_dtype(kw["learnable_sink"])[0], F32).reshape(H, 1)
                lse[:, a:b_] = s_arr
            continue
        kw_i = {n: (None if kw.get(n) is None else np.asarray(infer_dtype(kw[n])[0])[i:i + 1])
                for n in ("q_descale", "k_descale", "v_descale")}      # sequence i's (1, hk) factors
        r = forward(qa[None, a:b_], ka[None, c0:c1], va[None, c0:c1], _varlen_q=True, **{**kw, **kw_i})
        if r.out.dtype != out.dtype:
            out = out.astype(r.out.dtype)
        if r.lse.dtype != lse.dtype:
            lse = lse.astype(r.lse.dtype)
        out[a:b_] = r.out[0]
        lse[:, a:b_] = r.lse[0]
        stages["per_sequence"].append(r.stages)
        cfg = r.config
    if cfg is None:
        cfg = forward(np.zeros((1, 1, H, qa.shape[-1]), F32), np.zeros((1, 1, ka.shape[1], ka.shape[-1]), F32),
                      np.zeros((1, 1, va.shape[1], Dv), F32),
                      **{**kw, "q_descale": None, "k_descale": None, "v_descale": None}).config
    return TwinForwardResult(out=out, lse=lse, stages=stages, config=cfg)


# --------------------------------------------------------------------------- stage pieces
def _softcap(S, scale32, softcap, mf: Mufu, exact: bool, probe):
    """score = S*scale; softcap * tanh(score / softcap) (``create_softcap_scoremod``)."""
    S64 = np.asarray(S, F64)
    ex = float(softcap) * np.tanh(S64 * float(scale32) / float(softcap))
    if exact:
        return ex
    sc = _mul(S, np.array(scale32, F32)) if np.asarray(S).dtype == F32 else _rn32(S64 * float(scale32))
    t = _div(sc, np.array(F32(softcap)))
    out = _mul(np.array(F32(softcap)), mf.tanh(t))
    if probe:
        fin = np.isfinite(S64)
        probe(StageSample("softcap", out, ex, {"abs_out": np.abs(ex),
                                               "abs_score": np.abs(S64 * float(scale32)),
                                               "softcap": float(softcap)}, where=fin))
    return out


def _rescale_factor(kernel, m_old, m_new, m_safe, first, c, c_true, threshold, mf: Mufu,
                    exact, muts, probe):
    """Row-scale factor of the online softmax (SM90 ``row_scale``, SM100 ``acc_scale``).

    Returns (factor, m_to_store, m_safe_for_exp)."""
    with np.errstate(invalid="ignore", over="ignore"):
        if "rescale" in exact:
            arg64 = (np.asarray(m_old, F64) - np.asarray(m_safe, F64)) * c_true
            fac = np.exp2(arg64)
            arg = arg64
        else:
            arg = _mul(_sub(m_old, m_safe), np.array(c))
            fac = mf.ex2(arg)
            if probe:
                arg64 = (np.asarray(m_old, F64) - np.asarray(m_safe, F64)) * c_true
                ok = np.isfinite(arg64) & ~first
                probe(StageSample("rescale", fac, np.exp2(arg64),
                                  {"abs_arg": np.abs(np.where(ok, arg64, 0.0)),
                                   "scale_exact": np.exp2(np.where(ok, arg64, 0.0))}, where=ok))
    m_use = m_new
    if kernel == "sm100" and threshold > 0.0:
        keep = (~first) & (np.asarray(arg) >= -threshold)
        fac = np.where(keep, np.ones((), np.asarray(fac).dtype), fac)
        m_use = np.where(keep, m_old, m_new).astype(np.asarray(m_new).dtype)
        m_safe = np.where(keep, m_old, m_safe).astype(np.asarray(m_safe).dtype)
    if "rescale_skipped" in muts:
        fac = np.ones_like(np.asarray(fac))
    if kernel == "sm90":
        fac = np.where(first, np.ones((), np.asarray(fac).dtype), fac)
    else:
        fac = np.where(first, np.zeros((), np.asarray(fac).dtype), fac)
    return fac, m_use, m_safe


def _exp_arg(kernel, S, m_safe, c, c_true, max_offset, exact: bool, probe):
    """SM100: x = fma(S, c, max_offset - m*c); SM90/hd256: x = fma(S, c, -(m*c))."""
    S64 = np.asarray(S, F64)
    ms64 = np.asarray(m_safe, F64)[..., None]
    c_col = np.asarray(c)[..., None] if np.ndim(c) else np.array(c)       # per (b, h) with descales
    ct_col = np.asarray(c_true)[..., None] if np.ndim(c_true) else c_true
    with np.errstate(invalid="ignore", over="ignore"):
        ex = S64 * ct_col - ms64 * ct_col + max_offset
    if exact:
        return ex
    mc = _mul(np.asarray(m_safe), np.array(c))
    if kernel == "sm100":
        bias = _sub(np.array(F32(max_offset)), mc)
    else:
        bias = -mc
    x = _fma(S, c_col, np.asarray(bias)[..., None])
    if probe:
        fin = np.isfinite(ex)
        probe(StageSample("exp_arg", x, ex,
                          {"abs_sc": np.abs(S64 * ct_col), "abs_mc": np.abs(ms64 * ct_col),
                           "abs_x": np.abs(ex), "max_offset": float(max_offset)}, where=fin))
    return x


def _emu_custom(x32: np.ndarray, coeffs) -> np.ndarray:
    """FA4's packed emulation sequence with arbitrary fp32 coefficients (for mutations)."""
    from fa4verify.kernels.twin.exp2 import ROUND_INT, CLAMP_LO
    xc = b32.fmax(x32, CLAMP_LO)
    xr = b32.add(xc, ROUND_INT, "rm")
    xrb = b32.sub(xr, ROUND_INT, "rn")
    frac = b32.sub(xc, xrb, "rn")
    qv = np.full(frac.shape, coeffs[-1], dtype=F32)
    for cc in coeffs[-2::-1]:
        qv = b32.fma(qv, frac, np.full(frac.shape, cc, F32), "rn")
    return b32.from_bits(b32.add_i32(b32.shl_i32(b32.bits(xr), 23), b32.bits(qv)))


def emulated_exp2(x32: np.ndarray, muts=frozenset()) -> np.ndarray:
    """The polynomial exp2 FA4 uses on emulated columns (with the named mutations applied)."""
    from fa4verify.kernels.twin.exp2 import ex2_emulation, poly_coeffs_f32
    x32 = np.ascontiguousarray(x32, F32)
    if "poly_degree_2" in muts:
        y = ex2_emulation(x32, degree=2, variant="packed")
    elif "poly_coeff_ulp" in muts:
        cs = list(poly_coeffs_f32(3))
        cs[1] = np.nextafter(cs[1], F32(np.inf))
        y = _emu_custom(x32.reshape(-1), cs).reshape(x32.shape)
    else:
        y = ex2_emulation(x32, degree=3, variant="packed")
    if "nan_to_zero_emulated" in muts:
        y = np.where(np.isnan(x32), F32(1.0), y)
    return y


def _exp2(x, emu_cols, mf: Mufu, exact, muts, probe):
    """P = 2^x: MUFU on hardware columns (stage ``exp2``), FA4's polynomial on emulated columns
    (stage ``exp2_emu``); each stage switch makes only its own columns exact."""
    x = np.asarray(x)
    x64 = x.astype(F64)
    with np.errstate(over="ignore", invalid="ignore"):
        ex = np.exp2(x64)
    hw_exact = "exp2" in exact
    hw = ex if hw_exact else mf.ex2(x)
    has_emu = bool(emu_cols.any())
    if has_emu:
        xe = x[..., emu_cols]
        if "exp2_emu" in exact:
            pe = ex[..., emu_cols]
        else:
            xe32 = xe if xe.dtype == F32 else _rn32(xe)
            pe = emulated_exp2(xe32, muts)
    if probe:
        fin = np.isfinite(x64)
        if not hw_exact:
            probe(StageSample("exp2", hw, ex, {"p_exact": ex}, where=fin & ~emu_cols))
        if has_emu and "exp2_emu" not in exact:
            xe64 = x64[..., emu_cols]
            probe(StageSample("exp2_emu", np.asarray(pe), np.exp2(xe64),
                              {"p_exact": np.exp2(xe64)}, where=np.isfinite(xe64)))
    if not has_emu:
        return hw
    if np.asarray(pe).dtype == F64 or np.asarray(hw).dtype == F64:
        P = np.asarray(hw, F64).copy()
    else:
        P = hw.copy()
    P[..., emu_cols] = pe
    return P


def _seq_sum(terms: list, init):
    acc = init
    for t in terms:
        if acc is None:
            acc = t
        else:
            acc = _add(acc, t)
    return acc


def _row_sum_sm100(P, l_old, fac, first, exact: bool, rescale_exact: bool, probe):
    """``fadd_reduce`` (arch >= 100): init = l*acc_scale in lane 0; 8 lanes x 16 sequential adds
    over columns a, a+8, ...; combine (l0+l2, l1+l3), (l4+l6, l5+l7), then both, then lo+hi."""
    P = np.asarray(P)
    with np.errstate(invalid="ignore", over="ignore"):
        if rescale_exact:
            init = np.asarray(l_old, F64) * np.asarray(fac, F64)
        else:
            init = _mul(l_old, fac)
        init = np.where(first, np.zeros((), np.asarray(init).dtype), init)
        ex = np.asarray(init, F64) + np.asarray(P, F64).sum(axis=-1)
        if exact:
            return ex
        n = P.shape[-1]
        lanes = P.reshape(P.shape[:-1] + (n // 8, 8))
        acc = [lanes[..., 0, a] for a in range(8)]
        acc[0] = np.where(first, acc[0], _add(init, acc[0]))
        for j in range(1, n // 8):
            for a in range(8):
                acc[a] = _add(acc[a], lanes[..., j, a])
        # packed pairs: (acc0,acc1), (acc2,acc3), (acc4,acc5), (acc6,acc7)
        p01 = (_add(acc[0], acc[2]), _add(acc[1], acc[3]))
        p23 = (_add(acc[4], acc[6]), _add(acc[5], acc[7]))
        lo, hi = _add(p01[0], p23[0]), _add(p01[1], p23[1])
        res = _add(lo, hi)
        if probe:
            sabs = np.abs(np.asarray(init, F64)) + np.abs(np.asarray(P, F64)).sum(axis=-1)
            fin = np.isfinite(ex)
            probe(StageSample("row_sum", res, ex, {"sum_abs": sabs,
                                                   "n_add": float(n // 8 + 3)}, where=fin))
    return res


def _row_sum_sm90(P, lp_init, fac, first, tile_n, exact, rescale_exact, probe):
    """Per-thread partial sums: thread q of the quad owns columns 8j+2q+{0,1}; sequential
    ``reduce(ADD)`` with init = partial*row_scale (not on the first block)."""
    P = np.asarray(P)
    f = np.asarray(fac)[..., None]
    with np.errstate(invalid="ignore", over="ignore"):
        if rescale_exact:
            init = np.asarray(lp_init, F64) * np.asarray(f, F64)
        else:
            init = _mul(lp_init, f)
        init = np.where(first[..., None], np.zeros((), np.asarray(init).dtype), init)
        tv = P.reshape(P.shape[:-1] + (tile_n // 8, 4, 2))
        ex = np.asarray(init, F64) + np.asarray(tv, F64).sum(axis=(-3, -1))
        if exact:
            return ex
        acc = init
        for j in range(tile_n // 8):
            for e in range(2):
                acc = _add(acc, tv[..., j, :, e])
        if probe:
            sabs = np.abs(np.asarray(init, F64)) + np.abs(np.asarray(tv, F64)).sum(axis=(-3, -1))
            probe(StageSample("row_sum", acc, ex, {"sum_abs": sabs,
                                                   "n_add": float(tile_n // 4)},
                              where=np.isfinite(ex)))
    return acc


def _quad_reduce(l_part, exact, probe):
    """``warp_reduce(width=4)``: butterfly offsets 1 then 2 -> (s0+s1)+(s2+s3)."""
    lp = np.asarray(l_part)
    ex = lp.astype(F64).sum(axis=-1)
    if exact:
        return ex
    r = _add(_add(lp[..., 0], lp[..., 1]), _add(lp[..., 2], lp[..., 3]))
    if probe:
        probe(StageSample("row_sum", r, ex, {"sum_abs": np.abs(lp.astype(F64)).sum(axis=-1),
                                             "n_add": 2.0}, where=np.isfinite(ex)))
    return r


def _scale_rows(O, fac, do, exact):
    f = np.asarray(fac)[..., None]
    d = np.asarray(do)[..., None]
    if exact:
        return np.where(d, np.asarray(O, F64) * np.asarray(f, F64), np.asarray(O, F64))
    return np.where(d, _mul(O, f), O)


def _sink(kernel, l, m, mc, sink, H, c, c_true, max_offset, mf: Mufu, exact):
    """Fold the learnable sink into (l, m*c): ``apply_learnable_sink`` (SM100) /
    ``Softmax.finalize`` (SM90)."""
    s_arr, _ = infer_dtype(sink)
    s32 = np.asarray(s_arr, F32).reshape(1, H, 1)
    L2E = np.array(F32(LOG2_E))
    m = np.asarray(m)
    empty = m == -np.inf
    if exact:
        s64 = s32.astype(F64)
        mc64 = np.where(empty, s64 * LOG2_E, np.asarray(m, F64) * c_true)
        term = np.exp2(s64 * LOG2_E - mc64 + max_offset)
        l64 = np.where(empty, 2.0**max_offset, np.asarray(l, F64) + term)
        if kernel == "sm90":
            l64 = np.where(empty, np.asarray(l, F64) + 1.0, l64)
        return l64, mc64
    s_l2e = _mul(s32, L2E)
    if kernel == "sm90":
        mcs = np.where(empty, s_l2e, mc)
        term = mf.ex2(_sub(s_l2e, mcs))
        return _add(l, term), mcs
    # SM100: row_max = sink * (LOG2_E / c) when empty; row_sum = 2^max_offset
    m_sink = _mul(s32, _div(L2E, np.array(c)))
    m2 = np.where(empty, m_sink, m)
    term = mf.ex2(_add(_sub(s_l2e, _mul(m2, np.array(c))), np.array(F32(max_offset))))
    l2 = np.where(empty, F32(2.0**max_offset), _add(l, term))
    return l2, _mul(m2, np.array(c))


def _lse(kernel, m, mc, l_safe, zero_nan, c_true, scale32, max_offset, mf: Mufu, exact, probe):
    m64 = np.asarray(m, F64)
    l64 = np.asarray(l_safe, F64)
    with np.errstate(invalid="ignore", divide="ignore"):
        if kernel == "sm100_hd256":
            ex = float(scale32) * m64 + np.log(l64)
        else:
            ex = (np.asarray(mc, F64) + np.log2(l64) - max_offset) * LN2
        ex = np.where(zero_nan, -np.inf, ex)
        if exact:
            return ex
        if kernel == "sm100_hd256":
            lse = _add(_mul(np.array(scale32), m), _mul(mf.lg2(l_safe), np.array(F32(LN2))))
        elif kernel == "sm100":
            lse = _mul(_add(mc, _sub(mf.lg2(l_safe), np.array(F32(max_offset)))),
                       np.array(F32(LN2)))
        else:
            lse = _mul(_add(mc, mf.lg2(l_safe)), np.array(F32(LN2)))
        lse = np.where(zero_nan, F32(-np.inf), lse).astype(F32)
        if probe:
            ok = np.isfinite(ex)
            probe(StageSample("lse", lse, ex,
                              {"abs_mc": np.abs(np.where(ok, np.asarray(mc, F64), 0.0)),
                               "abs_lg2": np.abs(np.log2(l64)), "abs_lse": np.abs(np.where(ok, ex, 0)),
                               "max_offset": float(max_offset)}, where=ok))
    return lse
