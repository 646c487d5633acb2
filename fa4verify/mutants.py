"""Verifier power: a catalogue of numeric mutants of FA4 and a detection table.

What this measures
------------------
A verifier that never fails is worthless; one that fails on correct code is worse. This module
plants known numeric faults ("mutants") into the CPU twin of FA4
(``fa4verify.kernels.twin_attention``, through its ``mutations=`` parameter) and runs, side by
side, on a fixed battery of problems:

* **fa4verify** -- the checks fa4verify applies to such a fault (each a column of its own):
  ``exp2_cert`` (the exp2 emulation's certified error bound and bf16 wrong-count, for polynomial
  mutants), ``exp2_golden`` (bit-exactness of the exp2 emulation against the unmutated twin on a
  fixed input set -- the bit-exact gate fa4verify applies to probes and golden vectors),
  ``fwd_budget`` / ``bwd_budget`` (end-to-end output / gradients vs the certified oracle
  ``fa4verify.oracles.attention`` within the composed error budget, NaN locations included),
  ``stages`` (per-stage invariants of the twin's intermediate data, when the twin exposes them)
  and ``determinism`` (bitwise run-to-run and schedule-order reproducibility of the
  deterministic backward).
* **FA rule** -- FlashAttention's upstream accuracy test, reimplemented faithfully on the CPU
  (:func:`attention_ref_torch`, :func:`fa_rule`): ``max|out - ref| <= rtol * max|out_pt - ref|
  + atol``.
* **assert_close** -- ``torch.testing.assert_close`` with its defaults against the same
  fp32 reference rounded to the input dtype (bf16: rtol 1.6e-2, atol 1e-5).

A verifier *catches* a mutant when, on at least one battery problem, it passes the unmutated
twin and fails the mutant (a problem on which it fails the unmutated twin is a *false alarm*
and cannot count as a detection). Every figure here is labelled "CPU twin"; the production
column (``--target production``, run on a GPU by someone holding one) covers only faults that
FA4 lets a caller express through its public API (see :data:`PRODUCTION_KNOBS`).

Note [Upstream rule, reimplemented]
-----------------------------------
FlashAttention's test ``tests/cute/test_flash_attn.py`` (Dao-AILab/flash-attention at
``0251105a2fb19d2957484b7f023cd8c115286ced``) computes two references with
``flash_attn/cute/testing.py:326-470`` (``attention_ref``; identical line numbers in the
installed flash-attn-4 4.0.0b36):

* ``out_ref = attention_ref(q, k, v, ...)`` -- ``upcast=True``: q, k, v cast to fp32
  (``testing.py:359-362``), ``scores = einsum(q * scale, k)`` (``:379-383``), masks as ``-inf``
  (``:395-432``), ``torch.softmax`` (``:439``), ``einsum(P, v)`` (``:465``), and the output
  rounded back to the input dtype (``:470``);
* ``out_pt = attention_ref(..., upcast=False, reorder_ops=True)`` (test ``:430-448``): everything
  in the input dtype, with the scale folded into k (``k * scale`` rounded to bf16), bf16 softmax,
  bf16 GEMMs; for fp8 inputs the reference dtype is bf16 (``:341``) and P is additionally rounded
  through fp8 (``intermediate_dtype``, ``:447``, ``testing.py:463-464``);
* forward: ``fwd_atol = 2 * max|(out_ref + 0.3 - 0.3) - out_ref|`` evaluated in the reference
  dtype, ``rtol = 2`` (3 with softcap) (test ``:462-463``), and the assertion
  ``max|out - out_ref| <= rtol * max|out_pt - out_ref| + fwd_atol`` (``:513-515``);
* backward: ``g = randn_like(out)``; ``grads_ref``/``grads_pt`` by autograd through the two
  references (``:534, 562-566``); for each of dQ, dK, dV
  ``atol = 2 * max|(ref + 0.3 - 0.3) - ref|`` (+3e-4 with softcap) and the same inequality
  (``:601-618``); backward is only checked when not ``(causal or local) and seqlen_k < seqlen_q``
  and never for fp8 (``:517-529``) -- :func:`upstream_bwd_applies` encodes that gate.

The port here runs the same torch operations on the CPU (torch CPU bf16 matmuls accumulate in
fp32 and round once, env_feasibility.md section 5.2; the GPU's cuBLAS order differs, so ``out_pt``
may differ from a GPU run by fp32 summation-order effects). ``tests/test_mutants_upstream.py``
checks it against the installed ``flash_attn.cute.testing.attention_ref`` bit for bit.
NaN: ``max`` of a tensor with a NaN is NaN and ``NaN <= x`` is False, so the upstream rule fails
whenever the kernel output (or the reference) holds a NaN -- reproduced as is.
"""
from __future__ import annotations

