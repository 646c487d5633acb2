"""Properties of the CPU twin of FA4's backward (kernels/twin/backward.py). Small shapes only."""
from __future__ import annotations

import importlib
import math

import numpy as np
import pytest

from fa4verify.oracles import binary32 as b32

ta = importlib.import_module("fa4verify.kernels.twin.attention")
importlib.import_module("fa4verify.kernels.twin")


def bf16(rng, shape):
    return b32.to_bf16(rng.standard_normal(shape).astype(np.float32))


def grads_fp64(q, k, v, do, *, causal=False):
    """Independent fp64 gradients of softmax attention (exact O in D)."""
    rep = q.shape[2] // k.shape[2]
    Q = q.astype(float).transpose(0, 2, 1, 3)
    K = np.repeat(k.astype(float).transpose(0, 2, 1, 3), rep, 1)
    V = np.repeat(v.astype(float).transpose(0, 2, 1, 3), rep, 1)
    dO = do.astype(float).transpose(0, 2, 1, 3)
    sc = float(np.float32(1 / math.sqrt(Q.shape[-1])))
    s = Q @ K.swapaxes(-1, -2) * sc
    if causal:
        Sq, Sk = s.shape[-2:]
        s = np.where(np.arange(Sk)[None] <= np.arange(Sq)[:, None] + Sk - Sq, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    O = p @ V
    dV = p.swapaxes(-1, -2) @ dO
    dS = p * (dO @ V.swapaxes(-1, -2) - (dO * O).sum(-1, keepdims=True))
    dQ, dK = sc * dS @ K, sc * dS.swapaxes(-1, -2) @ Q
    B, H = dK.shape[:2]
    Hk = k.shape[2]
    dK = dK.reshape(B, Hk, rep, *dK.shape[2:]).sum(2)
    dV = dV.reshape(B, Hk, rep, *dV.shape[2:]).sum(2)
    return [x.swapaxes(1, 2) for x in (dQ, dK, dV)]


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
@pytest.mark.parametrize("causal,hq,hk", [(False, 2, 2), (True, 4, 2)])
def test_all_stages_exact_backward_reproduces_fp64_gradients(arch, causal, hq, hk):
    rng = np.random.default_rng(0)
    q, k, v = bf16(rng, (1, 150, hq, 64)), bf16(rng, (1, 270, hk, 64)), bf16(rng, (1, 270, hk, 64))
    do = bf16(rng, (1, 150, hq, 64))
    fr = ta.forward(q, k, v, arch=arch, causal=causal, exact_stages=frozenset(ta.FWD_STAGES))
    g = ta.backward(q, k, v, fr.out, do, lse=fr.lse, arch=arch, causal=causal,
                    exact_stages=frozenset(ta.BWD_STAGES))
    for got, ref in zip((g.dq, g.dk, g.dv), grads_fp64(q, k, v, do, causal=causal)):
        assert got.shape == ref.shape
        assert np.allclose(got, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_as_fa4_gradients_are_dtype_rounded_and_close(arch):
    rng = np.random.default_rng(1)
    q, k, v, do = (bf16(rng, (1, 100, 2, 64)) for _ in range(4))
    fr = ta.forward(q, k, v, arch=arch)
    g = ta.backward(q, k, v, fr.out, do, lse=fr.lse, arch=arch)
    for got, ref in zip((g.dq, g.dk, g.dv), grads_fp64(q, k, v, do)):
        assert np.array_equal(b32.to_bf16(got), got)
        assert np.abs(got - ref).max() <= 0.02 * np.abs(ref).max()


def test_backward_runs_the_forward_when_no_lse_is_given():
    rng = np.random.default_rng(2)
    q, k, v, do = (bf16(rng, (1, 64, 1, 32)) for _ in range(4))
    fr = ta.forward(q, k, v, arch="sm90")
    a = ta.backward(q, k, v, fr.out, do, lse=fr.lse, arch="sm90")
    b = ta.backward(q, k, v, fr.out, do, arch="sm90")
    assert np.array_equal(a.dq, b.dq) and np.array_equal(a.dk, b.dk)


def test_deterministic_order_is_fixed_ascending_or_spt_descending():
    rng = np.random.default_rng(3)
    q, k, v, do = bf16(rng, (1, 64, 1, 32)), bf16(rng, (1, 512, 1, 32)), bf16(rng, (1, 512, 1, 32)), \
        bf16(rng, (1, 64, 1, 32))
    fr = ta.forward(q, k, v, arch="sm100")
    g = ta.backward(q, k, v, fr.out, do, lse=fr.lse, arch="sm100", deterministic=True)
    assert g.stages["dq_order"] == (0, 1, 2, 3)
    frc = ta.forward(q, k, v, arch="sm100", causal=True)
    gc = ta.backward(q, k, v, frc.out, do, lse=frc.lse, arch="sm100", causal=True)
    assert gc.stages["dq_order"] == (3, 2, 1, 0)
    nd = ta.backward(q, k, v, fr.out, do, lse=fr.lse, arch="sm100", deterministic=False, seed=5)
    assert sorted(nd.stages["dq_order"]) == [0, 1, 2, 3]


def test_d_from_fp32_o_mutation_changes_d():
    rng = np.random.default_rng(4)
    q, k, v, do = (bf16(rng, (1, 64, 1, 64)) for _ in range(4))
    fr = ta.forward(q, k, v, arch="sm90")
    a = ta.backward(q, k, v, fr.out, do, lse=fr.lse, arch="sm90")
    b = ta.backward(q, k, v, fr.out, do, lse=fr.lse, arch="sm90", mutations={"d_from_fp32_o"},
                    out_fp32=fr.stages["o_fp32"])
    assert not np.array_equal(a.stages["D"], b.stages["D"])


def test_backward_rejects_fp8_and_unknown_names():
    rng = np.random.default_rng(5)
    q = bf16(rng, (1, 8, 1, 16))
    with pytest.raises(ValueError, match="bf16/fp16"):
        ta.backward(q, q, q, q, q, dtype="fp8")
    with pytest.raises(ValueError, match="unknown backward stage"):
        ta.backward(q, q, q, q, q, exact_stages={"dqq"})
    assert set(ta.MUTATIONS) >= {"d_from_fp32_o", "dq_shuffled_order", "poly_degree_2"}
