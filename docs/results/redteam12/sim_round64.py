"""What sm90_bwd_accum_round64_widened does to the matchers: the predictor reads the (mutated)
source; simulate by patching the parsed roundings, then list the audit's backward calls newly in
dq_accum / gqa_dkdv."""
import os, pickle, collections
os.environ["FA4VERIFY_FAKE_DEVICE"] = "h200"
from fa4verify.kernels import fa4_params as F
rows = pickle.load(open("docs/results/redteam12/cases0.pkl", "rb"))
def tags(p):
    local = any(w is not None for w in p.window_size); call = p.call
    lens = p.seqlens_q if p.varlen else (p.seqlen_q,)
    packed = p.varlen and not (call is not None and (call.q_batched or call.seqused_q))
    t = []
    if F.sm90_dq_defect_predicted(p.head_dim, p.head_dim_v, lens, causal=p.causal, local=local, varlen=packed): t.append("dq_accum")
    if p.nheads_kv < p.nheads and F.sm90_dq_accum_mismatch(p.head_dim, p.head_dim_v, causal=p.causal, local=local).get("mismatch"): t.append("gqa_dkdv")
    return t
before = {}
for cid, name, bwd, p in rows:
    if bwd and p.arch == "sm90": before[name] = tags(p)
orig = F.sm90_dq_accum_roundings()
print("parsed from source:", orig)
F.sm90_dq_accum_roundings.cache_clear()
F.sm90_dq_accum_mismatch.__globals__["sm90_dq_accum_roundings"] = lambda: {**orig, "accum": (64, 64)}
hd = collections.Counter()
for cid, name, bwd, p in rows:
    if not (bwd and p.arch == "sm90"): continue
    t = tags(p)
    if t != before[name]:
        print(f"{name:28s} hd={p.head_dim}/{p.head_dim_v} h={p.nheads}/{p.nheads_kv} {before[name]} -> {t}")
        hd[p.head_dim] += 1
print("newly absorbed calls by head dim:", dict(hd))
print("mismatch per hd (non-causal):", [h for h in range(8, 257, 8) if F.sm90_dq_accum_mismatch(h, h)["mismatch"]])
