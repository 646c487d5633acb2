"""The target layer: what fa4verify runs and judges. One interface, two kinds of target.

* :class:`TwinTarget` -- the CPU twin of FA4 (``fa4verify.kernels.twin.attention``) for any arch
  (sm90 / sm100 / sm103), optionally with planted ``mutations`` ("CPU twin");
* :class:`ProductionTarget` -- production FA4 through ``fa4verify.kernels.adapter`` on the local
  GPU, whatever GPU FA4 supports: the arch comes from the device (:func:`fa4verify.kernels.device.local_gpu`),
  figures are labelled ``measured on <GPU> (sm_XY)``. On SM100/SM103 ``emulation="disabled"``
  runs FA4 with its exp2 polynomial switched off (``adapter.exp2_emulation_disabled``: every exp2
  on MUFU), so a check can report the production-level cost of the polynomial.

Both take an :class:`~fa4verify.problem.AttentionProblem` and its materialised arrays (float32
holding exact dtype values, FA4 layout) and return :class:`Fwd` / :class:`Bwd` in float64. The
audit checks, the fuzz properties and the compile-only SM100 path (``FakeTensorMode``,
``tests/test_production_compile_only.py``) all run production through this module.
"""
from __future__ import annotations

import contextlib
import functools
import dataclasses
from typing import Any, Collection, Mapping, Optional

import numpy as np

from fa4verify.problem import CALL_FEATURES, MOD_FEATURE, FEATURES, AttentionProblem
from fa4verify.errors import Unsupported, DependencyMissing, HarnessError

__all__ = ["Target", "TwinTarget", "ProductionTarget", "Fwd", "Bwd", "make_target"]


from fa4verify.judge.attention import as_input_dtype as _typed  # noqa: E402  (one dtype conversion)


# ============================================================================ results
@dataclasses.dataclass
class Fwd:
    """Forward result in FA4 layout, as float64 (exact copies of what the target stored).
    ``native`` optionally keeps the target's own (out, lse) objects for its backward."""
    out: np.ndarray
    lse: np.ndarray
    native: Any = None
    #: Note [Scratch guard]: buffer name -> its ``GuardReport`` (fa4verify.determinism) for the O
    #: and LSE buffers the target guarded in this call; None where it guards none
    guard: Optional[Mapping[str, Any]] = None
    #: Note [Split-KV as a call form] (fa4verify.judge.split_combine): a split-KV call's fp32
    #: partials in FA4's layouts, ``(out_partial (S, b, sq, h, dv), lse_partial (S, b, sq, h))``,
    #: where the target hands them over; None otherwise
    partials: Optional[tuple[np.ndarray, np.ndarray]] = None


@dataclasses.dataclass
class Bwd:
    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    dsink: Optional[np.ndarray] = None
    #: the target's intermediate data where it exposes them (the twin's ``stages``, e.g. the fp32
    #: ``dq_accum``; dense problems only), else None
    stages: Optional[Mapping[str, Any]] = None
    #: Note [Scratch guard] (fa4verify/kernels/stage_taps.py): buffer name -> its ``GuardReport``
    #: (fa4verify.determinism) for the buffers the target guarded in this call; None where it
    #: guards none
    guard: Optional[Mapping[str, Any]] = None


def armed_guard(name: str, shape: tuple, dtype: Any, device: Any) -> Any:
    """Note [Scratch guard] (fa4verify/kernels/stage_taps.py): a NaN-filled buffer between two
    sentinel bands (:class:`fa4verify.determinism.GuardedBuffer`, armed), whose ``view`` FA4 gets."""
    from fa4verify.determinism.guard import GuardedBuffer
    buf = GuardedBuffer(name, shape, dtype, device)
    buf.arm()
    return buf


# ============================================================================ targets
class Target:
    """What the properties run. Subclasses implement :meth:`forward` and :meth:`backward` on
    materialised arrays (float32 holding exact dtype values, FA4 layout)."""

    name = "target"
    where = ""
    #: bitwise batch invariance / GQA equality are expected (CPU twin) or only within budget.
    bitwise_invariants = False
    #: a numpy model has no run-to-run nondeterminism to find (deterministic_bwd is skipped).
    deterministic_by_construction = False
    #: the code under test is FA4, reached through fa4verify's own call: an exception raised in
    #: fa4verify's code is fa4verify's error, not the target's (Note [Blame]); on the twin the
    #: model is fa4verify's code and is the subject
    blames_fa4 = False
    #: the arithmetic of the target's ``S = Q K^T`` where a bit-exact model of it was measured
    #: ("sm90": kernels/twin/tensor_core.py, Note [SM90 MMA model]); the judge then takes each
    #: score as that point instead of the worst-case inner-product enclosure. None: not modelled
    tensor_core: Optional[str] = None

    def features(self) -> tuple[str, ...]:
        """Problem features this target can run (subset of FEATURES)."""
        return FEATURES

    def check_supported(self, problem: AttentionProblem) -> None:
        """Raise :class:`Unsupported` when the target cannot run ``problem``."""

    def backward_unsupported(self, problem: AttentionProblem) -> Optional[str]:
        """Why the target has no backward for ``problem`` (the forward still runs), or None."""
        return _call_backward_unsupported(problem)

    def dlse_unsupported(self, problem: AttentionProblem) -> Optional[str]:
        """Why ``backward(..., dlse=)`` (a gradient through the returned LSE, Note [A gradient
        through the LSE]) cannot run for ``problem``, or None."""
        return f"the {self.name} target takes no gradient through the LSE"

    def autograd_unsupported(self, problem: AttentionProblem) -> Optional[str]:
        """Why :meth:`backward_autograd` (the public autograd path, Note [The public autograd
        path]) cannot run for ``problem``, or None."""
        return f"the {self.name} target has no public autograd path"

    def backward_autograd(self, problem: AttentionProblem, a: Mapping[str, Any], *, deterministic: bool = True,
                          dlse: Optional[np.ndarray] = None, lse_only: bool = False) -> Bwd:
        raise Unsupported(self.autograd_unsupported(problem) or "no public autograd path")

    def forward(self, problem: AttentionProblem, a: Mapping[str, Any]) -> Fwd:
        raise NotImplementedError

    def forward_inference(self, problem: AttentionProblem, a: Mapping[str, Any]) -> np.ndarray:
        """O of the problem's inference call (no LSE asked, no gradient). A target whose forward
        does not depend on it (the twin) returns its forward's O."""
        return self.forward(problem, a).out

    def backward(self, problem: AttentionProblem, a: Mapping[str, Any], fwd: Fwd, *,
                 deterministic: bool = True) -> Bwd:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"target": self.name, "where": self.where}


def production_features() -> tuple[str, ...]:
    """The problem features production FA4 runs (:meth:`ProductionTarget.features`, known without
    a GPU): boolean mask_mod patterns are twin-only; CuTe mask_mods come as call forms
    (mask_mod_fn) and as registered score_mod / mask_mod pairs (mod_pairs, fa4verify.mods)."""
    return tuple(f for f in FEATURES if f != "mask_mod") + CALL_FEATURES + (MOD_FEATURE,)


