"""Audit check ``mufu.tanh`` (GPU): the hardware tanh FA4's softcap uses, every fp32 input, against
the model the budgets of this GPU's arch carry (Note [MUFU tanh envelope],
:mod:`fa4verify.kernels.probes.probe_mufu_tanh`).

The budgets bound ``tanh.approx.f32`` by PTX's relative error ``tanh_rel`` everywhere and, on an
arch where it was measured, by ``tanh_abs1`` (the largest absolute error at ``|x| >= 1``) and
``tanh_sat`` (every ``|x| >= tanh_sat`` gives exactly +-1), which the backward interval bound
uses to decide saturated softcaps. Those two are facts of a GPU: this check measures them on
the GPU the audit runs on and fails when the GPU is outside what the budgets assume (a newer GPU,
driver or compiler lowering ``tanh`` differently), so a budget never rests on another GPU's
measurement without the audit saying so.
"""
from __future__ import annotations

from fa4verify.audit.registry import CheckContext, CheckResult, check


def judge_tanh(stats: dict, constants: dict) -> list[dict]:
    """Rows ``{"figure", "measured", "budget_name", "budget", "ok"}`` of a :func:`sweep` result
    against the budget constants (the sharper figures only where the constants carry them)."""
    rows = [{"figure": "largest relative error, normal |x|", "measured": stats["max_rel_normal"],
             "budget_name": "tanh_rel", "budget": constants["tanh_rel"]},
            {"figure": "outputs with |tanh| > 1", "measured": stats["over_one"],
             "budget_name": "(none allowed)", "budget": 0},
            {"figure": "non-finite outputs on finite inputs", "measured": stats["nonfinite"],
             "budget_name": "(none allowed)", "budget": 0},
            {"figure": "tanh(-x) != -tanh(x)", "measured": stats["odd_violations"],
             "budget_name": "(none allowed)", "budget": 0}]
    if "tanh_abs1" in constants:
        rows.append({"figure": "largest absolute error, |x| >= 1", "measured": stats["max_abs_from_1"],
                     "budget_name": "tanh_abs1", "budget": constants["tanh_abs1"]})
    if "tanh_sat" in constants:
        rows.append({"figure": "smallest |x| from which tanh == +-1 exactly", "measured": stats["sat"],
                     "budget_name": "tanh_sat", "budget": constants["tanh_sat"]})
    for r in rows:
        r["ok"] = bool(r["measured"] <= r["budget"])
    return rows


@check("mufu.tanh", title="MUFU tanh.approx (FA4's softcap) on every fp32 input vs the budgets' model",
       needs={"cuda"}, profiles={"default", "full", "exhaustive"}, cost=6)
def tanh(ctx: CheckContext) -> CheckResult:
    from fa4verify.checks.exp2 import budget_constants
    from fa4verify.kernels.probes import probe_mufu_tanh as probe
    arch = ctx.device_arch
    with ctx.progress(256, "tanh.approx over every fp32 input, one binade at a time") as bar:
        stats = probe.sweep(progress=lambda done, total: bar.advance(1))
    const = budget_constants(ctx.dtype, arch)
    rows = judge_tanh(stats, const)
    bad = [r for r in rows if not r["ok"]]
    sharp = "tanh_sat" in const
    head = (f"{stats['inputs']:,} inputs: max rel {stats['max_rel_normal']:.3g} (tanh_rel {const['tanh_rel']:.3g}), "
            f"max abs at |x| >= 1 {stats['max_abs_from_1']:.3g}, exactly +-1 from |x| >= {stats['sat']:.9g}")
    if bad:
        summary = "FAIL: " + "; ".join(f"{r['figure']} {r['measured']:.6g} > {r['budget_name']} {r['budget']:.6g}"
                                       for r in bad) + f" ({head})"
    else:
        summary = head + ("; within the budgets' measured model (tanh_abs1, tanh_sat)" if sharp else
                          f"; the {arch} budgets carry no measured tanh model (PTX's tanh_rel only)")
    tight = max((r["measured"] / r["budget"] for r in rows if r["budget"] > 0), default=None)
    return CheckResult(
        status="fail" if bad else "pass", where=ctx.where_measured(), summary=summary,
        metrics={"max_rel_normal": stats["max_rel_normal"], "max_abs_from_1": stats["max_abs_from_1"],
                 "sat": stats["sat"]},
        tightness=tight,
        details={"table": {"columns": ["figure", "measured", "budget", "value", "ok"],
                           "rows": [[r["figure"], r["measured"], r["budget_name"], r["budget"], r["ok"]]
                                    for r in rows]},
                 "sweep": stats})