import dataclasses
import math
import zlib
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

import numpy as np

__all__ = [
    "Mutant", "CATALOGUE", "MUTANT_NAMES", "PRODUCTION_KNOBS", "Problem", "battery",
    "Verdict", "attention_ref_torch", "fa_rule", "upstream_bwd_applies",
    "ASSERT_CLOSE_DEFAULTS", "assert_close_verdict", "fa_rule_forward", "fa_rule_backward",
    "run_suite", "SuiteResult", "render_table", "VERIFIERS",
]

Arch = Literal["sm90", "sm100"]
Status = Literal["pass", "fail", "n/a", "error"]


# =============================================================================== the catalogue
@dataclasses.dataclass(frozen=True)
class Mutant:
    """One planted numeric fault.

    ``name`` is the twin's mutation name (``twin_attention.forward(..., mutations={name})``).
    ``archs``: the twin archs on which the fault changes anything (the suite runs the mutant on
    these only). ``passes``: which passes it corrupts. ``poly`` marks exp2-polynomial mutants
    (the exp2 certification applies). ``production``: how (if at all) the same fault can be
    produced in production FA4 through a public knob; ``None`` = not expressible (the fault sits
    in hard-coded kernel code).
    """

    name: str
    title: str
    stage: str
    archs: tuple[Arch, ...]
    passes: tuple[Literal["fwd", "bwd"], ...]
    poly: bool = False
    fp8_only: bool = False
    production: str | None = None
    source: str = ""


