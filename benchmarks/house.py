#!/usr/bin/env python3
"""Figures of the house at a git revision: package lines (the judge, the execution engine, the
subject / truth / tolerance apart), test lines, modules at the package root, exception classes,
and (with ``--duplicates``) the repeated-code pairs the library's ``duplicates`` tool lists.

    python3 benchmarks/house.py [REV ...] [--duplicates]

Reads the tree of each revision with ``git ls-tree`` / ``git show`` (the working tree is not
touched), so two revisions print side by side: e.g. ``python3 benchmarks/house.py c215016 HEAD``.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys

EXC = re.compile(r"^class\s+\w+\s*\(([^)]*)\)\s*:", re.M)
EXC_BASES = ("Exception", "Error", "Warning", "Interrupt", "Exit")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


def figures(rev: str) -> dict[str, int]:
    files = [f for f in _git("ls-tree", "-r", "--name-only", rev).splitlines() if f.endswith(".py")]
    out = {"judge lines (fa4verify/, without run/)": 0, "engine lines (fa4verify/run/)": 0,
           "subject+truth+tolerance lines (kernels/, oracles/, error_budgets/)": 0, "test lines": 0,
           "modules at the package root": 0, "exception classes (package)": 0}
    for f in files:
        top = f.split("/")[0]
        if top not in ("fa4verify", "kernels", "oracles", "error_budgets", "tests"):
            continue
        text = _git("show", f"{rev}:{f}")
        n = text.count("\n")
        if top == "tests":
            out["test lines"] += n
            continue
        if f.startswith("fa4verify/run/"):
            out["engine lines (fa4verify/run/)"] += n
        elif top == "fa4verify":
            out["judge lines (fa4verify/, without run/)"] += n
        else:
            out["subject+truth+tolerance lines (kernels/, oracles/, error_budgets/)"] += n
        if top == "fa4verify" and f.count("/") == 1 and not f.endswith("__init__.py") and not f.endswith("__main__.py"):
            out["modules at the package root"] += 1
        for bases in EXC.findall(text):
            if any(b.strip().endswith(EXC_BASES) for b in bases.split(",")):
                out["exception classes (package)"] += 1
    return out


def duplicates(rev: str) -> int | None:
    """Pairs ``duplicates`` lists over the package at ``rev`` (None when the tool is absent)."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        subprocess.run(f"git archive {rev} fa4verify kernels oracles error_budgets | tar -x -C {d}", shell=True,
                       check=True)
        try:
            p = subprocess.run(["duplicates", d], capture_output=True, text=True, cwd=d)
        except FileNotFoundError:
            return None
        m = re.search(r"(\d+)\s+pairs?", p.stdout + p.stderr)
        return int(m.group(1)) if m else len([ln for ln in p.stdout.splitlines() if ln.strip()])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("revs", nargs="*", default=["HEAD"])
    ap.add_argument("--duplicates", action="store_true")
    a = ap.parse_args()
    cols = {r: figures(r) for r in a.revs}
    if a.duplicates:
        for r in a.revs:
            cols[r]["repeated-code pairs (duplicates)"] = duplicates(r)
    names = list(next(iter(cols.values())))
    w = max(len(n) for n in names)
    print(f"{'':{w}}  " + "  ".join(f"{r[:12]:>12}" for r in a.revs))
    for n in names:
        print(f"{n:{w}}  " + "  ".join(f"{str(cols[r][n]):>12}" for r in a.revs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
