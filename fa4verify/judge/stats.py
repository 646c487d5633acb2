"""The one producer of composed-budget statistics (``error_budgets/loader.py: STATISTICS``).

:class:`BudgetStats` computes, in float64 from the exact inputs and the oracle forward, every
statistic the composed budgets ``forward_out``, ``forward_lse``, ``backward_p`` and
``backward_dq/dk/dv`` read, for any :class:`~fa4verify.judge.problem.AttentionProblem`: dense
or varlen (zero-length sequences included), causal / local windows / mask_mod keep-patterns,
GQA/MQA, softcap (forward and backward) and learnable sinks. Kernel constants (KV tile width,
``max_offset``, lazy-rescale threshold) come from :func:`fa4verify.kernels.facts.kernel_constants`,
i.e. from the installed FA4.

Conventions (upper estimates where a choice exists, so budgets can only grow):

* ``n_blocks`` = KV tiles a row's visible keys span (FA4 iterates exactly these tiles), per row;
  ``n_rescale = n_blocks``;
* ``lg2_l = |log2 l_true| + max_offset + rescale_threshold`` (FA4's l carries up to
  2^(mo + threshold));
* ``sc_max`` includes a learnable sink's logit (its exponent argument);
* the dK/dV budgets use the largest per-row ``backward_p`` of the rows they sum over.

This module does not compare anything: :mod:`fa4verify.judge.verdict` does.
"""
from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any, Mapping, Optional

import numpy as np

from fa4verify.kernels import facts

__all__ = ["BudgetStats", "gamma", "FTZ"]

_LOG2E = math.log2(math.e)
_U32 = 2.0 ** -24
FTZ = 2.0 ** -126   # smallest normal fp32: what flush-to-zero can remove from one P


#: bytes of modelled kernel scores one statistics object keeps for its later backward passes
_S_KERNEL_BYTES = 1 << 28
#: bytes of interval P parts (Note [P before dO], error_budgets/interval.py) kept for later passes
_P_PART_BYTES = 1 << 28


class _Kept:
    """Values kept by key while their bytes fit ``limit`` (a later one that does not fit is not
    kept: its caller computes it again); one object shared by a statistics object's shallow copies."""

    def __init__(self, limit: int):
        self.items: dict = {}
        self.limit, self.bytes = int(limit), 0

    def put(self, key: Any, value: Any, nbytes: int) -> None:
        if key not in self.items and self.bytes + nbytes <= self.limit:
            self.items[key] = value
            self.bytes += int(nbytes)


def _same_arrays(a: tuple, b: tuple) -> bool:
    """Whether two tuples of arrays (or None) hold the same values, NaN equal to NaN."""
    return all((x is None and y is None) or (x is not None and y is not None and np.shape(x) == np.shape(y)
                                             and np.array_equal(x, y, equal_nan=True)) for x, y in zip(a, b))


def gamma(n, u=_U32):
    """Higham's gamma_n = n u / (1 - n u), +inf where n u >= 1."""
    nu = np.asarray(n, np.float64) * u
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(nu < 1, nu / (1 - nu), np.inf)


def _head(keep: np.ndarray, h: int) -> np.ndarray:
    """A segment's keep-mask of query head ``h``: ``keep`` itself, or its ``h``-th plane when the
    mask depends on the head (Note [Masks by head] in fa4verify/problem/__init__.py)."""
    return keep if keep.ndim == 2 else keep[h]


#: Note [A segment's heads at once] (:class:`BudgetStats`): the largest (heads x rows x keys) of a
#: segment whose heads' statistics are formed as one stack
_SEG_STACK_PAIRS = 1 << 18

#: the largest stack of (rows, keys) weights one product reads at once (Note [Head-major statistics])
_STACK_BYTES = 1 << 25


def _all_zero(x: np.ndarray) -> bool:
    """Whether every element of ``x`` is 0 (a loss through the LSE alone: dO = 0)."""
    return not np.any(x)


def _sum_keys(dst: np.ndarray, mt: np.ndarray, b: np.ndarray, fresh: bool, buf: np.ndarray) -> None:
    """``dst (+)= mt @ b`` into the contiguous key block ``dst``: assigned when ``fresh``."""
    if fresh:
        np.matmul(mt, b, out=dst)
    else:
        np.matmul(mt, b, out=buf)
        dst += buf


def _sums_both_sides(pairs: list, ak: np.ndarray, aq: np.ndarray, q_dst: dict, k_dst: dict, fresh: bool,
                     buf: np.ndarray) -> None:
    """For each ``(q name, k name, M)`` of ``pairs``: ``q_dst[q name] = M @ ak`` (the query side:
    one product of every M stacked, which reads the long ``ak`` once, where the stack is small)
    and ``k_dst[k name] (+)= M^T @ aq`` (the key side, :func:`_sum_keys`)."""
    lq, lk = pairs[0][2].shape
    if len(pairs) * lq * lk * 8 <= _STACK_BYTES:
        out = np.stack([m for _n, _k, m in pairs]).reshape(len(pairs) * lq, lk) @ ak
        for i, (n, _k, _m) in enumerate(pairs):
            q_dst[n][...] = out[i * lq:(i + 1) * lq]
    else:
        for n, _k, m in pairs:
            np.matmul(m, ak, out=q_dst[n])
    for _n, kn, m in pairs:
        _sum_keys(k_dst[kn], m.T, aq, fresh, buf)


#: the most (rows x keys) pairs, padding included, of one stack of interval blocks, and the most
#: of a block that joins a stack (a larger one is evaluated alone: its arithmetic outweighs numpy's
#: per-call cost already) (Note [Blocks in stacks])
_STACK_PAIRS = 1 << 18
_STACK_BLOCK = 1 << 12


class _Stack:
    """Note [Blocks in stacks]
    --------------------------
    The interval bound (:meth:`BudgetStats.backward_interval`) is evaluated per (segment, query
    head) block: a varlen call of 257 short sequences and 8 heads is 2,056 blocks of at most 9 x 13
    pairs, where numpy's per-call cost, not the arithmetic, was the judge's time (40 % of it on
    the default audit's heaviest calls). Small blocks (at most :data:`_STACK_BLOCK` pairs) of one
    size class are evaluated together, stacked
    along a leading axis and padded to the class's largest rows and keys: a padded row has no
    visible key (LSE ``-inf``, mask False), a padded key is masked, both with zero inputs, so every
    padded pair's P and dS is exactly 0 and adds nothing to a sum (error_budgets/interval.py reads
    each block on its last two axes; the row-wise LSE chain takes a stack as one block of all its
    rows). A real pair's interval is the one its block alone gives, up to the order of float64
    sums inside BLAS, which :data:`~error_budgets.interval.SLACK` covers (Note [Directed
    float64]). This object says where a stack's blocks sit in the token-major arrays: ``at_q`` /
    ``at_k`` gather a stack's rows / keys, ``put_q`` / ``add_k`` scatter its results back (a
    key block's GQA heads summed before they are added: another float64 order, inside the same
    slack). A stack of one block keeps that block's own
    arrays (no leading axis, no padding)."""

    def __init__(self, st: "BudgetStats", stack: list[tuple[int, int]]):
        w = st._w
        lqs = [w[b][0].stop - w[b][0].start for b, _h in stack]
        lks = [w[b][1].stop - w[b][1].start for b, _h in stack]
        B, Lq, Lk = len(stack), max(lqs), max(lks)
        self.one = B == 1
        self.units = list(stack)
        if self.one:                # a lone block: slices of the token-major arrays, as they are
            (b, h), = stack
            self._qs, self._ks, self._h, self._hk1 = w[b][0], w[b][1], h, h // st.g
            self.keep = _head(st._keeps[b], h)
            self.h = np.array([h], np.intp)
            return
        self.h = np.array([h for _b, h in stack], np.intp)
        self.hk = self.h // st.g
        self.qi = np.zeros((B, Lq), np.intp)
        self.ki = np.zeros((B, Lk), np.intp)
        self.qv = np.zeros((B, Lq), bool)
        self.kv = np.zeros((B, Lk), bool)
        self.keep = np.zeros((B, Lq, Lk), bool)
        for i, ((b, h), lq, lk) in enumerate(zip(stack, lqs, lks)):
            qs, ks = w[b][0], w[b][1]
            self.qi[i, :lq] = np.arange(qs.start, qs.stop)
            self.ki[i, :lk] = np.arange(ks.start, ks.stop)
            self.qv[i, :lq] = True
            self.kv[i, :lk] = True
            self.keep[i, :lq, :lk] = _head(st._keeps[b], h)
        self._hq = np.broadcast_to(self.h[:, None], (B, Lq))
        self._hk = np.broadcast_to(self.hk[:, None], (B, Lk))
        self._q_at = (self.qi[self.qv], self._hq[self.qv])
        # a key block's GQA heads add to the same keys: their values are summed first (stack order
        # kept by a stable sort), then added once
        lin = self.ki[self.kv] * (int(self.hk.max()) + 1) + self._hk[self.kv]
        self._k_order = np.argsort(lin, kind="stable")
        ls = lin[self._k_order]
        self._k_starts = np.flatnonzero(np.r_[True, ls[1:] != ls[:-1]])
        first = self._k_order[self._k_starts]
        self._k_at = (self.ki[self.kv][first], self._hk[self.kv][first])
        #: every key of every block as (token, KV head), in stack order
        self.k_at_all = (self.ki[self.kv], self._hk[self.kv])
        self._padded_q = not self.qv.all()
        self._padded_k = not self.kv.all()

    def at_q(self, x: np.ndarray, fill: float = 0.0) -> np.ndarray:
        """The stack's rows of a token-major ``(t, H, ...)`` array: (B, Lq, ...), padding ``fill``
        (a lone block: its own (lq, ...) view)."""
        if self.one:
            return x[self._qs, self._h]
        g = x[self.qi, self._hq]
        if self._padded_q:
            g[~self.qv] = fill
        return g

    def at_k(self, x: np.ndarray) -> np.ndarray:
        """The stack's keys of a token-major ``(t, Hk, ...)`` array: (B, Lk, ...), padding 0
        (a lone block: its own (lk, ...) view)."""
        if self.one:
            return x[self._ks, self._hk1]
        g = x[self.ki, self._hk]
        if self._padded_k:
            g[~self.kv] = 0.0
        return g

    def put_q(self, dst: np.ndarray, y: np.ndarray, head_major: bool = False) -> None:
        """``dst[rows, head] = y`` for each block's rows (``y`` as :meth:`at_q` gives);
        ``head_major``: ``dst`` is (H, t, ...) (Note [Head-major statistics])."""
        if self.one:
            if head_major:
                dst[self._h, self._qs] = y
            else:
                dst[self._qs, self._h] = y
            return
        dst[self._q_at[::-1] if head_major else self._q_at] = y[self.qv]

    def add_k(self, dst: np.ndarray, y: np.ndarray, head_major: bool = False) -> None:
        """``dst[keys, KV head] += y`` for each block's keys (a key's GQA heads summed first);
        ``head_major``: ``dst`` is (Hk, t, ...)."""
        if self.one:
            if head_major:
                dst[self._hk1, self._ks] += y
            else:
                dst[self._ks, self._hk1] += y
            return
        dst[self._k_at[::-1] if head_major else self._k_at] += np.add.reduceat(y[self.kv][self._k_order],
                                                                               self._k_starts, axis=0)


