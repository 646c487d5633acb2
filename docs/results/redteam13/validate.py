"""Evaluates each guarded fault's guard over every recorded kernel object (census0.pkl): the number
of audit kernel objects on which the fault would be live (must be 0), and the dtype census."""
import pickle
from collections import Counter
d = pickle.load(open("census0.pkl", "rb"))
G = {
 "sm90_bwd_hd64_causal_mha_nondet_dk_scale": ("FlashAttentionBackwardSm90", lambda s: s["tile_hdim"] <= 64 and s["is_causal"] and s["qhead_per_kvhead"] == 1 and not s["deterministic"]),
 "sm90_bwd_hd256_mha_nondet_dk_scale": ("FlashAttentionBackwardSm90", lambda s: s["tile_hdim"] == 256 and s["qhead_per_kvhead"] == 1 and not s["deterministic"]),
 "sm90_bwd_hd96_causal_mha_dk_scale": ("FlashAttentionBackwardSm90", lambda s: s["num_wg_dQ"] == 1 and s["is_causal"] and s["qhead_per_kvhead"] == 1),
 "sm90_bwd_mha_hd64_hdv128_dk_scale": ("FlashAttentionBackwardSm90", lambda s: s["tile_hdim"] <= 64 and s["tile_hdimv"] > 64),
 "sm90_fwd_hd192_hdv128_packgqa_scale": ("FlashAttentionForwardSm90", lambda s: s["pack_gqa"] and s["tile_hdim"] == 192 and s["tile_hdimv"] == 128 and s["tile_n"] == 128),
 "sm90_fwd_tile_m64_causal_scale": ("FlashAttentionForwardSm90", lambda s: s["tile_m"] == 64 and (s["is_causal"] or s["is_local"])),
}
for k, (cls, g) in G.items():
    objs = [r for r in d["rec"] if r[3] == cls]
    print(f"{k}: live on {sum(1 for r in objs if g(r[4]))} of {len(objs)} {cls} objects")
print("dtype of every kernel object:", Counter(r[4].get("dtype") for r in d["rec"] if "dtype" in r[4]))
