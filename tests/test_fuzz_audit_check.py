"""The fuzz audit checks: registered with the right needs, and fuzz.twin runs and reports."""
from __future__ import annotations

import importlib
import pytest

registry = importlib.import_module("fa4verify.audit.registry")
importlib.import_module("fa4verify.kernels.twin.attention")


def test_fuzz_checks_are_registered_with_their_needs():
    import fa4verify.checks.fuzz  # noqa: F401  (import registers them)
    reg = registry.registered()
    assert reg["fuzz.twin"].needs == {"cpu"} and reg["fuzz.twin"].archs == {"sm90", "sm100"}
    assert reg["fuzz.mutants"].needs == {"cpu"} and "default" not in reg["fuzz.mutants"].profiles
    assert {"cuda", "fa4"} <= reg["fuzz.production"].needs


def test_fuzz_twin_check_passes_and_reports_coverage():
    from fa4verify import fuzz
    import fa4verify.oracles.attention  # noqa: F401
    fuzz._budget(fuzz.AttentionProblem("sm90", "bf16", 1, 1, 1, 1, 1, 8, 8))
    from fa4verify.checks import fuzz as checks
    ctx = registry.CheckContext(dtype="fp16", arch="sm90", profile="default", seed=1, check_id="fuzz.twin[sm90]")
    from fa4verify.run.engine import run_here
    r = run_here(checks.twin.__fa4verify_check__, ctx)
    assert r.status == "pass", r.summary
    assert r.where == "CPU twin" and r.metrics["examples_higher_is_better"] >= 10
    assert 0 < r.tightness <= 1 and r.details["coverage"]["dtype"] == {"fp16": r.metrics["examples_higher_is_better"]}


def test_fuzz_twin_check_skips_fp8():
    from fa4verify.checks import fuzz as checks
    ctx = registry.CheckContext(dtype="fp8", arch="sm100", profile="default")
    with pytest.raises(registry.SkipCheck):
        checks.twin.__fa4verify_check__.cases(ctx)


def test_the_gpu_campaigns_head_dim_palette_rotates_through_every_supported_dim():
    from fa4verify._strategies.shapes import supported_head_dims
    from fa4verify.checks.fuzz import head_dim_palette
    dims = {d for d, dv in supported_head_dims("sm90", max_head_dim=256) if d == dv}
    seen: set[int] = set()
    for seed in range(len(dims)):
        pal = head_dim_palette("sm90", seed)
        assert pal[:2] == (64, 128) and len(pal) == 3 and set(pal) <= dims
        seen.update(pal)
    assert seen == dims
