"""Audit checks: call sequences against FA4's compile cache (Note [Call sequences],
:mod:`fa4verify.sequences`).

* ``sequences.production`` (GPU) -- the state machine on production FA4, one sequence per
  engine case (Note [One sequence per case]): calls in one process that share kernels and vary every attribute the installed FA4's compile key leaves out
  (window values, softmax_scale, sink, sequence lengths, batch, head count, non-contiguous /
  transposed / broadcast layouts, the backward's mode, a score_mod's runtime aux scalars), each
  judged by the one judge. default: 3 sequences of up to 5 calls; full: 10 x 6; exhaustive: 40 x 8;
  and in every profile the constructed sequence (Note [Constructed sequence]): every attribute
  the installed key leaves out varied alone on a kernel an earlier call compiled. A violation is shrunk to the
  shortest failing sequence, written as a replayable case and replayed in fresh processes
  ("sequence bug": fails in sequence, passes alone; "plain bug": fails alone).
* ``sequences.twin`` (CPU, full / exhaustive) -- the machine's own power: on the CPU twin behind
  a model of FA4's compile cache keyed like the installed FA4, clean sequences pass and two planted
  key faults (the softcap value and causal removed from the key) are found, shrunk to two calls
  and classified sequence bugs.

Options: ``--opt sequences_examples=N``, ``--opt sequences_steps=N``.
"""
from __future__ import annotations

import dataclasses
import tempfile
from typing import Any

from fa4verify.audit.registry import CheckContext, CheckResult, check

_PLAN = {"quick": (3, 5), "default": (3, 5), "full": (10, 6), "exhaustive": (40, 8)}
#: planted faults sequences.twin must find (attributes removed from the twin's key model); the
#: machine draws no block-sparse calls, so the shared block lists' pattern is planted against the
#: constructed pair (Note [Shared block lists])
PLANTED = (("softcap",), ("causal",), ("block_broadcast",))
_CONSTRUCTED_ONLY = frozenset({"block_broadcast"})


def _plan(ctx: CheckContext) -> tuple[int, int]:
    n, steps = _PLAN.get(ctx.profile, _PLAN["default"])
    opts = getattr(ctx, "options", None) or {}
    try:
        n = int(opts.get("sequences_examples", n))
        steps = int(opts.get("sequences_steps", steps))
    except ValueError as e:
        raise ValueError(f"--opt sequences_examples / sequences_steps: {e}") from None
    if n < 1 or steps < 1:
        raise ValueError("--opt sequences_examples and sequences_steps must be >= 1")
    return n, steps


