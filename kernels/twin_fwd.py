"""Thin re-export of :mod:`fa4verify.kernels.twin.forward` (the twin became a package, issue #18).

Kept only for imports written before the move; code inside fa4verify imports
``fa4verify.kernels.twin.forward``.  Every attribute (private ones too, through the module
``__getattr__``) is the package module's own object.
"""
from fa4verify.kernels.twin import forward as _impl
from fa4verify.kernels.twin.forward import *  # noqa: F401,F403


def __getattr__(name: str):
    return getattr(_impl, name)
