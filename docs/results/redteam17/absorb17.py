"""Round 17: for every coverage.production call (seed 0, sm90 bf16, fake H200), which known issues'
configuration predicates match each judged quantity (bwd_budget dq/dk/dv/dsink, fwd_budget out/lse),
which elements they accept, and whether the issue's model judges them there (None = configuration
only; NaN = unknown) -- mirroring known_issues._within_model. Writes absorb0.pkl and prints a listing.
Usage: python absorb17.py [first] [last]"""
import os, sys, time, pickle, warnings
os.environ["FA4VERIFY_FAKE_DEVICE"] = "h200"
warnings.filterwarnings("ignore")
import numpy as np
from fa4verify.fuzz import known_issues as KI, defect_models as DM
from fa4verify.fuzz.violation import Violation
from fa4verify.kernels.facts import bwd_tile
from fa4verify.problem import resolve_window

P = pickle.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "plan0.pkl"), "rb"))
lo, hi = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 and __name__ == "__main__" else (0, len(P))
ISS = {k.name: k for k in KI.KNOWN_ISSUES if "production" in k.targets}


def shapes(p, a):
    q, k, v = a["q"].shape, a["k"].shape, a["v"].shape
    out = q[:-1] + (p.head_dim_v,)
    lse = (p.nheads, q[0]) if p.varlen else (p.batch, p.nheads, p.seqlen_q)
    s = {"out": out, "lse": lse}
    s.update(dq=q, dk=k, dv=v)
    if p.sink:
        s["dsink"] = (p.nheads,)
    return s


def tok_head(p, shape, q):
    """(token, head) index grids of a tensor in FA4 layout (dense flattened batch-major)."""
    if q == "lse":
        if p.varlen:
            h, t = np.meshgrid(np.arange(shape[0]), np.arange(shape[1]), indexing="ij"); return t, h
        b, h, s = np.meshgrid(*(np.arange(n) for n in shape), indexing="ij"); return b * p.seqlen_q + s, h
    if p.varlen:
        t, h = np.meshgrid(np.arange(shape[0]), np.arange(shape[1]), indexing="ij")
    else:
        per = shape[1]
        b, s, h = np.meshgrid(*(np.arange(n) for n in shape[:3]), indexing="ij"); t = b * per + s
    return t[..., None], h[..., None]


def rows_to_mask(p, rows, shape, q):
    """rows: (token, head) bool over query rows -> element mask of quantity q (dk/dv: a key of a KV
    head whose group has a marked row of its sequence)."""
    if q in ("out", "dq", "lse"):
        t, h = tok_head(p, shape, q)
        return np.broadcast_to(rows[t, h], shape).copy()
    g = p.nheads // p.nheads_kv
    bounds = KI._token_bounds(p)
    tk = sum(lk for *_, lk in bounds)
    km = np.zeros((tk, p.nheads_kv), bool)
    for (q0, lq, k0, lk) in bounds:
        for hk in range(p.nheads_kv):
            if rows[q0:q0 + lq, hk * g:(hk + 1) * g].any():
                km[k0:k0 + lk, hk] = True
    t, h = tok_head(p, shape, q)
    return np.broadcast_to(km[t, h], shape).copy()


def whole(ki, p, a, prop, q, extra=None):
    v = Violation(prop, f"{q}: synthetic", dict({"quantity": q}, **(extra or {})))
    v.over_indices = None
    try:
        return bool(ki.applies(p, a, v))
    except Exception as e:
        return f"ERR {type(e).__name__}: {e}"


