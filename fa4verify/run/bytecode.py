"""A bytecode cache for Python installations fa4verify cannot write to.

Note [Bytecode cache]: every audit process -- the parent, the worker zygote, a spawned worker,
the fresh process that draws a fuzz campaign -- imports torch and FA4 (with the CuTe DSL, quack,
``torch._dynamo``: ~1,300 modules). Where the installation ships no ``.pyc`` files and its
``__pycache__`` directories cannot be written (a read-only image, a shared environment), Python
compiles every one of those modules from source in every process, every run. Measured on the lent
H200 (torch installed read-only without bytecode): the audit parent spent ~8 s in
``source_to_code``, the zygote's imports took 12-18 s, and each campaign's draw process ~8 s.

So, at the start of a command, when the installed torch has no bytecode next to its source and
that directory is not writable, fa4verify points Python's ``pycache_prefix`` (PEP 3147 / Python
3.8's ``PYTHONPYCACHEPREFIX``) at ``<FA4VERIFY_CACHE_DIR or .fa4verify-cache>/pycache``: this
process from then on, and every child through the environment. The first run writes the bytecode
there, later runs read it. Nothing changes what runs (bytecode is a cache of the same source; Python
recompiles when a source's size or mtime changes), and a user's own choice wins: nothing is set
when ``PYTHONDONTWRITEBYTECODE`` or ``PYTHONPYCACHEPREFIX`` is set, or torch's bytecode is there.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from typing import Callable, Optional

__all__ = ["enable", "needs_cache", "PROBE_PACKAGE"]

#: the package whose installation decides (the largest import of every audit process)
PROBE_PACKAGE = "torch"


def needs_cache(package: str = PROBE_PACKAGE, *,
                writable: Callable[[str], bool] = lambda d: os.access(d, os.W_OK)) -> Optional[str]:
    """Why ``package`` needs a bytecode cache elsewhere (one line), or None: it is not installed,
    its bytecode is there, or Python may write it there. Never imports the package."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None) if spec is not None else None
    if not origin or not origin.endswith(".py"):
        return None
    pyc = importlib.util.cache_from_source(origin)     # honours a prefix already in effect
    if os.path.exists(pyc):
        return None
    d = os.path.dirname(pyc)
    target = d if os.path.isdir(d) else os.path.dirname(d)   # __pycache__, or where it would go
    if writable(target):
        return None
    return f"{package} at {os.path.dirname(origin)} has no bytecode and {target} is not writable"


def enable(base: Optional[str] = None, *, package: str = PROBE_PACKAGE,
           writable: Callable[[str], bool] = lambda d: os.access(d, os.W_OK)) -> Optional[str]:
    """Note [Bytecode cache]: set this process's and its children's bytecode prefix when
    :func:`needs_cache`; returns the prefix, or None when nothing was set."""
    env = os.environ
    if (sys.dont_write_bytecode or env.get("PYTHONDONTWRITEBYTECODE")
            or env.get("PYTHONPYCACHEPREFIX") or sys.pycache_prefix):
        return None
    if needs_cache(package, writable=writable) is None:
        return None
    base = base or (env.get("FA4VERIFY_CACHE_DIR", "").strip() or ".fa4verify-cache")
    prefix = os.path.abspath(os.path.join(base, "pycache"))
    try:
        os.makedirs(prefix, exist_ok=True)
    except OSError:
        return None
    if not writable(prefix):
        return None
    sys.pycache_prefix = prefix
    env["PYTHONPYCACHEPREFIX"] = prefix
    return prefix
