"""Select and run audit checks: profile, ``-k`` expression, shard, needs, worker isolation.

:func:`run_audit` is what ``fa4verify audit`` and the pytest plugin call.  Checks run one after
another in this process, except those that need "cuda" (or all, with ``isolate="always"``),
which run in a worker subprocess (``python -m fa4verify.audit.worker``): a fault that kills the
process (CUDA illegal address, abort) becomes an ``error`` result and the audit goes on.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Iterable, Protocol, Sequence

from fa4verify._options import AuditConfig
from fa4verify.audit.registry import (CheckContext, CheckResult, CheckSpec, SkipCheck,
                                      cuda_available, discover, unmet_need)

__all__ = ["CheckRecord", "Selected", "AuditRun", "select", "run_audit", "execute",
           "KeywordError", "compile_keyword", "exit_code_for"]


class KeywordError(ValueError):
    """A malformed ``-k`` expression."""


# --------------------------------------------------------------------------------- -k expressions
_TOKEN = re.compile(r"\s*(\(|\)|[^\s()]+)")


def compile_keyword(expr: str | None) -> Callable[[str], bool]:
    """A pytest-like ``-k`` matcher over ``"<id> <title>"``: words match as case-insensitive
    substrings (``*`` and ``?`` as wildcards), combined with ``and``, ``or``, ``not`` and
    parentheses.  ``None``/"" selects everything."""
    if not expr or not expr.strip():
        return lambda text: True
    tokens = _TOKEN.findall(expr)
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        tok = tokens[pos]
        pos += 1
        return tok

    def word_matcher(w: str) -> Callable[[str], bool]:
        w = w.lower()
        if "*" in w or "?" in w:
            rx = re.compile(".*".join(re.escape(p) for p in w.split("*")).replace(r"\?", "."))
            return lambda t: rx.search(t.lower()) is not None
        return lambda t: w in t.lower()

    def parse_or() -> Callable[[str], bool]:
        left = parse_and()
        while peek() == "or":
            take()
            right = parse_and()
            left = (lambda a, b: lambda t: a(t) or b(t))(left, right)
        return left

    def parse_and() -> Callable[[str], bool]:
        left = parse_not()
        while peek() == "and":
            take()
            right = parse_not()
            left = (lambda a, b: lambda t: a(t) and b(t))(left, right)
        return left

    def parse_not() -> Callable[[str], bool]:
        if peek() == "not":
            take()
            inner = parse_not()
            return lambda t: not inner(t)
        return parse_atom()

    def parse_atom() -> Callable[[str], bool]:
        tok = peek()
        if tok is None:
            raise KeywordError(f"-k {expr!r}: unexpected end of expression")
        if tok == "(":
            take()
            inner = parse_or()
            if peek() != ")":
                raise KeywordError(f"-k {expr!r}: missing ')'")
            take()
            return inner
        if tok in (")", "and", "or"):
            raise KeywordError(f"-k {expr!r}: unexpected {tok!r}")
        return word_matcher(take())

    matcher = parse_or()
    if pos != len(tokens):
        raise KeywordError(f"-k {expr!r}: unexpected {tokens[pos]!r}")
    return matcher


# --------------------------------------------------------------------------------- records
@dataclasses.dataclass
class CheckRecord:
    """One executed (or skipped) check instance, as reported."""

    id: str                 #: result id ("<check id>" or "<check id>[<arch>]")
    check_id: str           #: the registered id
    title: str
    module: str
    arch: str
    needs: list[str]
    result: CheckResult
    duration_s: float = 0.0  #: wall seconds, including the worker start when isolated
    isolated: bool = False
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def status(self) -> str:
        return self.result.status

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in dataclasses.asdict(self).items() if k != "result"}
        d.update(self.result.to_dict())
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CheckRecord":
        return cls(id=d["id"], check_id=d.get("check_id", d["id"]), title=d.get("title", ""),
                   module=d.get("module", ""), arch=d.get("arch", ""),
                   needs=list(d.get("needs", [])), result=CheckResult.from_dict(d),
                   duration_s=float(d.get("duration_s", 0.0)), isolated=bool(d.get("isolated")),
                   notes=list(d.get("notes", [])))


@dataclasses.dataclass(frozen=True)
class Selected:
    spec: CheckSpec
    id: str
    arch: str


@dataclasses.dataclass
class AuditRun:
    config: AuditConfig
    records: list[CheckRecord]
    started: float
    finished: float
    discovered: int          #: check specs discovered (before profile/-k/shard selection)

    @property
    def duration_s(self) -> float:
        return self.finished - self.started


def exit_code_for(records: Sequence[CheckRecord], *, regressions: int = 0) -> int:
    """The gate: 1 on any fail (or baseline regression), 3 on any error (a check could not
    complete: exception, crash, import error), 10 on any undecided, 5 when nothing passed or
    failed (all skipped / none selected), else 0."""
    statuses = [r.status for r in records]
    if "fail" in statuses or regressions:
        return 1
    if "error" in statuses:
        return 3
    if "undecided" in statuses:
        return 10
    if "pass" not in statuses:
        return 5
    return 0


# --------------------------------------------------------------------------------- selection
def select(specs: Iterable[CheckSpec], config: AuditConfig) -> list[Selected]:
    """Checks of ``config.profile``, expanded per arch, filtered by ``-k``, then sharded.

    The shard partition is deterministic: the selected instance ids are sorted and instance
    number j (0-based) goes to shard ``j % n + 1``, so shards 1..n of one configuration are
    disjoint and cover every instance."""
    match = compile_keyword(config.keyword)
    out: list[Selected] = []
    for spec in specs:
        if config.profile not in spec.profiles:
            continue
        instances = spec.instances(config.archs)
        if not instances and spec.archs is not None:
            # an arch-specific check none of whose archs is selected: report it as a skip
            instances = [(f"{spec.id}[{a}]", a) for a in sorted(spec.archs)]
        for rid, arch in instances:
            if match(f"{rid} {spec.title} {spec.module}"):
                out.append(Selected(spec, rid, arch))
    if config.shard is not None:
        i, n = config.shard
        order = sorted(range(len(out)), key=lambda j: out[j].id)
        keep = {order[j] for j in range(len(order)) if j % n == i - 1}
        out = [s for j, s in enumerate(out) if j in keep]
    return out


# --------------------------------------------------------------------------------- execution
def execute(spec: CheckSpec, ctx: CheckContext) -> CheckResult:
    """Call the check function; exceptions become ``error``, :class:`SkipCheck` ``skip``."""
    try:
        res = spec.func(ctx)
    except SkipCheck as e:
        return CheckResult(status="skip", summary=str(e) or "skipped by the check")
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - SystemExit from a check is an error too
        tb = traceback.format_exc()
        return CheckResult(status="error", summary=f"{type(e).__name__}: {e}".strip()[:500],
                           details={"traceback": tb[-6000:]})
    if not isinstance(res, CheckResult):
        return CheckResult(status="error",
                           summary=f"check returned {type(res).__name__}, not CheckResult")
    return res


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except (ValueError, AttributeError):
        return f"signal {-rc}"


def _run_isolated(spec: CheckSpec, ctx: CheckContext, timeout: float) -> tuple[CheckResult, list[str]]:
    """Run one check in ``python -m fa4verify.audit.worker``; a dead worker is an error."""
    from fa4verify.audit.worker import build_request

    with tempfile.TemporaryDirectory(prefix="fa4verify-worker-") as td:
        req_path = os.path.join(td, "request.json")
        res_path = os.path.join(td, "result.json")
        err_path = os.path.join(td, "stderr.txt")
        with open(req_path, "w") as f:
            json.dump(build_request(spec, ctx), f)
        cmd = [sys.executable, "-m", "fa4verify.audit.worker", req_path, res_path]
        env = dict(os.environ)
        # the worker must import fa4verify (and .py check modules) exactly as we did
        env["PYTHONPATH"] = os.pathsep.join(
            [p for p in [os.getcwd(), env.get("PYTHONPATH", "")] if p])
        timed_out = False
        with open(err_path, "wb") as err:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env,
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout if timeout and timeout > 0 else None)
            except subprocess.TimeoutExpired:
                timed_out = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait()
            except KeyboardInterrupt:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise
        with open(err_path, "rb") as f:
            stderr_tail = f.read()[-4000:].decode("utf-8", "replace")
        if not timed_out and rc == 0 and os.path.exists(res_path):
            with open(res_path) as f:
                payload = json.load(f)
            return CheckResult.from_dict(payload["result"]), list(payload.get("notes", []))
        if timed_out:
            why = f"worker timed out after {timeout:g} s (killed)"
        elif rc < 0:
            why = f"worker process died: killed by {_signal_name(rc)} (exit {rc})"
        else:
            why = f"worker process exited with status {rc} without a result"
        last = [ln for ln in stderr_tail.strip().splitlines() if ln.strip()]
        if last:
            why += f"; last stderr line: {last[-1].strip()[:300]}"
        return (CheckResult(status="error", summary=why,
                            details={"worker_stderr_tail": stderr_tail, "worker_exit": rc}),
                [])


class Reporter(Protocol):  # pragma: no cover - interface
    def start(self, selected: Sequence[Selected], config: AuditConfig) -> None: ...
    def check_started(self, sel: Selected) -> None: ...
    def progress_factory(self, sel: Selected) -> Any: ...
    def check_finished(self, rec: CheckRecord) -> None: ...
    def finish(self, run: AuditRun) -> None: ...


def module_label(module: str) -> str:
    """A check module's dotted name, or the relative path of a --checks-module .py file."""
    if module.startswith("_fa4verify_ext."):
        f = getattr(sys.modules.get(module), "__file__", None)
        if f:
            try:
                return os.path.relpath(f)
            except ValueError:  # pragma: no cover - other drive on Windows
                return f
    return module


