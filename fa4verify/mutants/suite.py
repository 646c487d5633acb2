"""The mutant suite: every verifier on the unmutated twin and on every mutant over the battery,
and the detection summary (caught / missed / false alarm) per (mutant, verifier)."""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Literal, Sequence

import numpy as np

from fa4verify.mutants import production
from fa4verify.mutants.catalogue import MUTANT_NAMES, Mutant, get_mutant
from fa4verify.mutants.problems import Problem, battery, make_inputs
from fa4verify.mutants.twin_runs import TwinOutputs, run_twin
from fa4verify.mutants.upstream import _torch
from fa4verify.mutants.verdict import Status, Verdict
from fa4verify.errors import DependencyMissing
from fa4verify.mutants.columns import _REGISTRY, ProblemEnv, VerifierSpec, load_budgets, verifiers

@dataclasses.dataclass(frozen=True)
class Row:
    """One raw verdict: ``mutant`` is ``"none"`` for the unmutated twin."""

    mutant: str
    arch: str
    problem: str
    verifier: str
    status: Status
    figure: float | None
    detail: str


@dataclasses.dataclass(frozen=True)
class Cell:
    """Detection summary of (mutant, verifier) over the battery.

    ``status``: "caught" (fails the mutant on a problem where it passes the unmutated twin),
    "missed" (applied somewhere, never caught), "n/a" (never applied), "false-alarm" (it ran,
    but failed the unmutated twin on every such problem, so it cannot tell), "error" (only
    errors).
    ``figure``/``where``/``detail``: the deciding verdict -- for "caught" the catching verdict with
    the largest figure, for "missed" the applicable verdict closest to failing.
    """

    status: Literal["caught", "missed", "n/a", "false-alarm", "error"]
    figure: float | None = None
    where: str = ""
    detail: str = ""
    caught_on: int = 0
    applied_on: int = 0


