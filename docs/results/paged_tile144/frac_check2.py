import json, sys
import numpy as np
sys.path.insert(0, "/work/main")
from fa4verify.problem import AttentionProblem
from fa4verify.call_layout import call_arrays
from repro_triage import parse
from fit_rules import out_rule, RULES
single = lambda k, n, j, z, N: N == 1
never = RULES["never"]
tot = []
for fn in sys.argv[1:]:
    d = json.load(open(fn))
    for var in d["variants"]:
        pd = var.get("problem")
        if not pd or not pd.get("call") or not pd["call"].get("page_size") or var["outcome"] not in ("FAIL", "pass"):
            continue
        if pd.get("causal") or pd.get("window_size", [None, None]) != [None, None]:
            continue
        frac, worst = parse(var["detail"])
        p = AttentionProblem.from_dict(pd); a = p.materialize(); c = call_arrays(p, a)
        sink = a.get("learnable_sink")
        ref = out_rule(p, c, sink, never, schedule="none")
        o = out_rule(p, c, sink, single, schedule="eager")
        fr = 100 * np.mean(np.abs(o - ref) > 0.004)
        e = max((abs(o[t, h, dd] - g) for t, h, dd, g, _ in worst), default=0)
        e0 = max((abs(ref[t, h, dd] - g) for t, h, dd, g, _ in worst), default=0)
        print(f"{fn.split('/')[-1][:12]} {var['variant'][:30]:30s} hd={p.head_dim} P={p.call.page_size:3d} measured={var['outcome']} {frac}%  model(single-block rule)={fr:5.1f}%  worst-3 max|model-got|={e:.3f} (oracle {e0:.3f})")
