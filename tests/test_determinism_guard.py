"""Guard bands and NaN pre-fill: out-of-bounds writes and unwritten elements are caught."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fa4verify import determinism as d
from fa4verify.determinism import bitwise


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_armed_buffer_has_sentinel_guards_and_nan_interior(dtype):
    g = d.GuardedBuffer("dq", (2, 3, 4), dtype, "cpu", guard=16)
    g.arm()
    rep = g.check()
    assert rep.guard_ok and rep.nan_interior == 24
    g.view.copy_(torch.ones(2, 3, 4))
    rep = g.check()
    assert rep.guard_ok and rep.nan_interior == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_write_one_element_before_or_after_is_detected_with_offset(dtype):
    g = d.GuardedBuffer("dk", (5, 7), dtype, "cpu", guard=8)
    g.arm()
    g.view.zero_()
    g.storage[g.guard - 1] = 0.0        # one element before the buffer
    g.storage[g.guard + 35 + 3] = 1.0   # the fourth element after it
    rep = g.check()
    assert (rep.before, rep.after) == (1, 1)
    assert rep.first_offsets == (-1, 38)
    assert not rep.guard_ok


def test_writing_a_canonical_nan_into_the_guard_is_still_detected():
    g = d.GuardedBuffer("dv", (4,), torch.bfloat16, "cpu", guard=4)
    g.arm()
    g.view.zero_()
    g.storage[-1] = float("nan")  # canonical quiet NaN, not the sentinel's signalling payload
    assert g.check().after == 1


def test_unwritten_elements_stay_nan_and_are_counted():
    g = d.GuardedBuffer("dq", (10,), torch.bfloat16, "cpu", guard=4)
    g.arm()
    g.view[:7] = 2.0
    rep = g.check()
    assert rep.guard_ok and rep.nan_interior == 3


def test_default_guard_keeps_interior_128_byte_aligned_and_contiguous():
    for dt in (torch.bfloat16, torch.float32):
        g = d.GuardedBuffer("dq", (3, 5), dt, "cpu")
        off = g.view.data_ptr() - g.storage.data_ptr()
        assert off == d.GUARD_BYTES and off % 128 == 0
        assert g.view.is_contiguous() and g.aliases(g.view)
        assert not g.aliases(g.view.clone())


def test_sentinel_is_a_signalling_nan_distinct_from_canonical_nan():
    for name, bitsv in d.SENTINEL_BITS.items():
        nb = 16 if name != "float32" else 32
        t = torch.tensor([bitwise._signed(bitsv, nb)],
                         dtype=torch.int16 if nb == 16 else torch.int32).view(getattr(torch, name))
        assert d.nan_count(t) == 1
        canon = torch.tensor([float("nan")], dtype=getattr(torch, name))
        assert not d.compare_bitwise(t, canon).equal
