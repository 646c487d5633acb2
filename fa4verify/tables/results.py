"""The README's results table, generated from the evidence store ``docs/results/evidence.toml``.

The store is append-only: one ``[[claim]]`` per recorded figure (``id``, ``claim``, ``figure``,
``where``, ``fa4``, ``gpu``, ``date``, ``commit``, ``source``, optional ``headline``). A newer figure
for the same claim is a new entry with the same ``id``; the table shows the latest entry (the last in
file order) per ``(id, fa4, gpu)``, one table per FA4 version (the ``where`` column names the GPU).

``python -m fa4verify.tables.results --write README.md`` replaces the block between
``<!-- results-table:start -->`` and ``<!-- results-table:end -->`` with the headline rows;
``--write docs/results/README.md --all`` writes every claim; ``--check FILE [--all]`` exits 1 when
the file's block is stale (``tests/test_results_table.py`` runs it on both files).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any, Optional

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[2]
STORE = ROOT / "docs" / "results" / "evidence.toml"
START = "<!-- results-table:start -->"
END = "<!-- results-table:end -->"

FIELDS = ("id", "claim", "figure", "where", "fa4", "gpu", "date", "commit", "source")
#: the where-labels a figure may carry (README, "What the output means")
WHERE = re.compile(r"^(measured on .+ \(sm_\d+\)|recorded on .+ \(sm_\d+\)|CPU twin|compile-only)$")


def load(path: Path = STORE) -> list[dict[str, Any]]:
    """Every entry of the store, in file order (``ValueError`` naming the entry if one is bad)."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    claims = data.get("claim", [])
    for i, c in enumerate(claims):
        missing = [f for f in FIELDS if not isinstance(c.get(f), str)]
        if missing:
            raise ValueError(f"{path}: claim #{i + 1} ({c.get('id', '?')}): missing {', '.join(missing)}")
        if not WHERE.match(c["where"]):
            raise ValueError(f"{path}: claim {c['id']}: unknown where label {c['where']!r}")
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", c["date"]):
            raise ValueError(f"{path}: claim {c['id']}: date {c['date']!r} is not YYYY-MM-DD")
        if "\n" in c["figure"] or "|" in c["figure"]:
            raise ValueError(f"{path}: claim {c['id']}: a figure is one line without '|'")
    return claims


def latest(claims: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last entry per ``(id, fa4, gpu)``, in the order each key first appears."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for c in claims:
        out[(c["id"], c["fa4"], c["gpu"])] = c     # a dict keeps the key's first position
    return list(out.values())


def render(claims: Optional[list[dict[str, Any]]] = None, *, everything: bool = False) -> str:
    """One table per FA4 release (its ``where`` column names the GPU of each row): the rows of each
    GPU together, GPUs first (by name), the CPU rows last, newest release first."""
    claims = latest(load() if claims is None else claims)
    if not everything:
        claims = [c for c in claims if c.get("headline")]
    groups: dict[str, list[dict[str, Any]]] = {}
    for c in claims:
        groups.setdefault(c["fa4"], []).append(c)
    lines: list[str] = []
    for fa4 in sorted(groups, key=lambda k: [-ord(ch) for ch in k]):
        if lines:
            lines.append("")
        lines += [f"**flash-attn-4 {fa4}**", "", "| claim | figure | where | evidence |", "|---|---|---|---|"]
        rows = sorted(enumerate(groups[fa4]), key=lambda ic: (ic[1]["gpu"] == "", ic[1]["gpu"], ic[0]))
        for _, c in rows:
            lines.append(f"| {c['claim']} | {c['figure']} | {c['where']}, {c['date']} | "
                         f"`{c['source']}` ({c['commit']}) |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fa4verify.tables.results")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", metavar="FILE")
    g.add_argument("--check", metavar="FILE")
    ap.add_argument("--all", action="store_true", help="every claim, not only the headline ones")
    ns = ap.parse_args(argv)
    try:
        table = render(everything=ns.all)
    except (OSError, ValueError, tomllib.TOMLDecodeError) as e:
        print(f"fa4verify.tables.results: error: {e}", file=sys.stderr)
        return 2
    from fa4verify.tables.features import write_or_check
    return write_or_check("fa4verify.tables.results", table, write=ns.write, check=ns.check, start=START, end=END,
                          rerun=" --all" if ns.all else "")


if __name__ == "__main__":
    sys.exit(main())
