import json, sys
import numpy as np
sys.path.insert(0, "/work/main")
from fa4verify.problem import AttentionProblem
from fa4verify.call_layout import call_arrays
from repro_triage import parse
from fit_rules import out_rule, RULES
last = RULES["last block (first load)"]; never = RULES["never"]; always = RULES["always"]
for fn in sys.argv[1:]:
    d = json.load(open(fn))
    for var in d["variants"]:
        pd = var.get("problem")
        if not pd or not pd.get("call") or not pd["call"].get("page_size") or var["outcome"] not in ("FAIL", "pass"):
            continue
        frac, worst = parse(var["detail"])
        p = AttentionProblem.from_dict(pd); a = p.materialize(); c = call_arrays(p, a)
        sink = a.get("learnable_sink")
        ref = out_rule(p, c, sink, never, schedule="none")
        res = []
        for name, r in (("last", last), ("always", always), ("never", never)):
            o = out_rule(p, c, sink, r, schedule="eager")
            res.append(f"{name}={100*np.mean(np.abs(o-ref) > 0.004):5.1f}%")
        print(f"{fn.split('/')[-1][:12]} {var['variant'][:30]:30s} hd={p.head_dim} P={p.call.page_size:3d} measured={var['outcome']} {frac}%  model: {' '.join(res)}")
