"""The audit check registry: ``@check``, ``CheckContext``, ``CheckResult``, ``discover()``.

Writing a check (one module per area, ``fa4verify/checks/<area>.py``, discovered automatically)::

    from fa4verify.audit.registry import check, CheckContext, CheckResult

    @check("exp2.deg3.bf16", title="exp2 degree-3 certification",
           needs={"cpu"}, profiles={"quick", "default", "full", "exhaustive"})
    def run(ctx: CheckContext) -> CheckResult:
        with ctx.progress(1000, "sweeping fp32 inputs") as bar:
            for _ in range(10):
                ...
                bar.advance(100)
        return CheckResult(status="pass", where="CPU twin", summary="max 1 ulp",
                           metrics={"max_ulp": 1}, tightness=0.5)

Contract
--------
* ``id`` is stable (baselines, report merges and ``-k`` select by it): lowercase dotted words,
  ``[a-z0-9_.\\-]`` and ``[`` ``]``.  Two checks with the same id are an import error of the
  second module.
* ``needs`` is a subset of :data:`NEEDS` = {"cpu", "fa4", "cuda", "gmpy2"}.  An unmet need turns
  the check into ``skip`` with a standard reason (see :func:`unmet_need`); the function is not
  called.  Checks that need ``"cuda"`` are run by the audit in a worker subprocess so that a CUDA
  fault (illegal address, abort) becomes an ``error`` result and the audit goes on.
* ``profiles`` is the set of profiles (:data:`PROFILES`) in which the check is selected; a
  check not in the requested profile is not run and not listed as skipped.  The check can read
  ``ctx.profile`` to scale its own work (``quick`` < ``default`` < ``full`` < ``exhaustive``).
  The default profile must stay fast: the whole CPU audit has a 60 s budget on 2 cores.
* ``archs`` (optional keyword, not in the short contract): ``None`` (default) means the check
  runs ONCE; ``ctx.arch`` is then the first selected arch and ``ctx.archs`` all selected archs
  (loop over ``ctx.archs`` yourself if the check covers several).  A set such as
  ``{"sm90", "sm100"}`` makes the audit run the check once per selected arch in that set, with
  the result id ``"<id>[<arch>]"`` and ``ctx.arch`` that arch.
* ``cases`` and ``summarise`` (optional keywords, together): a check of many independent cases
  declares ``cases(ctx) -> list`` (run in the auditing process; picklable cases, e.g.
  :class:`~fa4verify.problem.AttentionProblem`), the decorated function becomes
  ``run_case(ctx, case) -> value`` (a picklable value) and ``summarise(ctx, results) ->
  CheckResult`` judges ``results``, the ``(case, value)`` pairs in case order. The engine
  (:mod:`fa4verify.run`) runs the cases side by side, the cases of one FA4 compile key in one
  worker, so the verdict is that of one loop over the cases. A case that errors, crashes or runs
  past its deadline makes the check ``error`` naming the case (``fail`` if the others already
  prove a violation), never ``pass``.
* ``compiles`` (optional keyword, checks that need "cuda"): ``compiles(ctx) -> list`` of
  :class:`fa4verify.compile.production.CompileCall`, the FA4 calls the check makes on the audited GPU,
  for a compile-only audit of a fake device (Note [Fake device audit] in
  :mod:`fa4verify.compile.production`); it calls ``ctx.skip(reason)`` when its calls cannot be known
  without running (e.g. a fuzz campaign's). A "cuda" check without it skips there, saying so.
* ``ctx.dtype`` is "bf16" | "fp16" | "fp8"; a check that does not apply to a dtype returns
  ``CheckResult(status="skip", summary="<reason>")`` (or calls ``ctx.skip(reason)``).
* The function returns a :class:`CheckResult`.  An exception becomes an ``error`` result with
  the exception's message; ``ctx.skip(reason)`` raises :class:`SkipCheck`, which becomes
  ``skip``.
* ``metrics`` are flat ``{name: float | int | str}``; numeric ones are compared against a
  ``--baseline`` report: larger is worse unless the name ends with ``_higher_is_better``.
  Keep names stable across runs (``max_ulp``, ``wrong_count``, ``emulated_share``...).
  Metrics whose name contains ``ulp`` and ``bf16`` are listed as "worst errors (bf16 ulps)" in
  the verdict, other ``ulp`` metrics on a separate line: name them after the format
  (``max_ulp_bf16``, ``max_ulp_fp32``).
* ``details`` is any JSON-able dict for the reports.  Plots in the HTML report come from
  ``details["plot"]`` (one dict or a list of dicts), see :data:`PLOT_CONVENTION`.
* ``tightness`` = measured / budget (<= 1 within budget); the verdict lists the tightest checks.

This module imports nothing heavy (no numpy, torch or flash_attn at import time).
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import os
import pkgutil
import re
import sys
import traceback
import zlib
from typing import Any, Callable, Iterable, Mapping

__all__ = [
    "NEEDS", "PROFILES", "PROFILE_ORDER", "STATUSES", "WHERE", "WHERE_GPU_RE", "valid_where", "ARCHS", "DTYPES",
    "PLOT_CONVENTION",
    "check", "CheckSpec", "CheckContext", "CheckResult", "SkipCheck",
    "discover", "registered", "unmet_need", "cuda_available", "load_module", "module_name_for",
]

#: What a check may need.  "cpu" is always available.
NEEDS: frozenset[str] = frozenset({"cpu", "fa4", "cuda", "gmpy2"})
#: Profiles, in increasing amount of work.
#: ``long`` is not a larger ``exhaustive``: only checks that list it run (the long-context
#: audit, ``production.long_context``), so the default audit's time is untouched.
PROFILE_ORDER: tuple[str, ...] = ("quick", "default", "full", "exhaustive", "long")
PROFILES: frozenset[str] = frozenset(PROFILE_ORDER)
STATUSES: frozenset[str] = frozenset({"pass", "fail", "skip", "error", "undecided"})
#: Where a figure was obtained ("" allowed for skip/error results that measured nothing): one of
#: these fixed labels, or a GPU label matching :data:`WHERE_GPU_RE`:
#: "measured on <GPU name> (sm_XY)" -- the GPU ran in this audit (``CheckContext.where_measured``);
#: "recorded on <GPU name> (sm_XY)" -- a check that, on this machine, reads figures or bits measured
#: on that GPU earlier (golden vectors, MUFU statistics, production figures,
#: :mod:`fa4verify.audit.evidence`): a GPU measurement, but no GPU ran in this audit.
WHERE: frozenset[str] = frozenset({"CPU twin", "compile-only", "CPU"})
WHERE_GPU_RE = re.compile(r"^(measured|recorded) on \S.* \(sm_\d{2,3}\)$")


def valid_where(where: str) -> bool:
    """Whether ``where`` is a label the reports accept (see :data:`WHERE`)."""
    return where in WHERE or bool(WHERE_GPU_RE.match(where))
from fa4verify.kernels.facts import ARCHS, DTYPES  # noqa: E402  (one vocabulary)

PLOT_CONVENTION = """\
details["plot"] may be one dict or a list of dicts, each with "kind" and "title" (str), optional
"xlabel", "ylabel", "logy" (bool), "where" (str, printed under the plot):
  {"kind": "histogram", "bins": [edges... n+1], "counts": [n ints]}          pre-binned histogram
  {"kind": "histogram", "series": {"deg 3": {"bins": [...], "counts": [...]}, ...}}  several, overlaid
  {"kind": "bars", "labels": [str...], "values": [float...], "budget": [float|None...]}
        measured vs budget per label (e.g. per stage); budget optional
  {"kind": "lines", "x": [float...], "series": {"name": [float...], ...}, "budget": float|None}
        e.g. error vs seqlen per feature; "logx" (bool) optional
  {"kind": "table", "columns": [str...], "rows": [[...], ...]}               rendered as a table
