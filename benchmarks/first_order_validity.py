"""Session-4 vs current composed budgets (Note [First-order validity], error_budgets/DERIVATIONS.md).

Usage:  python benchmarks/first_order_validity.py [--problems normal,outliers,outliers1000,huge16,huge]

For each problem (CPU twin forward + backward) prints, per tensor, the verdict under the session-4
formulas (tests/fixtures/session4_first_order_entries.toml) and under the shipped ones, and the
min / max ratio new/old of the budgets where both are finite. Figures: CPU twin. Asserts nothing.
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _problems():
    from fa4verify.problem import AttentionProblem, ValueSpec

    def mk(dist, seed, params, dtype="bf16", **kw):
        base = dict(arch="sm90", dtype=dtype, batch=1, seqlen_q=33, seqlen_k=70, nheads=2, nheads_kv=1,
                    head_dim=64, head_dim_v=64, causal=False, softmax_scale=1 / 8.0)
        base.update(kw)
        return AttentionProblem(values=ValueSpec(dist, seed, tuple(params)), **base)
    return {
        "normal": mk("normal", 21, (("sigma", 1.0),)),
        "outliers": mk("outliers", 23, (("p", 0.01), ("outlier_std", 100.0)), sink=True),
        "outliers1000": mk("outliers", 23, (("p", 0.01), ("outlier_std", 1000.0)), sink=True),
        "huge16": mk("huge", 14, (("e_qk", 6.0), ("e_v", 5.0)), dtype="fp16", seqlen_k=150, causal=True),
        "huge": mk("huge", 905, (("e_qk", 10.0), ("e_v", 0.0))),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default="normal,outliers,outliers1000,huge16,huge")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    from fa4verify import error_budgets as eb, judge
    from fa4verify.targets import TwinTarget
    probs = _problems()
    tmp = Path(tempfile.mkdtemp())
    s4 = (ROOT / "tests" / "fixtures" / "session4_first_order_entries.toml").read_text()
    print("fingerprint: CPU twin;", eb.loader.__name__, "FIRST_ORDER_LIMIT =", eb.loader.FIRST_ORDER_LIMIT)
    print(f"{'problem':<13} {'tensor':<8} {'old':<10} {'new':<10} {'n_hull':>6} {'min new/old':>12} {'max new/old':>12}")
    for name in args.problems.split(","):
        if name not in probs:
            print(f"unknown problem {name!r} (have {sorted(probs)})", file=sys.stderr)
            return 2
        p = probs[name]
        f_old = tmp / f"{p.dtype}_{p.arch}.toml"
        f_old.write_text(f'[meta]\nschema_version = 1\nextends = "{eb.budget_path(p.dtype, p.arch)}"\n\n' + s4)
        old = eb.load_file(f_old)
        a = p.materialize()
        t = TwinTarget()
        fw = t.forward(p, a)
        g = t.backward(p, a, fw)
        res = {}
        for tag, bs in (("old", old), ("new", None)):
            j = judge.judge_forward(p, a, fw.out, fw.lse, budgets=bs)
            jb = judge.judge_backward(p, a, g.dq, g.dk, g.dv, forward=j)
            res[tag] = {"out": (j.out, j.ref_out.budget), "lse": (j.lse, j.ref_lse.budget),
                        "dq": (jb.dq, jb.budgets["dq"]), "dk": (jb.dk, jb.budgets["dk"]),
                        "dv": (jb.dv, jb.budgets["dv"])}
        for n in ("out", "lse", "dq", "dk", "dv"):
            vo, bo = res["old"][n]
            vn, bn = res["new"][n]
            bo, bn = np.asarray(bo, np.float64), np.asarray(bn, np.float64)
            ok = np.isfinite(bo) & np.isfinite(bn) & (bo > 0) & (bn >= 0)
            r = bn[ok] / bo[ok] if ok.any() else np.array([math.nan])
            print(f"{name:<13} {n:<8} {vo.status:<10} {vn.status:<10} {getattr(vn, 'n_hull', 0):>6} "
                  f"{float(np.min(r)):>12.6f} {float(np.max(r)):>12.6f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
