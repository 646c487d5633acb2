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
  ``ValueError``, ``TypeError`` or ``NotImplementedError`` raised in FA4);
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

__all__ = ["FA4", "FA4VERIFY", "origin", "fa4_refusal", "device_fault", "describe"]

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


def fa4_refusal(exc: BaseException) -> bool:
    """FA4's own refusal of a call: a refusal type (:data:`REFUSAL_TYPES`) raised in FA4."""
    return isinstance(exc, REFUSAL_TYPES) and origin(exc) == FA4


def describe(exc: BaseException) -> str:
    """``"<who>: <type>: <message>"`` with who = "raised in FA4" / "raised in fa4verify's own call"."""
    who = "raised in FA4" if origin(exc) == FA4 else "raised in fa4verify's own call"
    return f"{who}: {type(exc).__name__}: {exc}"