class TwinTarget(Target):
    """The CPU twin (``fa4verify.kernels.twin.attention``), optionally with ``mutations``.

    The twin has no varlen entry point; varlen problems run sequence by sequence through the dense
    twin (each sequence is an independent attention call in FA4 as well) and are reassembled in
    FA4's varlen layout. mask_mod patterns run only if the twin accepts a ``mask`` argument.
    """

    name = "twin"
    where = "CPU twin"
    bitwise_invariants = True
    deterministic_by_construction = True

    def __init__(self, mutations: Collection[str] = (), *, accumulation: str = "exact-then-round",
                 mufu: str = "correctly-rounded", seed: int = 0):
        self.mutations = frozenset(mutations)
        #: faults planted in the twin's call-form layer (not in the kernel model)
        self.layout_mutations = self.mutations & set(LAYOUT_MUTATIONS)
        self.accumulation = accumulation
        #: the twin's tensor-core model, where it runs one (fa4verify.kernels.twin.fp32.mma)
        self.tensor_core = "sm90" if accumulation == "sm90-tensor-core" else None
        self.mufu = mufu
        self.seed = int(seed)   #: the MUFU model's seed (mufu="perturbed")
        from fa4verify.kernels.twin import attention as twin_attention
        self._ta = twin_attention
        known = set(getattr(self._ta, "MUTATIONS", ())) | set(LAYOUT_MUTATIONS)
        bad = self.mutations - known
        if bad:
            raise ValueError(f"unknown mutation(s) {sorted(bad)}; the twin knows {sorted(known)}")

    def features(self) -> tuple[str, ...]:
        # the twin models no boolean mask_mod pattern yet; call forms run through
        # fa4verify.call_layout (gathered K/V, or the exact varlen rewrite of a keep-pattern)
        return tuple(f for f in FEATURES if f != "mask_mod") + CALL_FEATURES

    def check_supported(self, problem: AttentionProblem) -> None:
        if problem.mask_mod is not None and "mask_mod" not in self.features():
            raise Unsupported("the twin does not model mask_mod patterns")
        if self.tensor_core is not None:
            from fa4verify.kernels.twin.tensor_core import model_for
            if problem.arch != "sm90" or model_for(self.tensor_core, problem.dtype) is None:
                raise Unsupported("the SM90 tensor-core model covers sm90 problems with bf16 or fp16 inputs, "
                                  f"not {problem.arch} {problem.dtype}")
        if problem.mods:
            raise Unsupported("the twin does not model score_mod / mask_mod pairs (fa4verify.mods)")
        if problem.descales and problem.softcap:
            raise Unsupported("the twin models fp8 descales without softcap (FA4 folds them into the softcap "
                              "score_mod's scale)")
        if (why := hd256_refusal(problem, "fwd")) is not None:
            raise Unsupported(why)
        if (why := split_kv_unmodelled(problem)) is not None:
            raise Unsupported(why)

    def describe(self) -> dict[str, Any]:
        return {"target": self.name, "where": self.where, "mutations": sorted(self.mutations),
                "accumulation": self.accumulation, "mufu": self.mufu, "seed": self.seed}

    def _kw(self, problem: AttentionProblem, a: Mapping[str, Any]) -> dict[str, Any]:
        return dict(arch=problem.arch, softmax_scale=problem.softmax_scale, causal=problem.causal,
                    window_size=tuple(problem.window_size), softcap=float(problem.softcap),
                    learnable_sink=a["learnable_sink"], mutations=self.mutations - self.layout_mutations,
                    accumulation=self.accumulation, mufu=self.mufu, seed=self.seed,
                    mla=problem.call is not None and problem.call.mla)

    def _segments(self, problem: AttentionProblem, a: Mapping[str, Any]):
        """(b, q-slice, k-slice) per sequence of a varlen problem (dense problems run in one call)."""
        for b, (q0, lq, k0, lk) in enumerate(problem._seq_bounds()):
            yield b, slice(q0, q0 + lq), slice(k0, k0 + lk)

    def _segment_groups(self, problem: AttentionProblem, a: Mapping[str, Any]) -> list[list[tuple]]:
        """Note [Equal sequences as a batch]
        ---------------------------------
        The twin runs a varlen problem a sequence at a time; sequences of equal lengths run as one
        dense call with a batch dimension instead, its entries put back in FA4's varlen layout. The
        twin is batch-invariant bit for bit (each batch entry's arithmetic is its own:
        ``bitwise_invariants``; ``tests/test_twin_varlen_groups.py`` compares both ways), so this
        changes no value, only the count of calls: 1,100 sequences of 13 lengths, 13 calls. Kept a
        sequence at a time where a call could tie the entries: a mutated twin (a planted fault may
        read across them), a perturbed MUFU model (its draws follow the call's shape), a learnable
        sink (the twin sums dsink over the batch in its own order). Each group: ``[(b, q-slice,
        k-slice), ...]``, sequences with no query rows left out."""
        segs = [s for s in self._segments(problem, a) if s[1].stop > s[1].start]
        if self.mutations or self.mufu != "correctly-rounded" or problem.sink:
            return [[s] for s in segs]
        groups: dict[tuple[int, int], list[tuple]] = {}
        for s in segs:
            groups.setdefault((s[1].stop - s[1].start, s[2].stop - s[2].start), []).append(s)
        return list(groups.values())

    def _call_form(self, problem: AttentionProblem, a: Mapping[str, Any], head: int = 0, *, forward: bool = False):
        """(problem, arrays) the twin runs for a call form: the same varlen problem on the K/V
        the call reads (gathered from pages or batched rows), or the varlen rewrite of a
        keep-pattern (with its index maps; query head ``head``'s where the heads differ).
        ``forward``: the rewrite walks the blocks as FA4's forward does (Note [Rule-cut blocks in
        the mask lists] in ``fa4verify.problem.calls``), else as its backward does."""
        from fa4verify import call_layout
        from fa4verify.problem import CallForm
        # the plain call the twin runs keeps FA4's pack_gqa choice (it moves SM100's emulated columns)
        plain = None if problem.call.pack_gqa is None else CallForm(pack_gqa=problem.call.pack_gqa)
        if problem.call.mla:       # the MLA kernels' constants stay with the rewrite
            plain = CallForm(qv_dim=problem.call.qv_dim)
        if problem.call.batched_layout:
            c = call_layout.call_arrays(problem, a)
            k, v = call_layout.gather_kv(problem, c, wrong_permutation="paged_wrong_permutation" in self.mutations)
            q, do = call_layout.gather_q(problem, c)
            return problem.replace(call=plain), dict(a, q=q.astype(np.float64), k=k.astype(np.float64),
                                                     v=v.astype(np.float64),
                                                     dout=None if do is None else do.astype(np.float64),
                                                     fa4_varlen_q=fa4_varlen_q(problem)), None
        from fa4verify.judge import keep_pattern
        # block lists under a causal / window rule: FA4's own tiles, the rule inside them (keep)
        rw = keep_pattern.rewrite(problem, head=head, lists=True, walk="sm100_forward" if forward else "index",
                                  cut_blocks_full="rule_cut_blocks_listed_full" in self.mutations)
        (qb, qr), (kb, kr) = rw["q_index"].T, rw["k_index"].T
        # the keep-mask holds every mask (a gather's causal limit too): the rewrite is unmasked
        vp = problem.replace(call=plain, causal=False, window_size=(None, None), batch=len(rw["seqlens_q"]),
                             seqlen_q=max(rw["seqlens_q"]),
                             seqlen_k=max(rw["seqlens_k"]), seqlens_q=rw["seqlens_q"], seqlens_k=rw["seqlens_k"])
        vw = functools.partial(keep_pattern.view, problem)
        va = dict(a, q=vw(a["q"])[qb, qr], k=vw(a["k"])[kb, kr], v=vw(a["v"])[kb, kr],
                  dout=None if a.get("dout") is None else vw(a["dout"])[qb, qr], mask=None,
                  cu_seqlens_q=np.concatenate([[0], np.cumsum(rw["seqlens_q"])]).astype(np.int32),
                  cu_seqlens_k=np.concatenate([[0], np.cumsum(rw["seqlens_k"])]).astype(np.int32),
                  # the kernel FA4 runs is the call's own: a dense call's, not a varlen one's
                  fa4_varlen_q=fa4_varlen_q(problem),
                  # Note [FP8 descales]: a rewritten sequence takes its problem sequence's factors
                  **{f"{n}_descale": np.asarray(a[f"{n}_descale"])[list(rw["seq"])] for n in problem.descales})
        if problem.call.block_size is not None:     # the kernel's flags and its KV block (_sparse_kw)
            from fa4verify.problem import resolve_window
            va["keep_rule"] = tuple(bool(f) for f in resolve_window(problem.causal, problem.window_size)[:2])
            va["keep_block"] = tuple(int(x) for x in problem.call.block_size)
            # FA4's backward Q block (sparse_block_size_q): 128 on SM90 where it gets no block_size
            va["keep_sparse_q"] = 128 if problem.call.block_size_implicit else va["keep_block"][0]
        if rw["keep"] is not None:      # Note [Block lists with causal or a window]
            va["keep"] = rw["keep"]
        return vp, va, rw

    def _heads(self, problem: AttentionProblem, a: Mapping[str, Any], *, forward: bool = False):
        """Note [Block masks by head]: per query head ``h``, ``(h, its KV head, the varlen rewrite of
        h's keep-pattern as a one-head problem, its arrays, the rewrite's maps)``."""
        g = problem.nheads // problem.nheads_kv
        for h in range(problem.nheads):
            kvh = h // g
            # the planted fault of source mutant block_sparse_packgqa_guard_dropped: a packed tile
            # reads the lists at its KV head's index, so each query head gets head h // g's mask
            vp, va, rw = self._call_form(problem, a, head=kvh if "block_lists_by_kv_head" in self.mutations else h,
                                         forward=forward)
            one = {n: None if va.get(n) is None else np.asarray(va[n])[:, i:i + 1]
                   for n, i in (("q", h), ("dout", h), ("k", kvh), ("v", kvh))}
            one.update({f"{n}_descale": np.asarray(va[f"{n}_descale"])[:, kvh:kvh + 1] for n in problem.descales})
            sink = va.get("learnable_sink")
            yield h, kvh, vp.replace(nheads=1, nheads_kv=1), dict(
                va, **one, learnable_sink=None if sink is None else np.asarray(sink)[h:h + 1]), rw

    def _forward_by_head(self, problem: AttentionProblem, a: Mapping[str, Any]) -> Fwd:
        from fa4verify.judge import keep_pattern as kp
        out = np.zeros((problem.batch, problem.seqlen_q, problem.nheads, problem.head_dim_v))
        lse = np.full((problem.batch, problem.nheads, problem.seqlen_q), -np.inf)
        for h, _kvh, vp, va, rw in self._heads(problem, a, forward=True):
            f = self.forward(vp, va)
            out[:, :, h] = kp._dense_rows(problem, f.out, rw, 0.0)[:, :, 0]
            lse[:, h] = kp._dense_lse(problem, f.lse, rw, -np.inf)[:, 0]
        return Fwd(out, lse)

    def _backward_by_head(self, problem: AttentionProblem, a: Mapping[str, Any], fwd: Fwd, deterministic: bool) -> Bwd:
        """Each query head's backward on its own rewrite: its dQ, and its share of its KV head's
        dK and dV (summed over the group in float64: the twin is not FA4's accumulation order here)."""
        from fa4verify.judge import keep_pattern as kp
        dq = np.zeros(np.shape(a["q"]))
        dk, dv = np.zeros(np.shape(a["k"])), np.zeros(np.shape(a["v"]))
        dsink = np.zeros(problem.nheads) if problem.sink else None
        got_dsink = False            # a dsink only where some head's call returned one (the twin models none)
        for h, kvh, vp, va, rw in self._heads(problem, a):
            qb, qr = rw["q_index"].T
            vf = Fwd(kp.view(problem, fwd.out)[qb, qr][:, h:h + 1], kp.view(problem, fwd.lse)[qb, h, qr][None, :])
            g = self.backward(vp, va, vf, deterministic=deterministic)
            dq[:, :, h] = kp._dense_rows(problem, g.dq, rw, 0.0)[:, :, 0]
            dk[:, :, kvh] += kp._sum_keys(problem, g.dk, np.zeros_like(g.dk), rw)[0][:, :, 0]
            dv[:, :, kvh] += kp._sum_keys(problem, g.dv, np.zeros_like(g.dv), rw)[0][:, :, 0]
            if dsink is not None and g.dsink is not None:
                dsink[h] = np.asarray(g.dsink).reshape(-1)[0]
                got_dsink = True
        return Bwd(dq, dk, dv, dsink if got_dsink else None)

    def forward(self, problem: AttentionProblem, a: Mapping[str, Any]) -> Fwd:
        self.check_supported(problem)
        if problem.call is not None and problem.call.split_kv:
            if split_kv_runs(problem):
                return self._forward_split(problem, a)
            import dataclasses    # FA4 runs the request unsplit (hd != hdv, few keys): the plain call
            return self.forward(problem.replace(call=dataclasses.replace(problem.call, num_splits=1)), a)
        if problem.call is not None and problem.call.block_per_head:
            return self._forward_by_head(problem, a)
        if _twin_rearranges(problem):
            vp, va, rw = self._call_form(problem, a, forward=True)
            f = self.forward(vp, va)
            if rw is None:
                return f
            from fa4verify.judge import keep_pattern as kp
            return Fwd(kp._dense_rows(problem, f.out, rw, 0.0), kp._dense_lse(problem, f.lse, rw, -np.inf))
        kw = self._kw(problem, a)
        if problem.call is not None and problem.call.pack_gqa is not None:
            kw["pack_gqa"] = problem.call.pack_gqa
        dt = problem.dtype
        if problem.mask_mod is not None:
            kw["mask"] = a["mask"]
        descale = {n: a.get(n) for n in ("q_descale", "k_descale", "v_descale")} if problem.descales else {}
        if not problem.varlen:
            r = self._ta.forward(_typed(a["q"], dt), _typed(a["k"], dt), _typed(a["v"], dt), **kw, **descale)
            return Fwd(np.asarray(r.out, np.float64), np.asarray(r.lse, np.float64))
        tq = a["q"].shape[0]
        out = np.zeros((tq, problem.nheads, problem.head_dim_v))
        lse = np.full((problem.nheads, tq), -np.inf)
        kw.update(_sparse_kw(problem, a))
        for grp in self._segment_groups(problem, a):      # Note [Equal sequences as a batch]
            bs = [b for b, _sq, _sk in grp]
            stack = lambda x, i: np.stack([x[s[i]] for s in grp])      # noqa: E731
            if a.get("keep") is not None:
                kw["keep"] = np.stack([a["keep"][b] for b in bs])
            r = self._ta.forward(_typed(stack(a["q"], 1), dt), _typed(stack(a["k"], 2), dt),
                                 _typed(stack(a["v"], 2), dt), **kw, _varlen_q=_fa4_varlen_q(problem, a),
                                 **{n: None if f is None else np.asarray(f)[bs] for n, f in descale.items()})
            ro, rl = np.asarray(r.out, np.float64), np.asarray(r.lse, np.float64)
            for j, (_b, sq, _sk) in enumerate(grp):
                out[sq] = ro[j]
                lse[:, sq] = rl[j]
        return Fwd(out, lse)

    def _forward_split(self, problem: AttentionProblem, a: Mapping[str, Any]) -> Fwd:
        """Note [Split-KV as a call form]: the twin forward on each of FA4's key ranges, its fp32
        output before the cast as the partial (an empty range: O = 0, LSE = -inf), merged by the
        combine twin (``kernels/twin_combine.py``)."""
        from fa4verify.judge.split_combine import split_problems
        from fa4verify.kernels import twin_combine
        ranges = split_kv_ranges(problem)
        if "split_range_overlap" in self.mutations:    # a planted fault: each later split starts a key early
            ranges = tuple((max(0, k0 - 1) if s and k1 > k0 else k0, k1) for s, (k0, k1) in enumerate(ranges))
        b, sq, h, dv = problem.batch, problem.seqlen_q, problem.nheads, problem.head_dim_v
        O = np.zeros((len(ranges), b, sq, h, dv))
        L = np.full((len(ranges), b, sq, h), -np.inf)
        descale = {n: a.get(n) for n in ("q_descale", "k_descale", "v_descale")} if problem.descales else {}
        dt = problem.dtype
        # every split runs the kernel FA4 compiled for the whole call: its mask flags (a split's
        # chunk window is only how the twin names the same keys), one CTA (split-KV never runs 2-CTA)
        from fa4verify.kernels import facts
        from fa4verify.kernels.twin.exp2 import emulated_columns
        causal_r, local_r, _, _ = facts.resolve_causal_local_window(problem.causal, problem.window_size)
        pack = problem.call.pack_gqa if problem.call.pack_gqa is not None else problem.nheads > problem.nheads_kv
        tile_n = split_kv_tile(problem)
        cols = emulated_columns(head_dim=problem.head_dim, head_dim_v=problem.head_dim_v, causal=causal_r,
                                local=local_r, pack_gqa=bool(pack), use_2cta=False,
                                is_sm103=problem.arch == "sm103", fp8=dt == "fp8", n_block_size=tile_n)
        emu = {"use_2cta": False, "emulated_columns": tuple(int(i) for i in np.flatnonzero(cols)), "tile_n": tile_n}
        for s, (p, aa, _) in enumerate(split_problems(problem, a, ranges)):
            if p is None:
                continue
            kw = self._kw(p, aa)              # the split's keys, its window in their coordinates
            if problem.call.pack_gqa is not None:
                kw["pack_gqa"] = problem.call.pack_gqa
            kw.update(emu)
            if "split_sink_every" in self.mutations:
                kw["learnable_sink"] = a["learnable_sink"]
            r = self._ta.forward(_typed(aa["q"], dt), _typed(aa["k"], dt), _typed(aa["v"], dt), **kw, **descale)
            O[s] = r.stages["o_fp32"]
            L[s] = np.transpose(np.asarray(r.lse, np.float64), (0, 2, 1))
        c = twin_combine.combine(O, L, out_dtype="bf16" if dt == "fp8" else dt, mufu=self.mufu, seed=self.seed)
        return Fwd(np.asarray(c.out, np.float64), np.transpose(np.asarray(c.lse, np.float64), (0, 2, 1)),
                   partials=(O, L))

    def taps_unsupported(self, problem: AttentionProblem) -> Optional[str]:
        """Why the twin's stage taps (its backward's D, lse_log2 and dq_accum, the buffers
        production's :mod:`fa4verify.kernels.stage_taps` reads) are not available, or None."""
        if problem.varlen or (problem.call is not None and problem.call.rearranges):
            return "the twin's stage taps are read on dense calls only (varlen runs sequence by sequence)"
        return None

    def dlse_unsupported(self, problem: AttentionProblem) -> Optional[str]:
        return _dlse_rearranged(problem)

    def backward(self, problem: AttentionProblem, a: Mapping[str, Any], fwd: Fwd, *,
                 deterministic: bool = True, taps: Optional[dict] = None, dlse: Optional[np.ndarray] = None) -> Bwd:
        """The twin's backward. ``taps``: a dict to fill with its stage values in production's tap
        layouts (``dpsum``, ``lse_log2`` (b, h, s); ``dq_accum`` (b, s, h, d); ``dq_accum_zeroed``:
        the accumulator the twin starts from), dense problems only (:meth:`taps_unsupported`).
        ``dlse``: a gradient through the returned LSE (the LSE's layout, fp32 values), on calls
        without a call form's rearrangement (:meth:`dlse_unsupported`)."""
        if taps is not None and self.taps_unsupported(problem) is not None:
            raise Unsupported(self.taps_unsupported(problem))
        if dlse is not None and (why := self.dlse_unsupported(problem)) is not None:
            raise Unsupported(why)
        self.check_supported(problem)
        if not hasattr(self._ta, "backward"):
            raise DependencyMissing("the twin backward (fa4verify.kernels.twin.backward) is not available")
        if problem.call is not None and problem.call.block_per_head:
            return self._backward_by_head(problem, a, fwd, deterministic)
        if _twin_rearranges(problem):
            vp, va, rw = self._call_form(problem, a)
            if rw is None:      # a batched layout: the problem itself, in its varlen layout
                return self.backward(vp, va, fwd, deterministic=deterministic, dlse=dlse)
            qb, qr = rw["q_index"].T
            from fa4verify.judge import keep_pattern as kp
            vf = Fwd(kp.view(problem, fwd.out)[qb, qr], kp.view(problem, fwd.lse)[qb, :, qr].T)
            g = self.backward(vp, va, vf, deterministic=deterministic)
            from fa4verify.judge import keep_pattern as kp
            dk, _ = kp._sum_keys(problem, g.dk, np.zeros_like(g.dk), rw)
            dv, _ = kp._sum_keys(problem, g.dv, np.zeros_like(g.dv), rw)
            return Bwd(kp._dense_rows(problem, g.dq, rw, 0.0), dk, dv, g.dsink)
        g = self._backward_direct(problem, a, fwd, deterministic=deterministic, taps=taps, dlse=dlse)
        # an MLA problem: the standard backward of q', k', v, in FA4's MLA layout
        return mla_grads(problem, g) if problem.call is not None and problem.call.mla else g

    def _backward_direct(self, problem: AttentionProblem, a: Mapping[str, Any], fwd: Fwd, *, deterministic: bool,
                         taps: Optional[dict], dlse: Optional[np.ndarray]) -> Bwd:
        """The twin's backward of a problem it runs as it is (no call-form rearrangement)."""
        kw = self._kw(problem, a)
        kw.pop("mla")
        kw["deterministic"] = deterministic
        dt = problem.dtype
        def call(q, k, v, o, do, lse, dl=None, keep=None):
            r = self._ta.backward(_typed(q, dt), _typed(k, dt), _typed(v, dt), _typed(o, dt), _typed(do, dt),
                                  lse=np.asarray(lse, np.float32), dlse=dl, keep=keep,
                                  keep_rule=a.get("keep_rule"), sparse_q=a.get("keep_sparse_q"), **kw)
            return r
        dl = None if dlse is None else np.asarray(dlse, np.float32)
        if not problem.varlen:
            r = call(a["q"], a["k"], a["v"], fwd.out, a["dout"], fwd.lse, dl)
            st = getattr(r, "stages", None)
            if taps is not None and st is not None:
                acc = np.asarray(st["dq_accum"])
                taps["dpsum"] = np.asarray(st["D"])
                taps["lse_log2"] = np.asarray(st["lse_log2"])
                taps["dq_accum"] = np.moveaxis(acc, 1, 2)            # (b, h, s, d) -> (b, s, h, d)
                taps["dq_accum_zeroed"] = np.zeros(taps["dq_accum"].shape, acc.dtype)
            return Bwd(*(np.asarray(getattr(r, n), np.float64) for n in ("dq", "dk", "dv")),
                       dsink=_maybe(getattr(r, "dsink", None)), stages=getattr(r, "stages", None))
        dq = np.zeros(a["q"].shape)
        dk = np.zeros(a["k"].shape)
        dv = np.zeros(a["v"].shape)
        dsink = np.zeros(problem.nheads) if problem.sink else None
        got_dsink = False            # a dsink only where some call returned one (the twin models none)
        for grp in self._segment_groups(problem, a):      # Note [Equal sequences as a batch]
            if dl is not None and "varlen_dlse_offset_dropped" in self.layout_mutations:
                sls = [slice(0, sq.stop - sq.start) for _b, sq, _sk in grp]  # each reads the first one's rows
            else:
                sls = [sq for _b, sq, _sk in grp]
            stack = lambda x, i: np.stack([x[s[i]] for s in grp])      # noqa: E731
            r = call(stack(a["q"], 1), stack(a["k"], 2), stack(a["v"], 2), stack(fwd.out, 1), stack(a["dout"], 1),
                     np.stack([fwd.lse[:, sq] for _b, sq, _sk in grp]),
                     None if dl is None else np.stack([dl[:, sl] for sl in sls]),
                     None if a.get("keep") is None else np.stack([a["keep"][b] for b, _sq, _sk in grp]))
            rq, rk, rv = (np.asarray(x, np.float64) for x in (r.dq, r.dk, r.dv))
            for j, (_b, sq, sk) in enumerate(grp):
                dq[sq] = rq[j]
                dk[sk] = rk[j]
                dv[sk] = rv[j]
            if dsink is not None and getattr(r, "dsink", None) is not None:
                dsink += np.asarray(r.dsink, np.float64)
                got_dsink = True
        return Bwd(dq, dk, dv, dsink if got_dsink else None)


