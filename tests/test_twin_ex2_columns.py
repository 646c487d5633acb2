"""``emulated_columns`` reproduces FA4's column-selection rule.

Expected column sets follow FA4's tuning table (flash_attn/cute/flash_fwd_sm100.py:550-557, ex2_emu_freq) (computed by hand
from the rule, independently of this code). One row differs on purpose: see
``test_hd256_uses_main_kernel_rule_in_installed_fa4``.
"""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify.kernels.twin import columns_from_settings, emulated_columns, emulation_settings, uses_2cta


def cols(*ranges: tuple[int, int]) -> list[int]:
    return [c for lo, hi in ranges for c in range(lo, hi + 1)]


R16 = cols((44, 47), (60, 63), (76, 79), (92, 95))
R10 = cols((38, 41), (48, 51), (58, 61), (70, 73), (80, 83), (90, 93))
R32 = cols((60, 63), (92, 95))
R16_S0 = cols((12, 15), (28, 31), (44, 47), (60, 63), (76, 79), (92, 95))
R8 = cols((36, 39), (44, 47), (52, 55), (60, 63), (68, 71), (76, 79), (84, 87), (92, 95))


def _got(**kw) -> list[int]:
    return np.flatnonzero(emulated_columns(**kw)).tolist()


@pytest.mark.parametrize("kw,expected,share", [
    (dict(head_dim=64), R16, 0.125),
    (dict(head_dim=64, causal=True), R16, 0.125),
    (dict(head_dim=64, pack_gqa=True), R16, 0.125),
    (dict(head_dim=32, local=True), R16, 0.125),
    (dict(head_dim=96, causal=True), R16, 0.125),
    (dict(head_dim=112, local=True, pack_gqa=True), R16, 0.125),
    (dict(head_dim=80), R16, 0.125),
    (dict(head_dim=96, pack_gqa=True), R10, 0.1875),
    (dict(head_dim=128, pack_gqa=True, use_2cta=False), R10, 0.1875),
    (dict(head_dim=96, pack_gqa=True, varlen_q=True), R32, 0.0625),
    (dict(head_dim=128, pack_gqa=True, varlen_q=True), R32, 0.0625),
    (dict(head_dim=128, use_2cta=True), R10, 0.1875),
    (dict(head_dim=128), R10, 0.1875),                       # derived: dense hd128 non-causal is 2-CTA
    (dict(head_dim=128, use_2cta=False), R16, 0.125),
    (dict(head_dim=128, causal=True), R16, 0.125),
    (dict(head_dim=192, head_dim_v=128, use_2cta=True), R16_S0, 0.1875),
    (dict(head_dim=192, head_dim_v=128, use_2cta=False), [], 0.0),
    (dict(head_dim=192, head_dim_v=128, local=True), [], 0.0),
    (dict(head_dim=192, head_dim_v=128, causal=True), R32, 0.0625),
    (dict(head_dim=128, is_sm103=True), [], 0.0),
    (dict(head_dim=64, is_sm103=True), [], 0.0),
    (dict(head_dim=192, head_dim_v=128, causal=True, is_sm103=True), [], 0.0),
    (dict(head_dim=128, fp8=True, use_2cta=True), R10, 0.1875),
    (dict(head_dim=128, fp8=True, causal=True), R8, 0.25),
    (dict(head_dim=64, fp8=True, causal=True), R16, 0.125),   # fp8 table only for hd_pad >= 96
])
def test_emulated_columns_match_fa4_tuning_table(kw, expected, share):
    got = _got(**kw)
    assert got == expected, f"{kw}: got {got}, expected {expected}"
    assert emulated_columns(**kw).mean() == share


def test_split_kv_tile_of_64_has_no_emulation():
    # n_block = 64 (split-KV with hd != hdv): frg_cnt = 2, start_frg = 1, last fragment hardware
    m = emulated_columns(head_dim=192, head_dim_v=128, causal=True, n_block_size=64)
    assert m.shape == (64,) and not m.any()


def test_hd256_uses_main_kernel_rule_in_installed_fa4():
    """The hd256 rows of FA4's tuning table (flash_attn/cute/flash_fwd_sm100.py) once described a
    dedicated hd256 forward (freq/res/start 14/6/0, 28.125%; 4.0.0b20..b33). flash-attn-4 4.0.0b36 has no ``sm100_hd256_2cta_fmha_forward.py``: hd256
    runs ``FlashAttentionForwardSm100`` with table rows (True, *, 256, False) = freq 14, start 0 and
    the default res 4 (``apply_exp2_convert`` callers never pass res). By hand: k % 14 in {10, 12}
    -> k in {10, 12, 24, 26} -> columns 10-13, 24-27 of fragments 0..2 -> 24 of 128 = 18.75%."""
    from fa4verify.kernels.fa4_params import fa4_source_dir
    d = fa4_source_dir()
    if d is not None and (d / "sm100_hd256_2cta_fmha_forward.py").exists():
        pytest.skip("this FA4 has the dedicated hd256 forward kernel; the 4.0.0b36 expectation does not apply")
    exp = cols((10, 13), (24, 27), (42, 45), (56, 59), (74, 77), (88, 91))
    for causal in (False, True):
        assert _got(head_dim=256, causal=causal) == exp
        assert emulation_settings(head_dim=256, causal=causal) == (14, 4, 0)
    assert _got(head_dim=256, use_2cta=False) == []        # key absent, default rule: hd_pad > 128


def test_rule_predicate_by_brute_force():
    """columns_from_settings against a direct transcription of the softmax.py predicate."""
    for freq in (0, 4, 6, 8, 10, 14, 16, 32):
        for res in (2, 4, 6):
            for start in (0, 1, 2):
                for n in (64, 128, 192):
                    m = columns_from_settings((freq, res, start), n)
                    for c in range(n):
                        j, k = divmod(c, 32)
                        k -= k % 2
                        emu = freq != 0 and not (k % freq < freq - res or j >= n // 32 - 1 or j < start)
                        assert m[c] == emu


def test_uses_2cta_follows_interface_rule():
    assert uses_2cta(head_dim=128)
    assert uses_2cta(head_dim=192, head_dim_v=128)
    assert not uses_2cta(head_dim=128, causal=True)
    assert not uses_2cta(head_dim=64)
    assert not uses_2cta(head_dim=128, varlen_q=True)
    assert uses_2cta(head_dim=256, causal=True)
    assert uses_2cta(head_dim=256, varlen_q=True)
    assert not uses_2cta(head_dim=128, split_kv=True)
    assert not uses_2cta(head_dim=128, disable_2cta=True)
    assert not uses_2cta(head_dim=128, arch=90)
    assert not uses_2cta(head_dim=128, single_m_block=True)
    assert uses_2cta(head_dim=256, single_m_block=True, hd256_decode_2cta=True)
    assert not uses_2cta(head_dim=128, pack_gqa=True, qhead_per_kvhead=3)
    assert not uses_2cta(head_dim=128, page_size=64)
