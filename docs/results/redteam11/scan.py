"""Reach of the eleventh round's faults over every FA4 call the default audit makes at seed 0 on an
H200 (sm_90, bf16): allcalls0.pkl (coverage.production 213 cases, fuzz.production 50, the other
GPU checks' compile lists) and seq0.pkl (sequences.production: the 12 calls its three drawn
sequences make at seed 0 and the 19 of the constructed sequence). Prints, per fault, the calls that
have the property the fault needs (all 0), with the nearest properties the audit does have."""
import math, os, pickle, sys
os.environ["FA4VERIFY_FAKE_DEVICE"] = "h200"
import numpy as np
sys.path.insert(0, os.path.dirname(__file__))
from feats import fwd_feats, bwd_feats

D = "docs/results/redteam11"
calls = pickle.load(open(f"{D}/allcalls0.pkl", "rb"))
seqs = pickle.load(open(f"{D}/seq0.pkl", "rb"))
F = []
for cid, name, op, det, p, extra in calls:
    if op == "combine":
        continue
    f = fwd_feats(p); f.update(check=cid, name=name, layout="contiguous"); F.append(f)
    if p.call is not None and p.call.inference:
        fi = fwd_feats(p, inference=True); fi.update(check=cid, name=name + "/inference", layout="contiguous"); F.append(fi)
    if op == "backward":
        b = bwd_feats(p, det); b.update(check=cid, name=name, layout="contiguous"); F.append(b)
for name, layout, det, p in seqs:
    f = fwd_feats(p); f.update(check="sequences.production", name=name, layout=layout); F.append(f)
    b = bwd_feats(p, det); b.update(check="sequences.production", name=name, layout=layout); F.append(b)
fw = [x for x in F if x["pass_"] == "fwd"]
bw = [x for x in F if x["pass_"] == "bwd"]
print(f"{len(fw)} forward and {len(bw)} backward FA4 calls (sequences included)")

def show(title, xs, n=8):
    print(f"  {title}: {len(xs)}" + ("  e.g. " + ", ".join(x['name'] for x in xs[:n]) if xs else ""))

print("\n[1] paged_cpasync_page_address_from_row_index: paged, page_size != tile_n (cp.async), pool not compact")
pc = [x for x in fw if x["paged"] and not x["paged_tma"]]
show("paged cp.async calls", pc)
# every paged pool is built by call_layout.call_arrays -> oracles.paged_kv.paginate (np.full, C-contiguous,
# K and V separate) and reaches torch through ProductionTarget._t (np.ascontiguousarray): check the arrays
from fa4verify import call_layout
noncompact = []
seen = set()
for cid, name, op, det, p, extra in calls:
    if p.call is None or not p.call.paged or id(p) in seen:
        continue
    seen.add(id(p))
    c = call_layout.call_arrays(p, p.materialize())
    for t in ("k", "v"):
        a = c[t]
        if not a.flags["C_CONTIGUOUS"]:
            noncompact.append(name)
print(f"  paged problems checked: {len(seen)}; pools not C-contiguous: {len(noncompact)} "
      f"(and ProductionTarget._t copies through np.ascontiguousarray anyway)")
show("sequences calls with paged KV", [x for x in fw if x["check"] == "sequences.production" and x["paged"]])

print("\n[2] packgqa_o_store_hdim_pred_from_q: cp.async PackGQA O store with head_dim_v padded, head_dim not")
show("forward calls with cp.async PackGQA (tile_m % g != 0)", [x for x in fw if not x["tma_q"]])
show("  ... and head_dim_v % 16 != 0", [x for x in fw if not x["tma_q"] and x["oobv"]])
show("  ... and head_dim % 16 == 0 (the fault's property)", [x for x in fw if not x["tma_q"] and x["oobv"] and not x["oob"]])
show("forward calls whose hd and hdv padding differ (any path)", [x for x in fw if x["oob"] != x["oobv"]])

print("\n[3] bwd_preprocess_hdim_v_pred_from_hd: backward, head_dim_v padded at the preprocess's rounding, head_dim not")
def pre_pad(x):
    m = 64 if x["dkv_swap"] else 32
    return (x["hd"] % m != 0), (x["hdv"] % m != 0)
show("backward calls with hd != hdv", [x for x in bw if x["hd"] != x["hdv"]])
show("  ... whose preprocess padding differs (the fault's property)", [x for x in bw if pre_pad(x)[0] != pre_pad(x)[1]])

print("\n[4] varlen_lpt_block_order_dropped: deterministic varlen causal/local backward with a KV-block chain "
      "longer than the CTAs resident at once")
SMS = 132
rows = []
for x in bw:
    if not (x["det"] and (x["cu_k"] or x["suk"]) and (x["causal"] or x["local"])):
        continue
    nb = [math.ceil(s / x["btn"]) for s in x["seqs_k"] if s]
    ctas = sum(nb) * x["h"]
    rows.append((x["name"], ctas, max(nb, default=0)))
print(f"  deterministic varlen causal/local backward calls: {len(rows)}")
print(f"  largest grid: {max(r[1] for r in rows)} CTAs; largest grid with a chain (>= 2 KV blocks in a "
      f"sequence): {max((r[1] for r in rows if r[2] >= 2), default=0)} CTAs; longest chain: {max(r[2] for r in rows)} KV blocks")
big = [r for r in rows if r[2] >= 2 and r[1] > SMS]
print(f"  calls with a chain and more CTAs than {SMS} SMs (the fault's property): {len(big)}")
dense = []
for x in bw:
    if x["det"] and not (x["cu_k"] or x["suk"]) and (x["causal"] or x["local"]):
        nb = math.ceil(max(x["seqs_k"]) / x["btn"])
        dense.append((x["name"], nb * x["h"] * x["batch"], nb))
print(f"  (dense deterministic causal/local backward, SingleTileLPTBwdScheduler: {len(dense)} calls, largest "
      f"{max(d[1] for d in dense)} CTAs with a chain of {max(d[2] for d in dense)}: the dense reversal is reached)")

print("\n[blind spots]")
show("calls with a non-contiguous layout (strided / transposed)", [x for x in fw if x["layout"] in ("strided", "transposed")])
show("calls with a broadcast (stride-0) layout", [x for x in fw if x["layout"] == "broadcast"])
show("non-contiguous calls with GQA, varlen, paged, hd != 64, or batch > 1",
     [x for x in fw if x["layout"] != "contiguous" and (x["g"] > 1 or x["cu_q"] or x["paged"] or x["hd"] != 64 or x["batch"] > 1)])
from fa4verify import mods as M
print("  fa4verify mod pairs whose CuTe function reads seqlen_info:",
      [n for n in M.names() if "seqlen_info." in __import__("inspect").getsource(M.get(n).build)])
mask = {n for n in M.names() if M.get(n).kind == "mask"}
score = {n for n in M.names() if M.get(n).kind == "score"}
show("mask-pair calls with seqused_q / seqused_k / paged KV",
     [x for x in F if any(m in mask for m in x["mods"]) and (x["squ"] or x["suk"] or x["paged"])])
show("score-pair calls with seqused_k",
     [x for x in F if any(m in score for m in x["mods"]) and x["suk"]])
show("score-pair calls with paged cp.async / kv_packed / block sparsity + GQA",
     [x for x in F if any(m in score for m in x["mods"]) and ((x["paged"] and not x["paged_tma"]) or (x["cu_k"] and x["suk"]) or (x["block"] and x["g"] > 1))])
show("calls with more than 34,133 keys in a sequence", [x for x in F if max(x["seqs_k"]) > 34133])
show("GQA ratio >= 16", [x for x in F if x["g"] >= 16])
