"""Which lines of FA4's source an audit ran: the host code of each call, and the kernel code the
CuTe DSL traced into the kernels it compiled.

Note [Source coverage]
----------------------
The CuTe DSL builds a kernel by running FA4's Python: a ``const_expr`` branch is decided while
tracing (only the taken side runs), a dynamic ``if`` / loop has every body traced once into the
IR. So the FA4 lines a process executed while compiling are the lines some compiled kernel holds,
and a line no task executed is code that no traced task compiled or called: a fault planted
there cannot be seen by those tasks, whatever their judge. Not traced: the separate processes
some checks start (``determinism.fa4``'s, the races' PDL-off runs, source mutants), a task killed
at its deadline, and what FA4 runs when it is imported; so the list of unrun lines can only be too
long, never too short. The converse does not hold: a traced line may sit behind a runtime
condition no problem met (a tile the scheduler never reached), so "traced" is necessary for
"verified", not sufficient. Attribution to checks is an upper bound on "only by chance": a kernel
one task compiled is reused untraced by the next task in its worker (FA4's in-memory cache) or
another worker (``DIR/kernel-cache``); ``--fresh-workers`` narrows it.

With ``$FA4VERIFY_SOURCE_TRACE_DIR`` set (``fa4verify audit --source-coverage DIR``), each
worker task runs under :class:`LineTracer` (``sys.monitoring`` on Python >= 3.12, else
``sys.settrace``; only function bodies under the installed ``flash_attn`` package are recorded)
and writes ``<dir>/<check>-<pid>-<ns>.lines.json``. :func:`report` merges them against the
executable lines of FA4's function bodies (:func:`executable_lines`) and names, per file and per
function, what no task ran, and what only a drawn campaign (``fuzz.*``) ran: code the audit
reached by chance, not by construction. A kernel loaded from FA4's disk cache is not traced,
so the audit runs with a kernel cache of its own, empty (``--source-coverage`` sees to it).
"""
from __future__ import annotations

import contextlib
import dataclasses
import glob
import inspect
import json
import os
import sys
import threading
import time
import types
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

__all__ = ["TRACE_ENV", "LineTracer", "tracing", "traced", "fa4_root", "executable_lines", "load_traces", "report",
           "render", "CHANCE_CHECKS"]

from fa4verify.run.worker import SOURCE_TRACE_ENV as TRACE_ENV    # noqa: E402  (stdlib only)
#: checks whose problems are drawn at random: what only they ran, the audit reached by chance
CHANCE_CHECKS = ("fuzz.",)
_FUNCTION = inspect.CO_OPTIMIZED | inspect.CO_NEWLOCALS     # a function body (not a module or class body)


def fa4_root() -> Optional[str]:
    """The directory of the ``flash_attn`` package this process would import (a source mutant's
    copy first on ``PYTHONPATH`` included), found without importing it
    (:func:`fa4verify.kernels.fa4_params.fa4_source_dir`); None without FA4."""
    from fa4verify.kernels.fa4_params import fa4_source_dir
    d = fa4_source_dir()
    return None if d is None else os.path.realpath(d.parent)


