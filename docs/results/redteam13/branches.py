"""Census of compile-time branch sides over census0.pkl (FA4's own kernel objects and compile
arguments for every SM90 audit call at seed 0). Each branch: (id, file:line, side condition as
FA4 evaluates it at trace time, predicate over the recorded kernel attributes/args). Both sides
of each branch are counted; also the distinct tile/variant configurations.
Writes branches0.txt (table) and branches0.pkl."""
import pickle, sys
from collections import defaultdict, Counter

d = pickle.load(open("census0.pkl", "rb"))
REC = d["rec"]

def fwd_f(a, args):
    g = a["qhead_per_kvhead"]; tm = a["tile_m"]
    f = dict(a)
    f.update(g=g, tm=tm, tn=a["tile_n"], hd=a["tile_hdim"], hdv=a["tile_hdimv"], nwg=tm // 64,
             pack=a["pack_gqa"], tma_q=not (a["pack_gqa"] and tm % g != 0), tma_kv=a["use_tma_KV"],
             lse=args[4] is not None, cu_q=args[6] is not None, cu_k=args[7] is not None,
             su_q=args[8] is not None, su_k=args[9] is not None, paged=args[10] is not None,
             wl=args[11] is not None, wr=args[12] is not None, sink=args[13] is not None,
             sparse=args[14] is not None, aux=bool(args[15][1]), cu_total=args[16] is not None,
             smod=a["score_mod"] is not None, mmod=a["mask_mod"] is not None, rs=a["mma_pv_is_rs"],
             oob=a["check_hdim_oob"], oobv=a["check_hdim_v_oob"])
    f["varlen_q"] = f["cu_q"] or f["su_q"]
    f["rescale"] = f["hdv"] > 128
    f["sched_bar"] = f["nwg"] >= 2 and f["hd"] <= 128
    return f

def bwd_f(a, args):
    f = dict(a)
    f.update(g=a["qhead_per_kvhead"], tm=a["tile_m"], tn=a["tile_n"], hd=a["tile_hdim"], hdv=a["tile_hdimv"],
             det=a["deterministic"], cu_q=args[10] is not None, cu_k=args[11] is not None,
             su_q=args[12] is not None, su_k=args[13] is not None, wl=args[14] is not None,
             wr=args[15] is not None, aux=bool(args[19][1]), sparse=args[20] is not None,
             cu_total=args[21] is not None, smod=a["score_mod"] is not None, mmod=a["mask_mod"] is not None,
             swap=a["SdP_swapAB"], dkvs=a["dKV_swapAB"], dqs=a["dQ_swapAB"], rs=a["mma_dkv_is_rs"],
             oob=a["check_hdim_oob"], oobv=a["check_hdim_v_oob"])
    f["varlen_q"] = f["cu_q"] or f["su_q"]
    f["spt"] = (f["is_causal"] or f["is_local"]) and f["det"]
    return f

