"""Verifier power: a catalogue of numeric mutants of FA4 and a detection table.

What this measures
------------------
A verifier that never fails is worthless; one that fails on correct code is worse. This package
plants known numeric faults ("mutants") into the CPU twin of FA4
(``fa4verify.kernels.twin.attention``, through its ``mutations=`` parameter) and runs, side by
side, on a fixed battery of problems:

* **fa4verify** -- the checks fa4verify applies to such a fault (each a column of its own):
  ``exp2_cert`` (the exp2 emulation's certified error bound and bf16 wrong-count, for polynomial
  mutants), ``exp2_golden`` (bit-exactness of the exp2 emulation against the unmutated twin on a
  fixed input set -- the bit-exact gate fa4verify applies to probes and golden vectors),
  ``fwd_budget`` / ``bwd_budget`` (end-to-end output / gradients vs the certified oracle
  ``fa4verify.oracles.attention`` within the composed error budget, NaN locations included),
  ``stages`` (per-stage invariants of the twin's intermediate data, when the twin exposes them)
  and ``determinism`` (bitwise run-to-run and schedule-order reproducibility of the
  deterministic backward).
* **FA rule** -- FlashAttention's upstream accuracy test, reimplemented faithfully on the CPU
  (:func:`attention_ref_torch`, :func:`fa_rule`): ``max|out - ref| <= rtol * max|out_pt - ref|
  + atol``.
* **assert_close** -- ``torch.testing.assert_close`` with its defaults against the same
  fp32 reference rounded to the input dtype (bf16: rtol 1.6e-2, atol 1e-5).

A verifier *catches* a mutant when, on at least one battery problem, it passes the unmutated
twin and fails the mutant (a problem on which it fails the unmutated twin is a *false alarm*
and cannot count as a detection). Every figure here is labelled "CPU twin"; the production
column (``--target production``, run on a GPU by someone holding one) covers only faults that
FA4 lets a caller express through its public API (see :data:`PRODUCTION_KNOBS`).

Layout (one concept per module)
-------------------------------
:mod:`~fa4verify.mutants.catalogue` (the faults), :mod:`~fa4verify.mutants.problems` (the battery),
:mod:`~fa4verify.mutants.verdict` (one cell), :mod:`~fa4verify.mutants.upstream` (FA's rule and
``assert_close``, Note [Upstream rule, reimplemented]), :mod:`~fa4verify.mutants.twin_runs` (running
the mutated twin), :mod:`~fa4verify.mutants.exp2_verifiers`, :mod:`~fa4verify.mutants.columns`
(fa4verify's verifiers through the judge core, and the registry), :mod:`~fa4verify.mutants.production`
(the knob-expressed faults on FA4 itself, through the target layer), :mod:`~fa4verify.mutants.suite`
(running everything, the detection summary) and :mod:`~fa4verify.mutants.table` (rendering, JSON).
This package re-exports every name its callers import.
"""
from __future__ import annotations

from fa4verify.mutants.catalogue import (Arch, Mutant, CATALOGUE, MUTANT_NAMES, PRODUCTION_KNOBS, get_mutant)
from fa4verify.mutants.problems import (Problem, battery, ProblemData, make_inputs)
from fa4verify.mutants.verdict import (Status, Verdict, NA)
from fa4verify.mutants.upstream import (attention_ref_torch, RuleOutcome, fa_rule, upstream_bwd_applies,
                                        UpstreamRefs, upstream_refs, fa_rule_forward, fa_rule_backward,
                                        ASSERT_CLOSE_DEFAULTS, assert_close_verdict)
from fa4verify.mutants.twin_runs import (TwinOutputs, StageTally, twin_module, run_twin)
from fa4verify.mutants.exp2_verifiers import (exp2_inputs, golden_exp2, exp2_cert_inputs)
from fa4verify.mutants.columns import (ProblemEnv, load_budgets, kernel_config, OracleHead, OracleCase,
                                       oracle_case, VerifierSpec, verifiers, VERIFIERS)
from fa4verify.mutants import production  # noqa: F401  (the module: tests swap its device)
from fa4verify.mutants.production import (PRODUCTION_VERIFIERS, PRODUCTION_DEVICE, production_applies,
                                          production_arch, run_production)
from fa4verify.mutants.suite import (Row, Cell, SuiteResult, BWD_REPEATS, run_suite, uncaught, exit_code)
from fa4verify.mutants.table import (table_rows, render_rich, render_markdown, read_json, write_json)

__all__ = [
    "Mutant", "CATALOGUE", "MUTANT_NAMES", "PRODUCTION_KNOBS", "get_mutant", "Problem",
    "battery", "make_inputs", "Verdict", "attention_ref_torch", "fa_rule", "upstream_bwd_applies",
    "ASSERT_CLOSE_DEFAULTS", "assert_close_verdict", "fa_rule_forward", "fa_rule_backward",
    "run_twin", "run_production", "run_suite", "SuiteResult", "Cell", "Row", "verifiers",
    "VERIFIERS", "table_rows", "render_rich", "render_markdown", "read_json", "write_json",
    "exit_code", "uncaught",
]