def fa4_varlen_q(problem: AttentionProblem) -> bool:
    """Whether FA4's call of ``problem`` has ``cu_seqlens_q`` or ``seqused_q`` (its SM 10.x forward
    then takes the varlen exp2 emulation setting: ``flash_fwd_sm100.py``, ``ex2_emu_freq``): a varlen
    problem, unless its Q goes batched without used lengths (``q_batched`` alone)."""
    call = problem.call
    return bool(problem.varlen) and (call is None or not call.q_batched or call.seqused_q)


def _fa4_varlen_q(problem: AttentionProblem, a: Mapping[str, Any]) -> bool:
    """:func:`fa4_varlen_q` of the call FA4 runs: the original call's where the twin runs a
    rearranged ``problem`` (:meth:`TwinTarget._call_form` records it: a dense block-sparse or
    mask_mod call's rewrite is varlen, FA4's kernel is not; a batched layout's Q may go without
    ``cu_seqlens_q``), else ``problem``'s own."""
    got = a.get("fa4_varlen_q")
    return fa4_varlen_q(problem) if got is None else bool(got)


def _sparse_kw(problem: AttentionProblem, a: Mapping[str, Any]) -> dict[str, Any]:
    """The twin's keyword arguments that a block-sparse call's rewrite (:meth:`TwinTarget._call_form`;
    under a causal or window rule the rule comes as the elementwise ``keep``) adds to its forward: on
    SM90 FA4's KV tile (the rule's, fitted to the lists' KV block); on SM 10.x the emulated exp2 columns of the kernel FA4 compiled, with the rule's flags (the rewrite
    runs without them) and without 2-CTA (``interface.py``: ``use_2cta_instrs`` requires ``not
    use_block_sparsity``); {} elsewhere. The backward takes the flags as ``keep_rule`` (its
    deterministic dQ order)."""
    if a.get("keep_rule") is None:
        return {}
    causal, local = a["keep_rule"]
    if problem.arch == "sm90":
        from fa4verify.kernels.facts import sm90_sparse_fwd_tile_n
        return {"tile_n": sm90_sparse_fwd_tile_n(problem.head_dim, problem.head_dim_v, causal, local,
                                                 a["keep_block"][1])}
    from fa4verify.kernels.twin.exp2 import emulated_columns
    pack = problem.call.pack_gqa if problem.call is not None and problem.call.pack_gqa is not None \
        else problem.nheads > problem.nheads_kv
    # FA4 runs no 2-CTA forward with block sparsity
    cols = emulated_columns(head_dim=problem.head_dim, head_dim_v=problem.head_dim_v, causal=causal, local=local,
                            pack_gqa=bool(pack), varlen_q=_fa4_varlen_q(problem, a), use_2cta=False,
                            is_sm103=problem.arch == "sm103", fp8=problem.dtype == "fp8")
    return {"emulated_columns": tuple(int(i) for i in np.flatnonzero(cols))}


