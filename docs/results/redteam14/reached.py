"""The SM100 variants (sm100_variants.fwd_key / bwd_key) the audit's calls reach, from census0.pkl
(census.py). Writes reached0.pkl {key: [call ids]} and reached0.txt."""
import os, pickle, sys
from collections import defaultdict
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sm100_variants import fwd_key, bwd_key, tag, MAIN_FWD, MAIN_BWD
here = os.path.dirname(os.path.abspath(__file__))
seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
d = pickle.load(open(f"{here}/census{seed}.pkl", "rb"))
det = {}
for n, c, o, dd, dl, e in d["todo"]:
    uid = (f"{c}::{n}" if not n.startswith(c) else n) + ("" if e == "default" else "::emu_" + e)
    det[uid] = dd
reached = defaultdict(list)
for uid, chk, ps, cls, a, args, kw in d["rec"]:
    p = d["problems"][uid]
    if ps.startswith("fwd") and cls in MAIN_FWD:
        k = fwd_key(cls, a)
    elif ps.startswith("bwd") and cls in MAIN_BWD:
        k = bwd_key(cls, a, gqa=p.nheads > p.nheads_kv, deterministic=det[uid])
    else:
        continue
    if uid not in reached[k]:
        reached[k].append(uid)
pickle.dump(dict(reached), open(f"{here}/reached{seed}.pkl", "wb"))
with open(f"{here}/reached{seed}.txt", "w") as f:
    for side in ("fwd", "bwd"):
        ks = sorted((k for k in reached if k[0] == side), key=tag)
        f.write(f"== {side}: {len(ks)} variants reached\n")
        for k in ks:
            ids = reached[k]
            f.write(f"{len(ids):4d}  {tag(k)}   e.g. {', '.join(ids[:3])}\n")
print(open(f"{here}/reached{seed}.txt").read())
