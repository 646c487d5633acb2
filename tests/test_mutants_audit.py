"""The ``mutants.detection`` audit check (fa4verify/checks/mutants.py)."""
from __future__ import annotations

import pytest

from fa4verify import mutants as M
from fa4verify.audit.registry import CheckContext, SkipCheck, discover


def _spec():
    specs = {s.id: s for s in discover()}
    assert "mutants.detection" in specs, sorted(specs)
    return specs["mutants.detection"]


def test_detection_check_is_registered_for_full_profiles_only():
    s = _spec()
    assert s.profiles == frozenset({"full", "exhaustive"})
    assert s.needs == frozenset({"cpu"})


def test_detection_check_skips_non_bf16():
    with pytest.raises(SkipCheck):
        _spec().func(CheckContext(dtype="fp16", profile="full"))


def test_detection_check_passes_when_caught_and_fails_on_a_miss(monkeypatch):
    """With a one-problem battery: rescale_skipped on peaked rows is caught (pass); with a
    problem that cannot expose tail_tile_dropped the check fails and names the miss."""
    tw = M.twin_module()
    assert not (tw is None or getattr(tw, "backward", None) is None), "fa4verify.kernels.twin.attention (forward and backward) failed to load (fa4verify's own module)"
    peaked = next(p for p in M.battery("quick") if p.name == "peaked_rescale")
    orig = M.run_suite

    def small(profile, **kw):
        kw.update(problems=(peaked,), mutants=["rescale_skipped"])
        return orig(profile, **kw)
    monkeypatch.setattr(M, "run_suite", small)
    r = _spec().func(CheckContext(dtype="bf16", profile="full", archs=("sm90",)))
    assert r.status == "pass", r.summary
    assert r.where == "CPU twin"
    assert r.metrics["caught_higher_is_better"] == 1 and r.metrics["false_alarms"] == 0

    def small_miss(profile, **kw):
        kw.update(problems=(M.Problem("no_tail", 16, 128, bwd=False),),
                  mutants=["tail_tile_dropped"])
        return orig(profile, **kw)
    monkeypatch.setattr(M, "run_suite", small_miss)
    r = _spec().func(CheckContext(dtype="bf16", profile="full", archs=("sm90",)))
    assert r.status == "fail" and "tail_tile_dropped" in r.summary