def _twin_rearranges(problem: AttentionProblem) -> bool:
    """Whether the twin runs ``problem`` through another problem (gathered K/V, or the varlen
    rewrite of a keep-pattern); an MLA call form alone does not: the problem's own q', k' are the
    twin's (Note [MLA as a call form])."""
    call = problem.call
    return call is not None and (call.batched_layout or call.keep_pattern)


def _dlse_rearranged(problem: AttentionProblem) -> Optional[str]:
    """Why a call form keeps ``problem`` from a gradient through the LSE (Note [A gradient through
    the LSE]): a batched layout returns the problem's LSE rows in its own layout, where the dLSE
    goes too (:func:`fa4verify.call_layout.to_call_lse`); a keep-pattern (block sparsity, a CuTe
    mask_mod) or MLA call is judged through a rewrite with no dLSE; None otherwise."""
    if problem.call is not None and (problem.call.keep_pattern or problem.call.mla):
        return "a gradient through the LSE is not passed on a block-sparse, CuTe mask_mod or MLA call form"
    return None


def _maybe(x):
    return None if x is None else np.asarray(x, np.float64)


class ProductionTarget(Target):
    """Production FA4 through ``fa4verify.kernels.adapter`` (CUDA). Construction raises
    ``NoCudaError`` ("no CUDA device: ...") without a usable GPU. FA4 has no boolean-mask
    entry point, so mask_mod patterns are not generated for this target."""

    name = "production"
    bitwise_invariants = False
    blames_fa4 = True

    def __init__(self, *, adapter: Any = None, device: str = "cuda", emulation: str = "default",
                 fake: bool = False) -> None:
        """``adapter``/``device`` exist for testing the conversion code without a GPU (a stand-in
        adapter module on CPU tensors); normal use takes ``fa4verify.kernels.adapter`` on CUDA.
        ``emulation``: "default" (FA4 as shipped) or "disabled" (SM100/SM103: every exp2 on MUFU).
        ``fake``: compile-only under torch ``FakeTensorMode`` (no GPU: FA4 compiles for
        ``FLASH_ATTENTION_ARCH`` and skips the launch; outputs are zero arrays of the right
        shapes, not values). The target enters its own FakeTensorMode (one per target, so the
        forward's fake O/LSE feed its backward) unless the caller already has one active. It needs
        the compile-only environment and CPU shims of :mod:`fa4verify.compile.census`; run it through
        :func:`fa4verify.compile.production.run_cases` (a subprocess) so they do not leak."""
        if emulation not in ("default", "disabled"):
            raise ValueError(f"emulation={emulation!r}: expected 'default' or 'disabled'")
        stand_in = adapter is not None
        if adapter is None:
            from fa4verify.kernels import adapter as _adapter
            adapter = _adapter
        self._ad = adapter
        self.fake = bool(fake)
        #: the memory layout of the inputs :meth:`_t` makes (Note [Input layouts])
        self.layout = "contiguous"
        if not stand_in and not fake:
            ok, reason = self._ad.cuda_status()
            if not ok:
                raise self._ad.NoCudaError(reason if reason.startswith("no CUDA") else f"no CUDA device: {reason}")
        import torch
        self._torch = torch
        self.device = device
        self.emulation = emulation
        self.gpu = None
        self.arch: Optional[str] = None
        if device == "cuda" and not fake:
            from fa4verify.kernels.device import local_gpu, where_measured
            self.gpu = local_gpu()
            if self.gpu is None:     # a stand-in adapter asked for "cuda" on a machine without one
                raise RuntimeError("no CUDA device: torch sees no GPU to label the measurements with")
            self.gpu_name = self.gpu.name
            self.arch = self.gpu.arch
            self.where = where_measured(self.gpu)
            # Note [SM90 MMA model]: FA4's SM90 kernels form S with the wgmma the model describes
            self.tensor_core = "sm90" if self.arch == "sm90" else None
        elif fake:
            import os
            from fa4verify.kernels import facts
            self.gpu_name = None
            self.arch = facts.arch_of_fa4_arch_env(
                os.environ.get("FLASH_ATTENTION_ARCH") or facts.fa4_arch_env("sm100"))
            self.where = "compile-only"
        else:
            self.gpu_name = None
            self.where = f"production code path on {device} (stand-in adapter)"
        if emulation == "disabled" and self.arch == "sm90":
            raise Unsupported("FA4's SM90 kernels have no exp2 emulation to disable")
        self.last_config: Optional[dict] = None
        self.configs: dict[str, int] = {}
        self._fake_mode = None
        if self.fake:
            from torch._subclasses.fake_tensor import FakeTensorMode
            # one mode for the target's lifetime: the forward's fake (out, lse) feed its backward
            self._fake_mode = FakeTensorMode()

    def _emulation(self):
        if self.emulation == "disabled":
            return self._ad.exp2_emulation_disabled()
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def _laid_out(self, problem: AttentionProblem):
        """Note [Input layouts]: the inputs :meth:`_t` makes inside take the problem's
        ``input_layout`` (a layout the caller set, the call sequences', is kept)."""
        want = problem.call.input_layout if problem.call is not None else "contiguous"
        if want == "contiguous" or self.layout != "contiguous":
            yield
            return
        self.layout = want
        try:
            yield
        finally:
            self.layout = "contiguous"

    def _mode(self):
        """Compile-only: run inside the target's FakeTensorMode unless the caller already entered
        one (then FA4 sees the caller's mode and the tensors made in it)."""
        if not self.fake:
            return contextlib.nullcontext()
        from torch._guards import active_fake_mode
        return contextlib.nullcontext() if active_fake_mode() is not None else self._fake_mode

    def features(self) -> tuple[str, ...]:
        return production_features()

    def check_supported(self, problem: AttentionProblem) -> None:
        if problem.mask_mod is not None:
            raise Unsupported("production FA4 takes mask_mod as a CuTe callable; boolean patterns are twin-only")
        if problem.varlen and problem.call is not None and problem.call.mla:
            raise Unsupported("a varlen MLA call is not judged here (Note [MLA as a call form]: dense calls)")
        if (why := hd256_refusal(problem, "fwd")) is not None:
            raise Unsupported(why)
        if problem.arch != "sm90" and (why := split_kv_unmodelled(problem)) is not None:
            raise Unsupported(why)      # on SM90 FA4 refuses num_splits > 1 itself
        for pair in problem.mod_pairs() if problem.mods else ():
            if pair is not None and pair.cute() is None:
                raise Unsupported(f"mod pair {pair.name!r} has no CuTe function here (no CUTLASS DSL, or no build)")
        if problem.varlen and problem.call is not None and problem.call.block_size is not None:
            from fa4verify.kernels import facts
            if not facts.varlen_block_sparsity():
                raise Unsupported("unsupported by this FA4 release: no block sparsity on a varlen call "
                                  "(its BlockSparseTensorsTorch has no cu_total_m_blocks / cu_block_idx_offsets)")

    def backward_unsupported(self, problem: AttentionProblem) -> Optional[str]:
        why = _call_backward_unsupported(problem)
        if why is None and problem.call is not None and problem.call.block_size is not None \
                and problem.arch == "sm90":
            want = tuple(self._ad.sm90_bwd_sparse_block_size(problem.head_dim, problem.head_dim_v))
            if tuple(problem.call.block_size) != want:
                why = (f"FA4's SM90 block-sparse backward takes {want[0]} x {want[1]} blocks; the forward's "
                       f"{problem.call.block_size[0]} x {problem.call.block_size[1]} mask is not on that grid")
        return why

    def _call_kw(self, problem: AttentionProblem, a: Mapping[str, Any], *, backward: bool = False,
                 deterministic: bool = False, public: bool = False) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """(q, k, v, dout, kwargs) of the adapter call for the problem's call form (``pack_gqa``
        only in the forward's: FA4's backward never packs). ``public``: the forward's arguments for
        FA4's public autograd entry, which takes a score pair's ``score_mod_bwd`` too."""
        dt = problem.dtype
        kw = dict(softmax_scale=problem.softmax_scale, causal=problem.causal, window_size=tuple(problem.window_size),
                  softcap=float(problem.softcap), learnable_sink=self._sink(problem, a),
                  **self._descale_kw(problem, a))
        call = problem.call
        if call.pack_gqa is not None and not backward:
            kw["pack_gqa"] = call.pack_gqa
        if call.batched_layout:
            from fa4verify import call_layout
            c = call_layout.call_arrays(problem, a)
            for n in ("seqused_k", "seqused_q", "page_table"):
                if c[n] is not None and not (n == "seqused_k" and call.full_pages):
                    kw[n] = self._t(c[n], None)
            if c["cu_seqlens_q"] is not None:
                kw.update(cu_seqlens_q=self._t(c["cu_seqlens_q"], None), max_seqlen_q=c["max_seqlen_q"])
            if c.get("cu_seqlens_k") is not None:       # CallForm.kv_packed
                kw.update(cu_seqlens_k=self._t(c["cu_seqlens_k"], None), max_seqlen_k=c["max_seqlen_k"])
            if problem.mods:           # a mod pair on paged KV: the mod sees each sequence's logical keys
                kw.update(self._mods_kw(problem, a))
                if not (backward or public):
                    kw.pop("score_mod_bwd", None)
            k, v = self._t(c["k"], dt), self._t(c["v"], dt)
            if call.paged and call.pool_layout != "separate":
                k, v = _pool_views(k, v, call.pool_layout)
            return (self._t(c["q"], dt), k, v, None if c["dout"] is None else self._t(c["dout"], dt), kw)
        if call.block_size is not None and problem.varlen:    # FA4's varlen block sparsity (forward only)
            if backward:
                from fa4verify.coverage.space import VARLEN_SPARSE_BWD
                raise Unsupported(VARLEN_SPARSE_BWD)
            bounds = problem._seq_bounds()
            listed = [call.block_mask(lq, lk, seq=i) for i, (_q0, lq, _k0, lk) in enumerate(bounds)]
            part = [call.partial_blocks(lq, lk, seq=i) for i, (_q0, lq, _k0, lk) in enumerate(bounds)]
            if problem.rule_blocks_in_mask_lists:      # Note [Rule-cut blocks in the mask lists]
                part = [p_ | problem.rule_mask_blocks(m_, lq, lk)
                        for p_, m_, (_q0, lq, _k0, lk) in zip(part, listed, bounds)]
            kw["block_sparse_tensors"] = self._ad.block_sparse_tensors_varlen(
                listed,
                nheads=block_mask_heads(problem), block_size=tuple(call.block_size), device=self.device,
                partial=part if any(p.any() for p in part) else None)
            kw.update(cu_seqlens_q=self._t(a["cu_seqlens_q"], None), cu_seqlens_k=self._t(a["cu_seqlens_k"], None),
                      max_seqlen_q=problem.seqlen_q, max_seqlen_k=problem.seqlen_k)
        elif call.block_size is not None:
            bs = call.block_size
            if backward and problem.arch == "sm90":
                bs = tuple(self._ad.sm90_bwd_sparse_block_size(problem.head_dim, problem.head_dim_v))
            if call.block_per_head:       # Note [Block masks by head]: (batch, nheads, n_q_blocks, n_kv_blocks)
                bm = np.stack([np.stack([call.block_mask(problem.seqlen_q, problem.seqlen_k, seq=call.grid_seq(problem, b),
                                                         head=h) for h in range(problem.nheads)])
                               for b in range(problem.batch)])
                part = np.zeros_like(bm)
            elif call.block_per_batch:      # one grid per batch entry: (batch, n_q_blocks, n_kv_blocks)
                bm = np.stack([call.block_mask(problem.seqlen_q, problem.seqlen_k, seq=b) for b in range(problem.batch)])
                part = np.stack([call.partial_blocks(problem.seqlen_q, problem.seqlen_k, seq=b)
                                 for b in range(problem.batch)])
            else:
                bm = call.block_mask(problem.seqlen_q, problem.seqlen_k)
                part = call.partial_blocks(problem.seqlen_q, problem.seqlen_k)
            if problem.rule_blocks_in_mask_lists and not backward:    # Note [Rule-cut blocks in the mask lists]
                part = part | problem.rule_mask_blocks(bm, problem.seqlen_q, problem.seqlen_k)
            kw["block_sparse_tensors"] = self._ad.block_sparse_tensors(
                bm, batch=problem.batch, nheads=block_mask_heads(problem), block_size=tuple(bs),
                direction="bwd" if backward else "fwd", device=self.device,
                deterministic=backward and deterministic, partial=part if part.any() else None,
                **({"pass_size": False} if call.block_size_implicit else {}))
        elif call.mask_mod_fn is not None:
            from fa4verify.problem.calls import mask_mod_pairs
            fn = mask_mod_pairs()[call.mask_mod_fn].load()
            if fn is None:
                raise DependencyMissing(f"mask_mod {call.mask_mod_fn!r} needs the CUTLASS DSL (nvidia-cutlass-dsl)")
            kw["mask_mod"] = fn
        if call.block_size is not None:     # Note [Partial blocks]: the mask pair inside mask blocks
            kw.update(self._mods_kw(problem, a))
            if not (backward or public):
                kw.pop("score_mod_bwd", None)
        return (self._t(a["q"], dt), self._t(a["k"], dt), self._t(a["v"], dt),
                None if a.get("dout") is None else self._t(a["dout"], dt), kw)

    def _t(self, x: Optional[np.ndarray], dtype: Optional[str]):
        if x is None:
            return None
        torch = self._torch
        if self.fake:   # FakeTensorMode: shapes and dtypes only, on the "cuda" device
            src = np.asarray(x)
            if dtype is None:   # keep the array's own dtype (cu_seqlens int32, sink float32)
                tdt = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float32,
                       np.dtype(np.int32): torch.int32, np.dtype(np.int64): torch.int64}.get(src.dtype)
                if tdt is None:
                    raise Unsupported(f"compile-only: no torch dtype for a {src.dtype} array")
            else:
                tdt = {"bf16": torch.bfloat16, "fp16": torch.float16,
                       "fp8": getattr(torch, "float8_e4m3fn", None)}.get(dtype)
                if tdt is None:
                    raise Unsupported(f"compile-only: dtype {dtype!r} has no torch dtype here")
            from torch._guards import active_fake_mode
            if active_fake_mode() is None:
                raise RuntimeError("ProductionTarget(fake=True) made a tensor outside FakeTensorMode")
            return input_view(torch.empty(src.shape, dtype=tdt, device="cuda"), self.layout)
        if dtype is None:
            return torch.from_numpy(np.ascontiguousarray(x)).to(self.device)
        tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": getattr(torch, "float8_e4m3fn", None)}.get(dtype)
        if tdt is None:
            raise Unsupported(f"dtype {dtype!r} has no torch dtype here")
        return input_view(torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(device=self.device, dtype=tdt),
                          self.layout)

    def _sink(self, problem: AttentionProblem, a: Mapping[str, Any]):
        """The learnable sink tensor in the problem's :attr:`~AttentionProblem.sink_dtype` (its
        values are exact there), or None."""
        dt = None if problem.sink_dtype == "fp32" else problem.sink_dtype
        return self._t(a["learnable_sink"], dt)

    def _descale_kw(self, problem: AttentionProblem, a: Mapping[str, Any]) -> dict[str, Any]:
        """Note [FP8 descales]: FA4's fp32 (batch, nheads_kv) ``q/k/v_descale`` of the problem's
        :attr:`~AttentionProblem.descales` ({} without)."""
        return {f"{n}_descale": self._t(np.asarray(a[f"{n}_descale"], np.float32), None) for n in problem.descales}

    def _kw(self, problem: AttentionProblem, a: Mapping[str, Any]) -> dict[str, Any]:
        kw = dict(softmax_scale=problem.softmax_scale, causal=problem.causal, window_size=tuple(problem.window_size),
                  softcap=float(problem.softcap),
                  learnable_sink=self._sink(problem, a), **self._descale_kw(problem, a))
        if problem.varlen:
            kw.update(cu_seqlens_q=self._t(a["cu_seqlens_q"], None), cu_seqlens_k=self._t(a["cu_seqlens_k"], None),
                      max_seqlen_q=problem.seqlen_q, max_seqlen_k=problem.seqlen_k)
        kw.update(self._mods_kw(problem, a))
        if problem.call is not None and problem.call.mask_causal:
            # the mask_causal call form: causal=True passed along with the mask pair, which FA4's
            # forward drops (the mask decides) and its backward must drop too
            kw.update(causal=True, causal_with_mask_mod=True)
        return kw

    def _mods_kw(self, problem: AttentionProblem, a: Mapping[str, Any]) -> dict[str, Any]:
        """The mod pairs' CuTe functions and their aux tensors and scalars (fa4verify.mods); {}
        without ``mods``."""
        kw: dict[str, Any] = {}
        if not problem.mods:
            return kw
        from fa4verify import mods as _mods
        aux: list = []
        scalars: tuple = ()
        for pair in problem.mod_pairs():
            if pair is None:
                continue
            aux_p = _mods.aux_for(problem, pair, a)
            if aux and aux_p:
                raise Unsupported("two mod pairs with aux tensors: FA4 shares one aux_tensors list")
            if scalars and aux_p.scalars:
                raise Unsupported("two mod pairs with aux scalars: FA4 shares one aux_scalars tuple")
            aux = aux or list(aux_p)
            scalars = scalars or aux_p.scalars
            kw.update({n: x for n, x in pair.kw_fa4(aux_scalars=aux_p.scalars,
                                                                constants=aux_p.constants).items() if n != "aux_tensors"})
        if aux:
            kw["aux_tensors"] = [self._t(np.asarray(x), None) for x in aux]
        return kw

    def _fwd_kw(self, problem: AttentionProblem, a: Mapping[str, Any]) -> dict[str, Any]:
        kw = self._kw(problem, a)
        kw.pop("score_mod_bwd", None)     # forward-only argument set
        if problem.call is not None and problem.call.pack_gqa is not None:
            kw["pack_gqa"] = problem.call.pack_gqa    # the forward's only: FA4's backward never packs
        if problem.call is not None and problem.call.split_kv:
            kw["num_splits"] = problem.call.num_splits
        return kw

    @staticmethod
    def _np(t) -> Optional[np.ndarray]:
        return None if t is None else t.detach().float().cpu().numpy().astype(np.float64)

    def _call(self, fn, *args, own_choice: bool = False, **kw):
        """Note [Blame]: FA4's own refusals (asserts, argument checks raised in FA4) are
        "FA4 rejected the call" (unsupported, counted); a feature the installed release cannot
        express is "unsupported by this FA4 release"; the adapter's deliberate refusals
        (``AdapterRefusal``) are "fa4verify's adapter refused the call"; anything else raised in
        fa4verify's own code is a :class:`HarnessError`. Other exceptions raised in FA4 (a crash)
        pass through: the judge's ``runs`` property fails on them. ``own_choice``: the call leaves
        FA4 a choice (``num_splits=0``: Note [Split-KV by FA4's heuristic]), so FA4 refusing it
        refuses what it chose itself: a crash, not a refusal."""
        from fa4verify import blame
        try:
            return fn(*args, **kw)
        except Exception as e:  # noqa: BLE001 - classified below, never swallowed
            ad = self._ad
            if isinstance(e, getattr(ad, "UnsupportedByRelease", ())):
                raise Unsupported(str(e)) from None
            if isinstance(e, getattr(ad, "AdapterRefusal", ())):
                raise Unsupported(f"fa4verify's adapter refused the call: {e}") from None
            if blame.origin(e) == blame.FA4:
                if blame.fa4_refusal(e) and not own_choice:
                    raise Unsupported(f"FA4 rejected the call: {type(e).__name__}: {e}") from None
                raise
            raise HarnessError(f"fa4verify's own call failed ({type(e).__name__}: {e})") from e

    def _mla_forward(self, problem: AttentionProblem, a: Mapping[str, Any]) -> Fwd:
        """Note [MLA as a call form]: FA4's ``qv`` call on the problem's split arrays; its LSE,
        (b, s, h), back in the problem's layout."""
        with self._mode(), self._emulation():     # every tensor inside the mode (FakeTensorMode when compile-only)
            q, qv = self._mla_split(problem, a, "q")
            k, _ = self._mla_split(problem, a, "k")
            kw: dict[str, Any] = dict(softmax_scale=problem.softmax_scale, causal=problem.causal)
            if problem.call.gather_topk:
                kw["gather_kv_indices"] = self._t(problem.call.gather_kv_indices(problem), None)
            r = self._call(self._ad.mla_forward, q, k, self._t(a["v"], problem.dtype), qv, **kw)
        self._note_config(r.config)
        out = np.zeros(tuple(r.out.shape)) if self.fake else self._np(r.out)
        lse = np.zeros(tuple(r.lse.shape)) if self.fake else self._np(r.lse)
        return Fwd(out, np.moveaxis(lse, -1, 1), native=(r.out, r.lse))

    def _mla_split(self, problem: AttentionProblem, a: Mapping[str, Any], key: str):
        """FA4's rope part and the latent part (qv) of the problem's array ``key`` (torch)."""
        d = problem.head_dim - problem.call.qv_dim
        x = np.asarray(a[key])
        return self._t(x[..., :d], problem.dtype), self._t(x[..., d:], problem.dtype)

    def _mla_backward(self, problem: AttentionProblem, a: Mapping[str, Any]) -> Bwd:
        """Note [The sparse MLA backward]: FA4's forward for training (it saves P, the row maxima and
        the O residual, or not with ``recompute_p``), then its sparse MLA backward; the gradients in
        the problem's layout, dq' = [dq, dqv], dk' = [dk, 0], dv of both uses of v (:func:`mla_grads`)."""
        call, dt = problem.call, problem.dtype
        with self._mode(), self._emulation():
            q, qv = self._mla_split(problem, a, "q")
            k, _ = self._mla_split(problem, a, "k")
            v, do = self._t(a["v"], dt), self._t(a["dout"], dt)
            idx = self._t(call.gather_kv_indices(problem), None)
            kw: dict[str, Any] = dict(softmax_scale=problem.softmax_scale, causal=problem.causal)
            f = self._call(self._ad.mla_forward, q, k, v, qv, gather_kv_indices=idx, for_backward=True,
                           gather_bwd_recompute_p=call.recompute_p, **kw)
            r = self._call(self._ad.mla_backward, q, k, v, qv, f.out, do, f.lse, idx, fwd=f,
                           recompute_p=call.recompute_p, **kw)
        self._note_config(r.config)
        if self.fake:
            shapes = problem.shapes()
            return Bwd(np.zeros(shapes["q"]), np.zeros(shapes["k"]), np.zeros(shapes["v"]), None)
        return self._mla_grads_of(problem, r.dq, r.dk, r.dv, r.dqv)

    def _mla_grads_of(self, problem: AttentionProblem, dq, dk, dv, dqv) -> Bwd:
        """FA4's MLA gradients (torch) in the problem's layout: dq' = [dq, dqv], dk' = [dk, 0] and
        dv of both uses of v (:func:`mla_grads`'s layout)."""
        n = self._np
        dk = n(dk)
        return Bwd(np.concatenate([n(dq), n(dqv)], axis=-1),
                   np.concatenate([dk, np.zeros(dk.shape[:-1] + (problem.call.qv_dim,))], axis=-1), n(dv), None)

    def forward(self, problem: AttentionProblem, a: Mapping[str, Any]) -> Fwd:
        return self._forward(problem, a, return_lse=True)

    def forward_inference(self, problem: AttentionProblem, a: Mapping[str, Any]) -> np.ndarray:
        """O of FA4's inference call (``return_lse=False``, no gradient: its own kernel without the
        LSE store) in the problem's layout (the ``inference_bitwise`` property)."""
        if problem.call is not None and problem.call.mla:
            raise Unsupported("the inference call is not made on an MLA call form")
        return self._forward(problem, a, return_lse=False).out

    def _forward(self, problem: AttentionProblem, a: Mapping[str, Any], *, return_lse: bool) -> Fwd:
        self.check_supported(problem)
        dt = problem.dtype
        if problem.call is not None and problem.call.mla:
            return self._mla_forward(problem, a)
        guarding = contextlib.nullcontext(None)
        iface = getattr(self._ad, "interface_module", None)
        if not self.fake and iface is not None:   # Note [Scratch guard]: O and LSE as guarded buffers
            from fa4verify.kernels.stage_taps import guard_forward_outputs
            guarding = guard_forward_outputs(iface(), armed_guard)    # the interface of this target's adapter
        with self._mode(), self._emulation(), self._laid_out(problem), guarding as fg:
            if problem.call is not None and problem.call.rearranges:
                q, k, v, _, kw = self._call_kw(problem, a)
                r = self._call(self._ad.forward, q, k, v, return_lse=return_lse, **kw)
            else:
                r = self._call(self._ad.forward, self._t(a["q"], dt), self._t(a["k"], dt), self._t(a["v"], dt),
                               return_lse=return_lse, own_choice=problem.call is not None and problem.call.num_splits == 0,
                               **self._fwd_kw(problem, a))
        guard = None if fg is None else {n: b.check() for n, b in fg.guards.items()}
        self.last_forward_guard = guard     # the inference call returns O alone: its guard is read here
        self._note_config(r.config)
        if r.lse is None:          # the inference call: O alone
            out = np.zeros(tuple(r.out.shape)) if self.fake else self._np(r.out)
            if problem.call is not None and problem.call.batched_layout:
                from fa4verify import call_layout
                out = call_layout.to_problem_out(problem, out)
            return Fwd(out, None, guard=guard)
        if self.fake:
            out, lse = np.zeros(tuple(r.out.shape)), np.zeros(tuple(r.lse.shape))
        else:
            out, lse = self._np(r.out), self._np(r.lse)
        if problem.call is not None and problem.call.batched_layout:
            from fa4verify import call_layout
            out, lse = call_layout.to_problem_fwd(problem, out, lse)
        partials = None
        if getattr(r, "partials", None) is not None and not self.fake:
            partials = (self._np(r.partials[0]), self._np(r.partials[1]))
            _check_split_model(problem, r.config, partials)
        elif not self.fake and problem.call is not None and problem.call.split_kv and split_kv_runs(problem):
            raise HarnessError("FA4 ran the split-KV call without handing partials to its combine "
                               "(interface._flash_attn_fwd_combine): fa4verify's model of the call does not hold")
        return Fwd(out, lse, native=(r.out, r.lse), guard=guard, partials=partials)

    def forward_tensors(self, q, k, v, **kw):
        """FA4's forward on the caller's own torch tensors (on the device, in the input dtype),
        under this target's emulation and compile-only settings; the call's kernel configuration is
        recorded. Returns the adapter's result unconverted (for a caller that needs the stored bits,
        e.g. the determinism digests); FA4's rejections reach the caller as raised."""
        with self._mode(), self._emulation():
            r = self._ad.forward(q, k, v, **kw)
        self._note_config(getattr(r, "config", None))
        return r

    def backward_tensors(self, q, k, v, out, dout, lse, **kw):
        """FA4's backward on the caller's own tensors, like :meth:`forward_tensors`; ``dq``/``dk``/
        ``dv`` buffers passed in ``kw`` are FA4's output buffers (written in place)."""
        with self._mode(), self._emulation():
            r = self._ad.backward(q, k, v, out, dout, lse, **kw)
        self._note_config(getattr(r, "config", None))
        return r

    def _note_config(self, cfg: Any) -> None:
        if hasattr(cfg, "to_dict"):
            d = cfg.to_dict()
        elif isinstance(cfg, Mapping) or cfg is None:
            d = dict(cfg or {})
        else:
            d = dict(vars(cfg))
        self.last_config = d
        key = f"{d.get('op')} arch={d.get('arch')} tile={d.get('tile_mn')} {d.get('dtype')}"
        self.configs[key] = self.configs.get(key, 0) + 1

    def describe(self) -> dict[str, Any]:
        d = {"target": self.name, "where": self.where, "kernel_configs": dict(self.configs),
             "arch": self.arch, "exp2_emulation": self.emulation, "tensor_core": self.tensor_core}
        try:
            d["versions"] = self._ad.versions()
        except Exception:  # noqa: BLE001
            pass
        return d

    def taps_unsupported(self, problem: AttentionProblem) -> Optional[str]:
        """Why the backward's stage taps (:mod:`fa4verify.kernels.stage_taps`: D, lse_log2 and
        dq_accum) cannot be read for ``problem``, or None."""
        from fa4verify.kernels import facts
        if self.fake or self.device != "cuda":
            return "stage taps need FA4 on a GPU"
        if problem.call is not None and problem.call.mla:
            return "FA4's sparse MLA backward is not tapped (its D and dQ buffers are its own)"
        if problem.varlen:
            return "stage taps read dense layouts only (varlen D / dq_accum are packed per tile)"
        if facts.sm100_hd256_lacks(problem.arch, problem.head_dim, problem.head_dim_v, "bwd"):
            return "FA4's dedicated SM100 hd-256 backward has no separate dQ postprocess to tap"
        return None

    def dlse_unsupported(self, problem: AttentionProblem) -> Optional[str]:
        if (why := _dlse_rearranged(problem)) is not None:
            return why
        from fa4verify.kernels import facts
        if "dlse" in facts.sm100_hd256_lacks(problem.arch, problem.head_dim, problem.head_dim_v, "bwd"):
            return facts.sm100_hd256_refusal("bwd", {"dlse"})
        return None

    def autograd_unsupported(self, problem: AttentionProblem) -> Optional[str]:
        if self.fake:
            return "compile-only: the public autograd path compiles the kernels the driver calls"
        if problem.call is not None and problem.call.gather_topk:   # Note [The sparse MLA backward]
            if not hasattr(self._ad, "mla_forward_backward_autograd"):
                return "this adapter has no public autograd entry for MLA (mla_forward_backward_autograd)"
            return _call_backward_unsupported(problem)
        if problem.call is not None and problem.call.paged:
            return "FA4 has no paged-KV backward (page_table is forward-only)"
        if problem.call is not None and problem.call.block_size is not None and problem.varlen:
            from fa4verify.coverage.space import VARLEN_SPARSE_BWD
            return VARLEN_SPARSE_BWD
        if not hasattr(self._ad, "forward_backward_autograd"):
            return "this adapter has no public autograd entry (forward_backward_autograd)"
        return None

    def backward_autograd(self, problem: AttentionProblem, a: Mapping[str, Any], *, deterministic: bool = True,
                          dlse: Optional[np.ndarray] = None, lse_only: bool = False) -> Bwd:
        """Note [The public autograd path]
        -----------------------------------
        Training code reaches FA4's backward through ``FlashAttnFunc.backward`` /
        ``FlashAttnVarlenFunc.backward``, which rebuild ``_flash_attn_bwd``'s arguments from what
        the forward saved on ``ctx`` (softcap, window, scale, the mods, ``dlse`` when the LSE is
        returned). The judge's backward calls that driver directly (its taps and NaN-filled
        buffers need it), so a fault in the autograd glue -- a ``ctx`` field dropped or swapped --
        reached no check. This runs the public path (``flash_attn_func`` /
        ``flash_attn_varlen_func``, then autograd of ``(out, lse)`` with ``(dout, dlse)``). A loss
        through O alone (``dlse`` None) is called as a training step calls it: ``return_lse`` and
        the varlen ``max_seqlen_q`` / ``max_seqlen_k`` left at FA4's defaults (FA4 must keep the
        LSE its backward needs, and derive its grid from the token counts: no audit call did
        either before red-team round 15, ``docs/results/redteam15/``); with a ``dlse`` the call
        asks ``return_lse=True``. ``bwd_stages`` judges its gradients with the driver's budgets and,
        on calls without a call form, with ``dlse`` and ``deterministic``, requires them bitwise
        equal to the driver's (:func:`fa4verify.fuzz.properties._judge_autograd`).

        Call forms too (seqused_q / seqused_k, K or Q packed at capacity offsets, block sparsity,
        a CuTe mask_mod): the public functions take them and their ``backward`` must hand them on
        (a varlen autograd backward that drops ``seqused_k``, or a block-sparse one that drops
        ``block_sparse_tensors_bwd``, reached no check: the fifth red-team round); FA4 gets the
        call's own arrays and the gradients come back in the problem's layout."""
        if (why := self.autograd_unsupported(problem)) is not None:
            raise Unsupported(why)
        dt = problem.dtype
        if problem.call is not None and problem.call.mla:
            if lse_only:
                raise Unsupported("a loss through the LSE alone is not passed on an MLA call form")
            call = problem.call
            with self._mode(), self._emulation():
                q, qv = self._mla_split(problem, a, "q")
                k, _ = self._mla_split(problem, a, "k")
                idx = self._t(call.gather_kv_indices(problem), None)
                # FA4's MLA LSE is (b, s, h): the problem's (b, h, s) dLSE transposed
                dl = None if dlse is None else self._t(np.ascontiguousarray(np.swapaxes(dlse, 1, 2), np.float32), None)
                r = self._call(self._ad.mla_forward_backward_autograd, q, k, self._t(a["v"], dt), qv,
                               self._t(a["dout"], dt), gather_kv_indices=idx, dlse=dl,
                               softmax_scale=problem.softmax_scale, causal=problem.causal,
                               gather_bwd_recompute_p=call.recompute_p)
            return self._mla_grads_of(problem, r[2], r[3], r[4], r[5])
        if problem.sink and a.get("learnable_sink") is None:
            raise Unsupported("a sink problem without its learnable_sink array")
        rearranged = problem.call is not None and problem.call.rearranges
        if dlse is not None and (why := _dlse_rearranged(problem)) is not None:
            raise Unsupported(why)
        with self._mode(), self._emulation(), self._laid_out(problem):
            if rearranged:
                q, k, v, do, kw = self._call_kw(problem, a, public=True)
                if problem.call.block_size is not None:      # the backward's own block lists
                    kw["block_sparse_tensors_bwd"] = self._call_kw(
                        problem, a, backward=True, deterministic=deterministic)[4]["block_sparse_tensors"]
            else:
                kw = self._kw(problem, a)             # score_mod_bwd too: the public backward takes it
                kw.pop("causal_with_mask_mod", None)  # the adapter's own: the public path has no guard
                if problem.call is not None and problem.call.pack_gqa is not None:
                    kw["pack_gqa"] = problem.call.pack_gqa
                q, k, v, do = (self._t(a[n], dt) for n in ("q", "k", "v", "dout"))
            if dlse is not None and rearranged and problem.call.batched_layout:    # the call's own LSE layout
                from fa4verify import call_layout
                dlse = call_layout.to_call_lse(problem, dlse)
            dl = None if dlse is None else self._t(np.ascontiguousarray(dlse, np.float32), None)
            if dlse is None:        # a loss through O alone, called as a training step calls it
                kw.pop("max_seqlen_q", None)
                kw.pop("max_seqlen_k", None)
            if lse_only:            # a loss through the LSE alone: FA4's backward gets no dO
                if dl is None:
                    raise Unsupported("a loss through the LSE alone needs a dlse")
                do = None
            r = self._call(self._ad.forward_backward_autograd, q, k, v, do, dlse=dl,
                           deterministic=deterministic, **kw)
        dq, dk, dv = self._np(r[2]), self._np(r[3]), self._np(r[4])
        if rearranged and problem.call.batched_layout:
            from fa4verify import call_layout
            dq, dk, dv = call_layout.to_problem_grads(problem, dq, dk, dv)
        return Bwd(dq, dk, dv, self._np(r[5]))

    def _poisoned(self, q, k, v) -> dict[str, Any]:
        """Note [Poisoned gradients]: FA4's dQ, dK and dV buffers, allocated here in q, k and v's
        shapes and filled with NaN, each between sentinel bands (:func:`armed_guard`, Note
        [Scratch guard]; a layout that is not contiguous gets no bands). FA4
        must write every element (zeros for a
        key no query sees: its kernels write them); one it leaves unwritten reads NaN and fails the
        judge, where FA4's own ``torch.empty`` would hand back whatever the allocator held (often
        zeros: a missed write passed unseen). Compile-only (fake) runs allocate nothing. The race
        harness also NaN-fills FA4's scratch buffers (``fa4verify/races.py``, Note [Poisoned
        scratch]) and leaves all of it off with ``--opt races_poison=off``."""
        if self.fake:
            return {}
        out: dict[str, Any] = {}
        self._grad_guards = {}
        for n, t in (("dq", q), ("dk", k), ("dv", v)):
            if not t.is_contiguous():   # a layout FA4 would allocate with strides: no guard, poisoned alike
                out[n] = self._torch.full_like(t, float("nan"))
                continue
            self._grad_guards[n] = armed_guard(n, tuple(t.shape), t.dtype, t.device)   # Note [Scratch guard]
            out[n] = self._grad_guards[n].view
        return out

    def backward(self, problem: AttentionProblem, a: Mapping[str, Any], fwd: Fwd, *,
                 deterministic: bool = True, taps: Optional[dict] = None, dlse: Optional[np.ndarray] = None) -> Bwd:
        """FA4's backward of ``problem`` into NaN-filled gradient buffers (Note [Poisoned
        gradients]). ``dlse``: a gradient through the returned LSE (its layout, fp32 values), on a
        call without a call form's rearrangement. ``taps``: a dict to fill with the stage buffers of this
        very call (numpy: ``dpsum``, ``lse_log2``, ``dq_accum_zeroed``, ``dq_accum`` in (b, s, h, d));
        see :meth:`taps_unsupported`."""
        self.check_supported(problem)
        if problem.call is not None and problem.call.mla:
            if taps is not None or dlse is not None:
                raise Unsupported("FA4's sparse MLA backward has no stage taps and takes no dLSE here")
            return self._mla_backward(problem, a)
        dt = problem.dtype
        self._grad_guards = {}
        cap = contextlib.nullcontext(None)
        if taps is not None:
            from fa4verify.kernels.stage_taps import capture_backward_stages
            cap = capture_backward_stages(guard=None if self.fake else armed_guard)
        with self._mode(), self._emulation(), self._laid_out(problem), cap as tapped:
            if fwd.native is not None:
                out, lse = fwd.native          # FA4's own O and LSE tensors from the forward call
            elif self.fake:
                out = self._t(fwd.out, dt)
                lse = self._t(np.asarray(fwd.lse, np.float32), None)
            else:
                out = self._t(fwd.out.astype(np.float32), dt)
                lse = self._torch.from_numpy(np.ascontiguousarray(fwd.lse, np.float32)).to(self.device)
            dl = {}
            if dlse is not None:
                if (why := self.dlse_unsupported(problem)) is not None:
                    raise Unsupported(why)
                if problem.call is not None and problem.call.batched_layout:    # the call's own LSE layout
                    from fa4verify import call_layout
                    dlse = call_layout.to_call_lse(problem, dlse)
                dl = {"dlse": self._t(np.ascontiguousarray(dlse, np.float32), None)}
            if problem.call is not None and problem.call.rearranges:
                if fwd.native is None:
                    raise Unsupported("a call-form backward needs the forward's own O and LSE tensors")
                q, k, v, do, kw = self._call_kw(problem, a, backward=True, deterministic=deterministic)
                kw.pop("page_table", None)
                r = self._call(self._ad.backward, q, k, v, out, do, lse, deterministic=deterministic,
                               **self._poisoned(q, k, v), **dl, **kw)
            else:
                q, k, v = self._t(a["q"], dt), self._t(a["k"], dt), self._t(a["v"], dt)
                r = self._call(self._ad.backward, q, k, v, out, self._t(a["dout"], dt), lse,
                               deterministic=deterministic, **self._poisoned(q, k, v), **dl, **self._kw(problem, a))
        self._note_config(r.config)
        # Note [Scratch guard]: the gradients' bands, then the preprocess's
        guarded = {**self._grad_guards, **({} if tapped is None else tapped.guards)}
        self._grad_guards = {}
        guard = {n: b.check() for n, b in guarded.items()}
        if taps is not None and tapped is not None:
            for n in ("dpsum", "lse_log2", "dq_accum_zeroed"):
                taps[n] = self._np(getattr(tapped, n))
            try:
                taps["dq_accum"] = self._np(tapped.dq_accum_logical(r.dq))
            except RuntimeError as e:
                taps["dq_accum_missing"] = str(e)
        if self.fake:
            ds = getattr(r, "dsink", None)
            return Bwd(*(np.zeros(tuple(t.shape)) for t in (r.dq, r.dk, r.dv)),
                       dsink=None if ds is None else np.zeros(tuple(ds.shape)))
        dq, dk, dv = self._np(r.dq), self._np(r.dk), self._np(r.dv)
        if problem.call is not None and problem.call.batched_layout:
            from fa4verify import call_layout
            dq, dk, dv = call_layout.to_problem_grads(problem, dq, dk, dv)
        return Bwd(dq, dk, dv, self._np(getattr(r, "dsink", None)), guard=guard)