CATALOGUE: tuple[Mutant, ...] = (
    Mutant("poly_degree_2", "degree-2 exp2 polynomial instead of degree 3", "exp2 (emulated)",
           ("sm100",), ("fwd",), poly=True,
           source="POLY_EX2[2], fc/utils.py:28-62; PR #2316 proposes degree 2"),
    Mutant("poly_coeff_ulp", "degree-3 polynomial with one coefficient off by 1 fp32 ulp",
           "exp2 (emulated)", ("sm100",), ("fwd",), poly=True,
           source="POLY_EX2[3], fc/utils.py:28-62"),
    Mutant("p_cast_rz", "P cast to bf16 with RZ instead of RNE", "P cast",
           ("sm90", "sm100"), ("fwd", "bwd"),
           source="cvt.rn / .to(dtype), fc/softmax.py:400-401, fc/utils.py:630-685"),
    Mutant("rescale_skipped", "O rescale skipped when the row max grows", "O rescale",
           ("sm90", "sm100"), ("fwd",),
           source="correction warps, fc/flash_fwd_sm100.py:2679-2702; fc/softmax.py:230-241"),
    Mutant("fp8_old_threshold", "fp8: rescale_threshold 4 with max_offset 8 (FA #2577)",
           "row max / P scaling", ("sm100",), ("fwd",), fp8_only=True,
           source="fc/flash_fwd_sm100.py:2182, 2190; #2577, #2716"),
    Mutant("nan_to_zero_emulated", "NaN scores turned to 0 in emulated lanes only",
           "exp2 (emulated)", ("sm100",), ("fwd",),
           source="fmax(NaN, -127) = -127 in ex2_emulation_2, fc/utils.py:776"),
    Mutant("causal_top_left", "causal mask aligned top-left instead of bottom-right", "mask",
           ("sm90", "sm100"), ("fwd", "bwd"),
           production="window_size=(None, seqlen_q - seqlen_k) with causal=False",
           source="causal_row_offset, fc/mask.py:714-721"),
    Mutant("causal_off_by_one", "causal mask off by one column", "mask",
           ("sm90", "sm100"), ("fwd", "bwd"),
           production="window_size=(None, 1) with causal=False",
           source="fc/mask.py"),
    Mutant("tail_tile_dropped", "last partial KV tile dropped", "tiling",
           ("sm90", "sm100"), ("fwd", "bwd"),
           production="flash_attn_varlen_func(seqused_k = seqlen_k rounded down to the KV tile)",
           source="n_block_max, fc/block_info.py"),
    Mutant("row_sum_rounded_p", "row sum from the rounded (bf16) P instead of fp32 P", "row sum",
           ("sm90", "sm100"), ("fwd",),
           source="update_row_sum on fp32 P, fc/softmax.py:334-339"),
    Mutant("rcp_low_precision", "rcp.approx replaced by a 2^-10-accurate reciprocal",
           "normalize", ("sm90", "sm100"), ("fwd",),
           source="rcp_approx, fc/flash_fwd_sm100.py:2743-2746; fc/softmax.py:216-220"),
    Mutant("d_from_fp32_o", "D = rowsum(dO * O) from the fp32 O instead of the rounded O",
           "bwd preprocess", ("sm90", "sm100"), ("bwd",),
           source="fc/flash_bwd_preprocess.py:389-397"),
    Mutant("dq_shuffled_order", "shuffled dQ accumulation order under deterministic=True",
           "dQ accumulation", ("sm90", "sm100"), ("bwd",),
           production="deterministic=False (atomic, unordered fp32 reduce-add)",
           source="semaphores, fc/flash_bwd_sm90.py:1880-1918; fc/barrier.py"),
)

MUTANT_NAMES: tuple[str, ...] = tuple(m.name for m in CATALOGUE)

#: Mutants the production column can express through FA4's public API on the H200 (SM90 kernels);
#: every other mutant is hard-coded kernel arithmetic. SM100-only knob (not runnable on the H200):
#: ``ex2_emu_freq = 0`` in ``flash_attn.cute.flash_fwd_sm100._TUNING_CONFIG`` turns the exp2
#: emulation off (fa4_numerics.md section 9.4) -- not a fault, so not a mutant here.
PRODUCTION_KNOBS: dict[str, str] = {m.name: m.production for m in CATALOGUE if m.production}


def get_mutant(name: str) -> Mutant:
    for m in CATALOGUE:
        if m.name == name:
            return m
    raise KeyError(f"unknown mutant {name!r}; known: {', '.join(MUTANT_NAMES)}")


# ============================================================================== the battery
@dataclasses.dataclass(frozen=True)
class Problem:
    """One attention problem of the fixed battery (layout (batch, seqlen, nheads, headdim)).

    ``kind``: ``"randn"`` (N(0,1) inputs rounded to ``dtype``), ``"peaked"`` (rows whose running
    max grows across KV tiles by ``growth`` log2 units -- near FA4's lazy-rescale threshold of 8),
    ``"nan"`` (a NaN in one key, so one score column of every row is NaN; one NaN key per head,
    placed at the KV columns in ``nan_cols``). ``dtype`` is the input dtype ("bf16" or "fp8",
    e4m3fn; fp8 output and reference are bf16). ``bwd``: run the backward pass too.
    """

    name: str
    seqlen_q: int
    seqlen_k: int
    head_dim: int = 64
    batch: int = 1
    nheads: int = 2
    causal: bool = False
    dtype: Literal["bf16", "fp8"] = "bf16"
    kind: Literal["randn", "peaked", "nan"] = "randn"
    growth: tuple[float, ...] = ()
    nan_cols: tuple[int, ...] = ()
    bwd: bool = True
    archs: tuple[Arch, ...] = ("sm90", "sm100")
    note: str = ""

    @property
    def softmax_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    def describe(self) -> str:
        bits = [f"{self.dtype} b{self.batch} h{self.nheads} d{self.head_dim}",
                f"sq={self.seqlen_q} sk={self.seqlen_k}"]
        if self.causal:
            bits.append("causal")
        if self.kind != "randn":
            bits.append(self.kind)
        return " ".join(bits)


