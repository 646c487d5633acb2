"""Distinct argument values seen per watched FA4 function (from trace0.pkl's args log), with call counts."""
import pickle, collections, sys
tr = pickle.load(open("trace0.pkl", "rb"))
by = collections.defaultdict(lambda: collections.defaultdict(set))
for tag, f, ln, name, args in tr["args"]:
    uid = tag.split("|")[0]
    for k, v in args.items():
        if isinstance(v, tuple) and v and v[0] == "T":
            v = ("T", v[2], len(v[1]))    # tensor: dtype and rank only
        by[(f, ln, name)][k].add((repr(v)[:80], uid))
want = sys.argv[1:] or None
for key in sorted(by):
    if want and key[2] not in want:
        continue
    print(f"== {key[0]}:{key[1]} {key[2]}")
    for k, s in by[key].items():
        c = collections.Counter()
        for v, uid in s:
            c[v] += 1
        print(f"   {k}: " + "; ".join(f"{v} x{n}" for v, n in c.most_common(12)) + (" ..." if len(c) > 12 else ""))
