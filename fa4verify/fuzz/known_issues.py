"""Known FA4 issues: documented accuracy problems of FA4 itself, each with the predicate that
decides whether a fuzz violation is exactly that issue's (docs/fuzzing.md)."""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Callable, Mapping, Optional

import numpy as np

from fa4verify.problem import AttentionProblem
from fa4verify.fuzz import defect_models
from fa4verify.fuzz.violation import Violation

@dataclasses.dataclass(frozen=True)
class KnownIssue:
    """A documented accuracy problem of FA4 itself (reproduced by the twin). A campaign records a
    violation that matches a known issue (``known_hits``) and keeps going instead of stopping on
    it; ``strict_known=True`` makes it a failure like any other."""
    name: str
    title: str
    reference: str
    applies: Callable[[AttentionProblem, Mapping[str, Any], "Violation"], bool]
    targets: tuple[str, ...] = ("twin", "production")
    #: Note [Known issues with a model] (fa4verify/fuzz/defect_models.py): ``model(problem, a,
    #: dout, dlse)`` -> the gradients FA4 computes under the defect (float64), or None where the
    #: model does not reach the problem; a gradient violation is then absorbed only within it
    model: Optional[Callable[..., Optional[dict]]] = None
    #: the elements the defect reaches, computed from the call: ``names(problem, a, v)`` -> a bool
    #: per row of ``v.over_indices`` (None where ``v`` is not of the defect's kind). ``applies`` is
    #: then :func:`_names_all` of it: the issue takes a violation only where it names every
    #: offending element (no model of the values there: FA4's are undefined or not modelled; its
    #: hits say so, ``known_model: elements``), and it may take its elements out of a violation
    #: another issue explains the rest of (Note [Two defects in one violation])
    names: Optional[Callable[..., Optional[np.ndarray]]] = None