def battery(profile: Literal["quick", "full"] = "quick") -> tuple[Problem, ...]:
    """The fixed battery. ``quick`` keeps every problem tiny (CI, < ~1 min for the whole suite);
    ``full`` adds larger and more varied shapes. Every problem exists for a reason written in its
    ``note``; the mutants each need at least one problem that exposes them."""
    q: list[Problem] = [
        Problem("tile_edge", 64, 130, note="one full 128-key tile + a 2-key tail; bwd"),
        Problem("causal_sq_lt_sk", 48, 200, causal=True,
                note="bottom-right causal, seqlen_q < seqlen_k, partial tail tile"),
        Problem("causal_sq_gt_sk", 150, 70, causal=True, bwd=True,
                note="bottom-right causal, seqlen_q > seqlen_k: fully masked first rows"),
        Problem("peaked_rescale", 32, 384, kind="peaked", growth=(5.0, 7.9, 8.1, 9.0, 12.0),
                note="row max grows across KV tiles by 5..12 log2 units (threshold 8)"),
        Problem("nan_scores", 16, 128, kind="nan", nan_cols=(44, 3), bwd=False,
                note="a NaN key at column 44 (emulated on SM100 hd64) in head 0 and column 3 "
                     "(MUFU) in head 1"),
        Problem("fp8_peaked", 32, 256, dtype="fp8", kind="peaked", growth=(1.5, 2.5, 3.5),
                bwd=False, archs=("sm100",),
                note="fp8 (SM100 only, fwd only): row max grows by 1.5..3.5 log2 units, where "
                     "the old threshold 4 skips the rescale and P*2^8 saturates e4m3"),
    ]
    if profile == "quick":
        return tuple(q)
    if profile != "full":
        raise ValueError(f"unknown profile {profile!r}; expected 'quick' or 'full'")
    full = q + [
        Problem("square_256", 256, 256, head_dim=128, nheads=3, note="hd128, two full tiles"),
        Problem("odd_113_203", 113, 203, head_dim=64, batch=2, note="odd lengths from upstream"),
        Problem("causal_255_256", 255, 256, causal=True, head_dim=128,
                note="upstream's (255,256) causal"),
        Problem("causal_square_257", 257, 257, causal=True, head_dim=64,
                note="square causal, 1-key tail tile"),
        Problem("peaked_rescale_hd128", 64, 512, head_dim=128, kind="peaked",
                growth=(6.0, 7.95, 8.05, 10.0, 16.0, 20.0), note="more growth values, hd128"),
        Problem("nan_scores_hd128", 32, 256, head_dim=128, kind="nan", nan_cols=(40, 100),
                bwd=False, note="NaN at column 40 (emulated for hd128 pack/2-CTA configs) and 100"),
        Problem("fp8_randn", 64, 256, dtype="fp8", bwd=False, archs=("sm100",),
                note="fp8 without peaks"),
        Problem("fp8_peaked_hd128", 64, 384, head_dim=128, dtype="fp8", kind="peaked",
                growth=(0.5, 2.0, 3.5, 6.0), bwd=False, archs=("sm100",), note="fp8 peaks, hd128"),
    ]
    return tuple(full)


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(name.encode())])