def load_specs(config: AuditConfig) -> list[CheckSpec]:
    return discover(modules=config.checks_modules, include_package=not config.no_default_checks)


def run_audit(config: AuditConfig, *, specs: Sequence[CheckSpec] | None = None,
              reporter: Reporter | None = None,
              selected: Sequence[Selected] | None = None) -> AuditRun:
    """Discover (unless ``specs``/``selected`` are given), select and run the checks."""
    started = time.time()
    if specs is None:
        specs = load_specs(config)
    if selected is None:
        selected = select(specs, config)
    if reporter is not None:
        reporter.start(selected, config)
    have_cuda = cuda_available() if any("cuda" in s.spec.needs for s in selected) else False
    records: list[CheckRecord] = []
    for sel in selected:
        spec = sel.spec
        if reporter is not None:
            reporter.check_started(sel)
        t0 = time.perf_counter()
        isolated = False
        notes: list[str] = []
        reason = unmet_need(spec, config.device, cuda=have_cuda)
        if reason is None and sel.arch not in config.archs:
            reason = f"arch {sel.arch} not selected (--arch {','.join(config.archs)})"
        if reason is not None:
            result = CheckResult(status="skip", summary=reason)
        else:
            ctx = CheckContext(dtype=config.dtype, arch=sel.arch, device=config.device,
                               profile=config.profile, seed=config.seed, check_id=sel.id,
                               archs=tuple(config.archs), options=dict(config.opts),
                               deployment=config.deployment_dict)
            isolated = config.isolate == "always" or (config.isolate == "auto"
                                                      and "cuda" in spec.needs)
            if isolated:
                result, notes = _run_isolated(spec, ctx, config.timeout)
            else:
                if reporter is not None:
                    ctx._progress_factory = reporter.progress_factory(sel)
                result = execute(spec, ctx)
                notes = list(ctx._notes)
        rec = CheckRecord(id=sel.id, check_id=spec.id, title=spec.title, module=module_label(spec.module),
                          arch=sel.arch, needs=sorted(spec.needs), result=result,
                          duration_s=time.perf_counter() - t0, isolated=isolated, notes=notes)
        records.append(rec)
        if reporter is not None:
            reporter.check_finished(rec)
    run = AuditRun(config=config, records=records, started=started, finished=time.time(),
                   discovered=len(specs) if specs is not None else len(selected))
    if reporter is not None:
        reporter.finish(run)
    return run
