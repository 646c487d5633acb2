"""The exceptions fa4verify's modules share, one class per concept.

What a run cannot do (each ends as a verdict of its own, never a pass):

* :class:`Unsupported` -- the target (the CPU twin, production FA4, a determinism backend) does not
  run this problem or configuration: counted as ``unsupported``, not failed;
* :class:`DependencyMissing` -- something the run needs is not here (a module, recorded evidence, a
  GPU): the check or verifier is reported unavailable / skipped with the reason;
* :class:`HarnessError` -- fa4verify's own call raised (Note [Blame], :mod:`fa4verify.blame`): an
  ``error`` of fa4verify, never a finding about FA4.

A user's bad input (one line, exit 2 from the command line; never a traceback):

* :class:`OptionError` -- an audit option (CLI or ``--fa4-*`` pytest option);
* :class:`DeploymentError` -- a deployment profile;
* :class:`ModPairError` -- a score_mod / mask_mod pair;
* :class:`KeywordError` -- an audit ``-k`` expression;
* :class:`ReportError` -- a report file (unreadable, corrupt or incompatible);
* :class:`OutputPathError` -- an output path that cannot or must not be written.

Not here, because they are not fa4verify's own or not shared: the subject's refusals live with the
subject, which never imports the judge (``fa4verify.kernels.adapter``: ``UnsupportedByRelease``,
``AdapterRefusal``, ``NoCudaError``, ``ReleaseInterfaceError``), as do the tolerance side's
(``fa4verify.error_budgets``: ``BudgetError``, ``InputPathError``) and the oracles'
(``ArbiterDisagreement``); the judge's :class:`~fa4verify.judge.verdict.UndecidedError` is raised
with its verdicts by the gates; the check protocol's :class:`~fa4verify.audit.registry.SkipCheck`,
the pool's ``TaskDied`` / ``PoolClosed`` and module-private control-flow exceptions stay with the
one module that raises and catches them.
"""
from __future__ import annotations

__all__ = ["Unsupported", "DependencyMissing", "HarnessError", "OptionError", "DeploymentError", "ModPairError",
           "KeywordError", "ReportError", "OutputPathError"]


# ------------------------------------------------------------------ what a run cannot do
class Unsupported(Exception):
    """The target cannot run this problem or configuration: a feature it does not model, or one
    the kernel under test rejects before running it (FA4's own refusals are told apart from
    fa4verify's errors by :func:`fa4verify.blame.fa4_refusal`)."""


class DependencyMissing(RuntimeError):
    """Something the run needs is not here: a module (the twin backward, the adapter, the CUTLASS
    DSL), recorded evidence, or a GPU. The check or verifier says so and does not run."""


class HarnessError(RuntimeError):
    """An exception raised in fa4verify's own call (the adapter, building the arguments,
    converting the results; Note [Blame], :mod:`fa4verify.blame`): an ``error`` of fa4verify,
    never a violation and never a finding about FA4. The judge passes it through; campaigns count
    it and checks report ``error`` with the count."""


# ------------------------------------------------------------------ a user's bad input
class OptionError(ValueError):
    """A bad option value; the message is one line and quotes the value."""


class DeploymentError(ValueError):
    """A malformed deployment profile (message names the file and key)."""


class ModPairError(ValueError):
    """A malformed or unknown mod pair (one-line message)."""


class KeywordError(ValueError):
    """A malformed ``-k`` expression."""


class ReportError(ValueError):
    """An unreadable, corrupt or incompatible report (one-line message)."""


class OutputPathError(OSError):
    """An output path that cannot or must not be written (one-line message)."""
