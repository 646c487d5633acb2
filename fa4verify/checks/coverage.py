"""Audit checks: coverage by construction (:mod:`fa4verify.coverage`).

* ``coverage.production`` (GPU): the covering-array plan of the local arch's feature space run on
  production FA4 -- every pair of supported dimension values and every supported
  mask x call form x pass and GQA ratio x softmax_scale x pass triple at least once, in shapes chosen at the tile edges, the
  ``"edges"`` values on a share of the rows (every mask edge with its one-key self-check), the
  backward's stage taps (D, lse_log2, dq_accum) on every dense backward row. The deployment
  profile confines the space; a space with nothing FA4 supports skips ("nothing ran").
* ``coverage.twin[<arch>]`` (CPU): the same plan on the CPU twin (the forms the twin runs), so a
  machine without a GPU shows what the plan covers and judges it on the twin.

Each row runs through the fuzz runner (:func:`fa4verify.fuzz.drawn.run_drawn`: the one judge,
known FA4 issues absorbed only where they explain the violation), one engine case per row like
``fuzz.production``. The result's details hold the coverage matrix: per dimension pair (and per
triple) the tuples covered of those supported, every hole by name, and every unsupported tuple
with the reason from FA4's own claims. A hole (a supported tuple whose rows FA4 refused or that
did not run) makes the check undecided, never a pass.
"""
from __future__ import annotations

from typing import Optional

from fa4verify.audit.registry import CheckContext, CheckResult, check
from fa4verify.checks.fuzz import (DrawnCase, _campaign_cases, _dtype, campaign_compiles, run_example,
                                   summarise_campaign)

#: the properties a planned row is judged on (the rest need extra kernels: the fuzz runs them)
PLAN_PROPERTIES = ("runs", "fwd_budget", "bwd_budget", "finite", "masked_rows", "edge_sensitive", "bwd_stages")


def forms_of(features: tuple[str, ...]) -> tuple[str, ...]:
    """The plan's call forms a target with ``features`` runs."""
    from fa4verify.problem import MOD_FEATURE
    out = ["dense"]
    if "varlen" in features:
        out.append("varlen")
    if "seqused_k" in features:
        out.append("seqused_k")
    if "seqused_q" in features:
        out.append("seqused_q")
    if "paged_kv" in features:
        out += ["paged_small", "paged_tile"]
    if "block_sparse" in features:
        out.append("block_sparse")
    if "block_sparse" in features and MOD_FEATURE in features:
        out.append("block_sparse_mod")
    if "block_sparse" in features and "varlen" in features:
        out.append("block_sparse_varlen")
    if "mask_mod_fn" in features or MOD_FEATURE in features:
        out.append("mask_mod")
    if MOD_FEATURE in features:
        out.append("score_mod")
    if "split_kv" in features:
        out.append("split_kv")
    return tuple(out)


def build(ctx: CheckContext, *, arch: str, dtype: str, features: tuple[str, ...]):
    """(space, plan, problems) of this audit on ``arch``."""
    from fa4verify.problem import MOD_FEATURE
    from fa4verify.coverage.cases import plan_problems
    from fa4verify.coverage.planner import plan
    from fa4verify.coverage.space import registered_pairs, space_for
    score, mask, mask_bwd = registered_pairs()
    if MOD_FEATURE not in features:     # the twin runs CuTe mask_mod call forms, not mod pairs
        score = ()
        mask = tuple(m for m in mask if m.startswith("fn:"))
        mask_bwd = tuple(m for m in mask_bwd if m.startswith("fn:"))
    sp = space_for(arch, dtype, forms=forms_of(features), deployment=ctx.deploy, score_pairs=score,
                   mask_pairs=mask, mask_pairs_bwd=mask_bwd)
    pl = plan(sp, seed=int(ctx.seed))
    pl.rows, problems = plan_problems(sp, pl.rows, seed=int(ctx.seed))   # every registered pair runs
    return sp, pl, problems


