"""Shards of one audit check: expansion into work items and the merge back into one result.

A check registered with ``@check(..., shards=k)`` (or ``shards=f(profile, workers)``) runs as
``k`` work items ``<id>[i/k]`` that the worker pool schedules like checks; each gets
``ctx.shard = (i - 1, k)`` and takes its cases with :meth:`CheckContext.shard_items` (cases with
one FA4 compile key stay on one shard). :func:`merge_shards` makes ONE :class:`CheckResult` of
them, so every report keeps one row per check:

* a shard that is missing (never ran, the audit was interrupted) or errored makes the check
  ``error`` -- never ``pass``; a ``fail`` among the others still wins (a proven violation stands);
* otherwise the check's own ``merge(ctx, parts)`` (``@check(merge=)``) recomputes the verdict from
  the union of the shards' raw case results (``details["shard_payload"]``), so the sharded verdict,
  summary and metrics are those of the unsharded run; without one, :func:`generic_merge`:
  fail > undecided > pass over the shards (the judge's rule), numeric metrics summed (counts) or
  maxed (names with ``tightness``, ``max``, ``worst``, ``ratio``), the largest tightness;
* every shard skipped: the check is skipped with the first shard's reason; a shard with no case
  (``details["shard_empty"]``) is neutral; any other skip beside shards that ran is ``undecided``;
* ``details["shards"]`` lists each shard: status, wall seconds, summary; the slowest shard's
  seconds is ``details["shard_max_s"]`` (the check's share of the critical path).

Nothing here imports numpy, torch or flash_attn.
"""
from __future__ import annotations

from typing import Any, Sequence

from fa4verify.audit.registry import CheckContext, CheckResult, CheckSpec

__all__ = ["shard_label", "shard_count", "empty_shard", "generic_merge", "merge_shards",
           "merged_check_status", "MAX_METRIC_WORDS"]

#: metric-name fragments merged by max over the shards (the others are summed)
MAX_METRIC_WORDS: tuple[str, ...] = ("tightness", "max", "worst", "ratio", "ulp")


def shard_label(result_id: str, index: int, count: int) -> str:
    """The work item name of shard ``index`` (0-based) of ``count``: ``"<id>[i/k]"``, 1-based."""
    return f"{result_id}[{index + 1}/{count}]"


def shard_count(spec: CheckSpec, profile: str, workers: int, override: int | None) -> int:
    """Shards of ``spec``: 1 when the check is not shardable; ``override`` (``--shards N``;
    1 = ``--no-shard``) for a shardable one; else the check's own count for the profile and
    the worker count."""
    own = spec.shard_count(profile, workers)
    shardable = callable(spec.shards) or spec.shards > 1
    if not shardable:
        return 1
    if override is not None:
        return max(1, int(override))
    return own


def empty_shard(ctx: CheckContext, what: str = "case", payload: Any = None) -> CheckResult:
    """The result of a shard whose share of the cases is empty (neutral in the merge)."""
    i, k = ctx.shard
    return CheckResult(status="skip", summary=f"shard {i + 1}/{k}: no {what}",
                       details={"shard_empty": True, "shard_payload": payload})


def merged_check_status(statuses: Sequence[str]) -> str:
    """fail > error > undecided > pass (the judge's fail > undecided > pass, with a broken
    shard above undecided); skips are neutral; nothing but skips: skip; nothing: error."""
    st = [s for s in statuses if s != "skip"]
    if not statuses:
        return "error"
    if not st:
        return "skip"
    for s in ("fail", "error", "undecided"):
        if s in st:
            return s
    return "pass"


def _is_max(name: str) -> bool:
    n = name.lower()
    return any(w in n for w in MAX_METRIC_WORDS)


def generic_merge(ctx: CheckContext, parts: Sequence[CheckResult]) -> CheckResult:
    """One result from shard results without a check-specific merge (module docstring)."""
    ran = [p for p in parts if not (p.status == "skip" and p.details.get("shard_empty"))]
    status = merged_check_status([p.status for p in ran])
    skipped = [p for p in ran if p.status == "skip"]
    if status != "skip" and skipped and status == "pass":
        status = "undecided"
    metrics: dict[str, Any] = {}
    for p in ran:
        for k, v in p.metrics.items():
            if k not in metrics:
                metrics[k] = v
            elif isinstance(v, (int, float)) and isinstance(metrics[k], (int, float)) \
                    and not isinstance(v, bool):
                metrics[k] = max(metrics[k], v) if _is_max(k) else metrics[k] + v
    ts = [p.tightness for p in ran if p.tightness is not None]
    where = next((p.where for p in ran if p.where), "")
    lead = next((p for p in ran if p.status == status), ran[0] if ran else None)
    summary = lead.summary if lead is not None else "no shard ran"
    if skipped and status == "undecided" and not any(p.status == "undecided" for p in ran):
        summary = f"{len(skipped)} shard(s) skipped beside shards that ran: {skipped[0].summary}"
    return CheckResult(status=status, where=where, summary=summary, metrics=metrics,
                       tightness=max(ts) if ts else None)


def merge_shards(spec: CheckSpec, ctx: CheckContext, parts: Sequence[CheckResult | None],
                 seconds: Sequence[float | None]) -> CheckResult:
    """ONE result for the ``len(parts)`` shards of ``spec`` (``None`` = a missing shard); see
    the module docstring for the rule. ``ctx`` is the unsharded context (``shard == (0, 1)``)."""
    k = len(parts)
    rows = [{"shard": shard_label(ctx.check_id, i, k),
             "status": "missing" if p is None else p.status,
             "seconds": None if seconds[i] is None else round(float(seconds[i]), 2),
             "summary": "never ran" if p is None else p.summary[:200]}
            for i, p in enumerate(parts)]
    shard_max = max((s for s in seconds if s is not None), default=0.0)
    missing = [i for i, p in enumerate(parts) if p is None]
    broken = [i for i, p in enumerate(parts) if p is not None and p.status == "error"]
    present = [p for p in parts if p is not None]
    if missing or broken:
        fails = [p for p in present if p.status == "fail"]
        first = (f"shard {missing[0] + 1}/{k} missing (never ran)" if missing else
                 f"shard {broken[0] + 1}/{k} errored: {parts[broken[0]].summary}")
        if fails:
            out = CheckResult(status="fail", where=fails[0].where, metrics=dict(fails[0].metrics),
                              tightness=fails[0].tightness,
                              summary=f"{fails[0].summary} (check incomplete: {first})")
        else:
            out = CheckResult(status="error", where=next((p.where for p in present if p.where), ""),
                              summary=f"{len(missing) + len(broken)}/{k} shards did not complete: {first}")
        out.details = {**out.details, "shards": rows, "shard_max_s": round(shard_max, 2)}
        return out
    if all(p.status == "skip" for p in present) and not all(p.details.get("shard_empty") for p in present):
        first = next(p for p in present if not p.details.get("shard_empty"))
        return CheckResult(status="skip", summary=first.summary, where=first.where,
                           details={"shards": rows, "shard_max_s": round(shard_max, 2)})
    try:
        out = spec.merge(ctx, list(present)) if spec.merge is not None else generic_merge(ctx, present)
        if not isinstance(out, CheckResult):
            raise TypeError(f"merge returned {type(out).__name__}, not CheckResult")
    except Exception as e:  # noqa: BLE001 - a broken merge is the check's error, never a pass
        out = CheckResult(status="error", summary=f"merging {k} shards failed: {type(e).__name__}: {e}"[:500])
    out.details = {**out.details, "shards": rows, "shard_max_s": round(shard_max, 2)}
    return out
