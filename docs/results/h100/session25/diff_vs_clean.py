import json,gzip,glob,os
def load(p):
    return json.load(gzip.open(p) if p.endswith('.gz') else open(p))
def sets(p):
    det=load(p)['results'][0]['details']; pc=det['plan_coverage']
    return d(pc.get('violating_rows',{})), d(pc.get('violating_edges',{})), det, load(p)['summary']['exit_code']
def d(x): return x if isinstance(x,dict) else {k:None for k in x}
for call in ("c6d84c7", "35451e8"):
    files=sorted(glob.glob(f'{call}/**/*.json*',recursive=True)); files=[f for f in files if not f.endswith('mutants.json')]
    cl=[f for f in files if os.path.basename(f).startswith('clean.')]
    cr,ce,_,cx=sets(cl[0]); print(f'{call} clean exit={cx} rows={sorted(cr)} edges={sorted(ce)}')
    for f in files:
        if f in cl: continue
        r,e,det,x=sets(f); name=os.path.basename(f).split('.json')[0]
        print(f'  {name} exit={x} extra rows={sorted(set(r)-set(cr))} extra edges={sorted(set(e)-set(ce))} missing vs clean rows={sorted(set(cr)-set(r))}')
        for k in sorted(set(e)-set(ce)):
            v=e[k]; print('     ',k, (v.get('property'),v.get('message','')[:150]) if isinstance(v,dict) else v)
        for k in sorted(set(r)-set(cr)):
            print('     row',k, json.dumps(r[k])[:200])