def _cases(ctx: CheckContext, *, target: str, features: tuple[str, ...], arch: str, dtype: str,
           where: str) -> list:
    """The plan's rows as the check's cases (coverage/planner.py is this check's ``cases()``)."""
    from fa4verify.coverage.cases import NONDETERMINISTIC_EDGES, edge_problems
    sp, pl, problems = build(ctx, arch=arch, dtype=dtype, features=features)
    if not pl.rows:
        why = "; ".join(f"{k}: {v}" for k, v in sp.notes.items()) or "the space is empty"
        ctx.skip(f"nothing to run: the audit's space holds no value FA4 supports on {arch} ({why})")
    # Note [Constructed edges]: after the rows, outside the coverage tuples
    edges = edge_problems(sp, seed=int(ctx.seed))
    n_rows = len(problems)
    backward = row_backward(sp, pl.rows)
    det = {i: r["det"] == "on" for i, r in enumerate(pl.rows)}
    det.update({n_rows + k: n not in NONDETERMINISTIC_EDGES for k, (n, _p, _b) in enumerate(edges)})
    # Note [Kernel variants]: then one call per SM90 kernel variant that neither reaches (FA4's
    # kernels: the twin compiles none)
    from fa4verify.coverage.variants import variant_edges
    ran = [(p, backward[i], det[i]) for i, p in enumerate(problems)]
    ran += [(p, b, det[n_rows + k]) for k, (_n, p, b) in enumerate(edges)]
    variants = variant_edges(sp, ran, seed=int(ctx.seed), by_twin=True) if target == "production" else []
    if target == "production":      # Note [Split-KV by FA4's heuristic]: FA4 picks the split count
        from fa4verify.coverage.cases import split_auto_edges
        for n, p, b in split_auto_edges(sp):
            det[n_rows + len(edges)] = True
            edges.append((n, p, b))
    for n, p, b, d in variants:
        det[n_rows + len(edges)] = d
        edges.append((n, p, b))
    # Note [Judged siblings]: then a sibling for each backward a known issue absorbs by its
    # configuration alone (the defects are production FA4's)
    siblings, unjudged = [], []
    if target == "production":
        from fa4verify.coverage.siblings import judged_siblings
        siblings, unjudged = judged_siblings(sp, [(f"row{i}", p, backward[i], det[i]) for i, p in enumerate(problems)]
                                             + [(n, p, b, det[n_rows + k]) for k, (n, p, b) in enumerate(edges)])
    for n, p, b, d in siblings:
        det[n_rows + len(edges)] = d
        edges.append((n, p, b))
    extra = {"plan": {"space": sp.describe(), "rows": pl.rows, "seed": int(ctx.seed),
                      "uncoverable": [list(map(list, t)) for t in pl.uncoverable],
                      "edges": [n for n, _p, _b in edges], "variant_edges": len(variants),
                      "judged_siblings": len(siblings), "unjudged": unjudged}}
    backward.update({n_rows + k: b for k, (_n, _p, b) in enumerate(edges)})
    if target == "production":
        # Note [A statistical verdict per kernel variant]: one call per variant also judged by
        # the statistical tier (its indices in the plan's details: run_example asks for the property)
        from fa4verify.coverage.variants import statistical_calls
        from fa4verify.fuzz.properties import STAT_TIER_MAX_CALLS
        every = problems + [p for _n, p, _b in edges]
        stat, stat_unjudged = statistical_calls([(p, backward[i], det[i]) for i, p in enumerate(every)],
                                                limit=STAT_TIER_MAX_CALLS)
        extra["plan"]["stat_calls"] = {str(i): tags for i, tags in sorted(stat.items())}
        extra["plan"]["stat_unjudged"] = stat_unjudged
    return _campaign_cases(ctx, target=target, arch=arch, dtype=dtype, n=n_rows + len(edges), kw={}, where=where,
                           extra=extra, problems=problems + [p for _n, p, _b in edges], properties=PLAN_PROPERTIES,
                           deterministic=det, backward=backward)


def row_backward(sp, rows: list) -> dict[int, bool]:
    """Whether each planned row calls FA4's backward: only where the space says FA4 has one
    (``FeatureSpace.passes``). A forward-only row keeps ``det=on`` (det=off is a backward setting),
    and FA4 would refuse a deterministic backward it cannot run before anything is judged (on the
    H200, seeds 0-2: a block-sparse row at head dim 104 was refused whole, "Deterministic not
    implemented for block-sparse backward", leaving its forward pairs uncovered)."""
    return {i: "bwd" in sp.passes(r) for i, r in enumerate(rows)}


