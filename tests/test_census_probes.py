"""The probe kernels compile for sm_90a and sm_100a without a GPU, and the instructions they
emit are the ones FA4's stage uses (compile-only)."""
from __future__ import annotations

import re

import pytest

# fa4: skipped with the reason without flash-attn-4 / the DSL (tests/conftest.py); slow: the
# module fixtures compile the probe kernels (~30 s on 2 cores)
pytestmark = [pytest.mark.fa4, pytest.mark.slow]


def _ops(sass: str) -> list[str]:
    return [ln.split(";")[0].split("*/")[-1].strip() for ln in sass.splitlines()
            if re.search(r"\b(MUFU|FFMA2?|FADD2?|F2FP|FMNMX)\b", ln)]


@pytest.fixture(scope="module")
def sm90(tmp_path_factory):
    from fa4verify.kernels.probes import probe_base as pb
    items = [("ex2_emulation", "3"), ("ex2_emulation", "5"), ("mufu_ex2", "fastmath"), ("mufu_tanh", "fastmath"),
             ("rcp", "approx"), ("log2", "fastmath"), ("exparg", "sm90"), ("cvt", "cvt_bf16x2"),
             ("cvt", "to_f16")]
    arts = pb.compile_many_in_subprocess(items, "sm_90a", tmp_path_factory.mktemp("p90"))
    return {(a.probe, a.variant): a for a in arts}


@pytest.fixture(scope="module")
def sm100(tmp_path_factory):
    from fa4verify.kernels.probes import probe_base as pb
    items = [("ex2_emulation_2", "3"), ("fma_packed", "rn"), ("ex2_emulation", "3"), ("mufu_tanh", "fastmath")]
    arts = pb.compile_many_in_subprocess(items, "sm_100a", tmp_path_factory.mktemp("p100"))
    return {(a.probe, a.variant): a for a in arts}


def test_probe_ex2_emulation_deg3_is_floor_then_three_ffma(sm90):
    a = sm90[("ex2_emulation", "3")]
    assert ".target sm_90a" in a.ptx
    assert re.search(r"add\.rm\.ftz\.f32", a.ptx)
    assert all(c in a.ptx for c in ("0f3D9DF09D", "0f3E6906A4", "0f3F31F519"))
    ops = _ops(a.sass)
    assert sum(o.startswith("FFMA ") for o in ops) == 3
    assert any(o.startswith("FADD.FTZ.RM") for o in ops)
    assert not any(o.startswith("MUFU") for o in ops)


def test_probe_ex2_emulation_deg5_has_five_ffma(sm90):
    ops = _ops(sm90[("ex2_emulation", "5")].sass)
    assert sum(o.startswith("FFMA ") for o in ops) == 5


@pytest.mark.parametrize("probe,ptx_op,sass_op", [
    (("mufu_ex2", "fastmath"), "ex2.approx.ftz.f32", "MUFU.EX2"),
    (("rcp", "approx"), "rcp.approx.ftz.f32", "MUFU.RCP"),
    (("log2", "fastmath"), "lg2.approx.ftz.f32", "MUFU.LG2"),
])
def test_probe_mufu_ops_lower_to_one_mufu(sm90, probe, ptx_op, sass_op):
    a = sm90[probe]
    assert ptx_op in a.ptx
    ops = _ops(a.sass)
    assert [o.split()[0] for o in ops if o.startswith("MUFU")] == [sass_op]


def test_probe_exparg_is_one_ffma_with_negated_addend(sm90):
    a = sm90[("exparg", "sm90")]
    assert re.search(r"\bmul\.f32\b", a.ptx) and re.search(r"\bsub\.f32\b", a.ptx)
    ffma = [o for o in _ops(a.sass) if o.startswith("FFMA ")]
    assert ffma and all(re.search(r",\s*-R\w+$", o) for o in ffma), ffma


def test_probe_cvt_is_round_to_nearest(sm90):
    assert "cvt.rn.bf16x2.f32" in sm90[("cvt", "cvt_bf16x2")].ptx
    assert "cvt.rn.f16.f32" in sm90[("cvt", "to_f16")].ptx
    assert any(o.startswith("F2FP.BF16") for o in _ops(sm90[("cvt", "cvt_bf16x2")].sass))


def test_probe_packed_emulation_sm100_uses_ffma2_and_fadd2_rm(sm100):
    a = sm100[("ex2_emulation_2", "3")]
    assert ".target sm_100a" in a.ptx
    assert "add.rm.f32x2" in a.ptx and "fma.rn.f32x2" in a.ptx
    ops = _ops(a.sass)
    assert sum(o.startswith("FFMA2") for o in ops) == 3
    assert sum(o.startswith("FADD2.RM") for o in ops) == 1


def test_probe_fma_packed_sm100_is_ffma2(sm100):
    ops = _ops(sm100[("fma_packed", "rn")].sass)
    assert [o.split()[0] for o in ops] == ["FFMA2"]


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_probe_mufu_tanh_is_one_mufu_tanh(arch, sm90, sm100):
    """The softcap's tanh (Note [MUFU tanh envelope]) is PTX tanh.approx.f32, one MUFU.TANH."""
    a = (sm90 if arch == "sm90" else sm100)[("mufu_tanh", "fastmath")]
    assert re.search(r"tanh\.approx\.f32", a.ptx)
    assert [x.split()[0] for x in _ops(a.sass) if x.startswith("MUFU")] == ["MUFU.TANH"]
