"""coverage.production's calls at seed 0, sm90 bf16, fake H200: rows then edges (with names).
Pickled as plan0.pkl: list of dict(idx, name, problem, backward, det)."""
import os, pickle, sys, time
os.environ["FA4VERIFY_FAKE_DEVICE"] = "h200"
from fa4verify.audit.registry import CheckContext, registered
import importlib, pkgutil, fa4verify.checks as C
for m in pkgutil.iter_modules(C.__path__):
    importlib.import_module("fa4verify.checks." + m.name)
t = time.time()
spec = registered()["coverage.production"]
ctx = CheckContext(dtype="bf16", arch="sm90", device="cuda", profile="default", seed=0,
                   check_id="coverage.production", archs=("sm90",))
cases = spec.cases(ctx)
ex = cases[0].head["extra"]["plan"]
nrows = len(ex["rows"]); edges = ex["edges"]
out = []
for c in cases:
    nm = f"row{c.index}" if c.index < nrows else f"edge:{edges[c.index - nrows]}"
    out.append(dict(idx=c.index, name=nm, problem=c.problem, backward=c.backward, det=c.deterministic,
                    row=ex["rows"][c.index] if c.index < nrows else None))
pickle.dump(out, open("plan0.pkl", "wb"))
print(len(cases), "cases;", nrows, "rows;", len(edges), "edges; bwd", sum(o["backward"] for o in out), f"{time.time()-t:.0f}s")
