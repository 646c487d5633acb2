"""A fuzz property's failure (:class:`Violation`) and the hook through which a known FA4 issue
absorbs exactly the violation it describes (Note [Known issues absorb one violation])."""
from __future__ import annotations

import contextvars
from typing import Any, Callable, Mapping, Optional

import numpy as np

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
        #: a gradient violation's judged values (``actual``, ``allow``: oracle bound + budget, and
        #: ``ctx``: the pass's dO and dLSE), for a known issue with a model (Note [Known issues with a
        #: model], fa4verify/fuzz/defect_models.py); None otherwise
        self.judged: Optional[dict] = None
        #: per element of ``over_indices``, whether the kernel's value there is finite, where the
        #: check knew the values without judging them (a masked row's O, a bitwise comparison);
        #: None otherwise (a judged violation's values are in ``judged``)
        self.finite_values: Optional[np.ndarray] = None




def tightness_key(v: Violation) -> str:
    """The name the tightness of ``v``'s quantity is reported under (``tightness_<this>``): the
    quantity, prefixed by the ``bwd_stages`` pass that reran the backward (``dlse_dq``,
    ``autograd_dk``; :data:`fa4verify.fuzz.properties.PASSES`), so a known issue that absorbs one
    pass's violation takes only that pass's figure out of Note [Tightness outside known issues]."""
    q = str(v.metrics.get("quantity", v.prop))
    return f"{v.metrics['pass']}_{q}" if v.metrics.get("pass") else q


def replay_properties(v: Violation) -> tuple[str, ...]:
    """The properties a replay of ``v`` runs: its own, and ``bwd_stages`` where a pass of it
    reran the backward (its violations are ``bwd_budget``'s, judged only inside ``bwd_stages``)."""
    return (v.prop, "bwd_stages") if v.metrics.get("pass") and v.prop != "bwd_stages" else (v.prop,)


def _where_str(idx: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(int(i)) for i in idx) + ")"


#: Note [Known issues absorb one violation]: while a campaign runs an example, this holds the
#: function that decides whether a violation is a known issue's (it records the hit and returns
#: True); the example then goes on, so every other property and tensor is still checked.
_ABSORB: "contextvars.ContextVar[Optional[Callable[[Violation], bool]]]" = contextvars.ContextVar(
    "fa4verify_fuzz_absorb", default=None)


#: what the run of the example being judged showed about the kernel's own conduct, given to every
#: violation of that example as metrics (Note [Scratch guard] in fa4verify/kernels/stage_taps.py:
#: ``scratch_overrun``, the preprocess's writes past its buffers), so a known issue can require the
#: conduct it describes to be seen in the very call whose downstream values it absorbs
_EXAMPLE_FACTS: "contextvars.ContextVar[Optional[dict]]" = contextvars.ContextVar("fa4verify_example_facts",
                                                                                   default=None)


#: the quantities (out, dq, ...) whose violations a known issue absorbed in the example being
#: judged: the statistical tier forms no verdict on a tensor a known defect is in (the
#: ``stat_tier`` property, fa4verify/fuzz/properties.py)
_ABSORBED: "contextvars.ContextVar[Optional[set]]" = contextvars.ContextVar("fa4verify_absorbed", default=None)


def _fail(v: "Violation") -> None:
    """Raise ``v`` unless a known issue absorbs exactly this violation (Note [Known issues absorb
    one violation])."""
    facts = _EXAMPLE_FACTS.get()
    if facts:
        for k, val in facts.items():
            v.metrics.setdefault(k, val)
    absorb = _ABSORB.get()
    if absorb is not None and absorb(v):
        absorbed = _ABSORBED.get()
        if absorbed is not None:
            absorbed.add(str(v.metrics.get("quantity", v.prop)))
        return
    raise v
