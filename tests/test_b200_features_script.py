"""scripts/b200_features.py (the SM100-only features for a B200 owner) runs every section end to
end on the CPU stand-in, and its comparison can fail."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("b200_features", ROOT / "scripts" / "b200_features.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_section_runs_on_the_cpu_stand_in(tmp_path):
    out = tmp_path / "b200.json"
    rc = _script().main(["--section", "all", "--json", str(out), "--device", "cpu"])
    d = json.loads(out.read_text())
    assert rc == 0, d["crashes"]
    assert d["where"].startswith("CPU stand-in")
    assert set(d["results"]) == {"mla_fwd", "gather_fwd", "gather_bwd", "fp8_fwd"}
    for name, r in d["results"].items():
        assert r["fa_rule_ok"] is True and r["nonfinite"] == 0, name
        assert r["max_rel_err"] < 2 ** -7, name     # float32 stand-in rounded to bf16 (u = 2^-8)
        for row in r["rows"]:
            for v in row.values():
                if isinstance(v, dict) and "oracle_bound_max" in v:
                    assert v["oracle_bound_max"] < 1e-9


def test_comparison_catches_a_wrong_mla_scale(tmp_path):
    """A kernel that uses 1/sqrt(64) instead of 1/sqrt(64 + 512) fails FA's rule."""
    mod = _script()
    K = mod.CpuStandIn()

    def wrong(q, k, v, qv, gather_kv_indices=None, causal=False, **kw):
        o, lse = mod.torch_mla(q.float() * 3, k.float(), v.float(), qv.float() * 3, gather_kv_indices, causal)
        return mod._Fwd(o.to(q.dtype), lse), {}
    K.mla_forward = wrong
    r = mod.section_mla_fwd(K, small=True)
    assert r["fa_rule_ok"] is False and r["max_rel_err"] > 0.01


@pytest.mark.parametrize("section", ["mla_fwd"])
def test_bad_section_is_a_usage_error(section, capsys):
    with pytest.raises(SystemExit) as e:
        _script().main(["--section", "nope", "--json", "x.json", "--device", "cpu"])
    assert e.value.code == 2
