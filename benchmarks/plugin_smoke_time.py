#!/usr/bin/env python3
"""Wall time of the pytest-plugin smoke run (``pytest -p fa4verify --fa4verify --fa4-only``):
what the collection of the test suite and one worker process per item used to cost.

Runs, from the repository root, as subprocesses:

* ``collect-suite``  ``pytest -p fa4verify --fa4verify=quick --co -q`` (no ``--fa4-only``: every
                     test module is imported, as the session-4 smoke run's xdist worker did);
* ``collect-only``   the same with ``--fa4-only`` (no test module imported now);
* ``fresh``          the smoke items with ``--fa4-fresh-workers``: a new worker process per
                     isolated item (what every item got before the per-process pool);
* ``shared``         the smoke items with the defaults: one worker pool per pytest process.

``-k`` picks the items (default: the pool fixture checks ``fixture.pool.pid_a/pid_b`` run
isolated, which report their worker's pid: the table gives the number of distinct worker
processes). ``-n N`` adds pytest-xdist. Prints one table (mode, wall seconds, items passed/
skipped/failed, worker processes) and the fingerprint (python, pytest, host CPUs). Usage::

    python3 benchmarks/plugin_smoke_time.py                       # CPU, fixture items
    python3 benchmarks/plugin_smoke_time.py --device cuda --no-fixtures \\
        -k "production.forward_rule or budgets.production.forward" -n 1
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POOL = os.path.join(ROOT, "tests", "fixtures", "audit_checks_pool.py")


def _run(args: list[str], junit: str | None) -> tuple[float, int, str]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "fa4verify", *args]
    if junit:
        cmd.append(f"--junitxml={junit}")
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    return time.perf_counter() - t0, r.returncode, (r.stdout + r.stderr).strip().splitlines()[-1:]


def _junit(path: str) -> tuple[dict[str, int], int | None]:
    counts = {"passed": 0, "skipped": 0, "failed": 0}
    pids = set()
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return counts, None
    for tc in root.iter("testcase"):
        kind = next((c.tag for c in tc if c.tag in ("failure", "error", "skipped")), "pass")
        counts[{"pass": "passed", "skipped": "skipped"}.get(kind, "failed")] += 1
        for p in tc.iter("property"):
            if p.get("name") == "fa4verify.metric.pid":
                pids.add(p.get("value"))
    return counts, (len(pids) if pids else None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", default="fixture.pool.pid", help="pytest -k expression for the items")
    ap.add_argument("-n", type=int, default=0, help="pytest-xdist workers (0: none)")
    ap.add_argument("--device", default="cpu", help="--fa4-device (cpu, cuda, auto)")
    ap.add_argument("--no-fixtures", action="store_true",
                    help="use fa4verify's own checks only (not the pool fixture checks)")
    ap.add_argument("--modes", default="collect-suite,collect-only,fresh,shared")
    a = ap.parse_args(argv)
    base = ["--fa4verify=quick", "--fa4-device", a.device]
    items = base + ["--fa4-only", "-k", a.k]
    if not a.no_fixtures:
        items += ["--fa4-no-default-checks", "--fa4-checks-module", POOL, "--fa4-isolate", "always"]
    if a.n:
        items += ["-n", str(a.n)]
    modes = {"collect-suite": base + ["--co"], "collect-only": base + ["--fa4-only", "--co"],
             "fresh": items + ["--fa4-fresh-workers"], "shared": items}
    print(f"{'mode':<14} {'wall s':>8} {'rc':>3} {'pass':>5} {'skip':>5} {'fail':>5} {'workers':>8}  last line")
    with tempfile.TemporaryDirectory(prefix="fa4v-smoke-") as td:
        for m in [x.strip() for x in a.modes.split(",") if x.strip()]:
            if m not in modes:
                print(f"unknown mode {m!r} (choose from {', '.join(modes)})", file=sys.stderr)
                return 2
            j = os.path.join(td, f"{m}.xml") if m in ("fresh", "shared") else None
            wall, rc, last = _run(modes[m], j)
            counts, workers = _junit(j) if j else ({"passed": 0, "skipped": 0, "failed": 0}, None)
            print(f"{m:<14} {wall:>8.2f} {rc:>3} {counts['passed']:>5} {counts['skipped']:>5} "
                  f"{counts['failed']:>5} {workers if workers is not None else '-':>8}  "
                  f"{last[0][:60] if last else ''}")
    import pytest
    print(f"fingerprint: python {platform.python_version()}, pytest {pytest.__version__}, "
          f"{os.cpu_count()} CPUs, {platform.machine()}; items -k {a.k!r}, device {a.device}"
          f"{f', xdist -n {a.n}' if a.n else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
