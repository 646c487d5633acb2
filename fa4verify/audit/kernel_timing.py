"""Where a worker's seconds go: FA4 kernel compiles, loads from FA4's disk cache, the rest.

:func:`install` wraps every ``compile_cache`` FA4's interface module keeps (the module comes
from :func:`fa4verify.kernels.adapter.interface_module`, the one importer of FA4 for production
kernels) (``get_jit_cache``
objects on ``_flash_attn_fwd``, ``_flash_attn_bwd``, ``_bwd_preprocess`` ...) in a
:class:`TimedCache` proxy that forwards every call unchanged and counts:

* a *load*: ``key in cache`` that was not in memory and FA4 then found on disk (its
  ``__contains__`` loads the entry; the seconds of that call);
* a *compile*: ``key in cache`` false, then ``cache[key] = fn`` -- FA4 compiles between the two,
  so the seconds from the miss to the store are the compile's (plus the export to disk);
* a *hit*: ``key in cache`` true from memory.

The proxy never changes what FA4 computes: it holds the original cache object and forwards
``__contains__``, ``__getitem__``, ``__setitem__`` and every other attribute to it. It is the
judge's instrument (:mod:`fa4verify.audit.worker` installs it in each worker process), never the
subject's code. :func:`snapshot` returns the counters; a worker reports the difference per check.
"""
from __future__ import annotations

import threading
import time
from typing import Any

__all__ = ["TimedCache", "install", "snapshot", "delta", "installed", "events_since", "key_digest"]

_lock = threading.Lock()
_counters: dict[str, float] = {"compiles": 0, "compile_s": 0.0, "compile_cpu_s": 0.0, "loads": 0, "load_s": 0.0,
                               "hits": 0, "events": 0, "used": 0}
_installed: list[str] = []
#: one entry per compile or disk load, in order: [kind, cache name, key digest, seconds, key text]
#: (Note [Compile keys in the timeline]); the key text only for compiles (what differs between
#: two compiles is read from it), cut to KEY_TEXT_CHARS
_events: list[list[Any]] = []
KEY_TEXT_CHARS = 600
#: every lookup's (cache name, key digest), in order: which kernels a piece of work used, hits
#: included (:func:`keys_used_since`)
_used: list[tuple[str, str]] = []


def key_digest(key: Any) -> str:
    """A digest of an FA4 compile key equal in every process: ``repr`` of the key's tuple
    (dtypes, bools, ints, hashes of mods -- no object addresses in FA4's keys), sha256, 12 hex."""
    import hashlib
    return hashlib.sha256(repr(key).encode()).hexdigest()[:12]


def _event(kind: str, cache: str, key: Any, seconds: float) -> None:
    text = repr(key)[:KEY_TEXT_CHARS] if kind == "compile" else ""
    with _lock:
        _events.append([kind, cache, key_digest(key), round(seconds, 3), text])
        _counters["events"] = len(_events)


def _bump(**kv: float) -> None:
    with _lock:
        for k, v in kv.items():
            _counters[k] = _counters.get(k, 0) + v


class TimedCache:
    """A counting proxy for one of FA4's compile caches (see the module docstring)."""

    def __init__(self, inner: Any, name: str) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_miss_t", {})
        object.__setattr__(self, "_memory", set())

    def __contains__(self, key: Any) -> bool:
        dg = key_digest(key)
        with _lock:
            _used.append((self._name, dg))
            _counters["used"] = len(_used)
        known = key in self._memory
        t0 = time.perf_counter()
        found = key in self._inner
        dt = time.perf_counter() - t0
        if found and known:
            _bump(hits=1)
        elif found:
            self._memory.add(key)
            # the first lookup of a key FA4 already held in memory (compiled before install)
            # is cheap; a disk load is not: count a load only when the call took measurable time
            if dt > 1e-3:
                _bump(loads=1, load_s=dt)
                _event("load", self._name, key, dt)
            else:
                _bump(hits=1)
        else:
            self._miss_t[key] = (time.perf_counter(), time.process_time())
        return found

    def __getitem__(self, key: Any) -> Any:
        return self._inner[key]

    def __setitem__(self, key: Any, fn: Any) -> None:
        t_miss = self._miss_t.pop(key, None)
        self._inner[key] = fn
        self._memory.add(key)
        if t_miss is not None:
            dt = time.perf_counter() - t_miss[0]
            _bump(compiles=1, compile_s=dt, compile_cpu_s=time.process_time() - t_miss[1])
            _event("compile", self._name, key, dt)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)

    def __len__(self) -> int:
        return len(self._inner)

    def clear(self) -> None:
        """Forwarded (``fa4verify.kernels.adapter.clear_compile_caches``); what was in memory is
        forgotten, so the next lookup counts as a load or a compile again."""
        self._memory.clear()
        self._miss_t.clear()
        self._inner.clear()


def install(*, import_fa4: bool = True) -> list[str]:
    """Wrap the compile caches of ``flash_attn.cute.interface`` (idempotent). Returns the names
    of the wrapped caches; [] when FA4 is not importable, or (``import_fa4=False``) not imported
    yet -- a worker that runs only CPU checks never pays FA4's import for the instrument."""
    import sys
    with _lock:
        if _installed:
            return list(_installed)
    if not import_fa4 and "flash_attn.cute.interface" not in sys.modules:
        return []
    try:
        from fa4verify.kernels.adapter import interface_module
        fa = interface_module()
    except Exception:   # noqa: BLE001 - no FA4 here: nothing to time
        return []
    names = []
    for name in sorted(vars(fa)):
        obj = getattr(fa, name)
        cache = getattr(obj, "compile_cache", None) if callable(obj) else None
        if cache is None or isinstance(cache, TimedCache):
            continue
        if not all(hasattr(cache, m) for m in ("__contains__", "__getitem__", "__setitem__")):
            continue
        try:
            obj.compile_cache = TimedCache(cache, name)
        except (AttributeError, TypeError):
            continue
        names.append(name)
    with _lock:
        _installed[:] = names
    return names


def installed() -> list[str]:
    with _lock:
        return list(_installed)


def snapshot() -> dict[str, float]:
    with _lock:
        return dict(_counters)


def delta(before: dict[str, float], after: dict[str, float] | None = None) -> dict[str, float]:
    """``after - before`` per counter (``after`` defaults to now), seconds rounded to ms."""
    after = snapshot() if after is None else after
    out = {}
    for k in _counters:
        if k in ("events", "used"):
            continue
        v = after.get(k, 0) - before.get(k, 0)
        out[k] = round(v, 3) if k.endswith("_s") else int(v)
    return out


def keys_used_since(before: dict[str, float]) -> list[list[str]]:
    """The distinct ``[cache, key digest]`` looked up since ``before`` (a :func:`snapshot`),
    in first-use order: the FA4 kernels a piece of work ran, whether compiled, loaded or hit."""
    with _lock:
        seen = dict.fromkeys(_used[int(before.get("used", 0)):])
    return [list(k) for k in seen]


def events_since(before: dict[str, float]) -> list[list[Any]]:
    """The compiles and loads since ``before`` (a :func:`snapshot`):
    ``[kind, cache, key digest, seconds, key text]`` each.

    Note [Compile keys in the timeline]: two work items that compile the same key (the same
    digest) in two workers compiled one kernel twice; a key compiled by one item and loaded by
    another is a saving. The audit benchmark counts both from these lists, which is how the
    sharing of keys between checks is measured, not assumed."""
    with _lock:
        return [list(e) for e in _events[int(before.get("events", 0)):]]