def _stack_score(spair, saux, ix: _Stack, w: list) -> tuple:
    """A score pair as :func:`error_budgets.interval.pair_p` takes it -- ``(ref(x), grad(x), err(x,
    y), lipschitz, curvature)`` on a block's ``x`` -- for the stack ``ix`` (Note [Blocks in
    stacks]): the pair's callables take one (segment, head) block with its own indices, so each
    is called per block on that block's part of the stack; a padded pair gets the identity (y =
    x, gradient 1, no error), which no visible pair reads."""
    if ix.one:
        (b, h), = ix.units
        lq, lk = ix.keep.shape
        sqi, ski = np.arange(lq)[:, None], np.arange(lk)[None, :]
        return (lambda x: spair.ref(x, b, h, sqi, ski, saux), lambda x: spair.grad(x, b, h, sqi, ski, saux),
                lambda x, y: spair.err(x, y, b, h, sqi, ski, saux),
                float(spair.lipschitz), float(getattr(spair, "curvature", np.inf)))
    parts = []
    for b, h in ix.units:
        lq, lk = w[b][0].stop - w[b][0].start, w[b][1].stop - w[b][1].start
        parts.append((b, h, lq, lk, np.arange(lq)[:, None], np.arange(lk)[None, :]))

    def each(fn, pad, x, y=None):
        out = np.full(x.shape, pad, np.float64) if pad is not None else np.array(x, np.float64)
        for i, (b, h, lq, lk, sqi, ski) in enumerate(parts):
            xi = x[i, :lq, :lk]
            r = fn(xi, b, h, sqi, ski, saux) if y is None else fn(xi, y[i, :lq, :lk], b, h, sqi, ski, saux)
            out[i, :lq, :lk] = np.broadcast_to(np.asarray(r, np.float64), (lq, lk))
        return out
    return (lambda x: each(spair.ref, None, x), lambda x: each(spair.grad, 1.0, x),
            lambda x, y: each(spair.err, 0.0, x, y),
            float(spair.lipschitz), float(getattr(spair, "curvature", np.inf)))


def kernel_constants_for(problem) -> facts.KernelConstants:
    causal, local, _, _ = facts.resolve_causal_local_window(problem.causal, problem.window_size)
    return facts.kernel_constants(problem.arch, problem.dtype, problem.head_dim, problem.head_dim_v,
                                  causal, local, mla=problem.call is not None and problem.call.mla)


