"""One cell of the detection table: a verifier's :class:`Verdict` on one (mutant, problem) (a
verifier whose dependency is missing raises :class:`fa4verify.errors.DependencyMissing`)."""
from __future__ import annotations

import dataclasses
from typing import Literal

Status = Literal["pass", "fail", "undecided", "n/a", "error"]


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One verifier's outcome on one (mutant or unmutated twin, problem).

    ``status``: "pass", "fail", "undecided" (the judge could not decide: never a catch, never a
    pass of the unmutated twin), "n/a" (the verifier does not apply here) or "error".
    ``figure``: the deciding number, ``measured / threshold`` for tolerance rules (> 1 fails),
    a count for bitwise / determinism checks (> 0 fails); ``None`` when not applicable.
    ``detail``: one line a person can act on (what was compared, with which numbers).
    """

    status: Status
    figure: float | None = None
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.status == "fail"


NA = Verdict("n/a")

