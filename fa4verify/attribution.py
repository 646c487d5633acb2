"""Old name of :mod:`fa4verify.stage_budgets` (per-stage budget checks, end-to-end checks and error
attribution), kept for callers on other branches: ``fa4verify.attribution`` *is* that module
(the same module object, so attributes and monkeypatches are shared)."""
import sys

from fa4verify import stage_budgets

sys.modules[__name__] = stage_budgets
