"""Audit checks for property-based fuzzing (fa4verify.fuzz, docs/fuzzing.md).

* ``fuzz.twin[<arch>]``      Hypothesis campaign on the CPU twin ("CPU twin"): every property of
                             ``fa4verify.fuzz.PROPERTIES`` on tile-edge shapes, masks and value
                             distributions. default: 20 examples per arch (~10 s on one core),
                             full: 100, exhaustive: 1000 (the nightly profile).
* ``fuzz.mutants``           the fuzzer FINDS and SHRINKS the planted twin faults causal_off_by_one,
                             causal_top_left, tail_tile_dropped and rescale_skipped (full and
                             exhaustive profiles; ~1 min on one core).
* ``fuzz.production``        the same campaign against production FA4 on the GPU ("measured on
                             <GPU>"): default 50 examples, full 200, exhaustive 1000. The
                             default profile draws head dims from a palette of three
                             (:func:`head_dim_palette`: 64, 128 and one more rotated by the seed,
                             so every head dim FA4 supports is drawn over as many seeds) to keep
                             the number of distinct FA4 compile keys, i.e. kernel compiles, small;
                             full and exhaustive draw every supported head dim. A deployment's
                             head dims replace the palette. Besides the dense call's features
                             it draws every FA4 call form the H200 runs (CALL_FEATURES: paged
                             KV, seqused_k, block sparsity, CuTe mask_mods); a deployment draws
                             the call forms it names (``features``, ``page_sizes``,
                             ``nan_pages``).

Options (``--opt KEY=VALUE``): ``fuzz_examples=N`` replaces the profile's example count and
``fuzz_time_limit_s=S`` stops drawing new examples after S seconds (a shrink is never cut short;
the summary says so), for fuzz.twin and fuzz.production.

Known FA4 issues (``fa4verify.fuzz.KNOWN_ISSUES``) are counted, not failed; any other violation
fails the check with the shrunk case and its ``@example`` snippet in the details.
"""
from __future__ import annotations

from typing import Any

from fa4verify.audit.registry import CheckContext, CheckResult, check

_TWIN_EXAMPLES = {"quick": 10, "default": 20, "full": 100, "exhaustive": 1000}
_GPU_EXAMPLES = {"quick": 20, "default": 50, "full": 200, "exhaustive": 1000}
_MUTANTS = ("causal_off_by_one", "causal_top_left", "tail_tile_dropped", "rescale_skipped")


def _profile(ctx: CheckContext) -> str:
    return "nightly" if ctx.profile == "exhaustive" else ("dev" if ctx.profile == "full" else "ci")


def _result(res: Any, where: str) -> CheckResult:
    known = {k: v["count"] for k, v in res.known_hits.items()}
    metrics: dict[str, Any] = {
        "examples_higher_is_better": res.examples_run,
        "violations": int(res.found),
        "known_issue_hits": sum(known.values()),
        "tightness_max": round(float(res.max_metrics.get("tightness_max", 0.0)), 4),
        "seconds": round(res.seconds, 1),
    }
    for k in ("tightness_out", "tightness_lse", "tightness_dq", "tightness_dk", "tightness_dv"):
        if k in res.max_metrics:
            metrics[k] = round(float(res.max_metrics[k]), 4)
    details: dict[str, Any] = {"coverage": res.coverage, "properties_ran": res.properties_ran,
                               "properties_skipped": res.properties_skipped, "known_issues": res.known_hits,
                               "unsupported": res.unsupported, "target": res.target}
    if res.found:
        f = res.failure
        details["failure"] = {k: f[k] for k in ("property", "message", "describe", "snippet", "problem")}
        return CheckResult(status="fail", where=where, metrics=metrics, details=details,
                           summary=f"{f['property']} violated, shrunk to {f['describe']}",
                           tightness=metrics["tightness_max"] or None)
    if res.examples_run == 0:
        return CheckResult(status="error", where=where, metrics=metrics, details=details,
                           summary="no example ran (every draw rejected)")
    undecided = getattr(res, "undecided", {}) or {}
    if undecided:
        details["undecided"] = undecided
        metrics["undecided_examples"] = sum(u["count"] for u in undecided.values())
        first = next(iter(undecided.items()))
        return CheckResult(status="undecided", where=where, metrics=metrics, details=details,
                           summary=(f"{res.examples_run} examples, no violation, but the judge could not decide "
                                    + ", ".join(f"{k} x{u['count']}" for k, u in undecided.items()) +
                                    f" "
                                    f"(first: {first[0]}: {first[1]['reason']})"),
                           tightness=metrics["tightness_max"] or None)
    summary = (f"{res.examples_run} examples, every property held; max tightness "
               f"{metrics['tightness_max']:.3g}")
    if res.stopped:
        summary += f" ({res.stopped})"
    calls = {k: sum(n for v, n in res.coverage.get(k, {}).items() if v not in ("None", "False"))
             for k in ("paged_kv", "seqused_k", "block_sparse", "mask_mod_fn")}
    if any(calls.values()):
        summary += "; call forms: " + ", ".join(f"{k} x{v}" for k, v in calls.items() if v)
    if known:
        summary += "; known issues hit: " + ", ".join(f"{k} x{v}" for k, v in known.items())
    return CheckResult(status="pass", where=where, metrics=metrics, details=details, summary=summary,
                       tightness=metrics["tightness_max"] or None)


