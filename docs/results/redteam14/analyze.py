"""Reached vs FA4-enumerated SM100 variants. Reads reached0.pkl (the audit) and enum_*.pkl
(enumerate.py); writes variants0.txt: per form the variants enumerated / reached / unreached, the
smallest call per unreached variant, and the greedy count of variant calls seed 0 would add
(rows in variants.py's order, one call per row that brings a variant not yet reached)."""
import os, sys, pickle, glob
from collections import defaultdict, Counter
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from sm100_variants import tag
reached = pickle.load(open(f"{here}/reached0.pkl", "rb"))
COARSE = "--coarse" in sys.argv
def co(k):
    """The coarse key: the forward's scheduler class dropped (covered pairwise, not per variant)."""
    return k[:-1] if (COARSE and k[0] == "fwd" and k[1] == "sm100") else k
def tg(k):
    return tag(k + ("-",)) if (COARSE and k[0] == "fwd" and k[1] == "sm100") else tag(k)
_r = {}
for k, v in reached.items():
    _r.setdefault(co(k), []).extend(v)
reached = _r
rows = []
for fn in sorted(glob.glob(f"{here}/enum_*.pkl"), key=lambda s: "dense" not in s):
    rows += pickle.load(open(fn, "rb"))
def size(p):
    return p.batch * p.seqlen_q * p.seqlen_k * p.nheads * (p.head_dim + p.head_dim_v)
def call(r, p, bwd, det):
    return (f"{r['form']} hd={r['hd']} mask={r['mask']} gqa={r['gqa']} seqlen={r['seqlen']}"
            + (f" bwd det={'on' if det else 'off'}" if bwd else " fwd") + f" :: {p.describe()}")
enum = defaultdict(list)          # key -> [(size, call)]
errs = Counter()
byform = defaultdict(set)
for r, p, bwd, det, f, b, e in rows:
    if e:
        errs[e.split(":")[0] + ": " + e.split(":")[1][:90] if ":" in e else e] += 1
        continue
    for k in (f, b):
        k = co(k) if k is not None else None
        if k is not None:
            enum[k].append((size(p), call(r, p, bwd and k[0] == 'bwd', det)))
            byform[r["form"]].add(k)
out = []
W = out.append
allk = set(enum)
for side in ("fwd", "bwd"):
    E = {k for k in allk if k[0] == side}
    R = {k for k in reached if k[0] == side}
    W(f"== {side}: FA4 picks {len(E)} variants over the enumerated space; the audit reaches {len(R)} "
      f"variants in all, {len(E & R)} of the enumerated; {len(E - R)} enumerated variants unreached; "
      f"{len(R - E)} reached only by calls outside the enumeration")
for form, ks in byform.items():
    W(f"   form {form}: {len(ks)} variants, {len(ks - set(reached))} unreached")
# greedy: as variant_edges would add them
have = set(reached)
added = defaultdict(int)
for r, p, bwd, det, f, b, e in rows:
    if e:
        continue
    want = [co(k) for k in (f, b) if k is not None and co(k) not in have]
    if want:
        have.update(want)
        added[r["form"]] += 1
W(f"== greedy variant calls at seed 0 (rows in enumeration order): {sum(added.values())} "
  + ", ".join(f"{k} {v}" for k, v in added.items()))
W(f"== enumeration rows {len(rows)}, FA4 refused / errors {sum(errs.values())}:")
for k, v in errs.most_common(12):
    W(f"   {v:4d}  {k}")
for side in ("fwd", "bwd"):
    U = sorted((k for k in allk - set(reached) if k[0] == side), key=tg)
    W(f"== unreached {side} ({len(U)}): variant | enumerated calls reaching it | smallest call")
    for k in U:
        c = sorted(enum[k])
        W(f"  {tg(k)} | {len(c)} | {c[0][1]}")
open(f"{here}/variants0{'_coarse' if COARSE else ''}.txt", "w").write("\n".join(out) + "\n")
print("\n".join(out[:12]))
