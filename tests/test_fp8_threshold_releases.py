"""``budgets.fp8.threshold`` judges the fp8 setting of the release that runs (CPU twin): FA #2577's
old setting (rescale threshold 4 with max_offset 8, as 4.0.0b20..b22 ship it) saturates the e4m3 P
cast and fails; b23's (threshold 4, e4m3 max_offset 4) and b24 on's (threshold 0, max_offset 8)
pass; and the summary says which, never "within budget" on a failure."""
from __future__ import annotations

import dataclasses

import pytest

from fa4verify.audit.registry import CheckContext
from fa4verify.checks import budgets as cb
from fa4verify.kernels import fa4_params


@pytest.mark.parametrize("rt_other, mo_fp8, status", [
    (0.0, 8.0, "pass"),      # 4.0.0b24 .. b36
    (4.0, 4.0, "pass"),      # 4.0.0b23
    (4.0, 8.0, "fail"),      # 4.0.0b20 .. b22: FA #2577's old setting
])
def test_the_installed_fp8_setting_is_judged(monkeypatch, rt_other, mo_fp8, status):
    base = fa4_params.load_params()
    p = dataclasses.replace(base, rescale_threshold_other=rt_other, max_offset_fp8=mo_fp8)
    monkeypatch.setattr(fa4_params, "load_params", lambda: p)
    r = cb.fp8_threshold(CheckContext(check_id="budgets.fp8.threshold", dtype="bf16"))
    assert r.status == status, r.summary
    assert "(caught)" in r.summary                       # the old setting is always seen
    if status == "fail":
        assert "OVER budget" in r.summary and "> 448" in r.summary and "within budget" not in r.summary
    else:
        assert "within budget" in r.summary and "<= 448" in r.summary
