"""The detection table: plain rows, rich and markdown renderings, and its JSON file."""
from __future__ import annotations

import math

import numpy as np

from fa4verify.mutants.problems import Problem
from fa4verify.mutants.suite import Cell, Row, SuiteResult, _spec

def _fmt_fig(f: float | None) -> str:
    if f is None:
        return ""
    if isinstance(f, float) and math.isnan(f):
        return "nan"
    if isinstance(f, float) and (math.isinf(f) or abs(f) >= 1e300):
        return "inf"  # (the judge reports an infinite ratio as the largest float)
    if float(f).is_integer() and abs(f) < 1e9:
        return str(int(f))
    return f"{f:.3g}"


def _cell_text(c: Cell) -> str:
    if c.status == "caught":
        return f"CAUGHT {_fmt_fig(c.figure)}"
    if c.status == "missed":
        return f"missed {_fmt_fig(c.figure)}"
    return c.status


#: column-header tags of what each verifier can judge
_JUDGES_SHORT = {"production": "prod", "twin only": "twin", "bit comparison": "bits"}


def table_rows(res: SuiteResult) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the detection table (plain strings; the last row is the unmutated
    twin's false-alarm count per verifier)."""
    header = ["mutant", "fa4verify", "judged by", "caught by"] + [
        f"{v} ({_JUDGES_SHORT[_spec(v).judges]})" for v in res.verifier_names]
    rows = []
    judged = res.headline()["judged_by"]
    for m in res.mutants:
        c, by = res.fa4verify_cell(m)
        rows.append([m, _cell_text(c), judged[m], ",".join(by) or "-"]
                    + [_cell_text(res.cell(m, v)) for v in res.verifier_names])
    fa = res.false_alarms()
    n_fa = sum(len(fa[v]) for v in res.verifier_names if _spec(v).group == "fa4verify")
    rows.append(["(unmutated: false alarms)", str(n_fa), "-", "-"]
                + [str(len(fa[v])) for v in res.verifier_names])
    return header, rows


def render_rich(res: SuiteResult, console=None) -> None:
    """Print the detection table with rich (to ``console`` or stdout)."""
    from rich.console import Console
    from rich.table import Table
    console = console or Console()
    header, rows = table_rows(res)
    t = Table(title=f"Mutant detection ({res.where}; profile {res.profile}, seed {res.seed}, "
                    f"archs {','.join(res.archs)})", show_lines=False)
    for h in header:
        t.add_column(h, overflow="fold")
    for r in rows:
        styled = []
        for x in r:
            if x.startswith("CAUGHT"):
                styled.append(f"[green]{x}[/green]")
            elif x.startswith("missed"):
                styled.append(f"[red]{x}[/red]")
            else:
                styled.append(x)
        t.add_row(*styled)
    console.print(t)
    console.print(res.headline()["text"])
    for name, why in res.unavailable.items():
        console.print(f"[yellow]verifier {name} unavailable:[/yellow] {why}")


def render_markdown(res: SuiteResult, command: str = "") -> str:
    """The detection table as GitHub markdown, followed by the deciding detail of every cell."""
    header, rows = table_rows(res)
    out = []
    if command:
        out.append(f"Produced by `{command}` ({res.where}, {res.seconds:.0f} s).\n")
    out.append(f"**{res.headline()['text']}.** Column tags: prod = can judge a production kernel, "
               f"twin = needs the twin's internals, bits = compares bits with the unmutated twin or "
               f"recorded golden bits.\n")
    out.append("| " + " | ".join(header) + " |")
    out.append("|" + "---|" * len(header))
    for r in rows:
        out.append("| " + " | ".join(x.replace("|", "\\|") for x in r) + " |")
    out.append("")
    out.append("Deciding verdicts (figure: measured/threshold for tolerance rules, a count for "
               "bitwise and determinism checks; problem[arch] where it was decided):\n")
    for m in res.mutants:
        out.append(f"* **{m}**")
        for v in res.verifier_names:
            c = res.cell(m, v)
            if c.status in ("caught", "missed", "false-alarm", "error"):
                detail = c.detail.replace("*", "\\*")
                out.append(f"  * {v}: {c.status} on {c.caught_on}/{c.applied_on} problems; "
                           f"{c.where}: {detail}")
    for name, why in res.unavailable.items():
        out.append(f"\nVerifier `{name}` unavailable: {why}")
    return "\n".join(out) + "\n"


def read_json(path: str) -> SuiteResult:
    """A :class:`SuiteResult` back from a ``--json`` file (for re-rendering tables, e.g. of a
    production run made on a GPU machine)."""
    import json

    def _num(x):
        if isinstance(x, str) and x in ("nan", "inf", "-inf"):
            return float(x)
        return x

    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    if d.get("schema") != "fa4verify.mutants/1":
        raise ValueError(f"{path}: not a fa4verify mutants JSON (schema {d.get('schema')!r})")
    res = SuiteResult(profile=d["profile"], seed=int(d["seed"]), archs=tuple(d["archs"]),
                      target=d["target"], where=d["where"],
                      unavailable=dict(d.get("unavailable", {})),
                      problems=tuple(Problem(**{k: tuple(v) if isinstance(v, list) else v
                                                for k, v in p.items()}) for p in d["problems"]),
                      mutants=tuple(m["name"] for m in d["mutants"]),
                      verifier_names=tuple(v["name"] for v in d["verifiers"]),
                      seconds=float(d.get("seconds", 0.0)))
    res.rows = [Row(r["mutant"], r["arch"], r["problem"], r["verifier"], r["status"],
                    _num(r["figure"]), r["detail"]) for r in d["rows"]]
    return res


def write_json(res: SuiteResult, path: str) -> None:
    import json

    def _default(o):
        if isinstance(o, (np.floating, np.integer)):
            return o.item()
        raise TypeError(type(o).__name__)

    def _clean(o):
        if isinstance(o, float) and (math.isnan(o) or math.isinf(o)):
            return str(o)
        if isinstance(o, dict):
            return {k: _clean(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [_clean(v) for v in o]
        return o

    with open(path, "w", encoding="utf-8") as f:
        json.dump(_clean(res.to_json()), f, indent=1, default=_default)
        f.write("\n")
