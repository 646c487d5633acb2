"""Aggregation across runs, processes and devices: the per-configuration status and the exit status
of ``fa4verify determinism``."""
from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from fa4verify.determinism.configs import DeterminismConfig
from fa4verify.determinism.runner import _tensor_names
from fa4verify.determinism.schema import FAILING, SCHEMA_REPORT, STATUSES

def aggregate(records: Sequence[Mapping[str, Any]], configs: Sequence[DeterminismConfig]
              ) -> dict:
    """Combine worker records into the report: per configuration a status (:data:`STATUSES`),
    the digests (when all runs, processes and devices agree), and the evidence."""
    arch = next((r.get("arch") for r in records if r.get("arch")), None)
    where = next((r.get("where") for r in records if r.get("where")), None)
    out_cfgs = []
    for cfg in configs:
        key = cfg.key()
        recs = [(r.get("process_index", i), x) for i, r in enumerate(records)
                for x in r.get("results", []) if x.get("config") == key]
        e: dict[str, Any] = {"key": key, "name": cfg.name, "config": cfg.to_json(),
                             "attention": cfg.attention, "mask": cfg.mask,
                             "processes": sorted({p for p, _ in recs}),
                             "devices": sorted({x["device"] for _, x in recs})}
        xf = cfg.xfail_reason(arch)
        if xf:
            e["upstream_xfail"] = xf
        problems: list[str] = []
        status = None
        if not recs:
            status, problems = "not-run", ["no worker produced a result"]
        kinds = {x["status"] for _, x in recs}
        if recs and "unsupported" in kinds:
            status = "unsupported"
            e["reason"] = next(x["reason"] for _, x in recs if x["status"] == "unsupported")
        elif recs and "error" in kinds:
            status = "error"
            e["reason"] = next(x["reason"] for _, x in recs if x["status"] == "error")
        elif recs and kinds == {"not-run"}:
            status = "not-run"
            e["reason"] = recs[0][1].get("reason", "")
        ok = [(p, x) for p, x in recs if x["status"] == "ok"]
        if status is None and ok:
            if len(ok) < len(recs):
                problems.append(f"{len(recs) - len(ok)} process/device result(s) not run")
            e["runs_per_process"] = ok[0][1]["det"]["runs"]
            e["total_runs"] = sum(x["det"]["runs"] for _, x in ok)
            inputs = sorted({x["inputs_digest"] for _, x in ok})
            inputs_differ = len(inputs) > 1
            e["inputs_digest"] = inputs[0] if not inputs_differ else inputs
            if inputs_differ:
                problems.append("inputs differ between processes/devices (generator not "
                                "reproducible): comparison invalid")
            fwd = {json.dumps(x["fwd_digests"], sort_keys=True) for _, x in ok}
            e["forward_reproducible"] = len(fwd) == 1
            if len(fwd) == 1:
                e["fwd_digests"] = json.loads(fwd.pop())
            digests: dict[str, str] = {}
            differing: dict[str, int] = {}
            for t in _tensor_names([x for _, x in ok]):
                seen: dict[str, int] = {}
                for _, x in ok:
                    for dg, v in x["det"]["digests"].get(t, {}).items():
                        seen[dg] = seen.get(dg, 0) + v["count"]
                if not seen:
                    continue
                if len(seen) == 1:
                    digests[t] = next(iter(seen))
                else:
                    differing[t] = len(seen)
            e["digests"] = digests
            e["shapes"] = ok[0][1].get("shapes", {})
            if differing:
                e["distinct_digests"] = differing
            # cross-device: per device, the digests must agree with other devices
            per_dev: dict[str, set] = {}
            for _, x in ok:
                per_dev.setdefault(x["device"], set()).add(json.dumps(
                    {t: sorted(v) for t, v in x["det"]["digests"].items()}, sort_keys=True))
            e["cross_device_equal"] = (len({s for v in per_dev.values() for s in v}) == 1
                                       if len(per_dev) > 1 else None)
            gv = [dict(v, process=p, device=x["device"]) for p, x in ok
                  for v in x["det"]["guard_violations"]]
            uw = [dict(v, process=p, device=x["device"]) for p, x in ok
                  for v in x["det"]["unwritten"]]
            nb = sorted({n for _, x in ok for n in x["det"].get("buffers_not_used", [])})
            if nb:
                problems.append(f"kernel did not write into the given buffers for {nb}: guard "
                                "bands and NaN pre-fill not effective for them")
            if gv:
                e["guard_violations"] = gv[:10]
            if uw:
                e["unwritten"] = uw[:10]
            if "default" in ok[0][1]:
                e["default_mode"] = _aggregate_default(ok)
            if gv:
                status = "guard-violation"
            elif uw:
                status = "unwritten"
            elif differing or inputs_differ:
                status = "xfail" if xf else "not-reproducible"
            else:
                status = "xpass" if xf else "reproducible"
        e["status"] = status
        if problems:
            e["problems"] = problems
        out_cfgs.append(e)
    counts = {s: sum(1 for c in out_cfgs if c["status"] == s) for s in STATUSES}
    return {"schema": SCHEMA_REPORT, "where": where, "arch": arch,
            "configs": out_cfgs, "counts": {k: v for k, v in counts.items() if v}}


def _aggregate_default(ok: Sequence[tuple[int, Mapping[str, Any]]]) -> dict:
    """Default-mode divergence over all processes/devices: per tensor, the largest number of
    elements that differ from the process's first default run, the largest ULP difference, the
    fraction of runs that differed, the number of distinct results, and the difference between
    the first default and the first deterministic result."""
    res: dict[str, Any] = {}
    runs = sum(x["default"]["runs"] for _, x in ok)
    for t in _tensor_names([x for _, x in ok], "default"):
        per = [x["default"].get("vs_first", {}).get(t) for _, x in ok]
        per = [v for v in per if v]
        if not per:
            continue
        distinct = set()
        for _, x in ok:
            distinct |= set(x["default"]["digests"].get(t, {}))
        vd = [x["default"].get("vs_deterministic", {}).get(t) for _, x in ok]
        vd = [v for v in vd if v]
        comp = sum(max(0, x["default"]["runs"] - 1) for _, x in ok)
        res[t] = {
            "numel": per[0]["numel"],
            "runs_compared": comp,
            "runs_differing": sum(v["runs_differing"] for v in per),
            "max_differing_elements": max(v["max_differing_elements"] for v in per),
            "max_differing_fraction": (max(v["max_differing_elements"] for v in per)
                                       / max(1, per[0]["numel"])),
            "max_ulp": max(v["max_ulp"] for v in per),
            "distinct_results": len(distinct),
            "vs_deterministic_differing": max((v["differing"] for v in vd), default=0),
            "vs_deterministic_max_ulp": max((v["max_ulp"] for v in vd), default=0),
        }
    return {"runs": runs, "tensors": res}


def exit_status(report: Mapping[str, Any]) -> int:
    """0: every configuration that ran is reproducible (or an upstream-xfail); 1: any
    non-reproducible / guard / unwritten / error result; 5: nothing ran (all unsupported or
    not-run)."""
    st = [c["status"] for c in report["configs"]]
    if any(s in FAILING for s in st):
        return 1
    if not any(s in ("reproducible", "xfail", "xpass") for s in st):
        return 5
    return 0
