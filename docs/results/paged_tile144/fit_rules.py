import json, sys
import numpy as np
sys.path.insert(0, "/work/main")
from fa4verify.problem import AttentionProblem
from fa4verify.call_layout import call_arrays
import model
from repro_triage import parse

def out_rule(p, c, sink, rule, **kw):
    q = np.asarray(c["q"], np.float64); cu = c["cu_seqlens_q"]
    outs = []
    for b in range(p.batch):
        qb = q[cu[b]:cu[b + 1]][None] if cu is not None else q[b][None]
        sk = int(c["seqused_k"][b]); N = -(-sk // 144)
        o, _ = model.paged_tile144_forward(qb, c["k"], c["v"], p.call.page_size, c["page_table"][b:b+1], [sk],
                                           p.scale, p.head_dim, learnable_sink=sink,
                                           oob_wins=(lambda kind, n, j, zero, _N=N: rule(kind, n, j, zero, _N)), **kw)
        outs.append(o[0])
    return np.concatenate(outs)

RULES = {
  "never": lambda k, n, j, z, N: False,
  "always": lambda k, n, j, z, N: True,
  "last block (first load)": lambda k, n, j, z, N: n == N - 1,
  "stage0": lambda k, n, j, z, N: (N - 1 - n) % 2 == 0,
}
SCHED = {"eager": dict(schedule="eager"), "sQeager+noSP+nocross": dict(schedule="none", sq=lambda m, n: m >= n),
         "lazy": dict(schedule="lazy"), "sQeager+SP": dict(schedule="none", sq=lambda m, n: m >= n, sp=lambda n: True)}
if __name__ == "__main__":
    tot = {}
    for fn in sys.argv[1:]:
        d = json.load(open(fn))
        for var in d["variants"]:
            pd = var.get("problem")
            if not pd or not pd.get("call") or not pd["call"].get("page_size") or var["outcome"] != "FAIL":
                continue
            frac, worst = parse(var["detail"])
            p = AttentionProblem.from_dict(pd); a = p.materialize(); c = call_arrays(p, a)
            line = []
            for rn, r in RULES.items():
                for sn, skw in SCHED.items():
                    o = out_rule(p, c, a.get("learnable_sink"), r, **skw)
                    e = max(abs(o[t, h, dd] - g) for t, h, dd, g, _ in worst)
                    tot.setdefault((rn, sn), []).append(e)
                    line.append(f"{e:.3f}")
            print(f"{var['variant'][:24]:24s} hd={p.head_dim} P={p.call.page_size:3d} toks={[w[0] for w in worst]} ", " ".join(line))
    print("columns:", [(rn, sn) for rn in RULES for sn in SCHED])
    for k, v in tot.items():
        print(f"{k[0]:24s} {k[1]:22s} median={np.median(v):.3f} max={np.max(v):.3f}")
