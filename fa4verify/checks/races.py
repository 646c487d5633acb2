"""Audit check ``races.production`` (GPU): FA4's backward under load (Note [Backward under load],
:mod:`fa4verify.races`) -- dO written by the kernel launched just before its preprocess, a
concurrent memory-bound stream, FA4's uninitialised buffers NaN-poisoned (Note [Poisoned
scratch]), every repetition judged by the one judge and, in deterministic mode, bitwise equal to
the first.

Cases (the engine runs them side by side, Note [One engine]): one per problem and backward mode
(deterministic, default) with PDL as FA4 compiles it, and with PDL off (Note [PDL off]) one case
for all of them, in a process of its own.

* default: dense causal MHA, GQA 4:1 and used-length Q with a learnable sink (Q at a capacity
  past the used rows: red-team round 16 #8), both modes, 3 repetitions, PDL on (a short run: 18
  backward repetitions);
* full: + the block-sparse call form, 8 repetitions, PDL on and off;
* exhaustive: 32 repetitions, PDL on and off.

A deployment profile (``ctx.deploy``) replaces the problems by its own (:func:`fa4verify.checks._live.problems`:
its head dims, masks, GQA ratio, softcap, sinks, seqlens clipped to its range; block-sparse only
when it ships that call form). ``--opt races_reps=N`` replaces the repetitions,
``--opt races_pdl=on|off|both`` the PDL runs, ``--opt races_poison=off`` leaves FA4's scratch
unpoisoned (the control of a planted-fault run: what the harness sees without the poison).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from fa4verify.problem import AttentionProblem
from fa4verify.audit.registry import CheckContext, CheckResult, check

_REPS = {"default": 3, "full": 8, "exhaustive": 32}
_PDL = {"default": ("on",), "full": ("on", "off"), "exhaustive": ("on", "off")}
_MODES = (("deterministic", True), ("default", False))
#: problems of the default profile (of :func:`fa4verify.races.race_problems`: dense causal, GQA,
#: used-length Q with a sink)
_DEFAULT_PROBLEMS = 3
#: seconds the PDL-off process may run (fresh imports, cold compiles, the repetitions): inside the
#: engine's task deadline (Note [Default deadline]: 300 s for this cost), so a slow run is this case's
#: one-line error, not a killed worker
_PDL_OFF_TIMEOUT_S = 280.0

#: device of the check (tests swap in "cpu" with a stand-in adapter)
_DEVICE = "cuda"


@dataclasses.dataclass(frozen=True)
class RaceCase:
    """One problem's backward under load, ``reps`` times in one mode, PDL as FA4 compiles it."""
    problem: AttentionProblem
    mode: str
    reps: int
    poison: bool = True

    @property
    def deterministic(self) -> bool:
        return dict(_MODES)[self.mode]

    def describe(self) -> str:
        return (f"{self.problem.describe()} {self.mode} x{self.reps} (PDL as FA4 compiles it"
                + ("" if self.poison else ", scratch not poisoned") + ")")


@dataclasses.dataclass(frozen=True)
class PdlOffCase:
    """Every problem in every mode, ``reps`` times each, PDL off, in a process of its own (Note
    [PDL off]): no ``problem`` attribute, so the engine gives it a task of its own."""
    problems: tuple[AttentionProblem, ...]
    reps: int
    poison: bool = True

    def describe(self) -> str:
        return (f"{len(self.problems)} problem(s) x {len(_MODES)} modes x{self.reps} with PDL off (own process"
                + ("" if self.poison else ", scratch not poisoned") + ")")


def _option(ctx: CheckContext, name: str, default: Any) -> Any:
    opts = getattr(ctx, "options", None) or {}
    return opts.get(name, default)


def _reps(ctx: CheckContext) -> int:
    try:
        reps = int(_option(ctx, "races_reps", _REPS.get(ctx.profile, 8)))
    except (TypeError, ValueError) as e:
        raise ValueError(f"--opt races_reps: {e}") from None
    if reps < 2:
        raise ValueError("--opt races_reps must be >= 2 (the bitwise comparison needs two)")
    return reps