def _deployment_kw(ctx: CheckContext, limits: dict, *, call_features: bool = False) -> dict:
    """run_campaign arguments that keep the drawn problems inside the audit's deployment. A
    deployment's call forms (``features``) are drawn with its ``page_sizes`` / ``nan_pages``;
    without a deployment, ``call_features`` adds every call form (CALL_FEATURES) to the dense
    call's features."""
    dep = ctx.deploy
    lim = dict(limits)
    kw = dep.strategy_kwargs() if dep is not None else {}
    lim.update(kw.get("limits", {}))
    if "head_dim_choices" in lim:   # explicit head dims replace the bound
        lim.pop("max_head_dim", None)
    if dep is None:
        if call_features:
            from fa4verify._strategies.calls import CALL_FEATURES
            from fa4verify._strategies.problem import FEATURES
            return {"limits": lim, "features": FEATURES + CALL_FEATURES}
        return {"limits": lim}
    return {"limits": lim, "features": kw["features"], "distributions": kw["distributions"]}


def _budget_opts(ctx: CheckContext, n: int) -> tuple[int, Any]:
    """(examples, time limit or None) from ``--opt fuzz_examples=N`` / ``fuzz_time_limit_s=S``."""
    opts = getattr(ctx, "options", None) or {}
    try:
        n = int(opts.get("fuzz_examples", n))
        t = opts.get("fuzz_time_limit_s")
        t = None if t in (None, "") else float(t)
    except ValueError as e:
        raise ValueError(f"--opt fuzz_examples / fuzz_time_limit_s: {e}") from None
    if n < 1 or (t is not None and not t > 0):
        raise ValueError("--opt fuzz_examples must be >= 1 and fuzz_time_limit_s > 0")
    return n, t


def _dtype(ctx: CheckContext) -> str:
    if ctx.dtype not in ("bf16", "fp16"):
        ctx.skip(f"fuzzing draws bf16/fp16 problems; dtype {ctx.dtype} (forward-only fp8) is not generated")
    return ctx.dtype


@check("fuzz.twin", title="Hypothesis fuzzing of shapes, masks and values on the CPU twin",
       needs={"cpu"}, profiles={"default", "full", "exhaustive"}, archs={"sm90", "sm100"})
def twin(ctx: CheckContext) -> CheckResult:
    from fa4verify import fuzz
    dtype = _dtype(ctx)
    n, tl = _budget_opts(ctx, _TWIN_EXAMPLES[ctx.profile])
    with ctx.progress(n, f"fuzzing the {ctx.arch} twin") as bar:
        res = fuzz.run_campaign(target=fuzz.TwinTarget(), arch=ctx.arch, dtype=dtype, examples=n, seed=ctx.seed,
                                profile=_profile(ctx), on_example=lambda i, p: bar.advance(1),
                                time_limit_s=tl, **_deployment_kw(ctx, {}))
    return _result(res, "CPU twin")


@check("fuzz.mutants", title="fuzzing finds and shrinks planted twin faults", needs={"cpu"},
       profiles={"full", "exhaustive"})
def mutants(ctx: CheckContext) -> CheckResult:
    from fa4verify import fuzz
    from fa4verify.kernels.twin import attention as ta
    found: dict[str, Any] = {}
    missing = [m for m in _MUTANTS if m not in ta.MUTATIONS]
    with ctx.progress(len(_MUTANTS), "fuzzing mutants") as bar:
        for m in _MUTANTS:
            if m in missing:
                continue
            res = fuzz.run_campaign(target=fuzz.TwinTarget([m]), arch="sm90", examples=100, seed=ctx.seed,
                                    profile="ci")
            found[m] = ({"property": res.failure["property"], "shrunk": res.failure["describe"],
                         "work": res.failure["work"]} if res.found else None)
            bar.advance(1)
    missed = [m for m, f in found.items() if f is None or f["property"] == "runs"]
    metrics = {"mutants": len(found), "found_higher_is_better": len(found) - len(missed),
               "max_shrunk_work": max((f["work"] for f in found.values() if f), default=0)}
    summary = "; ".join(f"{m}: {f['shrunk']}" if f else f"{m}: NOT FOUND" for m, f in found.items())
    return CheckResult(status="fail" if missed or missing else "pass", where="CPU twin", metrics=metrics,
                       details={"found": found, "missing_mutations": missing}, summary=summary)


def head_dim_palette(arch: str, seed: int, *, max_head_dim: int = 256) -> tuple[int, ...]:
    """64, 128 and the ``seed``-th (cyclically) other head dim FA4 supports on ``arch``."""
    from fa4verify._strategies.shapes import supported_head_dims
    others = [d for d, dv in supported_head_dims(arch, max_head_dim=max_head_dim)
              if d == dv and d not in (64, 128)]
    return (64, 128) + ((others[seed % len(others)],) if others else ())


@check("fuzz.production", title="Hypothesis fuzzing of production FA4 on the GPU", needs={"cuda", "fa4"},
       profiles={"default", "full", "exhaustive"}, cost=134)
def production(ctx: CheckContext) -> CheckResult:
    from fa4verify import fuzz
    dtype = _dtype(ctx)
    gpu = ctx.require_gpu()
    where = ctx.where_measured()
    tgt = fuzz.ProductionTarget()
    n, tl = _budget_opts(ctx, _GPU_EXAMPLES[ctx.profile])
    limits: dict[str, Any] = {"max_head_dim": 256}
    if ctx.profile in ("quick", "default"):
        limits["head_dim_choices"] = head_dim_palette(gpu.arch, ctx.seed)
    kw = _deployment_kw(ctx, limits, call_features=True)
    with ctx.progress(n, "fuzzing production FA4") as bar:
        res = fuzz.run_campaign(target=tgt, arch=gpu.arch, dtype=dtype, examples=n, seed=ctx.seed,
                                profile=_profile(ctx), on_example=lambda i, p: bar.advance(1),
                                time_limit_s=tl, **kw)
    out = _result(res, where)
    out.details["head_dims_drawn_from"] = list(kw["limits"].get("head_dim_choices", ())) or "all"
    out.details["features_drawn_from"] = list(kw.get("features") or ())
    return out