def result(res: Any, where: str) -> CheckResult:
    """The verdict of one machine run (:class:`fa4verify.sequences.machine.SequenceResult`)."""
    from fa4verify.fuzz.campaign import judged_shortfall
    from fa4verify.sequences.key import left_out
    metrics = {"sequences": res.examples, "calls": res.calls, "judged": res.judged,
               "unsupported": sum(res.unsupported.values()), "fa4verify_errors": sum(res.errors.values()),
               "seconds": round(res.seconds, 1)}
    out_attrs = sorted(left_out())
    details: dict[str, Any] = {"exercised": res.exercised, "unsupported": res.unsupported, "errors": res.errors,
                               "undecided": res.undecided, "known_issues": res.known,
                               "key_leaves_out": left_out(), "target": res.target}
    if res.failure is not None:
        f = res.failure
        details["failure"] = f
        kind = f.get("kind", "not classified")
        return CheckResult(status="fail", where=where, metrics=metrics, details=details,
                           summary=(f"{f['property']} violated on call {f['length']} of a {f['length']}-call "
                                    f"sequence ({kind}): " + " -> ".join(f["describe"])[:400]))
    if res.errors:
        first = next(iter(res.errors))
        return CheckResult(status="error", where=where, metrics=metrics, details=details,
                           summary=f"fa4verify's own call failed on {metrics['fa4verify_errors']} call(s) "
                                   f"(first: {first}); {res.judged} calls judged")
    short = judged_shortfall(res.judged, res.calls, unit="calls", unsupported=metrics["unsupported"])
    if short is not None:
        return CheckResult(status="undecided", where=where, metrics=metrics, details=details, summary=short)
    tested = sorted(a for a in out_attrs if res.exercised.get(a))
    details["left_out_not_varied"] = sorted(set(out_attrs) - set(tested))
    # the attributes the key holds only through its callable hash: varied by construction
    # (Note [Constructed sequence]); one no call varied (refused, not run) is said
    from fa4verify.sequences.machine import BY_CALLABLE
    details["by_callable_not_varied"] = sorted(a for a in BY_CALLABLE if not res.exercised.get(a))
    if out_attrs and not tested:
        return CheckResult(status="undecided", where=where, metrics=metrics, details=details,
                           summary=(f"{res.judged} calls judged, but no call reused a kernel with another value "
                                    f"of an attribute the key leaves out ({', '.join(out_attrs)})"))
    if res.undecided:
        return CheckResult(status="undecided", where=where, metrics=metrics, details=details,
                           summary=f"{res.judged} calls, no violation, but the judge could not decide "
                                   + ", ".join(f"{k} x{v}" for k, v in res.undecided.items()))
    right = ("every call right or its violation explained by a documented FA4 issue ("
             + ", ".join(f"{k} x{v}" for k, v in sorted(res.known.items())) + ")") if res.known else "every call right"
    return CheckResult(status="pass", where=where, metrics=metrics, details=details,
                       summary=(f"{res.examples} sequences, {res.judged} calls judged in sequence, {right}; "
                                f"key-sharing calls varied {', '.join(tested) or '-'}"
                                + (f"; left out of the key but not varied (refused or not run): "
                                   f"{', '.join(details['left_out_not_varied'])}"
                                   if details["left_out_not_varied"] else "")
                                + (f"; held by the callable hash but not varied (refused or not run): "
                                   f"{', '.join(details['by_callable_not_varied'])}"
                                   if details["by_callable_not_varied"] else "")))


@dataclasses.dataclass(frozen=True)
class SequenceCase:
    """One call sequence of ``sequences.production``: example 1 of the machine's draw under its own
    seed (Note [One sequence per case])."""
    index: int
    seed: int
    steps: int
    #: the constructed sequence (Note [Constructed sequence]) instead of a drawn one
    constructed: bool = False

    def describe(self) -> str:
        if self.constructed:
            return "the constructed call sequence (every attribute the key leaves out, varied alone)"
        return f"call sequence {self.index} (seed {self.seed}, up to {self.steps} calls)"


def case_seed(seed: int, index: int) -> int:
    """The machine's seed of sequence ``index`` of an audit run with ``seed``."""
    return (int(seed) * 1_000_003 + 7919 * (index + 1)) % (2 ** 32)


def _production_cases(ctx: CheckContext) -> list:
    if ctx.dtype not in ("bf16", "fp16"):
        ctx.skip(f"the sequences draw bf16/fp16 calls; dtype {ctx.dtype} is not drawn")
    ctx.require_gpu()
    n, steps = _plan(ctx)
    return ([SequenceCase(i, case_seed(int(ctx.seed), i), steps) for i in range(n)]
            + [SequenceCase(n, 0, 0, constructed=True)])


def merge_results(parts: list) -> Any:
    """One :class:`~fa4verify.sequences.machine.SequenceResult` from the cases' (in case order):
    counts added, the first failing sequence the finding."""
    from fa4verify.sequences.machine import SequenceResult
    out = SequenceResult(target=parts[0].target, arch=parts[0].arch)
    for r in parts:
        out.examples += r.examples
        out.calls += r.calls
        out.judged += r.judged
        out.seconds += r.seconds
        for mine, theirs in ((out.unsupported, r.unsupported), (out.errors, r.errors),
                             (out.exercised, r.exercised), (out.undecided, r.undecided), (out.known, r.known)):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0) + v
        if out.failure is None and r.failure is not None:
            out.failure = r.failure
    return out


def _production_summary(ctx: CheckContext, results: list) -> CheckResult:
    return result(merge_results([v for _c, v in results]), ctx.where_measured())


