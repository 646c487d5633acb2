"""Property-based fuzzing of FA4 attention, one concept per module:

* :mod:`~fa4verify.fuzz.properties` -- the properties and :func:`check_problem` (one problem, one target);
* :mod:`~fa4verify.fuzz.violation` -- :class:`Violation` and the known-issue absorb hook;
* :mod:`~fa4verify.fuzz.known_issues` -- documented FA4 issues and their predicates;
* :mod:`~fa4verify.fuzz.cases` -- replayable JSON cases and regression snippets;
* :mod:`~fa4verify.fuzz.profiles` -- Hypothesis profiles and size limits;
* :mod:`~fa4verify.fuzz.campaign` -- :func:`run_campaign` and :class:`CampaignResult`;
* :mod:`~fa4verify.fuzz.drawn` -- a campaign drawn up front and run in shards (the audit's).

The targets are the target layer's (:mod:`fa4verify.targets`), the verdicts the judge core's
(:mod:`fa4verify.judge`); this package re-exports every name its callers import.

Every property runs on an :class:`~fa4verify.problem.AttentionProblem` against a
*target*: the CPU twin of FA4 (``"twin"``, figures labelled "CPU twin") or production FA4 on a
GPU (``"production"``, "measured on <GPU> (sm_XY)"). The truth is the certified oracle
``fa4verify.oracles.attention`` and the tolerance the composed end-to-end error budget
``fa4verify.error_budgets.load(dtype, arch)``.

The properties are listed in :mod:`fa4verify.fuzz.properties`; Note [Fuzz cases are replayable]
is in :mod:`fa4verify.fuzz.cases`.
"""
from __future__ import annotations

from fa4verify.problem import AttentionProblem
from fa4verify.fuzz.campaign import CAMPAIGN_FORMAT, CampaignResult, _jsonable, _Stop, run_campaign
from fa4verify.fuzz.cases import (CASE_FORMAT, ReplayOutcome, _versions, load_case, regression_snippet,
                                  replay_case, write_case)
from fa4verify.fuzz.drawn import draw_problems, merge_drawn, run_drawn
from fa4verify.fuzz.known_issues import (KNOWN_ISSUES, KnownIssue, _sink_overflow, _sink_overflow_rows,
                                         _sm90_bwd_compile, _sm90_dq_accum, _sm90_gqa_dkdv_accum, _token_bounds,
                                         match_known_issue)
from fa4verify.fuzz.profiles import (_LIMITS, DEFAULT_CACHE_DIR, PROFILES, profile_limits, profile_name,
                                     register_profiles)
from fa4verify.fuzz.properties import (_FMT_MAX, PROPERTIES, CheckOutcome, _budget, _check_finite, _compare,
                                       _oracle_forward, _run_target, _unseen_keys,
                                       check_problem)
from fa4verify.fuzz.violation import _ABSORB, Violation, _fail, _where_str
from fa4verify.targets import Bwd, Fwd, ProductionTarget, Target, TwinTarget, make_target

__all__ = [
    "PROPERTIES", "PROFILES", "CASE_FORMAT", "CAMPAIGN_FORMAT", "Violation", "Target", "TwinTarget", "ProductionTarget", "make_target", "check_problem",
    "CampaignResult", "run_campaign", "write_case", "load_case", "replay_case", "regression_snippet",
    "register_profiles", "DEFAULT_CACHE_DIR", "profile_limits", "profile_name", "KnownIssue", "KNOWN_ISSUES",
    "match_known_issue", "draw_problems", "run_drawn", "merge_drawn", "ReplayOutcome", "CheckOutcome", "AttentionProblem", "Fwd", "Bwd",
]
