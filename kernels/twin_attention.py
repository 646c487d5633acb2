"""Thin re-export of :mod:`fa4verify.kernels.twin.attention` (the twin became a package, issue #18).

Kept only for imports written before the move; code inside fa4verify imports
``fa4verify.kernels.twin.attention``.  Every attribute (private ones too, through the module
``__getattr__``) is the package module's own object.
"""
from fa4verify.kernels.twin import attention as _impl
from fa4verify.kernels.twin.attention import *  # noqa: F401,F403


def __getattr__(name: str):
    return getattr(_impl, name)


__all__ = list(_impl.__all__)
