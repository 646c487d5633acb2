"""The CPU twin's fixed dQ accumulation order is bitwise reproducible (within a process and across
fresh processes), and the mutation ``dq_shuffled_order`` (an unseeded dQ order even with
deterministic=True) is detected by the determinism comparison. Labelled "CPU twin"."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

from fa4verify import determinism as d


@pytest.fixture(scope="module")
def twin_bwd():
    from fa4verify.kernels.twin import attention as ta
    assert "dq_shuffled_order" in getattr(ta, "MUTATIONS", ()), "twin has no dq_shuffled_order mutation"
    from fa4verify.kernels.twin import backward as twin_bwd  # noqa: F401
    return ta


KV_TILES = d.select_configs("mha-hd64-kv-tiles,mqa-hd128-causal-kv-tiles")


def test_kv_tile_configs_have_at_least_three_dq_partials():
    # order faults are only observable with >= 3 partial sums per dQ element (commutativity)
    for c in KV_TILES:
        assert -(-c.seqlen_k // 128) >= 3


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_twin_deterministic_backward_is_bitwise_reproducible_in_process(twin_bwd, arch):
    cfg = KV_TILES[1]
    rec = d.run_config(d.TwinBackend(arch=arch), cfg, "cpu", runs=3, default_runs=2)
    assert rec["status"] == "ok", rec.get("reason")
    c = d.aggregate([dict(results=[rec], arch=arch, where="CPU twin")], [cfg])["configs"][0]
    assert c["status"] == "reproducible", c
    assert set(c["digests"]) == {"dq", "dk", "dv", "dq_accum"}


@pytest.mark.slow  # fresh Python processes, each importing torch
def test_twin_is_reproducible_across_fresh_processes(twin_bwd, tmp_path):
    cfg = KV_TILES[0]
    spec = d.worker_spec("twin", [cfg], ["cpu"], runs=2, default_runs=0)
    recs = d.spawn_workers(spec, 2, str(tmp_path))
    assert all(r["returncode"] == 0 for r in recs), [r.get("fatal") for r in recs]
    c = d.aggregate(recs, [cfg])["configs"][0]
    assert c["status"] == "reproducible" and c["total_runs"] == 4, c


def test_mutation_dq_shuffled_order_is_detected(twin_bwd):
    # 5 KV tiles: two unseeded permutations agree with probability 1/120, all 4 runs with ~6e-7
    cfg = KV_TILES[0]
    rec = d.run_config(d.load_backend("twin:sm90+dq_shuffled_order"), cfg, "cpu", runs=4)
    assert rec["status"] == "ok", rec.get("reason")
    rep = d.aggregate([dict(results=[rec], arch="sm90")], [cfg])
    c = rep["configs"][0]
    assert c["status"] == "not-reproducible"
    assert "dq_accum" in c["distinct_digests"]
    assert "dk" in c["digests"] and "dv" in c["digests"]  # the fault is confined to dQ
    assert d.exit_status(rep) == 1


def test_mutated_digests_differ_from_the_unmutated_manifest(twin_bwd):
    """Run-to-run detection aside, the manifest comparison flags the mutated twin against the
    unmutated one's recorded digests (same environment key except the mutation field, compared
    strictly)."""
    cfg = KV_TILES[1]  # causal: deterministic order is descending, the shuffle rarely matches
    good = d.TwinBackend(arch="sm90")
    bad = d.load_backend("twin:sm90+dq_shuffled_order")

    def manifest(be):
        rec = d.run_config(be, cfg, "cpu", runs=1)
        rep = d.aggregate([dict(results=[rec], arch="sm90")], [cfg])
        return d.build_manifest(rep, be.environment("cpu"))
    ref = manifest(good)
    # 4 tiles in descending order; the mutation's unseeded permutation equals it with probability
    # 1/24, so the mutated twin runs until its order differs (8 tries: all equal with p = 24^-8)
    for _ in range(8):
        cmp_ = d.compare_manifests(manifest(bad), ref, strict_env=True)
        e = cmp_["entries"][0]
        if e["outcome"] != "match":
            break
    assert cmp_["environment_diff"] == {"mutations": ["dq_shuffled_order", "none"]}
    assert e["outcome"] == "mismatch" and "dq_accum" in e["tensors"]
    assert "dk" not in e["tensors"] and "dv" not in e["tensors"]
