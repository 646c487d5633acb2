"""Clean-run false alarms and fault sensitivity of the three tiers: the entry point of
``scripts/gpu/stat_tier.sh``.

For ``N`` clean problems (a few FA4 compile keys: (head dim, causal) combos in bf16, varied seqlen,
batch and seed) the target (production FA4 on the local GPU, or the twin with a perturbed MUFU on
CPU for tests) runs forward + deterministic backward; a process pool judges each problem on CPU by

* the **worst-case tier** (``judge_forward`` / ``judge_backward``: out, lse, dq, dk, dv),
* the **sharper tier** (``forward_out_prob``, ``backward_{dq,dk,dv}_prob``; reported with tightness),
* the **statistical tier** (:func:`fa4verify.judge.statistical.stat_compare`: out, dq, dk, dv
  against the CPU twin's prediction on the same inputs, ``alpha`` per campaign, Bonferroni over
  problems x tensors x tests),

and counts false alarms (any fail on a clean problem) with the Clopper-Pearson 95 % bound on the
per-problem rate. Then an **output-scaling bias sweep**: ``O (1 + 2^-k)``, k = 7..18, applied in
float64 to the target's bf16 output and *not re-rounded* (a stand-in for a kernel fault before the
output cast: re-rounding an already rounded bf16 output by a relative 2^-9 or less returns it
unchanged), judged by the worst-case and statistical tiers; reports the smallest bias each catches.

Usage::

    python -m fa4verify.mutants.stat_campaign --target production --problems 1000 --out DIR [--workers 15]
    python -m fa4verify.mutants.stat_campaign --target twin --problems 8 --out DIR      # CPU smoke

Writes ``DIR/stat_tier.json`` and ``DIR/stat_tier.log``; prints a summary. Labels: "measured on
<GPU> (sm_XY)" for production, "CPU twin" for the twin.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Optional

import numpy as np

TENSORS = ("out", "dq", "dk", "dv")
SWEEP_K = tuple(range(7, 19))


def plan(n: int, combos=((64, False), (128, False), (128, True)), seqlens=(128, 256), seed0: int = 0):
    """The problem list: combos x seqlens cycled, one seed each (batch 1, 2 heads)."""
    out = []
    for i in range(n):
        hd, causal = combos[i % len(combos)]
        s = seqlens[(i // len(combos)) % len(seqlens)]
        out.append({"i": i, "head_dim": hd, "causal": causal, "seqlen": s, "seed": seed0 + i})
    return out


def _problem(spec: dict, arch: str):
    from fa4verify.problem import AttentionProblem, ValueSpec
    s = spec["seqlen"]
    return AttentionProblem(arch=arch, dtype="bf16", batch=1, seqlen_q=s, seqlen_k=s, nheads=2, nheads_kv=2,
                            head_dim=spec["head_dim"], head_dim_v=spec["head_dim"], causal=spec["causal"],
                            values=ValueSpec("normal", int(spec["seed"])))


def judge_one(job: dict) -> dict:
    """CPU side of one problem: oracle, both bound tiers, the twin's prediction, the statistical
    tier, and (when ``job['sweep']``) the bias sweep. Runs in a worker process."""
    from fa4verify import judge
    from fa4verify.judge import statistical as S
    from fa4verify.targets import TwinTarget
    spec, arch = job["spec"], job["arch"]
    p = _problem(spec, arch)
    a = p.materialize()
    got = job["outputs"]
    jf = judge.judge_forward(p, a, got["out"], got["lse"])
    jb = judge.judge_backward(p, a, got["dq"], got["dk"], got["dv"], forward=jf,
                              kernel_fwd=(got["out"], got["lse"]))
    tw = TwinTarget()
    f = tw.forward(p, a)
    g = tw.backward(p, a, f, deterministic=True)
    pred = {"out": f.out, "dq": g.dq, "dk": g.dk, "dv": g.dv}
    ref = {"out": jf.ref_out.value, "dq": jb.oracle.dq, "dk": jb.oracle.dk, "dv": jb.oracle.dv}
    at = job["alpha_test"]
    sv = {n: S.stat_compare(n, got[n], pred[n], ref[n], "bf16", alpha_test=at) for n in TENSORS}
    wc = {"out": jf.out, "lse": jf.lse, "dq": jb.dq, "dk": jb.dk, "dv": jb.dv}
    pr = {"out": jf.prob, **(jb.prob or {})}
    row = {"spec": spec,
           "worst_case": {n: [v.status, v.tightness] for n, v in wc.items()},
           "sharper": {n: [v.status, v.tightness] for n, v in pr.items() if v is not None},
           "stat": {n: {"status": v.status, "bias": v.bias_diff, "bias_ci": list(v.bias_ci),
                        "radial": v.radial_diff, "radial_ci": list(v.radial_ci), "ks_p": v.ks_p,
                        "actual_mean": v.actual.mean, "actual_radial": v.actual.radial_mean,
                        "actual_rms": v.actual.rms, "actual_q999": v.actual.q999,
                        "pred_mean": v.predicted.mean, "pred_rms": v.predicted.rms,
                        "hist_actual": list(v.actual.hist), "hist_pred": list(v.predicted.hist),
                        "reason": v.reason} for n, v in sv.items()}}
    if job.get("sweep"):
        sweep = {}
        for k in SWEEP_K:
            o = np.asarray(got["out"], np.float64) * (1.0 + 2.0 ** -k)
            vwc = judge.compare("out", o, jf.ref_out.value, oracle_bound=jf.ref_out.bound, budget=jf.ref_out.budget)
            vst = S.stat_compare("out", o, pred["out"], ref["out"], "bf16", alpha_test=at)
            sweep[k] = {"worst_case": vwc.status, "tightness": vwc.tightness, "stat": vst.status,
                        "radial": vst.radial_diff}
        row["sweep"] = sweep
    return row


def _target(name: str):
    if name == "production":
        from fa4verify.targets import ProductionTarget
        t = ProductionTarget()
        return t, t.arch, t.where
    from fa4verify.targets import TwinTarget
    # the CPU stand-in for production: the twin with a perturbed MUFU (differs from the prediction)
    return TwinTarget(mufu="perturbed", seed=12345), "sm90", "CPU twin"


def run(*, target: str = "twin", problems: int = 8, workers: int = 1, alpha: float = 1e-6,
        sweep_problems: int = 4, seqlens=(128, 256), combos=((64, False), (128, False), (128, True)),
        log=print) -> dict:
    """Run the campaign; returns the JSON-able result (see the module docstring)."""
    from fa4verify.judge import statistical as S
    t0 = time.time()
    tgt, arch, where = _target(target)
    specs = plan(problems, combos=combos, seqlens=seqlens)
    alpha_test = S.alpha_per_test(alpha, problems * len(TENSORS))
    pool = None
    if workers > 1:
        import multiprocessing as mp
        pool = mp.get_context("spawn").Pool(workers)
    pending, rows = [], []
    for spec in specs:
        p = _problem(spec, arch)
        a = p.materialize()
        f = tgt.forward(p, a)
        g = tgt.backward(p, a, f, deterministic=True)
        job = {"spec": spec, "arch": arch, "alpha_test": alpha_test, "sweep": spec["i"] < sweep_problems,
               "outputs": {"out": f.out, "lse": f.lse, "dq": g.dq, "dk": g.dk, "dv": g.dv}}
        if pool is None:
            rows.append(judge_one(job))
        else:
            from fa4verify.mutants.stat_campaign import judge_one as _judge   # importable by name under spawn
            pending.append(pool.apply_async(_judge, (job,)))
    t_run = time.time() - t0
    if pool is not None:
        rows = [r.get() for r in pending]
        pool.close()
        pool.join()
    res = summarize(rows, where=where, alpha=alpha, alpha_test=alpha_test)
    res["wall_s"] = round(time.time() - t0, 1)
    res["target_s"] = round(t_run, 1)
    res["target"] = target
    res["where"] = where
    try:
        res["describe"] = tgt.describe()
    except Exception:  # noqa: BLE001
        pass
    res["rows"] = rows
    return res


def summarize(rows: list, *, where: str, alpha: float, alpha_test: float) -> dict:
    from fa4verify.judge import statistical as S
    n = len(rows)
    fa = {"worst_case": 0, "sharper": 0, "stat": 0, "any": 0}
    und = {"worst_case": 0, "sharper": 0, "stat": 0}
    tight: dict = {"worst_case": {}, "sharper": {}}
    for r in rows:
        bad = False
        for tier in ("worst_case", "sharper"):
            st = [s for s, _ in r[tier].values()]
            if "fail" in st:
                fa[tier] += 1
                bad = True
            und[tier] += "undecided" in st
            for t, (_, x) in r[tier].items():
                tight[tier][t] = max(tight[tier].get(t, 0.0), float(x))
        st = [v["status"] for v in r["stat"].values()]
        if "fail" in st:
            fa["stat"] += 1
            bad = True
        und["stat"] += "undecided" in st
        fa["any"] += bad
    sweep: dict = {}
    for r in rows:
        for k, s in r.get("sweep", {}).items():
            d = sweep.setdefault(int(k), {"problems": 0, "worst_case_caught": 0, "stat_caught": 0})
            d["problems"] += 1
            d["worst_case_caught"] += s["worst_case"] == "fail"
            d["stat_caught"] += s["stat"] == "fail"
    smallest = {}
    for tier in ("worst_case", "stat"):
        ks = [k for k, d in sweep.items() if d[f"{tier}_caught"] == d["problems"] and d["problems"]]
        smallest[tier] = f"2^-{max(ks)}" if ks else None
    hists = {}
    for t in TENSORS:
        ha = np.sum([r["stat"][t]["hist_actual"] for r in rows], axis=0).tolist() if rows else []
        hp = np.sum([r["stat"][t]["hist_pred"] for r in rows], axis=0).tolist() if rows else []
        hists[t] = {"actual": ha, "predicted": hp, "edges": S.HIST_EDGES.tolist()}
    return {"where": where, "problems": n, "alpha_per_campaign": alpha, "alpha_per_test": alpha_test,
            "false_alarms": fa, "undecided": und,
            "false_alarm_rate_bound_95": S.rate_bound_zero_events(n) if fa["any"] == 0 else None,
            "max_tightness": tight, "sweep": {str(k): v for k, v in sorted(sweep.items())},
            "smallest_bias_caught_by_all_sweep_problems": smallest, "histograms": hists}


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fa4verify.mutants.stat_campaign", description=__doc__.split("\n")[0])
    ap.add_argument("--target", choices=("production", "twin"), default="twin")
    ap.add_argument("--problems", type=int, default=8)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--alpha", type=float, default=1e-6)
    ap.add_argument("--sweep-problems", type=int, default=4)
    ap.add_argument("--seqlens", default="128,256")
    ap.add_argument("--out", required=True)
    ns = ap.parse_args(argv)
    try:
        seqlens = tuple(int(x) for x in ns.seqlens.split(","))
    except ValueError:
        print(f"stat_campaign: error: --seqlens {ns.seqlens!r}: expected comma-separated integers", file=sys.stderr)
        return 2
    if ns.problems < 1 or ns.workers < 1 or not (0 < ns.alpha < 1):
        print("stat_campaign: error: --problems/--workers >= 1 and 0 < --alpha < 1", file=sys.stderr)
        return 2
    os.makedirs(ns.out, exist_ok=True)
    res = run(target=ns.target, problems=ns.problems, workers=ns.workers, alpha=ns.alpha,
              sweep_problems=ns.sweep_problems, seqlens=seqlens)
    with open(os.path.join(ns.out, "stat_tier.json"), "w") as fh:
        json.dump(res, fh, indent=1, default=float)
    lines = [f"stat tier campaign ({res['where']}): {res['problems']} clean problems, {res['wall_s']} s",
             f"false alarms: {res['false_alarms']} (undecided {res['undecided']})",
             f"per-problem false-alarm rate <= {res['false_alarm_rate_bound_95']} (95 %, Clopper-Pearson, 0 events)"
             if res["false_alarm_rate_bound_95"] is not None else "false alarms present: no rate bound",
             f"alpha per campaign {res['alpha_per_campaign']:g}, per test {res['alpha_per_test']:.3g}",
             f"max tightness worst-case {json.dumps(res['max_tightness']['worst_case'])}",
             f"max tightness sharper    {json.dumps(res['max_tightness']['sharper'])}",
             "bias sweep O(1+2^-k), not re-rounded (stand-in for a fault before the output cast):"]
    for k, d in res["sweep"].items():
        lines.append(f"  k={k}: worst-case caught {d['worst_case_caught']}/{d['problems']}, "
                     f"statistical caught {d['stat_caught']}/{d['problems']}")
    lines.append(f"smallest bias caught in every sweep problem: {res['smallest_bias_caught_by_all_sweep_problems']}")
    text = "\n".join(lines)
    with open(os.path.join(ns.out, "stat_tier.log"), "w") as fh:
        fh.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
