"""Audit check ``races.production`` (GPU; full / exhaustive): FA4's backward under load (Note
[Backward under load], :mod:`fa4verify.races`) -- dO written by the kernel launched just before
it, a concurrent memory-bound stream, dense / GQA / block-sparse problems, every repetition judged
by the one judge and, in deterministic mode, bitwise equal to the first. full: 8 repetitions per
problem and mode; exhaustive: 32. ``--opt races_reps=N`` replaces the count.
"""
from __future__ import annotations

from fa4verify.audit.registry import CheckContext, CheckResult, check

_REPS = {"default": 4, "full": 8, "exhaustive": 32}


def result(rows: dict, where: str, target: dict) -> CheckResult:
    """The verdict of :func:`fa4verify.races.run_races` rows per mode (``{"deterministic": rows,
    "default": rows}``)."""
    from fa4verify.fuzz.campaign import judged_shortfall
    from fa4verify.races import COLUMNS
    flat = [(mode, r) for mode, rs in rows.items() for r in rs]
    metrics = {"reps": sum(r.reps for _, r in flat), "judged": sum(r.judged for _, r in flat),
               "violations": sum(r.violations for _, r in flat),
               "bitwise_mismatches": sum(r.bitwise_mismatches for _, r in flat),
               "unsupported": sum(r.unsupported for _, r in flat), "fa4verify_errors": sum(r.errors for _, r in flat)}
    details = {"table": {"columns": ["mode"] + COLUMNS, "rows": [[m] + r.row() for m, r in flat]},
               "target": target}
    bad = [(m, r) for m, r in flat if r.violations or r.bitwise_mismatches]
    if bad:
        m, r = bad[0]
        return CheckResult(status="fail", where=where, metrics=metrics, details=details,
                           summary=f"{len(bad)} problem/mode(s) wrong under load; first: {r.problem} ({m}): "
                                   f"{r.first_failure}"[:400])
    if metrics["fa4verify_errors"]:
        r = next(r for _, r in flat if r.errors)
        return CheckResult(status="error", where=where, metrics=metrics, details=details,
                           summary=f"fa4verify's own call failed on {metrics['fa4verify_errors']} repetition(s): "
                                   f"{r.first_failure}"[:400])
    short = judged_shortfall(metrics["judged"], metrics["reps"], unit="repetitions",
                             unsupported=metrics["unsupported"])
    if short is not None:
        return CheckResult(status="undecided", where=where, metrics=metrics, details=details, summary=short)
    return CheckResult(status="pass", where=where, metrics=metrics, details=details,
                       summary=(f"{metrics['judged']} backward repetitions under load (dO from the preceding "
                                f"kernel, busy stream) within budget; deterministic ones bitwise equal"))


@check("races.production", title="FA4 backward under load: dO from the preceding kernel, a busy stream (GPU)",
       needs={"cuda", "fa4"}, profiles={"full", "exhaustive"}, cost=40)
def production(ctx: CheckContext) -> CheckResult:
    from fa4verify import races
    if ctx.dtype not in ("bf16", "fp16"):
        ctx.skip(f"the race problems are bf16/fp16; dtype {ctx.dtype} is not run")
    gpu = ctx.require_gpu()
    opts = getattr(ctx, "options", None) or {}
    try:
        reps = int(opts.get("races_reps", _REPS.get(ctx.profile, 8)))
    except ValueError as e:
        raise ValueError(f"--opt races_reps: {e}") from None
    if reps < 2:
        raise ValueError("--opt races_reps must be >= 2 (the bitwise comparison needs two)")
    tgt = races.RacingTarget()
    probs = races.race_problems(gpu.arch, ctx.dtype, seed=int(ctx.seed))
    rows = {}
    with ctx.progress(2 * len(probs), "FA4 backward under load") as bar:
        for mode, det in (("deterministic", True), ("default", False)):
            rows[mode] = races.run_races(tgt, probs, reps=reps, deterministic=det)
            bar.advance(len(probs))
    return result(rows, ctx.where_measured(), tgt.describe())
