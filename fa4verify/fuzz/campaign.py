"""A fuzz campaign: Hypothesis draws problems, every property runs on each against one target,
known issues are counted, the first other failure is shrunk and kept as a replayable case.


Note [Campaigns do not depend on what is imported]
--------------------------------------------------
Hypothesis (6.1xx, ``hypothesis.internal.conjecture.providers._get_local_constants``) mixes the
literal constants of every *local* module in ``sys.modules`` (non-test files outside
site-packages: with an editable install, all of fa4verify) into its integer and float draws, and
re-reads the pool whenever ``sys.modules`` grows. A seeded campaign therefore drew different
examples in a long process (a pytest session, an audit that imported more of fa4verify first)
than in a fresh one: session 4's in-process rescale_skipped find-and-shrink missed the fault that
the same seed finds in a fresh process (``tests/test_fuzz_in_process_state.py`` reproduces the
divergence). :func:`run_campaign` draws with an empty local-constant pool (Hypothesis' own
global constants stay), so a seed means the same examples in any process; with a Hypothesis
that lacks that hook the campaign runs unchanged.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from typing import Any, Callable, Collection, Mapping, Optional

import numpy as np
from hypothesis import Verbosity, settings

from fa4verify.problem import FEATURES, AttentionProblem
from fa4verify._strategies.problem import attention_problems
from fa4verify.fuzz.cases import _versions, regression_snippet, write_case
from fa4verify.fuzz import known_issues as _known
from fa4verify.fuzz.known_issues import known_issue_matcher
from fa4verify.fuzz.profiles import profile_limits, profile_name, register_profiles
from fa4verify.fuzz.properties import PROPERTIES, check_problem
from fa4verify.fuzz.violation import _ABSORB, Violation, tightness_key
from fa4verify.targets import Target
from fa4verify.errors import DependencyMissing, HarnessError, Unsupported

CAMPAIGN_FORMAT = "fa4verify-fuzz-campaign/1"

# Note [Judged share]
# -------------------
# A campaign's verdict is about the examples it judged, not the ones it drew. Drawn examples
# that the target refused (unsupported: FA4 rejected the call, or the release lacks the
# feature), that fa4verify's own call failed on (errors, Note [Blame]) or that the time limit
# left unrun are not judged. A campaign that judged fewer than JUDGED_SHARE_MIN of its draw, or
# fewer than JUDGED_MIN examples (or the whole draw when it is smaller), is undecided with the
# counts, never a pass: 2 judged of 50 drawn verified 4 % of the campaign.
JUDGED_SHARE_MIN = 0.5
JUDGED_MIN = 10
#: undecided problems kept per property and tensor (CampaignResult.record_undecided)
UNDECIDED_KEEP = 10


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
    #: examples fa4verify's own call failed on (Note [Blame]): "<first line>" -> count; never judged
    errors: dict[str, int] = dataclasses.field(default_factory=dict)
    #: examples stopped by a violation a known FA4 issue explains (judged, not run to the end)
    known_raised: int = 0
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
    #: "<property>.<tensor>" -> {"count": examples, "reason": first reason, "first": its
    #: problem's description, "problem": its problem, "problems": the first UNDECIDED_KEEP
    #: problems (each replayable: ``fa4verify fuzz --replay``)}; :meth:`record_undecided`
    undecided: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    #: Note [Tightness outside known issues]: per quantity ("tightness_dq", ...) the worst
    #: tightness no known issue absorbed, and the worst of those
    max_metrics_outside_known: dict[str, float] = dataclasses.field(default_factory=dict)
    tightness_outside_known: float = 0.0

    @property
    def found(self) -> bool:
        return self.failure is not None

    def record_undecided(self, prop: str, why: str, describe: str, problem: Optional[dict]) -> None:
        """Count one example the judge could not decide on ``prop`` ("<property>.<tensor>"): the
        first reason and problem, and the first :data:`UNDECIDED_KEEP` problems, so that every
        undecided class of a campaign can be replayed, not only its first example. One rule for
        ``fa4verify fuzz`` (:func:`run_campaign`) and the audit's drawn campaign
        (:func:`fa4verify.fuzz.drawn.merge_drawn`)."""
        u = self.undecided.setdefault(prop, {"count": 0, "reason": why, "first": describe,
                                             "problem": problem, "problems": []})
        u["count"] += 1
        if problem is not None and len(u["problems"]) < UNDECIDED_KEEP:
            u["problems"].append(problem)

    def record_tightness(self, metrics: Mapping[str, Any], absorbed: Collection[str]) -> None:
        """Add one judged example's figures: ``metrics`` into :attr:`max_metrics` (every finite
        figure) and, outside the quantities in ``absorbed`` (those a known issue absorbed on this
        example), into :attr:`max_metrics_outside_known` / :attr:`tightness_outside_known`.

        Note [Tightness outside known issues]
        -------------------------------------
        A quantity a known issue absorbed (e.g. dQ of the recorded SM90 defect, 1e3 x its budget:
        the H200 default audit reported "every property held; max tightness 1.53e+03") says
        nothing about the budgets that still bind; the reported tightness is the worst over the
        rest. An absorbed quantity without a tightness figure of its own (a whole property, e.g.
        ``deterministic_bwd``) leaves the example whole: the figure can only be too high, never
        too low. One rule for ``fa4verify fuzz`` (:func:`run_campaign`) and the audit's drawn
        campaign (:func:`fa4verify.fuzz.drawn.merge_drawn`)."""
        fin = {k: float(v) for k, v in metrics.items()
               if isinstance(v, (int, float)) and math.isfinite(float(v))}
        for k, val in fin.items():
            self.max_metrics[k] = max(self.max_metrics.get(k, -math.inf), val)
        names = {f"tightness_{q}" for q in absorbed}
        keep_all = bool(absorbed) and not (names & set(metrics))
        for k, val in fin.items():
            if k.startswith("tightness_") and k != "tightness_max" and (keep_all or k not in names):
                self.max_metrics_outside_known[k] = max(self.max_metrics_outside_known.get(k, -math.inf), val)
                self.tightness_outside_known = max(self.tightness_outside_known, val)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["format"] = CAMPAIGN_FORMAT
        d["where"] = self.target.get("where", "")
        return _jsonable(d)


def record_hit(hits: dict, ki: Any, problem: AttentionProblem, v: Violation) -> None:
    """Count known issue ``ki``'s absorption of violation ``v`` in ``hits`` (``known_hits``: per
    issue name its count, title, reference, first problem, property and count per quantity). Note
    [Two defects in one violation]: the issue whose elements were taken out (``known_with``) is hit
    too, counted under its own name, and each names the other under ``with``."""
    q = str(v.metrics.get("quantity", v.prop))
    other = v.metrics.get("known_with")
    partner_issue = None if other is None else next((k for k in _known.KNOWN_ISSUES if k.name == other), None)
    for issue, partner in ((ki, other), (partner_issue, ki.name)):
        if issue is None:
            continue
        hit = hits.setdefault(issue.name, {"count": 0, "title": issue.title, "reference": issue.reference,
                                           "first": problem.describe(), "property": v.prop})
        hit["count"] += 1
        hit.setdefault("quantities", {})
        hit["quantities"][q] = hit["quantities"].get(q, 0) + 1
        if partner is not None:
            w = hit.setdefault("with", {})
            w[partner] = w.get(partner, 0) + 1


def judged_examples(res: "CampaignResult") -> int:
    """Examples the judge decided on: ran, or stopped on a violation (known or not)."""
    return int(res.examples_run) + int(getattr(res, "violations", int(res.found))) \
        + int(getattr(res, "known_raised", 0))


def power_shortfall(res: "CampaignResult") -> Optional[str]:
    """Why the campaign judged too little of its draw to pass (Note [Judged share]), or None."""
    return judged_shortfall(judged_examples(res), int(res.examples_requested), unit="drawn examples",
                            unsupported=sum(res.unsupported.values()), errors=sum(res.errors.values()),
                            not_run=int(getattr(res, "not_run", 0)))


def judged_shortfall(judged: int, drawn: int, *, unit: str, unsupported: int, errors: int = 0,
                     not_run: int = 0) -> Optional[str]:
    """Note [Judged share] for any run that draws and judges: None when ``judged`` is at least
    :data:`JUDGED_SHARE_MIN` of what was drawn and at least :data:`JUDGED_MIN` (or all of a
    smaller draw), else the reason with the counts."""
    drawn = max(int(drawn), judged + unsupported + errors + not_run)
    need = min(JUDGED_MIN, drawn)
    if judged >= need and judged >= JUDGED_SHARE_MIN * drawn:
        return None
    parts = [f"{unsupported} unsupported"] + ([f"{errors} fa4verify errors"] if errors else []) \
        + ([f"{not_run} not run"] if not_run else [])
    return (f"judged {judged} of {drawn} {unit} ({', '.join(parts)}); a verdict needs at least "
            f"{JUDGED_SHARE_MIN:.0%} of the draw and at least {need} judged")


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


@contextlib.contextmanager
def _fixed_constant_pool():
    """Note [Campaigns do not depend on what is imported]: Hypothesis' local-constant pool is
    empty while the campaign draws (its constant cache is cleared on entry and exit)."""
    try:
        from hypothesis.internal.conjecture import providers as _prov
        orig = _prov._get_local_constants
        empty = _prov.Constants()
        cache = _prov.CONSTANTS_CACHE.cache
    except (ImportError, AttributeError):       # another Hypothesis: nothing to pin
        yield
        return
    cache.clear()
    _prov._get_local_constants = lambda: empty
    try:
        yield
    finally:
        _prov._get_local_constants = orig
        cache.clear()


class _Stop(Exception):
    """Raised inside the test function once the campaign's time limit has passed."""


