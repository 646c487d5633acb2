"""JUnit XML for CI dashboards: one ``<testcase>`` per check instance.

pass -> plain testcase; fail -> ``<failure>``; error -> ``<error>``; undecided -> ``<failure
type="undecided">``; skip -> ``<skipped message=reason>``.  ``classname`` is ``fa4verify.<area>``
(the check id up to its first dot), ``name`` the check id; ``time`` in seconds.  Metrics go into
``<system-out>`` and the report-level configuration into ``<properties>``.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any


def _clean(s: Any) -> str:
    """Text safe for XML 1.0 (drops control characters other than tab/newline)."""
    s = str(s)
    return "".join(ch for ch in s if ch in "\t\n\r" or ord(ch) >= 0x20)


def render(report: dict[str, Any]) -> bytes:
    results = report["results"]
    c = report["summary"]["counts"]
    suites = ET.Element("testsuites", name="fa4verify audit")
    cfg = report.get("config", {})
    suite = ET.SubElement(
        suites, "testsuite",
        name=f"fa4verify.audit[{cfg.get('dtype', '?')},{cfg.get('profile', '?')}]",
        tests=str(len(results)), failures=str(c.get("fail", 0) + c.get("undecided", 0)),
        errors=str(c.get("error", 0)), skipped=str(c.get("skip", 0)),
        time=f"{report['summary'].get('duration_s', 0.0):.3f}", timestamp=report.get("created", ""))
    props = ET.SubElement(suite, "properties")
    for k, v in sorted(cfg.items()):
        ET.SubElement(props, "property", name=f"config.{k}", value=_clean(v))
    for k, v in sorted(((report.get("environment") or {}).get("versions") or {}).items()):
        ET.SubElement(props, "property", name=f"version.{k}", value=_clean(v))
    ET.SubElement(props, "property", name="schema", value=report.get("schema", ""))
    for r in results:
        area = r["id"].split(".", 1)[0]
        tc = ET.SubElement(suite, "testcase", classname=f"fa4verify.{area}", name=r["id"],
                           time=f"{float(r.get('duration_s', 0.0)):.3f}")
        msg = _clean(r.get("summary", ""))
        st = r["status"]
        if st == "fail":
            el = ET.SubElement(tc, "failure", message=msg, type="violation")
            el.text = _clean(_body(r))
        elif st == "undecided":
            el = ET.SubElement(tc, "failure", message=msg, type="undecided")
            el.text = _clean(_body(r))
        elif st == "error":
            el = ET.SubElement(tc, "error", message=msg, type="error")
            el.text = _clean(_body(r))
        elif st == "skip":
            ET.SubElement(tc, "skipped", message=msg)
        out = ET.SubElement(tc, "system-out")
        out.text = _clean(_body(r))
    ET.indent(suites)
    return ET.tostring(suites, encoding="utf-8", xml_declaration=True)


def _body(r: dict[str, Any]) -> str:
    lines = [f"{r['id']}: {r['status']} ({r.get('where') or '-'})", r.get("summary", "")]
    if r.get("tightness") is not None:
        lines.append(f"tightness (measured/budget): {r['tightness']}")
    for k, v in (r.get("metrics") or {}).items():
        lines.append(f"{k} = {v}")
    for n in r.get("notes") or []:
        lines.append(f"note: {n}")
    tb = (r.get("details") or {}).get("traceback") or (r.get("details") or {}).get("worker_stderr_tail")
    if tb:
        lines.append(str(tb))
    return "\n".join(lines)
