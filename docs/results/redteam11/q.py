import pickle, sys
from collections import Counter
F = pickle.load(open("docs/results/redteam11/feats0.pkl", "rb"))
def sel(**kw):
    out = []
    for x in F:
        ok = True
        for k, v in kw.items():
            if callable(v):
                if not v(x): ok = False; break
            elif x.get(k) != v: ok = False; break
        if ok: out.append(x)
    return out
def show(xs, keys):
    for x in xs:
        print(x["name"], x["pass_"], {k: x.get(k) for k in keys})