def _violation(problem: AttentionProblem, target: Target, properties, backward, strict_known: bool
               ) -> Optional[Violation]:
    """The violation ``problem`` raises on ``target`` that no known issue absorbs, or None (it
    passes, is refused, or only hits known issues)."""
    match = known_issue_matcher(problem, target.name, strict=strict_known)
    token = _ABSORB.set(lambda w: match(w) is not None)
    try:
        check_problem(problem, target, properties=properties, backward=backward)
    except Violation as v:
        return None if match(v) is not None else v
    except (Unsupported, HarnessError):
        return None
    finally:
        _ABSORB.reset(token)
    return None


#: strategy limits that confine a draw to a deployment's space: a polished case must stay inside
_CONFINING = ("head_count_choices", "seqlen_q_range", "seqlen_k_range", "mask_choices", "window_choices",
              "softcap_choices", "sinks", "scale_choices")


def _polish(problem: AttentionProblem, v: Violation, violation, *, budget: int = 40,
            limits: Optional[Mapping[str, Any]] = None) -> tuple[AttentionProblem, Violation]:
    """Note [Polishing the shrunk case]: Hypothesis's shrinker stops at a local minimum that depends
    on the path its draws took (a seqlen of 3 where 1 fails the same way). Greedy passes over the plain fields of a dense problem without a call form -- batch 1,
    fewer heads, seqlen_q and seqlen_k towards 1, head dim 8 -- keep each change under which the
    same property still fails (``violation(p)``: the unabsorbed violation or None), at most
    ``budget`` checks, each required to fail the same property on the same quantity. Returned as
    shrunk: varlen, call-form and mod problems, a ``runs`` failure (a crash can leave the device
    failing every later call: it would "reduce" to anything), and a campaign confined to a
    deployment (``limits``: its head counts and lengths; a head dim 8 only where the draw allows it).
    """
    lim = dict(limits or {})
    if (problem.varlen or problem.call is not None or problem.mods or problem.mask_mod is not None
            or v.prop == "runs" or any(lim.get(k) is not None for k in _CONFINING)):
        return problem, v
    hd_ok = lim.get("head_dim_choices") is None or any(
        (c if isinstance(c, int) else tuple(c)) in (8, (8, 8)) for c in lim["head_dim_choices"])
    quantity = v.metrics.get("quantity")

    def candidates(p: AttentionProblem):
        yield dict(batch=1)
        yield dict(nheads=p.nheads_kv)
        yield dict(nheads=p.nheads // p.nheads_kv, nheads_kv=1)
        yield dict(nheads=1, nheads_kv=1)
        for n in ("seqlen_q", "seqlen_k"):
            x = getattr(p, n)
            for y in (1, x // 2, x - 1):
                yield {n: y}
        if p.head_dim == p.head_dim_v and hd_ok:
            yield dict(head_dim=8, head_dim_v=8)
    checks = 0
    improved = True
    while improved and checks < budget:
        improved = False
        for change in candidates(problem):
            if all(getattr(problem, k) == c for k, c in change.items()) or any(
                    c < 1 or c > getattr(problem, k) for k, c in change.items()) or checks >= budget:
                continue
            try:
                cand = problem.replace(**change)
            except ValueError:
                continue
            checks += 1
            w = violation(cand)
            if w is not None and w.prop == v.prop and w.metrics.get("quantity") == quantity:
                problem, v, improved = cand, w, True
    return problem, v


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
        match = known_issue_matcher(problem, target.name, strict=strict_known)
        absorbed: set[str] = set()       # this example's quantities a known issue absorbed

        def absorb(v: Violation) -> bool:
            ki = match(v)
            if ki is None:
                return False
            absorbed.add(tightness_key(v))
            if state["last"] is None:    # count each drawn example once (not the shrink replays)
                record_hit(res.known_hits, ki, problem, v)
            return True

        token = _ABSORB.set(absorb)
        try:
            out = check_problem(problem, target, properties=properties, backward=backward)
        except Unsupported as e:
            key = str(e).split(":")[0][:120]
            res.unsupported[key] = res.unsupported.get(key, 0) + 1
            reject()
        except HarnessError as e:
            key = str(e)[:120]
            res.errors[key] = res.errors.get(key, 0) + 1
            reject()
        except Violation as v:
            ki = match(v)
            if ki is not None:
                hit = res.known_hits.setdefault(ki.name, {"count": 0, "title": ki.title, "reference": ki.reference,
                                                          "first": problem.describe(), "property": v.prop})
                hit["count"] += 1
                if state["last"] is None and problem.digest() not in seen:
                    seen.add(problem.digest())
                    res.known_raised += 1
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
                res.record_undecided(p, why, problem.describe(), problem.to_dict())
            res.record_tightness(out.metrics, absorbed)    # Note [Tightness outside known issues]
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
        with _fixed_constant_pool():
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
        shrunk = problem
        problem, v = _polish(problem, v, lambda p: _violation(p, target, properties, backward, strict_known),
                             limits=lim)
        fail = {"property": v.prop, "message": v.message, "metrics": _jsonable(v.metrics),
                "problem": problem.to_dict(), "describe": problem.describe(), "work": problem.work}
        if problem != shrunk:
            fail["polished_from"] = shrunk.to_dict()
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
