"""Per known issue: calls whose judged quantities its configuration predicate accepts, and how its model judges them."""
import pickle, collections
R = [r for f in sorted(__import__("glob").glob("absorb_*.pkl")) for r in pickle.load(open(f, "rb"))]
S = collections.defaultdict(lambda: collections.defaultdict(set))
for r in R:
    for e in r["ent"]:
        k = e["kind"] if e["kind"] != "array" else ("array+NaN" if e["unjudged"] else "array")
        S[e["issue"]][k].add(r["name"].replace("edge:", "e:"))
        S[e["issue"]]["any"].add(r["name"].replace("edge:", "e:"))
for i, d in S.items():
    print(f"{i}: {len(d['any'])} calls; " + "; ".join(f"{k}: {len(v)} ({' '.join(sorted(v, key=lambda s: (s[0], int(''.join(c for c in s if c.isdigit()) or 0)))[:14])}{' ...' if len(v) > 14 else ''})" for k, v in d.items() if k != "any"))