class BudgetStats:
    """End-to-end budget statistics (error_budgets/loader.py ``STATISTICS``), computed in fp64 from
    the exact inputs and the oracle, in FA4's layouts:

    * ``out``-layout dicts: arrays broadcastable to ``out`` ((b, s, h, dv) or (t, h, dv));
    * ``lse``-layout: broadcastable to the LSE ((b, h, s) or (h, t));
    * ``dq``/``dk``/``dv``-layout: broadcastable to q, k, v.

    Conservative choices (upper estimates, so budgets can only grow): ``n_blocks`` is
    ceil(seqlen_k / tile_n) of the sequence, ``n_rescale = n_blocks``, ``lg2_l = |log2 l_true| +
    max_offset + rescale_threshold`` (FA4's l carries up to 2^(mo + threshold)), and the dK/dV
    budgets use the largest per-row ``backward_p`` of the rows they sum over.
    """

    def __init__(self, problem, a: Mapping[str, Any], ofwd: Any, budget: Any, *, tile_n: Optional[int] = None):
        """``tile_n``: the KV tile FA4 runs the call with where it is not the forward's own
        (its split-KV at hd != hdv: :func:`fa4verify.targets.split_kv_tile`)."""
        self.problem, self.budget = problem, budget
        #: the modelled kernel scores S = Q K^T per (tensor core, row window, head): a function of
        #: q and k alone, shared by this object's shallow copies (each backward pass of an example
        #: judged on the same statistics: the driver's, with a dLSE)
        self._s_kernel = _Kept(_S_KERNEL_BYTES)
        #: the interval bound's P part per (tensor core, row window, head) with the LSE it read
        #: (Note [P before dO]): shared by the shallow copies like ``_s_kernel``, reused by a pass
        #: whose forward LSE is the same (the passes differ in dO or dLSE only)
        self._p_parts = _Kept(_P_PART_BYTES)
        kcon = kernel_constants_for(problem)
        if tile_n is not None:
            kcon = dataclasses.replace(kcon, tile_n=int(tile_n))
        kc = {"tile_n": float(kcon.tile_n), "max_offset": float(kcon.max_offset),
              "threshold": float(kcon.rescale_threshold)}
        self.kernel = kcon
        causal_r, local_r, _, _ = facts.resolve_causal_local_window(problem.causal, problem.window_size)
        #: the backward kernel's KV tile (SM90: ``_tile_size_bwd_sm90``); the backward budgets count
        #: max(forward, backward) tiles per row (budgets only grow)
        self.bwd_tile_n = facts.bwd_tile(problem.arch, problem.head_dim, problem.head_dim_v, causal_r, local_r)[1]
        H, Hk = problem.nheads, problem.nheads_kv
        g = H // Hk
        D, Dv = problem.head_dim, problem.head_dim_v
        scale = problem.scale
        cap = float(problem.softcap)
        q, k, v = (np.asarray(a[n], np.float64) for n in ("q", "k", "v"))
        dout = np.asarray(a["dout"], np.float64) if a.get("dout") is not None else None
        O = np.asarray(ofwd.out, np.float64)
        lse = np.asarray(ofwd.lse, np.float64)
        varlen = problem.varlen
        if not varlen:   # unify: token-major (t, h, d) per segment, segments = batch entries
            q, k, v, O = (x.reshape((-1,) + x.shape[2:]) for x in (q, k, v, O))
            dout = None if dout is None else dout.reshape((-1,) + dout.shape[2:])
            lse_t = np.moveaxis(lse, 1, 2).reshape(-1, H)       # (b*s, h)
        else:
            lse_t = lse.T                                        # (t, h)
        tq = q.shape[0]
        row = {n: np.zeros((tq, H)) for n in ("qk_c_max", "sc_max", "mc_abs", "softcap_err", "lse_abs",
                                              "lg2_l", "seqlen_k", "seqlen_q", "n_blocks", "lse_log2_abs")}
        el = {n: np.zeros((tq, H, Dv)) for n in ("abs_pv", "sum_abs_v")}
        #: the hull fallback's statistics (DERIVATIONS.md#hull-fallback): over ALL keys of the
        #: segment and KV head (a superset of any mask's attended set), broadcast to the rows
        hull = {n: np.zeros((tq, H, Dv)) for n in ("v_max_abs", "v_range", "sum_abs_v_all")}
        sink = a.get("learnable_sink") if problem.sink else None
        #: the learnable sink's logit per head (natural log), or None
        self.sink = None if sink is None else np.asarray(sink, np.float64).reshape(-1)
        # (a sink of -inf adds exp2(-inf) = 0 exactly: no exponent argument, Note [A sink of -inf])
        sink_abs = None if sink is None else np.where(np.isneginf(self.sink), 0.0, np.abs(self.sink)) * _LOG2E
        self._arrays = a
        self._w: list = []  # per segment: (qs, ks, w (h, lq, lk), tanh (h, lq, lk))
        self._keeps: list = []
        self._nb_bwd = np.zeros((q.shape[0] if varlen else problem.batch * problem.seqlen_q, 1))
        bounds = problem._seq_bounds()
        if not varlen:
            bounds = [(b * problem.seqlen_q, problem.seqlen_q, b * problem.seqlen_k, problem.seqlen_k)
                      for b in range(problem.batch)]
        masks = problem.keep_masks(a) if problem.mods else problem.keep_masks()
        if problem.heads_differ:     # Note [Masks by head]: (H, lq, lk) per segment
            per_head = [masks] + [problem.keep_masks(a, head=h) for h in range(1, H)]
            masks = [np.stack([m[i] for m in per_head]) for i in range(len(masks))]
        # a score pair (fa4verify.mods): y = its reference, its derivative where softcap keeps
        # tanh, its fp32 evaluation error (plus the rounding of x = fl(S scale) FA4 does before
        # calling it) in the softcap_err slot (error_budgets/DERIVATIONS.md#score-mod)
        spair = problem.mod_pairs()[0] if problem.mods else None
        if spair is not None:
            from fa4verify import mods as _mods
            saux = _mods.aux_for(problem, spair, a)
        self.score_pair = spair
        for bidx, ((q0, lq, k0, lk), keep) in enumerate(zip(bounds, masks)):
            qs, ks = slice(q0, q0 + lq), slice(k0, k0 + lk)
            if lq == 0:
                continue
            tn = int(kc["tile_n"])
            tb = int(self.bwd_tile_n)
            sqi, ski = np.arange(lq)[:, None], np.arange(lk)[None, :]   # FA4's sequence-local positions
            if lk:
                span = keep if keep.ndim == 2 else keep.any(axis=0)   # by head: the union's tiles
                anyk = span.any(axis=1)
                first = np.where(anyk, np.argmax(span, axis=1), 0)
                last = np.where(anyk, lk - 1 - np.argmax(span[:, ::-1], axis=1), 0)
                nb = np.where(anyk, last // tn - first // tn + 1, 0).astype(np.float64)
                nbb = np.where(anyk, last // tb - first // tb + 1, 0).astype(np.float64)
            else:
                nb = nbb = np.zeros(lq)
            topk = problem.call.gather_topk if problem.call is not None else 0
            if topk:     # a top-k gather: FA4 walks every slot tile of a row, whatever keys they hold
                nb = np.where(anyk, np.maximum(nb, -(-topk // tn)), 0.0) if lk else nb
            self._nb_bwd[qs] = nbb[:, None]
            row["seqlen_k"][qs] = max(lk, topk)
            row["seqlen_q"][qs] = lq
            row["n_blocks"][qs] = nb[:, None]
            W = np.zeros((H, lq, lk))
            TH = np.zeros((H, lq, lk))
            # Note [A segment's heads at once]: the heads of a small segment (at most
            # _SEG_STACK_PAIRS pairs over all heads) in one stack of (heads, rows, keys) arrays
            # (a score pair's callables take one head: one at a time)
            one_by_one = spair is not None or H * lq * lk > _SEG_STACK_PAIRS
            for hs in ([[h] for h in range(H)] if one_by_one else [list(range(H))]):
                ha = np.asarray(hs, np.intp)
                hka = ha // g
                qh = np.swapaxes(q[qs][:, ha], 0, 1)                 # (n, lq, D)
                kh = np.swapaxes(k[ks][:, hka], 0, 1)                # (n, lk, D)
                vh = np.swapaxes(v[ks][:, hka], 0, 1)                # (n, lk, Dv)
                S = qh @ np.swapaxes(kh, 1, 2)
                A = np.abs(qh) @ np.swapaxes(np.abs(kh), 1, 2)
                x = S * scale
                if cap > 0:
                    th = np.tanh(x / cap)
                    y = cap * th
                    TH[ha] = th
                elif spair is not None:
                    h = hs[0]
                    y = np.broadcast_to(np.asarray(spair.ref(x[0], bidx, h, sqi, ski, saux), np.float64), x[0].shape)[None]
                    TH[h] = np.broadcast_to(np.asarray(spair.grad(x[0], bidx, h, sqi, ski, saux), np.float64),
                                            x[0].shape)
                else:
                    y = x
                vis = keep[None] if keep.ndim == 2 else keep[ha]      # (n or 1, lq, lk)
                anyv = vis.any(axis=2)
                neg = np.where(vis, 0.0, -np.inf)
                row["qk_c_max"][qs, ha] = (np.max(np.where(vis, A, 0.0), axis=2, initial=0.0) * scale * _LOG2E).T
                sc_max = np.max(np.where(vis, np.abs(y), 0.0), axis=2, initial=0.0) * _LOG2E
                if sink_abs is not None:
                    sc_max = np.maximum(sc_max, sink_abs[ha][:, None])
                row["sc_max"][qs, ha] = sc_max.T
                m = np.max(y + neg, axis=2, initial=-np.inf)
                m = np.where(anyv, m, 0.0)
                row["mc_abs"][qs, ha] = (np.abs(m) * _LOG2E).T
                if cap > 0:
                    se = budget.evaluate("softcap", {"abs_out": np.abs(y), "abs_score": np.abs(x)})
                    row["softcap_err"][qs, ha] = (np.max(np.where(vis, se, 0.0), axis=2, initial=0.0) * _LOG2E).T
                elif spair is not None:
                    se = _U32 * np.abs(x) + np.asarray(spair.err(x[0], y[0], bidx, h, sqi, ski, saux), np.float64)
                    row["softcap_err"][qs, ha] = (np.max(np.where(vis, se, 0.0), axis=2, initial=0.0) * _LOG2E).T
                    if not spair.lipschitz <= 1.0:
                        # the S-error terms of the budgets assume |dy/dx| <= 1: not derived, undecided
                        row["softcap_err"][qs, ha] = np.nan
                L = lse_t[qs][:, ha].T                                # (n, lq)
                fin = np.isfinite(L)
                with np.errstate(invalid="ignore", over="ignore"):
                    w = np.where(vis & fin[..., None], np.exp(y - np.where(fin, L, 0.0)[..., None]), 0.0)
                W[ha] = w
                lse_abs = np.where(fin, np.abs(L), 0.0)
                row["lse_abs"][qs, ha] = lse_abs.T
                row["lse_log2_abs"][qs, ha] = (lse_abs * _LOG2E).T
                row["lg2_l"][qs, ha] = (np.where(anyv & fin, np.abs(L - m) * _LOG2E, 0.0)
                                        + kc["max_offset"] + kc["threshold"]).T
                avh = np.abs(vh)
                el["abs_pv"][qs, ha] = np.swapaxes(w @ avh, 0, 1)
                el["sum_abs_v"][qs, ha] = np.swapaxes(vis.astype(np.float64) @ avh, 0, 1)
                if lk:
                    hi, lo = np.max(vh, axis=1), np.min(vh, axis=1)   # (n, Dv)
                    if sink is not None:      # the sink adds mass to l only: 0 joins the hull
                        hi, lo = np.maximum(hi, 0.0), np.minimum(lo, 0.0)
                    hull["v_max_abs"][qs, ha] = np.max(avh, axis=1)[None]
                    hull["v_range"][qs, ha] = (hi - lo)[None]
                    hull["sum_abs_v_all"][qs, ha] = np.sum(avh, axis=1)[None]
            self._w.append((qs, ks, W, TH))
            self._keeps.append(keep)
        self.H, self.Hk, self.g, self.D, self.Dv, self.scale = H, Hk, g, D, Dv, scale
        self.kc = kc
        self.q, self.k, self.v, self.dout, self.O = q, k, v, dout, O
        self.lse_t = lse_t
        self.ofwd = ofwd
        self.row, self.el = row, el
        self.hull = hull
        #: set by :meth:`forward_out_decided`: (mask of the elements the hull fallback bounds,
        #: the first-order ``forward_out`` there), so :meth:`backward` keeps its first-order premise
        self.out_fallback: tuple | None = None
        #: set by :meth:`backward`: why a gradient budget is still not valid somewhere, or None
        self.bwd_undecided_reason: Optional[str] = None
        self.abs_o = np.abs(O)
        self.varlen = varlen

    # -- layout helpers: token-major (t, h[, d]) -> FA4 layouts
    def _to_out(self, x: np.ndarray) -> np.ndarray:
        p = self.problem
        if p.varlen:
            return x
        return x.reshape((p.batch, p.seqlen_q) + x.shape[1:])

    def _to_lse(self, x: np.ndarray) -> np.ndarray:
        p = self.problem
        if p.varlen:
            return x.T
        return np.moveaxis(x.reshape(p.batch, p.seqlen_q, -1), 1, 2)

    def _to_kv(self, x: np.ndarray) -> np.ndarray:
        p = self.problem
        if p.varlen:
            return x
        return x.reshape((p.batch, p.seqlen_k) + x.shape[1:])

    def _common(self) -> dict[str, Any]:
        return {"d": float(self.D), "dv": float(self.Dv), "tile_n": self.kc["tile_n"],
                "max_offset": self.kc["max_offset"], "x_max": self.kc["max_offset"] + self.kc["threshold"]}

    def _row_stats(self, backward: bool = False) -> dict[str, np.ndarray]:
        r = dict(self.row)
        if backward:
            r["n_blocks"] = np.maximum(r["n_blocks"], self._nb_bwd)
        r["n_rescale"] = r["n_blocks"]
        return r

    def forward_out(self, name: str = "forward_out") -> np.ndarray:
        st = self._common()
        for n, x in self._row_stats().items():
            st[n] = x[..., None]
        st.update(self.el)
        st["abs_o"] = self.abs_o
        return self._to_out(np.broadcast_to(self.budget.evaluate(name, st), self.abs_o.shape))

    def forward_out_hull(self) -> np.ndarray:
        """The convex-hull fallback ``forward_out_hull`` (DERIVATIONS.md#hull-fallback), FA4's
        out layout: a rigorous bound on |O_kernel - O_exact| without first-order assumptions."""
        st = self._common()
        for n, x in self._row_stats().items():
            st[n] = x[..., None]
        st.update(self.el)
        st.update(self.hull)
        st["abs_o"] = self.abs_o
        return self._to_out(np.broadcast_to(self.budget.evaluate("forward_out_hull", st), self.abs_o.shape))

    def forward_out_decided(self, name: str = "forward_out") -> tuple[np.ndarray, np.ndarray]:
        """(budget, hull mask): the element-wise minimum of the valid bounds among ``name`` (the
        first-order composition) and ``forward_out_hull`` (Note [Hull fallback]).

        A bound is valid where it is finite and non-negative; where neither is, the first-order
        value stays (the judge leaves the element unjudged: undecided). ``hull mask``: the
        elements whose budget is the hull's (the first-order one vacuous or larger). A budget
        set without ``forward_out_hull`` (a user's fixture) gets the first-order budget and an
        all-false mask.

        Note [Hull fallback]: both are upper bounds on |O_kernel - O_exact| under the same kernel
        model, so their minimum is one; the hull bound holds for any logit magnitude, the
        first-order one only while its precondition holds; past it (``forward_first_order > 2^-7``,
        Note [First-order validity] in error_budgets/loader.py) ``forward_out`` is ``+inf``, so the
        hull's bound is taken automatically (DERIVATIONS.md#hull-fallback)."""
        fo = np.asarray(self.forward_out(name), np.float64)
        if "forward_out_hull" not in self.budget:
            return fo, np.zeros(fo.shape, bool)
        hb = np.asarray(self.forward_out_hull(), np.float64)
        ok_fo = np.isfinite(fo) & (fo >= 0)
        ok_h = np.isfinite(hb) & (hb >= 0)
        use_h = ok_h & (~ok_fo | (hb < fo))
        out = np.where(use_h, hb, fo)
        if name == "forward_out":
            self.out_fallback = (use_h, fo)
        return out, use_h

    def forward_out_ftz_floor(self) -> np.ndarray:
        """Flush-to-zero envelope of O: each P < 2^-126 may become 0 and l >= 1, so
        ``|dO| <= 2^-126 * sum_visible |V|``."""
        return self._to_out(FTZ * self.el["sum_abs_v"])

    def forward_lse(self, same_s: bool = False) -> np.ndarray:
        """``forward_lse`` per row; ``same_s``: without the S accumulation's term (``d`` = 0), the
        LSE's error against the log-sum-exp of the kernel's own scores (Note [Same S in both
        passes], error_budgets/interval.py)."""
        st = self._common()
        if same_s:
            st["d"] = 0.0
        st.update(self._row_stats())
        return self._to_lse(np.broadcast_to(self.budget.evaluate("forward_lse", st), self.row["lse_abs"].shape))

    def backward(self, obwd: Any, out_allow: np.ndarray, out_bound: np.ndarray, *,
                 probabilistic: bool = True, kernel_fwd: Optional[tuple] = None,
                 tensor_core: Optional[str] = None, dlse: Optional[np.ndarray] = None) -> dict[str, np.ndarray]:
        """Allowances for dq, dk, dv (FA4 layouts) given the oracle backward (exact O); with
        ``probabilistic`` also the sharper tier's ``dq_prob``/``dk_prob``/``dv_prob`` where the
        budget set has them (callers that judge only the worst-case tier skip their cost).
        ``dlse``: a gradient through the returned LSE (FA4's LSE layout; ``obwd`` must be the
        oracle's with the same ``dlse``): Note [The composed budgets with dLSE]; the sharper
        tier is not formed then.

        Note [Backward interval fallback]: where a first-order budget is not valid (``+inf`` past
        ``first_order``'s limit, or NaN), the element's allowance is the interval bound
        (:meth:`backward_interval`, DERIVATIONS.md#backward-interval), rigorous at any finite
        logit scale; ``self.bwd_fallback`` holds, per tensor, the elements it bounds.
        ``kernel_fwd``: the ``(out, lse)`` the kernel's backward read (its own forward outputs,
        FA4 layouts); without it the interval bound reads the oracle's O and LSE widened by their
        forward allowances."""
        dl_t = None if dlse is None else self._lse_tokens(np.asarray(dlse, np.float64))
        out = self._backward_first_order(obwd, out_allow, out_bound, probabilistic=probabilistic and dl_t is None,
                                         dl_t=dl_t)
        valid = {n: np.isfinite(b) & (b >= 0) for n, b in out.items()}
        self.bwd_fallback = {n: np.zeros(np.shape(b), bool) for n, b in out.items()}
        #: Note [A bound without power] (fa4verify/judge/verdict.py): per gradient element, the
        #: |exact| above which a bound admitting 0 has lost its power: the largest rounding level
        #: of the tensor's exact terms before they cancel (u_p times their size plus the P / dS
        #: cast floor p_sub), where the interval bound decides (a smaller exact value is within the
        #: rounding of the terms: a correct kernel may return ~0 there); +inf where the
        #: first-order budget decides (its allowance is relative to those terms already)
        self.bwd_blind_above = {n: np.full(np.shape(obwd_n), np.inf) for n, obwd_n in
                                (("dq", obwd.dq), ("dk", obwd.dk), ("dv", obwd.dv))}
        # the interval bound is computed where the first-order composition is invalid somewhere or
        # its premises are stretched (a P error past the limit, or O bounded by the hull): there the
        # first-order budgets, even where finite, carry worst-case row maxima (backward_p = expm1
        # of the row's LSE and S errors); on other problems they are kept unchanged (and cheap)
        from fa4verify.error_budgets.loader import FIRST_ORDER_LIMIT
        stretched = (not all(v.all() for v in valid.values())
                     or float(np.max(self._bp_row, initial=0.0)) > FIRST_ORDER_LIMIT
                     or (self.out_fallback is not None and bool(self.out_fallback[0].any())))
        # the interval bound models the standard backward kernel, not the sparse MLA one: an MLA
        # problem's invalid first-order budgets stay undecided (Note [The sparse MLA backward])
        stretched = stretched and not (self.problem.call is not None and self.problem.call.mla)
        if "bwd_s_accum" in self.budget and stretched:
            iv = self.backward_interval(obwd, out_allow, out_bound, kernel_fwd=kernel_fwd, tensor_core=tensor_core,
                                        dl_t=dl_t)
            blind_iv = self.bwd_blind_above
            self.bwd_blind_above = {}
            for n, b in out.items():
                alt = np.asarray(iv[n.replace("_prob", "")], np.float64)
                ok = np.isfinite(alt) & (alt >= 0)
                # both are upper bounds under the same kernel model: per element the smaller valid one
                use = ok & (~valid[n] | (alt < b))
                out[n] = np.where(use, alt, b)
                self.bwd_fallback[n] = use
                if n in blind_iv:
                    self.bwd_blind_above[n] = np.where(use, blind_iv[n], np.inf)
        self.bwd_undecided_reason = self._undecided_reason(out, kernel_fwd)
        return out

    def with_zero_dout(self, a0: Mapping[str, Any]) -> "BudgetStats":
        """These statistics for the same call with dO = 0 (a loss through the LSE alone; ``a0``:
        its arrays, dout zero): every statistic of the forward is the same (none reads dO), so
        only ``dout`` is replaced -- instead of building them again from the inputs (a pass that
        rebuilt them cost as much as the example's own). Per-call state of :meth:`backward` stays
        each copy's own."""
        st = copy.copy(self)
        if self.dout is not None:
            st.dout = np.zeros_like(self.dout)
        st._arrays = dict(self._arrays, dout=a0.get("dout"))     # the effective inputs, as built
        return st

    def _kernel_scores(self, tensor_core: Optional[str], model: Any, key: tuple, ix: "_Stack", qb: np.ndarray,
                       kb: np.ndarray) -> Optional[np.ndarray]:
        """The kernel's S of the stack ``ix`` (Note [Blocks in stacks]; ``qb``, ``kb``: its Q and K)
        under the tensor-core ``model`` (Note [SM90 MMA model]), None where it is not modelled (NaN
        on the blocks of a stack outside the model's domain); computed once per statistics."""
        if model is None:
            return None
        ckey = (tensor_core,) + key
        if ckey in self._s_kernel.items:
            return self._s_kernel.items[ckey]
        from fa4verify.kernels.twin.tensor_core import in_domain, mma
        dt = self.problem.dtype
        if ix.one:
            s = mma(qb, kb, None, model) if in_domain(qb, kb, dt) else None
        else:
            # (a block's zero padding is no input: in_domain reads nonzero values and d)
            dom = np.array([in_domain(a, b, dt) for a, b in zip(qb, kb)])
            s = None
            if dom.any():
                s = np.full(ix.keep.shape, np.nan, np.float32)
                s[dom] = mma(qb[dom], kb[dom], None, model)
        # kept while they fit _S_KERNEL_BYTES (a long row's scores are recomputed instead)
        self._s_kernel.put(ckey, s, 0 if s is None else s.nbytes)
        return s

    def _interval_stacks(self) -> list[list[tuple[int, int]]]:
        """Note [Blocks in stacks]: the interval bound's (segment, query head) blocks as
        ``(segment index, head)``, in stacks: one block each where a block has over
        :data:`_STACK_BLOCK` pairs, else the blocks of a size class (rows and keys each up to the next power of two) together, at most
        :data:`_STACK_PAIRS` padded pairs a stack. The same
        stacks for every pass of the statistics (their P parts are kept by stack)."""
        units = []
        for bidx, (qs, ks, _, _) in enumerate(self._w):
            lq, lk = qs.stop - qs.start, ks.stop - ks.start
            if lq and lk:
                units += [(bidx, h, lq, lk) for h in range(self.H)]
        classes: dict[tuple[int, int], list] = {}
        stacks = []
        for u in units:
            if u[2] * u[3] > _STACK_BLOCK:
                stacks.append([(u[0], u[1])])
            else:
                classes.setdefault(((u[2] - 1).bit_length(), (u[3] - 1).bit_length()), []).append(u)
        for c in sorted(classes):
            us = classes[c]
            per = max(1, _STACK_PAIRS // (max(u[2] for u in us) * max(u[3] for u in us)))
            stacks += [[(b, h) for b, h, _, _ in us[i:i + per]] for i in range(0, len(us), per)]
        return stacks

    def _undecided_reason(self, out: Mapping[str, np.ndarray], kernel_fwd: Optional[tuple]) -> Optional[str]:
        """Why some gradient budget is still not valid (Note [Backward interval fallback]): the
        forward output the backward read is NaN/inf, or the bound overflows float64; None when
        every budget is valid."""
        if all((np.isfinite(b) & (b >= 0)).all() for b in out.values()):
            return None
        if self.problem.call is not None and self.problem.call.mla:
            return ("a first-order budget of FA4's sparse MLA backward is not valid here (logits too large for it), "
                    "and the interval bound models the standard backward only (Note [The sparse MLA backward])")
        if kernel_fwd is not None:
            o = np.asarray(kernel_fwd[0], np.float64)
            lse = np.asarray(kernel_fwd[1], np.float64)
            n_o, n_l = int((~np.isfinite(o)).sum()), int(np.isnan(lse).sum())
            if n_o or n_l:
                return (f"the forward output the kernel's backward read is non-finite ({n_o} O value(s) NaN/inf, "
                        f"{n_l} LSE value(s) NaN): the budget defines nothing there")
        return ("the interval bound overflows float64 here (a P interval past 2^1024: an S rounding bound of "
                "over 1000 log2 units): the problem's logits are beyond what the bound can represent")

    def _builtin_softcap(self) -> float:
        """The softcap ``c`` the kernel applies with FA4's built-in operations: the problem's, or
        that of fa4verify's built-in softcap pair (Note [A softcap pair in the built-in's model]; a
        user pair's claim is not trusted); 0.0 without."""
        if self.problem.softcap:
            return float(self.problem.softcap)
        from fa4verify import mods as _mods
        sp = self.score_pair
        if sp is not None and set(sp.equivalent) == {"softcap"} and _mods.is_builtin(sp):
            return float(sp.equivalent["softcap"])
        return 0.0

    def backward_interval(self, obwd: Any, out_allow: np.ndarray, out_bound: np.ndarray, *,
                          kernel_fwd: Optional[tuple] = None, tensor_core: Optional[str] = None,
                          dl_t: Optional[np.ndarray] = None) -> dict[str, np.ndarray]:
        """The interval bound (error_budgets/interval.py, DERIVATIONS.md#backward-interval) for
        ``dq``, ``dk``, ``dv`` and ``dq_accum`` (FA4 layouts, dQ units before the cast): per
        element ``|mid - ref| + rad`` of the enclosure of every value the kernel model admits.
        ``tensor_core``: the arithmetic of the kernel's ``S = Q K^T`` where it is modelled bit for
        bit (``"sm90"``: Note [SM90 MMA model], ``kernels/twin/tensor_core.py``; the target says,
        ``Target.tensor_core``); then every score is the model's point instead of the worst-case
        ``bwd_s_accum`` enclosure."""
        from fa4verify.error_budgets import interval as ivm
        p = self.problem
        H, Hk, g, sc = self.H, self.Hk, self.g, self.scale
        q, k, v, dout = self.q, self.k, self.v, self.dout
        if dout is None:
            raise ValueError("BudgetStats.backward_interval: the arrays carry no dout")
        flat = lambda x: x.reshape((-1,) + x.shape[-2:]) if not p.varlen else x   # noqa: E731
        # the oracle's O and LSE widened by their decided forward allowances
        o_mid = self.O
        o_rad = flat(np.asarray(out_allow, np.float64)) + flat(np.asarray(out_bound, np.float64))
        lse_mid = self.lse_t
        lb = np.asarray(getattr(self.ofwd, "lse_bound", 0.0), np.float64)
        lse_rad = self._lse_tokens(np.broadcast_to(self.forward_lse(), np.shape(self.ofwd.lse)) + lb) \
            if "forward_lse" in self.budget else np.full(lse_mid.shape, np.inf)
        if kernel_fwd is not None:
            k_lse = self._lse_tokens(np.asarray(kernel_fwd[1], np.float64))
            # Note [A forward LSE outside every model]: a row whose kernel LSE is +-inf where the
            # exact one is finite (FA4's sink overflow: +inf, so its backward computes P = 0) is no
            # value the forward model admits; bounding that row's gradient from it would enclose
            # exactly what the faulty forward implies (mid 0: the bound |mid - ref| + rad becomes
            # |ref| + rad, which a zero gradient meets with equality however large the exact one,
            # and which read as tightness 0.999998 on clean FA4, H200 2026-12-02). Such rows read
            # the oracle's O and LSE with their allowances instead: the gradient is judged against
            # a correct forward, and the forward checks report the LSE itself.
            off = np.isinf(k_lse) & np.isfinite(lse_mid)
            self.bwd_lse_outside = off
            o_k = flat(np.asarray(kernel_fwd[0], np.float64))
            o_mid = np.where(off[..., None], o_mid, o_k)
            o_rad = np.where(off[..., None], o_rad, 0.0)
            lse_mid = np.where(off, lse_mid, k_lse)
            lse_rad = np.where(off, lse_rad, 0.0)
        # Note [Same S in both passes] (error_budgets/interval.py): on an arch whose budgets say
        # so, the kernel's own LSE is within forward_lse without the S accumulation of the
        # log-sum-exp of the scores its backward recomputes
        lse_self = None
        if kernel_fwd is not None and self.budget.constants.get("bwd_same_s") == 1 and "forward_lse" in self.budget:
            lse_self = np.where(off, np.nan, self._lse_tokens(np.broadcast_to(self.forward_lse(same_s=True),
                                                                             np.shape(self.ofwd.lse))))
        sink = self.sink
        tq, tk = q.shape[0], k.shape[0]
        acc = {"dq": [np.zeros((tq, H, self.D)) for _ in range(3)],
               "dk": [np.zeros((tk, Hk, self.D)) for _ in range(3)],
               "dv": [np.zeros((tk, Hk, self.Dv)) for _ in range(3)]}
        n_q = np.zeros((tq, 1, 1))
        n_k = np.zeros((tk, 1, 1))
        # Note [A bound without power]: the rounding level of each exact gradient's terms before
        # they cancel (u_p times their size plus the cast floors), and what the model lets a
        # correct kernel drop
        u_p, p_sub = float(self.budget.constants["u_p"]), float(self.budget.constants["p_sub"])
        mag = {"dq": np.zeros((tq, H, self.D)), "dk": np.zeros((tk, Hk, self.D)), "dv": np.zeros((tk, Hk, self.Dv))}
        mma_model = None
        if tensor_core is not None:
            from fa4verify.kernels.twin.tensor_core import model_for
            mma_model = model_for(tensor_core, p.dtype)     # None: not modelled for this dtype
        spair = self.score_pair
        # Note [A softcap pair in the built-in's model]: fa4verify's built-in softcap pair computes
        # FA4's built-in softcap with the built-in's own operations (kernels/mods.py softcap_mod;
        # a user pair's claim is not trusted here: its CuTe side is not fa4verify's) and is
        # bounded by the built-in's interval model at cap c: a
        # saturated score is +-RN(c) exactly and its factor 0 (the MUFU tanh envelope), and the
        # factor carries tanh.approx's error, where the generic pair step (Lipschitz and curvature
        # over the whole S interval) admitted any P of a saturated row and left a huge-logit dV
        # without power (DERIVATIONS.md#backward-interval step 2)
        from fa4verify import mods as _mods
        cap = self._builtin_softcap()
        if cap and not p.softcap:
            spair = None            # the built-in softcap pair: its CuTe side is fa4verify's own
        if spair is not None:
            saux = _mods.aux_for(p, spair, self._arrays)
        for qs, ks, _, _ in self._w:
            lq, lk = qs.stop - qs.start, ks.stop - ks.start
            if lk and lq:
                n_q[qs] = lk + np.maximum(self.row["n_blocks"][qs, :1], self._nb_bwd[qs])[:, :, None] + 2
                n_k[ks] = lq * g + 2
        # Note [Blocks in stacks]: the (segment, query head) blocks in stacks of one padded shape
        lse_b = np.broadcast_to(lse_rad, lse_mid.shape)
        for si, stack in enumerate(self._interval_stacks()):
            ix = _Stack(self, stack)        # a lone block: its own (lq, lk) arrays, no leading axis
            at_q = ix.at_q
            qb, kb, vb, dob = at_q(q), ix.at_k(k), ix.at_k(v), at_q(dout)
            keep = ix.keep
            score = None if spair is None else _stack_score(spair, saux, ix, self._w)
            # Note [P before dO]: the P part of a stack whose forward LSE an earlier pass read too
            lse_in = (at_q(lse_mid, -np.inf), at_q(lse_b), None if lse_self is None else at_q(lse_self, np.nan))
            pkey = (tensor_core, si)
            held = self._p_parts.items.get(pkey)
            pp = held[1] if held is not None and _same_arrays(held[0], lse_in) else None
            exact = (at_q(self.O), at_q(self.lse_t, -np.inf))
            if pp is None:
                pp = ivm.pair_p(self.budget, q=qb, k=kb, lse_mid=lse_in[0], lse_rad=lse_in[1],
                                keep=keep, scale=sc, softcap=cap, score=score, exact=exact, lse_self=lse_in[2],
                                sink=None if sink is None else (float(sink[stack[0][1]]) if ix.one else sink[ix.h]),
                                n_blocks=at_q(self.row["n_blocks"]),
                                s_kernel=self._kernel_scores(tensor_core, mma_model, (si,), ix, qb, kb))
                self._p_parts.put(pkey, (tuple(None if x is None else np.array(x) for x in lse_in), pp), pp.nbytes)
            pi = ivm.pair_intervals(self.budget, q=qb, k=kb, v=vb, dout=dob, o_mid=at_q(o_mid), o_rad=at_q(o_rad),
                                    lse_mid=lse_in[0], lse_rad=lse_in[1], keep=keep, scale=sc, exact=exact,
                                    dlse=None if dl_t is None else at_q(dl_t), p_part=pp)
            sw = lambda x: np.swapaxes(x, -1, -2)        # noqa: E731
            with np.errstate(invalid="ignore", over="ignore"):
                # u_p times the terms' size, plus the cast floor p_sub of each visible term
                # (a P or dS below it is cast to 0 by a correct kernel)
                kv = keep.astype(np.float64)
                # (+ the exact dS of the pairs the model lets it drop: a saturated softcap)
                lvl = u_p * pi.ds_mag + pi.ds_drop + p_sub * kv
                ix.put_q(mag["dq"], sc * (lvl @ np.abs(kb)))
                ix.add_k(mag["dk"], sc * (sw(lvl) @ np.abs(qb)))
                ix.add_k(mag["dv"], sw(u_p * pi.p_ex + p_sub * kv) @ np.abs(dob))
            for x, y in zip(acc["dq"], ivm.accumulate(pi.ds_lo, pi.ds_hi, kb)):
                ix.put_q(x, y)
            for x, y in zip(acc["dk"], ivm.accumulate(sw(pi.ds_lo), sw(pi.ds_hi), qb)):
                ix.add_k(x, y)
            for x, y in zip(acc["dv"], ivm.accumulate(sw(pi.p_lo), sw(pi.p_hi), dob)):
                ix.add_k(x, y)
        ref = {"dq": flat(np.asarray(obwd.dq, np.float64)), "dk": flat(np.asarray(obwd.dk, np.float64)),
               "dv": flat(np.asarray(obwd.dv, np.float64))}
        out: dict[str, np.ndarray] = {}
        with np.errstate(invalid="ignore", over="ignore"):
            for n, nt, s_ in (("dq", n_q, sc), ("dk", n_k, sc), ("dv", n_k, None)):
                mid, rad = ivm.finish(*acc[n], nt, self.budget, scale=s_)
                out[n] = (np.abs(mid - ref[n]) + rad) * ivm.WIDEN
                if n == "dq":
                    mid, rad = ivm.finish(*acc[n], nt, self.budget, scale=sc, cast=False)
                    out["dq_accum"] = (np.abs(mid - ref[n]) + rad) * ivm.WIDEN
        # Note [A bound without power]: a reference counts when it exceeds the largest rounding
        # level of the tensor's terms (below it, a correct kernel may return ~0)
        from fa4verify.judge.verdict import BLIND_FLOOR
        with np.errstate(invalid="ignore"):
            self.bwd_blind_above = {n: max(BLIND_FLOOR, float(np.max(np.where(np.isfinite(m), m, 0.0), initial=0.0)))
                                    for n, m in mag.items()}
        return {"dq": self._to_out(out["dq"]), "dq_accum": self._to_out(out["dq_accum"]),
                "dk": self._to_kv(out["dk"]), "dv": self._to_kv(out["dv"])}

    def _first_order_pairs(self, w: np.ndarray, G: np.ndarray, TH: Optional[np.ndarray], DOV: Optional[np.ndarray],
                           kf: np.ndarray, derr_col: np.ndarray, softcap_pair: bool, sc_sub: float) -> tuple:
        """dS and the (rows, keys) weights ``M`` whose sums ``M |K|`` (query side) and ``M^T |Q|``
        (key side) the first-order budgets read, as ``[(query-side name, key-side name, M)]``, of
        one block or a stack of them (:meth:`_backward_first_order`, :meth:`_first_order_stack`):
        ``w`` the P weights, ``G = dP - D'``, ``TH`` the softcap's tanh (or a score pair's dy/dx,
        or the built-in softcap pair's ``1 - t^2``), ``DOV = |dO| |V|^T``, ``kf`` the visible
        pairs (the subnormal floors' statistics), ``derr_col`` the D error per row (a column)."""
        p, sc = self.problem, self.scale
        dS = w * G
        if p.softcap > 0:
            dS = dS * (1 - TH ** 2)
        elif self.score_pair is not None:
            dS = dS * TH            # dy/dx of the score pair (|dy/dx| <= 1: DERIVATIONS.md#score-mod)
        pairs = []
        if p.softcap > 0 or softcap_pair:
            t2 = TH ** 2 if p.softcap > 0 else 1.0 - TH          # the pair's TH is 1 - t^2
            pairs.append(("abs_tanh_dsk", "abs_tanh_dsq", sc * (w * np.abs(G) * t2)))
        pairs.append(("abs_dsk", "abs_dsq", sc * np.abs(dS)))
        if DOV is not None:     # (None: dO = 0, the weights are 0 and their sums stay 0)
            pairs.append(("abs_p_dov_k", "abs_p_dov_q", sc * (w * DOV)))
        pairs += [("abs_p_derr_k", "abs_p_derr_q", sc * (w * derr_col)),
                  ("sub_dsk", "sub_dsq", sc_sub * kf), ("abs_dpd_k", "abs_dpd_q", sc * (np.abs(G) * kf))]
        return dS, pairs

    def _first_order_stack(self, ix: "_Stack", q_el: dict, k_el: dict, v_el: dict, k_row: dict, bp_row: np.ndarray,
                           derr: np.ndarray, derrp: np.ndarray, derr_s: np.ndarray, dl_t: Optional[np.ndarray],
                           need_rss: bool, softcap_pair: bool, sc_sub: float, zero_do: bool = False) -> None:
        """The sums of :meth:`_backward_first_order`'s loop for a stack of small blocks (Note
        [Blocks in stacks]): the same products, stacked, added into the head-major ``q_el`` (query
        side: each block's rows assigned), ``k_el`` and ``v_el`` (key side: added, a key's GQA
        heads summed first); ``k_row["backward_p"]`` the largest ``backward_p`` of the rows each
        key sums over."""
        p, sc = self.problem, self.scale
        sw = lambda x: np.swapaxes(x, -1, -2)        # noqa: E731
        B, Lq, Lk = ix.keep.shape
        w = np.zeros((B, Lq, Lk))
        TH = np.zeros((B, Lq, Lk)) if (p.softcap > 0 or self.score_pair is not None or softcap_pair) else None
        for i, (b, h) in enumerate(ix.units):
            lq, lk = self._w[b][2].shape[1:]
            w[i, :lq, :lk] = self._w[b][2][h]
            if TH is not None:
                TH[i, :lq, :lk] = self._w[b][3][h]
        qb, kb, vb, dob, Ob = ix.at_q(self.q), ix.at_k(self.k), ix.at_k(self.v), ix.at_q(self.dout), ix.at_q(self.O)
        aq, ak, ado = np.abs(qb), np.abs(kb), np.abs(dob)
        Dh = np.sum(Ob * dob, axis=-1)
        if dl_t is not None:
            Dh = Dh - ix.at_q(dl_t)
        G = np.broadcast_to(-Dh[..., None], w.shape) if zero_do else dob @ sw(vb) - Dh[..., None]
        kf = ix.keep.astype(np.float64)
        dS, pairs = self._first_order_pairs(w, G, TH, None if zero_do else ado @ sw(np.abs(vb)), kf,
                                            ix.at_q(derr)[..., None], softcap_pair, sc_sub)
        for nq, nk, m in pairs:
            ix.put_q(q_el[nq], m @ ak, head_major=True)
            ix.add_k(k_el[nk], sw(m) @ aq, head_major=True)
        if not zero_do:
            ix.add_k(v_el["abs_pdo"], sw(w) @ ado, head_major=True)
            ix.add_k(v_el["sum_abs_do"], sw(kf) @ ado, head_major=True)
        if need_rss:
            ix.put_q(q_el["rss_dsk"], sc * sc * (dS * dS) @ (kb ** 2), head_major=True)
            ix.add_k(k_el["rss_dsq"], sc * sc * sw(dS * dS) @ (qb ** 2), head_major=True)
            if not zero_do:
                ix.add_k(v_el["rss_pdo"], sw(w * w) @ (dob ** 2), head_major=True)
            ix.put_q(q_el["derrp_pk"], sc * ix.at_q(derrp)[..., None] * np.abs(w @ kb), head_major=True)
            ix.add_k(k_el["rss_p_derrp_q"], sc * sc * sw((w * ix.at_q(derr_s)[..., None]) ** 2) @ (qb ** 2),
                     head_major=True)
        bmax = np.max(np.where(ix.qv, ix.at_q(np.asarray(bp_row, np.float64)), 0.0), axis=1, initial=0.0)
        np.maximum.at(k_row["backward_p"], ix.k_at_all, np.broadcast_to(bmax[:, None], ix.kv.shape)[ix.kv])

    def _lse_tokens(self, lse: np.ndarray) -> np.ndarray:
        """An LSE-layout array ((b, h, s) dense, (h, t) varlen) token-major: (t, h)."""
        if self.problem.varlen:
            return np.asarray(lse).T
        return np.moveaxis(np.asarray(lse), 1, 2).reshape(-1, self.H)

    def _backward_first_order(self, obwd: Any, out_allow: np.ndarray, out_bound: np.ndarray, *,
                              probabilistic: bool = True, dl_t: Optional[np.ndarray] = None) -> dict[str, np.ndarray]:
        """The first-order composed budgets ``backward_*`` (DERIVATIONS.md#bwd-composition);
        ``dl_t``: a gradient through the LSE, token-major (t, H).

        Note [The composed budgets with dLSE]
        -------------------------------------
        With a gradient through the returned LSE, FA4's preprocess writes ``D' = RN(D - dLSE)``
        and the main kernel reads it as D (``flash_bwd_preprocess.py``); dLSE enters nowhere
        else. So every ``backward_*`` budget keeps its form, its statistics read D' where they
        read D (``dS = P (dP - D')``, ``|dP - D'|``), and the D error ``derr`` gains the one fp32
        subtraction: ``|D'~ - D'| <= derr (1 + u) + u (sum_d (|O| + b_O) |dO| + |dLSE|)``
        (dLSE is an fp32 value, exact; DERIVATIONS.md#bwd-composition). The interval bound
        widens D the same way (error_budgets/interval.py ``pair_intervals``)."""
        p = self.problem
        if self.dout is None:
            raise ValueError("BudgetStats.backward: the arrays carry no dout")
        H, Hk, g, sc = self.H, self.Hk, self.g, self.scale
        q, k, v, dout, O = self.q, self.k, self.v, self.dout, self.O
        tq, tk = q.shape[0], k.shape[0]
        flat = lambda x: x.reshape((-1,) + x.shape[-2:]) if not p.varlen else x   # noqa: E731
        out_allow = np.asarray(out_allow, np.float64)
        if self.out_fallback is not None and self.out_fallback[0].any() \
                and np.shape(out_allow) == self.out_fallback[0].shape:
            # Note [Hull fallback]: the backward budgets are first order in the forward O error
            # (DERIVATIONS.md#bwd-composition); where the forward first-order budget is vacuous
            # their premise fails too, so the hull bound does not feed them (they stay undecided)
            out_allow = np.where(self.out_fallback[0], self.out_fallback[1], out_allow)
        bO = flat(out_allow) + flat(np.asarray(out_bound, np.float64))
        # Note [The sparse MLA backward]: FA4's MLA D reads O plus its fp32 residual (an fp32 O, so
        # each product rounds too: one more u), and its dS carries the softmax scale before the cast
        mla = p.call is not None and p.call.mla
        derr = np.sum(bO * np.abs(dout), axis=-1) \
            + gamma(self.Dv + (1 if mla else 0)) * np.sum((np.abs(O) + bO) * np.abs(dout), axis=-1)
        sc_sub = 1.0 if mla else sc
        if dl_t is not None:      # Note [The composed budgets with dLSE]: D' = RN(D - dLSE)
            derr = derr * (1 + _U32) + _U32 * (np.sum((np.abs(O) + bO) * np.abs(dout), axis=-1) + np.abs(dl_t))
        # the probabilistic D error (DERIVATIONS.md#probabilistic-bwd): the O errors as a Hoeffding
        # sum over d (bounded by the probabilistic forward allowance when the set has it)
        prob = probabilistic and all(f"backward_{n}_prob" in self.budget for n in ("dq", "dk", "dv"))
        if prob:
            lam = float(getattr(self.budget, "constants", {}).get("lam", 6.0))
            bOp = bO
            if "forward_out_prob" in self.budget:
                bOp = flat(self.forward_out("forward_out_prob")) + flat(np.asarray(out_bound, np.float64))
            from fa4verify.error_budgets.loader import _gamma_prob
            # derr_s: the D error in units of lam (one Hoeffding sum over (d) for dQ, one over (i, d) for dK)
            derr_s = np.sqrt(np.sum((bOp * dout) ** 2, axis=-1)) \
                + _gamma_prob(self.Dv, _U32, lam) * np.sum((np.abs(O) + bOp) * np.abs(dout), axis=-1) / lam
            derrp = lam * derr_s
        else:
            lam, derrp, derr_s = 6.0, derr, derr
        # the sharper tier's sums only where a formula reads them (each a (tokens, heads, d) float64
        # array): the sharper tier's, or a worst-case one of a budget set that names them
        rss = ("rss_dsk", "derrp_pk", "rss_dsq", "rss_p_derrp_q", "rss_pdo")
        need_rss = prob or any(n in self.budget.get(b).stats for b in ("backward_dq", "backward_dk", "backward_dv",
                                                                      "backward_dq_accum")
                               if b in self.budget for n in rss)
        # Note [Head-major statistics]: the per-element sums are built head-major, (heads, tokens,
        # d), so every (head, segment) destination is one contiguous block a product writes in
        # place (the first of a key block's heads assigns, the rest of its GQA group add); they
        # are turned token-major after the loop. A long row's (keys, d) destinations are the loop's
        # memory traffic (a strided += of a 34k-key block cost twice its product on the CPU)
        q_el = {n: np.zeros((H, tq, self.D)) for n in ("abs_dsk", "abs_p_dov_k", "abs_p_derr_k", "sub_dsk",
                                                        "abs_dpd_k", "abs_tanh_dsk")
                + (("rss_dsk", "derrp_pk") if need_rss else ())}
        k_el = {n: np.zeros((Hk, tk, self.D)) for n in ("abs_dsq", "abs_p_dov_q", "abs_p_derr_q", "sub_dsq",
                                                         "abs_dpd_q", "abs_tanh_dsq")
                + (("rss_dsq", "rss_p_derrp_q") if need_rss else ())}
        # the softcap factor 1 - tanh^2 that FA4 forms from tanh.approx (built-in softcap, or the
        # built-in softcap pair): its error is absolute, up to 2.01 tanh_rel t^2 (t = tanh(x / cap)),
        # not relative to the exact factor, which saturation takes to ~0 (DERIVATIONS.md#bwd-composition)
        softcap_pair = not p.softcap and self._builtin_softcap() > 0
        v_el = {n: np.zeros((Hk, tk, self.Dv)) for n in ("abs_pdo", "sum_abs_do") + (("rss_pdo",) if need_rss else ())}
        k_row = {n: np.zeros((tk, Hk)) for n in ("seqlen_q", "seqlen_k", "n_blocks", "backward_p")}
        # backward_p per query row, then its max over the rows each key sums over
        st = self._common()
        st.update(self._row_stats(backward=True))
        # Note [The sparse MLA backward]: with the P its forward saved, P's own budget
        p_budget = ("backward_p_rebuilt" if p.call.recompute_p else "backward_p_saved") if mla else "backward_p"
        bp_row = np.broadcast_to(self.budget.evaluate(p_budget, st), (tq, H))
        self._bp_row = bp_row
        keeps = {(qs.start, ks.start): km for (qs, ks, _, _), km in zip(self._w, self._keeps)}
        keep_of = lambda qs, ks: keeps[(qs.start, ks.start)]   # noqa: E731
        # a key block is fresh for a KV head until one of its query heads wrote it: the first
        # product assigns (no zero-fill read back); only where the windows' key ranges are disjoint
        spans = sorted((ks.start, ks.stop) for _qs, ks, _W, _TH in self._w if ks.stop > ks.start)
        disjoint = all(a1 <= b0 for (_a0, a1), (b0, _b1) in zip(spans, spans[1:]))
        written: set = set()
        # a loss through the LSE alone (dO = 0): every product with dO is exactly 0 (the arrays start
        # at 0), so none is formed (dP = 0: G = -D')
        zero_do = _all_zero(dout)
        # Note [Blocks in stacks]: the small blocks' sums in stacks (after this loop, adding)
        stacks = [st_ for st_ in self._interval_stacks() if len(st_) > 1]
        stacked = {u for st_ in stacks for u in st_}
        for bidx, (qs, ks, W, TH) in enumerate(self._w):
            lq, lk = qs.stop - qs.start, ks.stop - ks.start
            if lk == 0:
                continue
            k_row["seqlen_q"][ks] = lq * g      # dK/dV of a kv head accumulate over its g query heads
            if mla:    # FA4's MLA dv: an MMA over the heads of each token, both uses, then one add per token
                k_row["seqlen_q"][ks] = max(lq * g, 2 * g + lq)
            k_row["seqlen_k"][ks] = lk
            k_row["n_blocks"][ks] = float(np.maximum(self.row["n_blocks"][qs, 0], self._nb_bwd[qs, 0]).max()) if lq else 0
            ak = av = None
            # one reused (keys, d) buffer per width for the adds of a GQA group's later heads
            bk, bkv = np.empty((lk, self.D)), np.empty((lk, self.Dv))
            for h in range(H):
                hk = h // g
                fresh = disjoint and (ks.start, hk) not in written
                written.add((ks.start, hk))
                if h % g == 0:      # |K|, |V| of this KV head: read by each of its g query heads
                    ak, av = np.abs(k[ks, hk]), np.abs(v[ks, hk])
                if (bidx, h) in stacked:
                    continue
                aq, ado = np.abs(q[qs, h]), np.abs(dout[qs, h])
                w = W[h]
                Dh = np.sum(O[qs, h] * dout[qs, h], axis=-1)
                if dl_t is not None:
                    Dh = Dh - dl_t[qs, h]
                G = np.broadcast_to(-Dh[:, None], w.shape) if zero_do else dout[qs, h] @ v[ks, hk].T - Dh[:, None]
                kf = _head(keep_of(qs, ks), h).astype(np.float64)
                dS, pairs = self._first_order_pairs(w, G, None if TH is None else TH[h],
                                                    None if zero_do else ado @ av.T, kf, derr[qs, h][:, None],
                                                    softcap_pair, sc_sub)
                _sums_both_sides(pairs, ak, aq, {n: q_el[n][h, qs] for n, _m, _x in pairs},
                                 {m: k_el[m][hk, ks] for _n, m, _x in pairs}, fresh, bk)
                if not zero_do:
                    _sum_keys(v_el["abs_pdo"][hk, ks], w.T, ado, fresh, bkv)
                    _sum_keys(v_el["sum_abs_do"][hk, ks], kf.T, ado, fresh, bkv)
                if need_rss:   # sums of squares here, square roots after the loop
                    q_el["rss_dsk"][h, qs] = sc * sc * (dS * dS) @ (k[ks, hk] ** 2)
                    k_el["rss_dsq"][hk, ks] += sc * sc * (dS * dS).T @ (q[qs, h] ** 2)
                    if not zero_do:
                        v_el["rss_pdo"][hk, ks] += (w * w).T @ (dout[qs, h] ** 2)
                    # a D error dD_i shifts every dS_ij of row i by -P_ij dD_i: dQ_id by exactly
                    # -scale dD_i (P K)_id (first order), dK_jd by a sum over independent rows
                    q_el["derrp_pk"][h, qs] = sc * derrp[qs, h][:, None] * np.abs(w @ k[ks, hk])
                    k_el["rss_p_derrp_q"][hk, ks] += sc * sc * ((w * derr_s[qs, h][:, None]) ** 2).T @ (q[qs, h] ** 2)
                k_row["backward_p"][ks, hk] = np.maximum(k_row["backward_p"][ks, hk],
                                                         np.max(bp_row[qs, h], initial=0.0))
        for stack in stacks:
            self._first_order_stack(_Stack(self, stack), q_el, k_el, v_el, k_row, bp_row, derr, derrp, derr_s,
                                    dl_t, need_rss, softcap_pair, sc_sub, zero_do)
        # token-major (tokens, heads, d), as every budget formula reads them: views (a formula is
        # elementwise, and reads each slab of tokens with d contiguous; a copy of each was 14 passes
        # over 100 MB arrays on a 34k-key row)
        for d_ in (q_el, k_el, v_el):
            for n in d_:
                d_[n] = d_[n].transpose(1, 0, 2)
        # flush-to-zero envelope: every P below 2^-126 may become 0 (ex2.approx.ftz): FTZ times
        # the visible terms |dP - D| |K| (|Q|) and |dO| (a power of two: exactly those sums scaled)
        floor = {"dq": FTZ * q_el["abs_dpd_k"], "dk": FTZ * k_el["abs_dpd_q"], "dv": FTZ * v_el["sum_abs_do"]}
        if need_rss:
            for d_, n in ((q_el, "rss_dsk"), (k_el, "rss_dsq"), (v_el, "rss_pdo"), (k_el, "rss_p_derrp_q")):
                d_[n] = np.sqrt(d_[n])
        out: dict[str, np.ndarray] = {}
        common = self._common()
        # dq (query layout)
        st = dict(common)
        for n, x in self._row_stats(backward=True).items():
            st[n] = x[..., None]
        st["backward_p"] = bp_row[..., None]
        st.update(q_el)
        st["abs_dq"] = flat(np.abs(np.asarray(obwd.dq, np.float64)))
        out["dq"] = self._to_out(np.broadcast_to(self.budget.evaluate("backward_dq", st), q.shape))
        if "backward_dq_accum" in self.budget:   # the dq_accum stage tap (before the cast)
            out["dq_accum"] = self._to_out(np.broadcast_to(self.budget.evaluate("backward_dq_accum", st), q.shape))
        if prob:
            out["dq_prob"] = self._to_out(np.broadcast_to(self.budget.evaluate("backward_dq_prob", st), q.shape))
        # dk, dv (key layout)
        st = dict(common)
        for n, x in k_row.items():
            st[n] = x[..., None]
        st.update(k_el)
        st["abs_dk"] = flat(np.abs(np.asarray(obwd.dk, np.float64)))
        out["dk"] = self._to_kv(np.broadcast_to(self.budget.evaluate("backward_dk", st), k.shape))
        if prob:
            out["dk_prob"] = self._to_kv(np.broadcast_to(self.budget.evaluate("backward_dk_prob", st), k.shape))
        st.update(v_el)
        st["abs_dv"] = flat(np.abs(np.asarray(obwd.dv, np.float64)))
        out["dv"] = self._to_kv(np.broadcast_to(self.budget.evaluate("backward_dv", st), v.shape))
        if prob:
            out["dv_prob"] = self._to_kv(np.broadcast_to(self.budget.evaluate("backward_dv_prob", st), v.shape))
        self.ftz_floor = {"dq": self._to_out(floor["dq"]), "dk": self._to_kv(floor["dk"]),
                          "dv": self._to_kv(floor["dv"])}
        return out