def _production_compiles(ctx: CheckContext) -> list:
    """Note [Fake device audit]: a sequence's calls do not exist before it runs."""
    _production_cases(ctx)                       # its own skips first (dtype, GPU)
    ctx.skip(f"compile-only on a fake {ctx.require_gpu().label}: sequences.production draws each call "
             "of a sequence from Hypothesis's state machine as the sequence runs, so there is no list of "
             "FA4 calls to compile beforehand")


@check("sequences.production", title="Call sequences: compile-key collisions in production FA4 (GPU)",
       needs={"cuda", "fa4"}, profiles={"default", "full", "exhaustive"}, cost=40,
       cases=_production_cases, summarise=_production_summary, compiles=_production_compiles)
def production(ctx: CheckContext, case: SequenceCase) -> Any:
    """Note [One sequence per case]: each sequence is a case of its own, so the engine runs the
    sequences side by side in its workers (each from empty in-process compile caches, as every
    example of the machine starts). A sequence is the machine's example 1 under the case's seed:
    Hypothesis's example 0 is its minimal draw (every choice the simplest: one trivial problem
    called ``steps`` times), the same for every seed; it is drawn, not run (``first=1``)."""
    from fa4verify.sequences import machine
    gpu = ctx.require_gpu()
    spec = {"kind": "production"}
    if case.constructed:
        return machine.run_calls(machine.make_target(spec), machine.constructed_calls(gpu.arch, ctx.dtype),
                                 arch=gpu.arch, cases_dir=tempfile.mkdtemp(prefix="fa4v-seq-"), target_spec=spec)
    return machine.run_sequences(machine.make_target(spec), arch=gpu.arch, examples=1, first=1, steps=case.steps,
                                 seed=case.seed, cases_dir=tempfile.mkdtemp(prefix="fa4v-seq-"),
                                 target_spec=spec)


@check("sequences.twin", title="Call sequences: the machine finds planted compile-key faults (CPU twin)",
       needs={"cpu"}, profiles={"full", "exhaustive"})
def twin(ctx: CheckContext) -> CheckResult:
    from fa4verify.sequences import machine
    n, steps = _plan(ctx)
    rows, found = [], {}
    with ctx.progress(1 + len(PLANTED), "call sequences on the keyed twin") as bar:
        clean = machine.run_sequences(machine.make_target({"kind": "twin"}), examples=n, steps=steps,
                                      seed=int(ctx.seed), target_spec={"kind": "twin"})
        bar.advance(1)
        for drop in PLANTED:
            spec = {"kind": "twin", "drop": list(drop)}
            if set(drop) <= _CONSTRUCTED_ONLY:
                r = machine.run_calls(machine.make_target(spec), machine.constructed_calls(
                                      "sm90", ctx.dtype if ctx.dtype in ("bf16", "fp16") else "bf16", drop),
                                      arch="sm90", target_spec=spec)
            else:
                r = machine.run_sequences(machine.make_target(spec), examples=max(n, 10), steps=max(steps, 5),
                                          seed=int(ctx.seed), target_spec=spec)
            f = r.failure
            ok = f is not None and f.get("kind") == "sequence bug" and f["length"] == 2
            found["+".join(drop)] = f
            rows.append(["+".join(drop), "found" if ok else "MISSED",
                         "-" if f is None else f"{f['length']} calls ({f.get('kind')})"])
            bar.advance(1)
    base = result(clean, "CPU twin")
    missed = [r[0] for r in rows if r[1] != "found"]
    base.details["planted"] = {"table": {"columns": ["key field dropped", "outcome", "shrunk to"], "rows": rows},
                               "failures": found}
    base.metrics["planted_found_higher_is_better"] = len(rows) - len(missed)
    if base.status == "fail":
        base.summary = "clean keyed twin: " + base.summary
        return base
    if missed:
        return CheckResult(status="fail", where="CPU twin", metrics=base.metrics, details=base.details,
                           summary=f"planted compile-key fault(s) not found as 2-call sequence bugs: {missed}")
    base.summary = (f"planted key faults {', '.join(r[0] for r in rows)} found and shrunk to 2-call sequence bugs; "
                    f"clean: {base.summary}")
    return base