@dataclasses.dataclass
class SuiteResult:
    """Everything one run produced; :meth:`to_json` is the ``--json`` schema."""

    profile: str
    seed: int
    archs: tuple[str, ...]
    target: str = "twin"
    where: str = "CPU twin"
    rows: list[Row] = dataclasses.field(default_factory=list)
    unavailable: dict[str, str] = dataclasses.field(default_factory=dict)
    problems: tuple[Problem, ...] = ()
    mutants: tuple[str, ...] = ()
    verifier_names: tuple[str, ...] = ()
    seconds: float = 0.0

    # -- derived -------------------------------------------------------------------------
    def base_rows(self) -> dict[tuple[str, str, str], Row]:
        return {(r.arch, r.problem, r.verifier): r for r in self.rows if r.mutant == "none"}

    def false_alarms(self) -> dict[str, list[Row]]:
        """Verifier -> the unmutated-twin verdicts that failed (must be empty for fa4verify)."""
        out: dict[str, list[Row]] = {v: [] for v in self.verifier_names}
        for r in self.rows:
            if r.mutant == "none" and r.status == "fail":
                out[r.verifier].append(r)
        return out

    def cell(self, mutant: str, verifier: str) -> Cell:
        base = self.base_rows()
        rows = [r for r in self.rows if r.mutant == mutant and r.verifier == verifier]
        caught: list[Row] = []
        applied: list[Row] = []
        errors: list[Row] = []
        alarmed: list[Row] = []
        for r in rows:
            b = base.get((r.arch, r.problem, r.verifier))
            if r.status == "error":
                errors.append(r)
                continue
            if r.status != "n/a" and b is not None and b.status == "fail":
                alarmed.append(r)
                continue
            if r.status == "n/a" or b is None or b.status != "pass":
                continue  # not applicable
            applied.append(r)
            if r.status == "fail":
                caught.append(r)

        def fig(r: Row) -> float:
            f = r.figure
            return -1.0 if f is None or (isinstance(f, float) and math.isnan(f)) else float(f)

        def where(r: Row) -> str:
            return r.problem if r.arch == "-" else f"{r.problem}[{r.arch}]"

        if caught:
            best = max(caught, key=fig)
            return Cell("caught", best.figure, where(best), best.detail, len(caught), len(applied))
        if applied:
            best = max(applied, key=fig)
            return Cell("missed", best.figure, where(best), best.detail, 0, len(applied))
        if errors:
            return Cell("error", None, where(errors[0]), errors[0].detail)
        if alarmed:
            b = base[(alarmed[0].arch, alarmed[0].problem, alarmed[0].verifier)]
            return Cell("false-alarm", None, where(alarmed[0]),
                        f"fails the unmutated twin wherever it applies: {b.detail}")
        return Cell("n/a")

    def fa4verify_cell(self, mutant: str) -> tuple[Cell, list[str]]:
        """The combined fa4verify verdict: caught if any fa4verify verifier caught it. Returns
        the deciding cell and the names of every fa4verify verifier that caught it."""
        names = [v for v in self.verifier_names if _spec(v).group == "fa4verify"]
        cells = [(v, self.cell(mutant, v)) for v in names]
        by = [v for v, c in cells if c.status == "caught"]
        if by:
            v, c = next((v, c) for v, c in cells if c.status == "caught")
            return c, by
        missed = [c for _, c in cells if c.status == "missed"]
        if missed:
            return missed[0], []
        errs = [c for _, c in cells if c.status == "error"]
        return (errs[0] if errs else Cell("n/a")), []

    def headline(self) -> dict:
        """The honest headline: of the mutants, how many fa4verify catches at
        all, and how many with a verifier that can judge a production kernel (``judges ==
        "production"``); the rest were caught only by twin internals or bit comparisons. Each
        mutant's ``judged_by`` is the strongest class that caught it."""
        order = ("production", "twin only", "bit comparison")
        per: dict[str, str] = {}
        for m in self.mutants:
            _, by = self.fa4verify_cell(m)
            kinds = {_spec(v).judges for v in by}
            per[m] = next((k for k in order if k in kinds), "missed")
        counts = {k: sum(1 for v in per.values() if v == k) for k in order + ("missed",)}
        return {"mutants": len(self.mutants), "caught": len(self.mutants) - counts["missed"],
                "caught_by_production_verifiers": counts["production"], "by_class": counts,
                "judged_by": per,
                "text": (f"fa4verify catches {len(self.mutants) - counts['missed']}/{len(self.mutants)} "
                         f"mutants; {counts['production']}/{len(self.mutants)} with verifiers that can "
                         f"judge production FA4 (the rest: twin internals {counts['twin only']}, "
                         f"bit comparison {counts['bit comparison']})")}

    def to_json(self) -> dict:
        fa = self.false_alarms()
        table = {}
        for m in self.mutants:
            c, by = self.fa4verify_cell(m)
            table[m] = {"fa4verify": {**dataclasses.asdict(c), "caught_by": by}}
            for v in self.verifier_names:
                table[m][v] = dataclasses.asdict(self.cell(m, v))
        return {
            "schema": "fa4verify.mutants/1",
            "where": self.where, "target": self.target, "profile": self.profile,
            "seed": self.seed, "archs": list(self.archs), "seconds": round(self.seconds, 2),
            "mutants": [dataclasses.asdict(get_mutant(m)) for m in self.mutants],
            "verifiers": [{"name": s.name, "group": s.group, "scope": s.scope, "title": s.title,
                           "judges": s.judges} for s in map(_spec, self.verifier_names)],
            "headline": self.headline(),
            "problems": [dataclasses.asdict(p) for p in self.problems],
            "unavailable": dict(self.unavailable),
            "false_alarms": {v: [dataclasses.asdict(r) for r in rs] for v, rs in fa.items()},
            "table": table,
            "rows": [dataclasses.asdict(r) for r in self.rows],
        }