def _round_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    from fa4verify import binary32 as b32
    x = np.asarray(x, dtype=np.float32)
    if dtype == "bf16":
        return b32.to_bf16(x)
    if dtype == "fp8":
        return b32.to_fp8_e4m3fn(x)
    raise ValueError(f"unsupported dtype {dtype!r}")


@dataclasses.dataclass(frozen=True)
class ProblemData:
    """Inputs of one problem: float32 arrays holding exactly representable values of
    ``problem.dtype`` (q, k, v) and of bf16 (dout)."""

    problem: Problem
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    dout: np.ndarray


def make_inputs(p: Problem, seed: int = 0) -> ProblemData:
    """Deterministic inputs for ``p`` (depend only on ``seed`` and ``p.name``)."""
    rng = _rng(seed, p.name)
    b, sq, sk, h, d = p.batch, p.seqlen_q, p.seqlen_k, p.nheads, p.head_dim
    q = rng.standard_normal((b, sq, h, d)).astype(np.float32)
    k = rng.standard_normal((b, sk, h, d)).astype(np.float32)
    v = rng.standard_normal((b, sk, h, d)).astype(np.float32)
    if p.kind == "peaked":
        # Rows are split into groups j = i % len(growth). Row i's query is B*e_(1+j) plus small
        # noise; tile-0 keys are small noise (scores ~0). In every later KV tile t >= 1, key
        # t*128 + 5 + 7j is gamma_{t,j} * e_(1+j), so rows of group j (and only they: the other
        # groups' queries are orthogonal to it) see their score max grow by growth[j] log2 units
        # (x = S * scale * log2 e) at each tile boundary; the peak sits in MUFU column 5 + 7j.
        ngr = len(p.growth)
        if ngr == 0 or 1 + ngr > d:
            raise ValueError(f"{p.name}: peaked needs 1 <= len(growth) < head_dim")
        c = p.softmax_scale * math.log2(math.e)
        big = np.float32(4.0)
        q *= np.float32(0.05)
        k *= np.float32(0.05)
        for i in range(sq):
            q[:, i, :, 1:1 + ngr] = 0.0
            q[:, i, :, 1 + i % ngr] = big
        for t in range(1, -(-sk // 128)):
            for j, g in enumerate(p.growth):
                col = t * 128 + 5 + 7 * j
                if col < sk:
                    k[:, col, :, :] = 0.0
                    k[:, col, :, 1 + j] = np.float32(t * g / (c * float(big)))
    q = _round_dtype(q, p.dtype)
    k = _round_dtype(k, p.dtype)
    v = _round_dtype(v, p.dtype)
    if p.kind == "nan":
        for h_idx, col in enumerate(p.nan_cols):
            if h_idx < h and col < sk:
                k[:, col, h_idx, 0] = np.float32(np.nan)
    dout = _round_dtype(rng.standard_normal((b, sq, h, d)).astype(np.float32), "bf16")
    return ProblemData(p, q, k, v, dout)


# ===================================================================== verdicts (one cell each)
@dataclasses.dataclass(frozen=True)
class Verdict:
    """One verifier's outcome on one (mutant or unmutated twin, problem).

    ``status``: "pass", "fail", "n/a" (the verifier does not apply here) or "error".
    ``figure``: the deciding number, ``measured / threshold`` for tolerance rules (> 1 fails),
    a count for bitwise / determinism checks (> 0 fails); ``None`` when not applicable.
    ``detail``: one line a person can act on (what was compared, with which numbers).
    """

    status: Status
    figure: float | None = None
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.status == "fail"


NA = Verdict("n/a")


# ============================================================== FlashAttention's upstream rule
def _torch():
    import torch
    return torch


def _torch_dtype(name: str):
    torch = _torch()
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn,
            "fp32": torch.float32}[name]


def _local_mask(seqlen_q: int, seqlen_k: int, window_size, device=None):
    """``construct_local_mask`` (``flash_attn/cute/testing.py:252-291``) without padding masks,
    key_leftpad or sink tokens: True where the score is masked. Bottom-right aligned."""
    torch = _torch()
    row_idx = torch.arange(seqlen_q, dtype=torch.long).reshape(seqlen_q, 1)
    col_idx = torch.arange(seqlen_k, dtype=torch.long)
    sk, sq = seqlen_k, seqlen_q
    if window_size[0] is None:
        return col_idx > row_idx + sk - sq + window_size[1]
    sk_t = torch.full_like(col_idx, seqlen_k)
    if window_size[1] is None:
        local_mask_left = col_idx > sk_t
    else:
        local_mask_left = col_idx > torch.minimum(row_idx + sk - sq + window_size[1], sk_t)
    return torch.logical_or(local_mask_left, col_idx < row_idx + sk - sq - window_size[0])


def attention_ref_torch(q, k, v, *, causal: bool = False, window_size=(None, None),
                        learnable_sink=None, softcap: float = 0.0, upcast: bool = True,
                        reorder_ops: bool = False, intermediate_dtype=None):
    """FlashAttention's ``attention_ref`` (``flash_attn/cute/testing.py:326-470``), the subset the
    accuracy tests use (no padding masks, qv, descales, dropout, attention chunks or gathers).

    Same torch operations in the same order, so on the CPU it is bit-identical to the upstream
    function (checked by ``tests/test_mutants_upstream.py``). ``q, k, v``: torch tensors
    (batch, seqlen, nheads, headdim), GQA by repetition as upstream. Returns
    ``(output, attention)`` in ``v``'s original dtype, as upstream.
    """
    torch = _torch()
    if causal:
        window_size = (window_size[0], 0)
    dtype_og = v.dtype
    q_shape = q.shape
    if upcast:
        q, k, v, learnable_sink = [t.float() if t is not None else None
                                   for t in (q, k, v, learnable_sink)]
    seqlen_q, seqlen_k = q_shape[1], v.shape[1]
    # einops ``repeat(t, "b s h d -> b s (h g) d")`` (testing.py:371-374) == repeat_interleave
    k, v = [t.repeat_interleave(q_shape[2] // t.shape[2], dim=2) for t in (k, v)]
    d = q_shape[-1]
    softmax_scale = 1.0 / math.sqrt(d)
    scores = torch.einsum("bthd,bshd->bhts", q if reorder_ops else q * softmax_scale,
                          k * softmax_scale if reorder_ops else k)
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    local_mask = None
    if window_size[0] is not None or window_size[1] is not None:
        local_mask = _local_mask(seqlen_q, seqlen_k, window_size)
    if local_mask is not None:
        scores.masked_fill_(local_mask, float("-inf"))
    if learnable_sink is None:
        attention = torch.softmax(scores, dim=-1).to(v.dtype)
    else:
        scores_fp32 = scores.to(torch.float32)
        logits_max = torch.amax(scores_fp32, dim=-1, keepdim=True)
        learnable_sink = learnable_sink.reshape(-1, 1, 1)  # rearrange "h -> h 1 1"
        logits_or_sinks_max = torch.maximum(learnable_sink, logits_max)
        unnormalized_scores = torch.exp(scores_fp32 - logits_or_sinks_max)
        normalizer = unnormalized_scores.sum(dim=-1, keepdim=True) + torch.exp(
            learnable_sink - logits_or_sinks_max)
        attention = (unnormalized_scores / normalizer).to(v.dtype)
    if local_mask is not None:
        attention = attention.masked_fill(torch.all(local_mask, dim=-1, keepdim=True), 0.0)
    attention_drop = attention
    if intermediate_dtype is not None:
        attention_drop = attention_drop.to(intermediate_dtype).to(attention_drop.dtype)
    output = torch.einsum("bhts,bshd->bthd", attention_drop, v)
    return output.to(dtype=dtype_og), attention.to(dtype=dtype_og)


@dataclasses.dataclass(frozen=True)
class RuleOutcome:
    """``max|actual - ref| <= rtol * max|pt - ref| + atol``: the numbers and the verdict."""

    passed: bool
    diff_max: float
    diff_pt_max: float
    rtol: float
    atol: float

    @property
    def threshold(self) -> float:
        return self.rtol * self.diff_pt_max + self.atol

    @property
    def ratio(self) -> float:
        """diff_max / threshold (> 1 fails; NaN when a NaN is involved)."""
        t = self.threshold
        if math.isnan(self.diff_max) or math.isnan(t):
            return float("nan")
        return self.diff_max / t if t > 0 else (math.inf if self.diff_max > 0 else 0.0)


def fa_rule(actual, ref, pt, *, rtol: float = 2.0, extra_atol: float = 0.0) -> RuleOutcome:
    """The upstream inequality (test ``:462-463, 513-515`` forward; ``:601-618`` backward), with
    ``atol = 2 * max|(ref + 0.3 - 0.3) - ref|`` computed in ``ref``'s dtype plus ``extra_atol``.
    ``actual``, ``ref``, ``pt``: torch tensors of one dtype (ref's). Python ``<=`` on floats, as
    upstream: a NaN anywhere makes it fail."""
    atol = 2 * (ref + 0.3 - 0.3 - ref).abs().max().item() + extra_atol
    diff_max = (actual - ref).abs().max().item()
    diff_pt_max = (pt - ref).abs().max().item()
    passed = bool(diff_max <= rtol * diff_pt_max + atol)
    return RuleOutcome(passed, float(diff_max), float(diff_pt_max), float(rtol), float(atol))


def upstream_bwd_applies(p: Problem) -> bool:
    """Upstream checks gradients only for 16-bit inputs, and not when
    ``(causal or local) and seqlen_k < seqlen_q`` (test ``:517-529``)."""
    return p.dtype != "fp8" and p.bwd and not (p.causal and p.seqlen_k < p.seqlen_q)


def _ref_inputs(data: ProblemData, requires_grad: bool = False):
    """q, k, v as upstream's ``q_ref, k_ref, v_ref``: tensors of ``dtype_ref`` (bf16 for fp8
    inputs, test ``:341``) holding the exact input values."""
    torch = _torch()
    ref_dtype = torch.bfloat16  # bf16 problems and fp8 problems (dtype_ref) alike
    out = []
    for a in (data.q, data.k, data.v):
        t = torch.from_numpy(np.ascontiguousarray(a)).to(ref_dtype)
        if requires_grad:
            t.requires_grad_()
        out.append(t)
    return out


def _as_bf16_tensor(a: np.ndarray):
    torch = _torch()
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(torch.bfloat16)


@dataclasses.dataclass
class UpstreamRefs:
    """``out_ref``/``out_pt`` (and gradients when asked) for one problem, computed once."""

    out_ref: Any
    out_pt: Any
    grads_ref: tuple | None = None
    grads_pt: tuple | None = None


def upstream_refs(data: ProblemData, *, with_grads: bool) -> UpstreamRefs:
    """Both upstream references (and their autograd gradients for ``g = data.dout``)."""
    torch = _torch()
    p = data.problem
    qr, kr, vr = _ref_inputs(data, requires_grad=with_grads)
    inter = torch.float8_e4m3fn if p.dtype == "fp8" else None
    ctx = torch.enable_grad() if with_grads else torch.no_grad()
    with ctx:
        out_ref, _ = attention_ref_torch(qr, kr, vr, causal=p.causal)
        out_pt, _ = attention_ref_torch(qr, kr, vr, causal=p.causal, upcast=False,
                                        reorder_ops=True, intermediate_dtype=inter)
        grads_ref = grads_pt = None
        if with_grads:
            g = _as_bf16_tensor(data.dout)
            grads_ref = torch.autograd.grad(out_ref, (qr, kr, vr), g, retain_graph=False)
            grads_pt = torch.autograd.grad(out_pt, (qr, kr, vr), g, retain_graph=False)
    return UpstreamRefs(out_ref.detach(), out_pt.detach(),
                        tuple(x.detach() for x in grads_ref) if grads_ref else None,
                        tuple(x.detach() for x in grads_pt) if grads_pt else None)


def fa_rule_forward(out: np.ndarray, refs: UpstreamRefs, *, softcap: float = 0.0) -> Verdict:
    """The upstream forward rule on a kernel output ``out`` (float32 array of bf16 values)."""
    r = fa_rule(_as_bf16_tensor(out), refs.out_ref, refs.out_pt,
                rtol=2.0 if softcap == 0.0 else 3.0)
    return Verdict("pass" if r.passed else "fail", r.ratio,
                   f"max|out-ref|={r.diff_max:.3g} vs {r.rtol:g}*{r.diff_pt_max:.3g}"
                   f"+{r.atol:.3g}")


def fa_rule_backward(grads: Sequence[np.ndarray], refs: UpstreamRefs,
                     *, softcap: float = 0.0) -> Verdict:
    """The upstream backward rule on (dq, dk, dv): fails if any of the three fails; the figure
    is the worst ratio."""
    if refs.grads_ref is None:
        return NA
    rtol = 2.0 if softcap == 0.0 else 3.0
    extra = 0.0 if softcap == 0.0 else 3e-4
    worst: tuple[float, str] = (-1.0, "")
    ok = True
    for name, a, ref, pt in zip(("dq", "dk", "dv"), grads, refs.grads_ref, refs.grads_pt):
        r = fa_rule(_as_bf16_tensor(a), ref, pt, rtol=rtol, extra_atol=extra)
        ok &= r.passed
        ratio = r.ratio if not math.isnan(r.ratio) else math.inf
        if ratio > worst[0]:
            worst = (ratio, f"{name}: max|d-ref|={r.diff_max:.3g} vs {r.rtol:g}*"
                            f"{r.diff_pt_max:.3g}+{r.atol:.3g}")
    return Verdict("pass" if ok else "fail", worst[0], worst[1])


#: ``torch.testing.assert_close`` defaults (torch/testing/_comparison.py ``_DTYPE_PRECISIONS``)
ASSERT_CLOSE_DEFAULTS: dict[str, tuple[float, float]] = {
    "bf16": (1.6e-2, 1e-5), "fp16": (1e-3, 1e-5), "fp32": (1.3e-6, 1e-5)}


def assert_close_verdict(actual: np.ndarray | Sequence[np.ndarray], expected) -> Verdict:
    """``torch.testing.assert_close(actual, expected)`` with default tolerances (bf16 tensors on
    both sides). The verdict is torch's own; the figure is
    ``max |a - e| / (atol + rtol * |e|)`` (> 1 fails; inf for a NaN/inf mismatch)."""
    torch = _torch()
    acts = [actual] if isinstance(actual, np.ndarray) else list(actual)
    exps = [expected] if not isinstance(expected, (tuple, list)) else list(expected)
    rtol, atol = ASSERT_CLOSE_DEFAULTS["bf16"]
    ok = True
    worst = -1.0
    msg = ""
    for a, e in zip(acts, exps):
        at = _as_bf16_tensor(a)
        try:
            torch.testing.assert_close(at, e)
        except AssertionError as exc:
            ok = False
            if not msg:
                msg = str(exc).strip().splitlines()[0]
        af, ef = at.double(), e.double()
        diff = (af - ef).abs()
        ratio = diff / (atol + rtol * ef.abs())
        # equal_nan=False (the default): NaN on either side is a mismatch
        ratio = torch.where(torch.isnan(ratio), torch.full_like(ratio, math.inf), ratio)
        worst = max(worst, float(ratio.max().item()) if ratio.numel() else 0.0)
    return Verdict("pass" if ok else "fail", worst,
                   msg or f"max |a-e|/(atol+rtol|e|) = {worst:.3g}")