#: faults the twin can plant in its call-form layer (fa4verify.call_layout) and its varlen
#: sequence loop, for the fuzz's own mutation tests: ``paged_wrong_permutation`` reads a permuted
#: page table in reversed order; ``varlen_dlse_offset_dropped`` reads every sequence's dLSE from
#: the first sequence's rows (a dropped ``offset_batch`` of FA4's preprocess);
#: ``block_lists_by_kv_head`` gives each query head of a KV group the block mask of the query head
#: numbered as the KV head (Note [Block masks by head]: source mutant block_sparse_packgqa_guard_dropped);
#: ``rule_cut_blocks_listed_full`` runs an SM 10.x forward of block lists under a rule as FA4 would
#: with every listed block full (Note [Rule-cut blocks in the mask lists]: the rule inside the first
#: block it walks only)
LAYOUT_MUTATIONS: tuple[str, ...] = ("paged_wrong_permutation", "varlen_dlse_offset_dropped",
                                     "block_lists_by_kv_head", "split_range_overlap", "split_sink_every",
                                     "rule_cut_blocks_listed_full")


# Note [Input layouts]
# --------------------
# FA4 takes Q, K, V and dO with any strides whose last is 1 (``maybe_contiguous``), and models hand
# it views: Q/K/V sliced out of one fused QKV projection (a token stride of three rows of heads),
# (b, h, s, d) storage transposed to (b, s, h, d), rows wider than the head dim, K/V expanded over a
# size-1 dim (stride 0). Its TMA loads take the strides from their descriptors; its cp.async loads
# (PackGQA, paged) and stores compute addresses themselves, so a kernel that assumed contiguous
# rows is wrong only on such views. :func:`input_view` makes each from a contiguous tensor, with
# the same values (also under FakeTensorMode): ``strided`` (rows twice as wide), ``transposed``,
# ``qkv_packed`` (the middle third of a (..., 3, heads, d) buffer), ``broadcast`` (stride 0 on
# every size-1 dim). The production target applies a problem's ``CallForm.input_layout`` to the 3-
# and 4-D inputs it makes (:meth:`ProductionTarget._laid_out`); the call sequences set it per call.
INPUT_LAYOUTS = ("contiguous", "strided", "transposed", "qkv_packed", "broadcast")


