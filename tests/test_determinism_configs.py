"""Configuration matrix: validation, coverage, selection, and reproducible inputs."""
from __future__ import annotations

import dataclasses
import json

import pytest

from fa4verify import determinism as d


def test_every_configuration_in_every_matrix_is_valid_and_keys_are_unique():
    for name, m in d.MATRICES.items():
        assert m, name
        for c in m:
            assert d.validate_config(c) == [], (name, c.name)
        assert len({c.key() for c in m}) == len(m)
        assert len({c.name for c in m}) == len(m)
    for c in d.TIMING_CONFIGS:
        assert d.validate_config(c) == []


def test_h200_matrix_covers_the_issue_s_feature_list():
    m = d.MATRICES["h200"]
    assert {c.attention for c in m} == {"mha", "gqa", "mqa"}
    assert {c.mask for c in m} == {"full", "causal", "local"}
    assert any(c.softcap for c in m) and any(c.sink for c in m) and any(c.varlen for c in m)
    assert {64, 128, 192, 256} <= {c.head_dim for c in m}
    assert {"bf16", "fp16"} == {c.dtype for c in m}
    # shapes off the SM90 tiles (not multiples of 64/80/96/128/48) are present
    assert any(c.seqlen_q % 64 and c.seqlen_k % 64 for c in m if not c.varlen)
    # hd 192 / 256 carry the upstream xfail reasons on sm90 only
    for c in m:
        if c.head_dim in (192, 256):
            assert c.xfail_reason("sm90") and c.xfail_reason("sm100") is None


@pytest.mark.parametrize("change,field", [
    (dict(nheads=6, nheads_kv=4), "nheads=6"),
    (dict(head_dim=100), "head_dim=100"),
    (dict(head_dim=264), "head_dim=264"),
    (dict(causal=True, window=(4, 0)), "causal=True"),
    (dict(window=(-1, 3)), "window="),
    (dict(softcap=float("inf")), "softcap="),
    (dict(seqlen_q=0), "seqlen_q=0"),
    (dict(varlen=True), "varlen"),
    (dict(varlen=True, seqlens_q=(1, 2), seqlens_k=(3,)), "varlen"),
    (dict(seqlens_q=(3,)), "only for varlen"),
    (dict(dtype="fp8"), "dtype"),
    (dict(name="a|b"), "name"),
    (dict(upstream_xfail=(("gpu9", ""),)), "upstream_xfail"),
])
def test_invalid_configurations_are_rejected_with_the_field_named(change, field):
    c = dataclasses.replace(d.DeterminismConfig("x"), **change)
    errs = d.validate_config(c)
    assert errs and any(field in e for e in errs), errs


def test_select_by_matrix_name_glob_and_file(tmp_path):
    assert d.select_configs("h200") == d.MATRICES["h200"]
    g = d.select_configs("gqa-*")
    assert g and all(c.name.startswith("gqa-") for c in g)
    both = d.select_configs(["mha-hd64-full-edge,mha-hd64-full-edge", "cpu"])
    assert both[0].name == "mha-hd64-full-edge" and len(both) == 1 + len(d.MATRICES["cpu"])
    p = tmp_path / "c.json"
    p.write_text(json.dumps([d.MATRICES["cpu"][0].to_json()]))
    assert d.select_configs("@" + str(p)) == (d.MATRICES["cpu"][0],)
    for bad in ("nope", "zzz-*"):
        with pytest.raises(ValueError):
            d.select_configs(bad)
    p.write_text(json.dumps([dict(d.MATRICES["cpu"][0].to_json(), head_dim=7)]))
    with pytest.raises(ValueError, match="head_dim=7"):
        d.select_configs("@" + str(p))
    p.write_text(json.dumps([{"name": "x", "bogus": 1}]))
    with pytest.raises(ValueError, match="bogus"):
        d.select_configs("@" + str(p))


def test_config_json_round_trip():
    for c in d.MATRICES["h200"] + d.MATRICES["cpu"]:
        assert d.DeterminismConfig.from_json(json.loads(json.dumps(c.to_json()))) == c


def test_inputs_are_reproducible_from_the_seed_and_change_with_it():
    pytest.importorskip("torch")
    c = d.MATRICES["cpu"][4]  # varlen
    assert d.make_inputs(c).digest() == d.make_inputs(c).digest()
    assert d.make_inputs(c).digest() != d.make_inputs(dataclasses.replace(c, seed=99)).digest()
    p = d.make_inputs(d.MATRICES["cpu"][3])  # sink
    assert p.sink is not None and tuple(p.sink.shape) == (2,)
    pv = d.make_inputs(c)
    assert pv.cu_seqlens_q.tolist() == [0, 5, 5, 22] and pv.max_seqlen_k == 17
    assert tuple(pv.q.shape) == (22, 2, 64)
