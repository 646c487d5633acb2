"""Who raised an exception: FA4 or fa4verify (Note [Blame]).

Note [Blame]
------------
A verdict about FA4 is earned only by FA4. When a call into FA4 raises, the traceback says who
raised it: the deepest frame that belongs either to FA4 (a file under a ``flash_attn`` package
directory: ``flash_attn/cute/interface.py`` and the kernels it compiles) or to fa4verify (the
``fa4verify`` package and the directories it installs as ``fa4verify.kernels``,
``fa4verify.oracles``, ``fa4verify.error_budgets``) decides. Frames of neither (torch, the CuTe
DSL, numpy) are passed through: an assertion of the DSL reached from FA4's interface is FA4's; a
``torch.from_numpy`` failure while fa4verify builds the arguments is fa4verify's; a ``TypeError``
for a keyword the installed FA4 does not take is raised at the call site, in fa4verify's adapter,
so it is fa4verify's (the adapter should not have passed it: it reads FA4's signatures,
``fa4verify.kernels.adapter.UnsupportedByRelease``). A traceback with neither is fa4verify's: its
own code made the call. One exception: an asynchronous device fault (``CUDA error: an illegal
memory access`` and the like, :func:`device_fault`) surfaces at whatever synchronises next --
often fa4verify's copy of FA4's output -- so it is FA4's wherever it surfaces (the calls judged
here launch no kernel of fa4verify's own; out-of-memory is not a fault).

The consequences, everywhere a call into FA4 is judged:

* ``"FA4 rejected the call"`` only for FA4's own refusals (:func:`fa4_refusal`: an assertion,
  ``ValueError``, ``TypeError`` or ``NotImplementedError`` raised in FA4, the last two by a
  ``raise`` statement: a ``TypeError`` of an operation that failed inside FA4's code -- a subscript
  of an int while it traces a kernel -- is a crash, FA4's failure, not a refusal;
  :func:`deliberate`);
* an exception of fa4verify (:func:`origin` is ``"fa4verify"``) is an ``error`` of the check
  that made the call, never a FAIL and never a finding about FA4
  (:class:`fa4verify.errors.HarnessError` carries it through the judge);
* a feature the installed FA4 release cannot express (its function takes no such keyword) is
  ``"unsupported by this FA4 release"``, named (``UnsupportedByRelease``).
"""
from __future__ import annotations

import functools
import os
from typing import Optional

__all__ = ["FA4", "FA4VERIFY", "origin", "fa4_refusal", "deliberate", "device_fault", "describe", "path_owner",
           "report_blame"]

FA4 = "fa4"
FA4VERIFY = "fa4verify"

#: exception types with which FA4 refuses a call it does not support (its asserts, its argument
#: checks); raised by FA4 they are "FA4 rejected the call", not a crash
REFUSAL_TYPES = (AssertionError, NotImplementedError, TypeError, ValueError)


@functools.lru_cache(maxsize=1)
def _own_roots() -> tuple[str, ...]:
    import fa4verify
    roots = {os.path.dirname(os.path.abspath(fa4verify.__file__))}
    for sub in ("kernels", "oracles", "error_budgets"):
        try:
            mod = __import__(f"fa4verify.{sub}", fromlist=["__file__"])
            f = getattr(mod, "__file__", None)
            if f:
                roots.add(os.path.dirname(os.path.abspath(f)))
        except Exception:  # noqa: BLE001 - a missing subpackage has no frames to attribute
            pass
    return tuple(sorted(r + os.sep for r in roots))


def _frame_owner(filename: str) -> Optional[str]:
    path = os.path.abspath(filename)
    parts = path.split(os.sep)
    if "flash_attn" in parts[:-1]:
        return FA4
    if any(path.startswith(r) for r in _own_roots()):
        return FA4VERIFY
    return None


def device_fault(exc: BaseException) -> bool:
    """An asynchronous device fault reported by the CUDA runtime (not an out-of-memory)."""
    msg = str(exc)
    return ("CUDA error" in msg or type(exc).__name__ == "AcceleratorError") and "out of memory" not in msg


def origin(exc: BaseException) -> str:
    """``"fa4"`` when the deepest FA4-or-fa4verify frame of ``exc``'s traceback is FA4's (or
    ``exc`` is a :func:`device_fault`), else ``"fa4verify"`` (Note [Blame]). An exception that
    FA4 chained from another keeps its own traceback: the frame that raised *this* exception
    decides."""
    if device_fault(exc):
        return FA4
    owner = None
    tb = exc.__traceback__
    while tb is not None:
        o = _frame_owner(tb.tb_frame.f_code.co_filename)
        if o is not None:
            owner = o
        tb = tb.tb_next
    return owner or FA4VERIFY


def deliberate(exc: BaseException) -> bool:
    """Whether ``exc`` was raised on purpose by FA4: an assertion or ``NotImplementedError``, or a
    ``raise`` statement in FA4's own code as the innermost frame (its argument checks). Not: an
    operation that failed in FA4's code (``x[0]`` of an int, a call with wrong arguments), or a
    ``raise`` of a library FA4 called with what it cannot take (the CuTe DSL refusing a layout
    while FA4 traces a kernel): crashes. A frame whose source cannot be read counts as
    deliberate. (A ``raise`` whose message formatting fails counts as deliberate too.)"""
    if isinstance(exc, (AssertionError, NotImplementedError)):
        return True
    import linecache
    tb = exc.__traceback__
    if tb is None:
        return True
    while tb.tb_next is not None:
        tb = tb.tb_next
    path = tb.tb_frame.f_code.co_filename
    line = linecache.getline(path, tb.tb_lineno).strip()
    if not line:
        return True
    return _frame_owner(path) == FA4 and (line.startswith(("raise", "assert")) or " raise " in f" {line} ")


