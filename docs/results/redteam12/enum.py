"""Enumerate coverage.production + fuzz.production cases of the default audit at seed 0 on a fake
H200 and classify which known issues can apply to each (configuration level)."""
import os, pickle, sys, collections
os.environ["FA4VERIFY_FAKE_DEVICE"] = "h200"
from fa4verify.audit.registry import CheckContext, registered
import importlib, pkgutil, fa4verify.checks as C
for m in pkgutil.iter_modules(C.__path__):
    importlib.import_module("fa4verify.checks." + m.name)
out = []
for cid in ("coverage.production", "fuzz.production"):
    spec = registered()[cid]
    ctx = CheckContext(dtype="bf16", arch="sm90", device="cuda", profile="default", seed=0,
                       check_id=cid, archs=("sm90",))
    cases = spec.cases(ctx)
    for i, c in enumerate(cases):
        bwd = bool(getattr(c, "backward", True))
        out.append((cid, getattr(c, "name", None) or f"{cid}#{i}", bwd, c.problem))
    print(cid, len(cases))
pickle.dump(out, open("docs/results/redteam12/cases0.pkl", "wb"))
