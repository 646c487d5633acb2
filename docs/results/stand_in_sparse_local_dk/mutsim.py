"""CPU stand-in prediction: does coverage.production catch dK x (1 + 2^-7) in the SM90 MHA block-sparse
backward under a window (source mutant sm90_bwd_sparse_local_mha_dk_scale)? The stand-in: the oracle's
gradients rounded to bf16 (FA4's output dtype), the fault applied where the mutant's guard holds."""
import sys, numpy as np
sys.path.insert(0, "benchmarks")   # run from the repository root: PYTHONPATH=. python docs/results/stand_in_sparse_local_dk/mutsim.py mut|clean
import plan_judge_cost as B
from fa4verify.fuzz import properties as P
from fa4verify.problem import resolve_window
from oracles.binary32 import to_bf16

base = B.stand_in()
cls = type(base)

def guard(p):
    _, local, _, _ = resolve_window(p.causal, p.window_size)
    return p.call is not None and p.call.block_size is not None and local and p.nheads == p.nheads_kv

class Mut(cls):
    def backward(self, problem, a, fwd, **kw):
        g = super().backward(problem, a, fwd, **kw)
        r = lambda x: None if x is None else to_bf16(np.asarray(x, np.float32)).astype(np.float64)
        dk = r(g.dk)
        if guard(problem) and mode == 'mut':
            dk = r(np.asarray(dk, np.float32) * np.float32(1.0078125))
        return type(g)(r(g.dq), dk, r(g.dv), g.dsink) if hasattr(g, "_fields") else g.__class__(r(g.dq), dk, r(g.dv), g.dsink)

mode = sys.argv[1] if len(sys.argv) > 1 else "mut"
tgt = Mut()
cases = B.plan_cases("sm90", 0)
plan = cases[0].head["extra"]["plan"]
n_rows = len(plan["rows"]); names = [f"row{i}" for i in range(n_rows)] + list(plan["edges"])
stat = {int(i) for i in plan.get("stat_calls", {})}
hit = []
for c in cases:
    if not (c.backward and guard(c.problem)):
        continue
    props = tuple(c.head["properties"]) + (("stat_tier",) if c.index in stat else ())
    try:
        o = P.check_problem(c.problem, tgt, properties=props, backward=c.backward, deterministic=c.deterministic)
        tk = {k: round(v, 3) for k, v in o.metrics.items() if k.startswith("tightness_") and "dk" in k}
        print(f"{names[c.index]:55s} PASS {'undecided ' + str(o.undecided) if o.undecided else ''} {tk}", flush=True)
    except Exception as e:
        hit.append(names[c.index])
        print(f"{names[c.index]:55s} CAUGHT {type(e).__name__}: {str(e)[:160]}", flush=True)
print(f"{len(hit)} caught: {hit}")
