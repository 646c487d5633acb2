"""On a CUDA machine: FA4's deterministic backward is bitwise reproducible in-process, guard
bands stay intact, and the default mode's divergence is measured (small: 20 runs, 2 configs).
The full matrix (100 runs x 3 processes) is ``scripts/gpu_determinism.sh``."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fa4verify import determinism as d

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def fa4():
    # CUDA and FA4 are there (the ``gpu`` marker, tests/conftest.py); the backend may still refuse
    # a GPU it cannot run on (its reason)
    try:
        return d.load_backend("fa4")
    except EnvironmentError as ex:
        pytest.skip(str(ex))


@pytest.mark.parametrize("name", ["mha-hd128-causal", "gqa-hd128-full-tile"])
def test_fa4_deterministic_backward_is_bitwise_reproducible(fa4, name):
    cfg = d.select_configs(name)[0]
    rec = d.run_config(fa4, cfg, "cuda:0", runs=20, default_runs=5)
    assert rec["status"] == "ok", rec.get("reason")
    rep = d.aggregate([dict(results=[rec], arch=fa4.arch, where=fa4.where)], [cfg])
    c = rep["configs"][0]
    assert c["status"] == "reproducible", c
    assert rec["det"]["buffers_not_used"] == [], "adapter did not write into the given buffers"
    assert set(c["default_mode"]["tensors"]) == {"dq", "dk", "dv"}


def test_fa4_digests_match_the_recorded_h200_manifest(fa4):
    """Same environment key as the recorded run (kernels/evidence/determinism/h200_manifest.json) ->
    the digests must be the recorded ones; another GPU/driver/version -> skipped as a different
    environment (bitwise equality is not promised across environments)."""
    from fa4verify.kernels.evidence import evidence_path
    ref = d.load_manifest(str(evidence_path("determinism/h200_manifest.json")))
    cfgs = d.select_configs("mha-hd128-causal,gqa-hd64-varlen-causal")
    recs = [d.run_config(fa4, c, "cuda:0", runs=3) for c in cfgs]
    rep = d.aggregate([dict(results=recs, arch=fa4.arch)], cfgs)
    cur = d.build_manifest(rep, fa4.environment("cuda:0"))
    cmp_ = d.compare_manifests(cur, ref)
    if not cmp_["same_environment"]:
        pytest.skip(f"different environment from the recorded one: {cmp_['environment_diff']}")
    compared = [e for e in cmp_["entries"] if e["outcome"] in ("match", "mismatch")]
    assert len(compared) == 2 and not cmp_["failed"], cmp_
