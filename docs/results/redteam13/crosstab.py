"""Cross-tabulation of the main axes (head-dim class x mask mode x GQA/pack x deterministic) over
the census; prints the combinations no audit call reaches."""
import pickle, itertools
d = pickle.load(open("branches0.pkl", "rb")); F = d["feats"]
def hdc(h): return 64 if h <= 64 else 96 if h <= 96 else 128 if h <= 128 else 192 if h <= 192 else 256
def mode(f): return "causal" if f["is_causal"] else "local" if f["is_local"] else "none"
fw = {}
for cid, ps, f in F["fwd"]:
    k = (hdc(f["head_dim"] if "head_dim" in f else f["hd"]), mode(f), f["pack"], f["tn"])
    fw.setdefault(k, []).append(cid)
bw = {}
for cid, ps, f in F["bwd"]:
    k = (hdc(f["hd"]), mode(f), f["g"] > 1, f["det"])
    bw.setdefault(k, []).append(cid)
print("forward (hd class, mode, pack_gqa, tile_n) unreached:")
from flash_attn.cute.interface import _tile_size_fwd_sm90, _tile_size_bwd_sm90
for h, m, p in itertools.product([64, 96, 128, 192, 256], ["none", "causal", "local"], [False, True]):
    for hv in ([h] if h != 192 else [128, 192]):
        tn = _tile_size_fwd_sm90(h, hv, m == "causal", m == "local").n_block_size
        if (h, m, p, tn) not in fw:
            print("  ", h, hv, m, "pack" if p else "nopack", "tile_n", tn)
print("backward (hd class, mode, GQA, deterministic) unreached:")
for k in itertools.product([64, 96, 128, 192, 256], ["none", "causal", "local"], [False, True], [False, True]):
    if k not in bw: print("  ", k)
