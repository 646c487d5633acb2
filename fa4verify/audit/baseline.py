"""Baseline comparison (``--baseline previous.json``) and report merging (``report merge``).

Regression rule: for every check id present (and not skipped) in both reports, every numeric
metric present in both is compared.  Larger is worse unless the metric name ends with
``_higher_is_better``.  A metric that got worse by more than ``rtol * |old|`` (default rtol 0:
any growth) is a regression, even if the check still passes its budget; NaN where the baseline
had a number is a regression too.  A check that passed in the baseline and now fails or errors
is a regression (it already fails the gate on its own).  ``tightness`` is compared like a metric.
Checks only in one of the two reports are listed ("missing"/"new"), not failed.

A baseline that compares nothing -- no check id in both reports ran in both with a finite metric
in both (all-nan metrics, all skips, another version's check ids) -- cannot say "no regression":
the comparison is undecided (``compared`` 0, ``undecided`` the reason) and the gate's 0 becomes
10 (:func:`gate`).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from fa4verify.audit.report_json import as_number, build_report, counts, fingerprint_difference
from fa4verify.errors import ReportError

HIB = "_higher_is_better"


def _worse(name: str, old: float, new: float, rtol: float) -> bool:
    if math.isnan(old):
        return False
    if math.isnan(new):
        return True
    higher_better = name.endswith(HIB)
    delta = (old - new) if higher_better else (new - old)
    if math.isinf(old) and math.isinf(new) and old == new:
        return False
    return delta > rtol * abs(old) if math.isfinite(old) else delta > 0


def _better(name: str, old: float, new: float) -> bool:
    if math.isnan(old) or math.isnan(new):
        return False
    return (new > old) if name.endswith(HIB) else (new < old)


def compare(current: Sequence[dict[str, Any]], baseline: dict[str, Any], *,
            rtol: float = 0.0, path: str = "") -> dict[str, Any]:
    """Compare current results (report-format dicts) against a loaded baseline report."""
    base = {r["id"]: r for r in baseline.get("results", [])}
    cur = {r["id"]: r for r in current}
    regressions: list[dict[str, Any]] = []
    improvements: list[dict[str, Any]] = []
    compared = 0                     # (check, metric) pairs with a finite value on both sides
    both_ran = 0
    for cid, r in cur.items():
        b = base.get(cid)
        if b is None or r["status"] == "skip" or b["status"] == "skip":
            continue
        both_ran += 1
        if b["status"] == "pass" and r["status"] in ("fail", "error", "undecided"):
            regressions.append({"id": cid, "metric": "status", "old": b["status"],
                                "new": r["status"]})
        items = dict(b.get("metrics") or {})
        cm = dict(r.get("metrics") or {})
        if b.get("tightness") is not None and r.get("tightness") is not None:
            items["tightness"] = b["tightness"]
            cm["tightness"] = r["tightness"]
        for name, ov in items.items():
            if name not in cm:
                continue
            o, n = as_number(ov), as_number(cm[name])
            if o is None or n is None:
                continue
            if math.isfinite(o) and math.isfinite(n):
                compared += 1
            if _worse(name, o, n, rtol):
                regressions.append({"id": cid, "metric": name, "old": ov, "new": cm[name]})
            elif _better(name, o, n):
                improvements.append({"id": cid, "metric": name, "old": ov, "new": cm[name]})
    missing = sorted(set(base) - set(cur))
    new = sorted(set(cur) - set(base))
    undecided = None
    if compared == 0:
        if not set(base) & set(cur):
            undecided = "no check id in both reports (another version's or selection's checks?)"
        elif both_ran == 0:
            undecided = "no check ran in both reports (skipped in one or the other)"
        else:
            undecided = f"no finite metric in both reports for the {both_ran} check(s) run in both"
    return {"path": path, "rtol": rtol, "regressions": regressions, "improvements": improvements,
            "missing": missing, "new": new, "compared": compared, "undecided": undecided, "baseline_config": baseline.get("config") or {},
            "baseline_versions": (baseline.get("environment") or {}).get("versions", {})}


def gate(code: int, bl: dict[str, Any] | None) -> int:
    """The exit code with a baseline: a passing run (0) whose baseline compared nothing is
    undecided (10), never "0 regressions"; every other code stands."""
    if bl is not None and code == 0 and bl.get("undecided"):
        return 10
    return code


def config_mismatch(current_config: dict[str, Any], baseline: dict[str, Any]) -> list[str]:
    """Human-readable differences of dtype/profile/archs between a run and its baseline."""
    bc = baseline.get("config") or {}
    out = []
    for k in ("dtype", "profile", "archs", "device"):
        if k in bc and k in current_config and bc[k] != current_config[k]:
            out.append(f"{k}: baseline {bc[k]!r} vs now {current_config[k]!r}")
    return out


_MERGE_KEYS = ("dtype", "profile", "seed", "archs", "device", "keyword")


def check_shard_set(reports: Sequence[tuple[str, dict[str, Any]]]) -> None:
    """The reports are exactly the shards 1..N of one audit (or one unsharded report): no shard
    twice, none missing, no unsharded report among shards (raises ReportError). A merge of an
    incomplete set would otherwise gate like a complete audit."""
    shards: dict[tuple[int, int], str] = {}
    plain: list[str] = []
    for path, rep in reports:
        s = (rep.get("config") or {}).get("shard")
        if s is None:
            plain.append(path)
            continue
        try:
            a, b = str(s).split("/")
            i, n = int(a), int(b)
            if not 1 <= i <= n:
                raise ValueError
        except ValueError:
            raise ReportError(f"{path}: config shard {s!r} is not I/N") from None
        if (i, n) in shards:
            raise ReportError(f"{path}: shard {i}/{n} is also {shards[(i, n)]}; each shard "
                              "once")
        shards[(i, n)] = path
    if plain and (shards or len(plain) > 1):
        raise ReportError(f"{plain[-1]}: not a shard (audit without --shard); merge only the "
                          "shards 1..N of one audit")
    ns = sorted({n for _, n in shards})
    if len(ns) > 1:
        raise ReportError(f"shards of different partitions ({', '.join(f'/{n}' for n in ns)}); "
                          "not one audit")
    if ns:
        n = ns[0]
        missing = [f"{i}/{n}" for i in range(1, n + 1) if (i, n) not in shards]
        if missing:
            raise ReportError(f"incomplete shard set: missing shard {', '.join(missing)} "
                              f"(have {len(shards)} of {n}); a partial merge is not a complete "
                              "audit")


def merge(reports: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Merge shard reports of one configuration into one report (raises ReportError).

    All reports must share dtype, profile, seed, archs, device and keyword, and be exactly the
    shards 1..N of that audit (:func:`check_shard_set`); an id that appears in two reports must
    have the same status there, else it is an error.  The merged
    exit code is recomputed from the merged results."""
    from fa4verify.audit.runner import CheckRecord, exit_code_for

    if not reports:
        raise ReportError("nothing to merge")
    first_path, first = reports[0]
    cfg0 = dict(first.get("config") or {})
    results: dict[str, dict[str, Any]] = {}
    envs = []
    shards = []
    duration = 0.0
    fp0 = first.get("fingerprint")
    for path, rep in reports:
        cfg = rep.get("config") or {}
        fp = rep.get("fingerprint")
        if not isinstance(fp, dict) or not isinstance(fp.get("digest"), str):
            raise ReportError(f"{path}: carries no audit fingerprint (Note [Audit fingerprint]); "
                              "cannot tell it is a shard of the same audit")
        if fp["digest"] != fp0["digest"]:
            raise ReportError(f"{path}: a shard of another audit than {first_path} "
                              f"({fingerprint_difference(fp0, fp)}); not shards of one audit")
        for k in _MERGE_KEYS:
            if cfg.get(k) != cfg0.get(k):
                raise ReportError(f"{path}: config {k}={cfg.get(k)!r} differs from "
                                  f"{first_path} ({cfg0.get(k)!r}); not shards of one audit")
        shards.append(cfg.get("shard"))
        envs.append(rep.get("environment") or {})
        envs.extend(rep.get("environments") or [])
        duration += float((rep.get("summary") or {}).get("duration_s", 0.0) or 0.0)
        for r in rep["results"]:
            old = results.get(r["id"])
            if old is not None and old["status"] != r["status"]:
                raise ReportError(f"{path}: check {r['id']} is {r['status']} here but "
                                  f"{old['status']} in another report")
            results.setdefault(r["id"], r)
    check_shard_set(reports)
    merged_results = sorted(results.values(), key=lambda r: r["id"])
    recs = [CheckRecord.from_dict(r) for r in merged_results]
    code = exit_code_for(recs)
    cfg = dict(cfg0)
    cfg["shard"] = None
    cfg["merged_shards"] = shards
    rep = build_report(config=cfg, environment=first.get("environment") or {},
                       results=merged_results, exit_code=code, duration_s=duration,
                       command=[], environments=envs, audit_fingerprint=fp0)
    rep["summary"]["merged_from"] = [p for p, _ in reports]
    return rep


__all__ = ["compare", "merge", "config_mismatch", "counts", "gate"]