def sink_gap(problem: AttentionProblem, a: Mapping[str, Any]) -> tuple[np.ndarray, Any]:
    """Float (token, head) array: how far each row's sink lies above its largest visible logit, in
    log2 units (``-inf`` for a row with no key; NaN without a sink), and the forward kernel's
    constants (its ``max_offset`` and ``rescale_threshold``). FA4's sink fold computes
    ``exp2(sink*log2e - row_max*scale_log2)`` (plus ``max_offset``), which overflows fp32 once the
    exponent reaches 128. Note [Split-KV as a call form]: a split call folds the sink in its first
    split, against the running max of that split's keys alone."""
    from fa4verify.judge.attention import effective_inputs
    from fa4verify.kernels import facts
    tq = sum(lq for _, lq, _, _ in _token_bounds(problem))
    kc = facts.kernel_constants(problem.arch, problem.dtype, problem.head_dim, problem.head_dim_v,
                                bool(problem.causal), problem.local)
    gap = np.full((tq, problem.nheads), np.nan)
    if not problem.sink:
        return gap, kc
    a = effective_inputs(problem, a)       # Note [FP8 descales]: the logits of the descaled inputs
    sink = np.asarray(a["learnable_sink"], np.float64)
    q = np.asarray(a["q"], np.float64)
    k = np.asarray(a["k"], np.float64)
    q, k = q.reshape((-1,) + q.shape[-2:]), k.reshape((-1,) + k.shape[-2:])
    g = problem.nheads // problem.nheads_kv
    per = {h: problem.keep_masks(head=h) for h in (range(problem.nheads) if problem.heads_differ else (0,))}
    first = None
    if problem.call is not None and problem.call.split_kv:
        from fa4verify.targets import split_kv_ranges
        first = split_kv_ranges(problem)[0]
    for i, (q0, lq, k0, lk) in enumerate(_token_bounds(problem)):
        if lq == 0:
            continue
        if lk == 0:
            gap[q0:q0 + lq] = -np.inf
            continue
        for h in range(problem.nheads):
            keep = per[h if problem.heads_differ else 0][i]
            if first is not None:
                keep = keep & (np.arange(lk) >= first[0]) & (np.arange(lk) < first[1])
            y = (q[q0:q0 + lq, h] @ k[k0:k0 + lk, h // g].T) * problem.scale
            if problem.softcap > 0:
                y = problem.softcap * np.tanh(y / problem.softcap)
            m = np.max(np.where(keep, y, -np.inf), axis=1)
            with np.errstate(invalid="ignore"):
                gap[q0:q0 + lq, h] = np.where(np.isfinite(m), (sink[h] - m) * math.log2(math.e), -np.inf)
    return gap, kc


def _sink_overflow_rows(problem: AttentionProblem, a: Mapping[str, Any], *, lag: bool = True) -> np.ndarray:
    """Boolean (token, head) array: rows whose sink exceeds the largest visible logit by >= 126
    log2 units (less FA4's ``max_offset``, 8 for fp8 on SM100), where ``exp2(sink*log2e - row_max*scale_log2)`` in FA4's sink fold overflows fp32.
    FA4's ``row_max`` there is its running max, which SM100's lazy rescale leaves up to the
    rescale threshold below the largest logit (``facts.kernel_constants``: 8 log2 units for 16-bit
    inputs, 0 on SM90 and on the dedicated SM100 hd-256 forward of 4.0.0b20..b33): the band is widened by that lag (found by the
    twin on the plan's varlen block-sparse rows with sinks and negative scores: LSE = +inf at a
    gap of 121.8 log2 units). ``lag=False``: the band of an exact running max (126 log2 units).
    A superset: FA4 overflows only where the exponent reaches 128 (measured on an H100, 2026-12-06:
    plan row 17's row (0, 0, 6) inside this band kept a finite LSE; :func:`sink_gap`)."""
    gap, kc = sink_gap(problem, a)
    band = 126.0 - float(kc.max_offset) - (kc.rescale_threshold if lag else 0.0)
    with np.errstate(invalid="ignore"):
        return np.isfinite(gap) & (gap >= band)


def _sink_overflow(problem: AttentionProblem, a: Mapping[str, Any], v: "Violation") -> bool:
    """True when the violation is explained by sink-fold overflow: some row overflows, and (for a
    budget comparison) every over element of O, LSE or dQ lies in an overflowing (token, head) row;
    dK/dV/dsink elements lie in a KV head whose query group has an overflowing row in the same
    sequence (the bad row's gradient reaches every key it sees). A violation without element
    indices is explained only by a row past the band of an exact running max: the running max's
    lag widens the band only where the violation's elements can be checked against it."""
    if not problem.sink or v.prop not in ("finite", "fwd_budget", "bwd_budget", "key_permutation",
                                          "batch_invariance", "gqa_repeat"):
        return False
    rows = _sink_overflow_rows(problem, a)
    if not rows.any():
        return False
    idx = v.over_indices
    q = str(v.metrics.get("quantity", ""))
    if idx is None or not len(idx) or q not in ("out", "lse", "dq", "dk", "dv", "partial_out", "partial_lse",
                                                 "combine_out", "combine_lse"):
        # non-finite values: the overflow's LSE = +inf
        return v.prop == "finite" and bool(_sink_overflow_rows(problem, a, lag=False).any())
    idx = np.asarray(idx)
    varlen = problem.varlen
    if q == "lse":                     # (b, h, s) dense, (h, t) varlen
        tok = idx[:, 1] if varlen else idx[:, 0] * problem.seqlen_q + idx[:, 2]
        head = idx[:, 0] if varlen else idx[:, 1]
        return bool(rows[tok, head].all())
    if q.startswith("partial_") and v.metrics.get("split") != 0:
        return False                   # the sink folds in the first split only
    if q in ("partial_lse", "combine_lse"):     # a split call's (b, s, h): dense only
        tok, head = idx[:, 0] * problem.seqlen_q + idx[:, 1], idx[:, 2]
        return bool(rows[tok, head].all())
    if q in ("out", "dq", "partial_out", "combine_out"):   # (b, s, h, d) dense, (t, h, d) varlen
        tok = idx[:, 0] if varlen else idx[:, 0] * problem.seqlen_q + idx[:, 1]
        head = idx[:, 1] if varlen else idx[:, 2]
        return bool(rows[tok, head].all())
    # dk / dv: (b, s_k, hk, d) dense, (t_k, hk, d) varlen
    g = problem.nheads // problem.nheads_kv
    bounds = _token_bounds(problem)
    ktok = idx[:, 0] if varlen else idx[:, 0] * problem.seqlen_k + idx[:, 1]
    hk = idx[:, 1] if varlen else idx[:, 2]
    for t, h in zip(ktok, hk):
        seg = next(i for i, (_, _, k0, lk) in enumerate(bounds) if k0 <= t < k0 + lk)
        q0, lq = bounds[seg][0], bounds[seg][1]
        if not rows[q0:q0 + lq, h * g:(h + 1) * g].any():
            return False
    return True


def _token_bounds(problem: AttentionProblem) -> list[tuple[int, int, int, int]]:
    """(q_start, q_len, k_start, k_len) per sequence on the token axis of (t, h, d) arrays; dense
    problems are flattened batch-major."""
    if problem.varlen:
        return problem._seq_bounds()
    return [(b * problem.seqlen_q, problem.seqlen_q, b * problem.seqlen_k, problem.seqlen_k)
            for b in range(problem.batch)]


def _sm90_dq_accum(problem: AttentionProblem, a: Mapping[str, Any], v: "Violation") -> bool:
    """True when the violation is in dQ and FA4's SM90 backward writes and reads its dQ
    accumulator with different head-dim roundings for this problem (predicted from the installed
    FA4 source by :func:`fa4verify.kernels.fa4_params.sm90_dq_accum_mismatch`, and by the pinned
    release's roundings: Note [Pinned roundings])."""
    if problem.arch != "sm90" or v.prop not in ("bwd_budget", "masked_rows", "finite", "bwd_stages"):
        return False
    quantity = str(v.metrics.get("quantity", ""))
    # the dQ output, or the tapped fp32 accumulator itself (bwd_stages "dq_accum": the main kernel
    # wrote it with the other rounding; measured on the H200, 2026-12-02: 9 of 94 plan rows, all at
    # head dims 8/72/104, all rows >= 64); masked_rows says "dQ != 0 ..." with no quantity
    if quantity not in ("dq", "dq_accum") and not (quantity == "" and v.message.lower().startswith("dq")):
        return False
    from fa4verify.kernels import fa4_params
    local = any(w is not None for w in problem.window_size)
    lens = problem.seqlens_q if problem.varlen else (problem.seqlen_q,)
    # packed q (cu_seqlens_q): FA4's dQ accumulator is packed too and a later sequence's offset is
    # scaled by the mismatched rounding; batched q (q_batched, seqused_q) gets a batched
    # accumulator (interface.py: `if cu_seqlens_q is None`), where each sequence is a batch entry
    call = problem.call
    packed = problem.varlen and not (call is not None and (call.q_batched or call.seqused_q))
    if not fa4_params.sm90_dq_defect_predicted(problem.head_dim, problem.head_dim_v, lens, causal=problem.causal,
                                               local=local, varlen=packed, pinned=True):
        return False
    idx = v.over_indices
    if idx is None or not len(idx):
        return True
    # only dQ rows past the first SM90_DQ_DEFECT_GOOD_ROWS of a sequence are wrong (measured)
    good = fa4_params.SM90_DQ_DEFECT_GOOD_ROWS
    idx = np.asarray(idx)
    if problem.varlen:
        starts = np.array([q0 for q0, _, _, _ in problem._seq_bounds()])
        tok = idx[:, 0]
        seq = np.searchsorted(starts, tok, side="right") - 1
        row = tok - starts[seq]
        if not packed:                    # batched: only rows past the first `good` of their entry
            return bool((row >= good).all())
        # varlen: rows past the first `good` of a sequence, and every row of a sequence after the
        # first (its accumulator offset is scaled by the mismatched rounding too). MEASURED on the
        # H200 in session 5: fuzz.production drew q lens [65, 1] at hd 8, dQ wrong at token 64
        # (row 64 of sequence 0) and token 65 (row 0 of sequence 1);
        # docs/results/h200_session5/tdefault/
        return bool(((row >= good) | (seq >= 1)).all())
    row = idx[:, 1]
    return bool((row >= good).all())


def _split_sink_without_keys(problem: AttentionProblem, a: Mapping[str, Any], v: "Violation") -> bool:
    """True for a split-KV call with a learnable sink whose query tile owns no KV block in any
    split (a left window past every key: FA4's ``n_block_min >= n_block_max``), judged on its LSE:
    FA4's first split has no work there and its epilogue folds the sink only into a split with
    work, so the merged LSE is -inf where the sink alone gives it (O = 0 either way)."""
    if (problem.call is None or problem.call.num_splits == 1 or not problem.sink
            or v.prop not in ("finite", "fwd_budget") or v.metrics.get("quantity") != "lse"):
        return False
    from fa4verify.targets import split_kv_ranges
    try:
        ranges = split_kv_ranges(problem)
    except ValueError:
        return False
    return len(ranges) > 1 and all(k1 == k0 for k0, k1 in ranges)     # one range: FA4 ran it unsplit


def _sm90_bwd_compile(problem: AttentionProblem, a: Mapping[str, Any], v: "Violation") -> bool:
    """True for the SM90 backward compile failure seen at head dims 104 and 112 (non-causal, FA4's
    tile m=80): CuTe DSL raises "failed to partition ... with tiled_mma" for a head dim FA4's
    interface accepts. Only where the measurement was: no causal mask and no window (the window
    resolved as FA4 does), the pinned tile m 80 (:func:`fa4verify.kernels.facts.bwd_tile`, not
    FA4's own function, which a release or a fault may move); a causal or local call at these
    head dims (tile m 64) builds today and its failure is not this issue."""
    if not (problem.arch == "sm90" and v.prop == "runs" and problem.head_dim in (104, 112)
            and "failed to partition" in v.message):
        return False
    from fa4verify.kernels.facts import bwd_tile
    from fa4verify.problem import resolve_window
    r_causal, r_local, _, _ = resolve_window(problem.causal, problem.window_size)
    return not r_causal and not r_local and bwd_tile("sm90", problem.head_dim, problem.head_dim_v, False, False)[0] == 80


def _sm90_split_auto_refused(problem: AttentionProblem, a: Mapping[str, Any], v: "Violation") -> bool:
    """True where a ``num_splits=0`` call on SM90 fails with FA4's own split-KV refusal (Note
    [Split-KV by FA4's heuristic]): its heuristic picked a count over 1, which its SM90 forward
    asserts against (the message says so); any other failure of the call is not this issue."""
    return (problem.arch == "sm90" and v.prop == "runs" and problem.call is not None
            and problem.call.num_splits == 0 and "SplitKV not supported on SM 9.0" in v.message)


#: the (head_dim, head_dim_v) pairs whose SM90 MHA backward was measured not to launch (H200,
#: 6f502c4): another pair is not this issue until measured (a compile-only run names it: Note
#: [Launch limits, compile-only])
SM90_BWD_SMEM_OVER = frozenset({(64, 128), (128, 256)})

#: FA4 4.0.0b36's SM90 backward tiles at those pairs when the launch failure was measured, without
#: and with causal/local ((m_block, n_block, Q / dO / PdS stages): ``_tile_size_bwd_sm90``)
SM90_BWD_SMEM_OVER_TILES = {(64, 128): ((128, 128, 2, 2, 2), (128, 128, 2, 2, 2)),
                            (128, 256): ((80, 128, 2, 2, 2), (64, 128, 2, 2, 2))}


def sm90_bwd_smem_over_holds(head_dim: int, head_dim_v: int) -> bool:
    """Whether the installed FA4 still picks, at a pair of :data:`SM90_BWD_SMEM_OVER`, the
    backward tiles measured not to launch (a release with other tiles there is not this issue
    until measured; True without FA4: the pinned release's)."""
    if (head_dim, head_dim_v) not in SM90_BWD_SMEM_OVER:
        return False
    from fa4verify.kernels.fa4_params import sm90_bwd_tile_config
    got = tuple(sm90_bwd_tile_config(head_dim, head_dim_v, c, False) for c in (False, True))
    return None in got or got == SM90_BWD_SMEM_OVER_TILES[(head_dim, head_dim_v)]


def _sm90_bwd_hdv_gt_hd_smem(problem: AttentionProblem, a: Mapping[str, Any], v: "Violation") -> bool:
    """True for the launch failure of FA4's SM90 MHA backward at head_dim < head_dim_v (its tile
    chosen by head_dim alone needs more shared memory than a block may use): CUDA rejects the
    launch configuration (cudaErrorInvalidValue). Only while the installed FA4 picks the tiles
    measured there (:func:`sm90_bwd_smem_over_holds`)."""
    return (problem.arch == "sm90" and v.prop == "runs"
            and (problem.head_dim, problem.head_dim_v) in SM90_BWD_SMEM_OVER
            and problem.nheads == problem.nheads_kv
            and INVALID_LAUNCH.search(v.message) is not None
            and sm90_bwd_smem_over_holds(problem.head_dim, problem.head_dim_v))


#: how a launch CUDA rejects as invalid (cudaErrorInvalidValue, code 1) reads in FA4's exceptions:
#: a kernel compiled in the process (CUDA_LAUNCH_INVALID_CONFIG / cudaErrorInvalidValue, measured on
#: the H200 at 6f502c4) and one loaded from FA4's disk cache ("CUDA Error Code: 1", measured on an
#: H100 at 299cd69, the warm audit's rows 13, 27, 98, 126, 132, 146)
INVALID_LAUNCH = re.compile(r"CUDA_LAUNCH_INVALID_CONFIG|cudaErrorInvalidValue|CUDA Error Code: 1(?!\d)")


#: Note [Scratch guard] (fa4verify/kernels/stage_taps.py): what FA4 4.0.0b36's SM90 preprocess was
#: measured writing past its buffers at tile_m 80 and head_dim_v 64 (H100, 2026-12-05)
SM90_PREPROCESS_OVERRUN = {"dpsum": 16}

#: the quantities computed from D: dS = P (dP - D) feeds dQ (and its accumulator) and dK, and FA4's
#: postprocess forms dsink from D (``LearnableSinkBwdTensors(dpsum, ...)``); dV = P^T dO reads no D
_FROM_D = ("scratch_bounds", "D", "D_dlse", "dq_accum", "dq", "dk", "dsink")


def sm90_overrun_tile(problem: AttentionProblem) -> bool:
    """Whether ``problem``'s backward runs where FA4's SM90 preprocess overruns D: tile_m 80 and
    head_dim_v 64 (:data:`SM90_PREPROCESS_OVERRUN`)."""
    from fa4verify.kernels.facts import bwd_tile
    from fa4verify.problem import resolve_window
    if problem.arch != "sm90" or problem.head_dim_v != 64:
        return False
    r_causal, r_local, _, _ = resolve_window(problem.causal, problem.window_size)
    return bwd_tile(problem.arch, problem.head_dim, problem.head_dim_v, r_causal, r_local)[0] == 80


def _sm90_bwd_preprocess_overrun(problem: AttentionProblem, a: Mapping[str, Any], v: "Violation") -> bool:
    """True for a violation of an example whose own backward showed the measured overrun
    (``scratch_overrun``, :data:`SM90_PREPROCESS_OVERRUN`) on an SM90 call at tile_m 80 and
    head_dim_v 64: the overrun itself, and -- with a second (batch, head) whose D rows the overrun
    races with -- D and what is computed from it, or two deterministic calls that differ."""
    if not sm90_overrun_tile(problem):
        return False
    if v.metrics.get("scratch_overrun") != SM90_PREPROCESS_OVERRUN:
        return _sm90_varlen_preprocess_overrun(problem, v)
    quantity = str(v.metrics.get("quantity", ""))
    if v.prop == "bwd_stages" and quantity == "scratch_bounds":
        return True
    if problem.batch * problem.nheads < 2:        # no other head's D rows to race with
        return False
    return v.prop in ("bwd_stages", "bwd_budget", "deterministic_bwd") and quantity in _FROM_D


def _sm90_d_slots(problem: AttentionProblem, tile_m: int) -> Optional[tuple[np.ndarray, np.ndarray, int]]:
    """Where FA4's SM90 backward keeps D of each (query head, sequence) of a varlen problem:
    ``(start (nheads, batch), length (batch,), size)`` in D's flat buffer, or None for a Q side it
    passes batched and whole (``q_batched``: the dense layout, whose overrun past the last slot the
    scratch guard sees). ``interface.py`` (4.0.0b36): with ``cu_seqlens_q`` D is ``(num_head,
    total_q_rounded_padded)``, ``total_q_rounded_padded = (total_q + (batch + 1) * tile_m - 1) //
    tile_m * tile_m``, sequence b from ``(cu_seqlens_q[b] + b * tile_m) // tile_m * tile_m``
    (``seqlen_info.py``) -- the plain varlen call, and ``seqused_q`` over Q packed at capacity
    offsets (``cu_seqlens_q`` at them); without it (``seqused_q`` over batched Q) D is ``(batch,
    num_head, seqlen_q_rounded)``, ``seqlen_q_rounded`` the capacity rounded up to tile_m. Only the
    Q side matters: the preprocess reads O and dO (the K side's form is another kernel's)."""
    call = problem.call
    lens = np.asarray(problem.seqlens_q, np.int64)
    B, H = len(lens), problem.nheads
    if call is not None and call.q_batched:
        return None
    if call is not None and call.seqused_q and not call.q_packed:
        R = -(-int(call.q_capacity) // tile_m) * tile_m
        start = (np.arange(B)[None, :] * H + np.arange(H)[:, None]) * R
        return start, lens, B * H * R
    cu = (np.arange(B + 1) * int(call.q_capacity) if call is not None and call.seqused_q
          else np.concatenate([[0], np.cumsum(lens)]))
    tq = int(cu[-1])
    T = (tq + (B + 1) * tile_m - 1) // tile_m * tile_m
    off = (cu[:-1] + np.arange(B) * tile_m) // tile_m * tile_m
    return np.arange(H)[:, None] * T + off[None, :], lens, H * T


def _sm90_varlen_overrun_rows(problem: AttentionProblem, tile_m: int) -> Optional[np.ndarray]:
    """``(nheads, total_q)`` bool: the (query head, token) rows of a varlen call whose D the SM90
    preprocess's overrun writes as 0 (:func:`_sm90_bwd_preprocess_overrun`): the 16 rows after each
    sequence's last tile in D's buffer (:func:`_sm90_d_slots`) landing on another sequence's (or
    the next head's) rows; None where the layout is not modelled."""
    slots = _sm90_d_slots(problem, tile_m)
    if slots is None:
        return None
    start, lens, size = slots
    H, B = start.shape
    cu = np.concatenate([[0], np.cumsum(lens)])
    out = np.zeros((H, int(cu[-1])), bool)
    over = SM90_PREPROCESS_OVERRUN["dpsum"]
    s0, s1 = start.ravel(), (start + lens[None, :]).ravel()
    for h in range(H):
        for b in range(B):
            if lens[b] == 0:
                continue
            end = int(start[h, b]) + -(-int(lens[b]) // tile_m) * tile_m
            for g in range(end, min(end + over, size)):       # past D's end: the measured scratch overrun
                hit = np.flatnonzero((s0 <= g) & (g < s1))
                if hit.size:
                    h2, b2 = divmod(int(hit[0]), B)
                    out[h2, cu[b2] + g - int(start[h2, b2])] = True
    return out


def _sm90_varlen_preprocess_overrun(problem: AttentionProblem, v: "Violation") -> bool:
    """The same defect on a varlen call whose padding keeps the overrun inside D (no write past its
    end for the scratch guard to see; the caller checked the arch, head_dim_v 64 and tile_m 80): True for a ``bwd_budget`` dQ violation whose every element
    is a row the overrun zeroes (:func:`_sm90_varlen_overrun_rows`), or a dK one whose every
    element is a key of a sequence with such a row in a query head of its KV head (dS = P (dP - D)
    of those rows reaches every key of the sequence: tile_m 80 runs without causal or window, and
    calls with a mask_mod or mod pair are not taken); measured on NVIDIA H100 (sm_90), 2026-12-05
    (scripts/gpu_triage_case.py on plan row 139: dQ of rows 0..11 of sequence 1; each sequence
    alone, hdv 128, tile_m 64 (causal) and another values seed right), and on a seqused_q call over
    batched Q, 2026-12-06 (plan row 129: dQ of sequence 1's first rows, head 0). D is placed by the
    call's Q side (:func:`_sm90_d_slots`); the K side's form does not matter (the preprocess reads
    O and dO only)."""
    if not problem.varlen or problem.mods or problem.mask_mod is not None \
            or (problem.call is not None and problem.call.mask_mod_fn is not None):
        return False
    quantity = str(v.metrics.get("quantity", ""))
    if v.prop != "bwd_budget" or quantity not in ("dq", "dk"):
        return False
    idx = v.over_indices
    if idx is None or not len(idx):
        return False
    idx = np.asarray(idx)
    rows = _sm90_varlen_overrun_rows(problem, 80)
    if rows is None:
        return False
    if quantity == "dq":               # dq layout (t, h, d)
        return bool(rows[idx[:, 1], idx[:, 0]].all())
    g = problem.nheads // problem.nheads_kv
    lens_k = np.asarray(problem.seqlens_k, np.int64)
    seq_of_key = np.repeat(np.arange(len(lens_k)), lens_k)
    cu_q = np.concatenate([[0], np.cumsum(problem.seqlens_q)])
    hit = np.array([[rows[hk * g:(hk + 1) * g, cu_q[b]:cu_q[b + 1]].any() for b in range(len(lens_k))]
                    for hk in range(problem.nheads_kv)])
    return bool(hit[idx[:, 1], seq_of_key[idx[:, 0]]].all())      # dk layout (t_k, h_k, d)


def _mask_mod_causal_bwd(problem: AttentionProblem, a: Mapping[str, Any], v: "Violation") -> bool:
    """True for a gradient violation of a mask pair's call that also passes ``causal=True``
    (``CallForm.mask_causal``): FA4's backward applies the causal mask its forward dropped. The
    forward's violations are not this issue."""
    if problem.call is None or not problem.call.mask_causal:
        return False
    if v.prop not in ("bwd_budget", "bwd_stages"):      # a kept causal mask moves values, not NaN / masked rows
        return False
    return str(v.metrics.get("quantity", "")) in ("dq", "dk", "dv", "dq_accum")   # dq_accum: dQ unscaled


def _sm90_gqa_dkdv_accum(problem: AttentionProblem, a: Mapping[str, Any], v: "Violation") -> bool:
    """True when the violation is in dK or dV of a GQA/MQA problem (nheads_kv < nheads) on SM90
    at a head dim whose accumulator roundings disagree (the dQ predictor's set: with GQA FA4 sums
    dK/dV of the query heads of a group in fp32 accumulators tiled like dQ's)."""
    if problem.arch != "sm90" or problem.nheads_kv >= problem.nheads:
        return False
    if v.prop not in ("bwd_budget", "masked_rows", "finite", "gqa_repeat"):
        return False
    quantity = str(v.metrics.get("quantity", ""))
    if quantity not in ("dk", "dv") and not v.message.startswith(("dk", "dv")):
        return False
    from fa4verify.kernels import fa4_params
    local = any(w is not None for w in problem.window_size)
    r = fa4_params.sm90_dq_accum_mismatch(problem.head_dim, problem.head_dim_v, causal=problem.causal, local=local)
    return bool(r.get("mismatch") and r.get("pinned_mismatch"))      # Note [Pinned roundings]


def _empty_seq_tokens(problem: AttentionProblem) -> np.ndarray:
    """Bool (total_q,): query tokens of sequences with no key (seqlens_k[b] == 0)."""
    out = np.zeros(sum(problem.seqlens_q), bool)
    for q0, lq, _, lk in problem._seq_bounds():
        if lk == 0:
            out[q0:q0 + lq] = True
    return out


def _fwd_tile_n(problem: AttentionProblem) -> int:
    """The tile_n of the forward kernel FA4 runs for ``problem`` (its window resolved as FA4 does)."""
    from fa4verify.kernels.facts import fwd_tile
    from fa4verify.problem import resolve_window
    r_causal, r_local, _, _ = resolve_window(problem.causal, problem.window_size)
    return fwd_tile(problem.arch, problem.dtype, problem.head_dim, problem.head_dim_v, r_causal, r_local)[1]


def _names_all(names: Callable[..., Optional[np.ndarray]]) -> Callable[..., bool]:
    """The rule of an issue that names its elements (``KnownIssue.names``): it names every offending
    element of the violation."""
    def applies(problem: AttentionProblem, a: Mapping[str, Any], v: "Violation") -> bool:
        n = names(problem, a, v)
        return n is not None and len(n) > 0 and bool(np.all(n))
    return applies


def _tokens_named(bad: np.ndarray, tok: np.ndarray) -> np.ndarray:
    """Per offending element, whether its token lies in ``bad`` (False past its end)."""
    inside = tok < bad.size
    return inside & bad[np.where(inside, tok, 0)]


def _sm90_paged_tma_empty_seq_nan(problem: AttentionProblem, a: Mapping[str, Any], v: "Violation"
                                  ) -> Optional[np.ndarray]:
    """The elements of the recorded paged-KV finding: SM90, a paged call at page_size == tile_n
    (FA4's TMA paged path), NaN in the page pool (``hostile_nan``): O (not LSE) of a sequence
    with ``seqused_k[b] = 0``."""
    call = problem.call
    if problem.arch != "sm90" or call is None or not call.paged or not call.hostile_nan:
        return None
    if call.page_size != _fwd_tile_n(problem):
        return None
    q = str(v.metrics.get("quantity", ""))
    if (v.prop, q) not in (("finite", "out"), ("fwd_budget", "out"), ("paged_kv_bitwise", "out"),
                           ("masked_rows", "lse_rows")):
        return None
    idx = v.over_indices
    empty = _empty_seq_tokens(problem)
    if idx is None or not len(idx) or not empty.any():
        return None
    idx = np.asarray(idx)
    tok = idx[:, 1] if q == "lse_rows" else idx[:, 0]     # LSE layout (h, t); O layout (t, h, d)
    named = _tokens_named(empty, tok)
    # the defect's O is NaN: a finite wrong value there is another fault, and values not known are
    # not the defect's (every check that raises these violations carries them; red-team review)
    if v.prop == "finite":              # its offending values are the non-finite ones
        return named
    fin = _offending_finite(v, idx)
    return None if fin is None else named & ~fin


def _offending_finite(v: "Violation", idx: np.ndarray) -> Optional[np.ndarray]:
    """Per offending element of ``v`` (``idx``: its indices), whether the kernel's value is finite,
    or None where ``v`` does not carry the values."""
    if v.finite_values is not None and len(v.finite_values) == len(idx):
        return np.asarray(v.finite_values, bool)
    j = v.judged
    if j is not None and j.get("actual") is not None:
        act = np.asarray(j["actual"], np.float64)
        if act.ndim == idx.shape[1]:
            return np.isfinite(act[tuple(idx.T)])
    return None


def _sm90_paged_tile144_fwd(problem: AttentionProblem, a: Mapping[str, Any], v: "Violation") -> bool:
    """True for a forward violation of the measured paged-KV finding: SM90, head dim 80 or 96 (q and
    v), FA4's 192x144 forward tile (neither causal nor local) and a paged call whose page size is
    not that tile_n (FA4's cp.async ``PagedKVManager`` path, ``paged_kv_non_tma``)."""
    call = problem.call
    if problem.arch != "sm90" or call is None or not call.paged or problem.head_dim != problem.head_dim_v \
            or problem.head_dim not in (80, 96):
        return False
    tile_n = _fwd_tile_n(problem)
    if tile_n != 144 or call.page_size == tile_n:
        return False
    return (v.prop, str(v.metrics.get("quantity", ""))) in (
        ("fwd_budget", "out"), ("fwd_budget", "lse"), ("paged_kv_bitwise", "out"), ("paged_kv_bitwise", "lse"))


#: the tile_n FA4's forward kernels build their varlen ``SeqlenInfoQK`` with: flash_fwd_sm90.py
#: (and flash_fwd_sm100.py) call ``SeqlenInfoQK.create`` without ``tile_n`` ("Don't need to pass in
#: tile_mn because we won't access offset_padded"), so seqlen_info.py's default 128 sets
#: ``num_n_blocks``, the stride of a Q block's KV-block list under varlen block sparsity
#: (block_sparse_utils.py ``_get_curr_blocksparse_tensors_varlen``); flash-attn-4 4.0.0b36
SEQLEN_INFO_TILE_N = 128


def varlen_sparse_misread_tokens(problem: AttentionProblem) -> np.ndarray:
    """Boolean per packed query token: rows whose Q block reads another block's KV list in FA4's
    varlen block-sparse forward (finding ``sm90_varlen_sparse_kv_stride``): every Q block but the
    first of a sequence whose KV-block count at the kernel's tile_n (the forward tile fitted to the
    sparse KV block: interface.py ``_fit_sm90_fwd_tile_to_block_sparsity``) differs from the count
    at :data:`SEQLEN_INFO_TILE_N`, and whose read holds other blocks than its own list (the same
    blocks read give the right O). All False for other problems."""
    call = problem.call
    tq = sum(lq for _, lq, _, _ in _token_bounds(problem))
    out = np.zeros(tq, bool)
    if not problem.varlen or call is None or call.block_size is None or call.batched_layout:
        return out
    bq, bk = (int(x) for x in call.block_size)
    tile_n = _fwd_tile_n(problem)
    if problem.arch == "sm90":
        from fa4verify.kernels.facts import sm90_sparse_fwd_tile_n
        from fa4verify.problem import resolve_window
        causal, local, _, _ = resolve_window(problem.causal, problem.window_size)
        tile_n = sm90_sparse_fwd_tile_n(problem.head_dim, problem.head_dim_v, causal, local, bk)
    bounds = _token_bounds(problem)
    if not any(-(-lk // tile_n) != -(-lk // SEQLEN_INFO_TILE_N) and lq > bq for _q0, lq, _k0, lk in bounds):
        return out
    # the lists as fa4verify lays them out (one row of ceil(len_k / bk) entries per Q block, the
    # sequences one after another) and, per Q block, the entries FA4 reads at its stride: a block
    # whose read holds the same blocks as its own list gets the right O (red-team review: those
    # rows were named too)
    from fa4verify.kernels.adapter import _block_lists
    flat, counts, start = [], [], [0]
    for i, (_q0, lq, _k0, lk) in enumerate(bounds):
        c, idx = _block_lists(call.block_mask(lq, lk, seq=i))
        counts.append(c)
        flat.extend(idx.reshape(-1).tolist())
        start.append(start[-1] + idx.size)
    flat_a = np.asarray(flat, np.int64)
    for i, (q0, lq, _k0, lk) in enumerate(bounds):
        if -(-lk // tile_n) == -(-lk // SEQLEN_INFO_TILE_N) or lq <= bq:
            continue
        own, read = -(-lk // bk), -(-lk // SEQLEN_INFO_TILE_N)
        for mb in range(1, len(counts[i])):
            n = int(counts[i][mb])
            right = np.sort(flat_a[start[i] + mb * own:][:n])
            got = np.sort(flat_a[start[i] + mb * read:][:n])
            if len(got) != len(right) or not np.array_equal(right, got):
                out[q0 + mb * bq:q0 + min((mb + 1) * bq, lq)] = True
    return out


def sparse_bwd_unwritten_keys(problem: AttentionProblem) -> np.ndarray:
    """Boolean ``(key token, KV head)`` (dense ``(b, s_k)`` flattened, as the ``(t_k, h_k)`` view of
    dK / dV): the keys whose dK and dV FA4's SM90 block-sparse backward leaves unwritten under a
    left window (finding ``sm90_sparse_bwd_left_window_unwritten``). All False for other problems.

    Note [Unwritten KV tiles under a left window]
    ---------------------------------------------
    flash-attn-4 4.0.0b36, ``flash_bwd_sm90.py``: a KV tile ``n`` is processed when its block lists
    name any Q block (``get_total_q_block_count_bwd`` takes ``m_block_max`` and does not read it);
    ``consume_block_sparse_mma_bwd_sm90`` (``block_sparse_utils.py``) then runs only the Q subtiles
    ``m < m_block_max``, zero-initialising ``acc_dK`` / ``acc_dV`` at the first one it runs, and the
    epilogue writes the accumulators whatever ran. ``block_info.get_m_block_min_max`` lowers
    ``m_block_max`` under a left window to ``ceil(((n + 1) tile_n + seqlen_q - seqlen_k + left) /
    tile_m)`` (and ``ceil(seqlen_q / tile_m)`` at most). Where every listed subtile lies at or past
    it no MMA runs and the tile's dK / dV are the registers' old contents. A listed Q block ``i``
    (``sparse_q`` rows, ``sparse_q / tile_m`` subtiles from ``i * sparse_q / tile_m``) has a subtile
    below ``m_block_max`` iff ``i * sparse_q < min(seqlen_q, (n + 1) tile_n + seqlen_q - seqlen_k +
    left)``, whatever tile_m is (an integer k is below ``ceil(x)`` iff it is below ``x``), and the
    KV tile is the lists' KV block. Those keys' true gradients are 0 (no listed row reaches them),
    under GQA the group's other heads' sums, which the unwritten accumulator adds to: unknown either
    way. The SM 10.x backward marks those subtiles out of bounds (``m_block_oob``) instead: not this
    issue. A release whose source no longer has this shape
    (:func:`fa4verify.kernels.fa4_params.sm90_sparse_bwd_unwritten`) is not this issue either; without
    FA4 installed, the pinned release's (4.0.0b36) is taken."""
    call = problem.call
    tk = sum(lk for _, _, _, lk in _token_bounds(problem))
    out = np.zeros((tk, problem.nheads_kv), bool)
    if problem.arch != "sm90" or call is None or call.block_size is None or problem.varlen or call.mask_mod_fn:
        return out      # FA4 drops the window for a mask_mod; its varlen block sparsity is forward only
    from fa4verify.kernels import fa4_params
    if not fa4_params.sm90_sparse_bwd_unwritten().get("defect"):
        return out
    from fa4verify.problem import resolve_window
    _, local, left, _ = resolve_window(problem.causal, problem.window_size)
    if not local or left is None:
        return out
    bq, bk = (int(x) for x in call.block_size)
    g = problem.nheads // problem.nheads_kv
    for b, (_q0, lq, k0, lk) in enumerate(_token_bounds(problem)):
        for h in range(problem.nheads if call.block_per_head else 1):
            listed = call.block_mask(lq, lk, seq=call.grid_seq(problem, b), head=h)
            for n in range(listed.shape[1]):
                rows = np.flatnonzero(listed[:, n])
                if rows.size and rows.min() * bq >= min(lq, (n + 1) * bk + lq - lk + int(left)):
                    heads = [h // g] if call.block_per_head else list(range(problem.nheads_kv))
                    out[k0 + n * bk:k0 + min((n + 1) * bk, lk), heads] = True
    return out


def _sm90_sparse_bwd_left_window(problem: AttentionProblem, a: Mapping[str, Any], v: "Violation"
                                 ) -> Optional[np.ndarray]:
    """The elements of a dK / dV violation in the keys :func:`sparse_bwd_unwritten_keys` names
    (Note [Unwritten KV tiles under a left window])."""
    q = str(v.metrics.get("quantity", ""))
    if q not in ("dk", "dv") or v.prop not in ("bwd_budget", "bwd_stages", "finite", "deterministic_bwd",
                                               "masked_rows", "gqa_repeat", "batch_invariance"):
        return None
    idx = v.over_indices
    if idx is None or not len(idx):
        return None
    idx = np.asarray(idx)
    if idx.shape[1] != 4:                      # dense (b, s_k, h_k, d) only
        return None
    bad = sparse_bwd_unwritten_keys(problem)
    if not bad.any():
        return None
    tok = idx[:, 0] * problem.seqlen_k + idx[:, 1]
    inside = (tok < bad.shape[0]) & (idx[:, 2] < bad.shape[1])
    return inside & bad[np.where(inside, tok, 0), np.where(inside, idx[:, 2], 0)]


def _sm100_sparse_mla_autograd_dlse(problem: AttentionProblem, a: Mapping[str, Any], v: "Violation") -> bool:
    """FA4's public sparse MLA autograd path drops dLSE: only the gradients of that path's pass with
    a seeded dLSE (``autograd_dlse``), on a top-k gather call."""
    return (problem.call is not None and problem.call.gather_topk > 0 and v.prop == "bwd_budget"
            and v.metrics.get("pass") == "autograd_dlse")


def _sm90_varlen_sparse_kv_stride(problem: AttentionProblem, a: Mapping[str, Any], v: "Violation"
                                  ) -> Optional[np.ndarray]:
    """The elements of the varlen block-sparse finding in a forward violation: O / LSE of the
    rows :func:`varlen_sparse_misread_tokens` names."""
    q = str(v.metrics.get("quantity", ""))
    if problem.arch != "sm90" or (v.prop, q) not in (("fwd_budget", "out"), ("fwd_budget", "lse"),
                                                     ("finite", "out"), ("finite", "lse")):
        return None
    bad = varlen_sparse_misread_tokens(problem)
    idx = v.over_indices
    if not bad.any() or idx is None or not len(idx):
        return None
    idx = np.asarray(idx)
    tok = idx[:, 1] if q == "lse" else idx[:, 0]      # LSE layout (h, t); O layout (t, h, d)
    return _tokens_named(bad, tok)


def _sm100_fp8_fwd_no_build(problem: AttentionProblem, a: Mapping[str, Any], v: "Violation") -> bool:
    """True for a failed build of FA4's SM 10.x fp8 forward at a head dim that pads to 48, 80 or
    112 (the plan does not call it there: ``FeatureSpace.why_not``; a user's problem may)."""
    if problem.dtype != "fp8" or problem.arch == "sm90" or v.prop != "runs":
        return False
    from fa4verify.kernels.features import sm100_fp8_fwd_does_not_build
    return bool(sm100_fp8_fwd_does_not_build(problem.head_dim, problem.head_dim_v) and "partition" in v.message)


def _sm90_block_sparse_bwd_no_build(problem: AttentionProblem, a: Mapping[str, Any], v: "Violation") -> bool:
    """True for a failed build of FA4's SM90 block-sparse backward at a head dim in (192, 256)
    that is not a multiple of 64 (the fuzz does not call it there: the DSL usually aborts the
    process; this absorbs the MLIRError form, e.g. hd 224)."""
    if problem.arch != "sm90" or problem.call is None or problem.call.block_size is None or v.prop != "runs":
        return False
    from fa4verify.kernels.features import sm90_sparse_bwd_does_not_build
    return bool(sm90_sparse_bwd_does_not_build(problem.head_dim, problem.head_dim_v)
                and "partition" in v.message)


def _sm90_score_mod_gqa_bwd_indices(problem: AttentionProblem, a: Mapping[str, Any], v: "Violation") -> bool:
    """True for a backward violation of an SM90 GQA/MQA problem whose score pair changes under the
    indices FA4's SM90 backward hands it (``q_idx // g`` and head ``h * g + q_idx % g``: the Pack-GQA
    mapping applied to rows that are not packed), or reads past its aux tensors there. A read past
    the aux tensors reads whatever memory lies there, so two deterministic backward calls may
    differ too, in any gradient: the recomputed P itself is read from that memory (measured on the
    H200 on clean FA4 4.0.0b36: 2026-12-02, alibi GQA 3/1 hd 8, dQ differed in 128 of 192 elements;
    2026-12-05, the plan's alibi GQA 8/2 hd 96 row of 257 sequences, the public autograd path's dK
    with a seeded dLSE differed from the driver's in 210,722 elements). ``deterministic_bwd`` of
    dQ, dK or dV is absorbed only there, where every gradient
    is already outside its budget; never for a score pair that stays inside its aux tensors under
    FA4's mapping (a GQA accumulation-order fault in dK/dV stays reported on every other row)."""
    if problem.arch != "sm90" or problem.nheads_kv == problem.nheads or not problem.mods:
        return False
    quantity = str(v.metrics.get("quantity", ""))
    # the gradients and the dQ accumulator only: the forward is right, masking is untouched, and
    # D / lse_log2 / dq_post never see the score_mod (a fault there stays reported)
    repeat = v.prop == "deterministic_bwd" and quantity in ("dq", "dk", "dv")   # past the aux only
    if not ((v.prop in ("bwd_budget", "finite") and quantity in ("dq", "dk", "dv"))
            or (v.prop == "bwd_stages" and quantity == "dq_accum") or repeat):
        return False
    score, _ = problem.mod_pairs()
    if score is None:
        return False
    effect = _gqa_mapping_effect(problem, score, a)
    return effect == "past_aux" if repeat else effect is not None


def _gqa_mapping_effect(problem: AttentionProblem, score: Any, a: Mapping[str, Any]) -> Optional[str]:
    """What FA4's SM90 GQA backward mapping (row ``r`` of head ``h`` handed to the score pair as
    row ``r // g`` of head ``h * g + r % g``) does to the score pair: "past_aux" when its reference
    indexes past its aux tensors for some row and head (an IndexError), "changed" when some value
    or derivative differs from the right indices', None when the mapping changes nothing."""
    from fa4verify import mods
    aux = mods.aux_for(problem, score, a)
    g = problem.nheads // problem.nheads_kv
    ki = np.arange(problem.seqlen_k)[None, :]
    x = np.linspace(-4.0, 4.0, problem.seqlen_k)[None, :]
    changed = False
    for b in range(problem.batch):
        for h in range(problem.nheads):
            for r in range(problem.seqlen_q):
                try:
                    yb = score.ref(x, b, h * g + r % g, np.array([[r // g]]), ki, aux)
                    db = score.grad(x, b, h * g + r % g, np.array([[r // g]]), ki, aux)
                except IndexError:
                    return "past_aux"
                changed = changed or not (np.array_equal(yb, score.ref(x, b, h, np.array([[r]]), ki, aux))
                                          and np.array_equal(db, score.grad(x, b, h, np.array([[r]]), ki, aux)))
    return "changed" if changed else None


#: FA4 behaviours the fuzzer has found and that are documented (docs/fuzzing.md).
KNOWN_ISSUES: tuple[KnownIssue, ...] = (
    KnownIssue(
        "sink_rowsum_overflow",
        "learnable sink far above every visible logit: FA4's sink fold exp2(sink*log2e - "
        "row_max*scale_log2) overflows fp32, so LSE = +inf (O = 0, dsink wrong)",
        "flash_attn/cute/softmax.py Softmax.finalize / apply_learnable_sink (4.0.0b36); found by "
        "fa4verify fuzz on the CPU twin and CONFIRMED on production FA4 (measured on H200, "
        "2026-11-30, flash-attn-4 4.0.0b36, nvidia-cutlass-dsl 4.8.1, torch 2.11.0+cu130: LSE = +inf "
        "where the oracle gives -0.336); tests/regressions/finite-twin-sink-overflow.json",
        _sink_overflow, model=defect_models.sink_overflow),
    KnownIssue(
        "split_kv_sink_without_keys",
        "split-KV call with a learnable sink whose query tile has no KV block in any split (a left "
        "window past every key): FA4 folds the sink only into a split with work, so the merged LSE is "
        "-inf where the unsplit call (and the oracle) give the sink's; O = 0 either way",
        "flash-attn-4 4.0.0b36 flash_fwd_sm100.py: a (tile, split) without KV blocks skips its work "
        "(block_info.has_kv_work) and 'Only the first split owns the sink column' (apply_learnable_sink "
        "under split_idx == 0); predicted from the source and reproduced by the CPU twin (fa4verify's "
        "split model, tests/test_split_kv.py), found by a review of the split-KV fuzz draws; not run on "
        "a B200 (no SM 10.x GPU here)",
        _split_sink_without_keys),
    KnownIssue(
        "sm90_dq_accum_hdim_rounding",
        "SM90 backward: the main kernel tiles the fp32 dQ accumulator with head dim rounded to 16 "
        "but the postprocess reads it rounded to 32, so dQ rows past the first 64 of a sequence are "
        "wrong (dK, dV right) for head dims 8, 16, 40, 48, 72, 80 (104 and 112 fail to compile)",
        "flash_attn/cute/flash_bwd_sm90.py (hdim_multiple_of = 64 if dKV_swapAB else 16) vs "
        "interface.py / flash_bwd_postprocess.py (hdim_multiple_of = ... else 32), flash-attn-4 "
        "4.0.0b36; found by fa4verify on production FA4 and CONFIRMED by a head-dim sweep (measured "
        "on H200, 2026-11-30: dQ relative error 0.76-1.17 at exactly the predicted head dims, "
        "2.4e-3 elsewhere; correct while seqlen_q <= 64); docs/results/h200/README.md finding 2, "
        "kernels/evidence/golden/hd_sweep_h200.json, hd_sweep_seqlens_h200.json",
        _sm90_dq_accum, targets=("production",), model=defect_models.sm90_dq_misread),
    KnownIssue(
        "sm90_split_auto_refused",
        "num_splits=0 (FA4's split heuristic) on SM90: the heuristic picks a split count over 1 for a decode "
        "call (64 at b1 sq1 sk8192 h8/1 hd128 on 132 SMs), which FA4's SM90 forward then refuses (AssertionError: "
        "SplitKV not supported on SM 9.0); its SM 12.x path clamps the count to 1 instead",
        "flash-attn-4 4.0.0b36 interface.py _get_fwd_config (num_splits < 1 -> num_splits_heuristic, no SM90 "
        "clamp) and _flash_attn_fwd (assert not is_split_kv on SM 9.0); predicted from source and a compile-only "
        "probe on a fake H200 (red-team round 15 #6, docs/results/redteam15/probe_splits0.txt), measured on an "
        "H100 (2026-12-07, edge split_auto_decode of coverage.production, docs/results/h100/session27_7ae8fcd/)",
        _sm90_split_auto_refused, targets=("production",)),
    KnownIssue(
        "sm90_bwd_hd104_112_compile",
        "SM90 backward does not compile at head dims 104 and 112 (MLIRError: failed to partition "
        "'(112,80)' with tiled_mma) although FA4's interface accepts them",
        "flash-attn-4 4.0.0b36 flash_bwd_sm90.py with _tile_size_bwd_sm90's m_block 80 (non-causal); "
        "measured on H200, 2026-11-30, by scripts/gpu_hd_sweep.py (kernels/evidence/golden/hd_sweep_h200.json); "
        "causal (m_block 64) not measured",
        _sm90_bwd_compile, targets=("production",)),
    KnownIssue(
        "sm90_bwd_hdv_gt_hd_smem",
        "SM90 backward at head_dim < head_dim_v (64/128, 128/256) with nheads == nheads_kv: CUDA rejects the "
        "launch (cudaErrorInvalidValue); the kernel's shared storage (248,832 B at 64/128; 264,192 B or "
        "306,176 B at 128/256 by tile) exceeds the 232,448 B a block may use on sm_90. With GQA FA4 asserts 'GQA backward "
        "requires head_dim == head_dim_v', so no SM90 backward runs at head_dim < head_dim_v",
        "flash-attn-4 4.0.0b36: interface.py _tile_size_bwd_sm90 picks the backward tile by head_dim "
        "alone (hd <= 64: 128 x 128 with two Q and two dO stages), while dO and V are head_dim_v wide. "
        "Found by coverage.production and measured on NVIDIA H200 (sm_90), 2026-12-05, at 6f502c4: plan "
        "rows 13, 27, 98, 126, 132, 146 (every MHA backward row of those head-dim classes; "
        "docs/results/h200/session15_6f502c4/); the shared storage sizes compile-only (sm_90a), "
        "FlashAttentionBackwardSm90's SharedStorage.size_in_bytes()",
        _sm90_bwd_hdv_gt_hd_smem, targets=("production",)),
    KnownIssue(
        "sm90_bwd_preprocess_overrun",
        "SM90 backward at tile_m 80 (head_dim 97..128, no causal or window) and head_dim_v 64: the "
        "preprocess copies O and dO in passes of 32 rows, so an 80-row tile's partition covers 96 rows and it "
        "writes D for rows 80..95 too; in the last tile of a (batch, head) those rows are past the sequence and "
        "get D = 0: into rows 0..15 of the next (batch, head), which that head's own CTA writes as well (a "
        "race: D, and dS, dQ, dK, dsink from it, wrong or not from run to run; two deterministic calls may "
        "differ in them), and after the last (batch, head) past the end of the buffer (a write into memory FA4 "
        "does not own: 16 elements past D's end on every such call)",
        "flash-attn-4 4.0.0b36: flash_bwd_preprocess.py writes gPdPsum[row] for every row of its copy "
        "partition under use_padded_offsets (no row < tile_m check); interface.py _tile_size_bwd_sm90 m_block "
        "80 for head dims <= 128 without causal or window. Seen as the non-repeatable edge tile_tail_128x128 "
        "(H200, 6f502c4); predicted from the source by a helper; CONFIRMED measured on NVIDIA H100 80GB HBM3 "
        "(sm_90), 2026-12-05, at 299cd69 (scripts/gpu_preprocess_guard.py): at hd 128 / hdv 64 (1x2 and 2x3 "
        "(batch, heads), seqlen_q 80, 137, 160) 16 zeros past the end of D on every call, wrong D rows and dQ "
        "not bitwise in 17-19 of 20 deterministic repetitions; hdv 128 (same tile), hd 64, 96, 192, 256: none; "
        "docs/results/h100/session16_299cd69/. On a varlen call the padded layout may keep the overrun inside "
        "D, onto rows 0..15 of the next sequence: CONFIRMED measured on NVIDIA H100 80GB HBM3 (sm_90), "
        "2026-12-05, at 0518951 (coverage.production row 139, hd 128 / hdv 64, q lens 137/45/69: dQ of rows "
        "0..11 of sequence 1 out of budget; each sequence alone, hdv 128, causal (tile_m 64), one head and "
        "another values seed within it; scripts/gpu_triage_case.py, docs/results/h100/session19_0518951/); "
        "and on a seqused_q call over batched Q, D (batch, heads, capacity rounded to 80), onto rows 0..15 of "
        "the next (batch, head): measured on NVIDIA H100 80GB HBM3 (sm_90), 2026-12-06, at 6197c5c "
        "(coverage.production row 129, capacity 266, q lens 261/87/131: dQ of sequence 1 head 0 out of budget, "
        "worst at its row 2; a race: three warm runs passed it; docs/results/h100/session20_6197c5c/)",
        _sm90_bwd_preprocess_overrun, targets=("production",)),
    KnownIssue(
        "mask_mod_causal_bwd",
        "a mask_mod call that also passes causal=True: FA4's forward drops causal (the mask_mod decides) "
        "but its backward keeps it -- and then masks with causal alone (the element mask's causal branch "
        "precedes its mask_mod branch) -- so dQ, dK and dV are the gradients of another attention than the "
        "forward computed (silent)",
        "flash-attn-4 4.0.0b36: _flash_attn_fwd resolves the window with the mask_mod "
        "(_resolve_causal_local_window returns causal=False), _flash_attn_bwd without it (interface.py); "
        "mask.py apply_mask / apply_mask_sm100 apply the mask_mod only when neither causal nor local is set. "
        "Predicted by fa4verify's eighth red-team round (docs/results/redteam8/) and measured on NVIDIA "
        "H200 (sm_90), 2026-12-05, at 6f502c4: edge mask_mod_causal_passed (the document pair, hd 128, "
        "192 x 192), forward within budget, dQ 42,207 of 49,152 elements out of budget (worst 10.6 where "
        "the oracle has 0.137); docs/results/h200/session15_6f502c4/",
        _mask_mod_causal_bwd, targets=("production",), model=defect_models.mask_mod_causal),
    KnownIssue(
        "sm90_gqa_dkdv_accum_hdim_rounding",
        "SM90 GQA/MQA backward: dK and dV are wrong (relative error 0.9-1.2) at head dims 8, 16, 40, "
        "48, 72, 80 when nheads_kv < nheads; with nheads_kv == nheads they are right (dQ is wrong "
        "either way: sm90_dq_accum_hdim_rounding)",
        "predicted from flash-attn-4 4.0.0b36's source (flash_bwd_sm90.py dK/dV accumulators rounded to "
        "16 vs interface.py's 32, the root cause of the dQ finding, upstream PR #2896) and CONFIRMED "
        "measured on NVIDIA H200 (sm_90), 2026-12-01, scripts/gpu_predictions.py: hd 8/16/40/48/72/80 "
        "with 4 query heads over 1 or 2 KV heads, seqlen 256: dK/dV rel err 0.91-1.16; hd 64/128 "
        "2.3e-3; kernels/evidence/golden/bwd_predictions_h200.json. Its model (the misread accumulator "
        "over the keys) measured on an NVIDIA H100 (sm_90), 2026-12-06, coverage.production at 35451e8: "
        "within at 45 violations of 7 plan calls; outside in 3 calls with the score-index defect (the "
        "model then maps that defect's dK / dV) and in one seqused_q + sink call (no model there)",
        _sm90_gqa_dkdv_accum, targets=("production",), model=defect_models.sm90_dkv_misread),
    KnownIssue(
        "sm90_score_mod_gqa_bwd_indices",
        "SM90 GQA/MQA backward with a score_mod: the S recomputation and score_mod_bwd see q_idx // g and "
        "head h*g + q_idx % g (the Pack-GQA mapping on rows that are not packed), so dQ/dK/dV are wrong for "
        "a score_mod that reads q_idx or the head (rel_bias, alibi; alibi's slopes are read past nheads, so "
        "its deterministic backward may not repeat bitwise, in dQ, dK or dV); "
        "the forward is right, and so are index-free score_mods and nheads_kv == nheads",
        "flash-attn-4 4.0.0b36: flash_bwd_sm90.py apply_score_mod / apply_score_mod_bwd pass "
        "qhead_per_kvhead=self.qhead_per_kvhead to softmax.apply_score_mod_inner / _bwd_inner, though the "
        "SM90 backward never packs GQA (interface.py forces pack_gqa=False there); the SM90 forward and the "
        "SM100 backward pass '... if pack_gqa else 1'. Found by coverage.production and CONFIRMED measured on "
        "NVIDIA H200 (sm_90), 2026-12-02, scripts/gpu_triage_mods.py --only score: rel_bias GQA 4/2 dQ/dK/dV "
        "rel. err 0.57/0.70/0.63 vs the float64 reference, 4.2e-3/2.8e-3/2.7e-3 vs the model of that index "
        "mapping; MQA, causal, pack_gqa=False forward, deterministic backward the same; alibi GQA dQ 6.6; "
        "MHA, the index-free softcap pair, and K/V expanded to the query heads 2.9e-3-4.0e-3 "
        "(docs/results/h200/coverage/README.md); not repeatable where alibi's slopes are read past nheads: "
        "dQ of two deterministic calls (2026-12-02), dK of the public autograd path against the driver "
        "with the same dLSE (2026-12-05, docs/results/h200/speed/e09f829/)",
        _sm90_score_mod_gqa_bwd_indices, targets=("production",), model=defect_models.score_mod_gqa_indices),
    KnownIssue(
        "sm90_paged_tma_empty_seq_nan",
        "SM90 paged KV at page_size == tile_n (FA4's TMA paged path): a sequence with seqused_k[b] = 0 "
        "whose table row points at pages holding NaN gets O = NaN (its LSE is -inf, as it should be); "
        "with finite pages, at page_size 16 (cp.async path), or in sequences with keys, O is right",
        "measured on NVIDIA H200 (sm_90), session 4, flash-attn-4 4.0.0b36: hd 128, page_size 128, "
        "65,536 of 65,536 O elements of the empty sequence NaN; docs/results/h200_session4/README.md "
        "'Finding: paged KV', scripts/gpu_paged_empty_nan.py (pagednan/paged_empty_nan.json). The fuzz "
        "puts NaN in the page pool only when asked (attention_problems(hostile_nan=True))",
        _names_all(_sm90_paged_tma_empty_seq_nan), targets=("production",), names=_sm90_paged_tma_empty_seq_nan),
    KnownIssue(
        "sm90_paged_tile144_fwd",
        "SM90 paged-KV forward at head dims 80 and 96 without causal or local (FA4's 192x144 tile): O is "
        "wrong (34-95 % of elements off by ~0.3-1.9 at normal values) for every page size that is not 144 "
        "(FA4's cp.async PagedKVManager path); the same call unpaged, paged at page size 144 (TMA), causal or "
        "local (tile 192x128), and paged at head dims 64, 112 and 128, is right",
        "measured on NVIDIA H200 (sm_90), 2026-12-02, flash-attn-4 4.0.0b36: found by coverage.production "
        "(default audit, seed 2: paged P=16 + seqused_k + sink + varlen-q, hd 96) and triaged with "
        "scripts/gpu_triage_case.py (docs/results/h200/triage/): fails at page sizes 8, 16, 32, 64, 128, "
        "without the sink, batched q, each sequence alone, one head, other values, and at hd 80; passes "
        "unpaged, at page size 144, causal, with a window, and at hd 64 / 112 / 128 paged (FA4 refuses paged "
        "KV at hd 72 and 88: 'irregular head dim'). Root cause (CPU, source and PTX, twenty-fourth session, "
        "docs/results/paged_tile144/): the cp.async PagedKVManager copies a 144-row tile in waves of 64 (hd 80) "
        "or 32 (hd 96) rows, so its last wave writes 48 / 16 rows past the tile, checked against seqlen_k only "
        "(paged_kv.py), into the swizzled smem of row j (and past the stage: V into sQ); a float64 model with "
        "switches for the races it leaves open reproduces the triage's worst elements to 0.01-0.04",
        _sm90_paged_tile144_fwd, targets=("production",)),
    KnownIssue(
        "sm90_varlen_sparse_kv_stride",
        "SM90 varlen block-sparse forward with a KV tile other than 128 (a 96-key sparse block, e.g. head "
        "dim 192): each Q block but a sequence's first reads its KV-block list at m * ceil(seqlen_k / 128) "
        "instead of m * ceil(seqlen_k / tile_n), so its rows attend another block's list (padding entries "
        "included: block 0 again) and O is wrong at O(1) (sign flips)",
        "flash-attn-4 4.0.0b36: flash_fwd_sm90.py builds SeqlenInfoQK without tile_n (seqlen_info.py "
        "default 128 -> num_n_blocks), read as the per-Q-block stride by block_sparse_utils.py "
        "_get_curr_blocksparse_tensors_varlen, while cu_block_idx_offsets (FA4's own "
        "compute_block_sparsity too) count blocks of the fitted tile_n. Found by coverage.production and "
        "CONFIRMED measured on NVIDIA H200 (sm_90), 2026-12-04: triage (docs/results/h200/triage_5c59db7/) "
        "fails as recorded, without the sink or softcap, at normal values, hd 64/128, one head, pack_gqa "
        "default, every sequence with more than one Q block; passes without block sparsity and for the "
        "one-Q-block sequence; the kernel's O equals, to 3-4 digits, the float64 model of that stride "
        "(scripts/varlen_sparse_stride_model.py)",
        _names_all(_sm90_varlen_sparse_kv_stride), targets=("production",), names=_sm90_varlen_sparse_kv_stride),
    KnownIssue(
        "sm100_sparse_mla_autograd_dlse_dropped",
        "SM100 sparse MLA (qv + gather_kv_indices) through FA4's public autograd path with return_lse=True: "
        "a gradient through the returned LSE is dropped, so dQ, dK, dV and dqv miss its term",
        "PREDICTED from flash-attn-4 4.0.0b36's source, NOT measured (no B200): FlashAttnFunc.backward and "
        "FlashAttnVarlenFunc.backward receive dlse but call _flash_attn_bwd_sparse_mla, which has no dlse "
        "parameter (interface.py); the dense call path passes it on. On a B200, coverage.production's MLA "
        "gather edges show it in the pass autograd_dlse of bwd_stages (Note [The sparse MLA backward])",
        _sm100_sparse_mla_autograd_dlse, targets=("production",)),
    KnownIssue(
        "sm90_block_sparse_bwd_no_build",
        "SM90 block-sparse backward does not build at head dims 200/208/224/232/240 (the CuTe DSL "
        "aborts the process, or MLIRError: unable to partition at 224); hd 128/192/256 and the dense "
        "backward at those head dims build",
        "compile-only (sm_90a), flash-attn-4 4.0.0b36: docs/results/features/README.md, "
        "fa4verify.kernels.features.sm90_sparse_bwd_does_not_build (root cause: _tile_size_bwd_sm90 "
        "drops dKV_swapAB under sparsity); the fuzz skips that backward (an abort takes the process)",
        _sm90_block_sparse_bwd_no_build, targets=("production",)),
    KnownIssue(
        "sm90_sparse_bwd_left_window_unwritten",
        "SM90 block-sparse backward under a left window: a KV tile whose listed Q blocks all lie past the "
        "window's reach (m_block_max) runs no MMA, yet FA4 writes its dK and dV from accumulators never "
        "zeroed: those keys' dK / dV are whatever the registers held (seen up to 1.7e27 where the true "
        "gradient is 0); every other key, dQ and the forward are right",
        "flash-attn-4 4.0.0b36: flash_bwd_sm90.py processes a KV tile when get_total_q_block_count_bwd "
        "(block_sparse_utils.py) counts any listed Q block -- it takes m_block_max and does not read it -- "
        "and consume_block_sparse_mma_bwd_sm90 skips every subtile at or past m_block_max "
        "(block_info.get_m_block_min_max, lowered by window_size_left), zero-initialising the "
        "accumulators only at the first subtile it runs (Note [Unwritten KV tiles under a left window], "
        "fa4verify.fuzz.known_issues.sparse_bwd_unwritten_keys). Found by coverage.production and measured "
        "on NVIDIA H100 80GB HBM3 (sm_90), 2026-12-07, at ef3e925 (docs/results/h100/session30_ef3e925/): "
        "edges variant_bs_d72_fwd_128x128_local, judged_variant_bs_d72_fwd_128x128_local and "
        "variant_bs_d256_bwd_64x64_local_mha_nondet, dK of keys no query reaches up to -1.74e27 / 1.55e16 / "
        "0.57 through FA4's public autograd path; the same lists through the driver call passed that run "
        "(the registers' contents vary by call)",
        _names_all(_sm90_sparse_bwd_left_window), targets=("production",), names=_sm90_sparse_bwd_left_window),
    KnownIssue(
        "sm100_fp8_fwd_no_build",
        "SM 10.x fp8 forward does not compile at head dims that pad to 48, 80 or 112 (MLIRError: "
        "failed to partition '(128,80)' with tiled_mma) although FA4's interface accepts them",
        "compile-only (sm_100a, on a CPU), flash-attn-4 4.0.0b36, 2026-12-05: docs/results/fp8/README.md, "
        "fa4verify.kernels.features.sm100_fp8_fwd_does_not_build (the head dim padded to 16, the 8-bit "
        "MMA's K in steps of 32); not run on a B200",
        _sm100_fp8_fwd_no_build, targets=("production",)),
)


def match_known_issue(problem: AttentionProblem, v: "Violation", a: Optional[Mapping[str, Any]] = None,
                      target: str = "twin") -> Optional[KnownIssue]:
    """The known issue explaining violation ``v`` on ``problem`` for ``target``, or None. An issue
    with a model explains a gradient violation only where the kernel's values lie within it (Note
    [Known issues with a model]); what lies outside is said on ``v``."""
    a = problem.materialize() if a is None else a
    # every issue judges the violation as it was raised (a model that finds elements outside it
    # narrows ``v`` to them; the next issue must not see only those); unexplained, ``v`` keeps the
    # first narrowing and every model's note
    given = (v.over_indices, v.message, v.args, dict(v.metrics))
    narrowed, notes = None, []
    for ki in KNOWN_ISSUES:
        if target not in ki.targets:
            continue
        v.over_indices, v.message, v.args, v.metrics = given[0], given[1], given[2], dict(given[3])
        if ki.applies(problem, a, v) and _within_model(ki, problem, a, v):
            return ki
        if v.message != given[1]:
            notes.append(v.message[len(given[1]):])
            narrowed = narrowed or (v.over_indices, dict(v.metrics))
    v.over_indices, v.message, v.args, v.metrics = given[0], given[1], given[2], dict(given[3])
    ki = _two_defects(problem, v, a, target, given)
    if ki is None and narrowed is not None:
        v.over_indices, v.metrics = narrowed[0], narrowed[1]
        v.message = given[1] + "".join(dict.fromkeys(notes))
        v.args = (f"[{v.prop}] {v.message}",)
    return ki


def _two_defects(problem: AttentionProblem, v: "Violation", a: Mapping[str, Any], target: str,
                 given: tuple) -> Optional[KnownIssue]:
    """Note [Two defects in one violation]
    -----------------------------------
    One call may meet two FA4 defects, and one violation then holds elements of both: on an H100
    (2026-12-07, the default audit at seed 2, ``docs/results/h100/session32_2b4d54e/``) a varlen
    block-sparse call with a learnable sink and scores 100 below it returned LSE = +inf on every
    row: the sink fold's overflow (``sink_rowsum_overflow``, on the rows that see a key) and, on
    30 rows per head that see no key, the overflow again -- those rows belong to Q blocks that
    read another block's KV list (``sm90_varlen_sparse_kv_stride``), so they met keys. Neither
    issue takes the violation alone. An issue that names the elements its defect reaches
    (``KnownIssue.names``) takes those out; the rest must be one other issue's on its own terms
    (its rule, and its model where it has one, judged without the elements taken out). The
    violation is then that issue's hit, and its metrics name the first issue
    (``known_with``) and how many offending elements it took (``known_with_elements``). Nothing
    is taken where the named elements are all or none of the offending ones. ``given``: the
    violation's offending elements, message, args and metrics as it was raised."""
    idx = given[0]
    if idx is None or not len(idx):
        return None
    idx = np.asarray(idx)
    whole = Violation(v.prop, given[1], v.metrics)
    whole.over_indices = idx
    whole.judged, whole.finite_values = v.judged, v.finite_values
    fin = v.finite_values if v.finite_values is not None and len(v.finite_values) == len(idx) else None
    for e in KNOWN_ISSUES:
        if e.names is None or target not in e.targets:
            continue
        named = e.names(problem, a, whole)
        if named is None or not named.any() or named.all():
            continue
        for ki in KNOWN_ISSUES:
            if ki is e or target not in ki.targets:
                continue
            # the rest as raised, for each issue afresh: a model that finds elements outside it
            # narrows the violation it judges, and the next issue must judge the whole rest
            # (a model that found elements outside it judges again, without the ones taken out)
            rest = Violation(v.prop, given[1], {k: x for k, x in given[3].items() if not k.startswith("outside_")})
            rest.over_indices = idx[~named]
            rest.finite_values = None if fin is None else np.asarray(fin)[~named]
            if v.judged is not None:
                rest.judged = dict(v.judged, taken=e)
            if not ki.applies(problem, a, rest):
                continue
            if _within_model(ki, problem, a, rest):
                v.over_indices, v.message, v.args = given[:3]
                for k in [k for k in v.metrics if k.startswith("outside_")]:
                    del v.metrics[k]
                v.metrics.update({k: x for k, x in rest.metrics.items() if k.startswith("known_")})
                v.metrics["known_with"] = e.name
                v.metrics["known_with_elements"] = int(named.sum())
                return ki
    return None


def _within_model(ki: KnownIssue, problem: AttentionProblem, a: Mapping[str, Any], v: "Violation") -> bool:
    """Whether ``v``, which ``ki``'s configuration rule absorbs, lies within ``ki``'s model: True
    without a model, for a violation the model does not judge (no ``judged`` values) and where the
    model does not reach the problem (``v.metrics["known_model"]`` says which); else every element
    the judge found over budget must lie within the model (:func:`defect_models.outside_model`).
    Outside it, ``v`` is narrowed to those elements and its message says so (once)."""
    if ki.model is None:
        if ki.names is not None:
            v.metrics["known_model"] = "elements"
        return True
    if v.metrics.get("outside_known_model") == ki.name:
        return False
    j = getattr(v, "judged", None)
    quantity = str(v.metrics.get("quantity", ""))
    if j is None:
        v.metrics.setdefault("known_model", "not judged by the model")
        return True
    models = j["ctx"].setdefault("models", {})
    if ki.name not in models:
        models[ki.name] = ki.model(problem, a, j["ctx"]["dout"], j["ctx"].get("dlse"))
    m = models[ki.name]
    if m is None or quantity not in m:
        v.metrics["known_model"] = "none"
        return True
    from fa4verify.fuzz.defect_models import MODEL_SLACK, outside_model
    ref, allow, slack = m[quantity], np.asarray(j["allow"], np.float64), MODEL_SLACK
    if callable(ref):           # a map of the oracle's values and allowances (the misread accumulator)
        ref, allow = ref(np.asarray(j["ref"], np.float64), np.broadcast_to(allow, np.shape(j["ref"])))
        slack = 0.0
    elif quantity in ("dq", "dk", "dv"):
        # Note [The misread accumulator] applies to whatever dQ (and, under GQA, dK / dV) the kernel
        # accumulated, a defect's too: measured on an H100 (2026-12-06), plan row 114 (alibi under
        # GQA at hd 72) returns the misread of the score-index defect's dQ, and three plan calls of
        # that defect at the odd head dims its dK / dV. Where that defect reads unknown memory (NaN
        # rows: mapped heads past the aux tensors) its padded rows and columns may too (the model
        # does not compute them; on an H100 at c6d84c7 row 114 returned NaN there): unknown, not 0
        name = "misread" if quantity == "dq" else "misread_kv"
        if name not in models:
            models[name] = (defect_models.sm90_dq_misread if quantity == "dq"
                            else defect_models.sm90_dkv_misread)(problem, a, None, None)
        if models[name] is not None:
            r = np.asarray(ref, np.float64)
            ref, allow = models[name][quantity](r, np.broadcast_to(allow, np.shape(ref)),
                                                np.nan if np.isnan(r).any() else 0.0)
    act = np.asarray(j["actual"], np.float64).reshape(ref.shape)
    out = outside_model(act, ref, np.broadcast_to(allow, ref.shape), slack)
    if j.get("taken") is not None:        # Note [Two defects in one violation]: another issue's elements
        e = j["taken"]
        out = out & ~_named_everywhere(e, problem, a, v, ref.shape)
    if not out.any():
        v.metrics["known_model"] = "within"
        return True
    idx = np.argwhere(out)
    err = np.abs(act - ref)
    worst = tuple(int(i) for i in idx[int(np.nanargmax(np.where(np.isfinite(err[out]), err[out], np.inf)))])
    note = (f" [outside known issue {ki.name}'s model at {len(idx)} element(s); worst at {worst}: got "
            f"{act[worst]!r}, the model {ref[worst]!r}]")
    v.message += note
    v.args = (f"[{v.prop}] {v.message}",)
    v.over_indices = idx
    v.metrics["outside_known_model"] = ki.name
    v.metrics[f"outside_model_{quantity}"] = int(len(idx))
    return False


def _named_everywhere(e: KnownIssue, problem: AttentionProblem, a: Mapping[str, Any], v: "Violation",
                      shape: tuple[int, ...]) -> np.ndarray:
    """Boolean ``shape``: every element of the tensor ``e`` names (asked of each element, not only
    the offending ones: its defect's elements need not lie outside the budget to lie outside
    another issue's model). Kept in the judged values' context (one tensor, asked once)."""
    cache = (v.judged or {}).get("ctx", {}).setdefault("named", {}) if v.judged else {}
    key = (e.name, v.prop, str(v.metrics.get("quantity", "")), tuple(shape))
    if key not in cache:
        probe = Violation(v.prop, v.message, dict(v.metrics))
        probe.over_indices = np.argwhere(np.ones(shape, bool))
        probe.judged = v.judged          # the values, where an issue names by them
        n = e.names(problem, a, probe)
        cache[key] = np.zeros(shape, bool) if n is None else np.asarray(n, bool).reshape(shape)
    return cache[key]


def known_issue_matcher(problem: AttentionProblem, target: str, *, strict: bool = False
                        ) -> "Callable[[Violation], Optional[KnownIssue]]":
    """:func:`match_known_issue` for the violations of one problem's run, materialising the
    problem at most once (only when a violation asks); ``strict``: nothing is ever matched."""
    cache: dict[str, Any] = {}

    def match(v: "Violation") -> Optional[KnownIssue]:
        if strict:
            return None
        if "a" not in cache:
            cache["a"] = problem.materialize()
        return match_known_issue(problem, v, cache["a"], target=target)
    return match
