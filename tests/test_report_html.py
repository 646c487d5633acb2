"""The HTML report: plots from ``details["plot"]``, robustness, and a headless-Chromium render."""
from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys

import pytest

from fa4verify.audit import report_html
from fa4verify.audit.report_json import build_report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _report(results):
    full = []
    for r in results:
        d = {"id": r["id"], "check_id": r["id"], "title": "t", "module": "m", "arch": "sm90",
             "needs": ["cpu"], "status": "pass", "where": "CPU twin", "summary": "s", "metrics": {},
             "details": {}, "tightness": None, "duration_s": 0.1, "isolated": False, "notes": []}
        d.update(r)
        full.append(d)
    return build_report(config={"dtype": "bf16", "seed": 0}, environment={"versions": {}, "hardware": {}},
                        results=full, exit_code=0, duration_s=1.0)


def _pngs(html: str) -> list[bytes]:
    out = []
    marker = 'src="data:image/png;base64,'
    for part in html.split(marker)[1:]:
        out.append(base64.b64decode(part.split('"', 1)[0]))
    return out


@pytest.mark.parametrize("plot", [
    {"kind": "histogram", "title": "ulps deg 3", "bins": [0, 1, 2, 3], "counts": [5, 2, 1]},
    {"kind": "histogram", "title": "per degree", "series": {
        "deg 3": {"bins": [0, 1, 2], "counts": [3, 1]}, "deg 5": {"bins": [0, 1, 2], "counts": [4, 0]}}},
    {"kind": "bars", "title": "stages", "labels": ["s_accum", "p_cast"], "values": [0.5, 1.2],
     "budget": [1.0, 1.0]},
    {"kind": "lines", "title": "err vs seqlen", "x": [128, 256, 512],
     "series": {"causal": [1e-3, 2e-3, 3e-3], "plain": [1e-3, 1.5e-3, 2e-3]}, "budget": 4e-3, "logx": True},
])
def test_each_plot_kind_becomes_an_embedded_png(plot):
    html = report_html.render(_report([{"id": "a.b", "details": {"plot": plot}}]))
    pngs = _pngs(html)
    assert len(pngs) == 1 and pngs[0].startswith(PNG_MAGIC)


def test_table_plots_and_metrics_become_tables():
    plot = {"kind": "table", "title": "digests", "columns": ["run", "sha256"],
            "rows": [[1, "abc123"], [2, "abc123"]]}
    html = report_html.render(_report([{"id": "det.x", "details": {"plot": plot},
                                        "metrics": {"distinct_digests": 1}}]))
    assert "abc123" in html and "distinct_digests" in html and _pngs(html) == []


@pytest.mark.parametrize("plot", [
    {"kind": "histogram", "bins": [0, 1], "counts": [1, 2, 3]},
    {"kind": "bars", "labels": ["a"], "values": ["x"]},
    {"kind": "pie"},
    "not a dict",
])
def test_a_malformed_plot_is_a_note_not_a_crash(plot):
    html = report_html.render(_report([{"id": "bad.plot", "details": {"plot": plot}}]))
    assert "plot not drawn" in html and "bad.plot" in html


def test_overview_plot_when_checks_report_tightness():
    html = report_html.render(_report([{"id": "a", "tightness": 0.4}, {"id": "b", "tightness": 1.3,
                                                                       "status": "fail"}]))
    assert len(_pngs(html)) == 1 and 'alt="tightness overview"' in html


def test_text_is_escaped():
    html = report_html.render(_report([{"id": "x.y", "summary": "<script>alert(1)</script>"}]))
    assert "<script>alert" not in html and "&lt;script&gt;" in html


@pytest.mark.skipif(shutil.which("chromium") is None and shutil.which("chromium-browser") is None,
                    reason="chromium not installed (apt-get install -y chromium)")
def test_report_renders_in_headless_chromium(tmp_path):
    from fa4verify.cli import main

    h, png = tmp_path / "r.html", tmp_path / "r.png"
    ok = os.path.join(ROOT, "tests", "fixtures", "audit_checks_ok.py")
    assert main(["audit", "--no-default-checks", "--no-live", "--checks-module", ok,
                 "--html", str(h)]) == 0
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "screenshot_html.py"),
                           str(h), str(png), "--height", "1600"], capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr
    data = png.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 20_000  # more than a blank page


def test_other_details_become_tables():
    details = {"cases": [{"dist": "normal", "stages": {"s_accum": 0.25, "p_cast": 0.5}},
                         {"dist": "outliers", "stages": {"s_accum": 0.125}}],
               "config": {"tile_n": 128}, "seed": 3}
    html = report_html.render(_report([{"id": "t.x", "details": details}]))
    for text in ("stages.s_accum", "stages.p_cast", "outliers", "tile_n", "<h4>cases</h4>"):
        assert text in html


def test_bars_in_different_units_are_drawn_relative_to_their_budgets():
    plot = {"kind": "bars", "title": "mixed", "labels": ["max_rel_error", "bf16 ulp"],
            "values": [8.77e-5, 0.52], "budget": [8.78e-5, 1.0]}
    html = report_html.render(_report([{"id": "m.x", "details": {"plot": plot}}]))
    assert len(_pngs(html)) == 1 and "plot not drawn" not in html
    assert report_html.plot_bars(plot) != report_html.plot_bars({**plot, "budget": [1.0, 1.0]})


def test_error_vs_seqlen_plot_is_drawn_log_log_and_needs_two_seqlens():
    from fa4verify.audit.report_html import render_plot
    from fa4verify.checks._live import tightness_vs_seqlen_plot
    pts = [(512, "out", 0.3), (2048, "out", 0.4), (512, "dq", 0.1), (2048, "dq", 0.12), (2048, "dq", 0.2)]
    p = tightness_vs_seqlen_plot(pts, title="t", where="CPU twin")
    assert p["x"] == [512, 2048] and p["series"]["dq"] == [0.1, 0.2] and p["logx"] and p["logy"]
    assert render_plot(p).startswith('<img class="plot"')
    assert tightness_vs_seqlen_plot([(512, "out", 0.3)], title="t") is None
