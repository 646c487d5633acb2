"""Rank the blind spots from absorb_*.pkl: per (call, gradient) the share absorbed without a model
judging it; the features (single, pairs, triples) of backward calls carried ONLY by calls whose
gradient is >= HALF blind. Writes calls17.txt (per-call listing) and prints the ranking."""
import os, sys, pickle, itertools, collections
os.environ["FA4VERIFY_FAKE_DEVICE"] = "h200"
import numpy as np
from fa4verify.kernels import fa4_params
R = [r for f in sorted(__import__("glob").glob("absorb_*.pkl")) for r in pickle.load(open(f, "rb"))]
HALF = 0.5
SCORE = {'alibi', 'rel_bias', 'rel_scale', 'head_scale', 'scalar_bias', 'default_slope', 'seqlen_bias', 'batch_length_scale', 'softcap'}


def feats(p, det):
    f = set()
    c = p.call
    if p.varlen: f.add("varlen")
    if c:
        for k in ("seqused_q", "seqused_k", "q_batched", "kv_packed", "block_partial", "mask_causal", "block_per_head"):
            if getattr(c, k): f.add(k)
        if c.page_size: f.add("paged")
        if c.block_size: f.add("block_sparse")
        if c.mask_mod_fn: f.add("mask_mod_fn")
        if c.pack_gqa is False: f.add("pack_gqa=False")
    if not (f & {"varlen", "seqused_q", "seqused_k", "paged", "block_sparse", "q_batched"}): f.add("dense")
    g = p.nheads // p.nheads_kv
    f.add("mha" if g == 1 else "gqa"); f.add(f"g{g}")
    f.add(f"hd{p.head_dim}" + (f"/{p.head_dim_v}" if p.head_dim_v != p.head_dim else ""))
    local = any(w is not None for w in p.window_size)
    if fa4_params.sm90_dq_accum_mismatch(p.head_dim, p.head_dim_v, causal=p.causal, local=local).get("pinned_mismatch"):
        f.add("odd_hd")
    for m in p.mods: f.add(("score:" if m in SCORE else "mask:") + m)
    if p.sink: f.add("sink")
    if p.softcap: f.add("softcap")
    wl, wr = p.window_size
    if p.causal: f.add("causal")
    if wl is not None: f.add("winL")
    if wr is not None: f.add("winR")
    f.add("det" if det else "nondet")
    if p.batch > 256: f.add("b>256")
    if p.seqlens_k and 0 in p.seqlens_k: f.add("empty_k_seq")
    if p.seqlens_q and 0 in p.seqlens_q: f.add("empty_q_seq")
    if p.head_dim_v != p.head_dim: f.add("hd!=hdv"); f.add(f"hdv{p.head_dim_v}")
    from fa4verify.kernels.facts import bwd_tile
    from fa4verify.problem import resolve_window
    rc, rl, _, _ = resolve_window(p.causal, p.window_size)
    t = bwd_tile(p.arch, p.head_dim, p.head_dim_v, rc, rl)
    f.add(f"bwdtile{t[0]}x{t[1]}")
    return f


def short(r):
    return r["name"].replace("edge:", "e:")


rows = []
for r in R:
    r["feats"] = feats(r["problem"], r["det"])
    r["share"] = {q: r["blind"][q] / max(r["sizes"][q], 1) for q in r["sizes"]}

with open("calls17.txt", "w") as f:
    f.write("# coverage.production, seed 0, sm90 bf16, fake H200: every call; per quantity the share absorbed\n"
            "# without a model judging it (configuration-only or NaN model), then each (issue, quantity) the\n"
            "# configuration predicate accepts: cfg = accepted elements / all, model = none|map|array, unjudged =\n"
            "# accepted elements the model does not judge (None or NaN); slack/med = 2^-7 max|model| / median|model|\n")
    for r in R:
        bl = " ".join(f"{q}={r['share'][q]:.0%}" for q in r["sizes"] if r["blind"][q])
        f.write(f"{r['idx']:3d} {r['name']:40s} {'bwd' if r['bwd'] else 'fwd'} det={int(r['det'])} blind[{bl}] | {r['desc']}\n")
        for e in r["ent"]:
            f.write(f"      {e['issue']:36s} {e['q']:5s} cfg {e['cfg']}/{e['n']} model={e['kind']:5s} unjudged={e['unjudged']}"
                    + (f" slack/med={e['slack_over_median']:.3g}" if e['kind'] == 'array' else "")
                    + (f" ({e['note']})" if e['note'] else "") + "\n")