def merge_planned(ctx: CheckContext, results: list) -> CheckResult:
    """The campaign's summary over the rows, then what the rows that ran covered."""
    head = {"extra": results[0][0].head["extra"]}
    return planned_result(summarise_campaign(ctx, results), head, [v["outcome"] for _c, v in results])


def planned_result(out: CheckResult, head: dict, outcomes: list) -> CheckResult:
    """The campaign result ``out`` of a planned run, with what the rows that ran covered
    (``details["plan_coverage"]``); holes make it undecided (never a pass)."""
    from fa4verify.coverage.planner import coverage
    from fa4verify.coverage.space import FeatureSpace
    pl = head["extra"]["plan"]
    sp = FeatureSpace.from_dict(pl["space"])
    rows = pl["rows"]
    by = {int(o["index"]): o for o in outcomes}
    ran = [i for i in range(len(rows)) if by.get(i, {}).get("status") in ("ran", "known", "violation")]
    refused = {i: by[i].get("unsupported_detail") or by[i].get("unsupported", "") for i in range(len(rows))
               if by.get(i, {}).get("status") == "unsupported"}
    # a row stopped by a known FA4 run failure (its backward does not build: sm90_bwd_hd104_112_compile)
    # judged its forward only; its backward triples are not covered
    judged = [("fwd",) if (by[i].get("known_raised") or {}).get("property") == "runs" else None for i in ran]
    cov = coverage(sp, [rows[i] for i in ran], passes=judged)
    cov["refused_rows"] = {str(i): {"row": rows[i], "why": w} for i, w in refused.items()}
    cov["not_run_rows"] = [i for i in range(len(rows)) if by.get(i, {}).get("status") == "not_run"]
    # every violating row and edge by name (the campaign's summary shrinks to the first one)
    def failure(i: int) -> Optional[dict]:
        o = by.get(i, {})
        if o.get("status") != "violation" or not o.get("failure"):
            return None
        return {"property": o["failure"]["property"], "message": o["failure"]["message"][:300],
                "problem": o["failure"]["describe"]}
    cov["violating_rows"] = {str(i): dict(row=rows[i], **f) for i in range(len(rows))
                             for f in [failure(i)] if f is not None}
    cov["known_rows"] = {str(i): sorted({k["name"] for k in by[i].get("known", [])}
                                        | {k["with"]["name"] for k in by[i].get("known", []) if "with" in k}
                                        | ({by[i]["known_raised"]["name"]} if by[i].get("known_raised") else set()))
                         for i in range(len(rows)) if by.get(i, {}).get("known") or by.get(i, {}).get("known_raised")}
    # Note [Known issues with a model]: what each known issue absorbed, and how: within its float64
    # model, or by its configuration rule alone (a blind area a reviewer should see by name)
    absorbed = {}
    for i, o in by.items():
        ks = [{"name": k["name"], "quantity": k.get("tightness_key", k.get("quantity")), "property": k.get("property"),
               "model": k.get("model", "no model"), **({"with": k["with"]} if "with" in k else {})}
              for k in o.get("known", [])]
        if ks:
            absorbed[str(i)] = ks
    cov["known_absorbed"] = absorbed
    cov["uncoverable"] = pl.get("uncoverable", [])
    # Note [Constructed edges]: each must run (a refused or unrun edge is a hole, never a pass)
    cov["edge_cases"] = {n: by.get(len(rows) + k, {}).get("status", "not_run")
                         for k, n in enumerate(pl.get("edges", []))}
    cov["violating_edges"] = {n: f for k, n in enumerate(pl.get("edges", []))
                              for f in [failure(len(rows) + k)] if f is not None}
    edge_holes = [n for n, st in cov["edge_cases"].items() if st not in ("ran", "known", "violation")]
    # Note [Edge values]: a planned edge row must see every edge it planted
    blind = {i: int(by[i].get("metrics", {}).get("edges_blind", 0)) for i in ran
             if rows[i].get("values") == "edges" and by[i].get("metrics", {}).get("edges_blind", 0)}
    cov["blind_edge_rows"] = {str(i): n for i, n in blind.items()}
    edge_rows = [i for i in ran if rows[i].get("values") == "edges"]
    out.metrics["edge_rows"] = len(edge_rows)
    out.metrics["edges_seen"] = int(sum(by[i].get("metrics", {}).get("edges_seen", 0) for i in edge_rows))
    out.details.pop("plan", None)
    out.details["plan_coverage"] = cov
    out.details["plan"] = {"rows": len(rows), "seed": pl["seed"], "space": pl["space"],
                           "row_values": rows}
    out.details["plot"] = coverage_plot(cov, where=out.where)
    out.metrics["coverage_covered_higher_is_better"] = cov["covered"]
    out.metrics["coverage_supported"] = cov["supported"]
    out.metrics["coverage_holes"] = len(cov["holes"])
    head_line = (f"covered {cov['covered']}/{cov['supported']} supported value pairs and mask x form x pass "
                 f"and gqa x scale x pass triples in {len(ran)} of {len(rows)} planned rows ({sp.arch} {sp.dtype}; "
                 f"{len(cov['unsupported'])} tuples not planned: FA4 or fa4verify does not run them, each with its reason)")
    if blind:
        out.summary = (f"{len(blind)} planned edge row(s) blind to a one-key shift (first: row {next(iter(blind))}); "
                       + out.summary)
        if out.status == "pass":
            out.status = "undecided"
    if cov["edge_cases"]:
        head_line += f"; {len(cov['edge_cases']) - len(edge_holes)}/{len(cov['edge_cases'])} constructed edges ran"
        parts = []
        if pl.get("variant_edges"):      # Note [Kernel variants]
            parts.append(f"{pl['variant_edges']} of them for kernel variants no row or other edge compiles")
        if pl.get("judged_siblings"):    # Note [Judged siblings]
            parts.append(f"{pl['judged_siblings']} judged siblings of calls a known issue absorbs by configuration")
        if parts:
            head_line += " (" + "; ".join(parts) + ")"
    if pl.get("unjudged"):
        head_line += (f"; {len(pl['unjudged'])} call(s) a known issue absorbs by configuration with no judged "
                      f"sibling in the space: {', '.join(pl['unjudged'][:4])}")
    if absorbed:
        flat = [k for ks in absorbed.values() for k in ks]
        within = sum(k["model"] == "within" for k in flat)
        elements = sum(k["model"] == "elements" for k in flat)
        head_line += (f"; known FA4 issues absorbed {len(flat)} violation(s) in {len(absorbed)} case(s), {within} "
                      f"within a model of the defect, "
                      + (f"{elements} on elements the defect's rule names, " if elements else "")
                      + f"{len(flat) - within - elements} by configuration alone")
        two = sum("with" in k for k in flat)
        if two:          # Note [Two defects in one violation]
            head_line += f" ({two} of them with another issue's elements taken out)"
    # Note [A statistical verdict per kernel variant]: the calls the statistical tier judged, the
    # ones it could not (the reason each), the variants no call the twin runs reaches
    stat_calls = pl.get("stat_calls") or {}
    if stat_calls:
        judged_st = [i for i in stat_calls if "stat_tier" in by.get(int(i), {}).get("ran", [])]
        not_formed = {i: {k: w for k, w in by.get(int(i), {}).get("skipped", {}).items() if k.startswith("stat_tier")}
                      for i in stat_calls}
        cov["statistical"] = {"calls": stat_calls, "judged": judged_st,
                              "not_formed": {i: w for i, w in not_formed.items() if w},
                              "unjudged_variants": pl.get("stat_unjudged", [])}
        head_line += (f"; the statistical tier judged {len(judged_st)}/{len(stat_calls)} calls, one per kernel "
                      f"variant ({sum(len(t) for t in stat_calls.values())} variants; "
                      f"{len(pl.get('stat_unjudged', []))} no call the twin runs reaches)")
    # every violating row and edge by name: the campaign's summary shrinks to the first one only
    named = ([f"row {i} ({v['property']})" for i, v in cov["violating_rows"].items()]
             + [f"edge {n} ({v['property']})" for n, v in cov["violating_edges"].items()])
    if named:
        head_line += (f"; {len(named)} violating: " + ", ".join(named[:6])
                      + (f" and {len(named) - 6} more" if len(named) > 6 else ""))
    if edge_holes:
        named = ", ".join(f"{n} ({cov['edge_cases'][n]})" for n in edge_holes)
        out.summary = f"constructed edge(s) not judged: {named}; " + out.summary
        if out.status == "pass":
            out.status = "undecided"
    if cov["holes"] or cov["uncoverable"]:
        first = cov["holes"][0] if cov["holes"] else str(cov["uncoverable"][0])
        why = ""
        if refused:
            i, w = next(iter(refused.items()))
            why = f"; row {i} refused: {w}"
        out.summary = f"{head_line}; {len(cov['holes'])} HOLE(S), first: {first}{why}; " + out.summary
        if out.status == "pass":
            out.status = "undecided"
    else:
        out.summary = f"{head_line}; " + out.summary
    return out