FF = "flash_fwd_sm90.py"; FB = "flash_bwd_sm90.py"; MK = "mask.py"; BI = "block_info.py"
# (id, kernel, file:line, condition, predicate)
BR = [
 # ---------------- forward main kernel
 ("F01", "fwd", f"{FF}:232", "num_wg_mma==2 and (not use_tma_Q or not use_tma_KV) [regs 224/40]", lambda f: f["nwg"] == 2 and (not f["tma_q"] or not f["tma_kv"])),
 ("F02", "fwd", f"{FF}:220-229", "use_scheduler_barrier (num_wg>=2 and tile_hdim<=128)", lambda f: f["sched_bar"]),
 ("F03", "fwd", f"{FF}:214", "num_wg_mma==1 (tile_m 64)", lambda f: f["nwg"] == 1),
 ("F04", "fwd", f"{FF}:214", "num_wg_mma==3 (tile_m 192)", lambda f: f["nwg"] == 3),
 ("F05", "fwd", f"{FF}:247/1313", "not mma_pv_is_rs (P through smem)", lambda f: not f["rs"]),
 ("F06", "fwd", f"{FF}:232+", "rescale_O_before_gemm (tile_hdimv>128)", lambda f: f["rescale"]),
 ("F07", "fwd", f"{FF}:255", "pack_gqa", lambda f: f["pack"]),
 ("F08", "fwd", f"{FF}:280/765", "not use_tma_Q (cp.async PackGQA Q load/O store)", lambda f: not f["tma_q"]),
 ("F09", "fwd", f"{FF}:289/933", "not use_tma_KV (paged cp.async)", lambda f: not f["tma_kv"]),
 ("F10", "fwd", f"{FF}:702", "use_tma_KV and page_table (paged TMA)", lambda f: f["tma_kv"] and f["paged"]),
 ("F11", "fwd", f"{FF}:307", "use_tma_O and varlen_q (ragged O TMA)", lambda f: f["tma_q"] and f["varlen_q"]),
 ("F12", "fwd", f"{FF}:317", "SingleTileVarlenScheduler", lambda f: f["varlen_q"]),
 ("F13", "fwd", f"{FF}:322", "SingleTileLPTScheduler (causal, not local, not varlen_q)", lambda f: not f["varlen_q"] and f["is_causal"] and not f["is_local"]),
 ("F14", "fwd", f"{FF}:770", "use_block_sparsity", lambda f: f["sparse"]),
 ("F15", "fwd", f"{FF}:795/880", "block sparsity with cp.async Q (not use_tma_Q)", lambda f: f["sparse"] and not f["tma_q"]),
 ("F16", "fwd", f"{FF}:1143", "causal/local mask loop with pack_gqa", lambda f: (f["is_causal"] or f["is_local"]) and f["pack"]),
 ("F17", "fwd", f"{FF}:1177", "is_local and window_size_left is not None", lambda f: f["is_local"] and f["wl"]),
 ("F18", "fwd", f"{FF}:1177", "is_local and window_size_left is None (right-only window)", lambda f: f["is_local"] and not f["wl"]),
 ("F19", "fwd", f"{FF}:1172", "mask_mod in interior loop (mask_mod not None, not sparse)", lambda f: f["mmod"] and not f["sparse"]),
 ("F20", "fwd", f"{FF}:1239", "learnable_sink and not pack_gqa", lambda f: f["sink"] and not f["pack"]),
 ("F21", "fwd", f"{FF}:1241", "learnable_sink and pack_gqa (per-row sink head)", lambda f: f["sink"] and f["pack"]),
 ("F22", "fwd", f"{FF}:1089", "score_mod (incl. softcap)", lambda f: f["smod"]),
 ("F23", "fwd", f"{FF}:1059", "recompute fastdiv (aux tensors and varlen q)", lambda f: f["aux"] and f["varlen_q"]),
 ("F24", "fwd", f"{FF}:1062", "recompute fastdiv (aux tensors and varlen k)", lambda f: f["aux"] and (f["cu_k"] or f["su_k"])),
 ("F25", "fwd", f"{FF}:1313", "not mma_pv_is_rs and causal/local", lambda f: not f["rs"] and (f["is_causal"] or f["is_local"])),
 ("F26", "fwd", f"{FF}:1313", "not mma_pv_is_rs and pack_gqa", lambda f: not f["rs"] and f["pack"]),
 ("F27", "fwd", f"{FF}:1313", "not mma_pv_is_rs and cp.async Q (pack, 192 % g != 0)", lambda f: not f["rs"] and not f["tma_q"]),
 ("F28", "fwd", f"{FF}:1239", "learnable_sink and cp.async Q", lambda f: f["sink"] and not f["tma_q"]),
 ("F29", "fwd", f"{FF}:232", "num_wg_mma==3 and cp.async Q (no 224/40 regs)", lambda f: f["nwg"] == 3 and not f["tma_q"]),
 ("F30", "fwd", f"{FF}:259", "pack_gqa and no LSE (inference kernel)", lambda f: f["pack"] and not f["lse"]),
 ("F31", "fwd", f"{FF}:204", "no LSE (mLSE None)", lambda f: not f["lse"]),
 ("F32", "fwd", "paged_kv.py:103", "paged cp.async, head_dim_padded != head_dim_v_padded", lambda f: not f["tma_kv"] and f["hd"] != f["hdv"]),
 ("F33", "fwd", f"{FF}:785", "paged cp.async with pack_gqa", lambda f: not f["tma_kv"] and f["pack"]),
 ("F34", "fwd", f"{FF}:785", "paged cp.async with causal/local", lambda f: not f["tma_kv"] and (f["is_causal"] or f["is_local"])),
 ("F35", "fwd", f"{FF}:770", "block sparsity with pack_gqa", lambda f: f["sparse"] and f["pack"]),
 ("F36", "fwd", f"{FF}:1089", "score_mod with pack_gqa", lambda f: f["smod"] and f["pack"]),
 ("F37", "fwd", f"{MK}:244", "mask_mod with pack_gqa (fwd)", lambda f: f["mmod"] and f["pack"]),
 ("F38", "fwd", f"{MK}:334", "local, window_size_right None (fwd mask)", lambda f: f["is_local"] and not f["wr"]),
 ("F39", "fwd", f"{BI}:44", "local+left window with pack_gqa", lambda f: f["is_local"] and f["wl"] and f["pack"]),
 ("F40", "fwd", f"{BI}:36", "local, right window None, pack_gqa", lambda f: f["is_local"] and not f["wr"] and f["pack"]),
 ("F41", "fwd", f"{FF}:1177", "local with rescale_O_before_gemm (hdv>128)", lambda f: f["is_local"] and f["rescale"]),
 ("F42", "fwd", f"{FF}:1177", "causal with tile_m 192 and not rs (hd 65-96 causal)", lambda f: f["is_causal"] and f["nwg"] == 3 and not f["rs"]),
 ("F43", "fwd", f"{FF}:1016", "rescale_O_before_gemm and pack_gqa", lambda f: f["rescale"] and f["pack"]),
 ("F44", "fwd", f"{FF}:1016", "rescale_O_before_gemm and learnable_sink", lambda f: f["rescale"] and f["sink"]),
 ("F45", "fwd", "pack_gqa.py:240", "cp.async Q with check_hdim_oob", lambda f: not f["tma_q"] and f["oob"]),
 ("F46", "fwd", f"{FF}:214", "num_wg_mma==1 with causal/local", lambda f: f["nwg"] == 1 and (f["is_causal"] or f["is_local"])),
 ("F47", "fwd", "tile_scheduler.py", "varlen scheduler with cu_total_m_blocks (batch > threshold)", lambda f: f["cu_total"]),
 ("F48", "fwd", f"{FF}:1059", "aux tensors (mask/score mod reading aux) dense", lambda f: f["aux"] and not f["varlen_q"]),
 # ---------------- backward main kernel
 ("B01", "bwd", f"{FB}:396", "qhead_per_kvhead==1 (TMA dK/dV) vs GQA accum", lambda f: f["g"] == 1),
 ("B02", "bwd", f"{FB}:413", "deterministic and GQA (dK/dV semaphores)", lambda f: f["det"] and f["g"] > 1),
 ("B03", "bwd", f"{FB}:431", "num_wg_dQ==1 (dQ_single_wg, hd 65-96)", lambda f: f["num_wg_dQ"] == 1),
 ("B04", "bwd", f"{FB}:519", "SingleTileVarlenScheduler (cu_seqlens_k or seqused_k)", lambda f: f["cu_k"] or f["su_k"]),
 ("B05", "bwd", f"{FB}:521", "SingleTileLPTBwdScheduler (deterministic, not varlen_k)", lambda f: f["det"] and not (f["cu_k"] or f["su_k"])),
 ("B06", "bwd", f"{FB}:526", "spt (causal/local and deterministic)", lambda f: f["spt"]),
 ("B07", "bwd", f"{FB}:1939", "deterministic, not spt, window_left set (local semaphore arrive)", lambda f: f["det"] and not f["spt"] and f["wl"]),
 ("B08", "bwd", f"{FB}:716", "not mma_dkv_is_rs (P/dS via smem)", lambda f: not f["rs"]),
 ("B09", "bwd", f"{FB}:1559", "PdS_stage==1 and mma_dkv_is_rs", lambda f: f["PdS_stage"] == 1 and f["rs"]),
 ("B10", "bwd", f"{FB}:970", "Q_stage != dO_stage", lambda f: f["Q_stage"] != f["dO_stage"]),
 ("B11", "bwd", f"{FB}:1254", "shuffle_LSE (SdP_swapAB and tile_hdim<=64)", lambda f: f["shuffle_LSE"]),
 ("B12", "bwd", f"{MK}:286", "SdP_swapAB False (mask not swapped; hd>128)", lambda f: not f["swap"]),
 ("B13", "bwd", f"{FB}:1692", "dKV_swapAB", lambda f: f["dkvs"]),
 ("B14", "bwd", "flash_bwd_postprocess.py:698", "dQ_swapAB", lambda f: f["dqs"]),
 ("B15", "bwd", f"{FB}:1443", "empty KV tile zero-write (sparse/local/varlen_q)", lambda f: f["sparse"] or f["is_local"] or f["varlen_q"]),
 ("B16", "bwd", f"{FB}:1822", "dQaccum_store with cu_seqlens_q", lambda f: f["cu_q"]),
 ("B17", "bwd", f"{FB}:1822", "dQaccum_store with seqused_q only (padded batch)", lambda f: f["su_q"] and not f["cu_q"]),
 ("B18", "bwd", f"{FB}:1882", "deterministic with spt and GQA", lambda f: f["spt"] and f["g"] > 1),
 ("B19", "bwd", f"{MK}:383", "swap_AB mask, local, window_size_right None", lambda f: f["swap"] and f["is_local"] and not f["wr"]),
 ("B20", "bwd", f"{MK}:383", "swap_AB mask, local, window_size_left None", lambda f: f["swap"] and f["is_local"] and not f["wl"]),
 ("B21", "bwd", f"{MK}:334", "non-swap mask (hd>128), local, wr None", lambda f: not f["swap"] and f["is_local"] and not f["wr"]),
 ("B22", "bwd", f"{MK}:339", "non-swap mask (hd>128), local, wl None", lambda f: not f["swap"] and f["is_local"] and not f["wl"]),
 ("B23", "bwd", f"{MK}:303", "non-swap mask (hd>128), causal", lambda f: not f["swap"] and f["is_causal"]),
 ("B24", "bwd", f"{FB}:1534", "score_mod_bwd with SdP_swapAB False (hd>128)", lambda f: f["smod"] and not f["swap"]),
 ("B25", "bwd", f"{MK}:224", "mask_mod with SdP_swapAB False (hd>128)", lambda f: f["mmod"] and not f["swap"]),
 ("B26", "bwd", f"{FB}:1354", "block sparsity (bwd)", lambda f: f["sparse"]),
 ("B27", "bwd", f"{FB}:1354", "block sparsity with GQA (bwd)", lambda f: f["sparse"] and f["g"] > 1),
 ("B28", "bwd", f"{FB}:1354", "block sparsity with deterministic (bwd)", lambda f: f["sparse"] and f["det"]),
 ("B29", "bwd", f"{FB}:1354", "block sparsity, tile 64x64 Q_stage 1 (hd 256)", lambda f: f["sparse"] and f["Q_stage"] == 1),
 ("B30", "bwd", f"{FB}:431", "dQ_single_wg with GQA", lambda f: f["num_wg_dQ"] == 1 and f["g"] > 1),
 ("B31", "bwd", f"{FB}:431", "dQ_single_wg with deterministic", lambda f: f["num_wg_dQ"] == 1 and f["det"]),
 ("B32", "bwd", f"{FB}:431", "dQ_single_wg with causal/local", lambda f: f["num_wg_dQ"] == 1 and (f["is_causal"] or f["is_local"])),
 ("B33", "bwd", f"{FB}:1692", "dKV_swapAB with GQA (fp32 dK/dV accum)", lambda f: f["dkvs"] and f["g"] > 1),
 ("B34", "bwd", f"{FB}:1692", "dKV_swapAB with deterministic GQA", lambda f: f["dkvs"] and f["g"] > 1 and f["det"]),
 ("B35", "bwd", "flash_bwd_postprocess.py:698", "dQ_swapAB with deterministic", lambda f: f["dqs"] and f["det"]),
 ("B36", "bwd", "flash_bwd_postprocess.py:698", "dQ_swapAB with GQA", lambda f: f["dqs"] and f["g"] > 1),
 ("B37", "bwd", f"{FB}:1305", "recompute fastdiv (aux and varlen)", lambda f: f["aux"] and (f["varlen_q"] or f["cu_k"] or f["su_k"])),
 ("B38", "bwd", f"{FB}:1396", "seqused_k without cu_seqlens_k (varlen scheduler)", lambda f: f["su_k"] and not f["cu_k"]),
 ("B39", "bwd", f"{FB}:396", "GQA with varlen_k (fp32 accum, varlen)", lambda f: f["g"] > 1 and (f["cu_k"] or f["su_k"])),
 ("B40", "bwd", f"{FB}:1731", "deterministic GQA with varlen_k", lambda f: f["det"] and f["g"] > 1 and (f["cu_k"] or f["su_k"])),
 ("B41", "bwd", f"{FB}:1254", "shuffle_LSE with causal/local", lambda f: f["shuffle_LSE"] and (f["is_causal"] or f["is_local"])),
 ("B42", "bwd", f"{FB}:1557", "not mma_dkv_is_rs with GQA (hd>128 GQA)", lambda f: not f["rs"] and f["g"] > 1),
 ("B43", "bwd", f"{FB}:1557", "not mma_dkv_is_rs with causal/local", lambda f: not f["rs"] and (f["is_causal"] or f["is_local"])),
 ("B44", "bwd", f"{FB}:1557", "not mma_dkv_is_rs with deterministic", lambda f: not f["rs"] and f["det"]),
 ("B45", "bwd", f"{FB}:1939", "deterministic local non-spt ... (local implies spt when det)", lambda f: f["det"] and not f["spt"] and f["wl"]),
 ("B46", "bwd", "softmax.py/flash_bwd_sm90.py", "sink backward (learnable sink) with local", lambda f: False),
]

