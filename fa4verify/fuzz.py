"""Property-based fuzzing of FA4 attention: properties, targets, campaigns, replayable cases.

Every property below runs on an :class:`~fa4verify.strategies.AttentionProblem` against a
*target*: the CPU twin of FA4 (``"twin"``, figures labelled "CPU twin") or production FA4 on a
GPU (``"production"``, "measured on <GPU> (sm_XY)"). The truth is the certified oracle
``fa4verify.oracles.attention`` and the tolerance the composed end-to-end error budget
``fa4verify.error_budgets.load(dtype, arch)``.

Properties (:data:`PROPERTIES`)
-------------------------------
``runs``
    The target returns on every valid problem (a crash, e.g. FA #2562's zero-length varlen
    error, is a failure; an explicit "unsupported" rejection is not).
``fwd_budget``
    ``|O - O*| <= bound(O*) + budget(O)`` and the same for the LSE, elementwise, where ``O*`` is
    the oracle value, ``bound`` its certified error bound and ``budget`` the composed budget.
``bwd_budget``
    The same for dQ, dK, dV (and dsink) against the oracle backward (given the target's own O,
    as FA4's backward uses the rounded O).
``finite``
    No NaN/Inf in O, LSE or the gradients where the oracle's value is finite (and, for outputs
    stored in fp16/bf16, below the format's largest finite value); LSE = -inf is required
    exactly on fully masked rows without a sink (checked by ``masked_rows``).
``masked_rows``
    Fully masked query rows give O = 0 exactly and, without a sink, LSE = -inf; their dQ rows are
    exactly 0, and keys no query can see get dK = dV = 0 exactly.
``key_permutation``
    Non-causal, unmasked, dense problems: permuting the keys (and values) gives an output within
    budget of the *unpermuted* oracle (within budget, not bitwise: FA4's sums change order).
``batch_invariance``
    Running batch entry ``b`` alone gives the same O and LSE as entry ``b`` of the batched call:
    bitwise for the twin, within budget for production.
``gqa_repeat``
    GQA/MQA (``nheads_kv < nheads``) equals MHA with K, V repeated per query head: bitwise on the
    twin's SM90 path (no emulated columns depend on pack_gqa there), within budget otherwise.
``deterministic_bwd``
    Two ``deterministic=True`` backward calls return bitwise-identical dQ, dK, dV.

Note [Fuzz cases are replayable]
--------------------------------
A failing example is shrunk by Hypothesis, and the *final* (shrunk) failure is written as a JSON
case (:data:`CASE_FORMAT`) holding the problem (shapes, flags and a value seed -- the arrays are
regenerated from it), the target, arch, mutations, violated property, message and metrics. Replay
it with ``fa4verify fuzz --replay CASE.json`` or :func:`replay_case`; commit it under
``tests/regressions/`` to keep it as a regression vector (``tests/test_fuzz_regressions.py``
replays every file there). The Hypothesis example database is a disposable cache, never a record.
"""
from __future__ import annotations

import contextvars
import dataclasses
import datetime as _dt
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Collection, Mapping, Optional

import numpy as np
from hypothesis import HealthCheck, Verbosity, settings

from fa4verify import judge
from fa4verify._strategies.problem import FEATURES, AttentionProblem, attention_problems

__all__ = [
    "PROPERTIES", "PROFILES", "CASE_FORMAT", "CAMPAIGN_FORMAT", "Violation", "Unsupported",
    "DependencyMissing", "Target", "TwinTarget", "ProductionTarget", "make_target", "check_problem",
    "CampaignResult", "run_campaign", "write_case", "load_case", "replay_case", "regression_snippet",
    "register_profiles", "DEFAULT_CACHE_DIR", "profile_limits", "profile_name", "KnownIssue", "KNOWN_ISSUES",
    "match_known_issue", "ReplayOutcome", "CheckOutcome", "AttentionProblem", "Fwd", "Bwd",
]

CASE_FORMAT = "fa4verify-fuzz-case/1"
CAMPAIGN_FORMAT = "fa4verify-fuzz-campaign/1"
DEFAULT_CACHE_DIR = Path(".fa4verify-cache")

PROPERTIES: tuple[str, ...] = ("runs", "fwd_budget", "bwd_budget", "finite", "masked_rows", "key_permutation",
                               "batch_invariance", "gqa_repeat", "deterministic_bwd")

#: Largest finite value of the stored output formats.
_FMT_MAX = {"bf16": 3.3895313892515355e38, "fp16": 65504.0}


# ============================================================================ errors
class Violation(AssertionError):
    """A property failed on a problem. ``prop`` names it; ``metrics`` are JSON-able figures."""

    def __init__(self, prop: str, message: str, metrics: Optional[Mapping[str, Any]] = None):
        super().__init__(f"[{prop}] {message}")
        self.prop = prop
        self.message = message
        self.metrics = dict(metrics or {})
        #: indices (FA4 layout of the tensor) of every element over budget, when the violation is a
        #: budget comparison; None otherwise
        self.over_indices: Optional[np.ndarray] = None


from fa4verify.targets import DependencyMissing, Unsupported  # noqa: E402,F401


# ============================================================================ profiles
#: Hypothesis profile name -> settings. ``fa4-ci``: derandomized, no deadline (kernels JIT-compile),
#: no database, few examples; ``fa4-dev``: local default, database in the cache directory;
#: ``fa4-nightly``: long runs that let ``hypothesis.target`` steer toward large errors.
PROFILES: dict[str, dict[str, Any]] = {
    "fa4-ci": dict(max_examples=40, derandomize=True, deadline=None, database=None, print_blob=True,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                          HealthCheck.filter_too_much]),
    "fa4-dev": dict(max_examples=100, deadline=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much]),
    "fa4-nightly": dict(max_examples=5000, deadline=None, print_blob=True,
                        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                               HealthCheck.filter_too_much]),
}

