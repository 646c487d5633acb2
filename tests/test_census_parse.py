"""Unit tests of the census text parsing (no compiler involved)."""
from __future__ import annotations

import pytest

from fa4verify.compile import census as C


def _ptx_from_pattern(pattern: str) -> str:
    lines = []
    for ch in pattern:
        if ch == "H":
            lines.append("\tex2.approx.ftz.f32 \t%r1, %r2;")
        elif ch == "P":
            lines.append("\tadd.rm.f32x2 \t%rd1, %rd2, %rd3;")
        else:
            lines.append("\tmul.f32 \t%r1, %r2, %r3;")
    return "\n".join(lines)


def _tile(emulated_pairs: list[int], n: int = 16) -> str:
    out, c = [], 0
    while c < n:
        if c in emulated_pairs:
            out.append("P")
            c += 2
        else:
            out.append("H")
            c += 1
    return "".join(out)


def test_event_stream_expands_packed_floor_to_two_columns():
    assert C.exp2_event_stream(_ptx_from_pattern("HPH")) == "HEEH"


def test_comment_lines_are_not_counted():
    ptx = "// ex2.approx.ftz.f32 %r1, %r2;\n\tex2.approx.ftz.f32 %r1, %r2; // ex2.approx.ftz.f32"
    assert C.count_ptx(ptx)["ex2.approx.ftz.f32"] == 1


def test_derivation_finds_columns_across_extra_hardware_ex2():
    tile = _tile([4, 10])
    ptx = _ptx_from_pattern(tile + "H" + tile + "HH" + tile)
    d = C.derive_emulated_columns(ptx, n_block=16)
    assert d.copies_agree and d.tile_copies == 3
    assert d.emulated_columns == [4, 5, 10, 11]
    assert d.extra_hardware_ex2 == 3
    assert d.share == pytest.approx(4 / 16)


def test_derivation_reports_disagreeing_copies():
    ptx = _ptx_from_pattern(_tile([4]) + _tile([6]))
    d = C.derive_emulated_columns(ptx, n_block=16)
    assert not d.copies_agree and d.emulated_columns is None


def test_derivation_without_emulation_is_zero_share():
    d = C.derive_emulated_columns(_ptx_from_pattern("H" * 40), n_block=16)
    assert d.share == 0.0 and d.emulated_columns == [] and d.extra_hardware_ex2 == 40


def test_sass_ffma_negated_addend_pattern():
    s = "/*0100*/ FFMA R164, R24, UR8, -R14 ;\n/*0110*/ FFMA R1, R2, R3, R4 ;\n/*0120*/ FFMA2 R1, R2.F32x2.HI_LO, R3, R4 ;"
    c = C.count_sass(s)
    assert c["FFMA"] == 2 and c["FFMA with negated addend"] == 1 and c["FFMA2"] == 1