def _pdl(ctx: CheckContext) -> tuple[str, ...]:
    v = _option(ctx, "races_pdl", None)
    if v is None:
        return _PDL.get(ctx.profile, ("on", "off"))
    runs = {"on": ("on",), "off": ("off",), "both": ("on", "off")}
    if str(v) not in runs:
        raise ValueError(f"--opt races_pdl={v}: expected on, off or both")
    return runs[str(v)]


def _poison(ctx: CheckContext) -> bool:
    v = str(_option(ctx, "races_poison", "on"))
    if v not in ("on", "off"):
        raise ValueError(f"--opt races_poison={v}: expected on or off")
    return v == "on"


def problems(ctx: CheckContext, arch: str) -> list[AttentionProblem]:
    """The race problems of this audit on ``arch`` (module docstring): the deployment's when it has
    one, else :func:`fa4verify.races.race_problems` (the first three in the default profile)."""
    from fa4verify import races
    dep = ctx.deploy
    if dep is None:
        ps = races.race_problems(arch, ctx.dtype, seed=int(ctx.seed))
        return ps if ctx.profile in ("full", "exhaustive") else ps[:_DEFAULT_PROBLEMS]
    if ctx.dtype not in dep.dtypes:
        ctx.skip(f"deployment {dep.name!r} ships {list(dep.dtypes)}, not {ctx.dtype}")
    from fa4verify.problem import CallForm
    from fa4verify.checks import _live
    ps = _live.problems(ctx, arch, ctx.dtype)          # skips when the deployment ships nothing FA4 runs
    if ctx.profile not in ("full", "exhaustive"):
        ps = ps[:_DEFAULT_PROBLEMS]
    if "block_sparse" in dep.features and ctx.profile in ("full", "exhaustive"):
        p = ps[0]
        ps.append(p.replace(call=CallForm(block_size=(128, 128), block_keep=0.5, block_seed=int(ctx.seed))))
    return ps


def _cases(ctx: CheckContext) -> list:
    if ctx.dtype not in ("bf16", "fp16"):
        ctx.skip(f"the race problems are bf16/fp16; dtype {ctx.dtype} is not run")
    arch = ctx.require_gpu().arch if _DEVICE == "cuda" else "sm90"
    reps, pdl, poison = _reps(ctx), _pdl(ctx), _poison(ctx)
    ps = problems(ctx, arch)
    out: list = []
    if "on" in pdl:
        out += [RaceCase(p, mode, reps, poison) for p in ps for mode, _ in _MODES]
    if "off" in pdl:
        out.append(PdlOffCase(tuple(ps), reps, poison))
    return out


#: the race targets of this process by poison setting (their busy buffers are allocated once)
_TARGET: dict = {}


def _target(poison: bool = True):
    from fa4verify import races
    if _DEVICE != "cuda":               # tests: the stand-in adapter of the moment, never kept
        from fa4verify.kernels import adapter
        return races.RacingTarget(adapter=adapter, device=_DEVICE, poison=poison)
    if poison not in _TARGET:
        _TARGET[poison] = races.RacingTarget(poison=poison)
    return _TARGET[poison]


def _where(ctx: CheckContext) -> str:
    return ctx.where_measured() if _DEVICE == "cuda" else "CPU"


def _summary(ctx: CheckContext, results: list) -> CheckResult:
    rows: dict[str, list] = {}
    target: dict = {}
    for _case, v in results:
        for mode, rs in v["rows"].items():
            rows.setdefault(f"{mode}, PDL {v['pdl']}", []).extend(rs)
        target.setdefault(f"PDL {v['pdl']}", v["target"])
    return result(rows, results[0][1]["where"], target)


def _compiles(ctx: CheckContext) -> list:
    """Note [Fake device audit]: the backward of every problem in every mode (PDL as FA4 compiles
    it; the PDL-off builds of :class:`PdlOffCase` need a process with PDL off: they are not in the
    plan, and the plan says so)."""
    from fa4verify.compile.production import CompileCall
    out = []
    for c in _cases(ctx):
        if isinstance(c, RaceCase):
            out.append(CompileCall("backward", c.problem, deterministic=c.deterministic,
                                   purpose=f"{c.mode} backward under load"))
    return out