#: Problem size limits per profile (``attention_problems`` arguments). CI keeps shapes small so a
#: twin+oracle example costs well under a second on one core; nightly goes past two KV tiles of
#: every SM90 tile width and up to hd 256.
_LIMITS: dict[str, dict[str, int]] = {
    "fa4-ci": dict(max_seqlen=260, max_batch=2, max_heads=3, max_head_dim=64, max_work=1_500_000),
    "fa4-dev": dict(max_seqlen=300, max_batch=3, max_heads=4, max_head_dim=256, max_work=8_000_000),
    "fa4-nightly": dict(max_seqlen=600, max_batch=4, max_heads=6, max_head_dim=256, max_work=60_000_000),
}


def profile_name(profile: str) -> str:
    """Accept "ci" or "fa4-ci" (etc.); return the registered name."""
    name = profile if profile.startswith("fa4-") else f"fa4-{profile}"
    if name not in PROFILES:
        raise ValueError(f"profile={profile!r}: expected one of {sorted(p[4:] for p in PROFILES)}")
    return name


def profile_limits(profile: str) -> dict[str, int]:
    return dict(_LIMITS[profile_name(profile)])


def register_profiles(database_dir: Optional[os.PathLike] = None) -> None:
    """Register the ``fa4-*`` Hypothesis profiles (idempotent). ``fa4-dev`` and ``fa4-nightly``
    keep their example database under ``database_dir`` (default ``.fa4verify-cache/hypothesis``)."""
    from hypothesis.database import DirectoryBasedExampleDatabase
    db_dir = Path(database_dir) if database_dir is not None else DEFAULT_CACHE_DIR / "hypothesis"
    for name, kw in PROFILES.items():
        kw = dict(kw)
        if name != "fa4-ci":
            kw["database"] = DirectoryBasedExampleDatabase(str(db_dir))
        settings.register_profile(name, **kw)


# the targets live in fa4verify.targets (one target layer for audit, gate, fuzz, mutants)
from fa4verify.targets import (Bwd, Fwd, ProductionTarget, Target, TwinTarget,  # noqa: E402,F401
                               make_target)


# ============================================================================ oracle + budget
def _budget(problem: AttentionProblem):
    """The composed budget set for the problem's (dtype, arch). Any failure to load it (module
    missing, malformed TOML) is a missing dependency of the judge, never a finding about the target."""
    from fa4verify import error_budgets as eb
    try:
        return eb.load(problem.dtype, problem.arch)
    except Exception as e:  # noqa: BLE001
        raise DependencyMissing(f"error budgets for {problem.dtype}/{problem.arch} unavailable: "
                                f"{type(e).__name__}: {e}") from None


def _oracle_forward(problem: AttentionProblem, a: Mapping[str, Any]):
    if problem.mask_mod is not None:
        raise Unsupported("the oracle has no mask_mod semantics yet (issue 16)")
    return judge.oracle_forward(problem, a)


def _oracle_backward(problem: AttentionProblem, a: Mapping[str, Any]):
    """The exact gradient (the oracle's own O enters D), which is what the composed backward
    budgets bound (their ``derr`` term covers the kernel's O error;
    error_budgets/DERIVATIONS.md#bwd-composition)."""
    return judge.oracle_backward(problem, a)


# ============================================================================ comparisons
def _where_str(idx: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(int(i)) for i in idx) + ")"


#: Note [Known issues absorb one violation]: while a campaign runs an example, this holds the
#: function that decides whether a violation is a known issue's (it records the hit and returns
#: True); the example then goes on, so every other property and tensor is still checked.
_ABSORB: "contextvars.ContextVar[Optional[Callable[[Violation], bool]]]" = contextvars.ContextVar(
    "fa4verify_fuzz_absorb", default=None)


def _fail(v: "Violation") -> None:
    """Raise ``v`` unless a known issue absorbs exactly this violation (Note [Known issues absorb
    one violation])."""
    absorb = _ABSORB.get()
    if absorb is not None and absorb(v):
        return
    raise v


def _compare(prop: str, name: str, actual: np.ndarray, ref: np.ndarray, bound: np.ndarray,
             budget: np.ndarray, problem: AttentionProblem, undecided: dict[str, str],
             ftz_floor: Optional[np.ndarray] = None) -> float:
    """The judge's verdict (:func:`fa4verify.judge.compare`) on one tensor of one property.
    ``fail`` raises :class:`Violation` with the five worst elements; ``undecided`` is recorded in
    ``undecided`` (``"<prop>.<name>"`` -> reason) and never counts as a pass of the property.
    Returns the tightness over the judged elements."""
    if np.size(ref) == 0 and np.size(actual) == 0:
        return 0.0       # an empty tensor (e.g. dK of a batch with no keys): nothing exists to judge
    v = judge.compare(name, actual, ref, oracle_bound=bound, budget=budget, all_indices=True)
    if v.status == "fail":
        rows = [e.text() for e in v.violations]
        if not rows:
            rows = [v.reason]
        within = False
        if ftz_floor is not None and v.violations:
            fl = np.broadcast_to(np.asarray(ftz_floor, np.float64), np.shape(ref))
            within = v.n_over <= len(v.violations) and all(
                e.err <= e.allowed + float(fl[e.index]) for e in v.violations)
        viol = Violation(prop, f"{name}: {v.n_over} / {v.n_compared} elements "
                              f"({100.0 * v.n_over / max(v.n_compared, 1):.3g}%) exceed |{name} - oracle| <= "
                              f"oracle_bound + budget; worst: " + "; ".join(rows) + f" | case: {problem.describe()}",
                        {f"tightness_{name}": v.tightness, f"violations_{name}": v.n_over,
                         "max_violating_abs_err": max((e.err for e in v.violations), default=math.inf),
                         "quantity": name, "within_ftz_envelope": bool(within)})
        viol.over_indices = v.over_indices      # every over element: what a known issue must explain
        _fail(viol)
    if v.status == "undecided":
        undecided[f"{prop}.{name}"] = v.reason
    return v.tightness


