"""fa4verify catches every numeric mutant of the CPU twin and raises no false alarm on the
unmutated twin (``fa4verify mutants``, quick battery, fa4verify's verifiers only).

The suite result is computed once per test session (shared by pytest-xdist workers through a
file in pytest's base temp directory) -- about 75 s on one core; each test then reads its
mutant's verdict. Every figure is "CPU twin".
"""
from __future__ import annotations

import os
import pickle
import time

import pytest

from fa4verify import mutants as M

FA4VERIFY = tuple(s.name for s in M.verifiers() if s.group == "fa4verify")

# the session fixture runs the whole quick battery (~75 s on one core); the fast tier keeps one
# mutant end to end in tests/test_mutants_cli.py
pytestmark = pytest.mark.slow


def _compute():
    return M.run_suite("quick", seed=0, verifier_names=FA4VERIFY)


@pytest.fixture(scope="session")
def quick_result(tmp_path_factory):
    assert M.twin_module() is not None, "fa4verify.kernels.twin.attention failed to load (fa4verify's own module)"
    tw = M.twin_module()
    assert getattr(tw, "backward", None) is not None, "twin_attention.backward failed to load (fa4verify's own module)"
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent   # this session's directory, shared by its xdist workers
    data, lock = root / "fa4verify_mutants_quick.pkl", root / "fa4verify_mutants_quick.lock"
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        deadline = time.monotonic() + 900
        while not data.exists():
            if time.monotonic() > deadline:
                pytest.fail("timed out waiting for another worker's mutant suite result")
            time.sleep(0.5)
        with open(data, "rb") as f:
            return pickle.load(f)
    os.close(fd)
    res = _compute()
    tmp = root / f"fa4verify_mutants_quick.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        pickle.dump(res, f)
    os.replace(tmp, data)
    return res


@pytest.mark.parametrize("name", M.MUTANT_NAMES)
def test_fa4verify_catches_mutant(quick_result, name):
    """fa4verify's combined verdict on the mutant is "caught": some fa4verify verifier fails the
    mutant on a problem where it passes the unmutated twin."""
    cell, by = quick_result.fa4verify_cell(name)
    assert cell.status == "caught", (
        f"{name}: fa4verify {cell.status} (figure {cell.figure}, {cell.where}: {cell.detail}); "
        f"unavailable verifiers: {quick_result.unavailable}")
    assert by, name


def test_unmutated_twin_raises_no_false_alarm(quick_result):
    """Every fa4verify verifier passes (or does not apply to) the unmutated twin on every
    battery problem: zero false alarms, and no verifier errors."""
    fa = quick_result.false_alarms()
    bad = {v: [(r.arch, r.problem, r.detail) for r in rows] for v, rows in fa.items() if rows}
    assert not bad, bad
    errors = [(r.verifier, r.arch, r.problem, r.detail) for r in quick_result.rows
              if r.mutant == "none" and r.status == "error"]
    assert not errors, errors
    ran = {r.verifier for r in quick_result.rows if r.mutant == "none" and r.status == "pass"}
    missing = set(FA4VERIFY) - ran - set(quick_result.unavailable)
    assert not missing, f"verifiers that never passed anything: {missing}"


def test_every_fa4verify_verifier_is_available(quick_result):
    """The table is only meaningful with all of fa4verify's verifiers running."""
    assert not quick_result.unavailable, quick_result.unavailable


def test_detection_requires_a_clean_baseline():
    """A verifier that fails the unmutated twin on a problem cannot "catch" a mutant there."""
    res = M.SuiteResult(profile="quick", seed=0, archs=("sm90",), mutants=("p_cast_rz",),
                        verifier_names=("fa_rule_fwd",))
    res.rows = [M.Row("none", "sm90", "a", "fa_rule_fwd", "fail", 2.0, "x"),
                M.Row("p_cast_rz", "sm90", "a", "fa_rule_fwd", "fail", 3.0, "y")]
    assert res.cell("p_cast_rz", "fa_rule_fwd").status == "false-alarm"
    res.rows.append(M.Row("none", "sm90", "b", "fa_rule_fwd", "pass", 0.5, "z"))
    res.rows.append(M.Row("p_cast_rz", "sm90", "b", "fa_rule_fwd", "pass", 0.9, "w"))
    c = res.cell("p_cast_rz", "fa_rule_fwd")
    assert c.status == "missed" and c.figure == 0.9 and c.applied_on == 1
    res.rows.append(M.Row("p_cast_rz", "sm90", "b", "fa_rule_fwd", "fail", 1.5, "v"))
    assert res.cell("p_cast_rz", "fa_rule_fwd").status == "caught"


def test_mutants_no_selected_arch_applies_to_are_not_misses():
    """An SM100-only mutant in an SM90-only run is "not applicable", not a miss (exit 0), while a
    mutant that ran and was not caught is a miss (exit 1)."""
    res = M.SuiteResult(profile="quick", seed=0, archs=("sm90",),
                        mutants=("fp8_old_threshold", "p_cast_rz"),
                        verifier_names=("fwd_budget",))
    res.rows = [M.Row("none", "sm90", "a", "fwd_budget", "pass", 0.5, ""),
                M.Row("p_cast_rz", "sm90", "a", "fwd_budget", "fail", 2.0, "")]
    assert M.uncaught(res) == ([], ["fp8_old_threshold"])
    assert M.exit_code(res) == 0
    res.rows[1] = M.Row("p_cast_rz", "sm90", "a", "fwd_budget", "pass", 0.9, "")
    assert M.uncaught(res) == (["p_cast_rz"], ["fp8_old_threshold"])
    assert M.exit_code(res) == 1
