import json, sys
import numpy as np
sys.path.insert(0, "/work/main")
from fa4verify.problem import AttentionProblem
from fa4verify.call_layout import call_arrays
import model
from repro_triage import parse
from fit_rules import out_rule, RULES
fn = sys.argv[1]
d = json.load(open(fn))
last = RULES["last block (first load)"]
for var in d["variants"]:
    pd = var.get("problem")
    if not pd or not pd.get("call") or not pd["call"].get("page_size") or var["outcome"] != "FAIL":
        continue
    frac, worst = parse(var["detail"])
    p = AttentionProblem.from_dict(pd); a = p.materialize(); c = call_arrays(p, a)
    sink = a.get("learnable_sink")
    o1 = out_rule(p, c, sink, last, schedule="eager")
    # extra hypothesis: single-block seqs also get sQ rows<J cols<W zeroed (as if V(0) were stage 1)
    o2 = out_rule(p, c, sink, last, schedule="eager", sq=lambda m, n: True)
    # stage parity flipped for V only etc: emulate by zeroing Q rows explicitly
    q0 = np.array(c["q"], copy=True)
    cu = c["cu_seqlens_q"]
    print(var["variant"][:30], [(t, h, dd, g) for t, h, dd, g, _ in worst])
    print("   eager+last   ", [round(o1[t, h, dd], 4) for t, h, dd, g, _ in worst])
    print("   +sq always   ", [round(o2[t, h, dd], 4) for t, h, dd, g, _ in worst])