def _check_finite(prop: str, name: str, actual: np.ndarray, ref: np.ndarray, problem: AttentionProblem,
                  fmt_max: Optional[float]) -> None:
    ref = np.asarray(ref, np.float64)
    sel = np.isfinite(ref)
    if fmt_max is not None:
        sel &= np.abs(ref) < fmt_max * (1 - 2.0 ** -8)   # the oracle may legitimately overflow the format
    bad = sel & ~np.isfinite(actual)
    if bad.any():
        idx = tuple(np.argwhere(bad)[0])
        _fail(Violation(prop, f"{name}: {int(bad.sum())} non-finite value(s) where the oracle is finite, first "
                              f"{_where_str(idx)}: got {actual[idx]!r}, oracle {ref[idx]!r} | case: {problem.describe()}",
                        {f"nonfinite_{name}": int(bad.sum())}))


# ============================================================================ properties
@dataclasses.dataclass
class CheckOutcome:
    """What :func:`check_problem` measured: metrics (tightness per quantity, ...) and the
    properties skipped with their reason; ``undecided``: ``"<property>.<tensor>"`` -> why the
    judge could not decide (never counted as a pass of that property)."""
    metrics: dict[str, float]
    skipped: dict[str, str]
    ran: list[str]
    undecided: dict[str, str] = dataclasses.field(default_factory=dict)


def _run_target(problem: AttentionProblem, fn: Callable, *args, **kw):
    """Call the target; a crash on a valid problem is the ``runs`` property failing (an
    Unsupported or DependencyMissing passes through)."""
    try:
        return fn(*args, **kw)
    except (Violation, Unsupported, DependencyMissing):
        raise
    except Exception as e:  # noqa: BLE001
        raise Violation("runs", f"{type(e).__name__}: {e} | case: {problem.describe()}") from e