class LineTracer:
    """Records ``{file relative to the flash_attn package: {line, ...}}`` of the function bodies
    under ``root`` that run inside the ``with`` block: on every thread with ``sys.monitoring``
    (Python >= 3.12); with ``sys.settrace``, on this thread and on threads started inside the
    block. The tracers in place before the block are restored after it."""

    def __init__(self, root: str):
        self.root = os.path.realpath(root) + os.sep
        self.lines: dict[str, set[int]] = {}
        self._mon: Optional[int] = None
        self._prev: tuple = (None, None)
        # by id(): code objects compare equal across files (co_filename is not in their
        # equality); the code object is kept so its id is not reused
        self._keep: dict[int, tuple[types.CodeType, Optional[set[int]]]] = {}

    def _bucket(self, code: types.CodeType) -> Optional[set[int]]:
        hit = self._keep.get(id(code))
        if hit is not None:
            return hit[1]
        fn = code.co_filename
        rel = None
        if code.co_flags & _FUNCTION == _FUNCTION:
            real = fn if fn.startswith(self.root) else os.path.realpath(fn)
            if real.startswith(self.root):
                rel = real[len(self.root):]
        b = self.lines.setdefault(rel, set()) if rel is not None else None
        self._keep[id(code)] = (code, b)
        return b

    # Python >= 3.12: sys.monitoring, each location disabled once recorded
    def _on_line(self, code: types.CodeType, line: int):
        b = self._bucket(code)
        if b is not None:
            b.add(line)
        return sys.monitoring.DISABLE

    # Python < 3.12: sys.settrace, a local tracer only in FA4's frames
    def _on_call(self, frame: types.FrameType, event: str, arg: Any):
        b = self._bucket(frame.f_code)
        if b is None:
            return None

        def local(frame: types.FrameType, event: str, arg: Any):
            if event == "line":
                b.add(frame.f_lineno)
            return local
        return local

    def __enter__(self) -> "LineTracer":
        mon = getattr(sys, "monitoring", None)
        if mon is not None:
            for tool in (mon.COVERAGE_ID, 4, 5):
                try:
                    mon.use_tool_id(tool, "fa4verify-source")
                except ValueError:
                    continue
                self._mon = tool
                mon.register_callback(tool, mon.events.LINE, self._on_line)
                mon.set_events(tool, mon.events.LINE)
                # a location an earlier tracer of this process DISABLEd stays disabled until
                # this: without it the next task would record nothing the last one did
                mon.restart_events()
                break
        if self._mon is None:
            self._prev = (sys.gettrace(), getattr(threading, "gettrace", lambda: None)())
            sys.settrace(self._on_call)
            threading.settrace(self._on_call)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._mon is not None:
            mon = sys.monitoring
            mon.set_events(self._mon, 0)
            mon.register_callback(self._mon, mon.events.LINE, None)
            mon.free_tool_id(self._mon)
            self._mon = None
        else:
            sys.settrace(self._prev[0])
            threading.settrace(self._prev[1])     # type: ignore[arg-type]

    def to_json(self) -> dict[str, list[int]]:
        return {k: sorted(list(v)) for k, v in sorted(list(self.lines.items())) if v}


@contextlib.contextmanager
def tracing(label: str) -> Iterator[None]:
    """With ``$FA4VERIFY_SOURCE_TRACE_DIR`` set, the block runs under :class:`LineTracer` and its
    lines are written to ``<dir>/<label>-<pid>-<ns>.lines.json`` (Note [Source coverage]); else
    nothing happens."""
    out_dir = os.environ.get(TRACE_ENV)
    root = fa4_root() if out_dir else None
    if not out_dir or root is None:
        yield
        return
    tr = LineTracer(root)
    try:
        with tr:
            yield
    finally:
        path = os.path.join(out_dir, f"{label}-{os.getpid()}-{time.time_ns()}.lines.json")
        try:        # atomic: a worker killed mid-write leaves no half file; a failed write
            os.makedirs(out_dir, exist_ok=True)     # costs the trace, never the task's verdict
            with open(path + ".tmp", "w") as f:
                json.dump({"check": label, "root": root, "lines": tr.to_json()}, f)
            os.replace(path + ".tmp", path)
        except OSError:
            pass


def traced(label: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """``fn(*args, **kw)`` inside :func:`tracing` ``(label)``."""
    with tracing(label):
        return fn(*args, **kw)


# ------------------------------------------------------------------------------------------------
# the denominator and the report
# ------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Function:
    file: str                  #: relative to the flash_attn package
    qualname: str
    first: int                 #: the ``def`` line
    lines: frozenset           #: executable lines of its own body (nested functions excluded)


def _functions(code: types.CodeType, rel: str, prefix: str = "") -> Iterable[Function]:
    for c in code.co_consts:
        if not isinstance(c, types.CodeType):
            continue
        name = f"{prefix}{c.co_name}"
        if c.co_flags & _FUNCTION == _FUNCTION:
            own = {ln for _s, _e, ln in c.co_lines() if ln is not None and ln != c.co_firstlineno}
            yield Function(rel, name, c.co_firstlineno, frozenset(own))
        yield from _functions(c, rel, name + ".")


def executable_lines(root: str, files: Optional[Sequence[str]] = None) -> list[Function]:
    """The function bodies of FA4's source under ``root`` (``files``: relative paths; default every
    ``cute/*.py``): their executable lines, the ``def`` line excluded (a decorator runs it at import)."""
    rels = files if files is not None else sorted(
        os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "cute", "*.py")))
    out: list[Function] = []
    for rel in rels:
        path = os.path.join(root, rel)
        try:
            with open(path, encoding="utf-8") as f:
                src = f.read()
            code = compile(src, path, "exec", dont_inherit=True)
        except (OSError, SyntaxError, ValueError):
            continue
        out.extend(f for f in _functions(code, rel) if f.lines)
    return out


