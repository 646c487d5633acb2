import json, sys, itertools
import numpy as np
sys.path.insert(0, "/work/main")
from fa4verify.problem import AttentionProblem
from fa4verify.call_layout import call_arrays
import model
from repro_triage import parse

def model_out(p, c, sink, **kw):
    q = np.asarray(c["q"], np.float64); cu = c["cu_seqlens_q"]
    outs = []
    for b in range(p.batch):
        qb = q[cu[b]:cu[b + 1]][None] if cu is not None else q[b][None]
        o, _ = model.paged_tile144_forward(qb, c["k"], c["v"], p.call.page_size, c["page_table"][b:b+1],
                                           [int(c["seqused_k"][b])], p.scale, p.head_dim, learnable_sink=sink, **kw)
        outs.append(o[0])
    return np.concatenate(outs)

SCEN = {}
for s, w in itertools.product(("lazy", "eager", "none"), (True, False, "zeros", "data")):
    SCEN[f"{s}/{w}"] = dict(schedule=s, oob_wins=w)
# sQ eager but no cross-stage / no sP (a mixed schedule)
for w in (True, False, "zeros", "data"):
    SCEN[f"sQeager_only/{w}"] = dict(schedule="none", oob_wins=w, sq=lambda m, n: m >= n)

if __name__ == "__main__":
    rows = []
    for fn in sys.argv[1:]:
        d = json.load(open(fn))
        for var in d["variants"]:
            pd = var.get("problem")
            if not pd or not pd.get("call") or not pd["call"].get("page_size") or var["outcome"] != "FAIL":
                continue
            frac, worst = parse(var["detail"])
            if not worst:
                continue
            p = AttentionProblem.from_dict(pd); a = p.materialize(); c = call_arrays(p, a)
            sink = a.get("learnable_sink")
            res = {}
            for name, kw in SCEN.items():
                o = model_out(p, c, sink, **kw)
                res[name] = max(abs(o[t, h, dd] - g) for t, h, dd, g, _ in worst)
            best = sorted(res.items(), key=lambda x: x[1])[:4]
            print(f"{fn.split('/')[-1][:14]} {var['variant'][:30]:30s} hd={p.head_dim} P={p.call.page_size:3d} sk={p.seqlens_k} toks={[w[0] for w in worst]}")
            print("     best:", ", ".join(f"{k}={v:.3f}" for k, v in best), "| eager/False=%.3f lazy/True=%.3f eager/True=%.3f" % (res["eager/False"], res["lazy/True"], res["eager/True"]))
