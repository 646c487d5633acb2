"""Replay every committed fuzz regression case against production FA4 (GPU).

Usage (on a CUDA machine):  python scripts/gpu_replay_regressions.py [--json F]
Prints, per case, the twin's recorded outcome and production's outcome, so a behaviour found on
the CPU twin (e.g. the sink-overflow known issue) is confirmed or refuted on real hardware.
"""
from __future__ import annotations

import argparse
import glob
import json
import os

from fa4verify import fuzz


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", default=None)
    ap.add_argument("--cases", default=os.path.join(os.path.dirname(__file__), "..", "tests", "regressions"))
    args = ap.parse_args()
    rows = []
    for path in sorted(glob.glob(os.path.join(args.cases, "*.json"))):
        case = fuzz.load_case(path)
        if case.get("mutations"):
            continue  # planted twin faults have no production counterpart
        target = fuzz.make_target("production")
        try:
            out = fuzz.replay_case(case, target=target)
            row = {"case": os.path.basename(path), "property": case["property"],
                   "twin_expect": case.get("expect"), "production": out.status,
                   "message": out.message, "metrics": {k: (v if isinstance(v, (int, float, str)) else str(v))
                                                       for k, v in (out.metrics or {}).items()}}
            if out.status == "fail":
                ki = fuzz.match_known_issue(case["problem_obj"], fuzz.Violation(out.property, out.message, out.metrics),
                                            target="production")
                row["known_issue"] = ki.name if ki else None
        except Exception as e:  # a CUDA fault must not hide the other cases
            row = {"case": os.path.basename(path), "property": case.get("property"),
                   "production": "error", "message": f"{type(e).__name__}: {e}"}
        known = f" [known issue {row['known_issue']}]" if row.get("known_issue") else ""
        print(f"{row['case']:60s} {row['property']:12s} production={row['production']}{known}: {row['message'][:200]}")
        rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"where": "measured on H200", "cases": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
