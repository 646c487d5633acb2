#!/usr/bin/env python3
"""The release table (issue 29): what the default GPU audit reports for each FA4 release.

Reads the JSON audit reports that ``scripts/gpu.sh releases`` (``scripts/gpu/releases.sh``, Note
[Release runs]) leaves, one per release, and prints markdown: one row per release (its stack, the
verdict counts, exit code and wall time, or why there is no report), then one row per check that
did not pass (fail, undecided, error, and skips of GPU checks) with its one-line reason, its
shrunk reproducer where the report has one, and who is to blame (``fa4verify.blame.report_blame``,
Note [Blame of a report row]).

    python scripts/release_table.py --state DIR [--markdown FILE] [--brief]
    python scripts/release_table.py REPORT.json ... [--markdown FILE]

``--state DIR``: ``DIR/<release>.json`` reports and ``DIR/runs/<release>.txt`` run records
(``release=... rc=... wall=... cap=...``; a release with a record and no report: killed at its cap,
or not run). A report's own release (its ``environment.stack``) must be the one its file names;
otherwise its row says REPORT IS FOR another release. Bad input: one line, exit 2.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import sys
from typing import Any, Optional

STATUSES = ("pass", "fail", "undecided", "error", "skip")
#: the longest reason or reproducer a cell holds
CELL = 300


def _version_key(v: str) -> tuple:
    """4.0.0b9 < 4.0.0b27 < 4.0.0 (newest first when reversed)."""
    m = re.match(r"^(\d+)\.(\d+)\.(\d+)(?:(a|b|rc)(\d+))?", v)
    if not m:
        return (0, 0, 0, 0, 0, v)
    pre = {"a": 0, "b": 1, "rc": 2, None: 3}[m.group(4)]
    return (int(m.group(1)), int(m.group(2)), int(m.group(3)), pre, int(m.group(5) or 0), v)


def _cell(text: Any, limit: int = CELL) -> str:
    s = " ".join(str(text).split()).replace("|", "\\|")
    return s if len(s) <= limit else s[: limit - 3] + "..."


def read_run_record(path: str) -> dict[str, str]:
    """``release=X rc=Y wall=Z cap=C [workers=W] [note=free text]`` -> dict."""
    with open(path, encoding="utf-8") as f:
        text = f.read().strip()
    out: dict[str, str] = {}
    head, _, note = text.partition(" note=")
    for tok in head.split():
        k, _, v = tok.partition("=")
        out[k] = v
    if note:
        out["note"] = note
    return out


def report_release(rep: dict[str, Any]) -> Optional[str]:
    env = rep.get("environment") or {}
    return (env.get("stack") or {}).get("release") or (env.get("versions") or {}).get("FA4")


def stack_cell(rep: dict[str, Any]) -> str:
    env = rep.get("environment") or {}
    st = env.get("stack") or {}
    inst = st.get("installed") or {}
    dsl = inst.get("nvidia-cutlass-dsl") or (env.get("versions") or {}).get("CuTe DSL") or "?"
    quack = inst.get("quack-kernels") or "?"
    s = f"FA4 {report_release(rep) or '?'}, DSL {dsl}, quack {quack}"
    if st.get("mismatch"):
        s += "; MISMATCHED STACK: " + "; ".join(st["mismatch"])
    elif st:
        s += " (matches its metadata)"
    return s


def reproducer(row: dict[str, Any]) -> str:
    """The shrunk reproducer a result row carries, as one line, or ``-``: a failing call sequence
    (``sequences.*``: the calls, sequence/plain bug, the case file) or a fuzz failure's shrunk
    problem; for other checks the summary names the failing case."""
    d = row.get("details") or {}
    f = d.get("failure")
    if isinstance(f, dict):
        desc = f.get("describe")
        text = " -> ".join(map(str, desc)) if isinstance(desc, list) else str(desc or f.get("problem") or "")
        extra = [x for x in (f.get("kind"), f"{f['length']} calls" if f.get("length") else None,
                             os.path.basename(str(f["case_file"])) if f.get("case_file") else None) if x]
        return _cell(text + (f" ({', '.join(extra)})" if extra else ""))
    return "-"


def findings(rep: dict[str, Any]) -> list[dict[str, str]]:
    """Every check of ``rep`` that did not pass (skips only of GPU checks), with reason, reproducer
    and blame."""
    from fa4verify.blame import report_blame
    out = []
    for r in rep.get("results") or []:
        st = r.get("status")
        if st == "pass" or (st == "skip" and "cuda" not in (r.get("needs") or [])):
            continue
        out.append({"check": str(r.get("id")), "status": st, "reason": _cell(r.get("summary") or ""),
                    "reproducer": reproducer(r), "blame": report_blame(r)})
    return out


def load(paths: list[str], state: Optional[str]) -> list[dict[str, Any]]:
    """One entry per release: ``{"release", "report" (or None), "run" (record or {}), "path"}``."""
    from fa4verify.audit.report_json import load_report
    from fa4verify.errors import ReportError
    entries: dict[str, dict[str, Any]] = {}
    if state is not None:
        if not os.path.isdir(state):
            raise ReportError(f"--state {state}: not a directory")
        paths = sorted(glob.glob(os.path.join(state, "*.json"))) + list(paths)
        for rec in sorted(glob.glob(os.path.join(state, "runs", "*.txt"))):
            run = read_run_record(rec)
            rel = run.get("release") or os.path.basename(rec)[:-4]
            entries.setdefault(rel, {"release": rel, "report": None, "path": None})["run"] = run
    for p in paths:
        rep = load_report(p)
        name = os.path.basename(p)[:-5] if p.endswith(".json") else os.path.basename(p)
        rel = name if re.match(r"^\d+\.\d+\.\d+", name) else (report_release(rep) or name)
        e = entries.setdefault(rel, {"release": rel, "report": None, "path": None})
        e["report"], e["path"] = rep, p
    for e in entries.values():
        e.setdefault("run", {})
    return sorted(entries.values(), key=lambda e: _version_key(e["release"]), reverse=True)


def _no_report(e: dict[str, Any]) -> str:
    run = e["run"]
    rc = run.get("rc")
    if rc in ("124", "137"):
        return f"no report: killed at its cap of {run.get('cap')} s (rc {rc})"
    if rc == "not-run":
        return f"not run: {run.get('note', '')}"
    if rc == "preflight":
        return f"not run: {run.get('note', '')}"
    if rc is not None:
        return f"no report: the audit exited {rc} after {run.get('wall')} s without one"
    return "no report"


def markdown(entries: list[dict[str, Any]], brief: bool = False) -> str:
    lines = ["| release | stack | pass | fail | undecided | error | skip | exit | duration (s) | note |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for e in entries:
        rep = e["report"]
        if rep is None:
            lines.append(f"| {e['release']} | - | - | - | - | - | - | - | {e['run'].get('wall', '-')} | "
                         f"{_cell(_no_report(e))} |")
            continue
        s = rep.get("summary") or {}
        c = s.get("counts") or {}
        note = []
        got = report_release(rep)
        if got != e["release"]:
            note.append(f"REPORT IS FOR {got}, not {e['release']}")
        if e["run"].get("wall"):
            note.append(f"run wall {e['run']['wall']} s with {e['run'].get('workers', '?')} workers")
        lines.append(f"| {e['release']} | {_cell(stack_cell(rep))} | " + " | ".join(str(c.get(k, 0)) for k in STATUSES)
                     + f" | {s.get('exit_code', '-')} | {s.get('duration_s', '-')} | {_cell('; '.join(note)) or '-'} |")
    if brief:
        return "\n".join(lines) + "\n"
    lines += ["", "| release | check | verdict | reason (one line) | shrunk reproducer | blame |",
              "|---|---|---|---|---|---|"]
    for e in entries:
        if e["report"] is None:
            continue
        for f in findings(e["report"]):
            lines.append(f"| {e['release']} | {f['check']} | {f['status']} | {f['reason']} | {f['reproducer']} "
                         f"| {_cell(f['blame'])} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="*", metavar="REPORT.json")
    ap.add_argument("--state", default=None, metavar="DIR", help="releases.sh's state directory")
    ap.add_argument("--markdown", default=None, metavar="FILE", help="also write the table here")
    ap.add_argument("--brief", action="store_true", help="the per-release rows only")
    a = ap.parse_args(argv)
    from fa4verify.errors import ReportError
    if not a.reports and a.state is None:
        print("release_table: name REPORT.json files or --state DIR", file=sys.stderr)
        return 2
    try:
        entries = load(a.reports, a.state)
    except (ReportError, OSError, ValueError) as e:
        print(f"release_table: {e}".splitlines()[0], file=sys.stderr)
        return 2
    text = markdown(entries, brief=a.brief)
    if a.markdown:
        with open(a.markdown, "w", encoding="utf-8") as f:
            f.write(markdown(entries))
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
