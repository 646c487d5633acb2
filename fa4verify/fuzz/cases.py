"""Replayable fuzz cases: write, load and replay the shrunk failure of a campaign, and the pytest
snippet that pins it.


Note [Fuzz cases are replayable]
--------------------------------
A failing example is shrunk by Hypothesis, and the *final* (shrunk) failure is written as a JSON
case (:data:`CASE_FORMAT`) holding the problem (shapes, flags and a value seed -- the arrays are
regenerated from it), the target, arch, mutations, violated property, message and metrics. Replay
it with ``fa4verify fuzz --replay CASE.json`` or :func:`replay_case`; commit it under
``tests/regressions/`` to keep it as a regression vector (``tests/test_fuzz_regressions.py``
replays every file there). The Hypothesis example database is a disposable cache, never a record.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
from pathlib import Path
from typing import Any, Collection, Mapping, Optional

from fa4verify.problem import AttentionProblem
from fa4verify.fuzz.properties import check_problem
from fa4verify.fuzz.violation import Violation, replay_properties
from fa4verify.targets import Target, make_target
from fa4verify.errors import Unsupported

CASE_FORMAT = "fa4verify-fuzz-case/1"


def _versions() -> dict[str, Optional[str]]:
    from fa4verify.kernels.facts import dist_version
    return {d: dist_version(d) for d in ("fa4verify", "hypothesis", "numpy", "flash-attn-4", "nvidia-cutlass-dsl")}


def write_case(directory: os.PathLike, problem: AttentionProblem, violation: Violation, *,
               target: Target, profile: str = "", seed: Optional[int] = None) -> Path:
    """Write a replayable JSON case (Note [Fuzz cases are replayable]); never overwrites: the
    file name is ``<property>-<target>-<digest>.json``. Returns the path."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    desc = target.describe()
    case = {
        "format": CASE_FORMAT,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "target": desc["target"], "where": desc["where"],
        "arch": problem.arch, "mutations": desc.get("mutations", []),
        "property": violation.prop, "properties": list(replay_properties(violation)), "message": violation.message,
        "metrics": {k: (v if not isinstance(v, float) or math.isfinite(v) else repr(v))
                    for k, v in violation.metrics.items()},
        "expect": "fail", "profile": profile, "seed": seed,
        "problem": problem.to_dict(), "versions": _versions(),
    }
    stem = f"{violation.prop}-{desc['target']}{'-' + '+'.join(desc.get('mutations', [])) if desc.get('mutations') else ''}-{problem.digest()}"
    path = d / f"{stem}.json"
    n = 1
    while path.exists():
        path = d / f"{stem}-{n}.json"
        n += 1
    from fa4verify.audit.atomic import atomic_write_text
    atomic_write_text(str(path), json.dumps(case, indent=2, sort_keys=True) + "\n")   # never a torn file
    return path


#: Note [Replay limits]: a case file is input, and a replay materializes its problem (the float64
#: oracle holds a seqlen_q x seqlen_k score matrix per head): sizes past these are refused up
#: front (exit 2, the limit named) instead of a MemoryError. Far above any drawn problem (the
#: nightly profile: seqlen 600, work 6e7).
REPLAY_LIMITS = {"seqlen": 8192, "batch": 256, "heads": 128, "work": 1 << 31}


def _int(d: Mapping[str, Any], key: str, lo: int, hi: int) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"problem.{key}: expected an integer, got {v!r}")
    if not lo <= v <= hi:
        raise ValueError(f"problem.{key}={v} is outside [{lo}, {hi}] (replay limit)")
    return v


def check_problem_dict(d: Any) -> None:
    """Types and sizes of a case's ``problem`` (Note [Replay limits]); raises ValueError with a
    one-line message naming the field. The problem's own checks (supported head dims, varlen
    consistency) follow in :class:`AttentionProblem`."""
    if not isinstance(d, Mapping):
        raise ValueError(f"problem: expected an object, got {type(d).__name__}")
    for k in ("arch", "dtype"):
        if not isinstance(d.get(k), str):
            raise ValueError(f"problem.{k}: expected a string, got {d.get(k)!r}")
    L = REPLAY_LIMITS
    b = _int(d, "batch", 0, L["batch"])
    sq, sk = _int(d, "seqlen_q", 0, L["seqlen"]), _int(d, "seqlen_k", 0, L["seqlen"])
    h = _int(d, "nheads", 1, L["heads"])
    _int(d, "nheads_kv", 1, L["heads"])
    hd, hdv = _int(d, "head_dim", 1, 1024), _int(d, "head_dim_v", 1, 1024)
    work = max(b, 1) * h * sq * sk * max(hd, hdv)
    if work > L["work"]:
        raise ValueError(f"problem: batch*nheads*seqlen_q*seqlen_k*head_dim = {work} exceeds the "
                         f"replay limit {L['work']}")
    ws = d.get("window_size")
    if ws is not None:
        if (not isinstance(ws, (list, tuple)) or len(ws) != 2
                or any(w is not None and (isinstance(w, bool) or not isinstance(w, int) or abs(w) > 1 << 31)
                       for w in ws)):
            raise ValueError(f"problem.window_size: expected [left, right] of integers or null, got {ws!r}")
    for k in ("causal", "sink"):
        if d.get(k) is not None and not isinstance(d.get(k), bool):
            raise ValueError(f"problem.{k}: expected true/false, got {d.get(k)!r}")
    for k, lo in (("softcap", 0.0), ("softmax_scale", None)):
        v = d.get(k)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (
                lo is not None and v < lo) or (lo is None and v <= 0):
            raise ValueError(f"problem.{k}: expected a finite {'>= 0' if lo is not None else '> 0'} "
                             f"number, got {v!r}")
    for k in ("seqlens_q", "seqlens_k"):
        v = d.get(k)
        if v is None:
            continue
        if not isinstance(v, list) or len(v) > L["batch"] or any(
                isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= L["seqlen"] for x in v):
            raise ValueError(f"problem.{k}: expected a list of at most {L['batch']} integers in "
                             f"[0, {L['seqlen']}] (replay limit)")
    for k in ("mask_mod", "values", "call"):
        if d.get(k) is not None and not isinstance(d.get(k), Mapping):
            raise ValueError(f"problem.{k}: expected an object, got {d.get(k)!r}")
    call = d.get("call")
    if isinstance(call, Mapping):
        for k in ("kv_capacity", "q_capacity", "page_size"):
            if call.get(k) is not None:
                v = call[k]
                if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= L["seqlen"]:
                    raise ValueError(f"problem.call.{k}: expected an integer in [0, {L['seqlen']}] (replay limit), "
                                     f"got {v!r}")
    mods = d.get("mods")
    if mods is not None and (not isinstance(mods, list) or not all(isinstance(m, str) for m in mods)):
        raise ValueError(f"problem.mods: expected a list of names, got {mods!r}")
    if "mod_seed" in d:
        _int(d, "mod_seed", 0, 2**63 - 1)