def check_problem(problem: AttentionProblem, target: Target, *, properties: Collection[str] = PROPERTIES,
                  backward: bool = True) -> CheckOutcome:
    """Run ``properties`` on ``problem`` against ``target``; raise :class:`Violation` on the first
    failing one, :class:`Unsupported` when the target cannot run the problem. Properties whose
    dependencies are missing (oracle, budgets, twin backward) are skipped with the reason."""
    props = [p for p in PROPERTIES if p in set(properties)]
    unknown = set(properties) - set(PROPERTIES)
    if unknown:
        raise ValueError(f"unknown properties {sorted(unknown)}; known: {PROPERTIES}")
    target.check_supported(problem)
    a = problem.materialize()
    metrics: dict[str, float] = {}
    skipped: dict[str, str] = {}
    undecided: dict[str, str] = {}
    ran: list[str] = []
    fwd = _run_target(problem, target.forward, problem, a)
    ran.append("runs")
    masked = problem.fully_masked_rows()
    fmt_max = _FMT_MAX[problem.dtype]

    # ---------------------------------------------------------------- oracle + budget (forward)
    ofwd = None
    stats = None
    ref_out = ref_lse = None
    try:
        ofwd = _oracle_forward(problem, a)
        ref_out, ref_lse, stats, _ = judge.forward_allowances(problem, a, budgets=_budget(problem),
                                                              oracle=ofwd)
        oracle_error = None
    except (DependencyMissing, Unsupported) as e:
        oracle_error = str(e)

    def need_ref(p: str) -> bool:
        if ref_out is None:
            skipped[p] = oracle_error or "oracle unavailable"
            return False
        return True

    if "masked_rows" in props:
        ran.append("masked_rows")
        mo = np.moveaxis(fwd.out, -2, -3) if not problem.varlen else np.moveaxis(fwd.out, -2, 0)
        # mo: (b, h, s, dv) dense or (h, total, dv) varlen -- same leading layout as masked
        nz = masked & np.any(mo != 0, axis=-1)
        if nz.any():
            idx = tuple(np.argwhere(nz)[0])
            _fail(Violation("masked_rows", f"O != 0 on {int(nz.sum())} fully masked row(s) (LSE layout index "
                                           f"{_where_str(idx)}) | case: {problem.describe()}"))
        if not problem.sink:
            bad = masked & ~(np.isneginf(fwd.lse))
            if bad.any():
                idx = tuple(np.argwhere(bad)[0])
                _fail(Violation("masked_rows", f"LSE != -inf on {int(bad.sum())} fully masked row(s), first "
                                               f"{_where_str(idx)}: {fwd.lse[idx]!r} | case: {problem.describe()}"))
        metrics["masked_rows"] = int(masked.sum())

    if "finite" in props:
        if ref_out is not None:
            ran.append("finite")
            _check_finite("finite", "out", fwd.out, ref_out.value, problem, fmt_max)
            _check_finite("finite", "lse", fwd.lse, ref_lse.value, problem, None)
        else:
            ran.append("finite")
            for name, x in (("out", fwd.out),):
                if not np.isfinite(x).all():
                    _fail(Violation("finite", f"{name}: non-finite output on finite inputs | case: {problem.describe()}"))

    if "fwd_budget" in props and need_ref("fwd_budget"):
        ran.append("fwd_budget")
        metrics["tightness_out"] = _compare("fwd_budget", "out", fwd.out, ref_out.value, ref_out.bound,
                                            ref_out.budget, problem, undecided, ftz_floor=stats.forward_out_ftz_floor())
        metrics["tightness_lse"] = _compare("fwd_budget", "lse", fwd.lse, ref_lse.value, ref_lse.bound,
                                            ref_lse.budget, problem, undecided)

    from fa4verify._strategies.masks import resolve_window
    r_causal, r_local, _, _ = resolve_window(problem.causal, problem.window_size)
    plain = (not r_causal and not r_local and problem.mask_mod is None and not problem.varlen)
    if "key_permutation" in props:
        if not plain or problem.seqlen_k < 2:
            skipped["key_permutation"] = "needs a dense problem without causal/local/mask_mod and seqlen_k >= 2"
        elif need_ref("key_permutation"):
            ran.append("key_permutation")
            perm = np.random.default_rng(problem.values.seed ^ 0x5EED).permutation(problem.seqlen_k)
            ap = dict(a)
            ap["k"], ap["v"] = a["k"][:, perm], a["v"][:, perm]
            fp = _run_target(problem, target.forward, problem, ap)
            metrics["tightness_out_permuted"] = _compare("key_permutation", "out", fp.out, ref_out.value,
                                                         ref_out.bound, ref_out.budget, problem, undecided)
            _compare("key_permutation", "lse", fp.lse, ref_lse.value, ref_lse.bound, ref_lse.budget, problem,
                     undecided)

    if "batch_invariance" in props:
        if problem.batch < 2 or problem.varlen:
            skipped["batch_invariance"] = "needs a dense problem with batch >= 2"
        else:
            ran.append("batch_invariance")
            b = problem.batch - 1
            sub = problem.replace(batch=1)
            ab = dict(a)
            for n in ("q", "k", "v", "dout"):
                ab[n] = a[n][b:b + 1]
            if a.get("mask") is not None:
                ab["mask"] = a["mask"][b:b + 1]
            f1 = _run_target(problem, target.forward, sub, ab)
            if target.bitwise_invariants:
                for n, x, y in (("out", f1.out[0], fwd.out[b]), ("lse", f1.lse[0], fwd.lse[b])):
                    if not np.array_equal(x, y, equal_nan=True):
                        d = int(np.sum(~((x == y) | (np.isnan(x) & np.isnan(y)))))
                        _fail(Violation("batch_invariance", f"{n} of batch entry {b} run alone differs bitwise "
                                                            f"in {d} element(s) | case: {problem.describe()}"))
            elif need_ref("batch_invariance"):
                _compare("batch_invariance", "out", f1.out[0], ref_out.value[b], ref_out.bound[b],
                         np.broadcast_to(ref_out.budget, ref_out.value.shape)[b], problem, undecided)

    if "gqa_repeat" in props:
        if problem.nheads_kv == problem.nheads or problem.varlen:
            skipped["gqa_repeat"] = "needs a dense GQA/MQA problem (nheads_kv < nheads)"
        else:
            ran.append("gqa_repeat")
            g = problem.nheads // problem.nheads_kv
            mha = problem.replace(nheads_kv=problem.nheads)
            am = dict(a)
            am["k"], am["v"] = np.repeat(a["k"], g, axis=-2), np.repeat(a["v"], g, axis=-2)
            fm = _run_target(problem, target.forward, mha, am)
            if target.bitwise_invariants and problem.arch == "sm90":
                for n, x, y in (("out", fm.out, fwd.out), ("lse", fm.lse, fwd.lse)):
                    if not np.array_equal(x, y, equal_nan=True):
                        d = int(np.sum(~((x == y) | (np.isnan(x) & np.isnan(y)))))
                        _fail(Violation("gqa_repeat", f"{n} with repeated KV heads differs bitwise from GQA in "
                                                      f"{d} element(s) | case: {problem.describe()}"))
            elif need_ref("gqa_repeat"):
                _compare("gqa_repeat", "out", fm.out, ref_out.value, ref_out.bound, ref_out.budget, problem,
                         undecided)

    # ---------------------------------------------------------------- backward
    want_bwd = backward and {"bwd_budget", "deterministic_bwd", "masked_rows", "finite"} & set(props)
    if want_bwd:
        try:
            g = _run_target(problem, target.backward, problem, a, fwd, deterministic=True)
        except DependencyMissing as e:
            for p in ("bwd_budget", "deterministic_bwd"):
                if p in props:
                    skipped[p] = str(e)
            g = None
        if g is not None:
            if "masked_rows" in props:
                dq_rows = np.moveaxis(g.dq, -2, -3) if not problem.varlen else np.moveaxis(g.dq, -2, 0)
                nz = masked & np.any(dq_rows != 0, axis=-1)
                if nz.any():
                    _fail(Violation("masked_rows", f"dQ != 0 on {int(nz.sum())} fully masked row(s) | "
                                                   f"case: {problem.describe()}"))
                unseen = _unseen_keys(problem)
                for n, x in (("dk", g.dk), ("dv", g.dv)):
                    xr = np.any(x != 0, axis=(-1, -2))   # (b, sk) or (total_k,)
                    bad = unseen & xr
                    if bad.any():
                        _fail(Violation("masked_rows", f"{n} != 0 on {int(bad.sum())} key(s) no query can see | "
                                                       f"case: {problem.describe()}"))
            obwd = None
            if ({"bwd_budget", "finite"} & set(props)) and ref_out is not None:
                try:
                    obwd = _oracle_backward(problem, a)
                except (DependencyMissing, Unsupported) as e:
                    skipped["bwd_budget"] = str(e)
            if obwd is not None:
                for n in ("dq", "dk", "dv"):
                    if "finite" in props:
                        _check_finite("finite", n, getattr(g, n), getattr(obwd, n), problem, fmt_max)
                if "bwd_budget" in props:
                    try:
                        with np.errstate(invalid="ignore", over="ignore"):
                            allow = stats.backward(obwd, ref_out.budget, ref_out.bound)
                    except (DependencyMissing, KeyError) as e:
                        skipped["bwd_budget"] = f"backward budget unavailable: {e}"
                        allow = None
                    if allow is not None:
                        ran.append("bwd_budget")
                        for n in ("dq", "dk", "dv"):
                            metrics[f"tightness_{n}"] = _compare("bwd_budget", n, getattr(g, n), getattr(obwd, n),
                                                                 getattr(obwd, f"{n}_bound"), allow[n], problem,
                                                                 undecided, ftz_floor=stats.ftz_floor[n])
            if "deterministic_bwd" in props and target.deterministic_by_construction:
                skipped["deterministic_bwd"] = f"{target.where} is deterministic by construction"
            elif "deterministic_bwd" in props:
                ran.append("deterministic_bwd")
                g2 = _run_target(problem, target.backward, problem, a, fwd, deterministic=True)
                for n in ("dq", "dk", "dv"):
                    x, y = getattr(g, n), getattr(g2, n)
                    if not np.array_equal(x, y, equal_nan=True):
                        d = int(np.sum(~((x == y) | (np.isnan(x) & np.isnan(y)))))
                        _fail(Violation("deterministic_bwd", f"{n} differs bitwise between two deterministic "
                                                             f"backward calls in {d} element(s) | case: "
                                                             f"{problem.describe()}"))
    tights = [v for k, v in metrics.items() if k.startswith("tightness_") and math.isfinite(v)]
    metrics["tightness_max"] = max(tights) if tights else 0.0
    return CheckOutcome(metrics, skipped, ran, undecided)


