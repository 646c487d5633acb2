"""fa4verify.error_budgets -- tolerances as reviewed data (TOML) plus the loader.

``load(dtype, arch)`` returns the frozen :class:`~fa4verify.error_budgets.loader.BudgetSet` for
``dtype`` ("bf16" | "fp16" | "fp8") on ``arch`` ("sm90" | "sm100" | "sm103");
``budgets.evaluate(name, stats)`` gives the bound (absolute, elementwise on numpy arrays;
``budgets.evaluate(name, stats, TorchBackend(device))`` on torch float64 tensors).
Formulas and their derivations: ``*.toml`` and ``DERIVATIONS.md`` in this directory.
"""
from fa4verify.error_budgets.loader import (  # noqa: F401
    Budget, BudgetError, BudgetSet, CONSTANTS, STATISTICS, TorchBackend, available, budget_path, load,
    load_file,
)

__all__ = ["load", "load_file", "available", "budget_path", "Budget", "BudgetSet", "BudgetError",
           "CONSTANTS", "STATISTICS", "TorchBackend"]
