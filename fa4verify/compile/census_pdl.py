"""Static evidence that every kernel FA4's backward launches with programmatic dependent launch
waits for its predecessor (compile-only, no GPU).

A kernel launched with PDL may start while the kernel before it on its stream is still running
(Note [Early trigger], ``kernels/pdl_producer.py``); it must execute ``griddepcontrol.wait``
before it reads what that kernel wrote. Which of FA4's backward kernels are launched with PDL is
read from FA4's source (:func:`fa4verify.races.pdl_in_source`: ``use_pdl=`` in the launch); each
such kernel's compiled PTX must contain ``griddepcontrol.wait``. This is a necessary condition,
checked without timing: it catches a wait that was dropped (the planted
``bwd_preprocess_pdl_wait_dropped`` and ``bwd_sm90_lse_pdl_wait_dropped`` of
``fa4verify.races.RACE_MUTANTS``, which no GPU run has caught by timing); it does not prove that
the wait comes before every read (``races.production`` judges that on the GPU).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PdlRow", "pdl_rows", "kernel_module"]


def kernel_module(name: str) -> str:
    """FA4's source file of a dumped kernel (``...flash_attncuteflash_bwd_sm90FlashAttention...``
    -> ``flash_bwd_sm90.py``), or "" when the name does not say."""
    m = re.search(r"flash_attncute(flash_[a-z0-9_]+?)(?=FlashAttention|_object|$)", name)
    return f"{m.group(1)}.py" if m else ""


@dataclass
class PdlRow:
    arch: str
    kernel: str
    module: str
    pdl: bool                 #: launched with PDL (FA4's source)
    waits: int                #: griddepcontrol.wait sites in its PTX
    triggers: int             #: griddepcontrol.launch_dependents sites
    status: str = field(init=False)

    def __post_init__(self) -> None:
        self.status = "fail" if (self.pdl and self.waits == 0) else "pass"

    def row(self) -> list[Any]:
        return [self.arch, self.module or self.kernel[:60], "yes" if self.pdl else "no", self.waits,
                self.triggers, self.status]


COLUMNS = ["arch", "kernel (FA4 source)", "launched with PDL", "griddepcontrol.wait", "launch_dependents",
           "verdict"]


def pdl_rows(res: Any, pdl_files: dict[str, bool]) -> list[PdlRow]:
    """One row per backward kernel of a compiled case (:class:`fa4verify.compile.census.CaseResult`)."""
    rows = []
    for k in res.kernels:
        mod = kernel_module(k.name)
        if not mod.startswith("flash_bwd"):
            continue
        ptx = k.ptx or ""
        rows.append(PdlRow(res.case.arch, k.name, mod, bool(pdl_files.get(mod, False)),
                           len(re.findall(r"\bgriddepcontrol\.wait\b", ptx)),
                           len(re.findall(r"\bgriddepcontrol\.launch_dependents\b", ptx))))
    return rows
