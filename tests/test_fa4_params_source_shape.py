"""The twin's assumptions about FA4's code still hold (textual checks of the installed source).

Each check quotes a line (whitespace-normalised) the twin depends on; if FA4 changes it, the
failure says which assumption of ``fa4verify.kernels.twin`` to revisit.
"""
from __future__ import annotations

import re

import pytest

from fa4verify.kernels.fa4_params import fa4_source_dir


def _src(name: str) -> str:
    d = fa4_source_dir()
    if d is None:
        pytest.skip("flash-attn-4 is not installed")
    return re.sub(r"\s+", " ", (d / name).read_text())


def _expect(name: str, snippet: str, why: str) -> None:
    s = _src(name)
    norm = re.sub(r"\s+", " ", snippet)
    assert norm in s, (f"FA4 changed: flash_attn/cute/{name} no longer contains `{snippet}`. "
                       f"fa4verify.kernels.twin assumes it ({why}); re-read the source and update the twin.")


def test_column_rule_shape_in_apply_exp2_convert():
    _expect("softmax.py", "frg_tile = 32", "fragment size 32")
    _expect("softmax.py", "ex2_emu_res: cutlass.Constexpr[int] = 4", "res defaults to 4")
    _expect("softmax.py", "k % ex2_emu_freq < ex2_emu_freq - ex2_emu_res or j >= frg_cnt - 1 "
            "or j < ex2_emu_start_frg", "the hardware/emulation predicate")
    _expect("softmax.py", "utils.ex2_emulation_2(", "pairs use the packed emulation")


def test_kernel_passes_only_freq_and_start_frg():
    _expect("flash_fwd_sm100.py", "ex2_emu_freq=self.ex2_emu_freq, ex2_emu_start_frg=self.ex2_emu_start_frg, )",
            "res is never passed")


def test_emulation_settings_logic_in_fwd_kernel():
    f = "flash_fwd_sm100.py"
    _expect(f, "_default_enable_ex2_emu = (self.head_dim_padded <= 128 or (self.head_dim_padded == 192 "
            "and self.use_2cta_instrs and not self.is_causal and not self.is_local)) and not is_sm103",
            "default enable rule")
    _expect(f, "_tune_key = (self.use_2cta_instrs, self.is_causal, self.head_dim_padded, self.is_sm103)",
            "tuning key")
    _expect(f, 'if "ex2_emu_freq" in self._tune: self.enable_ex2_emu = self._tune["ex2_emu_freq"] > 0',
            "table override")
    _expect(f, 'self.ex2_emu_start_frg = self._tune.get("ex2_emu_start_frg", 1)', "start default 1")
    _expect(f, 'self.ex2_emu_freq = self._tune.get("ex2_emu_freq", 16)', "freq default 16")
    _expect(f, "self.pack_gqa and self.head_dim_padded > 64 and not self.is_causal and not self.is_local",
            "pack_gqa override condition")
    _expect(f, 'self.ex2_emu_freq = 32 if mCuSeqlensQ is not None or mSeqUsedQ is not None else '
            'self._tune.get("ex2_emu_freq", 10)', "pack_gqa override values")
    _expect(f, "self._tune = {**self._tune, **fp8_tune}", "fp8 override merges")
    _expect(f, "if const_expr(self.head_dim_padded < 96):", "fp8 small-hdim path skips the fp8 table")
    _expect(f, "is_sm103 = self.arch.is_family_of(Arch.sm_103f)", "SM103 family test")
    _expect(f, "self.head_dim_padded = int(math.ceil(head_dim / hdim_multiple_of) * hdim_multiple_of)",
            "hd padding")


def test_emulation_sequence_in_utils():
    f = "utils.py"
    _expect(f, "xy_clamped = (cute.arch.fmax(x, -127.0), cute.arch.fmax(y, -127.0))", "clamp, NaN-quiet")
    _expect(f, 'xy_rounded = cute.arch.add_packed_f32x2(xy_clamped, (fp32_round_int, fp32_round_int), rnd="rm")',
            "round-down add, DSL default ftz")
    _expect(f, "xy_rounded_back = cute.arch.sub_packed_f32x2(xy_rounded, (fp32_round_int, fp32_round_int))", "RN")
    _expect(f, "xy_frac = cute.arch.sub_packed_f32x2(xy_clamped, xy_rounded_back)", "RN")
    _expect(f, "out = cute.arch.fma_packed_f32x2(out, (x, y), (poly[i], poly[i]))", "fused Horner")
    _expect(f, "fp32_round_int = float(2**23 + 2**22)", "1.5*2^23")
    _expect(f, '"add.rm.ftz.f32 $0, $1, $2;"', "scalar variant flushes in the round-down add")
    _expect(f, '"shl.b32 x_rounded_e, x_rounded_i, 23;\\n\\t"', "combine: shift")
    _expect(f, '"add.s32 out_i, x_rounded_e, frac_ex_i;\\n\\t"', "combine: wrapping add")
    _expect(f, "out = out * x + poly[i]", "scalar Horner (contracted to FMA)")


def test_dsl_packed_ops_default_to_no_ftz():
    """DSL 4.8.1: calc_packed_f32x2_op has ``ftz=None`` (no attribute) and ``rnd='rn'``."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.find_spec("cutlass")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("nvidia-cutlass-dsl is not installed")
    p = Path(list(spec.submodule_search_locations)[0]) / "cute" / "arch" / "nvvm_wrappers.py"
    if not p.is_file():
        pytest.skip(f"{p} not found")
    s = re.sub(r"\s+", " ", p.read_text())
    m = re.search(r"def calc_packed_f32x2_op\((.*?)\) -> Tuple", s)
    assert m, "calc_packed_f32x2_op not found in the DSL"
    sig = m.group(1)
    assert 'rnd: Optional[Literal["rn", "rz", "rm", "rp", "none"]] = "rn"' in sig
    assert "ftz: Optional[bool] = None" in sig, f"DSL packed-op ftz default changed: {sig}"
    m2 = re.search(r"def fmax\((.*?)\) -> Float32", s)
    assert m2 and "nan: bool = False" in m2.group(1) and "ftz: bool = False" in m2.group(1)


def test_tuning_tables_in_config_py_agree_when_present():
    """4.0.0b36 also carries copies of the tables in config.py (``SM100_TUNING``,
    ``SM100_FP8_TUNING``, unused by the forward kernel, which reads its own); their ex2 fields agree."""
    from fa4verify.kernels.fa4_params import _literal_assignment, fa4_source_dir, load_params
    d = fa4_source_dir()
    if d is None or not (d / "config.py").is_file():
        pytest.skip("no flash_attn/cute/config.py")
    src = (d / "config.py").read_text()
    if "SM100_TUNING" not in src:
        pytest.skip("config.py has no SM100_TUNING table")
    p = load_params()

    def ex2(t):
        return {k: {f: v[f] for f in ("ex2_emu_freq", "ex2_emu_start_frg") if f in v} for k, v in t.items()}
    assert ex2(_literal_assignment(src, "SM100_TUNING", d / "config.py")) == ex2(p.tuning_config)
    assert ex2(_literal_assignment(src, "SM100_FP8_TUNING", d / "config.py")) == ex2(p.fp8_tuning_config)
