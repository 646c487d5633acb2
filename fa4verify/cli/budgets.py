"""``fa4verify budgets``: show and validate the per-stage error budgets (error_budgets/*.toml).

    fa4verify budgets show --dtype bf16 --arch sm90      # rich table of every entry
    fa4verify budgets show --file my_budgets.toml        # a file of your own (same schema)
    fa4verify budgets show --json                        # machine-readable
    fa4verify budgets validate                           # load every shipped file; exit 2 if any is bad

A malformed file is a usage error (exit 2) whose one-line message names the file, the key and the
problem (``BudgetError``).  Environment: ``FA4VERIFY_BUDGET_FILE`` is the default for ``--file``.
"""
from __future__ import annotations

import json
import sys

import click

from fa4verify.cli import ExitCode
from fa4verify.cli._common import OneLineGroup, usage


def _load(dtype: str | None, arch: str | None, file: str | None):
    from fa4verify.error_budgets import loader
    if file is not None:
        return [loader.load_file(file)]
    pairs = loader.available()
    if dtype:
        dt = loader.DTYPE_ALIASES.get(dtype)
        if dt is None:
            raise usage(f"--dtype: unknown dtype {dtype!r} (bf16, fp16, fp8)")
        pairs = [p for p in pairs if p[0] == dt]
    if arch:
        pairs = [p for p in pairs if p[1] == arch]
    if not pairs:
        raise usage(f"no budget file for dtype={dtype or '*'} arch={arch or '*'}")
    return [loader.load(d, a) for d, a in pairs]


def _fail(e: Exception) -> None:
    raise usage(str(e)) from None


def _json_safe(o):
    """JSON has no NaN/inf: non-finite floats become the strings "nan", "inf", "-inf"."""
    import math
    if isinstance(o, float) and not math.isfinite(o):
        return "nan" if math.isnan(o) else ("inf" if o > 0 else "-inf")
    if isinstance(o, dict):
        return {str(k): _json_safe(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_json_safe(v) for v in o]
    return o


@click.group("budgets", cls=OneLineGroup, context_settings={"help_option_names": ["-h", "--help"]})
def command():
    """Show and validate the per-stage error budgets (error_budgets/*.toml)."""


@command.command("show")
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp8"]), default=None,
              help="Only this input dtype. Default: all.")
@click.option("--arch", type=click.Choice(["sm90", "sm100", "sm103"]), default=None,
              help="Only this architecture. Default: all.")
@click.option("--file", "file", type=click.Path(dir_okay=False), default=None,
              envvar="FA4VERIFY_BUDGET_FILE",
              help="A budget TOML file to show instead of the shipped ones "
                   "(env FA4VERIFY_BUDGET_FILE).")
@click.option("--kind", type=click.Choice(["stage", "e2e", "all"]), default="all",
              help="Local stage budgets, composed end-to-end budgets, or both. Default: all.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def show(dtype, arch, file, kind, as_json):
    """Print the budgets: formula, units, derivation reference."""
    from fa4verify.error_budgets.loader import BudgetError
    try:
        sets = _load(dtype, arch, file)
    except BudgetError as e:
        _fail(e)
    if as_json:
        out = []
        for s in sets:
            out.append({"dtype": s.dtype, "arch": s.arch, "files": list(s.files),
                        "constants": {k: float(v) for k, v in s.constants.items()},
                        "entries": [{"name": b.name, "kind": b.kind, "formula": b.text,
                                     "dim": b.dim, "unit": b.unit, "confidence": b.confidence,
                                     "reason": b.reason, "statistics": list(b.stats)}
                                    for b in s.entries.values()
                                    if kind == "all" or b.kind == kind]})
        click.echo(json.dumps(_json_safe(out), indent=1, allow_nan=False))
        return
    from rich.console import Console
    from rich.table import Table
    console = Console(soft_wrap=False, highlight=False, markup=False)
    for s in sets:
        t = Table(title=f"error budgets {s.dtype} / {s.arch}  ({s.files[-1]})", show_lines=False)
        for col in ("kind", "name", "formula", "dim", "conf", "reason"):
            t.add_column(col, overflow="fold")
        for b in s.entries.values():
            if kind != "all" and b.kind != kind:
                continue
            t.add_row(b.kind, b.name, b.text, b.dim,
                      "1" if b.confidence == 1 else f"{b.confidence:g}", b.reason)
        console.print(t)
        consts = ", ".join(f"{k}={s.constants[k]:.4g}" for k in
                           ("u_p", "u_out", "e_exp", "emu_rel", "mufu_ex2_rel", "rcp_rel")
                           if k in s.constants)
        console.print(f"constants: {consts}")


@command.command("validate")
@click.option("--file", "files", multiple=True, type=click.Path(dir_okay=False),
              help="Validate these files instead of every shipped one.")
def validate(files):
    """Load every budget file; exit 2 naming file, key and problem if one is malformed."""
    from fa4verify.error_budgets import loader
    try:
        if files:
            sets = [loader.load_file(f) for f in files]
        else:
            sets = [loader.load(d, a) for d, a in loader.available()]
    except loader.BudgetError as e:
        _fail(e)
    if not sets:
        click.echo("fa4verify budgets validate: error: no budget files found", err=True)
        raise click.exceptions.Exit(int(ExitCode.NOTHING_RAN))
    for s in sets:
        click.echo(f"ok  {s.dtype:9s} {s.arch:6s} {len(s.entries):3d} entries  {s.files[-1]}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(command())
