"""Compile-only proof (CPU, fake B200, sm_100a): the variant edges of coverage.production (seed 0,
default sm100 bf16 space) that reach red-team round 14's top-ranked unreached SM100 variants are
compiled by FA4 for sm_100a through fa4verify.compile.production (nothing runs; no B200).

    python docs/results/sm100_variants/compile_only.py A|B     # A: items 1, 3, 4, 5; B: item 2
"""
import sys
import tempfile
import time
from pathlib import Path

from fa4verify.compile.production import CompileCase, enter_fake_device, run_cases

enter_fake_device("b200")
from fa4verify.coverage import cases, planner, space  # noqa: E402
from fa4verify.coverage.variants import bwd_variant, fwd_variant, variant_edges  # noqa: E402
from fa4verify.checks.coverage import row_backward  # noqa: E402
from fa4verify.problem import AttentionProblem  # noqa: E402


def _p(**kw):
    return AttentionProblem(**{**dict(arch="sm100", dtype="bf16", batch=2, nheads=2, nheads_kv=2), **kw})


hd192 = dict(seqlen_q=137, seqlen_k=59, head_dim=192, head_dim_v=128, causal=True)
hd256 = _p(seqlen_q=17, seqlen_k=259, head_dim=256, head_dim_v=256, causal=True)
ROUND14 = {   # round 14's rank: (what, its variant key)
    "A": [("1 bwd hd64 causal MHA nondet",
           bwd_variant(_p(seqlen_q=17, seqlen_k=259, head_dim=64, head_dim_v=64, causal=True), False)),
          ("3 fwd hd128 causal PackGQA cp.async Q (g=7)",
           fwd_variant(_p(seqlen_q=67, seqlen_k=67, head_dim=128, head_dim_v=128, causal=True, nheads=7, nheads_kv=1))),
          ("4 fwd hd128 causal q1 S ping-pong",
           fwd_variant(_p(seqlen_q=17, seqlen_k=259, head_dim=128, head_dim_v=128, causal=True))),
          ("5 bwd hd256 causal MHA nondet", bwd_variant(hd256, False)),
          ("5 bwd hd256 causal MHA det", bwd_variant(hd256, True))],
    "B": [(f"2 bwd hd192x128 causal {g} {d}", bwd_variant(_p(**hd192, nheads_kv=nk), d == "det"))
          for g, nk in (("MHA", 2), ("GQA", 1)) for d in ("nondet", "det")],
}

sp = space.space_for("sm100", "bf16")
pl = planner.plan(sp, seed=0)
rows, probs = cases.plan_problems(sp, pl.rows, seed=0)
bw = row_backward(sp, rows)
ran = [(p, bw[i], r["det"] == "on") for i, (p, r) in enumerate(zip(probs, rows))]
ran += [(p, b, n not in cases.NONDETERMINISTIC_EDGES) for n, p, b in cases.edge_problems(sp, seed=0)]
edges = variant_edges(sp, ran, seed=0)
# the plan's rows and constructed edges reaching a variant (where no variant edge was needed)
others = [(f"{'row' if i < len(rows) else 'edge'} #{i}", p, b, d) for i, (p, b, d) in enumerate(ran)]
chosen = []
for what, key in ROUND14[sys.argv[1]]:
    n, p, b, d = next(e for e in edges + others if key in (fwd_variant(e[1]), e[2] and bwd_variant(e[1], e[3])))
    op = "backward" if key[0] == "bwd" else "forward"
    chosen.append((what, n, op, d, CompileCase(op, problem_json=p.to_json(), deterministic=d)))
    print(f"{what}: {n} ({p.describe()}), {op}{' deterministic' if d and op == 'backward' else ''}", flush=True)
t0 = time.time()
work = tempfile.mkdtemp(prefix="sm100-variants-")
r = run_cases("sm_100a", [c for *_x, c in chosen], workdir=work, timeout=1500)
for (what, n, op, _d, _c), res in zip(chosen, r["results"]):
    print(f"compile-only sm_100a {op:8s} ok={res.get('ok')} refused={res.get('refused')!r} "
          f"kernels_read={res.get('kernels_read')} {res.get('seconds')} s  {n}  [{what}]"
          + (f"  error: {str(res.get('error'))[:300]}" if not res.get("ok") else ""))
ptx = list(Path(work).rglob("*.ptx"))
print(f"{len(ptx)} PTX files dumped for sm_100a ({sum('.target sm_100a' in f.read_text() for f in ptx)} with "
      f"'.target sm_100a'), e.g. {sorted(f.name for f in ptx)[:3]}")
print(f"wall {r['wall_seconds']:.0f} s (CPU, fake B200; {time.time() - t0:.0f} s with the subprocess start)")
