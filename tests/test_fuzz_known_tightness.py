"""Note [Tightness outside known issues]: a fuzz campaign whose examples hit a known issue reports
the worst tightness of what no known issue absorbed (the H200 default audit drew an hd-8 example
whose dQ, absorbed by the recorded SM90 defect, sat at 1527 x its budget, and the summary read
"every property held; max tightness 1.53e+03"). CPU only: synthetic outcomes of run_drawn."""
from __future__ import annotations

from fa4verify.checks.fuzz import _result
from fa4verify.fuzz.drawn import merge_drawn


def _ran(j, metrics, known=()):
    return {"index": j, "digest": f"d{j}", "describe": f"example {j}", "status": "ran",
            "features": {"hdim": "8x8"}, "ran": ["bwd_budget"], "skipped": {}, "undecided": {},
            "metrics": dict(metrics, tightness_max=max(metrics.values())), "problem": {"j": j},
            "known": [{"name": "sm90_dq_accum_hdim_rounding", "title": "t", "reference": "r",
                       "property": "bwd_budget", "quantity": q} for q in known]}


def _merge(outcomes):
    return merge_drawn([{"outcomes": outcomes, "seconds": 1.0, "target": {}}], expected=len(outcomes),
                       arch="sm90", profile="ci", seed=0)


def test_an_absorbed_quantity_does_not_set_the_tightness():
    res = _merge([_ran(0, {"tightness_out": 0.5, "tightness_dq": 1527.0}, known=["dq"]),
                  _ran(1, {"tightness_out": 0.7, "tightness_dq": 0.2})])
    r = _result(res, "measured on NVIDIA H200 (sm_90)")
    assert r.status == "pass"
    assert r.metrics["tightness_max"] == 1527.0 and r.metrics["tightness_outside_known"] == 0.7
    assert r.tightness == 0.7
    assert "max tightness 0.7 outside known issues (1.53e+03 in what they absorbed)" in r.summary


def test_without_known_hits_the_tightness_is_the_plain_maximum():
    res = _merge([_ran(0, {"tightness_out": 0.5, "tightness_dq": 0.9}), _ran(1, {"tightness_out": 0.7})])
    r = _result(res, "CPU twin")
    assert r.tightness == 0.9 and "tightness_outside_known" not in r.metrics
    assert "outside known issues" not in r.summary


def test_an_absorbed_quantity_without_its_own_figure_keeps_the_example_whole():
    """A known issue that absorbed a whole property (no per-quantity tightness): nothing of that
    example is excluded, so the figure can only be too high, never too low."""
    res = _merge([_ran(0, {"tightness_out": 3.0}, known=["deterministic_bwd"]), _ran(1, {"tightness_out": 0.4})])
    r = _result(res, "CPU twin")
    assert r.metrics["tightness_outside_known"] == 3.0 and r.tightness == 3.0
