"""Float64 models of documented FA4 defects: what FA4 computes where a known issue applies, so the
issue absorbs only the values its defect explains (Note [Known issues with a model]).

Note [Known issues with a model]
--------------------------------
A known issue that absorbs whole tensors of a configuration hides any other fault there (red-team
round 12: a score_mod_bwd handed the wrong head under GQA, inside a configuration the issue
absorbed wholesale). Where the defect
is specified well enough to compute, :class:`fa4verify.fuzz.known_issues.KnownIssue` carries a
``model``: the gradients FA4 computes under the defect, in float64, from the example's own inputs
(and the pass's dO and dLSE). A gradient violation of the issue's configuration is absorbed only
where the kernel's value lies within the example's allowance (oracle bound + budget of the right
problem) plus :data:`MODEL_SLACK` of the model tensor's largest magnitude (a float64
recomputation; a model that maps the oracle's own values -- the misread accumulator -- maps their
allowances too and takes no slack);
an element outside it is reported as a violation outside the issue's model. The model is float64
without an error bound of its own: the slack covers FA4's rounding on the defective path (its
agreement with the score-index model was measured to 4.2e-3 of the largest magnitude on the H200,
2026-12-02), and is far below the O(1) changes a different defect makes. An element the model
cannot say (a read past an aux tensor: unknown memory) is NaN there and absorbed. Where a model
does not reach a problem (it returns None: say, the misread maps on a block-sparse call) the issue
absorbs by its configuration rule as before, and the hit says so (``known_model: none``). Violations the model
does not judge (the dQ accumulator tap, bitwise repeats) keep the configuration rule.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

import numpy as np

from fa4verify.problem import AttentionProblem

#: the model's own slack, as a fraction of the model tensor's largest finite magnitude
MODEL_SLACK = 2.0 ** -7

#: ``score(b, h, rows, x) -> (y, dy/dx)`` for the rows ``rows`` (sequence positions) of head ``h``
ScoreFn = Callable[[int, int, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def _plain_score(problem: AttentionProblem, a: Mapping[str, Any]) -> Optional[ScoreFn]:
    """The right score transform of ``problem`` (its score pair at the true indices, else softcap,
    else the identity); None where a model would need more (a score pair with softcap: FA4 refuses)."""
    score = problem.mod_pairs()[0] if problem.mods else None
    if score is not None:
        from fa4verify import mods
        aux = mods.aux_for(problem, score, a)

        def f(b, h, rows, x):
            qi, ki = rows[:, None], np.arange(x.shape[1])[None, :]
            return (np.broadcast_to(np.asarray(score.ref(x.copy(), b, h, qi, ki, aux), np.float64), x.shape),
                    np.broadcast_to(np.asarray(score.grad(x.copy(), b, h, qi, ki, aux), np.float64), x.shape))
        return f
    if problem.softcap:
        cap = float(problem.softcap)

        def f(b, h, rows, x):
            t = np.tanh(x / cap)
            return cap * t, 1.0 - t * t
        return f
    return lambda b, h, rows, x: (x, np.ones_like(x))


def model_backward(problem: AttentionProblem, a: Mapping[str, Any], dout: np.ndarray, dlse: Optional[np.ndarray], *,
                   keep_fwd: Callable[[int, int], np.ndarray], keep_bwd: Callable[[int, int], np.ndarray],
                   score_fwd: ScoreFn, score_bwd: ScoreFn) -> dict[str, np.ndarray]:
    """dQ, dK, dV (float64, the problem's layouts: dense ``(b, s, h, d)``, varlen ``(t, h, d)``) of
    a backward that recomputes P with ``keep_bwd`` and ``score_bwd`` against the LSE and O of a
    forward with ``keep_fwd`` and ``score_fwd`` (FA4's backward takes both from its forward): ``P'
    = exp(y' - LSE)`` on ``keep_bwd`` (LSE 0 where the forward kept nothing, as FA4's preprocess
    hands it), ``D = rowsum(dO * O) - dLSE``, ``dS = P' (dP - D) y'``, ``dQ
    = scale dS K``, ``dK = scale dS^T Q``, ``dV = P'^T dO``; a learnable sink joins the forward's
    normaliser (``LSE = log(sum exp(y) + exp(sink_h))``, natural units, as the oracle's). Per batch
    entry or varlen sequence (``b``: its index, positions sequence-local, as FA4 hands them to the
    mods): ``keep_*(b, h)``: bool ``(len_q, len_k)``; ``score_*(b, h, rows, x)``: the transform and
    its derivative at the scaled scores ``x`` (NaN rows: unknown)."""
    q, k, v = (np.asarray(a[n], np.float64) for n in ("q", "k", "v"))
    do = np.asarray(dout, np.float64)
    dl = None if dlse is None else np.asarray(dlse, np.float64)
    sink = np.asarray(a["learnable_sink"], np.float64) if problem.sink else None
    g = problem.nheads // problem.nheads_kv
    sc = problem.scale
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for b, (q0, lq, k0, lk) in enumerate(problem._seq_bounds()):
        if problem.varlen:        # views of sequence b on the token axis (t, h, d); LSE (h, t)
            qs, dos, dqs = (x[q0:q0 + lq] for x in (q, do, dq))
            ks, vs, dks, dvs = (x[k0:k0 + lk] for x in (k, v, dk, dv))
            dls = None if dl is None else dl[:, q0:q0 + lq]
        else:
            qs, dos, dqs, ks, vs, dks, dvs = (x[b] for x in (q, do, dq, k, v, dk, dv))
            dls = None if dl is None else dl[b]
        rows = np.arange(lq)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            for h in range(problem.nheads):
                hk = h // g
                x = qs[:, h] @ ks[:, hk].T * sc
                kf, kb = keep_fwd(b, h), keep_bwd(b, h)
                y, _ = score_fwd(b, h, rows, x)
                y = np.where(kf, y, -np.inf)
                m = np.max(y, axis=1, keepdims=True) if lk else np.full((lq, 1), -np.inf)
                if sink is not None:
                    m = np.maximum(m, sink[h])
                m = np.where(np.isfinite(m), m, 0.0)
                s = np.sum(np.exp(y - m), axis=1, keepdims=True)
                if sink is not None:
                    s = s + np.exp(sink[h] - m)
                lse = np.where(s > 0, m + np.log(s), -np.inf)
                p = np.where(kf, np.exp(y - lse), 0.0)
                o = p @ vs[:, hk]
                yb, fp = score_bwd(b, h, rows, x)
                # FA4's preprocess hands the backward LSE = 0 for a row the forward kept nothing of
                # (flash_bwd_preprocess.py: ``lse * LOG2_E if lse != -inf else 0.0``): P = exp(y')
                # on the keys the backward keeps, none where both masks agree
                pb = np.where(kb, np.exp(yb - np.where(lse == -np.inf, 0.0, lse)), 0.0)
                dp = dos[:, h] @ vs[:, hk].T
                d = np.sum(dos[:, h] * o, axis=-1)
                if dls is not None:
                    d = d - dls[h]
                ds = np.where(kb, pb * (dp - d[:, None]) * fp, 0.0)
                ds = np.where(np.isnan(pb) | np.isnan(fp), np.nan, ds)
                # Note [A defect's overflow]: where a wrong P' or dS' reaches fp32's range FA4's
                # arithmetic overflows (exp2 of >= 128, products and sums past 2^128) and gives inf
                # or NaN in what they reach; float64 keeps a finite value up to 1e308. Unknown there
                # (measured on an H100, 2026-12-07: the score-index defect on outlier values gave
                # dQ = -inf where this model gave 9.1e44, and where it gave 0 from a huge P times 0)
                big = kb & ((pb >= _FP32_EDGE) | (np.abs(ds) >= _FP32_EDGE))
                aq, ak, av = np.abs(qs[:, h]), np.abs(ks[:, hk]), np.abs(dos[:, h])
                dq_h = sc * ds @ ks[:, hk]
                dq_h[(sc * np.abs(ds) @ ak >= _FP32_EDGE) | big.any(axis=1)[:, None]] = np.nan
                dk_h = sc * ds.T @ qs[:, h]
                dk_h[(sc * np.abs(ds).T @ aq >= _FP32_EDGE) | big.any(axis=0)[:, None]] = np.nan
                dv_h = pb.T @ dos[:, h]
                dv_h[(np.abs(pb).T @ av >= _FP32_EDGE) | (kb & (pb >= _FP32_EDGE)).any(axis=0)[:, None]] = np.nan
                dqs[:, h] = dq_h
                dks[:, hk] += dk_h
                dvs[:, hk] += dv_h
    return {"dq": dq, "dk": dk, "dv": dv}


#: Note [A defect's overflow]: the magnitude from which a defect's fp32 quantities may overflow in
#: FA4 (2^126: a sum of terms each below it, and below it together, stays below fp32's 2^128 in
#: any order of fp32 adds, with bf16 casts of dS on the way)
_FP32_EDGE = 2.0 ** 126


def _keeps(problem: AttentionProblem, a: Mapping[str, Any]) -> Callable[[int, int], np.ndarray]:
    cache: dict[int, list] = {}

    def keep(b, h):
        hh = h if problem.heads_differ else 0
        if hh not in cache:
            cache[hh] = problem.keep_masks(a, head=hh)
        return cache[hh][b]
    return keep


def mask_mod_causal(problem: AttentionProblem, a: Mapping[str, Any], dout: np.ndarray,
                    dlse: Optional[np.ndarray]) -> Optional[dict[str, np.ndarray]]:
    """Known issue ``mask_mod_causal_bwd``: the forward keeps the mask pair's pattern alone (FA4
    drops ``causal`` for a mask_mod), the backward recomputes P with FA4's causal mask alone
    (bottom-right aligned: key ``j`` of row ``i`` kept iff ``j <= i + seqlen_k - seqlen_q``, with a
    varlen call's lengths per sequence) -- its element mask takes the causal branch before the
    mask_mod branch (``mask.py`` ``apply_mask``: ``elif not mask_causal and not mask_local and
    mask_mod is not None``; the same in ``apply_mask_sm100``) -- against the forward's LSE and O
    (a learnable sink in it). None without ``CallForm.mask_causal`` (or with block sparsity, which
    that form does not take)."""
    if problem.call is None or not problem.call.mask_causal or problem.call.block_size is not None:
        return None
    score = _plain_score(problem, a)

    def causal(b, h):
        _, lq, _, lk = bounds[b]
        return np.arange(lk)[None, :] <= np.arange(lq)[:, None] + lk - lq
    bounds = problem._seq_bounds()
    return model_backward(problem, a, dout, dlse, keep_fwd=_keeps(problem, a), keep_bwd=causal,
                          score_fwd=score, score_bwd=score)


def head_mapped_score(problem: AttentionProblem, a: Mapping[str, Any], head_of: Callable[[int, int], int],
                      unknown: float = np.nan) -> ScoreFn:
    """The problem's score pair as a backward that hands row ``r`` of head ``h`` the pair as row
    ``r // g`` of head ``head_of(h, r)`` (``g`` query heads per KV head); a row whose head lies past
    the pair's aux tensors reads ``unknown`` (NaN: unknown memory)."""
    from fa4verify import mods
    score = problem.mod_pairs()[0]
    aux = mods.aux_for(problem, score, a)
    g = problem.nheads // problem.nheads_kv

    def mapped(b, h, rows, x):
        y, fp = np.empty_like(x), np.empty_like(x)
        ki = np.arange(x.shape[1])[None, :]
        for r in rows:
            hh, qq = head_of(h, int(r)), np.array([[int(r) // g]])
            try:
                y[r] = np.broadcast_to(np.asarray(score.ref(x[r:r + 1].copy(), b, hh, qq, ki, aux), np.float64),
                                       (1, x.shape[1]))
                fp[r] = np.broadcast_to(np.asarray(score.grad(x[r:r + 1].copy(), b, hh, qq, ki, aux), np.float64),
                                        (1, x.shape[1]))
            except IndexError:
                y[r] = fp[r] = unknown
        return y, fp
    return mapped


def score_mod_gqa_indices(problem: AttentionProblem, a: Mapping[str, Any], dout: np.ndarray,
                          dlse: Optional[np.ndarray]) -> Optional[dict[str, np.ndarray]]:
    """Known issue ``sm90_score_mod_gqa_bwd_indices``: the forward is right; the backward's S
    recomputation and score_mod_bwd see row ``r`` of head ``h`` as row ``r // g`` of head
    ``h * g + r % g`` (masks at the true indices); a row whose mapped head lies past the pair's aux
    tensors is unknown (NaN). On a varlen call ``r`` is the sequence-local row FA4 hands the mods
    (its SM90 backward indexes each sequence from 0; ``r // g`` stays below the sequence's length,
    so the aux wrap by its length changes nothing); a learnable sink joins the forward's LSE. The
    float64 model measured against FA4 on the H200 (2026-12-02, scripts/gpu_triage_mods.py):
    dQ/dK/dV within 4.2e-3/2.8e-3/2.7e-3 of its largest magnitude, dense calls. None with softcap
    (FA4 refuses a score_mod with it)."""
    score = problem.mod_pairs()[0] if problem.mods else None
    if problem.softcap or score is None:
        return None
    g = problem.nheads // problem.nheads_kv
    mapped = head_mapped_score(problem, a, lambda h, r: h * g + r % g)
    keep = _keeps(problem, a)
    return model_backward(problem, a, dout, dlse, keep_fwd=keep, keep_bwd=keep,
                          score_fwd=_plain_score(problem, a), score_bwd=mapped)


#: the log2 units around FA4's overflow exponent (128) inside which a row's sink fold may go
#: either way: the fp32 rounding of its exponent and of FA4's row max (bf16-level logits)
SINK_EDGE = 0.5


def sink_overflow(problem: AttentionProblem, a: Mapping[str, Any], dout: Optional[np.ndarray],
                  dlse: Optional[np.ndarray]) -> Optional[dict[str, np.ndarray]]:
    """Known issue ``sink_rowsum_overflow``: where a row's sink fold exponent ``sink*log2e -
    row_max*scale_log2 + max_offset`` reaches 128 the fold overflows fp32, so its LSE is +inf and O
    is 0 exactly; the backward then recomputes ``P = exp2(S - inf) = 0`` for that row and takes
    ``D = rowsum(dO * 0)``, so the row gives nothing to dK and dV and its dQ is 0: the oracle's
    gradients with that row's dO (and dLSE) set to zero. A row within :data:`SINK_EDGE` of the
    edge (or within SM100's lazy-rescale lag below it) may go either way: its LSE is unknown there
    (NaN: absorbed), while its O and gradients are modelled as overflowed -- the other outcome
    differs from them by ``2^-(gap)`` of the row's magnitudes, below 2^-119 (red-team round 17:
    1.4e-37 at most on the seed-0 plan), far inside any allowance, so an unrelated fault in those
    rows or in their KV heads' dK / dV stays judged (unless nothing else is left: a model of zeros
    gives no slack, and those rows are unknown with their reach). Every other row is the oracle's (an H100 run of
    the plan's sink rows at 2026-12-06 found rows between 126 and 128 log2 units finite, which the
    configuration rule's band had counted in). dsink is not modelled (the two outcomes give it the
    row's dLSE or nothing). With no row at the edge the model is the oracle. None on a split-KV call."""
    from fa4verify import judge
    from fa4verify.fuzz.known_issues import _token_bounds, sink_gap
    if not problem.sink or (problem.call is not None and problem.call.split_kv):
        return None
    gap, kc = sink_gap(problem, a)
    edge = 128.0 - float(kc.max_offset)
    with np.errstate(invalid="ignore"):
        over = np.isfinite(gap) & (gap >= edge + SINK_EDGE)
        maybe = np.isfinite(gap) & ~over & (gap >= edge - SINK_EDGE - float(kc.rescale_threshold))
    # no row at the edge: every row is the oracle's (the rule's wider band counts rows in which no
    # fold overflows: the model judges them, never absorbs them unjudged; red-team review)
    fw = judge.oracle_forward(problem, a)
    out, lse = np.array(fw.out, np.float64), np.array(fw.lse, np.float64)
    tq = gap.shape[0]

    def rows_of(x, mask, value):          # x in (token, head, ...) view: dense (b, s, h, d), varlen (t, h, d)
        v = x.reshape((tq,) + x.shape[-2:])
        v[mask] = value
        return v.reshape(x.shape)

    def lse_of(x, mask, value):           # LSE: varlen (h, t), dense (b, h, s)
        tok, head = np.nonzero(mask)
        if problem.varlen:
            x[head, tok] = value
        else:
            x[tok // problem.seqlen_q, head, tok % problem.seqlen_q] = value
        return x

    gone = over | maybe                   # O and the gradients: as overflowed (the other outcome differs by < 2^-119)
    out = rows_of(out, gone, 0.0)
    # where nothing else is left the model is 0 throughout and gives no slack (outside_model): the
    # tiny values of a near-edge row FA4 did not overflow are then unknown, with their reach
    blind = maybe if maybe.any() and not np.any(out) else np.zeros_like(maybe)
    out = rows_of(out, blind, np.nan)
    lse = lse_of(lse_of(lse, over, np.inf), maybe, np.nan)
    res = {"out": out, "lse": lse}
    if dout is None:
        return res
    do = rows_of(np.array(dout, np.float64), gone, 0.0)
    dl = None if dlse is None else lse_of(np.array(dlse, np.float64), gone, 0.0)
    ob = judge.oracle_backward(problem, dict(a, dout=do.astype(np.float32)),
                               dlse=None if dl is None else dl.astype(np.float32))
    grads = {n: np.asarray(getattr(ob, n), np.float64).copy() for n in ("dq", "dk", "dv")}
    if blind.any():
        grads["dq"] = rows_of(grads["dq"], blind, np.nan)
        g = problem.nheads // problem.nheads_kv
        for q0, lq, k0, lk in _token_bounds(problem):
            for hk in range(problem.nheads_kv):
                if blind[q0:q0 + lq, hk * g:(hk + 1) * g].any():
                    for n in ("dk", "dv"):
                        grads[n].reshape((-1,) + grads[n].shape[-2:])[k0:k0 + lk, hk] = np.nan
    res.update(grads)
    return res


def _misread_map(problem: AttentionProblem, rows: str) -> Optional[Callable]:
    """Note [The misread accumulator] as a map of (values, allowances) of the tensor whose rows are
    ``rows`` ("q": dQ, the M tile; "k": GQA dK / dV, the N tile), on SM90 where the pinned roundings
    differ (plain path); None with batched or used-length Q/K, block sparsity, hd != hdv, or where
    they agree."""
    from fa4verify.kernels import facts, fa4_params
    from fa4verify.problem import resolve_window
    call = problem.call
    if call is not None:
        other = ((call.q_batched or call.seqused_q) if rows == "q"
                 else (call.seqused_k or call.kv_packed or call.page_size is not None))
        if other or call.block_size is not None:
            return None
    if problem.arch != "sm90" or problem.head_dim_v != problem.head_dim:
        return None
    causal, local, _, _ = resolve_window(problem.causal, problem.window_size)
    r = fa4_params.sm90_dq_accum_mismatch(problem.head_dim, problem.head_dim_v, causal=bool(causal), local=bool(local))
    if not (r.get("mismatch") and r.get("pinned_mismatch")) or r.get("dKV_swapAB"):
        return None
    tiles = facts.sm90_bwd_tile(problem.head_dim, problem.head_dim_v, bool(causal), bool(local))
    tile = tiles[0] if rows == "q" else tiles[1]
    if tile % 64:
        return None
    bounds = problem._seq_bounds()
    lens = [lq if rows == "q" else lk for _, lq, _, lk in bounds]
    src = fa4_params.sm90_accum_misread(lens, problem.head_dim, tile, packed=problem.varlen)
    # token offsets of each sequence on the (token, head, col) view: dense (b, s, h, d) is flattened
    per = problem.seqlen_q if rows == "q" else problem.seqlen_k
    start = np.array([(q0 if rows == "q" else k0) for q0, _, k0, _ in bounds] if problem.varlen
                     else [b * per for b in range(problem.batch)], np.int64)
    dst_t, dst_c, src_t, src_c = [], [], [], []
    for b, s_ in enumerate(src):
        rr, cc = np.nonzero(s_[..., 0] >= 0)
        hit = s_[rr, cc]
        dst_t.append(start[b] + rr)
        dst_c.append(cc)
        src_t.append(start[hit[:, 0]] + hit[:, 1])
        src_c.append(hit[:, 2])
    dst_t, dst_c, src_t, src_c = (np.concatenate(x) if x else np.zeros(0, np.int64)
                                  for x in (dst_t, dst_c, src_t, src_c))

    def gather(ref: np.ndarray, allow: np.ndarray, unwritten: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """``ref`` and ``allow`` as FA4's postprocess returns them; ``unwritten``: the value where
        the read lands on the zeroed buffer or a padded row or column (0: padded rows and columns
        add 0 exactly; NaN, unknown, for a defect's accumulator whose padding is not modelled)."""
        shape = ref.shape
        x = ref.reshape((-1,) + shape[-2:])
        t = np.asarray(allow, np.float64).reshape((-1,) + shape[-2:])
        # the element's own allowance is kept where the read lands on zeros, as a hedge on that claim
        v, w = np.full_like(x, 0.0 if np.isnan(unwritten) else unwritten), t.copy()
        if np.isnan(unwritten):
            # unknown only in the (sequence, head) blocks whose own values hold an unknown (Note [A
            # defect's overflow]: an overflowing row's padded columns are inf * 0); a read landing in
            # another block's padding is then modelled 0 -- a false alarm, never a false pass
            for b, n in enumerate(lens):
                blk = slice(int(start[b]), int(start[b]) + int(n))
                heads = np.isnan(x[blk]).any(axis=(0, 2))
                v[blk, heads] = np.nan
        v[dst_t, :, dst_c] = x[src_t, :, src_c]
        w[dst_t, :, dst_c] = t[src_t, :, src_c]
        return v.reshape(shape), w.reshape(shape)
    return gather


def sm90_dq_misread(problem: AttentionProblem, a: Mapping[str, Any], dout: Optional[np.ndarray],
                    dlse: Optional[np.ndarray]) -> Optional[dict[str, Any]]:
    """Known issue ``sm90_dq_accum_hdim_rounding``: FA4's postprocess returns at each dQ element
    the true accumulator element Note [The misread accumulator] names
    (:func:`fa4verify.kernels.fa4_params.sm90_accum_misread`), or 0 where it reads memory never
    written: the model is that map of the oracle's dQ, with the allowance of the element read
    (its own rounding), and 0 within the element's own allowance where FA4 reads the zeroed buffer.
    Checked against the H200's recorded dQ of ``tests/regressions/bwd_budget-twin-ftz-floor.json``
    (dq[1, 72, 0, 3] = -27.75, the twin's value of the element the map names; the largest error
    3232 both there and in the model), and on an H100 (2026-12-06) for 58 violations of 17 plan
    calls. Dense and packed varlen calls at the pinned tiles of 64 rows or more; None with batched
    or used-length Q/K, block sparsity, or where the pinned roundings agree."""
    m = _misread_map(problem, "q")
    return None if m is None else {"dq": m}


def sm90_dkv_misread(problem: AttentionProblem, a: Mapping[str, Any], dout: Optional[np.ndarray],
                     dlse: Optional[np.ndarray]) -> Optional[dict[str, Any]]:
    """Known issue ``sm90_gqa_dkdv_accum_hdim_rounding``: with GQA FA4 sums dK and dV of a group in
    fp32 accumulators laid out like dQ's over the keys (N tile; flash_bwd_sm90.py's dKV accumulator
    epilogue, the same postprocess), so the returned dK / dV are the same map of the true sums
    (docs/results/dq_misread/, section 6). Measured on an H100 (2026-12-06, coverage.production at
    35451e8): within at 45 violations of 7 plan calls; outside where the score-index defect changed
    the sums (the judge now maps that defect's dK / dV: :func:`fa4verify.fuzz.known_issues._within_model`)
    and in one call with used-length Q, an empty Q sequence and a learnable sink, unexplained: None
    with either (the configuration rule absorbs, and says no model judged it; Note [Judged siblings]
    plans a sibling), as with used-length or paged K/V, block sparsity and hd != hdv
    (:func:`_misread_map`)."""
    if (problem.nheads_kv >= problem.nheads or (problem.call is not None and problem.call.seqused_q)
            or (problem.varlen and 0 in problem.seqlens_q)):
        return None
    m = _misread_map(problem, "k")
    return None if m is None else {"dk": m, "dv": m}


def outside_model(actual: np.ndarray, model: np.ndarray, allow: np.ndarray, slack: float = MODEL_SLACK) -> np.ndarray:
    """Bool mask: elements of ``actual`` outside ``model`` +- (``allow`` + ``slack`` x the model's
    largest finite magnitude); a NaN of the model (unknown) is never outside, a non-finite kernel
    value where the model is finite always is. ``slack``: :data:`MODEL_SLACK` for a float64
    recomputation, 0 for a map of the oracle's own values and allowances (the misread accumulator:
    each element is another element's, within that element's allowance)."""
    model = np.asarray(model, np.float64)
    actual = np.broadcast_to(np.asarray(actual, np.float64), model.shape)
    fin = np.isfinite(model)
    top = float(np.max(np.abs(model[fin]))) if fin.any() else 0.0
    tol = np.broadcast_to(np.asarray(allow, np.float64), model.shape) + slack * top
    with np.errstate(invalid="ignore"):
        inside = (np.abs(actual - model) <= tol) | (actual == model)     # == : an infinite model value
    return ~np.isnan(model) & (~inside | (fin & ~np.isfinite(actual)))