A check without details["plot"] gets a table of its metrics (and of details["table"] if it is a
{"columns": ..., "rows": ...} dict)."""

_ID_RE = re.compile(r"^[a-z0-9_][a-z0-9_.\-\[\]]*$")


class SkipCheck(Exception):
    """Raised by :meth:`CheckContext.skip`; the audit records a ``skip`` with this reason."""


# --------------------------------------------------------------------------------------- results
def _json_scalar(v: Any) -> float | int | str | bool | None:
    """Convert numpy scalars and the like into plain Python scalars (metrics must be flat)."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v
    # numpy scalar / 0-d array without importing numpy
    item = getattr(v, "item", None)
    if callable(item):
        try:
            out = item()
        except Exception:  # pragma: no cover - exotic object
            out = None
        if isinstance(out, (bool, int, float, str)):
            return out
    raise TypeError(f"metric value {v!r} ({type(v).__name__}) is not a float, int or str")


def _jsonable(obj: Any, path: str = "details") -> Any:
    """Deep-convert ``obj`` into JSON types (dict with str keys, list, scalars).

    numpy arrays become lists, numpy scalars Python scalars, tuples/sets lists; NaN and inf are
    kept as floats (written as strings "nan"/"inf" by the JSON report).
    """
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v, f"{path}.{k}") for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        seq = sorted(obj, key=repr) if isinstance(obj, (set, frozenset)) else obj
        return [_jsonable(v, f"{path}[]") for v in seq]
    tolist = getattr(obj, "tolist", None)
    if callable(tolist):
        return _jsonable(tolist(), path)
    item = getattr(obj, "item", None)
    if callable(item):
        return _jsonable(item(), path)
    raise TypeError(f"{path}: {type(obj).__name__} is not JSON-able")


