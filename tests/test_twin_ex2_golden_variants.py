"""The scalar/packed difference predicted by the twin, seen in the H200 golden vectors.

``ex2_emulation`` (scalar, recorded on the H200 by the GPU probes) flushes negative subnormal x in
``add.rm.ftz`` and returns 1.0; ``ex2_emulation_2`` (packed, what the kernels run; DSL 4.8.1 emits
no .ftz) returns p(1)/2 there. The GPU bits must equal the scalar twin everywhere and differ from
the packed twin exactly on the negative subnormals.
"""
from __future__ import annotations


import numpy as np
import pytest

from fa4verify.oracles import binary32 as b32
from fa4verify.kernels.evidence import evidence_path
from fa4verify.kernels.twin import ex2_emulation

GOLDEN = evidence_path("golden/probe_outputs.npz")


def test_gpu_scalar_variant_differs_from_packed_twin_only_on_negative_subnormals():
    if not GOLDEN.exists():
        pytest.skip(f"{GOLDEN.name} not recorded (GPU probes)")
    from fa4verify.kernels import golden
    g = golden.load(GOLDEN)
    x = g["x"].view(np.float32)
    want = g["ex2_emulation_deg3"]
    neg_sub = b32.is_subnormal(x) & np.signbit(x)
    if not neg_sub.any():
        pytest.skip("the golden inputs contain no negative subnormal")
    packed = ex2_emulation(x, 3, "packed").view(np.uint32)
    scalar = ex2_emulation(x, 3, "scalar").view(np.uint32)
    assert np.array_equal(scalar, want)
    assert np.array_equal(packed != want, neg_sub)
    assert np.all(want[neg_sub].view(np.float32) == 1.0)
