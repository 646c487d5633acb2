import pickle, sys
out = pickle.load(open(sys.argv[1],"rb"))
def s(p):
    sq = p.seqlens_q; sk = p.seqlens_k
    L = f"b={p.batch} sq={p.seqlen_q} sk={p.seqlen_k}" + (f" var(n={len(sq)} q0={sq[0]} k0={sk[0]})" if sq else "")
    c = p.call
    cs = ""
    if c is not None:
        cs = " ".join(f"{k}={v}" for k,v in vars(c).items() if v not in (None, False, 0, (), 1) ) if hasattr(c,'__dict__') else str(c)
        cs = cs[:80]
    return (f"{L} h={p.nheads}/{p.nheads_kv} d={p.head_dim}/{p.head_dim_v} causal={int(p.causal)} win={p.window_size} "
            f"sc={p.softcap} sink={p.sink and p.sink_dtype} scale={p.softmax_scale and round(p.softmax_scale,5)} "
            f"val={p.values.distribution}{dict(p.values.params)} mods={p.mods} mm={p.mask_mod} call[{cs}]")
for n,r,p,b in out:
    print(n, "BWD" if b else "fwd", (r or {}).get("det",""), s(p))
