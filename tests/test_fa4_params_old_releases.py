"""FA4's knobs as 4.0.0b20..b23 write them (kernels/fa4_params.py): the three-way
``rescale_threshold`` of b20..b22 is read (16-bit 8.0, fp8 4.0: the old fp8 setting of FA #2577);
b23's per-fp8-format ``max_offset`` is read for e4m3 (fa4verify's one fp8, kernels/twin/fp32.py) and
16-bit inputs, never for e5m2 (the middle value); and a
target that cannot be configured for the installed release (``FA4SourceChanged``) is fa4verify's
error in the fuzz properties, never the ``runs`` property failing."""
from __future__ import annotations

from pathlib import Path

import pytest

from fa4verify.kernels import fa4_params as fp

B20_RESCALE = """
            rescale_threshold = (
                8.0 if const_expr(self.q_dtype.width == 16) else
                4.0 if const_expr(self.q_dtype.width == 8) else
                0.0
            )
"""
B24_RESCALE = "            rescale_threshold = 8.0 if const_expr(self.q_dtype.width == 16) else 0.0\n"
B23_MAX_OFFSET = """
            max_offset = (
                4 if cutlass.const_expr(self.q_dtype is cutlass.Float8E4M3FN) else
                8 if cutlass.const_expr(self.q_dtype.width == 8) else
                0
            )
"""


def test_rescale_threshold_three_way_and_two_way():
    regs = (fp._RESCALE_RE, fp._RESCALE3_RE)
    p = Path("flash_fwd_sm100.py")
    assert fp._one_value(regs, B20_RESCALE, "rescale_threshold", p) == (8.0, 4.0)
    assert fp._one_value(regs, B24_RESCALE, "rescale_threshold", p) == (8.0, 0.0)
    with pytest.raises(fp.FA4SourceChanged, match="different values"):
        fp._one_value(regs, B20_RESCALE + B24_RESCALE, "rescale_threshold", p)


def test_max_offset_per_fp8_format_reads_the_e4m3_value():
    regs = (fp._MAX_OFFSET_RE, fp._MAX_OFFSET3_RE)
    p = Path("flash_fwd_sm100.py")
    assert fp._one_value(regs, B23_MAX_OFFSET, "max_offset", p) == (4.0, 0.0)
    # the e5m2 value is never taken for fa4verify's fp8 (e4m3)
    assert fp._one_value(regs, B23_MAX_OFFSET.replace("4 if", "5 if"), "max_offset", p) == (5.0, 0.0)
    # the b24+ two-way form and b23's in one file disagree on fp8: not one value
    two_way = "            max_offset = 8 if cutlass.const_expr(self.q_dtype.width == 8) else 0\n"
    with pytest.raises(fp.FA4SourceChanged, match="different values"):
        fp._one_value(regs, B23_MAX_OFFSET + two_way, "max_offset", p)
    with pytest.raises(fp.FA4SourceChanged, match="max_offset"):
        fp._one_value(fp._MAX_OFFSET_RE, B23_MAX_OFFSET, "max_offset", p)


def test_a_release_fa4verify_cannot_model_is_an_error_not_a_runs_violation():
    from fa4verify.errors import HarnessError
    from fa4verify.fuzz.properties import _run_target
    from fa4verify.problem import AttentionProblem

    class Twinlike:                    # blames_fa4 unset: a crash would be the target failing
        def forward(self):
            raise fp.FA4SourceChanged("flash_fwd_sm100.py: the hard-coded `max_offset` expression was not found")

    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=8, seqlen_k=8, nheads=1, nheads_kv=1,
                         head_dim=8, head_dim_v=8)
    with pytest.raises(HarnessError, match="cannot model this FA4 release"):
        _run_target(p, Twinlike().forward)
