"""FA4's SM90 configuration of every audit call (allcalls0.pkl), from FA4's own tile rules:
the forward's tile, PackGQA, TMA vs cp.async Q/O, head-dim padding, varlen / seqused / paged
arguments, the scheduler, tails; the backward's tile, swapAB flags, accumulator rounding, GQA
postprocess. Written to feats0.pkl (a list of dicts) for the scans."""
import os, pickle, sys, math
os.environ["FA4VERIFY_FAKE_DEVICE"] = "h200"
import numpy as np
from flash_attn.cute import interface as I
from fa4verify.targets import block_mask_heads

def cdiv(a, b): return -(-a // b)

def fwd_feats(p, inference=False):
    c = p.call
    hd, hdv = p.head_dim, p.head_dim_v
    g = p.nheads // p.nheads_kv
    wl, wr = p.window_size
    # FA4's _resolve_causal_local_window (mask_mod drops causal/window)
    mm = bool(c is not None and (c.mask_mod_fn is not None)) or any(
        getattr(pp, "kind", None) == "mask" for pp in (p.mod_pairs() if p.mods else ()) if pp is not None)
    causal, local = bool(p.causal), False
    if wl is not None and wl < 0: wl = None
    if wr is not None and wr < 0: wr = None
    if mm:
        causal, local = False, False
    else:
        if causal:
            local = wl is not None
        elif wl is not None or wr is not None:
            local = True
            if wl is None and wr == 0:   # FA4: left None + right 0 -> causal
                causal, local = True, False
    bs = c.block_size if c is not None else None
    sparse_q = bs[0] if bs else None
    cfg = I._tile_size_fwd_sm90(hd, hdv, causal, local, sparse_block_size_q=sparse_q)
    if bs:
        cfg = I._fit_sm90_fwd_tile_to_block_sparsity(cfg, bs[0], bs[1])
    tm, tn = cfg.m_block_size, cfg.n_block_size
    pack = (g > 1) if (c is None or c.pack_gqa is None) else bool(c.pack_gqa)
    if bs and block_mask_heads(p) != 1:
        pack = False
    if g == 1: pack = False
    use_tma_q = not (pack and tm % g != 0)
    thd, thdv = cdiv(hd, 16) * 16, cdiv(hdv, 16) * 16
    # call arguments
    varlen = p.varlen
    cu_q = cu_k = squ = suk = False
    paged = page = None
    if c is not None and c.batched_layout:
        squ = c.seqused_q
        cu_q = (c.seqused_q and c.q_packed) or (not c.seqused_q and not c.q_batched)
        suk = bool(c.seqused_k) and not c.full_pages
        cu_k = bool(c.kv_packed)
        if c.paged:
            paged, page = True, c.page_size
    elif varlen:
        cu_q = cu_k = True
    seqs_q = list(p.seqlens_q) if p.seqlens_q else [p.seqlen_q] * p.batch
    seqs_k = list(p.seqlens_k) if p.seqlens_k else [p.seqlen_k] * p.batch
    rows = [s * (g if pack else 1) for s in seqs_q]
    sched = "varlen" if (cu_q or squ) else ("lpt" if (causal or local) else "single")
    return dict(pass_="fwd", hd=hd, hdv=hdv, thd=thd, thdv=thdv, oob=hd != thd, oobv=hdv != thdv,
                g=g, pack=pack, tm=tm, tn=tn, rs=cfg.mma_pv_is_rs, tma_q=use_tma_q, causal=causal, local=local,
                cu_q=cu_q, cu_k=cu_k, squ=squ, suk=suk, paged=bool(paged), page=page,
                paged_tma=bool(paged) and page == tn, block=bool(bs), bs=bs, mods=tuple(p.mods), mm=mm,
                lse=not inference, sched=sched, batch=p.batch, nseq=len(seqs_q), h=p.nheads, hk=p.nheads_kv,
                seqs_q=seqs_q, seqs_k=seqs_k, rows=rows,
                mtail=any(r % tm for r in rows if r), ntail=any(s % tn for s in seqs_k if s),
                mtiles=max((cdiv(r, tm) for r in rows), default=0), ntiles=max((cdiv(s, tn) for s in seqs_k), default=0),
                sink=bool(p.sink), softcap=float(p.softcap), scale=p.softmax_scale)

def bwd_feats(p, det):
    c = p.call
    f = fwd_feats(p)
    hd, hdv = p.head_dim, p.head_dim_v
    bs = c.block_size if c is not None else None
    sparse_q = None
    if bs is not None:
        sparse_q = bs[0]
    cfg = I._tile_size_bwd_sm90(hd, hdv, f["causal"], f["local"], sparse_block_size_q=(128 if bs else None))
    mult_k = 64 if cfg.dKV_swapAB else 16      # kernel tile_hdim
    mult_p = 64 if cfg.dKV_swapAB else 32      # interface / postprocess rounding
    g = f["g"]
    d = dict(f)
    d.update(pass_="bwd", btm=cfg.m_block_size, btn=cfg.n_block_size, sdp_swap=cfg.SdP_swapAB,
             dkv_swap=cfg.dKV_swapAB, dq_swap=cfg.dQ_swapAB, nwg=cfg.num_wg, dq_single=cfg.dQ_single_wg,
             kthd=cdiv(hd, mult_k) * mult_k, kthdv=cdiv(hdv, mult_k) * mult_k,
             pthd=cdiv(hd, mult_p) * mult_p, gqa_post=g > 1, det=det,
             bmtail=any(s % cfg.m_block_size for s in f["seqs_q"] if s),
             bntail=any(s % cfg.n_block_size for s in f["seqs_k"] if s),
             bmtiles=max((cdiv(s, cfg.m_block_size) for s in f["seqs_q"]), default=0),
             bntiles=max((cdiv(s, cfg.n_block_size) for s in f["seqs_k"]), default=0),
             bsched="varlen" if (f["cu_k"] or f["suk"] or (f["cu_q"] and f["cu_k"])) else ("lpt" if det else "single"))
    return d

if __name__ == "__main__":
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    calls = pickle.load(open(f"/work/dev24/redteam13/allcalls{seed}.pkl", "rb"))
    out = []
    for cid, name, op, det, p, extra in calls:
        if op == "combine":
            continue
        try:
            ff = fwd_feats(p); ff.update(check=cid, name=name); out.append(ff)
            if p.call is not None and p.call.inference:
                fi = fwd_feats(p, inference=True); fi.update(check=cid, name=name + "/inference"); out.append(fi)
            if op == "backward":
                bf = bwd_feats(p, det); bf.update(check=cid, name=name); out.append(bf)
        except Exception as e:
            print("ERR", cid, name, type(e).__name__, e)
    pickle.dump(out, open(f"/work/dev24/redteam13/feats{seed}.pkl", "wb"))
    print(len(out), "pass-calls;", sum(1 for x in out if x["pass_"] == "fwd"), "fwd,",
          sum(1 for x in out if x["pass_"] == "bwd"), "bwd")
