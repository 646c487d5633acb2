"""Digests and bitwise comparison (fa4verify.determinism): the primitives every verdict rests on."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fa4verify.oracles import binary32 as b32
from fa4verify import determinism as d


def _bf16_from_bits(bits):
    return torch.tensor(np.asarray(bits, dtype=np.uint16).view(np.int16)).view(torch.bfloat16)


def test_digest_is_sha256_of_raw_bytes_and_sees_one_bit():
    import hashlib
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    raw = x.view(torch.int16).numpy().tobytes()
    assert d.digest(x) == hashlib.sha256(raw).hexdigest()
    y = x.clone()
    y.view(torch.int16)[1, 2] ^= 1  # flip the lowest mantissa bit of one element
    assert d.digest(y) != d.digest(x)
    # numpy holding the same bytes gives the same digest
    assert d.digest(x.view(torch.int16).numpy()) == d.digest(x)


def test_digest_distinguishes_signed_zeros_and_nan_payloads():
    pz, nz = _bf16_from_bits([0x0000]), _bf16_from_bits([0x8000])
    assert d.digest(pz) != d.digest(nz)
    assert d.digest(_bf16_from_bits([0x7FC0])) != d.digest(_bf16_from_bits([0x7FC1]))


@pytest.mark.parametrize("a_bits,b_bits", [
    (0x3F80, 0x3F83),      # 1.0 vs 1.0 + 3 ulp
    (0x0001, 0x8001),      # +min subnormal vs -min subnormal (crosses zero)
    (0x7F7F, 0x7F80),      # max finite vs +inf
    (0xBF80, 0x3F80),      # -1 vs +1
    (0x0000, 0x8000),      # +0 vs -0
])
def test_bf16_ulp_distance_agrees_with_binary32_kit(a_bits, b_bits):
    # bf16 values are fp32 values whose low 16 bits are 0, so one bf16 step is 2^16 fp32 steps.
    a, b = _bf16_from_bits([a_bits]), _bf16_from_bits([b_bits])
    fa = np.array([a_bits << 16], dtype=np.uint32).view(np.float32)
    fb = np.array([b_bits << 16], dtype=np.uint32).view(np.float32)
    expected = int(b32.ulp_distance(fa, fb)[0]) // 65536
    r = d.compare_bitwise(a, b)
    assert r.max_ulp == expected
    assert r.differing == 1 and r.first_index == 0


def test_fp32_ulp_distance_agrees_with_binary32_kit_on_random_pairs():
    rng = np.random.default_rng(1)
    a = rng.standard_normal(5000).astype(np.float32)
    b = (a + rng.standard_normal(5000).astype(np.float32) * np.float32(1e-5)).astype(np.float32)
    b[::7] = a[::7]
    expected = b32.ulp_distance(a, b)
    r = d.compare_bitwise(a, b)
    assert r.max_ulp == int(expected.max())
    assert r.differing == int((a.view(np.int32) != b.view(np.int32)).sum())


def test_compare_counts_nan_mismatch_separately_and_equal_is_bitwise():
    a = _bf16_from_bits([0x3F80, 0x7FC0, 0x4000, 0x4000])
    b = _bf16_from_bits([0x3F80, 0x3F80, 0x4000, 0x4001])
    r = d.compare_bitwise(a, b)
    assert (r.differing, r.nan_mismatch, r.max_ulp, r.first_index) == (2, 1, 1, 1)
    assert d.compare_bitwise(a, a.clone()).equal
    with pytest.raises(ValueError):
        d.compare_bitwise(a, b.float())


def test_nan_count_reads_bits_for_each_format():
    x = _bf16_from_bits([0x7FC0, 0x7F80, 0xFF81, 0x0000, 0x7F8A])  # qNaN, +inf, -sNaN, 0, sNaN
    assert d.nan_count(x) == 3
    h = torch.tensor([float("nan"), 1.0, float("inf")], dtype=torch.float16)
    assert d.nan_count(h) == 1
    f = torch.tensor([float("nan")] * 4 + [0.0], dtype=torch.float32)
    assert d.nan_count(f) == 4


def test_ml_dtypes_bf16_array_is_accepted():
    ml = pytest.importorskip("ml_dtypes")
    a = np.array([1.0, 2.0, -0.0], dtype=ml.bfloat16)
    t = d.as_tensor(a)
    assert t.dtype == torch.bfloat16
    assert d.digest(a) == d.digest(t)
