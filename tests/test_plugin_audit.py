"""The pytest plugin: ``pytest --fa4verify[=profile]`` runs audit checks as test items."""
from __future__ import annotations

import os

import pytest

pytest_plugins = ["pytester"]

FIX = os.path.join(os.path.dirname(__file__), "fixtures")
OK = os.path.join(FIX, "audit_checks_ok.py")
BAD = os.path.join(FIX, "audit_checks_bad.py")
TIGHT = os.path.join(FIX, "budget_tight.toml")


@pytest.fixture(autouse=True)
def _preload_heavy_modules():
    """pytester's in-process runs drop modules first imported inside them; re-importing torch
    in one process crashes, so import what the fixture checks import (torch via the CUDA probe,
    numpy) before the inner sessions."""
    import numpy  # noqa: F401

    from fa4verify.audit.registry import cuda_available

    cuda_available()


def _run(pytester, *args):
    pytester.makepyfile(test_user="def test_user_own():\n    assert True\n")
    return pytester.runpytest("-p", "no:cacheprovider", "--fa4-no-default-checks",
                                         "--fa4-checks-module", OK, *args)


def test_one_item_per_check_and_skip_reasons(pytester):
    res = _run(pytester, "--fa4verify=quick", "-rs", "-v")
    res.assert_outcomes(passed=5, skipped=1)  # 4 fixture checks + the user's test; 1 skip
    out = res.stdout.str()
    assert "fixture.per_arch[sm90] PASSED" in out or "per_arch[sm90]" in out
    assert "no CUDA device (torch.cuda.is_available() is False)" in out


def test_fa4_only_deselects_other_tests_and_k_selects_checks(pytester):
    res = _run(pytester, "--fa4verify", "--fa4-only", "-k", "dot")
    res.assert_outcomes(passed=1, deselected=4)   # the user's test is not even collected


def test_fa4_only_imports_no_test_module(pytester):
    """--fa4-only collects no test file (a smoke run must not pay for importing the suite):
    a test module that fails at import does not break the run; without --fa4-only it does."""
    pytester.makepyfile(test_broken="raise RuntimeError('imported although --fa4-only')\n")
    args = ("-p", "no:cacheprovider", "--fa4-no-default-checks", "--fa4-checks-module", OK,
            "--fa4verify", "-k", "dot")
    res = pytester.runpytest(*args, "--fa4-only")
    res.assert_outcomes(passed=1)
    assert "imported although" not in res.stdout.str()
    res = pytester.runpytest(*args)
    res.assert_outcomes(errors=1)


def test_failing_check_fails_the_item_with_its_summary(pytester):
    res = _run(pytester, "--fa4verify", "--fa4-only", "--fa4-opt", f"budget={TIGHT}", "-k", "dot")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*fixture.dot.bf16: FAIL (CPU)*budget 0.01*"])


def test_aborting_check_is_an_error_item_and_the_session_continues(pytester):
    res = _run(pytester, "--fa4verify", "--fa4-only", "--fa4-checks-module", BAD,
               "--fa4-isolate", "always", "-k", "bad")
    res.assert_outcomes(passed=1, failed=2, skipped=1)
    res.stdout.fnmatch_lines(["*fixture.bad.abort: ERROR*SIGABRT*"])


def test_without_the_flag_no_audit_items_are_added(pytester):
    res = _run(pytester)
    res.assert_outcomes(passed=1)


def test_bad_option_value_is_a_usage_error(pytester):
    res = _run(pytester, "--fa4verify", "--fa4-dtype", "fp32")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*--dtype 'fp32'*"])


def test_cli_and_plugin_share_the_option_table():
    from fa4verify import _options
    from fa4verify.cli.audit import command

    cli_names = {p.opts[0] for p in command.params if p.opts[0].startswith("--")}
    for opt in _options.OPTIONS:
        assert f"--{opt.name}" in cli_names


def test_json_and_html_reports_from_a_pytest_session(pytester, tmp_path):
    import json

    j, h = tmp_path / "a.json", tmp_path / "a.html"
    res = _run(pytester, "--fa4verify", "--fa4-only", "--fa4-json", str(j), "--fa4-html", str(h))
    res.assert_outcomes(passed=4, skipped=1)
    rep = json.loads(j.read_text())
    assert rep["schema"] == "fa4verify.audit/1" and rep["summary"]["exit_code"] == 0
    assert {r["id"] for r in rep["results"]} == {"fixture.dot.bf16", "fixture.lines", "fixture.needs_cuda",
                                                 "fixture.per_arch[sm90]", "fixture.per_arch[sm100]"}
    assert "data:image/png;base64," in h.read_text()


def test_unwritable_report_path_is_a_usage_error(pytester, tmp_path):
    res = _run(pytester, "--fa4verify", "--fa4-json", str(tmp_path / "missing" / "a.json"))
    assert res.ret == pytest.ExitCode.USAGE_ERROR


def test_items_of_one_pytest_process_share_one_worker_process(pytester, tmp_path):
    """Isolated checks of consecutive items run in the same worker process (one pool per pytest
    process), not one fresh worker per item: imports, CUDA context and compiled kernels are paid
    once per xdist worker."""
    import xml.etree.ElementTree as ET

    pool = os.path.join(FIX, "audit_checks_pool.py")
    xml = tmp_path / "j.xml"
    res = pytester.runpytest("-p", "no:cacheprovider", "--fa4-no-default-checks",
                             "--fa4-checks-module", pool, "--fa4verify", "--fa4-only",
                             "--fa4-isolate", "always", "--fa4-workers", "1", "-k", "pid",
                             f"--junitxml={xml}")
    res.assert_outcomes(passed=2)
    pids = [p.get("value") for p in ET.parse(xml).getroot().iter("property")
            if p.get("name") == "fa4verify.metric.pid"]
    assert len(pids) == 2 and pids[0] == pids[1] and int(pids[0]) != os.getpid()