def input_view(t: Any, layout: str) -> Any:
    """``t`` (a 3-D (tokens, heads, d) or 4-D (batch, seqlen, heads, d) input) as a view of
    ``layout`` with its values (Note [Input layouts]); other tensors and layouts unchanged."""
    if layout in ("contiguous", "block_broadcast") or t is None or t.dim() not in (3, 4):
        return t
    import torch
    from torch._subclasses.fake_tensor import FakeTensor
    fake = isinstance(t, FakeTensor)        # compile-only: strides alone (a copy into a view fails there)
    if layout == "strided":
        wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
        if not fake:
            wide[..., : t.shape[-1]] = t
        return wide[..., : t.shape[-1]]
    if layout == "transposed":          # (.., heads, seqlen, d) storage
        a, b = t.dim() - 3, t.dim() - 2
        shape = list(t.shape)
        shape[a], shape[b] = shape[b], shape[a]
        y = torch.empty(shape, dtype=t.dtype, device=t.device)
        y.copy_(t.transpose(a, b))
        return y.transpose(a, b)
    if layout == "qkv_packed":          # the middle third of (.., 3, heads, d)
        buf = torch.zeros(*t.shape[:-2], 3, *t.shape[-2:], dtype=t.dtype, device=t.device)
        if not fake:
            buf[..., 1, :, :] = t
        return buf[..., 1, :, :]
    if layout == "broadcast":
        st = [0 if n == 1 else s for n, s in zip(t.shape, t.stride())]
        return t.as_strided(t.shape, st)
    raise ValueError(f"layout {layout!r}: expected one of {INPUT_LAYOUTS}")


