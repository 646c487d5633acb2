"""Stateful fuzzing of FA4's compile cache: call sequences judged call by call (Note [Call sequences]).

Note [Call sequences]
---------------------
A compile-key collision shows only on the *second* call of a process: the first call compiles a
kernel under its key; a later call whose key is equal but whose meaning differs (an attribute the
key leaves out and the kernel bakes in: Note [Compile-key attributes],
:mod:`fa4verify.sequences.key`) silently runs the first call's kernel. A fresh-input fuzz
campaign judges every call but never arranges such pairs on purpose, and never shrinks to the
sequence that made a call wrong.

:func:`run_sequences` is a Hypothesis ``RuleBasedStateMachine`` over one target. Each example
starts from empty in-process compile caches (``target.reset()``) and fixes the attributes that
only change the key anyway (dtype, head dim, GQA ratio); every ``call`` rule then picks one of two
*key configurations* of the example (causal, window presence, softcap value, sink) -- so calls
reuse each other's kernels -- and varies every attribute the key leaves out (:data:`VARIED`:
window values, softmax_scale, sink values, sequence lengths, batch, head count, memory layout:
non-contiguous, transposed, broadcast K/V, deterministic, and on production the values of a
score_mod's runtime ``aux_scalars``: a key configuration may carry the ``scalar_bias`` pair,
whose scalars each call draws anew at its ``mod_seed``; FA4 keys only their types; or the
``default_slope`` pair, whose slope each call compiles in as a default argument of a new CuTe
function, drawn at its ``mod_seed``: FA4's key holds it only through its callable hash of
``__defaults__``). Each call is judged by the one judge
(:func:`fa4verify.fuzz.properties.check_problem`: runs, forward and backward within their
budgets). A violation stops the example; Hypothesis shrinks it to the shortest call sequence that
still fails (:func:`shrink`: calls removed one at a time while the sequence still fails, Hypothesis
draws only; a shrink of Hypothesis's own would re-run the judge thousands of times); that sequence
is written as a replayable case (:func:`write_case`), and its last call
is replayed alone in a fresh process (:func:`classify`): passing alone makes it a **sequence
bug** (what ran before it made it wrong), failing alone a **plain bug**.

Targets (:func:`make_target`): ``production`` (FA4 through the adapter, with the layouts applied
to the tensors FA4 receives) and ``twin`` (:class:`KeyedTwinTarget`: the CPU twin behind a model
of FA4's compile cache keyed by the attributes the installed FA4's key carries, so a kernel's
baked constants are those of the call that compiled it). ``drop=`` plants a compile-key fault:
key fields removed (production: from FA4's own key, by the source names of its elements; twin:
from the model's key), the faults the machine must find.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Collection, Mapping, Optional


from fa4verify.problem import AttentionProblem, ValueSpec
from fa4verify.targets import ProductionTarget, TwinTarget
from fa4verify.errors import HarnessError, Unsupported

__all__ = ["VARIED", "VARY", "SCALAR_PAIR", "DEFAULTS_PAIR", "constructed_calls", "run_calls", "LAYOUTS", "SEQ_PROPERTIES", "Call", "KeyedTwinTarget", "SequenceProductionTarget",
           "make_target", "judge_call", "run_sequences", "write_case", "replay", "classify", "CASE_FORMAT"]

CASE_FORMAT = "fa4verify-sequence-case/1"
#: the judge's properties each call is held to (the fuzz's; the rest need extra kernels)
SEQ_PROPERTIES = ("runs", "fwd_budget", "bwd_budget", "finite", "masked_rows")
LAYOUTS = ("contiguous", "strided", "transposed", "broadcast")
#: the layout of a block-sparse call's lists, not of its inputs: every list passed once, batch and
#: head extent 1 (FA4 expands it: stride 0), for lists equal over batch and heads (Note [Shared
#: block lists])
BLOCK_LAYOUT = "block_broadcast"
#: attributes (fa4verify.sequences.key.ATTRIBUTES names) the machine varies between calls that
#: share a key configuration; tests/test_sequences.py holds it against the installed key
VARIED = frozenset({"window_left", "window_right", "softmax_scale", "softcap", "causal", "sink", "sink_dtype",
                    "sink_values",
                    "seqlen", "batch", "nheads", "layout_strided", "layout_transposed", "layout_broadcast",
                    "deterministic", "aux_scalars", "mod_defaults", "block_broadcast"})
#: the score_mod pair whose runtime aux scalars the machine varies (production only: the twin
#: models no mod pairs), drawn at each call's ``mod_seed``
SCALAR_PAIR = "scalar_bias"
#: the score_mod pair whose compile-time constant (a default argument) the machine varies
#: (production only), drawn at each call's ``mod_seed``
DEFAULTS_PAIR = "default_slope"


@dataclasses.dataclass(frozen=True)
class Call:
    """One call of a sequence: the problem (inputs from its value seed), the memory layout of the
    tensors FA4 receives, the backward's mode."""
    problem: AttentionProblem
    layout: str = "contiguous"
    deterministic: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"problem": self.problem.to_dict(), "layout": self.layout, "deterministic": self.deterministic}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Call":
        return cls(AttentionProblem.from_dict(d["problem"]), d.get("layout", "contiguous"),
                   bool(d.get("deterministic", True)))

    def describe(self) -> str:
        return f"{self.problem.describe()} layout={self.layout}{'' if self.deterministic else ' nondet'}"

    def key_config(self) -> tuple:
        """fa4verify's view of the key-carrying attributes (dtype, head dim, GQA, causal, window
        presence, softcap, sink, broadcast layout, mode, the mod pair): calls with equal tuples
        should share FA4's kernels."""
        p = self.problem
        wl, wr = p.window_size
        return (p.dtype, p.head_dim, p.nheads // p.nheads_kv, p.causal, wl is not None, wr is not None,
                float(p.softcap), p.sink, self.layout == "broadcast", self.deterministic, p.mods,
                self.layout == BLOCK_LAYOUT)


