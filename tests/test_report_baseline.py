"""Baseline comparison rules, report merging and the JSON report's NaN handling."""
from __future__ import annotations

import json

import pytest

from fa4verify.audit.baseline import compare, merge
from fa4verify.audit.report_json import build_report, dumps, load_report
from fa4verify.errors import ReportError


def res(id_, status="pass", tightness=None, **metrics):
    return {"id": id_, "check_id": id_, "status": status, "where": "CPU", "summary": "",
            "metrics": metrics, "details": {}, "tightness": tightness, "duration_s": 0.0}


def rep(results, **cfg):
    config = {"dtype": "bf16", "profile": "default", "seed": 0, "archs": ["sm90"], "device": "cpu"}
    config.update(cfg)
    return build_report(config=config, environment={}, results=results, exit_code=0, duration_s=1)


def regs(cur, base, **kw):
    return [(g["id"], g["metric"]) for g in compare(cur, rep(base), **kw)["regressions"]]


def test_larger_is_worse_unless_higher_is_better():
    base = [res("a", max_ulp=2, coverage_higher_is_better=0.9)]
    assert regs([res("a", max_ulp=3, coverage_higher_is_better=0.9)], base) == [("a", "max_ulp")]
    assert regs([res("a", max_ulp=1, coverage_higher_is_better=0.8)], base) == [("a", "coverage_higher_is_better")]
    assert regs([res("a", max_ulp=2, coverage_higher_is_better=0.95)], base) == []


def test_rtol_tolerates_relative_growth_only_up_to_it():
    base = [res("a", wrong_count=100)]
    assert regs([res("a", wrong_count=105)], base, rtol=0.05) == []
    assert regs([res("a", wrong_count=106)], base, rtol=0.05) == [("a", "wrong_count")]


def test_nan_after_a_number_is_a_regression_and_text_metrics_are_ignored():
    base = [res("a", max_err=1e-3, note="x")]
    assert regs([res("a", max_err=float("nan"), note="y")], base) == [("a", "max_err")]
    assert regs([res("a", max_err="nan")], base) == [("a", "max_err")]


def test_status_and_tightness_regressions_and_skips():
    base = [res("a", tightness=0.5), res("b"), res("c", status="skip", m=1)]
    cur = [res("a", tightness=0.6), res("b", status="fail"), res("c", m=5), res("new")]
    out = compare(cur, rep(base))
    assert sorted((g["id"], g["metric"]) for g in out["regressions"]) == [("a", "tightness"), ("b", "status")]
    assert out["new"] == ["new"] and out["missing"] == []


def test_merge_recomputes_the_exit_code_and_rejects_conflicts():
    a = rep([res("x"), res("y", status="skip")], shard="1/2")
    b = rep([res("z", status="fail")], shard="2/2")
    m = merge([("a", a), ("b", b)])
    assert [r["id"] for r in m["results"]] == ["x", "y", "z"]
    assert m["summary"]["exit_code"] == 1 and m["summary"]["counts"]["fail"] == 1
    with pytest.raises(ReportError, match="seed"):
        merge([("a", a), ("c", rep([res("q")], seed=1))])
    with pytest.raises(ReportError, match="is fail here but pass"):
        merge([("a", a), ("d", rep([res("x", status="fail")]))])


def test_json_report_writes_non_finite_numbers_as_strings(tmp_path):
    r = rep([res("a", tightness=float("inf"), e=float("nan"))])
    text = dumps(r)
    json.loads(text)  # strict JSON
    assert '"e": "nan"' in text and '"tightness": "inf"' in text
    p = tmp_path / "r.json"
    p.write_text(text)
    assert load_report(str(p))["results"][0]["metrics"]["e"] == "nan"


@pytest.mark.parametrize("payload, msg", [
    ("[]", "not a JSON object"),
    ('{"schema": "fa4verify.audit/2", "results": []}', "schema"),
    ('{"schema": "fa4verify.audit/1"}', "results"),
    ('{"schema": "fa4verify.audit/1", "results": [{"id": "a", "status": "green"}]}', "results\\[0\\]"),
])
def test_invalid_reports_are_one_line_errors(tmp_path, payload, msg):
    p = tmp_path / "r.json"
    p.write_text(payload)
    with pytest.raises(ReportError, match=msg) as ei:
        load_report(str(p))
    assert "\n" not in str(ei.value)
