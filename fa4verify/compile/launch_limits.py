"""Launches a compiled FA4 kernel cannot make: its shared memory above the arch's per-block limit
(Note [Launch limits, compile-only]).

Note [Launch limits, compile-only]
----------------------------------
A kernel whose shared storage exceeds what a block may use on the target arch compiles, and then
CUDA rejects its launch (``cudaErrorInvalidValue``: measured on the H200 at 6f502c4, FA4's SM90
backward at head_dim < head_dim_v, known issue ``sm90_bwd_hdv_gt_hd_smem``). The CuTe DSL knows
it when it compiles: the host function of such a launch holds an unconditional
``printf("... launch shared memory exceeds current GPU arch <arch> allowed. Allocated: %lld bytes.
Max: <max> bytes.", <allocated>)`` -- the format is emitted for every launch, the call only where
the allocation is over the limit. :func:`over_limit` reads those calls from a compiled function's
host IR, so a compile-only run (``--fake-device``) names every call of the audit that would not
launch, on an arch no machine here has (B200 included).

:func:`install` hooks FA4's in-process compile cache (``cache_utils.JITCache``, which its
persistent subclass calls for compiles and disk loads alike): a compiled function is read once per
FA4 compile key (its verdict kept in this process and, with FA4's persistent kernel cache, in a
``<key hash>.launch.json`` beside the cached object, so a later process that loads the kernel from
disk knows it too), and every use of a key (``__contains__`` / ``__getitem__``: FA4 asks for its key
before each call, compile-only calls included) is counted for the call that made it. A key whose function came from the disk cache without such a record (a cache
filled before this reading existed) is counted as not read: the check says so, undecided.
"""
from __future__ import annotations

import hashlib
import json
import pickle
import re
from typing import Any, Optional

__all__ = ["over_limit", "install", "take"]

_FMT = re.compile(r'llvm\.mlir\.global internal constant @(printfFormat_\d+)\("[^"]*launch shared memory exceeds '
                  r'current GPU arch (\w+) allowed\. Allocated: %lld bytes\. Max: (\d+) bytes')

#: key hash -> [(function name, arch, allocated bytes, max bytes)] over the limit, or None (not read)
_BY_KEY: dict[str, Optional[list]] = {}
#: key hashes used since take()
_USED: set[str] = set()
_INSTALLED = False


def over_limit(ir_text: str) -> list[tuple[str, int, int]]:
    """``[(arch, allocated, max)]`` of every launch in a compiled host module's IR (its text) whose
    shared memory exceeds the arch's per-block limit (the DSL's unconditional error printf)."""
    fmts = {m.group(1): (m.group(2), int(m.group(3))) for m in _FMT.finditer(ir_text)}
    if not fmts:
        return []
    out = []
    for body in re.split(r"\n  llvm\.func ", ir_text):
        consts = dict(re.findall(r"(%\d+) = llvm\.mlir\.constant\((\d+) : i64\)", body))
        addr = {a: f for a, f in re.findall(r"(%\d+) = llvm\.mlir\.addressof @(printfFormat_\d+)", body) if f in fmts}
        gep = {g: addr[b] for g, b in re.findall(r"(%\d+) = llvm\.getelementptr (%\d+)\[", body) if b in addr}
        for ptr, val in re.findall(r"llvm\.call @printf\((%\d+), (%\d+)\)", body):
            if ptr in gep and val in consts:
                arch, mx = fmts[gep[ptr]]
                out.append((arch, int(consts[val]), mx))
    return out


def _key_hash(key: Any) -> str:
    try:
        return hashlib.sha256(pickle.dumps(key)).hexdigest()      # FA4's own (cache_utils._key_to_hash)
    except Exception:      # noqa: BLE001 - an unpicklable key: its text
        return hashlib.sha256(repr(key).encode()).hexdigest()


def _record(cache: Any, key: Any, fn: Any) -> None:
    h = _key_hash(key)
    side = getattr(cache, "cache_path", None)
    side = None if side is None else side / f"{h}.launch.json"
    ir = getattr(fn, "ir_module", None)
    if ir is not None:
        name = str(getattr(fn, "function_name", "") or type(fn).__name__)
        over = [[name, a, n, m] for a, n, m in over_limit(str(ir))]
        _BY_KEY[h] = over
        if side is not None:
            try:
                side.write_text(json.dumps(over))
            except OSError:
                pass
        return
    if h in _BY_KEY and _BY_KEY[h] is not None:
        return
    try:
        _BY_KEY[h] = json.loads(side.read_text()) if side is not None and side.exists() else None
    except (OSError, ValueError):
        _BY_KEY[h] = None


def install() -> None:
    """Hook FA4's in-process compile cache (compile-only processes only)."""
    global _INSTALLED
    if _INSTALLED:
        return
    from fa4verify.kernels.adapter import fa4_compile_cache_class
    cls = fa4_compile_cache_class()
    set_orig, get_orig, has_orig = cls.__setitem__, cls.__getitem__, cls.__contains__

    def setitem(self, key, fn):
        try:
            _record(self, key, fn)
        except Exception:      # noqa: BLE001 - reading the IR must never break a compile
            pass
        return set_orig(self, key, fn)

    def getitem(self, key):
        _USED.add(_key_hash(key))
        return get_orig(self, key)

    def contains(self, key):      # FA4 asks before each call (a compile-only call stops there)
        _USED.add(_key_hash(key))
        return has_orig(self, key)
    cls.__setitem__, cls.__getitem__, cls.__contains__ = setitem, getitem, contains
    _INSTALLED = True


def take() -> tuple[list[tuple[str, str, int, int]], int, int]:
    """(launches over the limit, kernels read, kernels not read) of the keys used since the last
    take(), each key once. A key FA4 asked for that never reached the cache -- its compile raised:
    FA4 refused the call (an assertion while tracing) -- is no kernel and counts as neither."""
    over: list = []
    read = unread = 0
    for h in sorted(_USED):
        if h not in _BY_KEY:
            continue
        rec = _BY_KEY[h]
        if rec is None:
            unread += 1
        else:
            read += 1
            over.extend(tuple(x) for x in rec)
    _USED.clear()
    return over, read, unread
