"""The determinism audit checks register with the right needs, and the harness self-check passes
(it would fail if any injected fault went unnoticed)."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

from fa4verify.audit import registry as R


@pytest.fixture(scope="module")
def specs():
    R.discover(modules=["fa4verify.checks.determinism"])
    return {k: v for k, v in R.registered().items() if k.startswith("determinism.")}


def test_checks_are_registered_with_their_needs(specs):
    assert set(specs) == {"determinism.harness", "determinism.twin", "determinism.fa4"}
    assert specs["determinism.fa4"].needs == frozenset({"cuda", "fa4"})
    assert specs["determinism.harness"].needs == frozenset({"cpu"})
    assert specs["determinism.twin"].archs == frozenset({"sm90", "sm100"})


def test_harness_check_passes_and_fa4_check_skips_without_gpu(specs):
    ctx = R.CheckContext(dtype="bf16", arch="sm90", device="cpu", profile="quick",
                         check_id="determinism.harness")
    r = specs["determinism.harness"].func(ctx)
    assert r.status == "pass", r.summary
    assert r.details["statuses"] == {"clean": "reproducible", "out-of-bounds": "guard-violation",
                                     "unwritten": "unwritten", "one-bit": "not-reproducible"}
    import torch
    if not torch.cuda.is_available():
        assert R.unmet_need(specs["determinism.fa4"], "cpu")


def test_fp8_is_skipped_for_the_backward(specs):
    ctx = R.CheckContext(dtype="fp8", arch="sm90", device="cpu", profile="quick",
                         check_id="determinism.twin[sm90]")
    with pytest.raises(R.SkipCheck, match="bf16/fp16"):
        specs["determinism.twin"].func(ctx)
