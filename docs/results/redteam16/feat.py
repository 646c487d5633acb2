import pickle, collections
rows=pickle.load(open('allcalls0.pkl','rb'))
def form(p):
    f=[]
    if p.seqlens_q is not None: f.append('varlen')
    c=p.call
    if c:
        if c.seqused_q: f.append('sq')
        if c.seqused_k: f.append('sk')
        if c.block_size: f.append('bs')
        if c.page_size: f.append('pg')
        if c.q_batched: f.append('qb')
    return '+'.join(f) or 'dense'
out=collections.defaultdict(list)
for r in rows:
    cid,name,op,det,p,dl=r[:6]
    if op!='backward': continue
    swap = p.head_dim<=128
    for m in p.mods:
        out[m].append(f"{name.replace('coverage.production','cov').replace('fuzz.production','fz')}[hd{p.head_dim} {'swap' if swap else 'noswap'} h{p.nheads}/{p.nheads_kv} {form(p)} det{int(bool(det))} b{p.batch} s{p.seqlen_q}/{p.seqlen_k}]")
    if p.softcap: out['softcap(param)'].append(f"{name[-4:]}[hd{p.head_dim} h{p.nheads}/{p.nheads_kv} {form(p)} sc{p.softcap} scale{p.softmax_scale}]")
for k,v in out.items():
    print(k, len(v)); [print('   ',x) for x in v]
