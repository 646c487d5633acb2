"""The ``mufu.tanh`` check's judgement of a tanh.approx sweep against the budgets' model
(Note [MUFU tanh envelope]); the sweep itself runs on a GPU (the audit's live check)."""
from __future__ import annotations

import pytest

from fa4verify.checks.mufu import judge_tanh


def _stats(**kw):
    s = {"max_rel_normal": 2.0 ** -12, "over_one": 0, "nonfinite": 0, "odd_violations": 0,
         "max_abs_from_1": 2.0 ** -22, "sat": 9.0, "inputs": 1 << 32}
    s.update(kw)
    return s


BASE = {"tanh_rel": 2.0 ** -10.987}
SHARP = dict(BASE, tanh_abs1=2.0 ** -21, tanh_sat=9.5)


def test_within_the_ptx_model_only_where_no_measured_model():
    rows = judge_tanh(_stats(max_abs_from_1=0.5, sat=1e30), BASE)
    assert all(r["ok"] for r in rows)
    assert {r["budget_name"] for r in rows} == {"tanh_rel", "(none allowed)"}


@pytest.mark.parametrize("bad", [dict(max_rel_normal=2.0 ** -10), dict(over_one=1), dict(nonfinite=3),
                                 dict(odd_violations=1), dict(max_abs_from_1=2.0 ** -20), dict(sat=9.6)])
def test_each_figure_outside_the_model_fails(bad):
    rows = judge_tanh(_stats(**bad), SHARP)
    assert [r for r in rows if not r["ok"]], rows
    assert all(r["ok"] for r in judge_tanh(_stats(), SHARP))
