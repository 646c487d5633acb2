"""Distinct values of every recorded kernel attribute / compile argument, per kernel class."""
import pickle, sys
from collections import defaultdict, Counter
d = pickle.load(open("census0.pkl", "rb"))
by = defaultdict(lambda: defaultdict(Counter))
for cid, chk, ps, cls, attrs, args, kw in d["rec"]:
    for k, v in attrs.items():
        by[cls][k][repr(v)[:60]] += 1
    for i, v in enumerate(args):
        by[cls][f"arg{i}"][repr(v)[:40]] += 1
    for k, v in kw.items():
        by[cls][f"kw_{k}"][repr(v)[:40]] += 1
for cls, m in by.items():
    n = sum(1 for r in d["rec"] if r[3] == cls)
    print(f"=== {cls} ({n} compiles)")
    for k, c in m.items():
        print(f"  {k}: " + ", ".join(f"{v}x{n}" for v, n in sorted(c.items())))