B = [r for r in R if r["bwd"]]
print(f"calls {len(R)}, backward {len(B)}")
for q in ("dq", "dk", "dv", "dsink", "out", "lse"):
    pool = B if q not in ("out", "lse") else R
    bl = [r for r in pool if q in r["share"] and r["share"][q] >= HALF]
    some = [r for r in pool if q in r["share"] and 0 < r["share"][q] < HALF]
    print(f"{q}: >=50% blind in {len(bl)} calls: {' '.join(short(r)+'(%d%%)' % round(100 * r['share'][q]) for r in bl)}")
    if some: print(f"    0-50% blind in {len(some)}: {' '.join(short(r)+'(%d%%)' % round(100 * r['share'][q]) for r in some)}")

print("\n== feature combinations of backward calls whose gradient q is judged (<50% blind) in NO call ==")
SKIP = lambda x: x.startswith("hd") and x != "hd!=hdv"
for q in ("dq", "dk", "dv"):
    judged = [r for r in B if r["share"][q] < HALF]
    blind = [r for r in B if r["share"][q] >= HALF]
    for k in (1, 2, 3):
        seen_j = set()
        for r in judged:
            fs = sorted(x for x in r["feats"] if not SKIP(x))
            seen_j.update(itertools.combinations(fs, k))
        only = collections.defaultdict(list)
        for r in blind:
            fs = sorted(x for x in r["feats"] if not SKIP(x))
            for c in itertools.combinations(fs, k):
                if c not in seen_j:
                    only[c].append(short(r))
        # minimal: drop a combo containing a smaller blind-only combo
        if k > 1:
            only = {c: v for c, v in only.items()
                    if not any(s in prev for j in range(1, k) for s in itertools.combinations(c, j))}
        prev = set(only) | (prev if k > 1 else set())
        for c, v in sorted(only.items(), key=lambda x: (-len(x[1]), x[0])):
            print(f"  {q} k={k} {' x '.join(c):60s} only in: {' '.join(v)}")

print("\n== per blind call: minimal feature combos (k<=3, hd values left out) whose gradient is judged nowhere else ==")
percall = collections.defaultdict(lambda: collections.defaultdict(list))
for q in ("dq", "dk", "dv"):
    judged = [r for r in B if r["share"][q] < HALF]
    seen = set()
    for r in judged:
        fs = sorted(x for x in r["feats"] if not SKIP(x))
        for k in (1, 2, 3):
            seen.update(itertools.combinations(fs, k))
    for r in B:
        if r["share"][q] < HALF:
            continue
        fs = sorted(x for x in r["feats"] if not SKIP(x))
        mins = []
        for k in (1, 2, 3):
            for c in itertools.combinations(fs, k):
                if c not in seen and not any(set(m) <= set(c) for m in mins):
                    mins.append(c)
        percall[short(r)][q] = mins
for r in B:
    n = short(r)
    if n not in percall:
        continue
    shares = " ".join(f"{q}={r['share'][q]:.0%}" for q in ("dq", "dk", "dv") if r["share"][q])
    why = sorted({(e["issue"], e["kind"]) for e in r["ent"] if e["unjudged"] and e["q"] in ("dq", "dk", "dv")})
    print(f"{n}: {shares} | {r['desc'][:160]}")
    print(f"    why: {'; '.join(f'{i} ({k})' for i, k in why)}")
    allq = collections.defaultdict(list)
    for q, mins in percall[n].items():
        for c in mins:
            allq[c].append(q)
    for c, qs in sorted(allq.items(), key=lambda x: (len(x[0]), x[0])):
        print(f"    {'/'.join(qs):9s} {' x '.join(c)}")