def load_traces(trace_dir: str) -> list[dict[str, Any]]:
    """The per-task line files of a run (:func:`traced`), in name order."""
    out = []
    for p in sorted(glob.glob(os.path.join(trace_dir, "*.lines.json"))):
        with open(p) as f:
            out.append(json.load(f))
    return out


def _ranges(lines: Iterable[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for ln in sorted(lines):
        if out and ln == out[-1][1] + 1:
            out[-1][1] = ln
        else:
            out.append([ln, ln])
    return out


def report(traces: Sequence[Mapping[str, Any]], root: str, *, files: Optional[Sequence[str]] = None,
           chance: Sequence[str] = CHANCE_CHECKS) -> dict[str, Any]:
    """Merge the tasks' traces against FA4's executable function lines (JSON-able): per file the
    lines run / executable, per check the lines it ran, and per function the lines no task ran
    (``unrun``) and those only a drawn campaign ran (``chance``), as line ranges."""
    funcs = executable_lines(root, files)
    run_by: dict[str, dict[str, set[int]]] = {}        # check -> file -> lines
    for t in traces:
        dst = run_by.setdefault(t["check"], {})
        for f, lines in t["lines"].items():
            dst.setdefault(f, set()).update(lines)
    every: dict[str, set[int]] = {}
    planned: dict[str, set[int]] = {}
    for check, per in run_by.items():
        by_chance = any(check.startswith(c) for c in chance)
        for f, lines in per.items():
            every.setdefault(f, set()).update(lines)
            if not by_chance:
                planned.setdefault(f, set()).update(lines)
    per_file: dict[str, dict[str, Any]] = {}
    for fn in funcs:
        ran = every.get(fn.file, set())
        pl = planned.get(fn.file, set())
        d = per_file.setdefault(fn.file, {"executable": 0, "run": 0, "by_construction": 0, "functions": []})
        d["executable"] += len(fn.lines)
        d["run"] += len(fn.lines & ran)
        d["by_construction"] += len(fn.lines & pl)
        unrun = sorted(fn.lines - ran)
        chance_only = sorted((fn.lines & ran) - pl)
        if unrun or chance_only:
            d["functions"].append({"function": fn.qualname, "def": fn.first, "executable": len(fn.lines),
                                   "unrun": _ranges(unrun), "chance": _ranges(chance_only),
                                   "entered": bool(fn.lines & ran)})
    checks = {c: sum(len(v) for v in per.values()) for c, per in sorted(run_by.items())}
    return {"root": root, "tasks": len(traces), "checks": checks, "files": per_file}


def render(rep: Mapping[str, Any], *, files: Optional[Sequence[str]] = None, detail: bool = True) -> str:
    """A text table of :func:`report`: per file run / by construction / executable, then (``detail``)
    each function with lines no task ran or only a drawn campaign ran."""
    out = [f"FA4 source lines run by {rep['tasks']} task(s) (Note [Source coverage]: a line no traced task ran "
           "is in no kernel they compiled and no call they made)",
           f"{'file':40s} {'run':>6s} {'planned':>8s} {'of':>6s}"]
    names = [f for f in rep["files"] if files is None or f in files]
    for f in names:
        d = rep["files"][f]
        out.append(f"{f:40s} {d['run']:6d} {d['by_construction']:8d} {d['executable']:6d}")
    if detail:
        for f in names:
            d = rep["files"][f]
            for fn in d["functions"]:
                if not fn["entered"]:
                    out.append(f"  {f}:{fn['def']} {fn['function']}: never entered ({fn['executable']} lines)")
                    continue
                if fn["unrun"]:
                    out.append(f"  {f}:{fn['def']} {fn['function']}: not run " + _fmt(fn["unrun"]))
                if fn["chance"]:
                    out.append(f"  {f}:{fn['def']} {fn['function']}: only by a drawn campaign " + _fmt(fn["chance"]))
    return "\n".join(out)


def _fmt(ranges: Sequence[Sequence[int]]) -> str:
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)
