"""Accept exactly the documented exit codes of the README's main command.

    python .ci/check_audit_exit.py RC REPORT.json

``fa4verify audit --dtype bf16`` exits 0, or 1 because of the recorded FA4 finding
``production.head_dims`` (README: SM90 backward dQ wrong at head dims 8/16/40/48/72/80, no compile
at 104/112). Exit 0 when RC is 0 (and the report agrees), or RC is 1 and the only checks that did
not pass or skip are the documented ones; exit 1 otherwise, naming what is undocumented.
"""
from __future__ import annotations

import json
import sys

DOCUMENTED = frozenset({"production.head_dims"})


def verdict(rc: int, report: dict) -> tuple[bool, str]:
    bad = sorted(r["id"] for r in report.get("results", []) if r.get("status") not in ("pass", "skip"))
    recorded = (report.get("summary") or {}).get("exit_code")
    if recorded != rc:
        return False, f"exit {rc} but the report records exit_code {recorded!r}"
    if rc == 0:
        return (not bad), ("exit 0" if not bad else f"exit 0 with non-passing checks {bad}")
    if rc != 1:
        return False, f"exit {rc} (documented: 0 or 1)"
    regressions = (report.get("baseline") or {}).get("regressions") or []
    undocumented = [i for i in bad if i not in DOCUMENTED]
    if not bad or undocumented or regressions:
        return False, (f"exit 1 with undocumented failures {undocumented or bad or regressions} "
                       f"(documented: {sorted(DOCUMENTED)})")
    return True, f"exit 1 on the documented finding(s) {bad}"


def main(argv: list[str]) -> int:
    rc = int(argv[1])
    try:
        with open(argv[2], encoding="utf-8") as f:
            report = json.load(f)
    except (OSError, ValueError) as e:
        print(f".ci/check_audit_exit: exit {rc} and no readable report: {e}", file=sys.stderr)
        return 1
    ok, why = verdict(rc, report)
    print(f".ci/run: fa4verify audit --dtype bf16: {why}", file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