def coverage_plot(cov: dict, *, where: str = "") -> list:
    """The HTML report's coverage matrix: a table per dimension pair (covered / supported) and
    the unsupported tuples with their reasons."""
    rows = [[g, c["covered"], c["supported"], cov["unsupported_per_group"].get(g, 0)]
            for g, c in cov["per_group"].items()]
    out = [{"kind": "table", "title": "coverage by construction: tuples covered / supported",
            "columns": ["dimensions", "covered", "supported", "not planned (FA4 or fa4verify)"], "rows": rows,
            "where": where}]
    ab = [[c, k["name"], k["quantity"], k["model"]] for c, ks in cov.get("known_absorbed", {}).items() for k in ks]
    if ab:
        out.append({"kind": "table", "title": "violations absorbed by known FA4 issues (case: plan row, or an edge "
                                              "after the rows)", "columns": ["case", "known issue", "quantity", "how"],
                    "rows": ab[:400]})
    if cov["holes"]:
        out.append({"kind": "table", "title": "holes (supported, not covered)", "columns": ["tuple"],
                    "rows": [[h] for h in cov["holes"][:200]]})
    uns = list(cov["unsupported"].items())
    if uns:
        out.append({"kind": "table", "title": "not planned: the installed FA4 or fa4verify does not run them",
                    "columns": ["tuple", "why"], "rows": [[t, w] for t, w in uns[:300]]})
    return out


