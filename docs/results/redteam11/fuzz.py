import os, pickle, sys
os.environ["FA4VERIFY_FAKE_DEVICE"] = "h200"
from fa4verify.audit.registry import CheckContext
from fa4verify.checks import fuzz as F
seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
ctx = CheckContext(dtype="bf16", arch="sm90", device="cuda", profile="default", seed=seed, check_id="fuzz.production", archs=("sm90",))
cases = F._production_cases(ctx)
out = [("fz%d"%c.index, None, c.problem, c.backward) for c in cases]
pickle.dump(out, open(f"docs/results/redteam11/fuzz{seed}.pkl","wb"))
print(len(out))
