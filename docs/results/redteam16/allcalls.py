"""Every FA4 call of the default audit at seed 0 on a fake H200 (sm_90, bf16):
coverage.production and fuzz.production from their full case lists (every drawn case, not one per
compile key), the other GPU checks from their compiles(ctx) lists; sequences.production has no list
(drawn as it runs) and is modelled by its space in feats.py. Pickled as rows
(check, name, op, deterministic, problem, dlse)."""
import os, pickle, sys
os.environ["FA4VERIFY_FAKE_DEVICE"] = "h200"
from fa4verify.audit.registry import CheckContext, registered
import importlib, pkgutil, fa4verify.checks as C
for m in pkgutil.iter_modules(C.__path__):
    importlib.import_module("fa4verify.checks." + m.name)
seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
out = []
for cid, spec in registered().items():
    if spec.compiles is None or "default" not in spec.profiles:
        continue
    ctx = CheckContext(dtype="bf16", arch="sm90", device="cuda", profile="default", seed=seed,
                       check_id=cid, archs=("sm90",))
    try:
        if cid in ("coverage.production", "fuzz.production"):
            cases = spec.cases(ctx)
            for c in cases:
                bwd = bool(getattr(c, "backward", True))
                out.append((cid, getattr(c, "name", None) or f"{cid}#{c.index}", "backward" if bwd else "forward",
                            getattr(c, "deterministic", True), c.problem, bwd))
            print(cid, len(cases), "cases")
            continue
        calls = spec.compiles(ctx)
    except BaseException as e:
        print(cid, "->", type(e).__name__, str(e)[:150]); continue
    print(cid, len(calls))
    for i, c in enumerate(calls):
        out.append((cid, f"{cid}#{i}", c.op, c.deterministic, c.problem, c.dlse, getattr(c, "splits", 0), tuple(getattr(c, "index", ()))))
pickle.dump(out, open(f"./allcalls{seed}.pkl", "wb"))
print("total", len(out))