def fa4_refusal(exc: BaseException) -> bool:
    """FA4's own refusal of a call: a refusal type (:data:`REFUSAL_TYPES`) raised in FA4, on purpose
    (:func:`deliberate`)."""
    return isinstance(exc, REFUSAL_TYPES) and origin(exc) == FA4 and deliberate(exc)


def describe(exc: BaseException) -> str:
    """``"<who>: <type>: <message>"`` with who = "raised in FA4" / "raised in fa4verify's own call"."""
    who = "raised in FA4" if origin(exc) == FA4 else "raised in fa4verify's own call"
    return f"{who}: {type(exc).__name__}: {exc}"


# Note [Blame of a report row]
# ----------------------------
# A report read on another machine (the release table, ``scripts/release_table.py``) has no
# exception object, only a row: its status, summary and, for a crashed check, the formatted
# traceback. :func:`report_blame` applies Note [Blame] to that row:
#
# * ``fail`` is FA4's: only FA4 earns a FAIL (fa4verify's own exceptions are errors) -- with the
#   row's ``where`` saying on what evidence: a CPU-twin FAIL is FA4's algorithm as the twin models
#   it; a FAIL "where" is "CPU" is about fa4verify's own data or arithmetic (budget files, oracles,
#   the twin's assumptions about the installed release: README's label table), so fa4verify's;
#   a coverage FAIL with holes from planned rows the installed release refuses ("refused: FA4
#   rejected the call") is fa4verify's for those holes: its feature space admitted what this
#   release does not (H200, 4.0.0b30: a block-sparse rule of that release); any property violated
#   in the same row stays FA4's, so such a row names both;
# * ``error``: a device fault is FA4's wherever it surfaced; a task killed at its deadline or lost
#   with its worker is undetermined (a hung or crashed FA4 kernel, or a harness too slow for its
#   deadline); a check saying that fa4verify's own call failed is fa4verify's; otherwise the
#   deepest frame of the traceback whose path is FA4's or fa4verify's decides
#   (:func:`path_owner`), and a traceback with neither is fa4verify's;
# * ``undecided`` is nobody's finding: no verdict (the summary says what is unknown);
# * ``pass`` and ``skip``: nothing to blame.

#: directories that hold fa4verify's code in a checkout or an install (``kernels/``, ``oracles/``,
#: ``error_budgets/`` install as ``fa4verify.*``)
_OWN_DIRS = ("fa4verify", "kernels", "oracles", "error_budgets")


def path_owner(filename: str) -> Optional[str]:
    """The owner of a source file named in a traceback from any machine, by its path alone:
    ``"fa4"`` under a ``flash_attn`` directory, ``"fa4verify"`` under one of :data:`_OWN_DIRS`
    (outside ``site-packages`` of other distributions), else None (torch, the DSL, numpy)."""
    parts = filename.replace("\\", "/").split("/")[:-1]
    if "flash_attn" in parts:
        return FA4
    if "fa4verify" in parts:
        return FA4VERIFY
    if any(p in _OWN_DIRS for p in parts) and "site-packages" not in parts and "dist-packages" not in parts:
        return FA4VERIFY
    return None


def _traceback_owner(text: str) -> Optional[str]:
    import re
    owner = None
    for m in re.finditer(r'File "([^"]+)", line \d+', text or ""):
        o = path_owner(m.group(1))
        if o is not None:
            owner = o
    return owner


def report_blame(row: dict) -> str:
    """Who is to blame for one result row of a JSON audit report (Note [Blame of a report row]):
    ``"FA4"`` (or ``"FA4 (as the CPU twin models it)"``), ``"fa4verify"``, ``"undetermined: <why>"``,
    ``"no verdict"`` or ``"-"``."""
    status = row.get("status")
    if status == "fail":
        where = str(row.get("where") or "")
        if where == "CPU":
            return "fa4verify"
        fa4 = "FA4 (as the CPU twin models it)" if where == "CPU twin" else "FA4"
        summary = str(row.get("summary") or "")
        if "HOLE" in summary and "refused: FA4 rejected the call" in summary:
            own = "fa4verify (holes: planned rows this FA4 release refuses)"
            return f"{fa4} (violation) and {own}" if " violated, shrunk to " in summary else own
        return fa4
    if status == "undecided":
        return "no verdict"
    if status != "error":
        return "-"
    summary = str(row.get("summary") or "")
    tb = str((row.get("details") or {}).get("traceback") or "")
    if device_fault(Exception(summary)) or device_fault(Exception(tb.strip().splitlines()[-1] if tb.strip() else "")):
        return "FA4"
    if "did not finish in" in summary or "lost with its worker" in summary:
        return "undetermined: killed at its deadline or lost with its worker (a hung FA4 kernel or a slow harness)"
    if "fa4verify's own call failed" in summary or "adapter cannot drive this FA4 release" in summary:
        return "fa4verify"
    return "FA4" if _traceback_owner(tb) == FA4 else "fa4verify"
