"""``benchmarks/plan_judge_cost.py`` runs coverage.production's own cases through the judge with
its CPU stand-in for FA4 and reports each example's judge seconds apart from the stand-in's."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.fa4

ROOT = Path(__file__).resolve().parents[1]


def test_it_judges_the_named_examples_of_the_plan(tmp_path):
    spec = importlib.util.spec_from_file_location("plan_judge_cost", ROOT / "benchmarks" / "plan_judge_cost.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "cost.json"
    assert mod.main(["--names", "sparse_q64", "sparse_q64_causal", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["name"] for r in rows] == ["sparse_q64", "sparse_q64_causal"]
    assert all(r["judge"] > 0 and r["target"] > 0 for r in rows)
