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
the summary says so), ``fuzz_distributions=NAME[,NAME]`` draws only those value distributions
(``huge``: the large-logit regime), for fuzz.twin and fuzz.production.

Known FA4 issues (``fa4verify.fuzz.KNOWN_ISSUES``) are counted, not failed; any other violation
fails the check with the first violating case (lowest example index) and its ``@example`` snippet
in the details.

Both campaigns are drawn up front (Note [Drawn campaigns], :mod:`fa4verify.fuzz.drawn`): the seed
fixes the examples, which are the check's cases (``@check(cases=)``: the engine runs the examples
of one FA4 compile key in one worker, and a kernel two workers need is compiled once when FA4's
kernel cache is on: Note [One compile per key per audit]); the summary over every example's
outcome is that of one loop over the campaign. Hypothesis's targeting and shrinking are not used
in the audit (``fa4verify fuzz`` keeps them).
"""
from __future__ import annotations

import dataclasses

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
        "violations": int(getattr(res, "violations", int(res.found))),    # violating examples, not a flag
        "known_issue_hits": sum(known.values()),
        "tightness_max": round(float(res.max_metrics.get("tightness_max", 0.0)), 4),
        "seconds": round(res.seconds, 1),
    }
    for k in ("tightness_out", "tightness_lse", "tightness_dq", "tightness_dk", "tightness_dv"):
        if k in res.max_metrics:
            metrics[k] = round(float(res.max_metrics[k]), 4)
    # Note [Tightness outside known issues] (fa4verify.fuzz.campaign): with known-issue hits the
    # check's tightness is the worst of what no known issue absorbed
    outside = getattr(res, "tightness_outside_known", None)
    if known and outside is not None:
        metrics["tightness_outside_known"] = round(float(outside), 4)
        # per tensor too: the clean tightness of each quantity (issue 28's regime figures)
        for k, val in sorted((getattr(res, "max_metrics_outside_known", None) or {}).items()):
            if k in ("tightness_out", "tightness_lse", "tightness_dq", "tightness_dk", "tightness_dv"):
                metrics[f"{k}_outside_known"] = round(float(val), 4)
    tight = metrics.get("tightness_outside_known", metrics["tightness_max"])
    from fa4verify.fuzz.campaign import judged_examples, power_shortfall
    errors = dict(getattr(res, "errors", {}) or {})
    metrics["judged"] = judged_examples(res)
    metrics["unsupported"] = sum(res.unsupported.values())
    metrics["fa4verify_errors"] = sum(errors.values())
    details: dict[str, Any] = {"coverage": res.coverage, "properties_ran": res.properties_ran,
                               "properties_skipped": res.properties_skipped, "known_issues": res.known_hits,
                               "unsupported": res.unsupported, "errors": errors, "target": res.target}
    err_note = ""
    if errors:   # Note [Blame]: fa4verify's own call failed; never a verdict about FA4
        first = next(iter(errors))
        err_note = (f"fa4verify's own call failed on {metrics['fa4verify_errors']} example(s) "
                    f"(first: {first})")
    if res.found:
        f = res.failure
        details["failure"] = {k: f[k] for k in ("property", "message", "describe", "snippet", "problem")}
        return CheckResult(status="fail", where=where, metrics=metrics, details=details,
                           summary=f"{f['property']} violated, shrunk to {f['describe']}"
                                   + (f"; {err_note}" if err_note else ""),
                           tightness=metrics["tightness_max"] or None)
    if errors:
        return CheckResult(status="error", where=where, metrics=metrics, details=details,
                           summary=f"{err_note}; {metrics['judged']} examples judged")
    if res.examples_run == 0 and metrics["judged"] == 0:
        return CheckResult(status="error", where=where, metrics=metrics, details=details,
                           summary="no example ran (every draw rejected)")
    short = power_shortfall(res)   # Note [Judged share]
    if short is not None:
        first = next(iter(res.unsupported), "")
        return CheckResult(status="undecided", where=where, metrics=metrics, details=details,
                           summary=short + (f" (first refusal: {first})" if first else ""),
                           tightness=tight or None)
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
                           tightness=tight or None)
    summary = f"{res.examples_run} examples, every property held; max tightness {tight:.3g}"
    if "tightness_outside_known" in metrics and metrics["tightness_max"] > tight:
        summary += f" outside known issues ({metrics['tightness_max']:.3g} in what they absorbed)"
    if res.stopped:
        summary += f" ({res.stopped})"
    calls = {k: sum(n for v, n in res.coverage.get(k, {}).items() if v not in ("None", "False"))
             for k in ("paged_kv", "seqused_k", "seqused_q", "block_sparse", "block_sparse_varlen", "block_partial",
                       "mask_mod_fn", "pack_gqa", "num_splits")}
    if any(calls.values()):
        summary += "; call forms: " + ", ".join(f"{k} x{v}" for k, v in calls.items() if v)
    if known:
        summary += "; known issues hit: " + ", ".join(f"{k} x{v}" for k, v in known.items())
    return CheckResult(status="pass", where=where, metrics=metrics, details=details, summary=summary,
                       tightness=tight or None)


def _deployment_kw(ctx: CheckContext, limits: dict, *, call_features: bool = False) -> dict:
    """run_campaign arguments that keep the drawn problems inside the audit's deployment. A
    deployment's call forms (``features``) are drawn with its ``page_sizes`` / ``nan_pages``;
    without a deployment, ``call_features`` adds every call form (CALL_FEATURES) to the dense
    call's features."""
    dep = ctx.deploy
    lim = dict(limits)
    kw = dep.strategy_kwargs(arch=ctx.arch, dtype=ctx.dtype) if dep is not None else {}
    lim.update(kw.get("limits", {}))
    if "head_dim_choices" in lim:   # explicit head dims replace the bound
        lim.pop("max_head_dim", None)
    only = _distributions_opt(ctx)
    if dep is None:
        out: dict[str, Any] = {"limits": lim}
        if call_features:
            from fa4verify.problem import CALL_FEATURES, MOD_FEATURE, FEATURES
            out["features"] = FEATURES + CALL_FEATURES + (MOD_FEATURE,)
        if only:
            out["distributions"] = only
        return out
    dists = kw["distributions"]
    if only:
        dists = [d for d in (dists or only) if d in only]
        if not dists:
            ctx.skip(f"--opt fuzz_distributions={','.join(only)}: the deployment draws none of them "
                     f"({', '.join(kw['distributions'])})")
    return {"limits": lim, "features": kw["features"], "distributions": dists}


