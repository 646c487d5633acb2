import os, pickle, sys
os.environ["FA4VERIFY_FAKE_DEVICE"] = "h200"
from fa4verify.audit.registry import CheckContext
from fa4verify.checks.coverage import build, row_backward
from fa4verify.coverage.cases import edge_problems
from fa4verify.targets import production_features
seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
ctx = CheckContext(dtype="bf16", arch="sm90", device="cuda", profile="default", seed=seed, check_id="coverage.production", archs=("sm90",))
sp, pl, problems = build(ctx, arch="sm90", dtype="bf16", features=production_features())
edges = edge_problems(sp, seed=seed)
bwd = row_backward(sp, pl.rows)
out = []
for i,(r,p) in enumerate(zip(pl.rows, problems)):
    out.append(("row%d"%i, r, p, bwd[i]))
for n,p,b in edges:
    out.append((n, None, p, b))
pickle.dump(out, open(f"docs/results/redteam11/plan{seed}.pkl","wb"))
print(len(pl.rows), len(edges))
