"""``load_params()`` reads FA4's knobs from the installed source; the pinned copy matches it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from fa4verify.kernels import fa4_params as fp


def _installed():
    """FA4 is installed (the ``fa4`` marker, tests/conftest.py): fa4_params must find its source."""
    assert fp.fa4_source_dir() is not None, "flash-attn-4 is installed but fa4_params finds no source"
    return fp.load_params()


@pytest.mark.fa4
def test_installed_params_equal_pinned_copy():
    p = _installed()
    assert p.installed and p.source == f"installed flash-attn-4 {p.fa4_version}"
    pinned = fp._read_pinned()
    assert fp.params_to_json(p) | {"fa4_version": None, "dsl_version": None} == \
        fp.params_to_json(pinned) | {"fa4_version": None, "dsl_version": None}, (
        "installed FA4 knobs differ from kernels/data/pinned_fa4_params.json; regenerate it with "
        "`python -m fa4verify.kernels.fa4_params --write-pinned kernels/data/pinned_fa4_params.json`")
    assert json.loads(fp.PINNED_PATH.read_text())["fa4_version"] == p.fa4_version


@pytest.mark.fa4
def test_parsed_params_equal_imported_module_attributes():
    """The AST/regex reading gives what Python gets when it imports FA4 (~5 s import)."""
    import flash_attn.cute.flash_fwd_sm100 as fwd
    import flash_attn.cute.utils as utils

    p = _installed()
    for d, coeffs in utils.POLY_EX2.items():
        t = coeffs if isinstance(coeffs, tuple) else (coeffs,)
        assert p.poly_ex2[d] == tuple(float(c) for c in t)
    assert set(p.poly_ex2) == set(utils.POLY_EX2)
    assert p.tuning_config == fwd._TUNING_CONFIG
    assert p.fp8_tuning_config == fwd._FP8_TUNING_CONFIG


def test_poly_coefficients_are_binary32_and_c0_is_one():
    import numpy as np
    p = fp.load_params()
    assert set(p.poly_ex2) == {0, 1, 2, 3, 4, 5}
    for d, cs in p.poly_ex2.items():
        assert len(cs) == d + 1 and cs[0] == 1.0
        assert all(float(np.float32(c)) == c for c in cs)
    # the hex values of flash_attn/cute/utils.py:30 POLY_EX2 (read from the sollya output, independently)
    hexes = [hex(int(np.float32(c).view(np.uint32))) for c in p.poly_ex2[3]]
    assert hexes == ["0x3f800000", "0x3f31f519", "0x3e6906a4", "0x3d9df09d"]


def test_hard_coded_knobs_and_max_exp2_argument():
    p = fp.load_params()
    assert p.rescale_threshold_16bit == 8.0 and p.rescale_threshold_other == 0.0
    assert p.max_offset_fp8 == 8.0 and p.max_offset_other == 0.0
    assert p.max_exp2_argument == 8.0


@pytest.mark.fa4
def test_versions_are_read_from_metadata():
    p = _installed()
    import importlib.metadata as md
    assert p.fa4_version == md.version("flash-attn-4")
    assert p.dsl_version == md.version("nvidia-cutlass-dsl")


def test_pinned_copy_is_used_and_labelled_when_fa4_absent(monkeypatch):
    monkeypatch.setenv("FA4VERIFY_FORCE_PINNED", "1")
    fp.load_params.cache_clear()
    try:
        p = fp.load_params()
        assert p.source.startswith("pinned copy (flash-attn-4 not installed")
        assert p.fa4_version is None and not p.installed
        assert p.poly_ex2[3][1] == float.fromhex("0x1.63ea32p-1")
    finally:
        monkeypatch.delenv("FA4VERIFY_FORCE_PINNED")
        fp.load_params.cache_clear()


def test_missing_hard_coded_pattern_fails_loudly():
    src = "rescale_threshold = self.compute_threshold()\n"
    with pytest.raises(fp.FA4SourceChanged, match="rescale_threshold"):
        fp._one_value(fp._RESCALE_RE, src, "rescale_threshold", Path("x.py"))
    with pytest.raises(fp.FA4SourceChanged, match="different values"):
        fp._one_value(fp._MAX_OFFSET_RE,
                      "max_offset = 8 if cutlass.const_expr(self.q_dtype.width == 8) else 0\n"
                      "max_offset = 7 if cutlass.const_expr(self.q_dtype.width == 8) else 0\n",
                      "max_offset", Path("x.py"))
    with pytest.raises(fp.FA4SourceChanged, match="_TUNING_CONFIG"):
        fp._literal_assignment("X = 1\n", "_TUNING_CONFIG", Path("x.py"))
    with pytest.raises(fp.FA4SourceChanged, match="plain literal"):
        fp._literal_assignment("_TUNING_CONFIG = make()\n", "_TUNING_CONFIG", Path("x.py"))


@pytest.mark.fa4
def test_pinned_generator_reproduces_committed_file(tmp_path):
    _installed()
    out = tmp_path / "pinned.json"
    assert fp._main(["--write-pinned", str(out)]) == 0
    assert out.read_text() == fp.PINNED_PATH.read_text()