@dataclasses.dataclass
class CheckResult:
    """The outcome of one check.

    status:    "pass" (within budget / bit-exact / reproducible), "fail" (a violation),
               "skip" (did not apply or could not run; ``summary`` is the reason),
               "error" (the check itself broke: exception, crash, import error),
               "undecided" (a certified comparison could not decide).
    where:     "measured on <GPU> (sm_XY)" | "recorded on <GPU> (sm_XY)" | "CPU twin" |
               "compile-only" | "CPU" ("" if nothing ran).
    summary:   one line for the terminal and the reports.
    metrics:   flat {name: float|int|str}; numeric ones are compared against a baseline
               (larger = worse unless the name ends with "_higher_is_better").
    details:   JSON-able dict for the reports; ``details["plot"]`` feeds the HTML plots.
    tightness: measured / budget (dimensionless; <= 1 means within budget), or None.
    """

    status: str
    where: str = ""
    summary: str = ""
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    tightness: float | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"CheckResult.status {self.status!r} is not one of {sorted(STATUSES)}")
        if self.where and not valid_where(self.where):
            raise ValueError(f"CheckResult.where {self.where!r} is not one of {sorted(WHERE)} nor "
                             f"'measured on <GPU> (sm_XY)' / 'recorded on <GPU> (sm_XY)'")
        if not isinstance(self.summary, str):
            self.summary = str(self.summary)
        if not isinstance(self.metrics, Mapping):
            raise TypeError("CheckResult.metrics must be a dict {name: float|int|str}")
        self.metrics = {str(k): _json_scalar(v) for k, v in self.metrics.items()}
        self.details = _jsonable(dict(self.details or {}))
        if self.tightness is not None:
            t = _json_scalar(self.tightness)
            if isinstance(t, (str, bool)):
                raise TypeError("CheckResult.tightness must be a float or None")
            self.tightness = float(t)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CheckResult":
        return cls(status=d["status"], where=d.get("where", ""), summary=d.get("summary", ""),
                   metrics=dict(d.get("metrics") or {}), details=dict(d.get("details") or {}),
                   tightness=d.get("tightness"))


