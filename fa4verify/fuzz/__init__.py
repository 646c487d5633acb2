"""Property-based fuzzing of FA4 attention, one concept per module:

* :mod:`~fa4verify.fuzz.properties` -- the properties and :func:`check_problem` (one problem, one target);
* :mod:`~fa4verify.fuzz.violation` -- :class:`Violation` and the known-issue absorb hook;
* :mod:`~fa4verify.fuzz.known_issues` -- documented FA4 issues and their predicates;
* :mod:`~fa4verify.fuzz.cases` -- replayable JSON cases and regression snippets;
* :mod:`~fa4verify.fuzz.profiles` -- Hypothesis profiles and size limits;
* :mod:`~fa4verify.fuzz.campaign` -- :func:`run_campaign` and :class:`CampaignResult`.

The targets are the target layer's (:mod:`fa4verify.targets`), the verdicts the judge core's
(:mod:`fa4verify.judge`); this package re-exports every name its callers import.

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

from fa4verify._strategies.problem import AttentionProblem
from fa4verify.fuzz.campaign import CAMPAIGN_FORMAT, CampaignResult, _jsonable, _Stop, run_campaign
from fa4verify.fuzz.cases import (CASE_FORMAT, ReplayOutcome, _versions, load_case, regression_snippet,
                                  replay_case, write_case)
from fa4verify.fuzz.known_issues import (KNOWN_ISSUES, KnownIssue, _sink_overflow, _sink_overflow_rows,
                                         _sm90_bwd_compile, _sm90_dq_accum, _sm90_gqa_dkdv_accum, _token_bounds,
                                         match_known_issue)
from fa4verify.fuzz.profiles import (_LIMITS, DEFAULT_CACHE_DIR, PROFILES, profile_limits, profile_name,
                                     register_profiles)
from fa4verify.fuzz.properties import (_FMT_MAX, PROPERTIES, CheckOutcome, _budget, _check_finite, _compare,
                                       _oracle_backward, _oracle_forward, _run_target, _unseen_keys,
                                       check_problem)
from fa4verify.fuzz.violation import _ABSORB, Violation, _fail, _where_str
from fa4verify.targets import (Bwd, DependencyMissing, Fwd, ProductionTarget, Target, TwinTarget, Unsupported,
                               make_target)

__all__ = [
    "PROPERTIES", "PROFILES", "CASE_FORMAT", "CAMPAIGN_FORMAT", "Violation", "Unsupported",
    "DependencyMissing", "Target", "TwinTarget", "ProductionTarget", "make_target", "check_problem",
    "CampaignResult", "run_campaign", "write_case", "load_case", "replay_case", "regression_snippet",
    "register_profiles", "DEFAULT_CACHE_DIR", "profile_limits", "profile_name", "KnownIssue", "KNOWN_ISSUES",
    "match_known_issue", "ReplayOutcome", "CheckOutcome", "AttentionProblem", "Fwd", "Bwd",
]
