"""FlashAttention's upstream accuracy rule and ``torch.testing.assert_close``, the two field
verifiers the detection table compares fa4verify with.

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
from typing import Any, Sequence

import numpy as np

from fa4verify.mutants.problems import Problem, ProblemData
from fa4verify.mutants.verdict import NA, Verdict

def _torch():
    import torch
    return torch


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
                lines = [ln.strip() for ln in str(exc).strip().splitlines()]
                keep = [ln for ln in lines if ln.startswith(("Mismatched", "Greatest"))]
                msg = "; ".join(keep) or lines[0]
        af, ef = at.double(), e.double()
        diff = (af - ef).abs()
        ratio = diff / (atol + rtol * ef.abs())
        # equal_nan=False (the default): NaN on either side is a mismatch
        ratio = torch.where(torch.isnan(ratio), torch.full_like(ratio, math.inf), ratio)
        worst = max(worst, float(ratio.max().item()) if ratio.numel() else 0.0)
    return Verdict("pass" if ok else "fail", worst,
                   msg or f"max |a-e|/(atol+rtol|e|) = {worst:.3g}")