def config_masks(p, a, S, bwd):
    """{(issue, q): (mask, note)} of what each predicate accepts."""
    out = {}
    qs = [q for q in S if (bwd or q in ("out", "lse"))]
    r_causal, r_local, _, _ = resolve_window(p.causal, p.window_size)
    # the runtime overrun needs FA4's real tile_m 80: under block sparsity FA4 drops to 64 unless the
    # sparse Q block is a multiple of 80 (interface.py _tile_size_bwd_sm90), so no scratch overrun shows
    from flash_attn.cute.interface import _tile_size_bwd_sm90
    bq = p.call.block_size[0] if (p.call is not None and p.call.block_size is not None) else None
    real_m = _tile_size_bwd_sm90(p.head_dim, p.head_dim_v, bool(r_causal), bool(r_local), bq).m_block_size \
        if p.head_dim <= 128 and p.head_dim > 96 else None
    overrun = (p.arch == "sm90" and p.head_dim_v == 64 and real_m == 80
               and bwd_tile(p.arch, p.head_dim, p.head_dim_v, r_causal, r_local)[0] == 80)
    for name, ki in ISS.items():
        for q in qs:
            prop = "fwd_budget" if q in ("out", "lse") else "bwd_budget"
            note = ""
            if name == "sink_rowsum_overflow":
                if not p.sink or q == "dsink":
                    continue
                rows = KI._sink_overflow_rows(p, a)
                if not rows.any():
                    continue
                m = rows_to_mask(p, rows, S[q], q)
            elif name == "sm90_dq_accum_hdim_rounding":
                if q != "dq" or whole(ki, p, a, prop, q) is not True:
                    continue
                good = KI.fa4_params.SM90_DQ_DEFECT_GOOD_ROWS if hasattr(KI, "fa4_params") else None
                from fa4verify.kernels import fa4_params
                good = fa4_params.SM90_DQ_DEFECT_GOOD_ROWS
                call = p.call
                if p.varlen:
                    packed = not (call is not None and (call.q_batched or call.seqused_q))
                    rows = np.zeros((S["dq"][0], p.nheads), bool)
                    for i, (q0, lq, _, _) in enumerate(p._seq_bounds()):
                        r = np.arange(lq)
                        rows[q0:q0 + lq] = ((r >= good) | (packed and i >= 1))[:, None]
                else:
                    rows = np.zeros((p.batch * p.seqlen_q, p.nheads), bool)
                    rows[:] = (np.tile(np.arange(p.seqlen_q), p.batch) >= good)[:, None]
                m = rows_to_mask(p, rows, S[q], q)
            elif name == "sm90_bwd_preprocess_overrun":
                if not overrun or q not in ("dq", "dk", "dsink"):
                    continue
                # dense / any: with the measured scratch overrun (past D's end) the whole tensor
                # does the overrun land past D's end (the scratch guard sees it: scratch_overrun on
                # every violation of the call)? dense / q_batched: D (b, h, s rounded to 80), the last
                # slot's tile ends at the buffer's end -> yes; varlen: from FA4's slots
                shows, note = True, "scratch overrun past D's end (dense D layout)"
                if p.varlen:
                    slots = KI._sm90_d_slots(p, 80)
                    if slots is not None:
                        st, ln, size = slots
                        ends = st + (-(-ln[None, :] // 80)) * 80
                        shows = bool(((ends + KI.SM90_PREPROCESS_OVERRUN["dpsum"] > size) & (ln[None, :] > 0)).any())
                        note = "scratch overrun past D's end (varlen slots)"
                    else:
                        note = "scratch overrun past D's end (q_batched: dense D layout, assumed)"
                w = shows and whole(ki, p, a, prop, q, {"scratch_overrun": dict(KI.SM90_PREPROCESS_OVERRUN)})
                if w is True:
                    m = np.ones(S[q], bool)
                elif p.varlen and q in ("dq", "dk"):
                    rows = KI._sm90_varlen_overrun_rows(p, 80)
                    if rows is None or not rows.any() or p.mods or p.mask_mod is not None or \
                            (p.call is not None and p.call.mask_mod_fn is not None):
                        continue
                    m = rows_to_mask(p, rows.T, S[q], q); note = "varlen overrun rows"
                else:
                    continue
            elif name == "sm90_paged_tma_empty_seq_nan":
                if q != "out" or p.call is None or not p.call.paged or not p.call.hostile_nan or not p.varlen:
                    continue
                e = KI._empty_seq_tokens(p)
                if not e.any() or p.call.page_size != KI._fwd_tile_n(p):
                    continue
                m = rows_to_mask(p, np.repeat(e[:, None], p.nheads, 1), S[q], q)
            elif name == "sm90_varlen_sparse_kv_stride":
                if q not in ("out", "lse"):
                    continue
                bad = KI.varlen_sparse_misread_tokens(p)
                if not bad.any():
                    continue
                m = rows_to_mask(p, np.repeat(bad[:, None], p.nheads, 1), S[q], q)
            else:
                w = whole(ki, p, a, prop, q)
                if w is not True:
                    if isinstance(w, str): print("   !!", name, q, w)
                    continue
                m = np.ones(S[q], bool)
            out[(name, q)] = (m, note)
    # the backward that does not run at all (a 'runs' violation absorbed): nothing of it is judged
    if bwd:
        for name, msg in (("sm90_bwd_hd104_112_compile", "failed to partition '(112,80)' with tiled_mma"),
                          ("sm90_bwd_hdv_gt_hd_smem", "cudaErrorInvalidValue"),
                          ("sm90_block_sparse_bwd_no_build", "MLIRError: unable to partition")):
            v = Violation("runs", msg, {})
            if ISS[name].applies(p, a, v):
                for q in S:
                    if q not in ("out", "lse"):
                        out[(name, q)] = (np.ones(S[q], bool), "backward does not run")
    return out


def model_ref(name, p, a, q, cache):
    """Mirror of _within_model: the effective model of quantity q -> ('none', None) | ('map', None) |
    ('array', ref float64)."""
    ki = ISS[name]
    if ki.model is None:
        return "none", None
    if name not in cache:
        cache[name] = ki.model(p, a, a["dout"], None)
    m = cache[name]
    if m is None or q not in m:
        return "none", None
    ref = m[q]
    if callable(ref):
        return "map", None
    if q in ("dq", "dk", "dv"):
        nm = "misread" if q == "dq" else "misread_kv"
        if nm not in cache:
            cache[nm] = (DM.sm90_dq_misread if q == "dq" else DM.sm90_dkv_misread)(p, a, None, None)
        if cache[nm] is not None:
            r = np.asarray(ref, np.float64)
            ref, _ = cache[nm][q](r, np.zeros_like(r), np.nan if np.isnan(r).any() else 0.0)
    return "array", np.asarray(ref, np.float64)


def analyze(p, bwd):
    """(blind element counts per quantity, sizes, entries) of problem p."""
    a = p.materialize()
    S = shapes(p, a)
    cm = config_masks(p, a, S, bwd)
    cache, ent = {}, []
    blind = {q: np.zeros(S[q], bool) for q in S}
    for (name, q), (m, note) in cm.items():
        kind, ref = model_ref(name, p, a, q, cache)
        n, cov = m.size, int(m.sum())
        if kind == "array":
            nan = np.isnan(ref) & m
            fin = np.isfinite(ref)
            top = float(np.abs(ref[fin]).max()) if fin.any() else 0.0
            med = float(np.median(np.abs(ref[fin & m]))) if (fin & m).any() else 0.0
            small = float(np.mean(np.abs(ref[fin & m]) <= DM.MODEL_SLACK * top)) if (fin & m).any() else 0.0
            un = nan
        else:
            top = med = small = float("nan")
            un = m if kind == "none" else np.zeros_like(m)
        blind[q] |= un
        ent.append(dict(issue=name, q=q, n=n, cfg=cov, kind=kind, unjudged=int(un.sum()), note=note,
                        slack_over_median=(DM.MODEL_SLACK * top / med) if med else float("nan"), slack_share=small))
    return {q: int(blind[q].sum()) for q in S}, {q: int(np.prod(S[q])) for q in S}, ent


if __name__ == "__main__":
    res = []
    for o in P[lo:hi]:
        t0 = time.time()
        p = o["problem"]
        bl_, sz, ent = analyze(p, o["backward"])
        res.append(dict(idx=o["idx"], name=o["name"], bwd=o["backward"], det=o["det"], desc=p.describe(), problem=p,
                        sizes=sz, blind=bl_, ent=ent, sec=time.time() - t0))
        r = res[-1]
        bl = {q: f"{r['blind'][q] / max(r['sizes'][q], 1):.0%}" for q in sz if r["blind"][q]}
        print(f"{o['idx']:3d} {o['name'][:34]:34s} bwd={int(o['backward'])} {time.time()-t0:5.1f}s blind={bl} | {p.describe()[:150]}", flush=True)
        for e in ent:
            print(f"      {e['issue']:36s} {e['q']:5s} cfg {e['cfg']}/{e['n']} model={e['kind']:5s} unjudged={e['unjudged']} "
                  f"{e['note']}" + (f" slack/med={e['slack_over_median']:.3g} slack_share={e['slack_share']:.2g}" if e['kind'] == 'array' else ""), flush=True)
    pickle.dump(res, open(f"absorb_{lo}_{hi}.pkl", "wb"))