def _production_cases(ctx: CheckContext) -> list:
    from fa4verify.targets import production_features
    dtype = _dtype(ctx, fp8=True)
    gpu = ctx.require_gpu()
    return _cases(ctx, target="production", features=production_features(), arch=gpu.arch,
                  dtype=dtype, where=ctx.where_measured())


def _twin_cases(ctx: CheckContext) -> list:
    from fa4verify.targets import TwinTarget
    return _cases(ctx, target="twin", features=TwinTarget().features(), arch=ctx.arch, dtype=_dtype(ctx, fp8=True),
                  where="CPU twin")


@check("coverage.production", title="Coverage by construction: every supported pair and planned triple "
                                    "on production FA4",
       needs={"cuda", "fa4"}, profiles={"default", "full", "exhaustive"}, cost=200,
       cases=_production_cases, summarise=merge_planned,
       compiles=lambda ctx: campaign_compiles(_production_cases(ctx)))
def production(ctx: CheckContext, case: DrawnCase) -> dict:
    return run_example(ctx, case)


@check("coverage.twin", title="Coverage by construction on the CPU twin (the forms it runs)",
       needs={"cpu"}, profiles={"full", "exhaustive"}, archs={"sm90", "sm100"},
       cases=_twin_cases, summarise=merge_planned)
def twin(ctx: CheckContext, case: DrawnCase) -> dict:
    return run_example(ctx, case)


__all__ = ["PLAN_PROPERTIES", "forms_of", "build", "merge_planned", "planned_result", "coverage_plot"]
