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
    # per tensor: dQ's figure is that of the example no known issue touched
    assert r.metrics["tightness_out_outside_known"] == 0.7 and r.metrics["tightness_dq_outside_known"] == 0.2
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


def _campaign_with_an_absorbed_dq(monkeypatch, tmp_path):
    """``fa4verify fuzz``'s in-process campaign (run_campaign) on examples whose dQ a known issue
    absorbs at 1527 x its budget while O sits at 0.5 (a stand-in check_problem and matcher)."""
    from fa4verify.fuzz import campaign as C
    from fa4verify.fuzz.known_issues import KnownIssue
    from fa4verify.fuzz.properties import CheckOutcome
    from fa4verify.fuzz.violation import Violation, _fail
    from fa4verify.targets import TwinTarget
    ki = KnownIssue("sm90_dq_accum_hdim_rounding", "t", "r", lambda *a: True)

    def check(problem, target, **kw):
        _fail(Violation("bwd_budget", "dq over", {"quantity": "dq", "tightness_dq": 1527.0}))
        return CheckOutcome({"tightness_out": 0.5, "tightness_dq": 1527.0, "tightness_max": 1527.0}, {}, ["bwd_budget"])

    monkeypatch.setattr(C, "check_problem", check)
    monkeypatch.setattr(C, "known_issue_matcher",
                        lambda problem, target, strict=False: lambda v: ki if v.metrics.get("quantity") == "dq" else None)
    return C.run_campaign(target=TwinTarget(), examples=4, seed=0, database_dir=tmp_path)


def test_fuzz_campaign_applies_the_same_rule(monkeypatch, tmp_path):
    """One rule for both paths (CampaignResult.record_tightness): run_campaign used to add every
    figure to its maxima, so ``fa4verify fuzz`` reported the absorbed dQ's 1527 as its tightness."""
    res = _campaign_with_an_absorbed_dq(monkeypatch, tmp_path)
    assert res.examples_run >= 1 and res.known_hits["sm90_dq_accum_hdim_rounding"]["count"] >= 1
    assert res.max_metrics["tightness_dq"] == 1527.0                      # every figure stays on record
    assert res.max_metrics_outside_known == {"tightness_out": 0.5}
    assert res.tightness_outside_known == 0.5
    r = _result(res, "CPU twin")                                          # the audit's reading of it
    assert r.tightness == 0.5 and r.metrics["tightness_outside_known"] == 0.5
    assert res.to_json()["max_metrics_outside_known"] == {"tightness_out": 0.5}


def test_fuzz_command_prints_the_tightness_outside_known_issues(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from fa4verify import fuzz
    from fa4verify.cli.fuzz import command
    res = _campaign_with_an_absorbed_dq(monkeypatch, tmp_path)
    monkeypatch.setattr(fuzz, "run_campaign", lambda **kw: res)
    r = CliRunner().invoke(command, ["--target", "twin", "--examples", "4", "--cache-dir", str(tmp_path)])
    assert "max tightness outside known issues (error / allowed): out 0.5" in r.output, r.output
    assert "(in what known issues absorbed: dq 1.53e+03)" in r.output, r.output
    assert "max tightness (error / allowed)" not in r.output


def _undecided(j, prop):
    o = _ran(j, {"tightness_out": 0.1})
    o["undecided"] = {prop: f"impossible question at this precision ({j})"}
    return o


def test_every_undecided_class_keeps_replayable_problems():
    """CampaignResult.record_undecided (one rule for both campaign paths): the count, the first
    reason and problem, and the first UNDECIDED_KEEP problems of each property and tensor, so a
    user can replay more than the first undecided example."""
    from fa4verify.fuzz.campaign import UNDECIDED_KEEP
    res = _merge([_undecided(j, "bwd_budget.dq") for j in range(UNDECIDED_KEEP + 3)] + [_undecided(UNDECIDED_KEEP + 3, "bwd_budget.dv")])
    u = res.undecided["bwd_budget.dq"]
    assert u["count"] == UNDECIDED_KEEP + 3 and u["reason"].endswith("(0)") and u["problem"] == {"j": 0}
    assert u["problems"] == [{"j": j} for j in range(UNDECIDED_KEEP)]
    assert res.undecided["bwd_budget.dv"]["problems"] == [{"j": UNDECIDED_KEEP + 3}]
    r = _result(res, "CPU twin")
    assert r.status == "undecided" and r.details["undecided"]["bwd_budget.dq"]["count"] == UNDECIDED_KEEP + 3


def test_a_rerun_pass_reports_its_own_absorbed_figure():
    """The dLSE and autograd passes of bwd_stages rerun the backward: a known issue that absorbs
    their dQ takes out ``tightness_dlse_dq`` / ``tightness_autograd_dq`` (the violation carries
    its pass, ``tightness_key``), not the driver's dQ, which still binds where it held."""
    from fa4verify.fuzz.properties import PASSES, _compare
    from fa4verify.fuzz.violation import Violation, tightness_key
    import numpy as np
    import pytest
    from fa4verify.problem import AttentionProblem
    p = AttentionProblem("sm90", "bf16", 1, 4, 4, 1, 1, 8, 8)
    ref = np.ones((1, 4, 1, 8))
    with pytest.raises(Violation) as ei:
        _compare("bwd_budget", "dq", ref * 2, ref, 0 * ref, 1e-3 + 0 * ref, p, {}, pass_="dlse")
    v = ei.value
    assert tightness_key(v) == "dlse_dq" and v.metrics["quantity"] == "dq" and v.message.startswith(PASSES["dlse"])
    assert tightness_key(Violation("bwd_budget", "x", {"quantity": "dk"})) == "dk"
    known = [{"name": "k", "title": "t", "reference": "r", "property": "bwd_budget", "quantity": "dq",
              "tightness_key": "dlse_dq"}]
    o = _ran(0, {"tightness_dq": 0.4, "tightness_dlse_dq": 1490.0, "tightness_dk": 0.5})
    o["known"] = known
    r = _result(_merge([o]), "measured on NVIDIA H200 (sm_90)")
    assert r.metrics["tightness_outside_known"] == 0.5 and r.metrics["tightness_dq_outside_known"] == 0.4
    assert "tightness_dlse_dq_outside_known" not in r.metrics