# ============================================================================ targets
class SequenceProductionTarget(ProductionTarget):
    """Production FA4 with the call's memory layout applied to the input tensors FA4 receives
    (the target's ``layout``, Note [Input layouts]: ``strided``: a view into rows twice as wide;
    ``transposed``: (b, h, s, d) storage viewed as (b, s, h, d); ``broadcast``: stride 0 on every
    size-1 dim of K and V; Note [Shared block lists]: ``block_broadcast``), and ``reset`` emptying
    FA4's in-process compile caches. ``drop``: FA4 key fields (source text of ``compile_key``
    elements) removed from every lookup of FA4's caches -- a planted compile-key fault."""

    def __init__(self, *, drop: Collection[str] = (), **kw: Any) -> None:
        super().__init__(**kw)
        self.drop = tuple(drop)
        self._t_calls = 0
        if self.drop:
            self._plant()

    def _fns(self):
        fa = self._ad.fa4_interface()
        return [getattr(fa, n) for n in dir(fa)
                if callable(getattr(fa, n, None)) and hasattr(getattr(fa, n), "compile_cache")]

    def _plant(self) -> None:
        hit = []
        for fn in self._fns():
            for names in self._ad._compile_key_names(fn):
                idx = tuple(i for i, n in enumerate(names) if n in self.drop)
                if idx:
                    fn.compile_cache = _ProjectedCache(fn.compile_cache, idx, len(names))
                    hit.append(fn.__name__)
                    break
        if not hit:
            raise ValueError(f"no FA4 compile key has the fields {list(self.drop)}")

    def reset(self) -> None:
        """Empty FA4's in-process compile caches. Only the in-memory dicts: a persistent cache's
        own ``clear()`` also deletes its files (``cache_utils.JITPersistentCache.clear``), the
        audit's shared kernel cache; with it on, the next call loads the kernel of its key."""
        for fn in self._fns():
            cache = fn.compile_cache
            cache = cache.inner if isinstance(cache, _ProjectedCache) else cache
            mem = getattr(cache, "cache", None)
            if isinstance(mem, dict):
                mem.clear()
            elif isinstance(cache, dict):
                cache.clear()

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["planted_key_drop"] = list(self.drop)
        return d

    def _call_kw(self, problem: AttentionProblem, a: Mapping[str, Any], **kw: Any):
        out = super()._call_kw(problem, a, **kw)
        if self.layout == BLOCK_LAYOUT:
            _require_shared_lists(problem)
            out[4]["block_sparse_tensors"] = shared_block_lists(out[4]["block_sparse_tensors"], check=not self.fake)
        return out


# Note [Shared block lists]
# --------------------------
# FlexAttention's ``create_block_mask(B=None, H=None)`` gives one set of block lists for every
# batch entry and head; FA4 takes it with batch and head extent 1 and expands it
# (``block_sparsity._expand_sparsity_tensor``: stride 0), and keys the kernel on which list dims
# are stride 0 (``get_block_sparse_broadcast_pattern``), since CuTe keeps a stride 0 static: a
# kernel compiled for shared lists reads entry (0, 0) for every batch entry and head. A call with
# lists per entry under an otherwise equal key must therefore compile its own kernel; a key that
# forgets the pattern runs the shared-list kernel on it (the tenth red-team round's
# ``block_sparse_broadcast_not_keyed``). No other audit call passes shared lists: the adapter
# materialises the batch dim, and the head extent is 1 exactly on packed GQA calls, whose key
# differs in ``pack_gqa`` anyway. The layout ``block_broadcast`` passes a call's lists shared
# (refused when they differ by entry); the constructed sequence follows such a call with one of
# lists per batch entry and head (:func:`constructed_calls`), and the keyed twin models the stale
# kernel (:class:`KeyedTwinTarget`, ``drop=("block_broadcast",)``). Measured on an H100
# (2026-12-06, docs/results/h100/session24_985b9b8/): with the pattern planted out of FA4's forward
# key the second call did reuse the first's kernel and was right -- the kernel reads the lists'
# strides at run time, so on 4.0.0b36 that fault changes no value and the twin's stale kernel is a
# model of the machine's reach, not of FA4.
def _require_shared_lists(problem: AttentionProblem) -> None:
    """HarnessError unless ``problem`` has one set of block lists for every batch entry and head
    (what layout ``block_broadcast`` passes once)."""
    c = problem.call
    if c is None or c.block_size is None or problem.varlen or c.block_per_head or c.block_per_batch:
        raise HarnessError(f"layout {BLOCK_LAYOUT!r} needs one set of block lists for every batch entry and head")


def shared_block_lists(bst: Any, *, check: bool = True) -> Any:
    """FA4's ``BlockSparseTensorsTorch`` ``bst`` with its count and index lists passed once,
    batch and head extent 1 (Note [Shared block lists]); HarnessError when its lists differ
    between batch entries or heads (``check``: False under FakeTensorMode, which has no values)."""
    names = ("mask_block_cnt", "mask_block_idx", "full_block_cnt", "full_block_idx")
    out = {}
    for n in names:
        t = getattr(bst, n)
        if t is None:
            continue
        one = t[:1, :1]
        if check and not bool((t == one).all()):
            raise HarnessError(f"layout {BLOCK_LAYOUT!r}: the call's {n} differs between batch entries or heads")
        out[n] = one.contiguous()
    return bst._replace(**out)


def _entry_zero_blocks(problem: AttentionProblem) -> AttentionProblem:
    """``problem`` with every batch entry and head reading the block lists of entry 0, head 0:
    what a kernel compiled for shared lists (stride 0) reads of lists per entry."""
    from fa4verify.problem.calls import CallForm

    @dataclasses.dataclass(frozen=True)
    class EntryZero(CallForm):
        def _blocks(self, seqlen_q, seqlen_k, seq=None, head=None):
            return super()._blocks(seqlen_q, seqlen_k, None if seq is None else 0, None if head is None else 0)
    c = problem.call
    return problem.replace(call=EntryZero(**{f.name: getattr(c, f.name) for f in dataclasses.fields(CallForm)}))