def _pool_views(k: Any, v: Any, layout: str) -> tuple[Any, Any]:
    """The paged pools ``k``, ``v`` (num_pages, page_size, nheads_kv, d), as FA4 gets them under
    Note [Page pool layouts]: ``kv_fused``, the two halves of one (num_pages, 2, page, hk, d)
    cache; ``hnd``, (num_pages, page, hk, d) views of (num_pages, hk, page, d) storage. The same
    values, other strides."""
    import torch
    if layout == "kv_fused":
        fused = torch.stack([k, v], dim=1)
        return fused[:, 0], fused[:, 1]
    if layout == "hnd":
        def hnd(x):
            y = torch.empty((x.shape[0], x.shape[2], x.shape[1], x.shape[3]), dtype=x.dtype, device=x.device)
            y.copy_(x.transpose(1, 2))          # (also under FakeTensorMode, where .contiguous() fails here)
            return y.transpose(1, 2)
        return hnd(k), hnd(v)
    raise ValueError(f"pool_layout={layout!r}")


def block_mask_heads(problem: AttentionProblem) -> int:
    """The head extent of the block-sparse tensors FA4 gets for ``problem`` (Note [Block masks
    broadcast over heads]).

    Note [Block masks broadcast over heads]
    ---------------------------------------
    A call form's block mask is one mask for every head. FA4 takes it either per head
    (``(batch, nheads, ...)``) or broadcast (head extent 1, which FA4 expands), and the choice
    picks the kernel: ``interface.py`` turns packed GQA off when the block-sparse tensors' head
    extent is not 1 ("pack_gqa requires block sparse head dim == 1"). So a GQA problem whose call
    does not set ``pack_gqa=False`` gets the broadcast form, and runs FA4's packed-GQA block-sparse
    kernel (on SM90 with ``tile_m % (q heads per KV head) != 0`` also its cp.async Q load), as a
    dense GQA call would; an MHA problem or ``pack_gqa=False`` keeps the per-head form. Found with
    ``audit --source-coverage`` on the H200: with per-head tensors only, no audit kernel held the
    packed block-sparse path (Note [Source coverage]). A mask drawn per head (``block_per_head``)
    goes per head whatever the GQA (Note [Block masks by head])."""
    packed = problem.nheads != problem.nheads_kv and (problem.call is None or problem.call.pack_gqa is not False)
    per_head = problem.call is not None and problem.call.block_per_head     # Note [Block masks by head]
    return 1 if packed and not per_head else problem.nheads


