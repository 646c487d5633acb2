"""The judge's CPU seconds per example over the whole plan of ``coverage.production`` (its rows,
constructed edges, kernel-variant edges, judged siblings and the statistical tier's calls), as the
GPU audit judges them, with no GPU: a CPU stand-in answers for FA4.

A warm default audit on an H100 spends ~90 % of its worker time in the judge (the figures are in
its report, ``examples: ... s in the judge``); this prints that work per example on this machine,
so a change to the judge can be measured before a GPU is lent::

    python benchmarks/plan_judge_cost.py                    # every example, then the sums
    python benchmarks/plan_judge_cost.py --only stat        # the statistical tier's calls
    python benchmarks/plan_judge_cost.py --names row2 varlen_lookup_chunks --profile
    python benchmarks/plan_judge_cost.py --profile --sort cumulative --lines 150

The stand-in: the CPU twin's outputs where the twin runs the call (so the statistical tier's
prediction meets the same arithmetic), else the oracle's rounded to fp32 (score / mask pairs, a
learnable sink, block lists under a causal or window rule). Its own seconds (``target``) are not
the judge's and are left out of the ``judge`` column, as the audit leaves FA4's calls out. Seed 0,
arch sm90, bf16 (the plan a GPU audit on an H100 / H200 runs). Seconds on this machine, one run;
the verdicts are the stand-in's, not FA4's.
"""
from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np


def stand_in():
    from fa4verify.targets import Bwd, Fwd, TwinTarget

    class StandIn(TwinTarget):
        name = "production"
        where = "stand-in"
        deterministic_by_construction = False

        def __init__(self):
            super().__init__()
            self.tensor_core = "sm90"       # the judge's sm90 scores, as for production

        def check_supported(self, problem):
            pass

        def _twin_runs(self, problem) -> bool:
            if problem.sink:
                return False
            try:
                TwinTarget.check_supported(self, problem)
                return True
            except Exception:  # noqa: BLE001 - the twin's refusal: the oracle answers
                return False

        def forward(self, problem, a):
            if self._twin_runs(problem):
                return TwinTarget.forward(self, problem, a)
            from fa4verify import judge
            of = judge.oracle_forward(problem, a)
            return Fwd(np.asarray(of.out, np.float32).astype(np.float64),
                       np.asarray(of.lse, np.float32).astype(np.float64))

        def backward(self, problem, a, fwd, *, deterministic=True, taps=None, dlse=None):
            if self._twin_runs(problem) and self.backward_unsupported(problem) is None:
                return TwinTarget.backward(self, problem, a, fwd, deterministic=deterministic, taps=taps, dlse=dlse)
            from fa4verify import judge
            ob = judge.oracle_backward(problem, a, dlse=dlse)
            r = lambda x: None if x is None else np.asarray(x, np.float32).astype(np.float64)   # noqa: E731
            return Bwd(r(ob.dq), r(ob.dk), r(ob.dv), r(getattr(ob, "dsink", None)))

        def taps_unsupported(self, problem):
            return TwinTarget.taps_unsupported(self, problem) or (None if self._twin_runs(problem) else "stand-in")

        def autograd_unsupported(self, problem):
            return self.dlse_unsupported(problem)

        def backward_autograd(self, problem, a, *, deterministic=True, dlse=None, lse_only=False):
            f = self.forward(problem, a)
            aa = dict(a, dout=np.zeros_like(a["dout"])) if lse_only else a
            return self.backward(problem, aa, f, deterministic=deterministic, dlse=dlse)
    return StandIn()


def plan_cases(arch: str, seed: int) -> list:
    """``coverage.production``'s cases on ``arch`` (its own ``cases()``, no GPU asked)."""
    from fa4verify.checks import coverage as C
    from fa4verify.audit.registry import CheckContext
    from fa4verify.targets import production_features
    ctx = CheckContext(arch=arch, seed=seed, profile="default", check_id=f"coverage.production[{arch}]")
    return C._cases(ctx, target="production", features=production_features(), arch=arch, dtype="bf16",
                    where="stand-in")


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm90")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", choices=("all", "stat", "nostat"), default="all",
                    help="the statistical tier's calls, the others, or every example")
    ap.add_argument("--names", nargs="*", help="examples by name (rowN or the edge's name)")
    ap.add_argument("--json", help="write [{index, name, judge, target, stat}, ...] here")
    ap.add_argument("--profile", action="store_true", help="cProfile the judged examples")
    ap.add_argument("--sort", default="tottime", choices=("tottime", "cumulative"),
                    help="the profile's order: own time, or time with the callees'")
    ap.add_argument("--lines", type=int, default=30, help="the profile's rows printed")
    a = ap.parse_args(argv)
    from fa4verify.fuzz import properties as P
    cases = plan_cases(a.arch, a.seed)
    plan = cases[0].head["extra"]["plan"]
    n_rows = len(plan["rows"])
    names = [f"row{i}" for i in range(n_rows)] + list(plan["edges"])
    stat = {int(i) for i in plan.get("stat_calls", {})}
    tgt = stand_in()
    prof = None
    if a.profile:
        import cProfile
        prof = cProfile.Profile()
    out = []
    for c in cases:
        i, name = c.index, names[c.index]
        if a.names and name not in a.names:
            continue
        if (a.only == "stat" and i not in stat) or (a.only == "nostat" and i in stat):
            continue
        props = tuple(c.head["properties"]) + (("stat_tier",) if i in stat else ())
        P.target_seconds(reset=True)
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        try:
            o = P.check_problem(c.problem, tgt, properties=props, backward=c.backward, deterministic=c.deterministic)
            how = "undecided" if o.undecided else "judged"
        except Exception as e:  # noqa: BLE001 - the stand-in's violations end an example early: said
            how = f"{type(e).__name__}"
        if prof:
            prof.disable()
        total = time.perf_counter() - t0
        target = P.target_seconds()
        out.append({"index": i, "name": name, "judge": total - target, "target": target, "stat": i in stat})
        print(f"{i:4d} {name:60s} judge {total - target:7.2f} s  stand-in {target:6.2f} s  "
              f"{'stat ' if i in stat else ''}{how}", flush=True)
    j = sum(r["judge"] for r in out)
    js = sum(r["judge"] for r in out if r["stat"])
    print(f"{len(out)} examples: judge {j:.1f} s ({js:.1f} s on the {sum(r['stat'] for r in out)} statistical-tier "
          f"calls), stand-in {sum(r['target'] for r in out):.1f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f)
    if prof:
        import pstats
        pstats.Stats(prof).sort_stats(a.sort).print_stats(a.lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