class _ProjectedCache:
    """FA4's compile cache seen through a key without the fields ``drop`` (planted fault)."""

    def __init__(self, inner: Any, drop: tuple[int, ...], n: int) -> None:
        self.inner, self.drop, self.n = inner, drop, n

    def _k(self, key: Any) -> Any:
        if isinstance(key, tuple) and len(key) == self.n:
            return tuple(x for i, x in enumerate(key) if i not in self.drop)
        return key

    def __contains__(self, key: Any) -> bool:
        return self._k(key) in self.inner

    def __getitem__(self, key: Any) -> Any:
        return self.inner[self._k(key)]

    def __setitem__(self, key: Any, value: Any) -> None:
        self.inner[self._k(key)] = value

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class KeyedTwinTarget(TwinTarget):
    """The CPU twin behind a model of FA4's compile cache: a "kernel" is compiled on the first call
    of its key and bakes in the values of the key-carrying attributes it models (causal, softcap:
    the attributes the installed FA4's key carries, :func:`fa4verify.sequences.key.analyse`; the
    block lists' broadcast pattern, Note [Shared block lists]); a later call with an equal key runs
    with the baked values. With FA4's own key nothing is baked wrongly; ``drop`` removes attributes
    from the model's key (planted faults: ``causal``, ``softcap``, ``block_broadcast``), and the
    second call of a pair that differs only there runs the first's (a kernel baked for shared block
    lists reads entry 0's of a call with lists per entry; the reverse reads the strides it is given)."""

    name = "twin"
    BAKED = ("causal", "softcap", "block_broadcast")

    def __init__(self, *, drop: Collection[str] = (), **kw: Any) -> None:
        super().__init__(**kw)
        unknown = set(drop) - set(self.BAKED)
        if unknown:
            raise ValueError(f"drop {sorted(unknown)}: the twin's key model bakes only {self.BAKED}")
        self.drop = tuple(drop)
        self.layout = "contiguous"
        self._depth = 0
        self._cache: dict[tuple, dict[str, Any]] = {}

    def reset(self) -> None:
        self._cache.clear()

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["planted_key_drop"] = list(self.drop)
        return d

    def _baked(self, problem: AttentionProblem, direction: str) -> AttentionProblem:
        wl, wr = problem.window_size
        blocks = problem.call is not None and problem.call.block_size is not None
        if self._depth == 1 and self.layout == BLOCK_LAYOUT:
            _require_shared_lists(problem)
        attrs = {"causal": bool(problem.causal), "softcap": float(problem.softcap),
                 "block_broadcast": blocks and self.layout == BLOCK_LAYOUT}
        key = (direction, problem.dtype, problem.head_dim, problem.nheads // problem.nheads_kv,
               wl is not None, wr is not None, problem.sink, blocks) \
            + tuple((n, v) for n, v in attrs.items() if n not in self.drop)
        got = self._cache.setdefault(key, attrs)
        if got == attrs:
            return problem
        shared = got["block_broadcast"] and not attrs["block_broadcast"]
        problem = problem.replace(causal=got["causal"], softcap=got["softcap"])
        return _entry_zero_blocks(problem) if shared else problem

    def forward(self, problem, a):
        self._depth += 1            # the twin runs a call form through derived problems: the call is the outermost
        try:
            return super().forward(self._baked(problem, "fwd"), a)
        finally:
            self._depth -= 1

    def backward(self, problem, a, fwd, **kw):
        self._depth += 1
        try:
            return super().backward(self._baked(problem, "bwd"), a, fwd, **kw)
        finally:
            self._depth -= 1


def make_target(spec: Mapping[str, Any]):
    """``{"kind": "production" | "twin", "drop": [...]}`` -> a sequence target."""
    kind = spec.get("kind")
    drop = tuple(spec.get("drop") or ())
    if kind == "production":
        return SequenceProductionTarget(drop=drop)
    if kind == "twin":
        return KeyedTwinTarget(drop=drop)
    raise ValueError(f"sequence target kind {kind!r}: expected 'production' or 'twin'")


# ============================================================================ judging
def judge_call(target: Any, call: Call, known: Optional[dict[str, int]] = None):
    """Run ``call`` on ``target`` and judge it (:func:`~fa4verify.fuzz.properties.check_problem`);
    raises :class:`~fa4verify.fuzz.violation.Violation` on a wrong call, Unsupported when the
    target refuses it, HarnessError on fa4verify's own error (Note [Blame]). A violation a
    documented FA4 issue explains for this call alone is absorbed as the campaigns absorb it
    (:mod:`fa4verify.fuzz.known_issues`, Note [Known issues absorb one violation]) and counted in
    ``known`` by the issue's name."""
    from fa4verify.fuzz.known_issues import known_issue_matcher
    from fa4verify.fuzz.properties import check_problem
    from fa4verify.fuzz.violation import _ABSORB
    match = known_issue_matcher(call.problem, getattr(target, "name", "twin"))

    def absorb(v: Any) -> bool:
        ki = match(v)
        if ki is not None and known is not None:
            known[ki.name] = known.get(ki.name, 0) + 1
        return ki is not None
    from fa4verify.fuzz.properties import CheckOutcome
    from fa4verify.fuzz.violation import Violation
    target.layout = call.layout
    token = _ABSORB.set(absorb)
    try:
        return check_problem(call.problem, target, properties=SEQ_PROPERTIES, backward=True,
                             deterministic=call.deterministic)
    except Violation as v:      # raised past the absorbing hook (a run that failed): as the campaigns
        if absorb(v):
            return CheckOutcome(metrics={}, skipped={}, ran=[])
        raise
    finally:
        _ABSORB.reset(token)
        target.layout = "contiguous"


# ============================================================================ the machine
_SCALES = (None, 0.0625, 0.125, 0.25)
_SOFTCAPS = (0.0, 5.0, 30.0)
_WINDOWS = ((None, None), (16, 0), (40, 8), (100, 100))


def _call_strategy(arch: str, target_kind: str, key_pool: int):
    """Hypothesis strategies of the machine (imported lazily: the audit imports checks early)."""
    from hypothesis import strategies as st
    production = target_kind == "production"
    layouts = LAYOUTS if production else ("contiguous",)
    base = st.fixed_dictionaries({
        "dtype": st.sampled_from(("bf16", "fp16")),
        "head_dim": st.sampled_from((64, 128)),
        "gqa": st.sampled_from((1, 2)),
        "keys": st.lists(st.fixed_dictionaries({
            "causal": st.booleans(), "window": st.sampled_from(_WINDOWS), "softcap": st.sampled_from(_SOFTCAPS),
            "sink": st.booleans(), "mod": st.sampled_from((None, SCALAR_PAIR, DEFAULTS_PAIR) if production else (None,))}),
            min_size=1, max_size=key_pool),
    })
    call = st.fixed_dictionaries({
        "key": st.integers(0, key_pool - 1),
        "causal": st.booleans(),
        "softcap": st.sampled_from(_SOFTCAPS),
        "window_shift": st.sampled_from((0, 7, 33)),
        "scale": st.sampled_from(_SCALES),
        "seqlen_q": st.sampled_from((64, 97, 200)),
        "seqlen_k": st.sampled_from((64, 128, 256)),
        "batch": st.sampled_from((1, 2)),
        "kv_heads": st.sampled_from((1, 2)),
        "layout": st.sampled_from(layouts),
        "deterministic": st.booleans(),
        "vary_key": st.sampled_from((False, False, True)),
        "seed": st.integers(0, 2**16),
        "mod_seed": st.integers(0, 2**16),
    })
    return base, call