#: Extra backward calls per backward-mutant run for the run-to-run determinism check (upstream's
#: race-condition test runs 1000; a shuffled order over n KV blocks repeats the deterministic
#: fp32 sums with probability <= 2/n!: 2 extra calls on 6 blocks all repeat it with p < 1e-5).
BWD_REPEATS: dict[str, int] = {"quick": 2, "full": 8}


def _spec(name: str) -> VerifierSpec:
    for s in _REGISTRY:
        if s.name == name:
            return s
    raise KeyError(f"unknown verifier {name!r}")


def _mutant_applies(m: Mutant, p: Problem, arch: str) -> bool:
    if arch not in m.archs or arch not in p.archs:
        return False
    if m.fp8_only and p.dtype != "fp8":
        return False
    return p.dtype in m.dtypes


def _evaluate(spec: VerifierSpec, *args) -> Verdict:
    try:
        return spec.fn(*args)
    except DependencyMissing:
        raise
    except Exception as exc:  # noqa: BLE001 - a broken verifier is an "error" cell, not a crash
        return Verdict("error", None, f"{type(exc).__name__}: {exc}".splitlines()[0][:300])


def run_suite(profile: Literal["quick", "full"] = "quick", *, seed: int = 0,
              archs: Sequence[str] = ("sm90", "sm100"), mutants: Sequence[str] | None = None,
              verifier_names: Sequence[str] | None = None,
              problems: Sequence[Problem] | None = None,
              progress: Callable[[str], None] | None = None,
              target: Literal["twin", "production"] = "twin") -> SuiteResult:
    """Run every selected verifier on the unmutated twin and on every mutant, over the battery.

    ``target="production"`` runs FA4 itself on the local GPU (:func:`run_production`): only the
    mutants of :data:`PRODUCTION_KNOBS`, only :data:`PRODUCTION_VERIFIERS`, on the GPU's arch;
    figures are labelled "measured on <GPU>".

    Work: per (problem, arch) one unmutated twin run (forward; backward twice when the problem
    has a backward pass) and one run per applicable mutant. The exp2 verifiers run once per
    polynomial mutant. ``progress`` receives one line per finished unit of work.
    """
    import time
    t0 = time.perf_counter()
    say = progress or (lambda s: None)
    muts = [get_mutant(n) for n in (mutants or MUTANT_NAMES)]
    specs = [s for s in verifiers() if verifier_names is None or s.name in verifier_names]
    runner: Callable[..., TwinOutputs] = run_twin
    where = "CPU twin"
    if target == "production":
        arch0 = production.production_arch()
        archs = (arch0,)
        muts = [m for m in muts if m.production]
        specs = [s for s in specs if s.name in production.PRODUCTION_VERIFIERS]
        runner = production.run_production
        where = (f"measured on {_torch().cuda.get_device_name()}"
                 if production.PRODUCTION_DEVICE == "cuda" else "CPU twin")
    elif target != "twin":
        raise ValueError(f"target={target!r}: expected 'twin' or 'production'")
    if verifier_names is not None:
        unknown = set(verifier_names) - {s.name for s in _REGISTRY}
        if unknown:
            raise KeyError(f"unknown verifier(s) {sorted(unknown)}")
    probs = tuple(problems) if problems is not None else battery(profile)  # type: ignore[arg-type]
    if target == "production":  # the adapter runs fp16/bf16 (fp8 is a private SM100 path)
        probs = tuple(p for p in probs if p.dtype == "bf16")
    res = SuiteResult(profile=profile, seed=seed, archs=tuple(archs), problems=probs,
                      target=target, where=where, mutants=tuple(m.name for m in muts),
                      verifier_names=tuple(s.name for s in specs))
    live = list(specs)

    def record(mname: str, arch: str, pname: str, spec: VerifierSpec, v: Verdict) -> None:
        fig = v.figure
        if isinstance(fig, (np.floating, np.integer)):
            fig = float(fig)
        res.rows.append(Row(mname, arch, pname, spec.name, v.status, fig, v.detail))

    # exp2-scope verifiers: once for the unmutated emulation and once per polynomial mutant
    for spec in [s for s in live if s.scope == "exp2"]:
        try:
            record("none", "-", "exp2-inputs", spec, _evaluate(spec, None, profile))
            for m in muts:
                record(m.name, "-", "exp2-inputs", spec, _evaluate(spec, m, profile))
            say(f"exp2 verifier {spec.name}: done")
        except DependencyMissing as exc:
            res.unavailable[spec.name] = str(exc)
            live.remove(spec)
    pspecs = [s for s in live if s.scope == "problem"]
    for p in probs:
        data = make_inputs(p, seed)
        refs = None
        for arch in archs:
            if arch not in p.archs:
                continue
            sb, sb_err = None, None
            if any(sp.name == "stages" for sp in pspecs):
                try:
                    sb = load_budgets(p.dtype, arch)
                except DependencyMissing as exc:
                    sb_err = str(exc)

            def _mark(run: TwinOutputs) -> TwinOutputs:
                if sb_err:
                    run.stage_tally, run.stage_error = {}, sb_err
                return run
            base = _mark(runner(data, arch, (), bwd=p.bwd, repeat_bwd=1 if p.bwd else 0,
                                stage_budgets=sb))
            env = ProblemEnv(data=data, arch=arch, base=base, refs=refs)

            for spec in list(pspecs):
                if base.error is not None:
                    record("none", arch, p.name, spec, Verdict("error", None, base.error))
                    continue
                try:
                    record("none", arch, p.name, spec, _evaluate(spec, env, base))
                except DependencyMissing as exc:
                    res.unavailable[spec.name] = str(exc)
                    pspecs.remove(spec)
            say(f"{p.name}[{arch}] unmutated: done")
            for m in muts:
                if not _mutant_applies(m, p, arch) or (
                        target == "production" and not production.production_applies(m, p)):
                    continue
                # run-to-run repeats only where the backward itself is mutated (a forward
                # mutant changes the backward's inputs, so no reference manifest applies)
                reps = BWD_REPEATS[profile] if (p.bwd and "bwd" in m.passes) else 0
                run = _mark(runner(data, arch, (m.name,), bwd=p.bwd, repeat_bwd=reps,
                                   stage_budgets=sb))
                for spec in pspecs:
                    if run.error is not None:
                        record(m.name, arch, p.name, spec, Verdict("error", None, run.error))
                        continue
                    try:
                        record(m.name, arch, p.name, spec, _evaluate(spec, env, run))
                    except DependencyMissing as exc:  # pragma: no cover - caught on the base run
                        record(m.name, arch, p.name, spec, Verdict("error", None, str(exc)))
                say(f"{p.name}[{arch}] {m.name}: done")
            refs = env.refs  # shared by the archs of this problem
    res.verifier_names = tuple(s.name for s in specs if s.name not in res.unavailable)
    res.seconds = time.perf_counter() - t0
    return res


def uncaught(res: SuiteResult) -> tuple[list[str], list[str]]:
    """``(missed, not_applicable)``: mutants fa4verify ran on but did not catch (missed, error
    or false alarm), and mutants no selected problem/arch applies to (e.g. SM100-only faults in
    an ``--arch sm90`` run)."""
    missed, na = [], []
    for m in res.mutants:
        c, _ = res.fa4verify_cell(m)
        if c.status == "n/a":
            na.append(m)
        elif c.status != "caught":
            missed.append(m)
    return missed, na


def exit_code(res: SuiteResult) -> int:
    """0: fa4verify caught every mutant that applies and raised no false alarm; 1: a miss or a
    false alarm; 5: nothing ran (every verdict an error or n/a)."""
    if not any(r.status in ("pass", "fail") for r in res.rows):
        return 5
    fa = res.false_alarms()
    if any(fa[v] for v in res.verifier_names if _spec(v).group == "fa4verify"):
        return 1
    return 1 if uncaught(res)[0] else 0