# --------------------------------------------------------------------------------------- context
class _NullBar:
    """Progress handle used when nobody displays progress."""

    def __init__(self, total: float | None = None, description: str = "") -> None:
        self.total = total
        self.completed = 0.0
        self.description = description

    def advance(self, n: float = 1) -> None:
        self.completed += n

    def update(self, description: str | None = None, *, completed: float | None = None,
               total: float | None = None, advance: float | None = None) -> None:
        """Same keywords as rich's ``Progress.update`` (the ones that make sense here)."""
        if description is not None:
            self.description = description
        if total is not None:
            self.total = total
        if completed is not None:
            self.completed = completed
        if advance is not None:
            self.completed += advance


ProgressFactory = Callable[[float | None, str], "contextlib.AbstractContextManager[Any]"]


@dataclasses.dataclass
class CheckContext:
    """What a check gets to know about the audit it runs in.

    dtype:   "bf16" | "fp16" | "fp8" (the audited input dtype).
    arch:    "sm90" | "sm100" | "sm103" (see the module docstring for per-arch checks).
    archs:   all archs selected for this audit (``--arch auto``: the device's, or on a CPU
             machine ("sm90", "sm100")).
    device:  "cpu" | "cuda".
    profile: "quick" | "default" | "full" | "exhaustive".
    seed:    the audit's seed (int); :meth:`rng` derives a per-check stream from it.
    check_id: the id of the running check (with "[arch]" suffix for per-arch checks).
    options: free-form extra options (``--fa4-opt key=value``), strings.
    deployment: the deployment profile (``--deployment``) as a dict; :attr:`deploy` parses it.
    kernel_cache: the audit's kernel cache directory (``--kernel-cache`` as in effect; None: off):
             FA4's compiled kernels, and what a compile-only check keeps of its own builds
             (Note [Census cache] in :mod:`fa4verify.compile.census_pdl`).
    """

    dtype: str = "bf16"
    arch: str = "sm100"
    device: str = "cpu"
    profile: str = "default"
    seed: int = 0
    check_id: str = ""
    archs: tuple[str, ...] = ("sm90", "sm100")
    options: dict[str, str] = dataclasses.field(default_factory=dict)
    #: the audit's deployment profile (``Deployment.to_dict()``) or None: every case a check draws
    #: comes from it, and recorded findings apply only where they intersect it
    deployment: dict[str, Any] | None = None
    kernel_cache: str | None = None
    _progress_factory: ProgressFactory | None = dataclasses.field(default=None, repr=False)
    _notes: list[str] = dataclasses.field(default_factory=list, repr=False)

    def rng(self, stream: int | str = 0):
        """A fresh ``numpy.random.Generator`` seeded by (seed, check id, stream): reproducible
        across runs and processes, independent between checks."""
        import numpy as np

        key = zlib.crc32(f"{self.check_id}\x00{stream}".encode())
        return np.random.default_rng([int(self.seed) & 0xFFFFFFFFFFFFFFFF, key])

    @property
    def profile_level(self) -> int:
        """0 for quick, 1 default, 2 full, 3 exhaustive (for scaling work)."""
        return PROFILE_ORDER.index(self.profile)

    def progress(self, total: float | None, description: str = ""
                 ) -> "contextlib.AbstractContextManager[Any]":
        """Context manager yielding a handle with ``.advance(n)``: shown as a progress bar on
        a TTY, silent otherwise.  ``total`` in whatever unit ``advance`` counts (or None)."""
        if self._progress_factory is None:
            return contextlib.nullcontext(_NullBar(total, description))
        return self._progress_factory(total, description)

    def note(self, message: str) -> None:
        """Record a line that the reports show under the check (e.g. "slow: 40 s")."""
        self._notes.append(str(message))

    def skip(self, reason: str) -> "None":
        """Stop the check now and record it as skipped with ``reason``."""
        raise SkipCheck(reason)

    @property
    def deploy(self):
        """The :class:`fa4verify.deployment.Deployment` of the audit, or None."""
        if not self.deployment:
            return None
        from fa4verify.deployment import Deployment
        return Deployment.from_dict(self.deployment)

    @property
    def gpu(self):
        """The local GPU (:class:`fa4verify.kernels.device.GPU`) when the audit runs on CUDA, else
        None."""
        if self.device != "cuda":
            return None
        from fa4verify.kernels.device import local_gpu
        return local_gpu()

    def require_gpu(self, note: str = ""):
        """The local GPU, whose fa4verify arch (sm90 | sm100 | sm103) FA4 supports; otherwise
        skip with the reason (a GPU FA4 runs no SM90/SM100 kernel on is never labelled as if it
        did). ``note`` is appended to the skip reason."""
        gpu = self.gpu
        if gpu is None:
            self.skip("no CUDA device" + (f" ({note})" if note else ""))
        if gpu.arch is None:
            self.skip(gpu.unsupported_reason() + (f" ({note})" if note else ""))
        return gpu

    def where_measured(self) -> str:
        """``measured on <GPU name> (sm_XY)`` for the local GPU (after :meth:`require_gpu`)."""
        from fa4verify.kernels.device import where_measured
        return where_measured(self.require_gpu())

    @property
    def device_arch(self) -> str:
        """The local GPU's fa4verify arch (skips when unsupported)."""
        return self.require_gpu().arch


