"""Which audit calls reach FA4's default softmax_scale with head_dim != head_dim_v (fwd and bwd), per pass."""
import pickle, collections
tr = pickle.load(open("trace0.pkl", "rb"))
c = collections.Counter(); ex = collections.defaultdict(set)
for tag, f, ln, name, a in tr["args"]:
    if name not in ("_flash_attn_fwd", "_flash_attn_bwd"):
        continue
    q, v = a.get("q"), a.get("v")
    if not (isinstance(q, tuple) and isinstance(v, tuple)):
        continue
    hd, hdv = q[1][-1], v[1][-1]
    uid, ps = tag.split("|")
    key = (name, "scale None" if a.get("softmax_scale") is None else "scale given", "hd==hdv" if hd == hdv else f"hd!=hdv")
    c[key + (ps,)] += 1
    if hd != hdv:
        ex[key].add((uid, hd, hdv))
for k in sorted(c):
    print(k, c[k])
for k, s in ex.items():
    print(k, sorted(s)[:8])
