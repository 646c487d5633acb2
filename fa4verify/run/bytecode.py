"""A bytecode cache for Python installations without bytecode that Python may not write.

Note [Bytecode cache]: every audit process -- the parent, the worker zygote, a spawned worker,
the fresh process that draws a fuzz campaign -- imports torch and FA4 (with the CuTe DSL, quack,
``torch._dynamo``: ~1,300 modules). Where the installation ships no ``.pyc`` files and Python may
not write them beside the source (``PYTHONDONTWRITEBYTECODE=1``, as in many container images, or
a read-only install), Python compiles every one of those modules from source in every process,
every run. Measured on the lent H200 (torch installed without bytecode, PYTHONDONTWRITEBYTECODE=1):
the audit parent spent ~8 s of a warm default audit in ``source_to_code``, the worker zygote's
imports took 10-18 s, each campaign's draw process 3-8 s.

So the console command (not an in-process ``main([...])``), when the installed torch has no
bytecode beside its source and Python would not write it there, points Python's
``pycache_prefix`` (``PYTHONPYCACHEPREFIX``) at ``<FA4VERIFY_CACHE_DIR or .fa4verify-cache>/pycache``
for itself and every child, and keeps imports from writing bytecode (``PYTHONDONTWRITEBYTECODE``).
The worker zygote, idle between forks, writes **checked-hash** bytecode (PEP 552) there for the
modules it imported (:func:`fill_some`; once the forks are done it also imports what the workers
import beyond its preload, Note [Idle imports], so those are written too), the audit's parent for its own after the reports are
written (at most a second a run, so a cold audit does not wait for it); every later import finds
it. Checked-hash, never the
import system's timestamp bytecode: a cache outside the source tree outlives the source it was
made from, and a planted copy of FA4 rewritten at the same path with the same size and mtime
(a one-character fault, files copied with their mtimes) would otherwise run the previous copy's
bytecode. A hash mismatch makes Python compile the source again. Nothing is ever written beside a
source. ``FA4VERIFY_BYTECODE_CACHE=off`` leaves Python's settings untouched, and a user's own
``PYTHONPYCACHEPREFIX`` is kept.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from typing import Callable, Optional

__all__ = ["active", "enable", "needs_cache", "missing", "fill_some", "PROBE_PACKAGE", "SWITCH", "OURS"]

#: the package whose installation decides (the largest import of every audit process)
PROBE_PACKAGE = "torch"
#: ``off`` leaves Python's bytecode settings as they are
SWITCH = "FA4VERIFY_BYTECODE_CACHE"
#: the prefix :func:`enable` set (children inherit it): the only one :func:`fill_some` fills
OURS = "FA4VERIFY_PYCACHE"


def needs_cache(package: str = PROBE_PACKAGE, *,
                writable: Callable[[str], bool] = lambda d: os.access(d, os.W_OK)) -> Optional[str]:
    """Why ``package`` needs a bytecode cache elsewhere (one line), or None: it is not installed,
    its bytecode is there, or Python writes it there itself. Never imports the package."""
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
    where = os.path.dirname(origin)
    if sys.dont_write_bytecode or os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return f"{package} at {where} has no bytecode and Python is told not to write it there"
    d = os.path.dirname(pyc)
    target = d if os.path.isdir(d) else os.path.dirname(d)   # __pycache__, or where it would go
    if writable(target):
        return None
    return f"{package} at {where} has no bytecode and {target} is not writable"


def enable(base: Optional[str] = None, *, package: str = PROBE_PACKAGE,
           writable: Callable[[str], bool] = lambda d: os.access(d, os.W_OK)) -> Optional[str]:
    """Note [Bytecode cache]: point this process's and its children's bytecode at fa4verify's
    cache when :func:`needs_cache` (imports then read it and write nothing); returns the prefix,
    or None when nothing was changed."""
    env = os.environ
    if (env.get(SWITCH, "").strip().lower() in ("off", "0", "no", "false")
            or env.get("PYTHONPYCACHEPREFIX") or sys.pycache_prefix):
        return None
    if needs_cache(package, writable=writable) is None:
        return None
    if base is None:
        from fa4verify._options import cache_base
        base = cache_base()
    prefix = os.path.abspath(os.path.join(base, "pycache"))
    try:
        os.makedirs(prefix, exist_ok=True)
    except OSError:
        return None
    if not writable(prefix):
        return None
    sys.pycache_prefix = prefix
    sys.dont_write_bytecode = True           # only :func:`fill_some` writes, checked-hash
    env["PYTHONPYCACHEPREFIX"] = env[OURS] = prefix
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return prefix


def active() -> bool:
    """Whether this process reads bytecode from the prefix :func:`enable` set (and only then
    writes any: never beside a source, nor into a prefix of the user's own)."""
    return bool(sys.pycache_prefix) and os.environ.get(OURS) == sys.pycache_prefix


def missing() -> list[str]:
    """The sources of this process's imported modules with no bytecode under the prefix (none
    unless :func:`active`)."""
    if not active():
        return []
    out = []
    for m in list(sys.modules.values()):
        f = getattr(m, "__file__", None)
        if not isinstance(f, str) or not f.endswith(".py"):
            continue
        try:
            if os.path.exists(f) and not os.path.exists(importlib.util.cache_from_source(f)):
                out.append(f)
        except (ValueError, OSError):
            continue
    return sorted(set(out))


def fill_some(pending: list[str], n: int = 25, seconds: Optional[float] = None) -> int:
    """Write checked-hash bytecode under the prefix for up to ``n`` of ``pending`` (popped), for
    at most about ``seconds``; the number written. A source that does not compile is skipped (its
    import compiles it)."""
    import py_compile
    import time
    done, end = 0, None if seconds is None else time.monotonic() + seconds
    while pending and done < n and (end is None or time.monotonic() < end):
        f = pending.pop()
        try:
            py_compile.compile(f, cfile=importlib.util.cache_from_source(f), doraise=True, quiet=2,
                               invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
            done += 1
        except (py_compile.PyCompileError, OSError, ValueError, SyntaxError):
            continue
    return done