def _distributions_opt(ctx: CheckContext) -> list[str] | None:
    """``--opt fuzz_distributions=NAME[,NAME]``: draw only these value distributions (e.g.
    ``huge``, to run a campaign in the large-logit regime); None without the option."""
    raw = (getattr(ctx, "options", None) or {}).get("fuzz_distributions")
    if raw in (None, ""):
        return None
    from fa4verify.problem import DISTRIBUTIONS
    names = [d.strip() for d in str(raw).split(",") if d.strip()]
    bad = [d for d in names if d not in DISTRIBUTIONS]
    if bad or not names:
        raise ValueError(f"--opt fuzz_distributions={raw!r}: unknown distribution "
                         f"{(bad or [raw])[0]!r}; known: {', '.join(DISTRIBUTIONS)}")
    return names


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


#: Note [Siblings share compile keys] (fa4verify._strategies.problem.problem_groups): in the
#: default profile (fuzz.production does not run in quick) every drawn production problem comes
#: with this many siblings (other
#: values, other varlen lengths, the same FA4 kernels), so the campaign's examples cost about half
#: the compiles; full and exhaustive draw every example on its own
_GPU_SIBLINGS = {"default": 1, "full": 0, "exhaustive": 0}


def _siblings(ctx: CheckContext) -> int:
    """Siblings per drawn production problem: the profile's, or ``--opt fuzz_siblings=N``."""
    opts = getattr(ctx, "options", None) or {}
    raw = opts.get("fuzz_siblings", _GPU_SIBLINGS.get(ctx.profile, 0))
    try:
        n = int(raw)
    except (TypeError, ValueError):
        raise ValueError(f"--opt fuzz_siblings={raw!r}: expected an integer >= 0") from None
    if n < 0:
        raise ValueError(f"--opt fuzz_siblings={raw!r}: expected an integer >= 0")
    return n


def _dtype(ctx: CheckContext, *, fp8: bool = False) -> str:
    """The campaign's dtype: bf16 / fp16, and fp8 where the campaign is planned (``fp8``: the
    coverage plan runs fp8 forward rows with their descales; the fuzz draws no fp8)."""
    if ctx.dtype not in ("bf16", "fp16") and not (fp8 and ctx.dtype == "fp8"):
        ctx.skip(f"fuzzing draws bf16/fp16 problems; dtype {ctx.dtype} (forward-only fp8) is not generated")
    return ctx.dtype


