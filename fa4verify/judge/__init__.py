"""The judge core: one comparison, one statistics producer (the problem type it judges is
:class:`fa4verify.problem.AttentionProblem`).

* :mod:`fa4verify.judge.verdict` -- :func:`compare` (``|actual - ref| <= oracle_bound + budget``,
  verdict ``pass | fail | undecided``), :class:`Verdict`, :class:`UndecidedError`, and
  :class:`StreamedCompare` (the same policy over slabs of torch tensors on a device: the
  long-context judge);
* :mod:`fa4verify.judge.stats` -- :class:`BudgetStats`, the composed budgets' statistics;
* :mod:`fa4verify.judge.attention` -- oracle + budgets + compare for forward and backward outputs
  of an :class:`~fa4verify.problem.AttentionProblem`.

Audit checks, the public gate, fuzz properties, mutant verifiers and attribution all call these;
no other module of fa4verify compares a kernel output with an oracle under a budget.
"""
from fa4verify.judge.attention import (BackwardJudgement, ForwardJudgement, Reference, arrays_from,
                                       dense_problem, effective_inputs, forward_allowances, judge_backward,
                                       judge_forward, load_budgets, oracle_backward, oracle_backwards, oracle_forward,
                                       oracle_pass, tie_mla)
from fa4verify.judge.stats import BudgetStats
from fa4verify.judge.verdict import BLIND_FLOOR, STATUSES, Element, UndecidedError, Verdict, combine, compare, worst_status

__all__ = ["BudgetStats", "Verdict", "Element", "UndecidedError", "STATUSES", "BLIND_FLOOR", "compare",
           "combine", "worst_status", "Reference", "ForwardJudgement", "BackwardJudgement", "dense_problem",
           "arrays_from", "oracle_forward", "oracle_backward", "oracle_backwards", "oracle_pass", "forward_allowances", "judge_forward",
           "judge_backward", "load_budgets", "tie_mla", "effective_inputs"]
