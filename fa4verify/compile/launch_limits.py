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
launch, on an arch no machine here has (B200 included). :func:`install` records each function FA4
compiles in this process; a function loaded from FA4's kernel cache carries no IR and is not read
(counted apart).
"""
from __future__ import annotations

import re
from typing import Any

__all__ = ["over_limit", "install", "take"]

_FMT = re.compile(r'llvm\.mlir\.global internal constant @(printfFormat_\d+)\("[^"]*launch shared memory exceeds '
                  r'current GPU arch (\w+) allowed\. Allocated: %lld bytes\. Max: (\d+) bytes')

#: (function name, arch, allocated bytes, max bytes) of the launches over the limit, since take()
_OVER: list[tuple[str, str, int, int]] = []
#: [functions read, functions without IR (loaded from a cache)] since take()
_COUNTS = [0, 0]
_SEEN: set[int] = set()        # functions read since take() (a subclass's __setitem__ calls its base's)
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


def _record(fn: Any) -> None:
    if id(fn) in _SEEN:
        return
    _SEEN.add(id(fn))
    ir = getattr(fn, "ir_module", None)
    if ir is None:
        _COUNTS[1] += 1
        return
    _COUNTS[0] += 1
    name = str(getattr(fn, "function_name", "") or type(fn).__name__)
    for arch, alloc, mx in over_limit(str(ir)):
        _OVER.append((name, arch, alloc, mx))


def install() -> None:
    """Read every function FA4 compiles in this process (FA4's ``JITCache`` and its persistent
    subclass: their ``__setitem__``). Compile-only processes only."""
    global _INSTALLED
    if _INSTALLED:
        return
    from flash_attn.cute import cache_utils
    for cls in {cache_utils.JITCache, getattr(cache_utils, "JITPersistentCache", cache_utils.JITCache)}:
        orig = cls.__dict__.get("__setitem__")
        if orig is None:
            continue

        def setitem(self, key, fn, _orig=orig):
            try:
                _record(fn)
            except Exception:      # noqa: BLE001 - reading the IR must never break a compile
                pass
            return _orig(self, key, fn)
        cls.__setitem__ = setitem
    _INSTALLED = True


def take() -> tuple[list[tuple[str, str, int, int]], int, int]:
    """(launches over the limit, functions read, functions without IR) since the last take()."""
    out = (list(_OVER), _COUNTS[0], _COUNTS[1])
    _OVER.clear()
    _SEEN.clear()
    _COUNTS[0] = _COUNTS[1] = 0
    return out
