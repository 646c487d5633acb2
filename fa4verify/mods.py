"""The registry of score_mod / mask_mod pairs: fa4verify's library
(:func:`fa4verify.kernels.mods.library`) plus users' own pairs, so a user's mod is audited,
fuzzed and gated like a built-in.

>>> import numpy as np
>>> from fa4verify import mods
>>> from fa4verify.kernels.mods import ModPair
>>> p = ModPair("my_bias", "score", lambda x, b, h, qi, ki, a: x + 0.25,
...             grad=lambda x, *r: np.ones_like(x),
...             err=lambda x, y, *r: 2.0 ** -24 * (np.abs(x) + 0.25))
>>> mods.register_mod_pair(p) is p
True
>>> "my_bias" in mods.names()
True
>>> mods.unregister("my_bias")

A problem names its pairs (``AttentionProblem(mods=("alibi",))``); the judge's oracle applies
each pair's float64 reference (``fa4verify.oracles.mods``) and the budgets add the pair's
``err`` term (error_budgets/DERIVATIONS.md#score-mod). :func:`validate` is what registration
checks: a malformed pair is refused with a one-line :class:`ModPairError`.
"""
from __future__ import annotations

import re
import sys
from typing import Iterable, Optional

import numpy as np

from fa4verify.kernels.mods import AuxValues, ModPair, ModShape, library
from fa4verify.errors import ModPairError

__all__ = ["ModPair", "ModShape", "register_mod_pair", "unregister", "get", "names", "is_builtin",
           "validate", "resolve", "aux_for", "user_pair_modules"]

_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")      # fullmatch: "$" would let a trailing newline in
_REGISTRY: dict[str, ModPair] = {}
_BUILTIN: set[str] = set()
#: user pair name -> (module name, file) of the module that registered it: Note [Pairs in a fresh
#: process]
_ORIGIN: dict[str, tuple[str, str]] = {}


def _probe_shape() -> ModShape:
    return ModShape(batch=2, nheads=2, seqlen_q=8, seqlen_k=8)


#: Note [Mod pairs on every class]: the shape a pair is swept on after the small probe: every head
#: index up to 128 and every (query, key) position up to 260 -- past FA4's tile edges 64, 128 and
#: 256 -- in both batch entries. A mask that differs only for heads >= 2, or past a tile edge, is
#: caught here, not after the gate judged a kernel against it.
SWEEP_SHAPE = ModShape(batch=2, nheads=128, seqlen_q=260, seqlen_k=260)
#: a declared ``err`` larger than this share of max(|y|, |x|, 1) at a random point is no fp32
#: evaluation error (FA4's worst, tanh.approx in softcap, is 2^-11 relative): such an err would
#: let the gate pass a wrong output -- a negated one at 2 |y| -- and is refused
ERR_SHARE_MAX = 2.0 ** -6
#: random points the err is checked at, over all heads and positions of SWEEP_SHAPE
ERR_POINTS = 4096