@check("races.production", title="FA4 backward under load: dO from the preceding kernel, a busy stream, PDL on and off (GPU)",
       needs={"cuda", "fa4"}, profiles={"default", "full", "exhaustive"}, cost=30, cases=_cases,
       summarise=_summary, compiles=_compiles)
def production(ctx: CheckContext, case: Any) -> dict:
    """One case (:class:`RaceCase`, :class:`PdlOffCase`): its rows per mode. cost: measured on the
    H200 (main 1f8c92c), its two tasks take 5.8 s each warm and up to 9.1 s cold, the longest
    tasks of a warm default audit; the cost puts them first in the queue (tasks are queued by
    cost, Note [One engine])."""
    from fa4verify import races
    if isinstance(case, PdlOffCase):
        out = races.run_races_pdl_off(case.problems, reps=case.reps, modes=_MODES, timeout_s=_PDL_OFF_TIMEOUT_S,
                                      poison=case.poison)
        return {"pdl": "off", "rows": out["rows"], "where": _where(ctx),
                "target": dict(out["target"], kernel_cache=out["kernel_cache"])}
    tgt = _target(case.poison)
    rows = races.run_races(tgt, [case.problem], reps=case.reps, deterministic=case.deterministic)
    return {"pdl": "on", "rows": {case.mode: rows}, "target": tgt.describe(), "where": _where(ctx)}


def result(rows: dict, where: str, target: dict) -> CheckResult:
    """The verdict of :func:`fa4verify.races.run_races` rows per mode (``{"deterministic, PDL on":
    rows, ...}``)."""
    from fa4verify.fuzz.campaign import judged_shortfall
    from fa4verify.races import COLUMNS
    flat = [(mode, r) for mode, rs in rows.items() for r in rs]
    metrics = {"reps": sum(r.reps for _, r in flat), "judged": sum(r.judged for _, r in flat),
               "violations": sum(r.violations for _, r in flat),
               "bitwise_mismatches": sum(r.bitwise_mismatches for _, r in flat),
               "poisoned": sum(r.poisoned for _, r in flat),
               "unsupported": sum(r.unsupported for _, r in flat), "fa4verify_errors": sum(r.errors for _, r in flat)}
    details = {"table": {"columns": ["mode"] + COLUMNS, "rows": [[m] + r.row() for m, r in flat]},
               "target": target}
    bad = [(m, r) for m, r in flat if r.violations or r.bitwise_mismatches]
    if bad:
        m, r = bad[0]
        return CheckResult(status="fail", where=where, metrics=metrics, details=details,
                           summary=f"{len(bad)} problem/mode(s) wrong under load; first: {r.problem} ({m}): "
                                   f"{r.first_failure}"[:400])
    if metrics["fa4verify_errors"]:
        r = next(r for _, r in flat if r.errors)
        return CheckResult(status="error", where=where, metrics=metrics, details=details,
                           summary=f"fa4verify's own call failed on {metrics['fa4verify_errors']} repetition(s): "
                                   f"{r.first_failure}"[:400])
    short = judged_shortfall(metrics["judged"], metrics["reps"], unit="repetitions",
                             unsupported=metrics["unsupported"])
    if short is not None:
        return CheckResult(status="undecided", where=where, metrics=metrics, details=details, summary=short)
    pdl = sorted({m.split("PDL ")[-1] for m in rows if "PDL " in m})
    return CheckResult(status="pass", where=where, metrics=metrics, details=details,
                       summary=(f"{metrics['judged']} backward repetitions under load (dO from the preceding "
                                f"kernel, busy stream" + (f", PDL {' and '.join(pdl)}" if pdl else "")
                                + ") within budget; deterministic ones bitwise equal; FA4's uninitialised "
                                f"buffers NaN-poisoned in {metrics['poisoned']}/{metrics['judged']}"))