@dataclasses.dataclass(frozen=True)
class DrawnCase:
    """Example ``index`` of a drawn (or planned) campaign: the engine's case of the fuzz and
    coverage checks (Note [Drawn campaigns], fa4verify.fuzz.drawn). ``target``: "twin" or
    "production" (built in the worker); ``head``: what every case of the campaign shares (arch,
    profile, seed, where, extra details, properties, the wall-clock deadline of
    ``--opt fuzz_time_limit_s``); ``backward``: False for a planned row the space runs forward only
    (FA4 has no backward there: its backward is never called)."""
    index: int
    problem: Any
    target: str
    head: dict
    deterministic: bool = True
    backward: bool = True

    @property
    def queue_weight(self) -> float:
        """Its work in plain forward examples (:func:`fa4verify.run.engine.case_weight`, an
        estimate for the queue's order): twice with the backward (its kernels and judge), one more
        per 64 varlen sequences (the judge and the oracle run per sequence), and one more per 2^26
        multiply-adds of the problem (the oracle and the judge's SM90 MMA model grow with it:
        measured on the H200, a 2 x 8-head 389 x 439 block-sparse row at hd 96 was the warm
        audit's last item, 12.1 s from 8.8 s, queued as a plain backward row)."""
        seqs = len(getattr(self.problem, "seqlens_q", None) or ())
        work = float(getattr(self.problem, "work", 0) or 0)
        return (2.0 if self.backward else 1.0) * (1.0 + seqs / 64 + work / 2 ** 26)


def _campaign_cases(ctx: CheckContext, *, target: str, arch: str, dtype: str, n: int, kw: dict,
                    where: str, extra: dict | None = None, time_limit_s: float | None = None,
                    siblings: int = 0, problems: list | None = None, properties: Any = None,
                    deterministic: dict | None = None, backward: dict | None = None) -> list:
    """The campaign's ``n`` examples, drawn up front from the seed (Note [Drawn campaigns]), or
    ``problems`` (a plan: ``coverage.*``), as the check's cases."""
    import time

    from fa4verify.fuzz import drawn
    if problems is None:       # the features the target runs (no target built here: no GPU work)
        from fa4verify.problem import FEATURES
        from fa4verify.targets import TwinTarget, production_features
        runs = production_features() if target == "production" else TwinTarget().features()
        kw = dict(kw)
        feats = [f for f in (kw.pop("features", None) or FEATURES) if f in runs]
        problems = drawn.draw_problems(arch=arch, dtype=dtype, examples=n, seed=ctx.seed, profile=_profile(ctx),
                                       features=feats, siblings=siblings, **kw)
    head = {"arch": arch, "profile": _profile(ctx), "seed": ctx.seed, "where": where,
            "extra": dict(extra or {}, siblings=siblings), "properties": properties,
            "deadline": None if time_limit_s is None else time.time() + time_limit_s}
    det, bwd = deterministic or {}, backward or {}
    return [DrawnCase(j, p, target, head, bool(det.get(j, True)), bool(bwd.get(j, True)))
            for j, p in enumerate(problems)]


def _target(name: str) -> Any:
    from fa4verify.targets import ProductionTarget, TwinTarget
    return ProductionTarget() if name == "production" else TwinTarget()


def run_example(ctx: CheckContext, case: DrawnCase) -> dict:
    """One example: its outcome (:func:`fa4verify.fuzz.drawn.run_drawn`), seconds and target."""
    import time

    from fa4verify.fuzz import drawn
    from fa4verify.fuzz.properties import PROPERTIES
    h = case.head
    tl = None if h["deadline"] is None else max(0.0, h["deadline"] - time.time())
    props = tuple(h["properties"] or PROPERTIES)
    if str(case.index) in (h["extra"].get("plan") or {}).get("stat_calls", {}):
        props += ("stat_tier",)      # Note [A statistical verdict per kernel variant]
    part = drawn.run_drawn([case.problem], [0], target=_target(case.target), time_limit_s=tl,
                           properties=props, deterministic={0: case.deterministic},
                           backward=case.backward)
    return {"outcome": dict(part["outcomes"][0], index=case.index), "seconds": part["seconds"],
            "target": part["target"]}


def summarise_campaign(ctx: CheckContext, results: list) -> CheckResult:
    """The check's result from its examples' outcomes (every example once, in order)."""
    import hashlib

    from fa4verify.fuzz import drawn
    h = results[0][0].head
    parts = [{"outcomes": [v["outcome"]], "seconds": v["seconds"], "target": v["target"]} for _c, v in results]
    res = drawn.merge_drawn(parts, expected=[c.index for c, _v in results], arch=h["arch"],
                            profile=h["profile"], seed=h["seed"])
    out = _result(res, h["where"])
    out.details.update(h["extra"])
    if h["extra"].get("distributions_drawn_from"):
        out.summary += f" [values drawn only from {', '.join(h['extra']['distributions_drawn_from'])}]"
    out.details["examples_drawn"] = len(results)
    out.details["draw_digest"] = hashlib.sha256("".join(c.problem.digest() for c, _v in results).encode()
                                                ).hexdigest()[:16]
    out.details["violating_examples"] = int(getattr(res, "violations", 0))
    out.details["worst_problem"] = res.worst_problem
    # Note [Compile keys in the timeline]: example index -> the FA4 kernels it ran ("cache:digest")
    ek = {str(v["outcome"]["index"]): [f"{c}:{d}" for c, d in v["outcome"]["kernels"]]
          for _c, v in results if v["outcome"].get("kernels")}
    if ek:
        out.details["example_kernels"] = dict(sorted(ek.items(), key=lambda kv: int(kv[0])))
    # example index -> [its seconds, of which in the target's calls] (the rest: the judge)
    es = {str(v["outcome"]["index"]): [v["outcome"]["seconds"]["total"], v["outcome"]["seconds"]["target"]]
          for _c, v in results if v["outcome"].get("seconds")}
    if es:
        out.details["example_seconds"] = dict(sorted(es.items(), key=lambda kv: int(kv[0])))
    return out


