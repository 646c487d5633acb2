import os, pickle, collections
os.environ["FA4VERIFY_FAKE_DEVICE"] = "h200"
import numpy as np
from fa4verify.fuzz import known_issues as K
from fa4verify.kernels import fa4_params
from fa4verify.kernels.facts import bwd_tile
from fa4verify.problem import resolve_window
rows = pickle.load(open("docs/results/redteam12/cases0.pkl", "rb"))
res = collections.defaultdict(list)
for cid, name, bwd, p in rows:
    tag = []
    call = p.call
    local = any(w is not None for w in p.window_size)
    if p.arch != "sm90":
        continue
    if bwd:
        lens = p.seqlens_q if p.varlen else (p.seqlen_q,)
        packed = p.varlen and not (call is not None and (call.q_batched or call.seqused_q))
        if fa4_params.sm90_dq_defect_predicted(p.head_dim, p.head_dim_v, lens, causal=p.causal, local=local, varlen=packed):
            tag.append("dq_accum")
        if p.nheads_kv < p.nheads and fa4_params.sm90_dq_accum_mismatch(p.head_dim, p.head_dim_v, causal=p.causal, local=local).get("mismatch"):
            tag.append("gqa_dkdv")
        if p.nheads_kv != p.nheads and p.mods:
            score, _ = p.mod_pairs()
            if score is not None:
                try:
                    eff = K._gqa_mapping_effect(p, score, p.materialize())
                except Exception as e:
                    eff = "ERR " + type(e).__name__
                if eff is not None:
                    tag.append("score_gqa:" + eff)
        if call is not None and call.mask_causal:
            tag.append("mask_causal")
        if p.head_dim_v == 64:
            rc, rl, _, _ = resolve_window(p.causal, p.window_size)
            if bwd_tile(p.arch, p.head_dim, p.head_dim_v, rc, rl)[0] == 80:
                tag.append("preproc_overrun(b*h=%d)" % (p.batch * p.nheads))
        if p.head_dim in (104, 112):
            tag.append("hd104_112")
        if (p.head_dim, p.head_dim_v) in K.SM90_BWD_SMEM_OVER and p.nheads == p.nheads_kv:
            tag.append("smem_over")
    if call is not None and call.paged and p.head_dim == p.head_dim_v and p.head_dim in (80, 96):
        if K._fwd_tile_n(p) == 144 and call.page_size != 144:
            tag.append("paged144")
    if call is not None and call.paged and call.hostile_nan:
        tag.append("paged_nan")
    try:
        if K.varlen_sparse_misread_tokens(p).any():
            tag.append("sparse_stride")
    except Exception:
        pass
    if p.sink:
        try:
            if K._sink_overflow_rows(p, p.materialize()).any():
                tag.append("sink_overflow")
        except Exception as e:
            tag.append("sinkERR")
    if tag:
        print(f"{cid:20s} {name:40s} bwd={int(bwd)} {p.describe()[:150]} -> {' '.join(tag)}")
        for t in tag:
            res[t.split("(")[0].split(":")[0]].append(name)
print()
for k, v in res.items():
    print(k, len(v))
