"""The session-5 finding on FA4's public ``flash_attn_combine`` (SM90, FA4 4.0.0b36): 16-bit
(bf16/fp16) partials give wrong outputs, fp32 partials are right. The source-level predictor
(:func:`fa4verify.kernels.fa4_params.combine_partial_tiling`: the O-partial copy covers more
rows than the tile) must agree with every case measured on the H200
(``docs/results/h200_session5/combine/``), and the fp32-partial runs must stay right."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from fa4verify.kernels import fa4_params

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs/results/h200_session5/combine"
_BITS = {"float32": 32, "bfloat16": 16, "float16": 16}


def _measured():
    import importlib.util
    spec = importlib.util.spec_from_file_location("diag", ROOT / "scripts/gpu_combine_diag.py")
    diag = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(diag)
    rows = []
    for f in sorted(RESULTS.glob("combine_diag*.json")):
        d = json.loads(f.read_text())
        assert d["where"].startswith("measured on NVIDIA H200"), f
        for name, r in d["cases"].items():
            c = diag.CASES[name]
            if c["kind"] == "combine" and r.get("ok") and "frac_elems_wrong" in r:
                rows.append((name, c, r))
    return rows


@pytest.mark.fa4
def test_predictor_agrees_with_every_measured_combine_case():
    rows = _measured()
    assert {c["dt"] for _, c, _ in rows} >= {"float32", "bfloat16", "float16"}, "too few measured cases"
    for name, c, r in rows:
        pred = fa4_params.combine_partial_tiling(c["d"], _BITS[c["dt"]])
        assert pred["overrun"] is not None, pred
        wrong = r["frac_elems_wrong"] > 0
        assert pred["overrun"] == wrong, (name, pred, r["frac_elems_wrong"])


def test_fp32_partials_were_right_and_16_bit_partials_wrong_on_the_h200():
    rows = _measured()
    for name, c, r in rows:
        if c["dt"] == "float32":
            assert r["frac_elems_wrong"] == 0 and r["max_abs_err_out"] < 0.02, name
        else:
            assert r["frac_elems_wrong"] > 0.2, name


def test_predictor_is_undecided_when_the_source_changes(monkeypatch, tmp_path):
    (tmp_path / "interface.py").write_text("k_block_size = 128\n")
    (tmp_path / "flash_fwd_combine.py").write_text("num_threads: int = 256\n")
    monkeypatch.setattr(fa4_params, "fa4_source_dir", lambda: tmp_path)
    fa4_params._combine_source_rules.cache_clear()
    try:
        r = fa4_params.combine_partial_tiling(128, 16)
    finally:
        fa4_params._combine_source_rules.cache_clear()
    assert r["overrun"] is None and "changed" in r["reason"]
