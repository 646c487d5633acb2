"""The README's coverage block: what the audit's plan covers, per arch and dtype, by construction.

    python -m fa4verify.coverage.table [--write README.md | --check README.md]

Generated from the feature space and the planner (no GPU: the plan is decided before anything
runs); ``tests/test_coverage_table.py`` fails when the README's block is stale. What a run on a
GPU actually covered is in that audit's report (the coverage matrix), never here.
"""
from __future__ import annotations

import argparse
import collections
import re
from typing import Optional

from fa4verify.coverage.planner import plan
from fa4verify.coverage.space import space_for

__all__ = ["render", "START", "END", "main"]

START, END = "<!-- coverage:start -->", "<!-- coverage:end -->"


def _reason_head(why: str) -> str:
    """A reason without its leading ``<value>: `` and trailing detail (``(...)``, ``; ...``), for the
    summary counts."""
    head, sep, rest = why.partition(": ")
    if sep and " " not in head:
        why = rest
    why = why.split("; ")[0].strip()
    return re.sub(r"\s*\([^()]*\)$", "", why)


#: the plans the block shows: the main command's (bf16, each arch) and fp8's (SM 10.x only)
PLANS: tuple[tuple[str, str], ...] = (("sm90", "bf16"), ("sm100", "bf16"), ("sm100", "fp8"))


def render(plans: tuple[tuple[str, str], ...] = PLANS, seed: int = 0) -> str:
    lines = [f"The plan of `coverage.production` (the GPU's own arch, the audit's `--dtype`), seed {seed}: every "
             "supported value pair of two dimensions, every mask x call form x pass triple and every GQA ratio x "
             "softmax_scale x pass triple is in some row (a "
             "registered pair no row took gets a row of its own; `coverage.twin` plans the twin's forms the same "
             "way); fp8 runs forward only and adds a descale dimension (Note [FP8 descales]).", "",
             "| arch, dtype | rows | tuples covered | head-dim classes | tuples not planned (why) |",
             "|---|---|---|---|---|"]
    for arch, dtype in plans:
        sp = space_for(arch, dtype)
        pl = plan(sp, seed=seed)
        why = collections.Counter(_reason_head(w) for w in pl.unsupported.values())
        top = "; ".join(f"{r}: {n}" for r, n in why.most_common(3))
        rest = sum(why.values()) - sum(n for _, n in why.most_common(3))
        lines.append(f"| {arch}, {dtype} | {len(pl.rows)} | {len(pl.required) - len(pl.uncoverable)}/{len(pl.required)} "
                     f"| {', '.join(sp.hd)} | {len(pl.unsupported)} ({top}{f'; other: {rest}' if rest else ''}) |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    from fa4verify.tables.features import write_or_check
    ap = argparse.ArgumentParser(prog="python -m fa4verify.coverage.table", description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", metavar="README")
    g.add_argument("--check", metavar="README")
    ns = ap.parse_args(argv)
    return write_or_check("fa4verify.coverage.table", render(), write=ns.write, check=ns.check, start=START, end=END)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
