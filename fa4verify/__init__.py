"""fa4verify: numerical-accuracy verification for FlashAttention-4 (flash_attn.cute).

Public API (the names in :data:`__all__`, each the very object of its home module, so
``inspect.signature`` shows its real parameters):

* :func:`assert_attention_within_budget`, :class:`GateSummary` -- the gate for your own tests
  (:mod:`fa4verify.gates`);
* :func:`compare`, :class:`Verdict`, :class:`UndecidedError`, :class:`BudgetStats` -- the one
  judge (:mod:`fa4verify.judge`): ``pass | fail | undecided``;
* :class:`AttentionProblem` -- what is judged: one attention call as plain data
  (:mod:`fa4verify.problem`, no Hypothesis import);
* :func:`register_mod_pair`, :class:`ModPair` -- your own FA4 score_mod / mask_mod with its
  float64 reference, judged like the built-in pairs (:mod:`fa4verify.mods`).

Importing this package is light: no numpy, torch, cutlass or flash_attn import happens here; each
public name is imported from its home module on first access (PEP 562 ``__getattr__``).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: public name -> home module
_HOME: dict[str, str] = {
    "assert_attention_within_budget": "fa4verify.gates",
    "GateSummary": "fa4verify.gates",
    "UndecidedError": "fa4verify.judge.verdict",
    "Verdict": "fa4verify.judge.verdict",
    "compare": "fa4verify.judge.verdict",
    "BudgetStats": "fa4verify.judge.stats",
    "AttentionProblem": "fa4verify.problem",
    "register_mod_pair": "fa4verify.mods",
    "ModPair": "fa4verify.mods",
}

__all__ = ["__version__", *_HOME]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from fa4verify.problem import AttentionProblem
    from fa4verify.gates import GateSummary, assert_attention_within_budget
    from fa4verify.judge.stats import BudgetStats
    from fa4verify.judge.verdict import UndecidedError, Verdict, compare


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'fa4verify' has no attribute {name!r}")
    obj = getattr(importlib.import_module(home), name)
    globals()[name] = obj          # later accesses skip __getattr__
    return obj


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