def load_case(path_or_dict: os.PathLike | Mapping[str, Any]) -> dict[str, Any]:
    """Read and validate a case file; returns the dict with ``problem`` parsed to an
    :class:`AttentionProblem` under ``"problem_obj"``. A malformed case raises ValueError (one
    line), never reaches a kernel."""
    if isinstance(path_or_dict, Mapping):
        case = dict(path_or_dict)
    else:
        case = json.loads(Path(path_or_dict).read_text())
    if not isinstance(case, dict):
        raise ValueError(f"not a fuzz case: a JSON {type(case).__name__}, not an object")
    if case.get("format") != CASE_FORMAT:
        raise ValueError(f"not a fuzz case: format={case.get('format')!r} (expected {CASE_FORMAT!r})")
    check_problem_dict(case.get("problem"))
    for k in ("target", "property"):
        if not isinstance(case.get(k), str):
            raise ValueError(f"{k}: expected a string, got {case.get(k)!r}")
    if not isinstance(case.get("mutations", []), list):
        raise ValueError(f"mutations: expected a list, got {case.get('mutations')!r}")
    try:
        case["problem_obj"] = AttentionProblem.from_dict(case["problem"])
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise ValueError(f"problem: {e}") from None
    return case


@dataclasses.dataclass
class ReplayOutcome:
    status: str                     # "fail" | "pass" | "undecided" | "unsupported" | "skipped"
    property: Optional[str]
    message: str
    metrics: dict[str, Any]


def replay_case(case: os.PathLike | Mapping[str, Any], *, target: Optional[Target] = None,
                properties: Optional[Collection[str]] = None) -> ReplayOutcome:
    """Re-run a case. By default the case's own target and mutations, and only the properties
    that judged it (``properties`` overrides; pass :data:`PROPERTIES` for all)."""
    c = load_case(case)
    problem: AttentionProblem = c["problem_obj"]
    if target is None:
        target = make_target(c["target"], mutations=c.get("mutations", ()))
    props = tuple(properties) if properties is not None else tuple(
        c.get("properties") or replay_properties(Violation(c["property"], "", c.get("metrics"))))
    try:
        out = check_problem(problem, target, properties=props)
    except Violation as v:
        return ReplayOutcome("fail", v.prop, v.message, v.metrics)
    except Unsupported as e:
        return ReplayOutcome("unsupported", None, str(e), {})
    if not out.ran:
        return ReplayOutcome("skipped", None, "; ".join(f"{k}: {v}" for k, v in out.skipped.items()), out.metrics)
    if out.undecided:
        return ReplayOutcome("undecided", next(iter(out.undecided)).split(".")[0],
                             "; ".join(f"{k}: {v}" for k, v in out.undecided.items()), out.metrics)
    return ReplayOutcome("pass", None, f"ran {out.ran}", out.metrics)


def regression_snippet(problem: AttentionProblem, violation: Violation, *, target: Target,
                       case_path: Optional[os.PathLike] = None) -> str:
    """A pytest snippet that pins the shrunk counterexample: an ``@example`` for a Hypothesis
    test over :func:`attention_problems` and a plain regression test."""
    desc = target.describe()
    muts = desc.get("mutations", [])
    js = problem.to_json()
    target_expr = f"TwinTarget({sorted(muts)!r})" if desc["target"] == "twin" else "ProductionTarget()"
    lines = [
        f"# Shrunk counterexample: property {violation.prop!r} on {desc['where']}"
        + (f" with mutations {muts}" if muts else ""),
        f"# {problem.describe()}",
    ]
    if case_path is not None:
        lines.append(f"# case file: {case_path}  (replay: fa4verify fuzz --replay {case_path})")
    lines += [
        "from hypothesis import example, given",
        "from fa4verify.fuzz import TwinTarget, ProductionTarget, check_problem",
        "from fa4verify.problem import AttentionProblem",
        "from fa4verify.strategies import attention_problems",
        "",
        f"@example(AttentionProblem.from_json({js!r}))",
        f"@given(attention_problems(arch={problem.arch!r}, dtype={problem.dtype!r}))",
        "def test_fuzz_properties(problem):",
        f"    check_problem(problem, {target_expr}, properties={list(replay_properties(violation))!r})",
    ]
    return "\n".join(lines)