def _build(arch: str, base: Mapping[str, Any], v: Mapping[str, Any]) -> Call:
    """The call ``v`` on the key configuration it picks (or, with ``vary_key``, on that
    configuration with causal / softcap redrawn: a call next to its key-sharing neighbours)."""
    kc = dict(base["keys"][v["key"] % len(base["keys"])])
    if v["vary_key"]:
        kc.update(causal=v["causal"], softcap=v["softcap"])
    mod = kc.get("mod")
    if mod:                 # FA4 turns softcap into a score_mod: one or the other
        kc["softcap"] = 0.0
    wl, wr = kc["window"]
    if wl is not None:
        wl, wr = wl + v["window_shift"], wr + (v["window_shift"] // 2)
    hk = v["kv_heads"]
    p = AttentionProblem(arch=arch, dtype=base["dtype"], batch=v["batch"], seqlen_q=v["seqlen_q"],
                         seqlen_k=v["seqlen_k"], nheads=hk * base["gqa"], nheads_kv=hk,
                         head_dim=base["head_dim"], head_dim_v=base["head_dim"], causal=kc["causal"],
                         window_size=(wl, wr), softcap=float(kc["softcap"]), sink=kc["sink"],
                         softmax_scale=v["scale"], values=ValueSpec("normal", int(v["seed"])),
                         mods=(mod,) if mod else (), mod_seed=int(v["mod_seed"]) if mod else 0)
    return Call(p, v["layout"], bool(v["deterministic"]))


#: what a ``neighbour`` rule changes in the previous call (one attribute, the rest kept)
NEIGHBOUR = ("causal", "softcap", "sink", "sink_dtype", "window", "softmax_scale", "seqlen", "batch", "nheads",
             "layout", "deterministic", "values")
#: the production machine's neighbours: also the aux scalars of the call's score_mod and the
#: constant compiled into it (a call without the pair gets it: a key change)
NEIGHBOUR_PRODUCTION = NEIGHBOUR + ("aux_scalars", "mod_defaults")


def _neighbour(c: Call, which: str, v: Mapping[str, Any]) -> Call:
    """``c`` with one attribute changed (taken from the fresh draw ``v``, or flipped): the pairs
    that test the key -- a key-carrying attribute changed on an otherwise equal call must compile
    another kernel, a left-out one must be read at run time."""
    p, layout, det = c.problem, c.layout, c.deterministic

    def other(seq, cur, pick):
        return pick if pick != cur else seq[(list(seq).index(cur) + 1) % len(seq)] if cur in seq else seq[0]
    if which == "causal":
        p = p.replace(causal=not p.causal)
    elif which == "softcap":      # a softcap drops the score_mod pair (FA4 takes one or the other)
        p = p.replace(softcap=float(other(_SOFTCAPS, p.softcap, v["softcap"])), mods=(), mod_seed=0)
    elif which == "sink":
        p = p.replace(sink=not p.sink, sink_dtype="fp32")
    elif which == "sink_dtype":     # a sink in the other dtype (the call gets one if it had none)
        p = p.replace(sink=True, sink_dtype="bf16" if p.sink and p.sink_dtype == "fp32" else "fp32",
                      mods=(), mod_seed=0)
    elif which == "window":
        wl, wr = p.window_size
        sh = 1 + int(v["window_shift"])
        p = p.replace(window_size=(16 + sh, sh // 2) if wl is None else (wl + sh, (wr or 0) + sh // 2))
    elif which == "softmax_scale":
        p = p.replace(softmax_scale=other(_SCALES, p.softmax_scale, v["scale"]))
    elif which == "seqlen":
        p = p.replace(seqlen_q=v["seqlen_q"], seqlen_k=v["seqlen_k"])
    elif which == "batch":
        p = p.replace(batch=2 if p.batch == 1 else 1)
    elif which == "nheads":
        g = p.nheads // p.nheads_kv
        hk = 2 if p.nheads_kv == 1 else 1
        p = p.replace(nheads=g * hk, nheads_kv=hk)
    elif which == "layout":
        layout = v["layout"] if v["layout"] != layout else "contiguous" if layout != "contiguous" else layout
    elif which == "deterministic":
        det = not det
    elif which == "values":
        p = p.replace(values=ValueSpec(p.values.distribution, int(v["seed"]), p.values.params))
    elif which == "gqa":            # the query heads per KV head, the KV heads kept
        g = p.nheads // p.nheads_kv
        p = p.replace(nheads=p.nheads_kv * (2 if g == 1 else 1))
    elif which in ("aux_scalars", "mod_defaults"):
        pair = SCALAR_PAIR if which == "aux_scalars" else DEFAULTS_PAIR
        ms = int(v["mod_seed"])
        p = p.replace(mods=(pair,), softcap=0.0,
                      mod_seed=ms if ms != p.mod_seed or p.mods != (pair,) else ms + 1)
    return Call(p, layout, det)


@dataclasses.dataclass
class SequenceResult:
    """What one run of the machine measured (JSON-able via :meth:`to_json`)."""
    target: dict[str, Any]
    arch: str
    examples: int = 0
    calls: int = 0
    judged: int = 0
    unsupported: dict[str, int] = dataclasses.field(default_factory=dict)
    errors: dict[str, int] = dataclasses.field(default_factory=dict)
    #: attribute -> calls that reused a key configuration an earlier call of the example compiled
    #: with another value of the attribute (the pairs that test the key)
    exercised: dict[str, int] = dataclasses.field(default_factory=dict)
    undecided: dict[str, int] = dataclasses.field(default_factory=dict)
    #: documented FA4 issues that explained a violation of a call (name -> violations absorbed)
    known: dict[str, int] = dataclasses.field(default_factory=dict)
    failure: Optional[dict[str, Any]] = None
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: Call attributes compared between key-sharing calls for :attr:`SequenceResult.exercised`
def _attrs(c: Call) -> dict[str, Any]:
    p = c.problem
    return {"window_left": p.window_size[0], "window_right": p.window_size[1], "softmax_scale": p.softmax_scale,
            "sink_values": p.values.seed if p.sink else None, "sink_dtype": p.sink_dtype if p.sink else None,
            "seqlen": (p.seqlen_q, p.seqlen_k),
            "batch": p.batch, "nheads": p.nheads, "layout_strided": c.layout == "strided",
            "layout_transposed": c.layout == "transposed", "deterministic": c.deterministic,
            "aux_scalars": p.mod_seed if SCALAR_PAIR in p.mods else None,
            "mod_defaults": p.mod_seed if DEFAULTS_PAIR in p.mods else None,
            "block_broadcast": c.layout == BLOCK_LAYOUT}


def run_sequences(target: Any, *, arch: str = "sm90", examples: int = 10, steps: int = 6, seed: int = 0,
                  key_pool: int = 2, cases_dir: Optional[os.PathLike] = None, target_spec: Optional[dict] = None,
                  replay_fresh: bool = True, time_limit_s: Optional[float] = None,
                  first: int = 0) -> SequenceResult:
    """Run the machine (Note [Call sequences]) ``examples`` times with up to ``steps`` calls each.
    A failure is shrunk, written to ``cases_dir`` (when given) and, with ``replay_fresh``,
    classified by replaying in fresh processes (:func:`classify`; needs ``target_spec``).

    ``first``: the examples before it are drawn but not run (Note [One sequence per case]), so
    ``first=i, examples=1`` runs exactly example ``i`` of the seed's draw."""
    from hypothesis import HealthCheck, Verbosity, settings
    from hypothesis import seed as hseed
    from hypothesis import strategies as st
    from hypothesis.stateful import (RuleBasedStateMachine, initialize, precondition, rule,
                                     run_state_machine_as_test)

    from fa4verify.fuzz.violation import Violation
    kind = (target_spec or {}).get("kind", "production" if isinstance(target, ProductionTarget) else "twin")
    base_st, call_st = _call_strategy(arch, kind, key_pool)
    res = SequenceResult(target=target.describe(), arch=arch)
    state: dict[str, Any] = {"failing": [], "violation": None, "t0": time.monotonic(), "shrinking": False,
                             "example": -1}

    class CallSequence(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            state["example"] += 1
            self.dry = state["example"] < first     # drawn only (Note [One sequence per case])
            if not self.dry:
                target.reset()
            self.calls: list[Call] = []
            self.seen: dict[tuple, dict[str, Any]] = {}

        @initialize(base=base_st)
        def start(self, base):
            self.base = base

        @rule(v=call_st)
        def call(self, v):
            self._judge(_build(arch, self.base, v))

        @precondition(lambda self: bool(self.calls))
        @rule(which=st.sampled_from(NEIGHBOUR_PRODUCTION if kind == "production" else NEIGHBOUR), v=call_st)
        def neighbour(self, which, v):
            self._judge(_neighbour(self.calls[-1], which, v))

        def _judge(self, c: Call) -> None:
            if (time_limit_s is not None and not state["shrinking"]
                    and time.monotonic() - state["t0"] > time_limit_s):
                return
            self.calls.append(c)
            if self.dry:
                return
            counting = not state["shrinking"]
            if counting and len(self.calls) == 1:      # a sequence is an example with at least one call
                res.examples += 1
            try:
                _judge_counted(target, c, self.calls, self.seen, res if counting else None)
            except Violation as v_:
                if state["violation"] is None:     # the first failure: its sequence is the finding
                    state["violation"], state["failing"] = v_, list(self.calls)
                state["shrinking"] = True
                raise

    from hypothesis import Phase
    st_kw = dict(max_examples=int(first) + int(examples), stateful_step_count=int(steps), deadline=None, database=None,
                 verbosity=Verbosity.quiet, suppress_health_check=list(HealthCheck), derandomize=False,
                 phases=[Phase.explicit, Phase.generate])
    # the seed goes on the machine class: run_state_machine_as_test reads it from the factory it is
    # given (hypothesis/stateful.py, get_state_machine_test); on a wrapper it was ignored and every
    # run drew from Hypothesis's global random (a draw that differed between runs and processes)
    seeded = hseed(int(seed))(CallSequence)
    test = lambda: run_state_machine_as_test(seeded, settings=settings(**st_kw))  # noqa: E731
    t0 = time.monotonic()
    from fa4verify.fuzz.campaign import _fixed_constant_pool
    try:
        with _fixed_constant_pool():
            test()
    except Exception as e:  # noqa: BLE001 - a Violation, or Hypothesis's Flaky around one
        # Hypothesis replays a failing example once more to report it; a failure that does not
        # recur on that replay (a race, a cache state) comes back as its Flaky error: the first
        # failing sequence is still the finding
        if state["violation"] is None:
            raise
        if not isinstance(e, Violation):
            state["flaky"] = f"{type(e).__name__}: the failure did not recur on Hypothesis's replay"
        _finding(res, target, state["failing"], state["violation"], arch=arch, cases_dir=cases_dir,
                 target_spec=target_spec or {"kind": kind}, classify_fresh=replay_fresh and target_spec is not None)
        if state.get("flaky"):
            res.failure["flaky"] = state["flaky"]
    res.seconds = time.monotonic() - t0
    res.target = target.describe()
    return res


def _judge_counted(target: Any, c: Call, calls: list[Call], seen: dict[tuple, dict[str, Any]],
                   res: Optional[SequenceResult]) -> None:
    """Judge ``c``, the last of ``calls`` (the sequence so far), and count it in ``res`` (None:
    not counted, a shrink's replay): judged, unsupported, fa4verify errors, undecided, known
    issues, and the attributes a key-sharing call varied (``seen``: the first attributes of each
    key configuration). A violation is raised."""
    if res is not None:
        res.calls += 1
    try:
        out = judge_call(target, c, res.known if res is not None else None)
    except Unsupported as e:
        # kept in the sequence: its forward may have compiled a kernel before the refusal
        if res is not None:
            k = str(e).split(":")[0][:120]
            res.unsupported[k] = res.unsupported.get(k, 0) + 1
        return
    except HarnessError as e:
        if res is not None:
            res.errors[str(e)[:120]] = res.errors.get(str(e)[:120], 0) + 1
        return
    if res is None:
        return
    res.judged += 1
    for u in out.undecided:
        res.undecided[u] = res.undecided.get(u, 0) + 1
    kc, now = c.key_config(), _attrs(c)
    before = seen.get(kc)
    if before is not None:
        for n, val in now.items():
            if before.get(n) != val:
                res.exercised[n] = res.exercised.get(n, 0) + 1
    else:
        seen[kc] = now
    # causal / softcap / sink share a kernel only through a collision: count the calls that
    # followed a call of the same sequence with another value of them
    lay = {"layout_broadcast": "broadcast", "block_broadcast": BLOCK_LAYOUT}
    for n, val in (("causal", c.problem.causal), ("softcap", c.problem.softcap),
                   ("sink", c.problem.sink), ("layout_broadcast", c.layout == "broadcast"),
                   ("block_broadcast", c.layout == BLOCK_LAYOUT)):
        prev = [getattr(x.problem, n, None) if n not in lay else x.layout == lay[n] for x in calls[:-1]]
        if prev and any(pv != val for pv in prev):
            res.exercised[n] = res.exercised.get(n, 0) + 1


def _finding(res: SequenceResult, target: Any, drawn: list[Call], v: Any, *, arch: str,
             cases_dir: Optional[os.PathLike], target_spec: Mapping[str, Any], classify_fresh: bool) -> None:
    """``res.failure`` from the failing sequence ``drawn``: shrunk, written to ``cases_dir``,
    and (``classify_fresh``) replayed in fresh processes."""
    seq, v = shrink(drawn, target, v)
    res.failure = {"property": v.prop, "message": v.message, "calls": [c.to_dict() for c in seq],
                   "describe": [c.describe() for c in seq], "length": len(seq), "drawn_length": len(drawn)}
    if cases_dir is not None:
        try:
            res.failure["case_file"] = str(write_case(cases_dir, seq, target_spec, v, arch=arch))
        except OSError as e:
            res.failure["case_error"] = f"{type(e).__name__}: {e}"
    if classify_fresh:
        res.failure.update(classify(seq, target_spec, arch=arch))


# Note [Constructed sequence]
# ---------------------------
# The machine's draws vary what they happen to draw: three default sequences may never reuse a
# kernel with another value of some attribute FA4's key leaves out. ``constructed_calls`` decides
# it by construction: one base call (a window, a scale, hd 64), then, for every attribute the
# installed key leaves out, that call with only this attribute changed -- each a second call of
# the base's key, so each runs the kernel the base compiled (the sink's values on the base with a
# sink, the aux scalars on the base with the ``scalar_bias`` pair: keys of their own, compiled by
# the call before). The sink's presence, in 4.0.0b36's forward key but not its backward's, is
# varied on the base itself: the second call reuses the backward kernel. The attributes FA4's key
# holds only through its hash of a callable (softcap's closure, a default-captured constant:
# :data:`BY_CALLABLE`) are varied whether or not the installed hash reads them: what the hash
# covers is read from ``utils.py`` by its text (:func:`fa4verify.sequences.key.callable_hash_covers`),
# and an edit that keeps the text but drops the value would pass that reading; the pair of calls
# decides it. ``sequences.production`` runs it as one more case; a test fails when the installed
# key leaves out an attribute this sequence does not vary.
#: the neighbour (:func:`_neighbour`, or ``layout:<name>``) that changes each call attribute alone
VARY: dict[str, str] = {
    "gqa_ratio": "gqa", "window_left": "window", "window_right": "window", "softmax_scale": "softmax_scale",
    "sink_values": "values", "seqlen": "seqlen", "batch": "batch", "nheads": "nheads",
    "layout_strided": "layout:strided", "layout_transposed": "layout:transposed",
    "layout_broadcast": "layout:broadcast", "aux_scalars": "aux_scalars", "mod_defaults": "mod_defaults",
    "causal": "causal",
    "softcap": "softcap", "sink": "sink", "sink_dtype": "sink_dtype", "deterministic": "deterministic",
    "block_broadcast": "block_lists"}


def _by_callable() -> tuple[str, ...]:
    from fa4verify.sequences.key import ATTRIBUTES
    return tuple(a.name for a in ATTRIBUTES if a.via_callable is not None)


#: attributes FA4's key holds only through its callable hash: always in the constructed sequence
BY_CALLABLE = _by_callable()


def constructed_calls(arch: str, dtype: str = "bf16", attributes: Optional[Collection[str]] = None) -> list[Call]:
    """Note [Constructed sequence]: the base call, then one call per attribute (default: every
    attribute the installed FA4's key leaves out, :func:`fa4verify.sequences.key.left_out`, and
    every one of :data:`BY_CALLABLE`) that changes it alone. An attribute it cannot vary raises ValueError when named in ``attributes``;
    read from the installed key it is left out of the sequence (the check's summary names every
    left-out attribute no call varied)."""
    from fa4verify.sequences.key import left_out
    if attributes is None:
        attrs = sorted({a for a in left_out() if a in VARY} | set(BY_CALLABLE))
    else:
        attrs = sorted(attributes)
        missing = [a for a in attrs if a not in VARY]
        if missing:
            raise ValueError(f"no constructed neighbour varies {missing}")
    base = Call(AttentionProblem(arch=arch, dtype=dtype, batch=1, seqlen_q=97, seqlen_k=128, nheads=2, nheads_kv=2,
                                 head_dim=64, head_dim_v=64, window_size=(40, 8), softmax_scale=0.125,
                                 values=ValueSpec("normal", 11)), "contiguous", True)
    v = {"window_shift": 7, "scale": 0.25, "seqlen_q": 64, "seqlen_k": 256, "layout": "strided", "seed": 12,
         "mod_seed": 5, "softcap": 30.0}
    # a base of its own for what needs a key of its own: the sink's values and dtype (an fp32 sink
    # call compiles, the next varies the values or the dtype), the aux scalars and the default-captured constant (the
    # pair's first call compiles), softcap (a softcap compiles its score_mod, the next changes the constant) and causal (without a
    # window: FA4 turns causal with a window into a local mask)
    own = {"values": base.problem.replace(sink=True), "sink_dtype": base.problem.replace(sink=True),
           "aux_scalars": base.problem.replace(mods=(SCALAR_PAIR,), mod_seed=3),
           "mod_defaults": base.problem.replace(mods=(DEFAULTS_PAIR,), mod_seed=3),
           "softcap": base.problem.replace(softcap=5.0),
           "causal": base.problem.replace(window_size=(None, None))}
    calls = [base]
    done: set[str] = set()
    for a in attrs:
        which = VARY[a]
        if which in done:           # window_left and window_right: one call changes the window
            continue
        done.add(which)
        if which == "block_lists":      # Note [Shared block lists]: shared, then per batch entry and head
            calls += _block_list_calls(arch, dtype)
            continue
        b = base
        if which in own:
            b = Call(own[which], base.layout, True)
            calls.append(b)
        if which.startswith("layout:"):
            calls.append(Call(b.problem, which.partition(":")[2], b.deterministic))
        else:
            calls.append(_neighbour(b, which, v))
    return calls


def _block_list_calls(arch: str, dtype: str) -> list[Call]:
    """Note [Shared block lists]: an MHA block-sparse call with one set of block lists passed
    shared (batch and head extent 1), then the same call with lists drawn per batch entry and
    head, every entry's other than entry (0, 0)'s (the block seed is the first that makes them
    so). Not deterministic: FA4's SM90 block-sparse backward has no deterministic mode."""
    from fa4verify.coverage.cases import sparse_block_size
    from fa4verify.problem.calls import CallForm
    bq, bk = sparse_block_size(arch, 64, 64)
    p = AttentionProblem(arch=arch, dtype=dtype, batch=2, seqlen_q=2 * bq, seqlen_k=3 * bk, nheads=2, nheads_kv=2,
                         head_dim=64, head_dim_v=64, values=ValueSpec("normal", 11))
    for seed in range(1, 1000):
        per = CallForm(block_size=(bq, bk), block_seed=seed, block_keep=0.5, block_per_head=True, block_per_batch=True)
        grids = [per.block_mask(p.seqlen_q, p.seqlen_k, seq=b, head=h) for b in range(2) for h in range(2)]
        if all((g != grids[0]).any() for g in grids[1:]):
            break
    shared = p.replace(call=CallForm(block_size=(bq, bk), block_seed=seed, block_keep=0.5))
    return [Call(shared, BLOCK_LAYOUT, False), Call(p.replace(call=per), "contiguous", False)]


def run_calls(target: Any, calls: list[Call], *, arch: str = "sm90", cases_dir: Optional[os.PathLike] = None,
              target_spec: Optional[dict] = None, replay_fresh: bool = True) -> SequenceResult:
    """Judge ``calls`` in order in one process (from empty in-process compile caches), counted as
    one sequence; the first violation is the finding, shrunk, written and classified as in
    :func:`run_sequences`."""
    from fa4verify.fuzz.violation import Violation
    res = SequenceResult(target=target.describe(), arch=arch, examples=1)
    t0 = time.monotonic()
    target.reset()
    seen: dict[tuple, dict[str, Any]] = {}
    for i, c in enumerate(calls):
        try:
            _judge_counted(target, c, calls[:i + 1], seen, res)
        except Violation as v:
            _finding(res, target, calls[:i + 1], v, arch=arch, cases_dir=cases_dir,
                     target_spec=target_spec or {"kind": getattr(target, "name", "twin")},
                     classify_fresh=replay_fresh and target_spec is not None)
            break
    res.seconds = time.monotonic() - t0
    res.target = target.describe()
    return res


def shrink(calls: list[Call], target: Any, violation: Any) -> tuple[list[Call], Any]:
    """The shortest sub-sequence of ``calls`` (order kept, the failing last call kept) that still
    fails on ``target`` from empty caches: calls are removed one at a time, first to last, while
    the rest still fails (1-minimal: no single call can be removed). Returns (calls, violation of
    the shortest)."""
    from fa4verify.fuzz.violation import Violation
    seq = list(calls)

    def fails(cand: list[Call]) -> Optional[Any]:
        """The violation of the sequence's last call (earlier calls refused or passing)."""
        target.reset()
        for i, c in enumerate(cand):
            try:
                judge_call(target, c)
            except Violation as v:
                return v if i == len(cand) - 1 else None
            except (Unsupported, HarnessError):
                continue
        return None

    alone = fails(seq[-1:])
    if alone is not None:
        return seq[-1:], alone
    changed = True
    while changed and len(seq) > 2:
        changed = False
        for i in range(len(seq) - 1):
            cand = seq[:i] + seq[i + 1:]
            v = fails(cand)
            if v is not None:
                seq, violation, changed = cand, v, True
                break
    return seq, violation


# ============================================================================ cases and replay
def write_case(cases_dir: os.PathLike, calls: list[Call], target_spec: Mapping[str, Any], v: Any, *,
               arch: str) -> Path:
    """A replayable case: ``python -m fa4verify.sequences replay CASE`` runs it."""
    import hashlib
    d = Path(cases_dir)
    d.mkdir(parents=True, exist_ok=True)
    body = {"format": CASE_FORMAT, "arch": arch, "target": dict(target_spec),
            "calls": [c.to_dict() for c in calls], "property": getattr(v, "prop", None),
            "message": getattr(v, "message", str(v))}
    name = hashlib.sha256(json.dumps(body["calls"], sort_keys=True).encode()).hexdigest()[:12]
    path = d / f"sequence-{name}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body, indent=1, sort_keys=True))
    os.replace(tmp, path)
    return path


def replay(calls: list[Call], target: Any) -> dict[str, Any]:
    """Run ``calls`` in order on ``target`` (empty caches first): ``{"status": "pass" | "fail" |
    "unsupported" | "error", "at": index of the failing call, "message", "refused": [indices]}``.
    A refused call (unsupported, or fa4verify's error) does not end the replay: its forward may
    have compiled a kernel; the last call decides "unsupported" / "error" when it is refused."""
    from fa4verify.fuzz.violation import Violation
    target.reset()
    refused: list[int] = []
    last: dict[str, Any] = {"status": "pass", "at": None, "message": ""}
    for i, c in enumerate(calls):
        try:
            judge_call(target, c)
            last = {"status": "pass", "at": None, "message": ""}
        except Violation as v:
            return {"status": "fail", "at": i, "property": v.prop, "message": v.message[:400], "refused": refused}
        except Unsupported as e:
            refused.append(i)
            last = {"status": "unsupported", "at": i, "message": str(e)[:400]}
        except HarnessError as e:
            refused.append(i)
            last = {"status": "error", "at": i, "message": str(e)[:400]}
    return dict(last, refused=refused)


def _replay_fresh(calls: list[Call], target_spec: Mapping[str, Any], *, arch: str,
                  keep_cache: bool = False) -> dict[str, Any]:
    """:func:`replay` in a fresh ``python -m fa4verify.sequences.machine`` (FA4's persistent
    kernel cache off, so no kernel of this process reaches it; ``keep_cache``: on, as in this
    process, reading what this run stored)."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    if not keep_cache:
        env["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] = "0"
    args = {"target": dict(target_spec), "arch": arch, "calls": [c.to_dict() for c in calls]}
    try:
        cp = subprocess.run([sys.executable, "-m", "fa4verify.sequences", "replay-stdin"],
                            input=json.dumps(args), env=env, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as e:
        return {"status": "error", "message": f"fresh process: {type(e).__name__}: {e}"}
    lines = (cp.stdout or "").strip().splitlines()
    if cp.returncode not in (0, 1) or not lines:
        tail = (cp.stderr or "").strip().splitlines()[-1:] or ["(no stderr)"]
        return {"status": "error", "message": f"fresh process exit {cp.returncode}: {tail[0][:300]}"}
    return json.loads(lines[-1])


def classify(calls: list[Call], target_spec: Mapping[str, Any], *, arch: str) -> dict[str, Any]:
    """Replay the shrunk sequence, then its last call alone, each in a fresh process:
    ``{"kind": "sequence bug" | "plain bug" | "persistent-cache bug" | "not reproduced" |
    "undecided", "replay_sequence", "replay_last_alone"[, "replay_with_cache"]}``. A sequence bug
    fails in sequence and passes alone.

    Note [Persistent-cache bug]: with FA4's persistent kernel cache on (every audit), a call can
    load a kernel that an earlier call -- of another sequence of the same worker, or another
    process -- stored under an equal compile key: its shrunk sequence then fails in the run and
    passes in fresh processes with the cache off (on the H200, both planted compile-key faults).
    Where both pass and this process has the cache on, the last call is replayed alone once more
    in a fresh process reading the same cache: a failure there is a **persistent-cache bug** (the
    cache holds a kernel the call's key does not tell apart), a bug FA4's users meet across
    processes."""
    whole = _replay_fresh(calls, target_spec, arch=arch)
    alone = _replay_fresh(calls[-1:], target_spec, arch=arch)
    out: dict[str, Any] = {"replay_sequence": whole, "replay_last_alone": alone}
    if whole["status"] == "fail" and alone["status"] == "pass":
        kind = "sequence bug"
    elif alone["status"] == "fail":
        kind = "plain bug"
    elif whole["status"] == "pass":
        kind = "not reproduced"
        if os.environ.get("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED") == "1":
            cached = _replay_fresh(calls[-1:], target_spec, arch=arch, keep_cache=True)
            out["replay_with_cache"] = cached
            if cached["status"] == "fail":
                kind = "persistent-cache bug"
    else:
        kind = "undecided"
    return {"kind": kind, **out}


def _run_main(argv: list[str]) -> int:
    """``run``: the machine on a target, the result as JSON (stdout, or ``--json PATH``); exit 1
    when a call sequence failed, 2 on bad arguments."""
    import argparse
    ap = argparse.ArgumentParser(prog="python -m fa4verify.sequences run")
    ap.add_argument("--target", choices=("production", "twin"), default="production")
    ap.add_argument("--drop", action="append", default=[],
                    help="plant a compile-key fault: a key field removed (production: the source text of "
                         "an FA4 compile_key element, e.g. causal, score_mod_hash; twin: causal, softcap, block_broadcast)")
    ap.add_argument("--examples", type=int, default=10)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arch", default=None, help="default: the local GPU's (production), sm90 (twin)")
    ap.add_argument("--cases-dir", default=None)
    ap.add_argument("--json", default=None)
    try:
        a = ap.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    if a.examples < 1 or a.steps < 1:
        print("fa4verify sequences: --examples and --steps must be >= 1", file=sys.stderr)
        return 2
    spec = {"kind": a.target, "drop": list(a.drop)}
    try:
        tgt = make_target(spec)
    except (ValueError, RuntimeError) as e:
        print(f"fa4verify sequences: {e}", file=sys.stderr)
        return 2
    arch = a.arch or getattr(tgt, "arch", None) or "sm90"
    res = run_sequences(tgt, arch=arch, examples=a.examples, steps=a.steps, seed=a.seed, cases_dir=a.cases_dir,
                        target_spec=spec)
    text = json.dumps(res.to_json(), indent=1, default=str)
    if a.json:
        Path(a.json).write_text(text)
    else:
        print(text)
    f = res.failure
    print(f"sequences: {res.examples} sequences, {res.calls} calls, {res.judged} judged, "
          f"unsupported {sum(res.unsupported.values())}, fa4verify errors {sum(res.errors.values())}; "
          + ("no violation" if f is None else
             f"FAIL {f['property']} after {f['length']} call(s) ({f.get('kind', 'not classified')}): "
             + " -> ".join(f["describe"])), file=sys.stderr)
    return 1 if f is not None else 0


def _main(argv: list[str]) -> int:
    """``run ...`` (:func:`_run_main`), ``replay CASE.json`` (prints the replay's JSON; exit 1 when
    a call fails) or ``replay-stdin`` (the arguments of :func:`_replay_fresh` on stdin)."""
    if argv[:1] == ["run"]:
        return _run_main(argv[1:])
    if argv[:1] == ["replay-stdin"]:
        args = json.loads(sys.stdin.read())
    elif argv[:1] == ["replay"] and len(argv) == 2:
        try:
            args = json.loads(Path(argv[1]).read_text())
        except (OSError, json.JSONDecodeError) as e:
            print(f"fa4verify sequences: cannot read {argv[1]}: {e}", file=sys.stderr)
            return 2
        if args.get("format") != CASE_FORMAT:
            print(f"fa4verify sequences: {argv[1]} is not a {CASE_FORMAT} case", file=sys.stderr)
            return 2
    else:
        print("usage: python -m fa4verify.sequences run [--target production|twin] [--drop FIELD] ... | "
              "replay CASE.json", file=sys.stderr)
        return 2
    calls = [Call.from_dict(c) for c in args["calls"]]
    out = replay(calls, make_target(args["target"]))
    print(json.dumps(out))
    return 1 if out["status"] == "fail" else 0
