"""Audit check ``tensor_core.mma`` (GPU): the SM90 tensor core's fp32-accumulating MMA for bf16
and fp16 inputs, re-measured on the GPU the audit runs on against the bit-exact model the judge
uses for FA4's scores (Note [SM90 MMA model], ``kernels/twin/tensor_core.py``).

The backward interval bound takes each score of an sm90 production backward as the model's point
(``ProductionTarget.tensor_core``). The model was recorded on an H200
(``kernels/evidence/golden/mma_sm90_h200.json``); this check measures it again, here, with the
probe that recorded it (:mod:`fa4verify.kernels.probes.mma_triton`: one wgmma per 16-wide k step,
inputs spread over 24 binades), and fails on any output that differs by one bit -- so no verdict
rests on another GPU's tensor core without the audit saying so. On an arch without a model the
judge uses none and the check has nothing to measure (skip). Without Triton (not a dependency of
fa4verify; torch's CUDA builds bring it) it cannot measure: skip with that reason, and the
judge's model rests on the H200 recording alone.
"""
from __future__ import annotations

from fa4verify.audit.registry import CheckContext, CheckResult, check

#: 64 x 64 tiles per case (bf16 / fp16 x 1 / 4 k steps): 131,072 outputs, under a second on an H200
TILES = 8


def judge_measurement(m: dict) -> tuple[str, str]:
    """``(status, summary)`` of a :func:`fa4verify.kernels.probes.mma_triton.measure` result."""
    head = f"{m['outputs']:,} outputs of wgmma k steps (bf16, fp16; 1 and 4 steps)"
    bad = {k: c for k, c in m["cases"].items() if c["model_bit_equal"] != c["outputs"]}
    steps = {k: c["wgmma_per_tile"] for k, c in m["cases"].items()}
    wrong_steps = {k: n for k, n in steps.items() if n != int(k.split("_k")[1]) // 16}
    if wrong_steps:
        return "undecided", (f"the probe did not compile to one wgmma per k step ({wrong_steps}): nothing measured "
                         "the tensor core FA4 uses")
    if bad:
        k, c = next(iter(bad.items()))
        fm = c["first_mismatch"]
        return "fail", (f"FAIL: {m['mismatches']:,} of {head} differ from the SM90 model (first: {k} "
                        f"{fm['index']}: GPU {fm['gpu']!r}, model {fm['model']!r}); the judge's scores "
                        "for this GPU's FA4 rest on a model it does not follow")
    return "pass", f"{head}: every one bit-equal to the SM90 model the judge uses"


@check("tensor_core.mma", title="SM90 tensor-core MMA (bf16/fp16 -> fp32) vs the judge's bit-exact model",
       needs={"cuda"}, profiles={"default", "full", "exhaustive"}, cost=2)
def mma(ctx: CheckContext) -> CheckResult:
    arch = ctx.device_arch
    if arch != "sm90":
        ctx.skip(f"no tensor-core model for {arch}: the judge bounds its scores worst-case there")
    try:
        import triton  # noqa: F401
    except ImportError:
        ctx.skip("Triton is not installed: the tensor core cannot be re-measured here "
                 "(the judge's model rests on the H200 recording, kernels/evidence/golden/mma_sm90_h200.json)")
    from fa4verify.kernels.probes import mma_triton as probe
    m = probe.measure(tiles=TILES, seed=int(ctx.seed))
    status, summary = judge_measurement(m)
    return CheckResult(status=status, where=ctx.where_measured(), summary=summary,
                       metrics={"outputs": m["outputs"], "mismatches": m["mismatches"]},
                       details={"cases": m["cases"]})