def _twin_cases(ctx: CheckContext) -> list:
    dtype = _dtype(ctx)
    n, tl = _budget_opts(ctx, _TWIN_EXAMPLES[ctx.profile])
    kw = _deployment_kw(ctx, {})
    return _campaign_cases(ctx, target="twin", arch=ctx.arch, dtype=dtype, n=n, time_limit_s=tl,
                           kw=kw, where="CPU twin", extra=_distributions_extra(ctx))


def _distributions_extra(ctx: CheckContext) -> dict:
    """``{"distributions_drawn_from": [...]}`` when ``--opt fuzz_distributions`` narrowed the draw
    (the summary says so: a pass on huge logits only is not a pass of the whole mix)."""
    only = _distributions_opt(ctx)
    return {"distributions_drawn_from": only} if only else {}


@check("fuzz.twin", title="Hypothesis fuzzing of shapes, masks and values on the CPU twin",
       needs={"cpu"}, profiles={"default", "full", "exhaustive"}, archs={"sm90", "sm100"},
       cases=_twin_cases, summarise=summarise_campaign)
def twin(ctx: CheckContext, case: DrawnCase) -> dict:
    return run_example(ctx, case)


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


#: the cold cost of fuzz.production (its work items' seconds summed: 206 s on the H200, 8 workers)
#: and more: its compile-key groups are the audit's most uneven tasks, so they start first
_GPU_COST = 240


def _production_cases(ctx: CheckContext) -> list:
    dtype = _dtype(ctx)
    gpu = ctx.require_gpu()
    where = ctx.where_measured()
    n, tl = _budget_opts(ctx, _GPU_EXAMPLES[ctx.profile])
    limits: dict[str, Any] = {"max_head_dim": 256}
    if ctx.profile in ("quick", "default"):
        limits["head_dim_choices"] = head_dim_palette(gpu.arch, ctx.seed)
    kw = _deployment_kw(ctx, limits, call_features=True)
    drawn_from = list(kw["limits"].get("head_dim_choices", ())) or "all"
    return _campaign_cases(ctx, target="production", arch=gpu.arch, dtype=dtype, n=n, kw=kw, where=where,
                           time_limit_s=tl, siblings=_siblings(ctx),
                           extra={"head_dims_drawn_from": drawn_from,
                                  "features_drawn_from": list(kw.get("features") or ()),
                                  **_distributions_extra(ctx)})


def campaign_compiles(cases: list) -> list:
    """Note [Fake device audit]: the FA4 calls of a drawn campaign's cases -- one per FA4 compile
    key (the other cases of a key run the kernel it compiled), the backward where the case runs one
    (a planned row the space runs forward only -- a backward FA4 cannot build there, known issue
    sm90_bwd_hd104_112_compile -- compiles its forward alone, as the GPU run calls it;
    :func:`fa4verify.compile.production._run_call` compiles the forward only where FA4 has none)
    and its variant with a ``dlse`` where the ``bwd_stages`` property's dLSE pass runs it."""
    from fa4verify.compile.production import CompileCall
    from fa4verify.fuzz.properties import PROPERTIES
    from fa4verify.run.engine import case_key
    first: dict = {}
    count: dict = {}
    for c in cases:
        k = (case_key(c), bool(getattr(c, "backward", True)))
        first.setdefault(k, c)
        count[k] = count.get(k, 0) + 1
    return [CompileCall("backward" if k[1] else "forward", c.problem,
                        **({"deterministic": c.deterministic,
                            "dlse": "bwd_stages" in (c.head.get("properties") or PROPERTIES)} if k[1] else {}),
                        purpose=f"{count[k]} case(s) of this compile key") for k, c in first.items()]


@check("fuzz.production", title="Hypothesis fuzzing of production FA4 on the GPU", needs={"cuda", "fa4"},
       profiles={"default", "full", "exhaustive"}, cost=_GPU_COST, cases=_production_cases,
       summarise=summarise_campaign, compiles=lambda ctx: campaign_compiles(_production_cases(ctx)))
def production(ctx: CheckContext, case: DrawnCase) -> dict:
    return run_example(ctx, case)