def _unseen_keys(problem: AttentionProblem) -> np.ndarray:
    """Bool ``(batch, seqlen_k)`` (dense) or ``(total_k,)`` (varlen): keys no query row can see."""
    cols = [~m.any(axis=0) for m in problem.keep_masks()]
    if problem.varlen:
        return np.concatenate(cols) if cols else np.zeros(0, bool)
    return np.stack(cols)


# ============================================================================ known issues
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


def _sink_overflow_rows(problem: AttentionProblem, a: Mapping[str, Any]) -> np.ndarray:
    """Boolean (token, head) array: rows whose sink exceeds the largest visible logit by >= 126
    log2 units, where ``exp2(sink*log2e - row_max*scale_log2)`` in FA4's sink fold overflows fp32."""
    tq = sum(lq for _, lq, _, _ in _token_bounds(problem))
    rows = np.zeros((tq, problem.nheads), bool)
    if not problem.sink:
        return rows
    sink = np.asarray(a["learnable_sink"], np.float64)
    q = np.asarray(a["q"], np.float64)
    k = np.asarray(a["k"], np.float64)
    q, k = q.reshape((-1,) + q.shape[-2:]), k.reshape((-1,) + k.shape[-2:])
    g = problem.nheads // problem.nheads_kv
    for (q0, lq, k0, lk), keep in zip(_token_bounds(problem), problem.keep_masks()):
        if lq == 0 or lk == 0:
            continue
        for h in range(problem.nheads):
            y = (q[q0:q0 + lq, h] @ k[k0:k0 + lk, h // g].T) * problem.scale
            if problem.softcap > 0:
                y = problem.softcap * np.tanh(y / problem.softcap)
            m = np.max(np.where(keep, y, -np.inf), axis=1)
            rows[q0:q0 + lq, h] = np.isfinite(m) & ((sink[h] - m) * math.log2(math.e) >= 126.0)
    return rows


def _sink_overflow(problem: AttentionProblem, a: Mapping[str, Any], v: "Violation") -> bool:
    """True when the violation is explained by sink-fold overflow: some row overflows, and (for a
    budget comparison) every over element of O, LSE or dQ lies in an overflowing (token, head) row;
    dK/dV/dsink elements lie in a KV head whose query group has an overflowing row in the same
    sequence (the bad row's gradient reaches every key it sees)."""
    if not problem.sink or v.prop not in ("finite", "fwd_budget", "bwd_budget", "key_permutation",
                                          "batch_invariance", "gqa_repeat"):
        return False
    rows = _sink_overflow_rows(problem, a)
    if not rows.any():
        return False
    idx = v.over_indices
    q = str(v.metrics.get("quantity", ""))
    if idx is None or not len(idx) or q not in ("out", "lse", "dq", "dk", "dv"):
        return v.prop == "finite"      # non-finite values: the overflow's LSE = +inf
    idx = np.asarray(idx)
    varlen = problem.varlen
    if q == "lse":                     # (b, h, s) dense, (h, t) varlen
        tok = idx[:, 1] if varlen else idx[:, 0] * problem.seqlen_q + idx[:, 2]
        head = idx[:, 0] if varlen else idx[:, 1]
        return bool(rows[tok, head].all())
    if q in ("out", "dq"):             # (b, s, h, d) dense, (t, h, d) varlen
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
    FA4 source by :func:`fa4verify.kernels.fa4_params.sm90_dq_accum_mismatch`)."""
    if problem.arch != "sm90" or v.prop not in ("bwd_budget", "masked_rows", "finite"):
        return False
    quantity = str(v.metrics.get("quantity", ""))
    if quantity != "dq" and not v.message.startswith("dq"):
        return False
    from fa4verify.kernels import fa4_params
    local = any(w is not None for w in problem.window_size)
    lens = problem.seqlens_q if problem.varlen else (problem.seqlen_q,)
    if not fa4_params.sm90_dq_defect_predicted(problem.head_dim, problem.head_dim_v, lens, causal=problem.causal,
                                               local=local, varlen=problem.varlen):
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
        row = tok - starts[np.searchsorted(starts, tok, side="right") - 1]
    else:
        row = idx[:, 1]
    return bool((row >= good).all())


def _sm90_bwd_compile(problem: AttentionProblem, a: Mapping[str, Any], v: "Violation") -> bool:
    """True for the SM90 backward compile failure seen at head dims 104 and 112 (non-causal, FA4's
    tile m=80): CuTe DSL raises "failed to partition ... with tiled_mma" for a head dim FA4's
    interface accepts."""
    return (problem.arch == "sm90" and v.prop == "runs" and problem.head_dim in (104, 112)
            and "failed to partition" in v.message)


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
    return bool(fa4_params.sm90_dq_accum_mismatch(problem.head_dim, problem.head_dim_v, causal=problem.causal,
                                                  local=local).get("mismatch"))


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
        _sink_overflow),
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
        _sm90_dq_accum, targets=("production",)),
    KnownIssue(
        "sm90_bwd_hd104_112_compile",
        "SM90 backward does not compile at head dims 104 and 112 (MLIRError: failed to partition "
        "'(112,80)' with tiled_mma) although FA4's interface accepts them",
        "flash-attn-4 4.0.0b36 flash_bwd_sm90.py with _tile_size_bwd_sm90's m_block 80 (non-causal); "
        "measured on H200, 2026-11-30, by scripts/gpu_hd_sweep.py (kernels/evidence/golden/hd_sweep_h200.json); "
        "causal (m_block 64) not measured",
        _sm90_bwd_compile, targets=("production",)),
    KnownIssue(
        "sm90_gqa_dkdv_accum_hdim_rounding",
        "SM90 GQA/MQA backward: dK and dV are wrong (relative error 0.9-1.2) at head dims 8, 16, 40, "
        "48, 72, 80 when nheads_kv < nheads; with nheads_kv == nheads they are right (dQ is wrong "
        "either way: sm90_dq_accum_hdim_rounding)",
        "predicted from flash-attn-4 4.0.0b36's source (flash_bwd_sm90.py dK/dV accumulators rounded to "
        "16 vs interface.py's 32, the root cause of the dQ finding, upstream PR #2896) and CONFIRMED "
        "measured on NVIDIA H200 (sm_90), 2026-12-01, scripts/gpu_predictions.py: hd 8/16/40/48/72/80 "
        "with 4 query heads over 1 or 2 KV heads, seqlen 256: dK/dV rel err 0.91-1.16; hd 64/128 "
        "2.3e-3; kernels/evidence/golden/bwd_predictions_h200.json",
        _sm90_gqa_dkdv_accum, targets=("production",)),
)


def match_known_issue(problem: AttentionProblem, v: "Violation", a: Optional[Mapping[str, Any]] = None,
                      target: str = "twin") -> Optional[KnownIssue]:
    """The known issue explaining violation ``v`` on ``problem`` for ``target``, or None."""
    a = problem.materialize() if a is None else a
    for ki in KNOWN_ISSUES:
        if target in ki.targets and ki.applies(problem, a, v):
            return ki
    return None


# ============================================================================ cases
def _versions() -> dict[str, Optional[str]]:
    from fa4verify.kernels.facts import dist_version
    return {d: dist_version(d) for d in ("fa4verify", "hypothesis", "numpy", "flash-attn-4", "nvidia-cutlass-dsl")}


def write_case(directory: os.PathLike, problem: AttentionProblem, violation: Violation, *,
               target: Target, profile: str = "", seed: Optional[int] = None) -> Path:
    """Write a replayable JSON case (Note [Fuzz cases are replayable]); never overwrites: the
    file name is ``<property>-<target>-<digest>.json``. Returns the path."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    desc = target.describe()
    case = {
        "format": CASE_FORMAT,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "target": desc["target"], "where": desc["where"],
        "arch": problem.arch, "mutations": desc.get("mutations", []),
        "property": violation.prop, "message": violation.message,
        "metrics": {k: (v if not isinstance(v, float) or math.isfinite(v) else repr(v))
                    for k, v in violation.metrics.items()},
        "expect": "fail", "profile": profile, "seed": seed,
        "problem": problem.to_dict(), "versions": _versions(),
    }
    stem = f"{violation.prop}-{desc['target']}{'-' + '+'.join(desc.get('mutations', [])) if desc.get('mutations') else ''}-{problem.digest()}"
    path = d / f"{stem}.json"
    n = 1
    while path.exists():
        path = d / f"{stem}-{n}.json"
        n += 1
    from fa4verify.audit.atomic import atomic_write_text
    atomic_write_text(str(path), json.dumps(case, indent=2, sort_keys=True) + "\n")   # never a torn file
    return path


def load_case(path_or_dict: os.PathLike | Mapping[str, Any]) -> dict[str, Any]:
    """Read and validate a case file; returns the dict with ``problem`` parsed to an
    :class:`AttentionProblem` under ``"problem_obj"``."""
    if isinstance(path_or_dict, Mapping):
        case = dict(path_or_dict)
    else:
        case = json.loads(Path(path_or_dict).read_text())
    if case.get("format") != CASE_FORMAT:
        raise ValueError(f"not a fuzz case: format={case.get('format')!r} (expected {CASE_FORMAT!r})")
    case["problem_obj"] = AttentionProblem.from_dict(case["problem"])
    return case


@dataclasses.dataclass
class ReplayOutcome:
    status: str                     # "fail" | "pass" | "undecided" | "unsupported" | "skipped"
    property: Optional[str]
    message: str
    metrics: dict[str, Any]


def replay_case(case: os.PathLike | Mapping[str, Any], *, target: Optional[Target] = None,
                properties: Optional[Collection[str]] = None) -> ReplayOutcome:
    """Re-run a case. By default the case's own target and mutations, and only the property it
    recorded (``properties`` overrides; pass :data:`PROPERTIES` for all)."""
    c = load_case(case)
    problem: AttentionProblem = c["problem_obj"]
    if target is None:
        target = make_target(c["target"], mutations=c.get("mutations", ()))
    props = tuple(properties) if properties is not None else (c["property"],)
    try:
        out = check_problem(problem, target, properties=props)
    except Violation as v:
        return ReplayOutcome("fail", v.prop, v.message, v.metrics)
    except Unsupported as e:
        return ReplayOutcome("unsupported", None, str(e), {})
    if not out.ran:
        return ReplayOutcome("skipped", None, "; ".join(f"{k}: {v}" for k, v in out.skipped.items()), out.metrics)
    if out.undecided:
        return ReplayOutcome("undecided", next(iter(out.undecided)).split(".")[0],
                             "; ".join(f"{k}: {v}" for k, v in out.undecided.items()), out.metrics)
    return ReplayOutcome("pass", None, f"ran {out.ran}", out.metrics)


def regression_snippet(problem: AttentionProblem, violation: Violation, *, target: Target,
                       case_path: Optional[os.PathLike] = None) -> str:
    """A pytest snippet that pins the shrunk counterexample: an ``@example`` for a Hypothesis
    test over :func:`attention_problems` and a plain regression test."""
    desc = target.describe()
    muts = desc.get("mutations", [])
    js = problem.to_json()
    target_expr = f"TwinTarget({sorted(muts)!r})" if desc["target"] == "twin" else "ProductionTarget()"
    lines = [
        f"# Shrunk counterexample: property {violation.prop!r} on {desc['where']}"
        + (f" with mutations {muts}" if muts else ""),
        f"# {problem.describe()}",
    ]
    if case_path is not None:
        lines.append(f"# case file: {case_path}  (replay: fa4verify fuzz --replay {case_path})")
    lines += [
        "from hypothesis import example, given",
        "from fa4verify.fuzz import TwinTarget, ProductionTarget, check_problem",
        "from fa4verify.strategies import AttentionProblem, attention_problems",
        "",
        f"@example(AttentionProblem.from_json({js!r}))",
        f"@given(attention_problems(arch={problem.arch!r}, dtype={problem.dtype!r}))",
        "def test_fuzz_properties(problem):",
        f"    check_problem(problem, {target_expr}, properties=[{violation.prop!r}])",
    ]
    return "\n".join(lines)


# ============================================================================ campaigns
@dataclasses.dataclass
class CampaignResult:
    """Everything one campaign measured; :meth:`to_json` is the ``--json`` schema
    (:data:`CAMPAIGN_FORMAT`)."""
    target: dict[str, Any]
    arch: str
    profile: str
    seed: Optional[int]
    examples_requested: int
    examples_run: int = 0
    unique_problems: int = 0
    unsupported: dict[str, int] = dataclasses.field(default_factory=dict)
    coverage: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    properties_ran: dict[str, int] = dataclasses.field(default_factory=dict)
    properties_skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    max_metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    worst_problem: Optional[dict] = None
    failure: Optional[dict[str, Any]] = None
    seconds: float = 0.0
    stopped: Optional[str] = None
    known_hits: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    versions: dict[str, Optional[str]] = dataclasses.field(default_factory=dict)
    #: "<property>.<tensor>" -> {"count": examples, "reason": first reason, "first": problem}
    undecided: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    @property
    def found(self) -> bool:
        return self.failure is not None

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["format"] = CAMPAIGN_FORMAT
        d["where"] = self.target.get("where", "")
        return _jsonable(d)


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        x = float(x)
        return x if math.isfinite(x) else repr(x)
    return x


class _Stop(Exception):
    """Raised inside the test function once the campaign's time limit has passed."""


def run_campaign(*, target: Target, arch: str = "sm90", dtype: Optional[str] = None, examples: int = 40,
                 seed: Optional[int] = 0, profile: str = "ci", properties: Collection[str] = PROPERTIES,
                 features: Optional[Collection[str]] = None, distributions: Optional[Collection[str]] = None,
                 limits: Optional[Mapping[str, int]] = None, cases_dir: Optional[os.PathLike] = None,
                 database_dir: Optional[os.PathLike] = None, time_limit_s: Optional[float] = None,
                 backward: bool = True, strict_known: bool = False, on_example: Optional[Callable[[int, AttentionProblem], None]] = None,
                 verbose: bool = False) -> CampaignResult:
    """Run a Hypothesis campaign of ``examples`` problems against ``target``.

    The first failing problem is shrunk; the shrunk failure is stored in ``result.failure``
    (property, message, metrics, problem, snippet, and the case file when ``cases_dir`` is set).
    ``hypothesis.target`` steers toward large ``tightness_max`` (and per quantity). With
    ``time_limit_s``, generation stops at the limit and the result says so (``stopped``).
    """
    pname = profile_name(profile)
    register_profiles(database_dir)
    lim: dict[str, Any] = profile_limits(profile)
    lim.update(limits or {})
    feats = tuple(f for f in (features if features is not None else FEATURES) if f in target.features())
    strategy = attention_problems(arch=arch, dtype=dtype, features=feats,
                                  distributions=tuple(distributions) if distributions else None, **lim)
    strategy.validate()   # bad limits raise InvalidArgument here, not inside the campaign
    res = CampaignResult(target=target.describe(), arch=arch, profile=pname, seed=seed, examples_requested=examples,
                         versions=_versions())
    seen: set[str] = set()
    state: dict[str, Any] = {"last": None, "t0": time.monotonic(), "best": -1.0}
    from hypothesis import given, reject, seed as hseed, target as htarget

    base = settings.get_profile(pname)
    db = base.database
    if database_dir is not None and pname != "fa4-ci":
        from hypothesis.database import DirectoryBasedExampleDatabase
        db = DirectoryBasedExampleDatabase(str(database_dir))
    st_kw = dict(max_examples=examples, database=db, report_multiple_bugs=False,
                 verbosity=Verbosity.normal if verbose else Verbosity.quiet)
    if pname == "fa4-ci":
        # derandomized by default; an explicit seed keeps runs reproducible but distinct
        st_kw["derandomize"] = seed is None

    def body(problem: AttentionProblem) -> None:
        if (time_limit_s is not None and state["last"] is None
                and time.monotonic() - state["t0"] > time_limit_s):   # never cut a shrink short
            res.stopped = f"time limit {time_limit_s:g} s reached"
            raise _Stop()
        a_cache: dict[str, Any] = {}

        def absorb(v: Violation) -> bool:
            if strict_known:
                return False
            if "a" not in a_cache:
                a_cache["a"] = problem.materialize()
            ki = match_known_issue(problem, v, a_cache["a"], target=target.name)
            if ki is None:
                return False
            if state["last"] is None:    # count each drawn example once (not the shrink replays)
                hit = res.known_hits.setdefault(ki.name, {"count": 0, "title": ki.title, "reference": ki.reference,
                                                          "first": problem.describe(), "property": v.prop})
                hit["count"] += 1
                hit.setdefault("quantities", {})
                q = str(v.metrics.get("quantity", v.prop))
                hit["quantities"][q] = hit["quantities"].get(q, 0) + 1
            return True

        token = _ABSORB.set(absorb)
        try:
            out = check_problem(problem, target, properties=properties, backward=backward)
        except Unsupported as e:
            key = str(e).split(":")[0][:120]
            res.unsupported[key] = res.unsupported.get(key, 0) + 1
            reject()
        except Violation as v:
            ki = None if strict_known else match_known_issue(problem, v, target=target.name)
            if ki is not None:
                hit = res.known_hits.setdefault(ki.name, {"count": 0, "title": ki.title, "reference": ki.reference,
                                                          "first": problem.describe(), "property": v.prop})
                hit["count"] += 1
                return
            state["last"] = (problem, v)
            raise
        except (DependencyMissing, _Stop):
            raise
        finally:
            _ABSORB.reset(token)
        dg = problem.digest()
        if dg not in seen and state["last"] is None:   # after a failure, calls are shrinking
            seen.add(dg)
            res.examples_run += 1
            if on_example is not None:
                on_example(res.examples_run, problem)
            for k, val in problem.features().items():
                res.coverage.setdefault(k, {})
                res.coverage[k][str(val)] = res.coverage[k].get(str(val), 0) + 1
            for p in out.ran:
                res.properties_ran[p] = res.properties_ran.get(p, 0) + 1
            for p, why in out.skipped.items():
                res.properties_skipped.setdefault(p, why)
            for p, why in out.undecided.items():
                u = res.undecided.setdefault(p, {"count": 0, "reason": why, "first": problem.describe()})
                u["count"] += 1
            for k, val in out.metrics.items():
                if isinstance(val, (int, float)) and math.isfinite(val):
                    res.max_metrics[k] = max(res.max_metrics.get(k, -math.inf), float(val))
            if out.metrics.get("tightness_max", 0.0) > state["best"]:
                state["best"] = out.metrics["tightness_max"]
                res.worst_problem = {"problem": problem.to_dict(), "tightness_max": state["best"]}
        for k in ("tightness_max", "tightness_out", "tightness_lse", "tightness_dq", "tightness_dk", "tightness_dv"):
            val = out.metrics.get(k)
            if val is not None and math.isfinite(val):
                htarget(float(val), label=k)

    test = settings(base, **st_kw)(given(strategy)(body))
    if seed is not None:
        # a fixed seed makes the run reproducible; Hypothesis then neither reads nor writes the
        # example database (leave seed=None in dev/nightly runs to use it)
        test = hseed(seed)(test)
    t0 = time.monotonic()
    try:
        test()
    except _Stop:
        if state["last"] is not None:   # pragma: no cover - _Stop is not raised once a failure exists
            raise
    except DependencyMissing:
        raise
    except BaseException as e:  # noqa: BLE001 - hypothesis re-raises the shrunk failure
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        last = state["last"]
        if last is None:
            raise
        problem, v = last
        fail = {"property": v.prop, "message": v.message, "metrics": _jsonable(v.metrics),
                "problem": problem.to_dict(), "describe": problem.describe(), "work": problem.work}
        if cases_dir is not None:
            try:
                path = write_case(cases_dir, problem, v, target=target, profile=pname, seed=seed)
                fail["case_file"] = str(path)
            except OSError as e:          # the finding is kept; only its case file is lost
                fail["case_error"] = f"{type(e).__name__}: {e}"
        fail["snippet"] = regression_snippet(problem, v, target=target, case_path=fail.get("case_file"))
        res.failure = fail
    res.unique_problems = len(seen)
    res.seconds = time.monotonic() - t0
    res.target = target.describe()          # production: the kernel configurations that ran
    return res
