"""Audit check for verifier power (fa4verify.mutants): fa4verify catches every planted numeric
mutant of the CPU twin and raises no false alarm on the unmutated twin.

* ``mutants.detection``  ("full" and "exhaustive" profiles only; about 2 min on one core for the
                         quick battery, which "full" runs; "exhaustive" runs the full battery).
                         Figures are "CPU twin". The metrics also record how many mutants the FA
                         upstream rule and ``torch.testing.assert_close`` defaults catch -- measured
                         side by side, never assumed.
"""
from __future__ import annotations

from fa4verify.audit.registry import CheckContext, CheckResult, check


@check("mutants.detection", title="fa4verify catches every numeric mutant of the twin; no false "
       "alarms", needs={"cpu"}, profiles={"full", "exhaustive"})
def detection(ctx: CheckContext) -> CheckResult:
    from fa4verify import mutants as M
    from fa4verify.mutants import suite

    if ctx.dtype != "bf16":
        ctx.skip(f"the mutant battery is bf16 (with fp8 forward problems); dtype {ctx.dtype} "
                 "has no battery of its own")
    tw = M.twin_module()
    if tw is None or getattr(tw, "backward", None) is None:
        ctx.skip("fa4verify.kernels.twin.attention (forward and backward) is not available")
    archs = tuple(a for a in ctx.archs if a in ("sm90", "sm100")) or ("sm90", "sm100")
    battery = "full" if ctx.profile == "exhaustive" else "quick"
    with ctx.progress(None, f"mutant suite ({battery} battery, {','.join(archs)})") as bar:
        res = M.run_suite(battery, seed=ctx.seed, archs=archs, progress=lambda _s: bar.advance(1))
    header, rows = M.table_rows(res)
    groups = {"fa4verify": [], "FA rule": [], "assert_close": []}
    for v in res.verifier_names:
        groups[suite._spec(v).group].append(v)

    def caught_by_group(group: str) -> int:
        n = 0
        for m in res.mutants:
            if group == "fa4verify":
                n += res.fa4verify_cell(m)[0].status == "caught"
            else:
                n += any(res.cell(m, v).status == "caught" for v in groups[group])
        return n

    fa = res.false_alarms()
    fa4_fa = sum(len(fa[v]) for v in groups["fa4verify"])
    caught = caught_by_group("fa4verify")
    missed, not_applicable = M.uncaught(res)
    metrics = {
        "mutants": len(res.mutants),
        "caught_higher_is_better": caught,
        "missed": len(missed),
        "not_applicable": len(not_applicable),
        "false_alarms": fa4_fa,
        "fa_rule_caught_higher_is_better": caught_by_group("FA rule"),
        "assert_close_caught_higher_is_better": caught_by_group("assert_close"),
        "fa_rule_false_alarms": sum(len(fa[v]) for v in groups["FA rule"]),
        "assert_close_false_alarms": sum(len(fa[v]) for v in groups["assert_close"]),
        "seconds": round(res.seconds, 1),
    }
    ok = not missed and fa4_fa == 0 and not res.unavailable
    summary = (f"fa4verify caught {caught}/{len(res.mutants) - len(not_applicable)} mutants, "
               f"{fa4_fa} false alarms; "
               f"FA rule caught {metrics['fa_rule_caught_higher_is_better']}, assert_close "
               f"{metrics['assert_close_caught_higher_is_better']} ({battery} battery)")
    if missed:
        summary += f"; missed: {', '.join(missed)}"
    if not_applicable:
        summary += f"; not applicable to {','.join(archs)}: {', '.join(not_applicable)}"
    if res.unavailable:
        summary += f"; unavailable verifiers: {', '.join(res.unavailable)}"
    return CheckResult(status="pass" if ok else "fail", where="CPU twin", summary=summary,
                       metrics=metrics,
                       details={"plot": {"kind": "table", "title": "Mutant detection (CPU twin)",
                                         "columns": header, "rows": rows,
                                         "where": "CPU twin"},
                                "unavailable": dict(res.unavailable)},
                       tightness=None)