# pre/post-process branches
def pre_f(a, args):
    return dict(tm=a["tile_m"], oobv=a["check_hdim_v_oob"], cu_q=args[6] is not None, su_q=args[7] is not None,
                dlse=args[8] is not None, cu_total=args[12] is not None, hdv=a["head_dim_v_padded"])
def post_f(a, args):
    return dict(tm=a["tile_m"], oob=a["check_hdim_oob"], nthr=a["num_threads"], dqs=a["dQ_swapAB"],
                cu=args[3] is not None, su=args[4] is not None, sink=args[5] is not None, a6=args[6] is not None,
                hd=a["tile_hdim"], atom=a["AtomLayoutMdQ"])
BR += [
 ("P01", "pre", "flash_bwd_preprocess.py:382", "check_hdim_v_oob", lambda f: f["oobv"]),
 ("P02", "pre", "flash_bwd_preprocess.py:448", "dLSE", lambda f: f["dlse"]),
 ("P03", "pre", "flash_bwd_preprocess.py:448", "dLSE with cu_seqlens_q", lambda f: f["dlse"] and f["cu_q"]),
 ("P04", "pre", "flash_bwd_preprocess.py:448", "dLSE with seqused_q", lambda f: f["dlse"] and f["su_q"]),
 ("P05", "pre", "flash_bwd_preprocess.py:238", "cu_total_m_blocks (>threshold sequences)", lambda f: f["cu_total"]),
 ("P06", "pre", "flash_bwd_preprocess.py:382", "check_hdim_v_oob with dLSE", lambda f: f["oobv"] and f["dlse"]),
 ("Q01", "post", "flash_bwd_postprocess.py:698", "dQ_swapAB (postprocess)", lambda f: f["dqs"]),
 ("Q02", "post", "flash_bwd_postprocess.py:519", "sink tensors (dsink reduce in postprocess)", lambda f: f["sink"]),
 ("Q03", "post", "flash_bwd_postprocess.py:522", "sink with cu_seqlens_q", lambda f: f["sink"] and f["cu"]),
 ("Q04", "post", "flash_bwd_postprocess.py:579", "seqused only (no cu_seqlens)", lambda f: f["su"] and not f["cu"]),
 ("Q05", "post", "flash_bwd_postprocess.py", "128 threads (tile 48/dQ single?)", lambda f: f["nthr"] == 128),
 ("Q06", "post", "flash_bwd_postprocess.py", "check_hdim_oob", lambda f: f["oob"]),
 ("Q07", "post", "flash_bwd_postprocess.py", "sink with seqused", lambda f: f["sink"] and f["su"]),
]

