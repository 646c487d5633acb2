"""The JSON audit report, schema ``fa4verify.audit/1``.

Top level (all keys always present unless marked optional)::

    schema        "fa4verify.audit/1"
    created       ISO-8601 UTC time the report was written
    command       argv of the run (list of str), or [] for merged reports
    config        AuditConfig.to_dict(): dtype, device, archs, profile, seed, keyword, shard, ...
    seeds         {"audit": int, "per_check": how per-check streams derive from it}
    environment   {"versions": {fa4verify, FA4, CuTe DSL, torch, numpy, python, ...},
                   "hardware": {cpu, os, device, gpu_name, driver, cuda_runtime, ...}}
                  (merged reports: "environments": list of these, one per shard)
    summary       {"counts": {status: n}, "exit_code": int, "duration_s": float,
                   "verdict": str, "where": {where: n}}
    results       list of per-check dicts: id, check_id, title, module, arch, needs, status,
                  where, summary, metrics, details, tightness, duration_s, isolated, notes
    fingerprint   {"digest": sha256 hex, "parts": {...}}: what the audit was (Note [Audit
                   fingerprint]); the shards of one audit share it
    baseline      (optional) {"path": str, "regressions": [...], "improvements": [...],
                   "missing": [...], "new": [...], "compared": int, "undecided": str|None}

Non-finite floats are written as the strings "nan", "inf", "-inf" (JSON has no NaN) and read
back as floats by :func:`load_report`.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
from typing import Any, Sequence
from fa4verify.errors import ReportError

SCHEMA = "fa4verify.audit/1"
PER_CHECK_SEED = ("numpy.random.default_rng([seed, crc32(check_id + '\\0' + stream)]) "
                  "(fa4verify.audit.registry.CheckContext.rng)")


def _sanitize(obj: Any) -> Any:
    if isinstance(obj, float):
        if math.isnan(obj):
            return "nan"
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
        return obj
    if isinstance(obj, dict):
        return {str(k): _sanitize(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_sanitize(v) for v in obj]
    return obj


def as_number(v: Any) -> float | None:
    """A metric value as a float (``"nan"``/``"inf"`` strings included), or None if textual."""
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str) and v in ("nan", "inf", "-inf"):
        return float(v)
    return None


def counts(results: Sequence[dict[str, Any]]) -> dict[str, int]:
    out = {k: 0 for k in ("pass", "fail", "error", "undecided", "skip")}
    for r in results:
        out[r["status"]] = out.get(r["status"], 0) + 1
    return out


def where_counts(results: Sequence[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in results:
        if r["status"] == "skip":
            continue
        w = r.get("where") or ("no result" if r["status"] == "error" else "unspecified")
        out[w] = out.get(w, 0) + 1
    return out


def verdict_text(exit_code: int) -> str:
    return {0: "PASSED: every check that ran is within budget",
            1: "FAILED: budget, determinism or bit-exactness violation (or baseline regression)",
            2: "USAGE ERROR",
            3: "ERROR: a check could not complete (exception, crash or import error)",
            5: "NOTHING RAN: no check passed or failed (all skipped or none selected)",
            10: "UNDECIDED: a certified comparison could not decide"}.get(exit_code, f"exit {exit_code}")


#: Note [Audit fingerprint]
#: ------------------------
#: What makes two reports parts of ONE audit (``report merge``) or the same question
#: (``--baseline``): the checks asked (profile, keyword, archs, dtype, device, seed, options,
#: the checks modules with their content hashes), the deployment, the error-budget files
#: (content hashes: a budget edit is another audit), the software versions and the GPU model.
#: Execution-only knobs (shard, workers, kernel cache, isolation, timeout, check shards) and the
#: host (name, CPU) are left out: shards of one audit run on different machines.
FINGERPRINT_CONFIG = ("dtype", "device", "archs", "profile", "seed", "keyword", "no_default_checks",
                      "opts", "deployment", "budget_file")
FINGERPRINT_VERSIONS_IGNORED = ("python",)


def _file_sha256(path: str) -> str | None:
    import hashlib

    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def budget_file_hashes(extra: str | None = None) -> dict[str, str | None]:
    """sha256 of every shipped budget file (``error_budgets/*.toml``), plus ``extra``
    (``$FA4VERIFY_BUDGET_FILE``) when set, keyed by file name."""
    import glob
    import os

    from fa4verify import error_budgets

    d = os.path.dirname(error_budgets.__file__)
    out = {os.path.basename(p): _file_sha256(p) for p in sorted(glob.glob(os.path.join(d, "*.toml")))}
    if extra:
        out[f"FA4VERIFY_BUDGET_FILE:{extra}"] = _file_sha256(extra)
    return out


def fingerprint(config: dict[str, Any], environment: dict[str, Any]) -> dict[str, Any]:
    """The audit fingerprint of a report (Note [Audit fingerprint]): ``{"digest", "parts"}``."""
    import hashlib
    import os

    hw = (environment or {}).get("hardware") or {}
    versions = {k: v for k, v in sorted(((environment or {}).get("versions") or {}).items())
                if k not in FINGERPRINT_VERSIONS_IGNORED}
    parts = {
        "config": {k: config.get(k) for k in FINGERPRINT_CONFIG},
        # by file name and content: shards run from different checkouts name other paths
        "checks_modules": [[os.path.basename(str(m)), _file_sha256(str(m)) if str(m).endswith(".py") else None]
                           for m in (config.get("checks_modules") or ())],
        "budget_files": budget_file_hashes(config.get("budget_file")),
        "versions": versions,
        "gpu": hw.get("gpu_name") if config.get("device") == "cuda" else None,
    }
    blob = json.dumps(_sanitize(parts), sort_keys=True, default=str)
    return {"digest": hashlib.sha256(blob.encode()).hexdigest(), "parts": _sanitize(parts)}


def fingerprint_difference(a: dict[str, Any], b: dict[str, Any]) -> str:
    """The first part in which two fingerprints differ, as ``part.key: x vs y`` (for messages)."""
    pa, pb = (a or {}).get("parts") or {}, (b or {}).get("parts") or {}
    for part in sorted(set(pa) | set(pb)):
        x, y = pa.get(part), pb.get(part)
        if x == y:
            continue
        if isinstance(x, dict) and isinstance(y, dict):
            for k in sorted(set(x) | set(y), key=str):
                if x.get(k) != y.get(k):
                    return f"{part}.{k}: {x.get(k)!r} vs {y.get(k)!r}"
        return f"{part}: {x!r} vs {y!r}"
    return "digest"


def build_report(*, config: dict[str, Any], environment: dict[str, Any],
                 results: list[dict[str, Any]], exit_code: int, duration_s: float,
                 command: Sequence[str] = (), baseline: dict[str, Any] | None = None,
                 environments: list[dict[str, Any]] | None = None,
                 audit_fingerprint: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report dict; ``audit_fingerprint`` (a merge passes its shards' one) defaults to
    :func:`fingerprint` of ``config`` and ``environment``."""
    rep: dict[str, Any] = {
        "schema": SCHEMA,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": list(command),
        "config": config,
        "seeds": {"audit": config.get("seed"), "per_check": PER_CHECK_SEED},
        "environment": environment,
        "summary": {"counts": counts(results), "exit_code": int(exit_code),
                    "duration_s": round(float(duration_s), 3), "verdict": verdict_text(exit_code),
                    "where": where_counts(results)},
        "results": results,
        "fingerprint": audit_fingerprint if audit_fingerprint is not None else fingerprint(config, environment),
    }
    if environments is not None:
        rep["environments"] = environments
    if baseline is not None:
        rep["baseline"] = baseline
    return rep


def dumps(report: dict[str, Any]) -> str:
    return json.dumps(_sanitize(report), indent=2, sort_keys=False, allow_nan=False) + "\n"


def _is_num(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) or v in ("nan", "inf", "-inf")


def validate(rep: Any, source: str = "report") -> dict[str, Any]:
    """Check the shape of a loaded report (raises :class:`ReportError`): every field a reader
    uses (merge, baseline, show, the renderers) has its type, so a wrongly typed field is one
    line, never a crash halfway through a merge."""
    if not isinstance(rep, dict):
        raise ReportError(f"{source}: not a JSON object")
    schema = rep.get("schema")
    if schema != SCHEMA:
        raise ReportError(f"{source}: schema {schema!r} is not {SCHEMA!r}")
    res = rep.get("results")
    if not isinstance(res, list):
        raise ReportError(f"{source}: 'results' is missing or not a list")
    for i, r in enumerate(res):
        if not isinstance(r, dict) or not isinstance(r.get("id"), str) or r.get("status") not in (
                "pass", "fail", "skip", "error", "undecided"):
            raise ReportError(f"{source}: results[{i}] lacks a valid id/status")
        for key, types, what in (("metrics", dict, "an object"), ("details", dict, "an object"),
                                 ("summary", str, "a string"), ("where", str, "a string"),
                                 ("title", str, "a string"), ("check_id", str, "a string"),
                                 ("module", str, "a string"), ("arch", str, "a string"),
                                 ("needs", list, "a list"), ("notes", list, "a list"),
                                 ("timing", list, "a list")):
            if r.get(key) is not None and not isinstance(r[key], types):
                raise ReportError(f"{source}: results[{i}].{key} is not {what}")
        for key in ("duration_s", "tightness"):
            if r.get(key) is not None and not _is_num(r[key]):
                raise ReportError(f"{source}: results[{i}].{key} {r[key]!r} is not a number")
    for key in ("config", "summary", "environment", "fingerprint", "seeds"):
        if rep.get(key) is not None and not isinstance(rep[key], dict):
            raise ReportError(f"{source}: {key!r} is not an object")
    cfg = rep.get("config") or {}
    for key in ("dtype", "device", "profile", "keyword", "shard"):
        if cfg.get(key) is not None and not isinstance(cfg[key], str):
            raise ReportError(f"{source}: config.{key} {cfg[key]!r} is not a string")
    if cfg.get("archs") is not None and not (isinstance(cfg["archs"], list)
                                             and all(isinstance(a, str) for a in cfg["archs"])):
        raise ReportError(f"{source}: config.archs is not a list of strings")
    if cfg.get("seed") is not None and (isinstance(cfg["seed"], bool) or not isinstance(cfg["seed"], int)):
        raise ReportError(f"{source}: config.seed {cfg['seed']!r} is not an integer")
    summ = rep.get("summary") or {}
    if summ.get("duration_s") is not None and not _is_num(summ["duration_s"]):
        raise ReportError(f"{source}: summary.duration_s {summ['duration_s']!r} is not a number")
    if rep.get("environments") is not None and not (isinstance(rep["environments"], list) and all(
            isinstance(e, dict) for e in rep["environments"])):
        raise ReportError(f"{source}: 'environments' is not a list of objects")
    env = rep.get("environment") or {}
    for key in ("versions", "hardware"):
        if env.get(key) is not None and not isinstance(env[key], dict):
            raise ReportError(f"{source}: environment.{key} is not an object")
    fp = rep.get("fingerprint")
    if fp is not None and not (isinstance(fp.get("digest"), str) and isinstance(fp.get("parts", {}), dict)):
        raise ReportError(f"{source}: fingerprint lacks a digest string")
    return rep


def load_report(path: str) -> dict[str, Any]:
    """Read and validate a JSON report; any problem is a one-line :class:`ReportError`."""
    from fa4verify.error_budgets.input_files import InputPathError, read_input_text

    try:
        text = read_input_text(path)
    except InputPathError as e:
        msg = str(e)
        if "not UTF-8" in msg:
            msg = f"{path}: not UTF-8 text (corrupt report?)"
        raise ReportError(msg) from None
    try:
        rep = json.loads(text)
    except json.JSONDecodeError as e:
        raise ReportError(f"{path}: corrupt JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    return validate(rep, path)
