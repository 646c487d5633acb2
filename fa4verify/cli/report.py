"""``fa4verify report``: merge shard reports, show a report, re-render it as HTML/JUnit.

    fa4verify report merge a.json b.json ... -o merged.json [--html F] [--junit F]
    fa4verify report show merged.json

``merge`` exits with the merged gate's exit code (0/1/3/5/10, as ``audit``), 2 on bad input;
``show`` exits with the report's recorded exit code.
"""
from __future__ import annotations

import click

from fa4verify.cli._common import FiniteFloat, OneLineGroup, check_outputs, usage


def _usage(msg: str):
    return usage(msg)


@click.group(name="report", cls=OneLineGroup, context_settings={"help_option_names": ["-h", "--help"]})
def command():
    """Merge and inspect fa4verify audit reports (JSON, schema fa4verify.audit/1)."""


def _load(paths):
    from fa4verify.audit.report_json import load_report
    from fa4verify.errors import ReportError

    out = []
    for p in paths:
        try:
            out.append((p, load_report(p)))
        except ReportError as e:
            raise _usage(str(e)) from None
    return out


def _distinct_inputs(pairs):
    """The same report given twice (``s1.json ./s1.json``, a link) is an error."""
    from fa4verify.audit.atomic import file_identity

    seen = {}
    for opt, p in pairs:
        if p is None:
            continue
        key = file_identity(p)
        if key in seen:
            raise _usage(f"{p} is the same file as {seen[key]}: each report once")
        seen[key] = p


@command.command("merge")
@click.argument("reports", nargs=-1, required=True, metavar="REPORT.json...")
@click.option("-o", "--output", "output", required=True, metavar="FILE", help="Merged JSON report.")
@click.option("--html", "html_path", default=None, metavar="FILE", help="Also write HTML.")
@click.option("--junit", "junit_path", default=None, metavar="FILE", help="Also write JUnit XML.")
@click.option("--baseline", "baseline_path", default=None, metavar="FILE",
              help="Previous JSON report: exit 1 on any metric regression of the merged results.")
@click.option("--regression-rtol", default=0.0, type=FiniteFloat(min=0.0), show_default=True,
              metavar="R",
              help="Relative growth of a metric tolerated before it counts as a regression.")
def merge_cmd(reports, output, html_path, junit_path, baseline_path, regression_rtol):
    """Merge the JSON reports of the shards of one audit (same dtype/profile/seed/archs)."""
    from fa4verify.audit.baseline import compare, config_mismatch, gate, merge
    from fa4verify.audit.report_json import verdict_text
    from fa4verify.errors import ReportError
    from fa4verify.audit.runner import CheckRecord, exit_code_for
    from fa4verify.audit.terminal import make_console, render_verdict
    from fa4verify.audit.report_files import write_reports

    inputs = [("REPORT", p) for p in reports] + [("--baseline", baseline_path)]
    check_outputs([("-o", output), ("--html", html_path), ("--junit", junit_path)], inputs=inputs)
    _distinct_inputs([("REPORT", p) for p in reports])
    baseline = None
    if baseline_path is not None:
        (_, baseline), = _load([baseline_path])
    loaded = _load(reports)
    try:
        merged = merge(loaded)
    except ReportError as e:
        raise _usage(str(e)) from None
    if baseline is not None:
        bl = compare(merged["results"], baseline, rtol=regression_rtol, path=baseline_path)
        bl["mismatch"] = config_mismatch(merged["config"], baseline)
        merged["baseline"] = bl
        code = gate(exit_code_for([CheckRecord.from_dict(r) for r in merged["results"]],
                                  regressions=len(bl["regressions"])), bl)
        merged["summary"]["exit_code"] = code
        merged["summary"]["verdict"] = verdict_text(code)
    try:
        write_reports(merged, json_path=output, junit_path=junit_path, html_path=html_path)
    except OSError as e:
        click.echo(f"fa4verify report merge: error: cannot write report: {e}", err=True)
        return 2
    console = make_console()
    render_verdict(merged, console)
    console.print(f"merged {len(loaded)} report(s) -> {output}")
    return merged["summary"]["exit_code"]


@command.command("show")
@click.argument("report", metavar="REPORT.json")
@click.option("--html", "html_path", default=None, metavar="FILE", help="Re-render as HTML.")
@click.option("--junit", "junit_path", default=None, metavar="FILE", help="Re-render as JUnit XML.")
@click.option("--rows", default=60, type=click.IntRange(min=1), show_default=True,
              help="Rows of the check table.")
def show_cmd(report, html_path, junit_path, rows):
    """Print the verdict of a saved report (and optionally re-render it)."""
    from fa4verify.audit.terminal import make_console, render_verdict
    from fa4verify.audit.report_files import write_reports

    check_outputs([("--html", html_path), ("--junit", junit_path)], inputs=[("REPORT", report)])
    (path, rep), = _load([report])
    code = (rep.get("summary") or {}).get("exit_code")
    if isinstance(code, bool) or code not in (0, 1, 2, 3, 5, 10):
        raise _usage(f"{path}: summary.exit_code {code!r} is not an audit exit code")
    from rich.markup import escape

    from fa4verify.audit.terminal import printable
    console = make_console()
    shown = printable(rep)          # Note [No raw control bytes on the terminal]
    cfg = shown.get("config", {})
    hw = (shown.get("environment") or {}).get("hardware") or {}
    console.print(escape(f"{printable(path)}: {shown.get('created', '')} dtype={cfg.get('dtype')} "
                         f"profile={cfg.get('profile')} device={cfg.get('device')} "
                         f"archs={','.join(cfg.get('archs') or [])} on "
                         f"{hw.get('gpu_name') or hw.get('cpu', '?')}"))
    render_verdict(rep, console, max_rows=rows)
    if html_path is not None or junit_path is not None:
        try:
            write_reports(rep, junit_path=junit_path, html_path=html_path)
        except OSError as e:
            click.echo(f"fa4verify report show: error: cannot write report: {e}", err=True)
            return 2
    return int(code)