# --------------------------------------------------------------------------------------- registry
@dataclasses.dataclass(frozen=True)
class CheckSpec:
    """A registered check."""

    id: str
    title: str
    needs: frozenset[str]
    profiles: frozenset[str]
    func: Callable[[CheckContext], CheckResult]
    module: str
    archs: frozenset[str] | None = None
    #: expected wall seconds on a reference GPU (the H200), for scheduling only: the runner
    #: starts the most expensive isolated checks first so the pool's workers finish together
    cost: float = 1.0
    #: ``cases(ctx) -> list``: the check's independent cases (``func`` is then
    #: ``run_case(ctx, case)``), or None: ``func(ctx) -> CheckResult`` is the whole check
    cases: Callable[[CheckContext], list] | None = None
    #: ``summarise(ctx, [(case, value), ...]) -> CheckResult`` (with ``cases``)
    summarise: Callable[..., CheckResult] | None = None
    #: ``compiles(ctx) -> [CompileCall, ...]``: the FA4 calls of a compile-only audit
    compiles: Callable[[CheckContext], list] | None = None

    @property
    def qualname(self) -> str:
        return f"{self.module}:{getattr(self.func, '__qualname__', '?')}"

    def instances(self, selected_archs: Iterable[str]) -> list[tuple[str, str]]:
        """(result id, arch) pairs this check runs as for ``selected_archs`` (ordered)."""
        sel = list(selected_archs)
        if self.archs is None:
            return [(self.id, sel[0] if sel else "sm100")]
        return [(f"{self.id}[{a}]", a) for a in sel if a in self.archs]


_REGISTRY: dict[str, CheckSpec] = {}


