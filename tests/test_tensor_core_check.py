"""The audit check ``tensor_core.mma`` (fa4verify/checks/tensor_core.py): it passes only when the
GPU's wgmma equals the judge's SM90 model on every output, fails on one differing bit, and says
so when its probe did not measure the instruction FA4 uses (CPU: a stand-in GPU).
"""
from __future__ import annotations

import importlib

import numpy as np

from fa4verify.checks.tensor_core import judge_measurement
from fa4verify.kernels.probes import mma_triton as probe

tc = importlib.import_module("fa4verify.kernels.twin.tensor_core")


def _gpu(flip: int = 0, steps_off: bool = False):
    """A stand-in for probe.run: the model itself, with ``flip`` outputs one ulp off."""
    def run(A, B, C, dt):
        O = tc.mma(A, np.swapaxes(B, 1, 2), C, tc.SM90[dt]).copy()
        if flip:
            O.flat[:flip] = np.nextafter(O.flat[:flip], np.float32(np.inf))
        return O, (A.shape[-1] // 16) + (1 if steps_off else 0)
    return run


def test_a_gpu_that_follows_the_model_passes():
    m = probe.measure(tiles=1, fn=_gpu())
    assert m["mismatches"] == 0 and m["outputs"] == 4 * 4096
    status, summary = judge_measurement(m)
    assert status == "pass" and "bit-equal" in summary


def test_one_differing_bit_fails_and_names_it():
    m = probe.measure(tiles=1, fn=_gpu(flip=1))
    status, summary = judge_measurement(m)
    assert status == "fail" and m["mismatches"] == 4
    assert "bf16_k16 (0, 0, 0)" in summary and "differ from the SM90 model" in summary


def test_a_probe_that_missed_the_instruction_decides_nothing():
    status, summary = judge_measurement(probe.measure(tiles=1, fn=_gpu(steps_off=True)))
    assert status == "undecided" and "one wgmma per k step" in summary


def test_a_model_one_parameter_off_would_be_caught():
    """The measurement's inputs expose the parameters: a GPU that rounds its sum to nearest instead
    of toward zero is told apart on these draws."""
    import dataclasses

    def rn_gpu(A, B, C, dt):
        m = dataclasses.replace(tc.SM90[dt], final="rn")
        return tc.mma(A, np.swapaxes(B, 1, 2), C, m), A.shape[-1] // 16
    status, _ = judge_measurement(probe.measure(tiles=1, fn=rn_gpu))
    assert status == "fail"