def _sweep(pair: ModPair) -> None:
    """Note [Mod pairs on every class]: the mask's head independence on every head and position
    of :data:`SWEEP_SHAPE`; a score pair's ``ref`` finite there and its ``err`` checked against the
    float64 reference at random points (at most :data:`ERR_SHARE_MAX` of the value's scale)."""
    n, sh = pair.name, SWEEP_SHAPE
    try:
        aux = pair.make_aux(sh, seed=1)
    except Exception as e:  # noqa: BLE001
        raise ModPairError(f"mod pair {n!r}: aux factory failed on {sh}: {type(e).__name__}: {e}") from None
    qi = np.arange(sh.seqlen_q)[:, None]
    ki = np.arange(sh.seqlen_k)[None, :]
    full = (sh.seqlen_q, sh.seqlen_k)
    try:
        if pair.kind == "mask":
            if pair.by_head:
                return
            for b in range(sh.batch):
                k0 = np.broadcast_to(np.asarray(pair.ref(b, 0, qi, ki, aux)), full)
                for h in range(1, sh.nheads):
                    kh = np.broadcast_to(np.asarray(pair.ref(b, h, qi, ki, aux)), full)
                    if not np.array_equal(k0, kh):
                        q, k = map(int, np.argwhere(k0 != kh)[0])
                        raise ModPairError(f"mod pair {n!r}: the mask depends on the head (batch {b}: head {h} "
                                           f"differs from head 0 at query {q}, key {k}); declare it by_head=True")
            return
        rng = np.random.default_rng(0)
        per = max(1, ERR_POINTS // (sh.batch * 8))
        worst = (0.0, None)
        for b in range(sh.batch):
            for h in sorted({0, 1, sh.nheads - 1, *rng.integers(0, sh.nheads, 5).tolist()}):
                x = rng.uniform(-20.0, 20.0, full)
                y = np.broadcast_to(np.asarray(pair.ref(x.copy(), b, h, qi, ki, aux), dtype=np.float64), full)
                if not np.isfinite(y).all():
                    q, k = map(int, np.argwhere(~np.isfinite(y))[0])
                    raise ModPairError(f"mod pair {n!r}: ref is not finite at batch {b}, head {h}, query {q}, "
                                       f"key {k} (score {x[q, k]:.4g})")
                e = np.broadcast_to(np.asarray(pair.err(x.copy(), y, b, h, qi, ki, aux), dtype=np.float64), full)
                pick = rng.integers(0, x.size, per)
                ex, ey, ee = x.flat[pick], y.flat[pick], e.flat[pick]
                if not np.isfinite(ee).all() or (ee < 0).any():
                    raise ModPairError(f"mod pair {n!r}: err must be finite and >= 0 at every head and position")
                share = ee / np.maximum(np.maximum(np.abs(ey), np.abs(ex)), 1.0)
                i = int(np.argmax(share))
                if share[i] > worst[0]:
                    worst = (float(share[i]), (b, h, float(ex[i]), float(ey[i]), float(ee[i])))
    except ModPairError:
        raise
    except Exception as e:  # noqa: BLE001
        raise ModPairError(f"mod pair {n!r}: reference failed on {sh}: {type(e).__name__}: {e}") from None
    if worst[0] > ERR_SHARE_MAX:
        b, h, x0, y0, e0 = worst[1]
        raise ModPairError(f"mod pair {n!r}: err {e0:.4g} at score {x0:.4g} (ref {y0:.4g}, batch {b}, head {h}) is "
                           f"{worst[0]:.3g} of max(|y|, |x|, 1), more than {ERR_SHARE_MAX:g}: no fp32 evaluation "
                           "error; the gate would pass a wrong (e.g. negated) output")


def validate(pair: ModPair, *, sweep: bool = True) -> ModPair:
    """Check ``pair`` on a small problem: name, kind, callables, the reference's shape and dtype,
    finiteness, head independence of masks not declared ``by_head``, and for score pairs
    ``grad`` and ``err`` (finite, ``err >= 0``) and a finite ``lipschitz`` >= 0; then on every
    head and position class (Note [Mod pairs on every class]: masks not declared ``by_head``
    head-independent everywhere, a score pair's ``err``
    checked against the float64 reference at random points). Raises :class:`ModPairError`."""
    if not isinstance(pair, ModPair):
        raise ModPairError(f"expected a fa4verify.kernels.mods.ModPair, got {type(pair).__name__}")
    n = pair.name
    if not isinstance(n, str) or not _NAME.fullmatch(n):
        raise ModPairError(f"mod pair name {ascii(n) if isinstance(n, str) else repr(n)} must match "
                           "[a-z][a-z0-9_]* (at most 64 characters)")
    if pair.kind not in ("score", "mask"):
        raise ModPairError(f"mod pair {n!r}: kind must be 'score' or 'mask', got {pair.kind!r}")
    if not callable(pair.ref):
        raise ModPairError(f"mod pair {n!r}: ref must be callable")
    if pair.build is not None and not callable(pair.build):
        raise ModPairError(f"mod pair {n!r}: build must be callable or None")
    if pair.kind == "score":
        for f in ("grad", "err"):
            if not callable(getattr(pair, f)):
                raise ModPairError(f"mod pair {n!r}: a score pair needs a callable {f} "
                                   f"({'dy/dx for the backward' if f == 'grad' else 'its fp32 evaluation error bound'})")
        for f in ("lipschitz", "curvature"):
            val = getattr(pair, f)
            if not (isinstance(val, (int, float)) and np.isfinite(val) and val >= 0):
                raise ModPairError(f"mod pair {n!r}: {f} must be a finite number >= 0, got {val!r}")
    elif pair.grad is not None or pair.err is not None:
        raise ModPairError(f"mod pair {n!r}: a mask pair has no grad/err (its keep set is exact)")
    sh = _probe_shape()
    try:
        aux = pair.make_aux(sh, seed=0)
    except Exception as e:  # noqa: BLE001 - the user's factory failing is the message
        raise ModPairError(f"mod pair {n!r}: aux factory failed on {sh}: {type(e).__name__}: {e}") from None
    if not all(np.isfinite(aux.scalars)):
        raise ModPairError(f"mod pair {n!r}: its aux scalars must be finite fp32 values, got {aux.scalars}")
    qi = np.arange(sh.seqlen_q)[:, None]
    ki = np.arange(sh.seqlen_k)[None, :]
    x = np.linspace(-3.0, 3.0, sh.seqlen_q * sh.seqlen_k).reshape(sh.seqlen_q, sh.seqlen_k)
    try:
        if pair.kind == "score":
            y = np.asarray(pair.ref(x.copy(), 0, 1, qi, ki, aux))
            g = np.asarray(pair.grad(x.copy(), 0, 1, qi, ki, aux))
            e = np.asarray(pair.err(x.copy(), np.broadcast_to(y, x.shape), 0, 1, qi, ki, aux))
            outs = {"ref": y, "grad": g, "err": e}
        else:
            k0 = np.asarray(pair.ref(0, 0, qi, ki, aux))
            k1 = np.asarray(pair.ref(0, 1, qi, ki, aux))
            outs = {"ref": k0}
    except Exception as e:  # noqa: BLE001
        raise ModPairError(f"mod pair {n!r}: reference failed on {sh}: {type(e).__name__}: {e}") from None
    for what, arr in outs.items():
        try:
            arr = np.broadcast_to(arr, x.shape)
        except ValueError:
            raise ModPairError(f"mod pair {n!r}: {what} returned shape {np.shape(arr)}, not broadcastable "
                               f"to the (q, kv) block {x.shape}") from None
        if pair.kind == "mask":
            if arr.dtype != bool:
                raise ModPairError(f"mod pair {n!r}: a mask ref must return booleans, got {arr.dtype}")
        elif not np.issubdtype(arr.dtype, np.floating) or not np.isfinite(arr).all():
            raise ModPairError(f"mod pair {n!r}: {what} must return finite floats on finite scores")
    if pair.kind == "score" and (np.asarray(outs["err"]) < 0).any():
        raise ModPairError(f"mod pair {n!r}: err must be >= 0")
    if pair.kind == "mask" and not pair.by_head \
            and not np.array_equal(np.broadcast_to(k0, x.shape), np.broadcast_to(k1, x.shape)):
        raise ModPairError(f"mod pair {n!r}: the mask depends on the head; declare it by_head=True")
    if pair.kind == "score" and pair.by_head:
        raise ModPairError(f"mod pair {n!r}: by_head is a mask pair's declaration (a score pair gets the head)")
    if pair.kind == "score" and "softcap" in (pair.equivalent or {}):
        _check_softcap_claim(pair, qi, ki, aux)
    if sweep:
        _sweep(pair)
    return pair


def _check_softcap_claim(pair: ModPair, qi, ki, aux) -> None:
    """A score pair's ``equivalent = {"softcap": c}`` is a claim about its reference: ``y =
    c tanh(x / c)`` and ``dy/dx = sech^2(x / c)``; checked here over 9 decades of ``|x| / c`` on
    both signs (the GPU script compares the kernels)."""
    c = pair.equivalent["softcap"]
    if not (isinstance(c, (int, float)) and np.isfinite(c) and c > 0):
        raise ModPairError(f"mod pair {pair.name!r}: equivalent softcap must be a finite number > 0, got {c!r}")
    c = float(c)
    t = np.concatenate([-np.logspace(-4, 5, 200)[::-1], [0.0], np.logspace(-4, 5, 200)])
    x = np.broadcast_to((c * t)[:, None], (t.size, ki.shape[1])).copy()
    q = np.zeros((t.size, 1), dtype=qi.dtype)
    try:
        y = np.broadcast_to(np.asarray(pair.ref(x.copy(), 0, 0, q, ki, aux), np.float64), x.shape)
        g = np.broadcast_to(np.asarray(pair.grad(x.copy(), 0, 0, q, ki, aux), np.float64), x.shape)
    except Exception as e:  # noqa: BLE001
        raise ModPairError(f"mod pair {pair.name!r}: reference failed on the softcap claim's sweep: "
                           f"{type(e).__name__}: {e}") from None
    e2 = np.exp(-2.0 * np.abs(x / c))
    if not (np.allclose(y, c * np.tanh(x / c), rtol=1e-12, atol=0.0)
            and np.allclose(g, 4.0 * e2 / (1.0 + e2) ** 2, rtol=1e-9, atol=1e-300)):
        raise ModPairError(f"mod pair {pair.name!r}: equivalent={{'softcap': {c:g}}} claims y = {c:g} tanh(x / {c:g}) "
                           "and its derivative, but the reference differs")


def register_mod_pair(pair: ModPair, *, replace: bool = False) -> ModPair:
    """Validate and register ``pair`` under ``pair.name``; returns it. A built-in name, or a
    taken name without ``replace=True``, is refused (:class:`ModPairError`). The calling module
    is recorded (Note [Pairs in a fresh process])."""
    validate(pair)
    if pair.name in _BUILTIN:
        raise ModPairError(f"mod pair name {pair.name!r} is a fa4verify built-in; choose another name")
    if pair.name in _REGISTRY and not replace:
        raise ModPairError(f"mod pair {pair.name!r} is already registered (replace=True to overwrite)")
    _REGISTRY[pair.name] = pair
    caller = sys._getframe(1).f_globals
    _ORIGIN[pair.name] = (str(caller.get("__name__") or ""), str(caller.get("__file__") or ""))
    return pair


def unregister(name: str) -> None:
    if name in _BUILTIN:
        raise ModPairError(f"mod pair {name!r} is a built-in and cannot be unregistered")
    _REGISTRY.pop(name, None)
    _ORIGIN.pop(name, None)


def user_pair_modules() -> dict[str, tuple[str, str]]:
    """User pair name -> (module name, file) of the module that registered it.

    Note [Pairs in a fresh process]
    -------------------------------
    The audit draws its fuzz campaigns in a fresh ``python -m fa4verify.fuzz.drawn`` (Note [One
    draw per audit]), which knows only the built-in pairs: a pair registered in the auditing
    process (a ``--checks-module``, a conftest, a script) was never drawn there. The drawer
    imports the modules that registered the user pairs (by name where it imports, else from its
    file as ``--checks-module`` files are loaded) and refuses to draw, naming the pair, when one is still
    missing afterwards (registered outside any importable module, e.g. in ``__main__`` or inside
    a function): a campaign never silently leaves a registered pair out."""
    return {n: _ORIGIN.get(n, ("", "")) for n in names() if n not in _BUILTIN}


def is_builtin(pair: ModPair) -> bool:
    """``pair`` is fa4verify's own registered built-in (users cannot register or replace one)."""
    return pair.name in _BUILTIN and _REGISTRY.get(pair.name) is pair


def get(name: str) -> ModPair:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ModPairError(f"unknown mod pair {name!r} (registered: {', '.join(sorted(_REGISTRY))})") from None


def names() -> list[str]:
    return sorted(_REGISTRY)


def resolve(names_: Iterable[str]) -> tuple[Optional[ModPair], Optional[ModPair]]:
    """``(score pair, mask pair)`` of a problem's ``mods`` (at most one of each)."""
    score = mask = None
    for nm in names_:
        p = get(nm)
        if p.kind == "score":
            if score is not None:
                raise ModPairError(f"two score mods ({score.name}, {nm}): FA4 takes one score_mod")
            score = p
        else:
            if mask is not None:
                raise ModPairError(f"two mask mods ({mask.name}, {nm}): FA4 takes one mask_mod")
            mask = p
    return score, mask


def aux_for(problem, pair: ModPair, arrays=None) -> AuxValues:
    """The aux data of ``pair`` in ``problem``: the arrays ``arrays["mod_aux"][pair.name]`` when
    the caller gives them (real data; an :class:`AuxValues` there brings its own scalars), else
    the pair's factory, and the aux scalars, at the problem's ``mod_seed`` where not given; the
    compile-time constants always at the problem's ``mod_seed`` (they name the CuTe function)."""
    given = (arrays or {}).get("mod_aux") or {}
    if pair.name in given:
        g = given[pair.name]
        seed = int(getattr(problem, "mod_seed", 0))
        scalars = getattr(g, "scalars", None) or pair.make_scalars(seed)
        return AuxValues([np.asarray(x) for x in g], scalars, pair.make_constants(seed), _seqlens(problem))
    return pair.make_aux(ModShape(problem.batch, aux_heads(problem, pair), problem.seqlen_q, problem.seqlen_k),
                         seed=int(getattr(problem, "mod_seed", 0)), seqlens=_seqlens(problem))


def aux_heads(problem, pair: ModPair) -> int:
    """The head count a pair's aux factory is asked for (``ModShape.nheads``).

    Note [Aux for the mapped heads]
    -------------------------------
    FA4 4.0.0b36's SM90 GQA backward hands a score pair head ``h g + r % g`` for row ``r`` of query
    head ``h`` (known issue ``sm90_score_mod_gqa_bwd_indices``), past ``nheads`` for ``h >= nheads /
    g``. With aux sized for ``nheads`` those reads land in unknown memory: the defect's model is NaN
    there and absorbs whatever FA4 returns (red-team round 17: three quarters of a GQA alibi call's
    gradients, half of ``score_head_gqa``'s). A score pair under GQA is therefore built for ``nheads
    g`` heads, every head FA4 may hand it: the forward and the oracle read the first ``nheads``,
    the defective backward defined values the model computes. Mask pairs and MHA keep ``nheads``."""
    g = max(1, problem.nheads // max(1, problem.nheads_kv))
    return problem.nheads * g if pair.kind == "score" and g > 1 else problem.nheads


def _seqlens(problem) -> list[tuple[int, int]]:
    """Per batch entry (varlen: per sequence) the lengths FA4 hands the mods (Note [Lengths the
    mods see] in :mod:`fa4verify.kernels.mods`): the used lengths, whatever the call's layout."""
    return [(lq, lk) for _, lq, _, lk in problem._seq_bounds()]


for _p in library():
    validate(_p, sweep=False)      # the sweep of the built-ins is a test (half a second per import)
    _REGISTRY[_p.name] = _p
    _BUILTIN.add(_p.name)