feats = defaultdict(list)
for cid, chk, ps, cls, a, args, kw in REC:
    if cls == "FlashAttentionForwardSm90": feats["fwd"].append((cid, ps, fwd_f(a, args)))
    elif cls == "FlashAttentionBackwardSm90": feats["bwd"].append((cid, ps, bwd_f(a, args)))
    elif cls == "FlashAttentionBackwardPreprocess": feats["pre"].append((cid, ps, pre_f(a, args)))
    elif cls == "FlashAttentionBackwardPostprocess": feats["post"].append((cid, ps, post_f(a, args)))

rows = []
for bid, k, where, cond, pred in BR:
    yes = sorted({cid for cid, ps, f in feats[k] if pred(f)})
    no = sorted({cid for cid, ps, f in feats[k] if not pred(f)})
    rows.append((bid, k, where, cond, len(yes), len(no), yes[:4]))
out = open("branches0.txt", "w")
for r in rows:
    print(f"{r[0]:4} {r[1]:4} {r[2]:34} T={r[4]:4} F={r[5]:4}  {r[3]}  eg={r[6][:2]}", file=out)
# configurations
cfgs = {}
for k, keys in (("fwd", ("tm", "tn", "hd", "hdv", "rs", "pack", "tma_q", "tma_kv")),
                ("bwd", ("tm", "tn", "hd", "hdv", "Q_stage", "dO_stage", "PdS_stage", "swap", "dkvs", "dqs", "num_wg_dQ"))):
    c = Counter(tuple(f[x] for x in keys) for cid, ps, f in feats[k])
    cfgs[k] = (keys, c)
    print(f"\n{k} configurations {keys}:", file=out)
    for t, n in sorted(c.items(), key=lambda x: (x[0][2], x[0][0], x[0][1])):
        print(f"   {t}  x{n}", file=out)
out.close()
pickle.dump({"rows": rows, "feats": dict(feats), "cfgs": cfgs}, open("branches0.pkl", "wb"))
print(open("branches0.txt").read())