def check(id: str, *, title: str = "", needs: Iterable[str] = ("cpu",),
          profiles: Iterable[str] = ("quick", "default", "full", "exhaustive"),
          archs: Iterable[str] | None = None, cost: float = 1.0,
          cases: Callable[[CheckContext], list] | None = None,
          summarise: Callable[..., CheckResult] | None = None,
          compiles: Callable[[CheckContext], list] | None = None) -> Callable[[Callable], Callable]:
    """Register ``func(ctx) -> CheckResult`` (or, with ``cases`` and ``summarise``,
    ``func(ctx, case)``) as the audit check ``id`` (see module docstring)."""
    if not isinstance(id, str) or not _ID_RE.match(id):
        raise ValueError(f"check id {id!r} must match {_ID_RE.pattern}")
    needs_s = frozenset(needs)
    bad = needs_s - NEEDS
    if bad:
        raise ValueError(f"check {id!r}: unknown needs {sorted(bad)} (allowed: {sorted(NEEDS)})")
    profiles_s = frozenset(profiles)
    bad = profiles_s - PROFILES
    if bad or not profiles_s:
        raise ValueError(f"check {id!r}: bad profiles {sorted(profiles_s)} (allowed: {list(PROFILE_ORDER)})")
    import math
    if not isinstance(cost, (int, float)) or not math.isfinite(cost) or cost < 0:
        raise ValueError(f"check {id!r}: cost {cost!r} must be finite seconds >= 0")
    if (cases is None) != (summarise is None) or not all(f is None or callable(f) for f in (cases, summarise)):
        raise ValueError(f"check {id!r}: cases and summarise must be given together, both callable")
    if compiles is not None and (not callable(compiles) or "cuda" not in needs_s):
        raise ValueError(f"check {id!r}: compiles must be callable, on a check that needs cuda")
    archs_s = None if archs is None else frozenset(archs)
    if archs_s is not None and (not archs_s or archs_s - set(ARCHS)):
        raise ValueError(f"check {id!r}: bad archs {sorted(archs_s)} (allowed: {list(ARCHS)})")

    def deco(func: Callable) -> Callable:
        module = getattr(func, "__module__", "?")
        spec = CheckSpec(id=id, title=title or (func.__doc__ or id).strip().splitlines()[0],
                         needs=needs_s, profiles=profiles_s, func=func, module=module,
                         archs=archs_s, cost=float(cost), cases=cases, summarise=summarise,
                         compiles=compiles)
        old = _REGISTRY.get(id)
        if old is not None and (old.module != module
                                or getattr(old.func, "__qualname__", None) != getattr(func, "__qualname__", None)):
            raise ValueError(f"duplicate check id {id!r}: already registered by {old.qualname}")
        _REGISTRY[id] = spec
        func.__fa4verify_check__ = spec  # type: ignore[attr-defined]
        return func

    return deco


def registered() -> dict[str, CheckSpec]:
    """A copy of the registry (id -> spec), in registration order."""
    return dict(_REGISTRY)


# --------------------------------------------------------------------------------------- needs
def cuda_available() -> bool:
    """torch.cuda.is_available(), False if torch is missing (imports torch only when asked);
    True on a fake device (Note [Fake device]: the "cuda" checks then compile only)."""
    from fa4verify.kernels.device import fake_device
    if fake_device() is not None:
        return True
    if importlib.util.find_spec("torch") is None:
        return False
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # pragma: no cover - broken torch install
        return False


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def unmet_need(spec: CheckSpec, device: str, *, cuda: bool | None = None) -> str | None:
    """The skip reason for the first unmet need of ``spec`` on ``device``, or None if all met.

    ``cuda`` overrides the probe of torch.cuda.is_available() (the runner probes once).
    """
    for need in sorted(spec.needs):
        if need == "cpu":
            continue
        if need == "fa4":
            if not _importable("flash_attn.cute"):
                return "FA4 missing (flash_attn.cute not importable: pip install flash-attn-4==4.0.0b36)"
        elif need == "gmpy2":
            if not _importable("gmpy2"):
                return "gmpy2 missing (pip install gmpy2)"
        elif need == "cuda":
            have = cuda_available() if cuda is None else cuda
            if not have:
                return "no CUDA device (torch.cuda.is_available() is False)"
            if device != "cuda":
                return f"needs CUDA but the audit runs with --device {device}"
    return None


