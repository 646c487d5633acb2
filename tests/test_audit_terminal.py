"""Terminal output: live progress on a TTY, one line per check otherwise, the verdict."""
from __future__ import annotations

import io
import os

from rich.console import Console

from fa4verify._options import build_config
from fa4verify.audit.report_json import build_report
from fa4verify.audit.runner import exit_code_for, run_audit
from fa4verify.audit.terminal import TerminalReporter, render_verdict

OK = os.path.join(os.path.dirname(__file__), "fixtures", "audit_checks_ok.py")


def _run(console, live):
    cfg = build_config(device="cpu", checks_modules=[OK], no_default_checks=True)
    rep = TerminalReporter(console, live=live)
    run = run_audit(cfg, reporter=rep)
    return run


def test_non_tty_prints_one_line_per_finished_check_with_where_and_time():
    buf = io.StringIO()
    run = _run(Console(file=buf, width=200, force_terminal=False), live=False)
    lines = [ln for ln in buf.getvalue().splitlines() if ln.startswith("[")]
    assert len(lines) == len(run.records) == 5
    assert lines[0].startswith("[1/5] PASS  fixture.dot.bf16  CPU  ")
    assert any("SKIP  fixture.needs_cuda  -" in ln and "no CUDA device" in ln for ln in lines)
    assert any("fixture.per_arch[sm100]  CPU twin" in ln for ln in lines)


def test_tty_live_display_runs_progress_bars_and_still_reports_every_check():
    buf = io.StringIO()
    run = _run(Console(file=buf, width=120, force_terminal=True), live=True)
    out = buf.getvalue()
    assert "\x1b[" in out  # ANSI: a live display was drawn
    assert [r.status for r in run.records].count("pass") == 4
    assert "fixture.dot.bf16" in out


def test_verdict_lists_worst_ulps_tightness_skips_and_where():
    buf = io.StringIO()
    run = _run(Console(file=io.StringIO(), width=200), live=False)
    results = [r.to_dict() for r in run.records]
    report = build_report(config={"profile": "default"}, environment={}, results=results,
                          exit_code=exit_code_for(run.records), duration_s=1.0)
    render_verdict(report, Console(file=buf, width=200))
    out = buf.getvalue()
    assert "PASSED" in out and "(exit 0)" in out
    assert "worst errors (bf16 ulps): fixture.dot.bf16 max_ulp_bf16=" in out
    assert "other ulp metrics: fixture.dot.bf16 spread_ulp=" in out
    assert "tightest budgets (measured/budget): fixture.dot.bf16 0.5" in out
    assert "skipped 1: no CUDA device (torch.cuda.is_available() is False) -- fixture.needs_cuda" in out
    assert "ran: 1 CPU, 3 CPU twin" in out
