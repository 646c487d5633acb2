"""census.aux_scalars (Note [Runtime scalars]): FA4 keys its kernels on the aux scalars' types
only, so a score_mod's scalar value must reach the kernel as a launch parameter; compile-only.
The installed FA4 passes with a cutlass.Float32; a planted score_mod that folds the value into
the code fails; the Python float FA4's docstring shows does not compile (recorded as a finding)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fa4verify.compile.census_aux import AUX_VALUE, judge, ptx_immediate


def test_the_immediate_is_the_fp32_bit_pattern():
    assert ptx_immediate(AUX_VALUE) == "0f3DFCD6EA" and ptx_immediate(1.0) == "0f3F800000"


def _row(compiled=True, immediate=False, error=None):
    return {"compiled": compiled, "immediate": immediate, "error": error, "f32_params": 3, "kernels": int(compiled)}


def test_judge_fails_a_folded_value_and_is_undecided_without_a_compiled_float32():
    assert judge({"sm_90a float32": _row(), "sm_90a python": _row(False, error="E")})[0] == "pass"
    status, summary = judge({"sm_90a float32": _row(immediate=True), "sm_100a float32": _row()})
    assert status == "fail" and "sm_90a float32" in summary and "sm_100a" not in summary
    assert judge({"sm_90a float32": _row(False, error="boom"), "sm_90a python": _row()})[0] == "undecided"
    assert "does not compile" in judge({"sm_90a float32": _row(), "sm_90a python": _row(False, error="E")})[1]


def _audit(tmp_path, env) -> dict:
    rep = tmp_path / "aux.json"
    cp = subprocess.run([sys.executable, "-m", "fa4verify", "audit", "--dtype", "bf16", "--profile", "full",
                         "-k", "census.aux_scalars", "--json", str(rep), "--kernel-cache", "off"],
                        env=env, capture_output=True, text=True, timeout=900)
    assert rep.exists(), cp.stdout[-2000:] + cp.stderr[-2000:]
    return json.loads(rep.read_text())["results"][0]


@pytest.mark.fa4
@pytest.mark.slow
@pytest.mark.parametrize("plant", [None, "baked"])
def test_the_installed_fa4_passes_and_a_folded_scalar_fails(tmp_path, plant):
    env = {k: v for k, v in os.environ.items() if k != "FA4VERIFY_AUX_PLANT"}
    if plant:
        env["FA4VERIFY_AUX_PLANT"] = plant
    r = _audit(tmp_path, env)
    assert r["where"] == "compile-only"
    if plant is None:
        assert r["status"] == "pass", r["summary"]
        assert r["metrics"]["folded"] == 0
    else:
        assert r["status"] == "fail" and ptx_immediate(AUX_VALUE) in r["summary"], r["summary"]
        assert r["metrics"]["folded"] == 2


def test_no_ptx_read_is_undecided_not_a_pass():
    rows = {"sm_90a float32": dict(_row(), kernels=0)}
    assert judge(rows)[0] == "undecided"
