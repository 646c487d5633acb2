"""Replay every committed fuzz case in tests/regressions/ (see the README there)."""
from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from fa4verify import fuzz

CASES = sorted((Path(__file__).parent / "regressions").glob("*.json"))

importlib.import_module("fa4verify.kernels.twin.attention")


def _deps():
    import fa4verify.oracles.attention  # noqa: F401
    fuzz._budget(fuzz.AttentionProblem("sm90", "bf16", 1, 1, 1, 1, 1, 8, 8))


def test_there_are_regression_cases():
    assert len(CASES) >= 4


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_regression_case_replays_as_recorded(path):
    _deps()
    case = json.loads(path.read_text())
    assert case["format"] == fuzz.CASE_FORMAT
    if case["target"] != "twin":
        pytest.skip("production cases replay on a GPU only (pytest -m gpu)")
    out = fuzz.replay_case(case)
    assert out.status == case["expect"], f"{path.name}: {out.status}: {out.message}"
    if case["expect"] == "pass":      # a fixed defect: must now pass every property, not just its own
        full = fuzz.replay_case(case, properties=fuzz.PROPERTIES)
        assert full.status == "pass", f"{path.name}: {full.status}: {full.property}: {full.message}"
        return
    assert out.property == case["property"]
    problem = fuzz.AttentionProblem.from_dict(case["problem"])
    if case.get("mutations"):
        clean = fuzz.replay_case(case, target=fuzz.TwinTarget(), properties=fuzz.PROPERTIES)
        assert clean.status == "pass", f"unmutated twin fails {path.name}: {clean.message}"
    if case.get("known_issue"):
        v = fuzz.Violation(out.property, out.message, out.metrics)
        ki = fuzz.match_known_issue(problem, v)
        assert ki is not None and ki.name == case["known_issue"]
