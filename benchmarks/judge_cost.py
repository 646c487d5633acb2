"""The judge's own CPU seconds on the heaviest problems of the default GPU audit's plan.

A warm audit on the H200 compiles nothing; its critical path is the slowest coverage task, where
the judge's float64 work (values, oracle, budgets) runs next to FA4's kernels. This times, per
problem, the stages of that work with no kernel at all (no GPU needed):

    python benchmarks/judge_cost.py                      # the 4 heaviest rows and every edge over 1 s
    python benchmarks/judge_cost.py --edges causal_l2_sections --rows 122
    python benchmarks/judge_cost.py --all            # every row and edge, and the sums

Columns: ``values`` (materialize), ``oracle_fwd``, ``fwd_allow`` (forward budgets),
``oracle_bwd`` (one oracle pass: the forward, the driver's backward and the dLSE pass's, Note [One
oracle pass] and Note [Variants share a pass], so ``oracle_fwd`` and ``oracle_bwd_dlse`` are 0),
``bwd_allow`` (the composed backward budgets), and the same
two for the dLSE pass (``*_dlse``, Note [The composed budgets with dLSE]) and for a loss through the LSE alone
(``*_lse_only``: dO = 0, the autograd pass of a deterministic row; its oracle the dLSE pass's minus
the driver's, Note [Gradients by linearity]). As production judges them: the
kernel's forward is the oracle's (rounded to fp32), and on sm90 the scores of the interval bound
come from the tensor-core model (Note [SM90 MMA model]), computed once per problem and shared by
its passes (the first backward column carries that cost). Seconds on this machine, one run each.
"""
from __future__ import annotations

import argparse
import copy
import time

import numpy as np


def _problems(arch: str, seed: int):
    from fa4verify.checks.coverage import forms_of
    from fa4verify.coverage.cases import edge_problems, plan_problems
    from fa4verify.coverage.planner import plan
    from fa4verify.coverage.space import registered_pairs, space_for
    from fa4verify.targets import production_features
    score, mask, mask_bwd = registered_pairs()
    sp = space_for(arch, "bf16", forms=forms_of(production_features()), score_pairs=score, mask_pairs=mask,
                   mask_pairs_bwd=mask_bwd)
    pl = plan(sp, seed=seed)
    _rows, problems = plan_problems(sp, pl.rows, seed=seed)
    return problems, {n: p for n, p, _b in edge_problems(sp, seed=seed)}


def _size(p) -> int:
    pairs = sum(a * b for a, b in zip(p.seqlens_q, p.seqlens_k)) if p.varlen else p.batch * p.seqlen_q * p.seqlen_k
    return pairs * p.nheads * (p.head_dim + p.head_dim_v)


def time_problem(p) -> dict[str, float]:
    from fa4verify import judge
    from fa4verify.fuzz.properties import _budget
    from fa4verify.oracles.attention import backward_difference
    t: dict[str, float] = {}

    def run(name, f):
        t0 = time.perf_counter()
        r = f()
        t[name] = time.perf_counter() - t0
        return r
    a = run("values", p.materialize)
    dl = (np.random.default_rng(0).standard_normal(p.fully_masked_rows().shape) * 0.5).astype(np.float32)
    # Note [One oracle pass] and Note [Variants share a pass]: one oracle pass gives the forward,
    # the driver's backward and the dLSE pass's (the oracle_bwd column; oracle_fwd is 0 but
    # where the oracle computes the forward on its own)
    t0 = time.perf_counter()
    of, (ob, obd) = judge.oracle_pass(p, a, (None, dl))
    t["oracle_bwd"] = time.perf_counter() - t0
    t["oracle_fwd"] = t["oracle_bwd_dlse"] = 0.0
    ref_out, _lse, stats, _ = run("fwd_allow", lambda: judge.forward_allowances(p, a, budgets=_budget(p), oracle=of))
    kw = dict(probabilistic=False, kernel_fwd=(np.asarray(of.out, np.float32), np.asarray(of.lse, np.float32)),
              tensor_core="sm90" if p.arch == "sm90" else None)
    run("bwd_allow", lambda: copy.copy(stats).backward(ob, ref_out.budget, ref_out.bound, **kw))
    run("bwd_allow_dlse", lambda: copy.copy(stats).backward(obd, ref_out.budget, ref_out.bound, dlse=dl, **kw))
    a0 = dict(a, dout=np.zeros_like(a["dout"]))
    # Note [Gradients by linearity]: production's LSE-only oracle is the dLSE pass's minus the driver's
    ob0 = run("oracle_bwd_lse_only", lambda: backward_difference(obd, ob))
    run("bwd_allow_lse_only", lambda: stats.with_zero_dout(a0).backward(ob0, ref_out.budget, ref_out.bound, dlse=dl,
                                                                         **kw))
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="sm90")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rows", type=int, nargs="*", help="plan row indices (default: the 4 largest)")
    ap.add_argument("--edges", nargs="*", help="edge names (default: the 4 largest)")
    ap.add_argument("--all", action="store_true", help="every plan row and edge, then the column sums")
    args = ap.parse_args()
    problems, edges = _problems(args.arch, args.seed)
    if args.all:
        args.rows, args.edges = list(range(len(problems))), list(edges)
    rows = args.rows if args.rows is not None else sorted(range(len(problems)), key=lambda i: -_size(problems[i]))[:4]
    names = args.edges if args.edges is not None else sorted(edges, key=lambda n: -_size(edges[n]))[:4]
    cols = ("values", "oracle_fwd", "fwd_allow", "oracle_bwd", "bwd_allow", "oracle_bwd_dlse", "bwd_allow_dlse",
            "oracle_bwd_lse_only", "bwd_allow_lse_only")
    print(f"{'problem':<14}" + "".join(f"{c:>20}" for c in cols) + f"{'total':>10}")
    sums = dict.fromkeys(cols, 0.0)
    failed = []
    for label, p in [(f"row {i}", problems[i]) for i in rows] + [(n, edges[n]) for n in names]:
        try:
            t = time_problem(p)
        except Exception as e:  # noqa: BLE001 - a problem the judge cannot time here (no backward): said, skipped
            failed.append(label)
            print(f"{label:<14} not timed: {type(e).__name__}: {str(e)[:100]}")
            continue
        for c in cols:
            sums[c] += t.get(c, 0.0)
        print(f"{label:<14}" + "".join(f"{t.get(c, 0.0):>20.2f}" for c in cols) + f"{sum(t.values()):>10.2f}",
              flush=True)
        print(f"  {p.describe()[:140]}")
    if len(rows) + len(names) > 1:
        print(f"{'sum':<14}" + "".join(f"{sums[c]:>20.2f}" for c in cols) + f"{sum(sums.values()):>10.2f}"
              + (f"   ({len(failed)} not timed: {', '.join(failed[:6])})" if failed else ""))


if __name__ == "__main__":
    main()
