import os, pickle
os.environ["FA4VERIFY_FAKE_DEVICE"] = "h200"
from fa4verify.problem import resolve_window
rows = pickle.load(open("docs/results/redteam12/cases0.pkl", "rb"))
for cid, name, bwd, p in rows:
    if not bwd or not (96 < p.head_dim <= 128): continue
    c, l, _, _ = resolve_window(p.causal, p.window_size)
    mm = p.call is not None and p.call.mask_mod_fn is not None
    if l and not c:
        print(f"{name:26s} hd={p.head_dim}/{p.head_dim_v} h={p.nheads}/{p.nheads_kv} window={p.window_size} mm={mm} block={p.call.block_size if p.call else None} -> tile_m 80 under sm90_bwd_window_tile80")
