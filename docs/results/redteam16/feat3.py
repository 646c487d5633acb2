import pickle, collections
rows=pickle.load(open('allcalls0.pkl','rb'))
B=[r for r in rows if r[2]=='backward']
c=collections.defaultdict(list)
def tn(hd):
    return 128 if hd<=128 else (96 if hd<=192 else 48)
for r in B:
    p=r[4]; sw='swap' if p.head_dim<=128 else 'noswap'
    wl,wr=p.window_size
    kind=('causal' if p.causal else '')+('L' if wl is not None else '')+('R' if wr is not None else '')
    mm=[m for m in p.mods if m in ('causal','causal_aligned','document','prefix_lm','head_window','sliding_window','checkerboard')]
    if mm: kind+='+mask_mod'
    c[(sw,kind or 'none')].append(r[1].split('#')[0][:4]+'#'+r[1].split('#')[1])
for k in sorted(c): print(k, len(c[k]), ' '.join(c[k][:10]))
