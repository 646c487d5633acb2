"""The ``mufu.tanh`` check's judgement of a tanh.approx sweep against the budgets' model
(Note [MUFU tanh envelope]); the sweep itself runs on a GPU (the audit's live check)."""
from __future__ import annotations

import math

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


def _fake_mufu(sat: float, rel: float):
    """A stand-in tanh on the CPU: relative error ``rel`` below ``sat``, exactly +-1 from it."""
    import torch

    def fn(x):
        t = torch.tanh(x.double()) * (1 + rel)
        t = torch.where(x.abs() >= sat, torch.sign(x.double()), t.clamp(-1, 1))
        return t.float()
    return fn


@pytest.mark.fa4      # the probe module imports the CuTe DSL
def test_sweep_finds_the_saturation_point_and_the_errors():
    """The sweep's reductions on a stand-in (three binades on the CPU): the saturation point is
    the first fp32 from which every output is +-1; the absolute error at |x| >= 1 is measured."""
    from fa4verify.kernels.probes.probe_mufu_tanh import sweep
    s = sweep(fn=_fake_mufu(5.0, 2.0 ** -14), device="cpu", exponents=[126, 128, 129])
    assert s["sat"] == 5.0
    assert s["over_one"] == 0 and s["nonfinite"] == 0 and s["odd_violations"] == 0
    # the largest absolute error at |x| >= 1 is the jump to 1 at the saturation point
    assert s["max_abs_from_1"] == pytest.approx(1 - math.tanh(5.0), rel=1e-3)
    assert s["inputs"] == 3 * 2 * (1 << 23)
    rows = judge_tanh(s, dict(SHARP, tanh_sat=5.0, tanh_abs1=2.0 ** -14))
    assert [r["budget_name"] for r in rows if not r["ok"]] == ["tanh_abs1"]


def test_the_budgets_carry_the_recorded_sweep_and_the_twin_models_it():
    """The sm90 budgets' tanh model is at least what the H200 sweep recorded (one fact: the
    recording; the budgets may only be wider), and the twin's sm90 MUFU tanh stays inside it."""
    import json

    import numpy as np

    from fa4verify.error_budgets import loader
    from fa4verify.kernels.evidence import evidence_path
    from fa4verify.kernels.twin.forward import Mufu, mufu_tanh_envelope
    rec = json.loads(evidence_path("golden/mufu_tanh.json").read_text())["archs"]["sm90"]
    assert rec["over_one"] == 0 and rec["odd_violations"] == 0
    for dt in ("bf16", "fp16"):
        c = loader.load(dt, "sm90").constants
        assert c["tanh_abs1"] >= rec["max_abs_from_1"] and c["tanh_sat"] >= rec["sat"]
        assert c["tanh_rel"] >= rec["max_rel_normal"]
    assert "tanh_sat" not in loader.load("bf16", "sm100").constants   # not measured there
    assert mufu_tanh_envelope("sm100") is None
    env = mufu_tanh_envelope("sm90")
    x = np.concatenate([np.linspace(-40, 40, 20001), [7.999999, 8.0, -8.0, 1.0, -1.0]]).astype(np.float32)
    for mode in ("correctly-rounded", "perturbed"):
        th = Mufu(mode, 3, arch="sm90").tanh(x).astype(np.float64)
        ex = np.tanh(x.astype(np.float64))
        big = np.abs(x) >= 1
        assert np.all(np.abs(th) <= 1)
        assert np.all(np.abs(th - ex)[big] <= env["abs1"] + 2.0 ** -24)
        assert np.all(np.abs(th)[np.abs(x) >= env["sat"]] == 1.0)
