"""Write an audit report's files -- JSON, JUnit XML, HTML -- atomically, all or none.

Shared by ``fa4verify audit``, ``fa4verify report`` and the pytest plugin (``--fa4-json`` /
``--fa4-html``), so the plugin never imports the CLI. Every file is rendered in memory first and
then written through :func:`fa4verify.audit.atomic.write_all`; a path that is ``None`` is not
written.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional


def write_reports(report: Mapping[str, Any], *, json_path: Optional[str] = None,
                  junit_path: Optional[str] = None, html_path: Optional[str] = None) -> None:
    """Render every requested report in memory, then write them atomically (all or none)."""
    from fa4verify.audit.atomic import write_all
    from fa4verify.audit.report_json import dumps

    outs = []
    if json_path is not None:
        outs.append((json_path, dumps(report).encode("utf-8")))
    if junit_path is not None:
        from fa4verify.audit.report_junit import render as junit

        outs.append((junit_path, junit(report)))
    if html_path is not None:
        from fa4verify.audit.report_html import render as html

        outs.append((html_path, html(report).encode("utf-8")))
    write_all(outs)