def _split_kw(problem: AttentionProblem) -> tuple[dict[str, Any], bool]:
    """(the keywords :func:`fa4verify.kernels.facts.split_kv_config` and ``split_kv_key_ranges``
    share, FA4's resolved ``causal``) of a split-KV problem."""
    from fa4verify.kernels import facts
    causal, local, left, right = facts.resolve_causal_local_window(problem.causal, problem.window_size)
    return dict(seqlen_q=problem.seqlen_q, qhead_per_kvhead=problem.nheads // problem.nheads_kv, local=local,
                window_left=left, window_right=right, batch=problem.batch, nheads_kv=problem.nheads_kv,
                pack_gqa=problem.call.pack_gqa), causal


def split_kv_ranges(problem: AttentionProblem) -> tuple[tuple[int, int], ...]:
    """FA4's key range of each split of a split-KV problem (:func:`fa4verify.kernels.facts.split_kv_key_ranges`):
    one range where FA4 runs the call unsplit (hd != hdv with few keys)."""
    from fa4verify.kernels import facts
    kw, causal = _split_kw(problem)
    return facts.split_kv_key_ranges(problem.arch, problem.dtype, problem.head_dim, problem.head_dim_v,
                                     problem.seqlen_k, problem.call.num_splits, causal=causal, **kw)


def split_kv_tile(problem: AttentionProblem) -> int:
    """The KV tile FA4's split-KV forward of ``problem`` runs (:func:`fa4verify.kernels.facts.split_kv_config`:
    the forward tile, 64 at hd != hdv)."""
    from fa4verify.kernels import facts
    kw, causal = _split_kw(problem)
    return facts.split_kv_config(problem.arch, problem.dtype, problem.head_dim, problem.head_dim_v,
                                 seqlen_k=problem.seqlen_k, num_splits=problem.call.num_splits, causal=causal, **kw)[0]


def split_kv_runs(problem: AttentionProblem) -> bool:
    """Whether FA4 runs ``problem`` as a split-KV call (partials and its internal combine): a
    request it keeps (``num_splits`` > 1) or its heuristic's count over 1 (``num_splits=0``;
    :func:`fa4verify.kernels.facts.split_kv_config`)."""
    return problem.call is not None and problem.call.split_kv and len(split_kv_ranges(problem)) > 1


def _check_split_model(problem: AttentionProblem, cfg: Any, partials) -> None:
    """The split FA4 ran is the one fa4verify models (its tile_n, from FA4's compile key, and the
    partial count); a disagreement is fa4verify's error, never a verdict on FA4."""
    tn, want = split_kv_tile(problem), len(split_kv_ranges(problem))
    ran = getattr(cfg, "tile_mn", None)
    S = int(partials[0].shape[0])
    if S != want or (ran is not None and ran[1] is not None and int(ran[1]) != tn):
        raise HarnessError(f"fa4verify's model of FA4's split-KV call disagrees with the call it ran: "
                           f"{S} partials of tile_n {None if ran is None else ran[1]}, modelled "
                           f"{want} of tile_n {tn} (kernels.facts.split_kv_config)")


def split_kv_unmodelled(problem: AttentionProblem) -> Optional[str]:
    """Why fa4verify cannot judge a split-KV problem (FA4's split of its keys not modelled), or None."""
    if problem.call is None or problem.call.num_splits == 1:
        return None
    try:
        split_kv_ranges(problem)
    except ValueError as e:
        return f"split-KV: {e}"
    return None


def hd256_refusal(problem: AttentionProblem, pass_: str) -> Optional[str]:
    """Why FA4's dedicated SM100 (256, 256) kernel of ``pass_`` refuses what ``problem`` uses
    (:func:`fa4verify.kernels.facts.sm100_hd256_lacks`), or None."""
    from fa4verify.kernels import facts
    lacks = facts.sm100_hd256_lacks(problem.arch, problem.head_dim, problem.head_dim_v, pass_)
    if not lacks:
        return None
    score, mask = problem.mod_pairs() if problem.mods else (None, None)
    call = problem.call
    used = {name for name, on in (
        ("softcap", problem.softcap > 0), ("sink", problem.sink), ("local", problem.local),
        ("score_mod", score is not None),
        ("mask_mod", mask is not None or problem.mask_mod is not None
         or (call is not None and call.mask_mod_fn is not None)),
        ("block_sparse", call is not None and call.block_size is not None)) if on} & lacks
    return facts.sm100_hd256_refusal(pass_, used) if used else None


#: Note [The sparse MLA backward]: why a saved-P sparse MLA backward is not run where FA4's
#: training forward rescales lazily (the budget assumes a saved P of at most 1)
MLA_BWD_UNJUDGED = ("this FA4 release's training forward of a gather rescales lazily (a saved P above 1), which "
                    "fa4verify's saved-P budget does not model (Note [The sparse MLA backward])")


def mla_grads(problem: AttentionProblem, bwd: "Bwd") -> "Bwd":
    """Note [The sparse MLA backward]: a problem-layout backward (dq', dk' over [rope, latent], dv
    of the value use) in FA4's MLA layout: dv holds both uses of v (``dv + dk'[..., rope:]``, as
    FA4 returns it) and dk' only the rope part (its latent columns zero)."""
    dk, dv = problem.call.fold_latent(problem, bwd.dk, bwd.dv)
    return Bwd(bwd.dq, dk, dv, bwd.dsink, stages=bwd.stages)


#: FA4 runs fp8 inputs forward only
FP8_NO_BACKWARD = "FA4 has no fp8 backward (interface.py raises 'FA4 CuTe FP8 backward is not supported yet')"


def _call_backward_unsupported(problem: AttentionProblem) -> Optional[str]:
    """FA4 4.0.0b36's limits on the backward of a problem's head dims and call form, or None."""
    from fa4verify.kernels import facts
    if problem.dtype == "fp8":
        return FP8_NO_BACKWARD
    if problem.call is not None and problem.call.split_kv:
        # FA4's public autograd path would recompute its own (unsplit) forward, and the driver
        # backward reads the split forward's O and LSE: neither is judged here
        return "split-KV is judged forward-only (_flash_attn_bwd has no num_splits)"
    if problem.call is not None and problem.call.mla:
        if not problem.call.gather_topk:
            return "FA4 has no dense MLA backward (only the top-k gather one)"
        if problem.dtype != "bf16" and facts.sparse_mla_bwd_bf16_only():
            return "FA4's sparse MLA backward takes bf16 inputs only (it asserts 'sparse MLA dK requires bfloat16')"
        lazy = facts.mla_fwd_constants()["train_rescale_threshold"] != 0.0
        return MLA_BWD_UNJUDGED if lazy and not problem.call.recompute_p else None
    why = facts.bwd_refusal(problem.arch, problem.head_dim, problem.head_dim_v, problem.nheads / problem.nheads_kv)
    if why is None:
        why = hd256_refusal(problem, "bwd")
    if why is None and problem.varlen and (problem.softcap > 0 or (problem.mods and problem.mod_pairs()[0] is not None)) \
            and not facts.bwd_takes_varlen_score_mod():
        why = ("this FA4 release has no varlen backward with a score_mod, softcap included (its _flash_attn_bwd "
               "asserts 'varlen + score_mod not supported in bwd yet')")
    call = problem.call
    if why is not None or call is None:
        return why
    if call.paged:
        return "FA4 has no paged-KV backward (page_table is forward-only, interface.py)"
    from fa4verify.coverage.space import VARLEN_SPARSE_BWD
    if call.block_size is not None and problem.varlen:
        return VARLEN_SPARSE_BWD
    if call.mask_mod_fn is not None:
        from fa4verify.problem.calls import mask_mod_pairs
        pair = mask_mod_pairs().get(call.mask_mod_fn)
        if pair is None or not pair.backward:
            return f"mask_mod {call.mask_mod_fn!r}: no backward pair registered"
    if call.block_size is not None and problem.arch == "sm90":
        from fa4verify.kernels.features import sm90_sparse_bwd_does_not_build
        if sm90_sparse_bwd_does_not_build(problem.head_dim, problem.head_dim_v):
            return ("known issue sm90_block_sparse_bwd_no_build: FA4's SM90 block-sparse backward does not "
                    f"build at head dim {problem.head_dim} (the DSL aborts the process)")
    return None


def make_target(name: str, *, mutations: Collection[str] = (), accumulation: str = "exact-then-round") -> Target:
    """``"twin"`` or ``"production"``; mutations and ``accumulation`` exist only on the twin."""
    if name == "twin":
        return TwinTarget(mutations, accumulation=accumulation)
    if name == "production":
        if mutations:
            raise ValueError("mutations exist only on the CPU twin (--target twin)")
        if accumulation != "exact-then-round":
            raise ValueError("accumulation chooses the CPU twin's arithmetic (--target twin)")
        return ProductionTarget()
    raise ValueError(f"target={name!r}: expected 'twin' or 'production'")

