"""Backward calls whose dK/dV (and dQ) violations a known issue absorbs whole, and the features only they carry."""
import os; os.environ["FA4VERIFY_FAKE_DEVICE"]="h200"
import pickle, collections
from fa4verify.kernels import fa4_params
from feat import form
rows=pickle.load(open('allcalls0.pkl','rb'))
B=[r for r in rows if r[2]=='backward']
SCORE={'alibi','rel_bias','rel_scale','head_scale','scalar_bias','default_slope','seqlen_bias','batch_length_scale','softcap'}
def absorbed(p):
    why=[]
    if p.nheads_kv<p.nheads:
        local=any(w is not None for w in p.window_size)
        r=fa4_params.sm90_dq_accum_mismatch(p.head_dim,p.head_dim_v,causal=p.causal,local=local)
        if r.get('mismatch') and r.get('pinned_mismatch'): why.append('dkdv_shadow')
        if set(p.mods)&SCORE and (p.seqlens_q is not None or p.sink or p.softcap): why.append('scoremod_gqa_nomodel')
    return why
def feats(p, det):
    f={'form:'+x for x in form(p).split('+')}
    f.add('hd%d'%p.head_dim); f.add('gqa%d'%(p.nheads//p.nheads_kv) if p.nheads_kv else 'gqa?')
    f|={'mod:'+m for m in p.mods}
    if p.sink: f.add('sink:'+p.sink_dtype)
    if p.softcap: f.add('softcap')
    wl,wr=p.window_size; f.add('win:'+('c' if p.causal else '')+('L' if wl is not None else '')+('R' if wr is not None else ''))
    f.add('det%d'%bool(det))
    if p.seqlens_k and 0 in p.seqlens_k: f.add('empty_k_seq')
    if p.seqlens_q and 0 in p.seqlens_q: f.add('empty_q_seq')
    if p.batch>256: f.add('batch>256')
    if p.call and p.call.q_batched: f.add('q_batched')
    return f
A=collections.defaultdict(list); N=collections.defaultdict(list)
for r in B:
    p=r[4]; w=absorbed(p); nm=r[1].replace('coverage.production','cov').replace('fuzz.production','fz')
    if w: print('ABSORBED', nm, w, form(p), f"h{p.nheads}/{p.nheads_kv} hd{p.head_dim} mods={p.mods} sink={p.sink} sc={p.softcap} w={p.window_size} c={p.causal} det={r[3]}")
    for f in feats(p, r[3]): (A if w else N)[f].append(nm)
print()
only=[f for f in A if f not in N]
print('features of backward calls carried ONLY by absorbed calls:', only)
for f in only: print('  ', f, A[f])
# pairs
import itertools
pa=collections.defaultdict(list); pn=set()
for r in B:
    p=r[4]; fs=sorted(feats(p,r[3])); w=absorbed(p)
    for x,y in itertools.combinations(fs,2):
        if w: pa[(x,y)].append(r[1][-4:])
        else: pn.add((x,y))
onlyp=[k for k in pa if k not in pn and not k[0].startswith('hd') and not k[1].startswith('hd')]
print('pairs only in absorbed calls (hd-free):', len(onlyp))
for k in sorted(onlyp): print('  ',k,pa[k])
