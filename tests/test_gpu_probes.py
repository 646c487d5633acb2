"""Probe kernels on the GPU vs the CPU twin / binary32 (``pytest -m gpu``, measured on H200).

Fresh random inputs each run (seeded), complementing the stored golden vectors."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify.oracles import binary32 as b32

pytestmark = pytest.mark.gpu


def _gpu():
    """torch, for a test the ``gpu`` marker lets run (CUDA and FA4 present: tests/conftest.py)."""
    import torch
    return torch


def _inputs(n=1 << 20, seed=11):
    rng = np.random.default_rng(seed)
    a = np.concatenate([rng.uniform(-130, 10, n // 2).astype(np.float32),
                        rng.integers(0, 1 << 32, n // 2, dtype=np.int64).astype(np.uint32).view(np.float32)])
    return a


def _to_gpu(torch, a):
    return torch.from_numpy(a.view(np.int32).copy()).cuda().view(torch.float32)


def _bits(t):
    return t.contiguous().view(__import__("torch").int32).cpu().numpy().view(np.uint32)


@pytest.mark.parametrize("degree", [1, 2, 3, 4, 5])
def test_gpu_probe_ex2_emulation_equals_twin(degree):
    torch = _gpu()
    from fa4verify.kernels import twin
    from fa4verify.kernels.probes import probe_base as pb
    x = _inputs()
    y = _bits(pb.load("ex2_emulation").run(_to_gpu(torch, x), str(degree)))
    t = np.asarray(twin.ex2_emulation(x, degree, variant="scalar"), np.float32).view(np.uint32)
    nan = np.isnan(y.view(np.float32)) & np.isnan(t.view(np.float32))
    bad = ~nan & (y != t)
    assert not bad.any(), (f"degree {degree}: {int(bad.sum())} mismatches (measured on GPU), "
                           f"first x={x[bad][:5]!r}")


def test_gpu_probe_cvt_bf16_equals_binary32():
    torch = _gpu()
    from fa4verify.kernels.probes import probe_base as pb
    x = _inputs()
    y = pb.load("cvt").run(_to_gpu(torch, x), "cvt_bf16x2").cpu().numpy().view(np.uint16)
    t = b32.to_bf16_bits(x)
    ok = np.isnan(x) | (y == t)
    assert ok.all(), f"{int((~ok).sum())} mismatches, first x={x[~ok][:5]!r}"


def test_gpu_probe_exparg_is_fused():
    torch = _gpu()
    from fa4verify.kernels import golden
    from fa4verify.kernels.probes import probe_base as pb
    s_b, m_b = golden.exparg_inputs(1 << 16, seed=3)
    s, m = s_b.view(np.float32), m_b.view(np.float32)
    c = np.float32(golden.EXPARG_SCALES[1])
    a, p = pb.load("exparg").run(_to_gpu(torch, s), _to_gpu(torch, m), float(c))
    want = np.asarray(b32.fma(s, np.full_like(s, c), -b32.mul(m, np.full_like(m, c))), np.float32)
    assert np.array_equal(_bits(a), want.view(np.uint32))
    # P = MUFU ex2 of the same argument
    p2 = pb.load("mufu_ex2").run(a)
    assert torch.equal(p.view(torch.int32), p2.view(torch.int32))