# --------------------------------------------------------------------------------------- discovery
def _import_error_spec(module: str, exc: BaseException) -> CheckSpec:
    """A synthetic check standing for a module that failed to import: it always errors."""
    short = (os.path.splitext(os.path.basename(module))[0] if _is_path(module)
             else module.rsplit(".", 1)[-1])
    short = re.sub(r"[^a-z0-9_]", "_", short.lower())
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    msg = f"import of {module} failed: {type(exc).__name__}: {exc}"

    def _broken(ctx: CheckContext) -> CheckResult:
        return CheckResult(status="error", where="", summary=msg,
                           details={"traceback": tb[-4000:]})

    _broken.__qualname__ = f"import_error<{module}>"
    return CheckSpec(id=f"import.{short}",
                     title=f"import {module}", needs=frozenset({"cpu"}),
                     profiles=PROFILES, func=_broken, module=module)


def _is_path(name: str) -> bool:
    return name.endswith(".py") or os.sep in name or "/" in name


def module_name_for(name_or_path: str) -> str:
    """The module name a check module entry is imported under (a .py path gets a private
    name derived from its absolute path, the same in the audit and in its workers)."""
    if not _is_path(name_or_path):
        return name_or_path
    ap = os.path.abspath(name_or_path)
    stem = re.sub(r"[^0-9a-zA-Z_]", "_", os.path.splitext(os.path.basename(ap))[0])
    return f"_fa4verify_ext.{stem}_{zlib.crc32(ap.encode()):08x}"


def load_module(name_or_path: str):
    """Import a check module given as a dotted name or a path to a .py file."""
    if not _is_path(name_or_path):
        return importlib.import_module(name_or_path)
    ap = os.path.abspath(name_or_path)
    if not os.path.isfile(ap):
        raise ImportError(f"check module file {name_or_path!r} does not exist")
    modname = module_name_for(ap)
    if modname in sys.modules:
        return sys.modules[modname]
    spec = importlib.util.spec_from_file_location(modname, ap)
    if spec is None or spec.loader is None:  # pragma: no cover
        raise ImportError(f"cannot load {name_or_path!r}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(modname, None)
        raise
    return mod


def _iter_package_modules(package: str) -> list[str]:
    pkg = importlib.import_module(package)
    path = getattr(pkg, "__path__", None)
    if path is None:  # a plain module given as "package"
        return [package]
    names = [f"{package}.{m.name}" for m in pkgutil.iter_modules(path)
             if not m.name.startswith("_")]
    return sorted(names)


def discover(package: str = "fa4verify.checks", *, modules: Iterable[str] = (),
             include_package: bool = True) -> list[CheckSpec]:
    """Import every module of ``package`` (and the extra ``modules``) and return their checks.

    A module that fails to import (syntax error, missing dependency at import time, duplicate
    id, ...) does not crash discovery: it is represented by a check ``import.<module>`` whose
    result is ``error`` with the exception message.  Returned in a stable order: by module name,
    then registration order within the module.  Modules whose name starts with "_" are skipped.
    """
    names: list[str] = []
    if include_package:
        try:
            names.extend(_iter_package_modules(package))
        except Exception as exc:  # the package itself is broken
            return [_import_error_spec(package, exc)]
    for m in modules:
        if m not in names:
            names.append(m)
    out: list[CheckSpec] = []
    for entry in names:
        name = module_name_for(entry)
        try:
            mod = sys.modules[name] if name in sys.modules else load_module(entry)
            sub = getattr(mod, "__path__", None)
            if sub is not None and name != package:  # an extra package: take its modules too
                for child in _iter_package_modules(name):
                    importlib.import_module(child)
        except BaseException as exc:  # noqa: BLE001 - SystemExit/KeyboardInterrupt at import too
            if isinstance(exc, KeyboardInterrupt):
                raise
            out.append(_import_error_spec(entry if _is_path(entry) else name, exc))
            continue
        for spec in _REGISTRY.values():
            if spec.module == name or spec.module.startswith(name + "."):
                out.append(spec)
    # one spec per id, first wins (an extra module may also be in the package)
    seen: set[str] = set()
    uniq = []
    for s in out:
        if s.id not in seen:
            seen.add(s.id)
            uniq.append(s)
    return uniq
