import pickle, collections, dataclasses
rows=pickle.load(open('allcalls0.pkl','rb'))
from fa4verify.problem import *  # noqa
def cf(c):
    if c is None: return ''
    d=[]
    for f in dataclasses.fields(c):
        v=getattr(c,f.name)
        if v!=f.default: d.append(f"{f.name}={v}")
    return "CF(" + ",".join(d)+")"
for r in rows:
    cid,name,op,det,p,dl=r[:6]
    print(f"{name[:34]:34s} {op[:4]} det={int(bool(det))} dl={int(bool(dl))} b{p.batch} s{p.seqlen_q}/{p.seqlen_k} h{p.nheads}/{p.nheads_kv} d{p.head_dim}/{p.head_dim_v} c={int(p.causal)} w={p.window_size} sc={p.softcap} sink={int(p.sink)}{p.sink_dtype if p.sink else ''} scale={p.softmax_scale} vq={p.seqlens_q} vk={p.seqlens_k} mm={p.mask_mod} mods={p.mods} {cf(p.call)} val={p.values.distribution}{p.values.params} desc={p.descales}")
