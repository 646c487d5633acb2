"""Properties of the CPU twin of FA4's forward (kernels/twin/forward.py). Small shapes only."""
from __future__ import annotations

import importlib
import math

import numpy as np
import pytest

from fa4verify.oracles import binary32 as b32

ta = importlib.import_module("fa4verify.kernels.twin.attention")
importlib.import_module("fa4verify.kernels.twin")

ALL_FWD = frozenset(ta.FWD_STAGES)


def bf16(rng, shape, scale=1.0, loc=0.0):
    return b32.to_bf16((rng.standard_normal(shape) * scale + loc).astype(np.float32))


def ref_fp64(q, k, v, *, causal=False, window=(None, None), softcap=0.0, sink=None, scale=None):
    """Independent fp64 attention (numpy, direct softmax): (out (b,s,h,dv), lse (b,h,s))."""
    rep = q.shape[2] // k.shape[2]
    q = q.astype(np.float64).transpose(0, 2, 1, 3)
    k = np.repeat(k.astype(np.float64).transpose(0, 2, 1, 3), rep, axis=1)
    v = np.repeat(v.astype(np.float64).transpose(0, 2, 1, 3), rep, axis=1)
    # the kernel receives softmax_scale as an fp32 runtime argument
    scale = float(np.float32(scale or 1 / math.sqrt(q.shape[-1])))
    s = q @ k.swapaxes(-1, -2) * scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    Sq, Sk = s.shape[-2:]
    i = np.arange(Sq)[:, None]
    j = np.arange(Sk)[None]
    ok = np.ones((Sq, Sk), bool)
    wl, wr = window
    if causal:
        wr = 0
    if wr is not None:
        ok &= j <= i + Sk - Sq + wr
    if wl is not None:
        ok &= j >= i + Sk - Sq - wl
    s = np.where(ok, s, -np.inf)
    mx = s.max(-1, keepdims=True)
    if sink is not None:
        mx = np.maximum(mx, np.asarray(sink, np.float64).reshape(1, -1, 1, 1))
    mxs = np.where(np.isfinite(mx), mx, 0)
    p = np.exp(s - mxs)
    lsum = p.sum(-1, keepdims=True)
    if sink is not None:
        lsum = lsum + np.exp(np.asarray(sink, np.float64).reshape(1, -1, 1, 1) - mxs)
    with np.errstate(invalid="ignore", divide="ignore"):
        o = np.where(lsum > 0, p @ v / np.where(lsum > 0, lsum, 1), 0.0)
        lse = np.where(lsum[..., 0] > 0, mxs[..., 0] + np.log(lsum[..., 0]), -np.inf)
    return o.swapaxes(1, 2), lse


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
@pytest.mark.parametrize("causal,sq,sk,d", [(False, 200, 300, 64), (True, 300, 200, 128),
                                             (True, 130, 390, 96)])
def test_all_stages_exact_reproduces_fp64_attention(arch, causal, sq, sk, d):
    """With every stage exact, the twin's online-softmax/tiling/masking structure must give the
    exact attention to fp64 accuracy (a wrong block range, mask or rescale would not)."""
    rng = np.random.default_rng(1)
    q, k, v = bf16(rng, (1, sq, 2, d)), bf16(rng, (1, sk, 2, d)), bf16(rng, (1, sk, 2, d))
    r = ta.forward(q, k, v, arch=arch, causal=causal, exact_stages=ALL_FWD)
    o, lse = ref_fp64(q, k, v, causal=causal)
    assert np.allclose(r.out, o, rtol=0, atol=1e-12)
    fin = np.isfinite(lse)
    assert np.array_equal(fin, np.isfinite(r.lse))
    assert np.allclose(r.lse[fin], lse[fin], rtol=0, atol=1e-12)


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_all_stages_exact_with_window_softcap_sink_gqa(arch):
    rng = np.random.default_rng(2)
    q, k, v = bf16(rng, (2, 150, 4, 64)), bf16(rng, (2, 260, 2, 64)), bf16(rng, (2, 260, 2, 64))
    sink = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
    kw = dict(window=(70, 10), softcap=15.0, sink=sink)
    r = ta.forward(q, k, v, arch=arch, window_size=(70, 10), softcap=15.0, learnable_sink=sink,
                   exact_stages=ALL_FWD)
    o, lse = ref_fp64(q, k, v, **kw)
    assert np.allclose(r.out, o, rtol=0, atol=1e-12)
    assert np.allclose(r.lse, lse, rtol=0, atol=1e-11)


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
@pytest.mark.parametrize("acc", ta.ACCUMULATIONS)
def test_as_fa4_output_within_two_bf16_ulps_of_fp64(arch, acc):
    """Every accumulation model stays within 2 bf16 ulp (at |O|) + 2^-9 * sum|P||V| of fp64."""
    rng = np.random.default_rng(3)
    q, k, v = bf16(rng, (1, 140, 1, 64)), bf16(rng, (1, 200, 1, 64)), bf16(rng, (1, 200, 1, 64))
    r = ta.forward(q, k, v, arch=arch, accumulation=acc)
    o, lse = ref_fp64(q, k, v)
    assert r.out.dtype == np.float32
    assert np.array_equal(b32.to_bf16(r.out), r.out), "output is not bf16-rounded"
    tol = 2 * 2.0**-8 * np.abs(o) + 2.0**-8 * np.abs(v).max()
    assert (np.abs(r.out - o) <= tol).all()
    assert np.abs(r.lse - lse).max() < 1e-4


def test_gqa_equals_mha_with_repeated_kv_heads_bitwise():
    rng = np.random.default_rng(4)
    q, k, v = bf16(rng, (1, 64, 4, 32)), bf16(rng, (1, 96, 2, 32)), bf16(rng, (1, 96, 2, 32))
    a = ta.forward(q, k, v, arch="sm90")
    b = ta.forward(q, np.repeat(k, 2, axis=2), np.repeat(v, 2, axis=2), arch="sm90")
    assert np.array_equal(a.out, b.out) and np.array_equal(a.lse, b.lse)


def test_sm100_emulates_columns_only_on_sm100_not_sm103_or_sm90():
    rng = np.random.default_rng(5)
    q, k, v = bf16(rng, (1, 32, 1, 64)), bf16(rng, (1, 256, 1, 64)), bf16(rng, (1, 256, 1, 64))
    assert ta.forward(q, k, v, arch="sm100").stages["emulated_fraction"] > 0
    assert ta.forward(q, k, v, arch="sm103").stages["emulated_fraction"] == 0
    assert ta.forward(q, k, v, arch="sm90").stages["emulated_fraction"] == 0


def test_exp2_emu_stage_switch_changes_only_sm100():
    rng = np.random.default_rng(6)
    q, k, v = bf16(rng, (1, 64, 2, 64)), bf16(rng, (1, 256, 2, 64)), bf16(rng, (1, 256, 2, 64))
    a = ta.forward(q, k, v, arch="sm100")
    b = ta.forward(q, k, v, arch="sm100", exact_stages={"exp2_emu"})
    assert not np.array_equal(a.stages["row_sum"], b.stages["row_sum"])
    c = ta.forward(q, k, v, arch="sm90")
    d = ta.forward(q, k, v, arch="sm90", exact_stages={"exp2_emu"})
    assert np.array_equal(c.out, d.out)


def test_sm100_lazy_rescale_bounds_p_by_two_to_the_threshold():
    """16-bit: P <= 2^8 (max kept while growth <= 8 log2 units) and P > 1 occurs for rising
    scores; SM90 always updates the max so P <= 1."""
    rng = np.random.default_rng(7)
    d = 64
    q = bf16(rng, (1, 16, 1, d))
    # scores grow along the KV axis so later (earlier-visited = higher index) ... build both ways
    k = bf16(rng, (1, 512, 1, d))
    ramp = np.linspace(0, 1, 512, dtype=np.float32)[None, :, None, None]
    k = b32.to_bf16((k * 0.3 + ramp * q.mean(1, keepdims=True) * 0).astype(np.float32))
    qk = b32.to_bf16((np.linspace(-6, 6, 512, dtype=np.float32)[None, :, None, None]
                      * np.ones((1, 1, 1, d), np.float32) / 8).astype(np.float32))
    q1 = b32.to_bf16(np.ones((1, 16, 1, d), np.float32))
    v = bf16(rng, (1, 512, 1, d))
    r100 = ta.forward(q1, qk[:, ::-1].copy(), v, arch="sm100", softmax_scale=1.0)
    r90 = ta.forward(q1, qk[:, ::-1].copy(), v, arch="sm90", softmax_scale=1.0)
    assert r100.stages["p_max"].max() <= 2.0**8
    assert r100.stages["p_max"].max() > 1.0
    # SM90: x = fma(S, c, -RN(m*c)) can be slightly positive at the row max (the rounding of
    # m*c), so P may exceed 1 by a few fp32 ulps, never more
    assert r90.stages["p_max"].max() <= 1.0 + 2.0**-18


def _peaked_fp8_case():
    """Rows whose score rises by ~6 log2 units per KV block (visited last-to-first)."""
    d = 64
    n = 512
    q = np.zeros((1, 8, 1, d), np.float32)
    q[..., 0] = 1.0
    k = np.zeros((1, n, 1, d), np.float32)
    # block b (visited in order 3,2,1,0) has scores ~ 3.0*(3-b) + small
    blk = np.arange(n) // 128
    k[0, :, 0, 0] = (3 - blk) * 3.0 + (np.arange(n) % 128) / 256.0
    k = b32.to_fp8_e4m3fn(k)
    v = b32.to_fp8_e4m3fn(np.random.default_rng(8).standard_normal((1, n, 1, d)).astype(np.float32))
    return q, k, v


def test_fp8_current_setting_keeps_p_within_e4m3_range_old_setting_saturates():
    """FA #2577: threshold 4 with max_offset 8 lets P reach 2^12 > 448 (e4m3 max)."""
    q, k, v = _peaked_fp8_case()
    new = ta.forward(q, k, v, arch="sm100", dtype="fp8", softmax_scale=1.0)
    old = ta.forward(q, k, v, arch="sm100", dtype="fp8", softmax_scale=1.0,
                     mutations={"fp8_old_threshold"})
    assert new.stages["p_max"].max() <= 2.0**8
    assert old.stages["p_max"].max() > 448.0
    assert old.stages["p_cast_max"].max() == 448.0


MUTATION_CASES = {
    "poly_degree_2": dict(arch="sm100"),
    "poly_coeff_ulp": dict(arch="sm100"),
    "p_cast_rz": dict(arch="sm90"),
    "rescale_skipped": dict(arch="sm90"),
    "causal_top_left": dict(arch="sm90", causal=True),
    "causal_off_by_one": dict(arch="sm100", causal=True),
    "tail_tile_dropped": dict(arch="sm90"),
    "row_sum_rounded_p": dict(arch="sm100"),
    "rcp_low_precision": dict(arch="sm90"),
}


@pytest.mark.parametrize("name", sorted(MUTATION_CASES))
def test_each_forward_mutation_changes_the_result(name):
    rng = np.random.default_rng(9)
    q, k, v = bf16(rng, (1, 100, 2, 64), 2.0), bf16(rng, (1, 300, 2, 64)), bf16(rng, (1, 300, 2, 64))
    kw = MUTATION_CASES[name]
    a = ta.forward(q, k, v, **kw)
    b = ta.forward(q, k, v, mutations={name}, **kw)
    same = (np.array_equal(a.out, b.out) and np.array_equal(a.lse, b.lse)
            and np.array_equal(a.stages["row_sum"], b.stages["row_sum"]))
    assert not same, name


def test_nan_to_zero_emulated_only_differs_on_nan_scores_in_emulated_columns():
    rng = np.random.default_rng(10)
    q, k, v = bf16(rng, (1, 8, 1, 64)), bf16(rng, (1, 128, 1, 64)), bf16(rng, (1, 128, 1, 64))
    a = ta.forward(q, k, v, arch="sm100", mutations={"nan_to_zero_emulated"})
    b = ta.forward(q, k, v, arch="sm100")
    assert np.array_equal(a.out, b.out)            # no NaN: identical
    k2 = k.copy()
    k2[0, 60, 0, 3] = np.nan                      # column 60 is emulated for hd 64
    assert 60 in ta.forward(q, k2, v, arch="sm100").config.emulated_columns
    c = ta.forward(q, k2, v, arch="sm100", mutations={"nan_to_zero_emulated"})
    d = ta.forward(q, k2, v, arch="sm100")
    assert not np.array_equal(np.isnan(c.out), np.isnan(d.out)) or \
        not np.allclose(c.out, d.out, equal_nan=True)


def test_unknown_stage_or_mutation_is_rejected():
    rng = np.random.default_rng(11)
    q = bf16(rng, (1, 8, 1, 16))
    with pytest.raises(ValueError, match="unknown forward stage"):
        ta.forward(q, q, q, exact_stages={"expp2"})
    with pytest.raises(ValueError, match="unknown mutation"):
        ta.forward(q, q, q, mutations={"nope"})
    with pytest.raises(ValueError, match="not a bf16 value"):
        ta.forward(q + np.float32(1e-3), q, q, dtype="bf16")


def test_perturbed_mufu_is_seeded():
    rng = np.random.default_rng(12)
    q, k, v = bf16(rng, (1, 64, 1, 64)), bf16(rng, (1, 200, 1, 64)), bf16(rng, (1, 200, 1, 64))
    a = ta.forward(q, k, v, mufu="perturbed", seed=1)
    b = ta.forward(q, k, v, mufu="perturbed", seed=1)
    c = ta.forward(q, k, v, mufu="perturbed", seed=2)
    assert np.array_equal(a.stages["row_sum"], b.stages["row_sum"])
    assert not np.array_equal(a.stages["row_sum"], c.stages["row_sum"])


def test_custom_coefficient_emulation_equals_twin_emulation_bitwise():
    from fa4verify.kernels.twin import ex2_emulation, poly_coeffs_f32
    from fa4verify.kernels.twin.forward import _emu_custom
    x = np.random.default_rng(13).uniform(-130, 8, 20000).astype(np.float32)
    x[:3] = [-np.inf, np.nan, -1e-9]
    a = _emu_custom(x, list(poly_coeffs_f32(3)))
    assert np.array_equal(b32.bits(a), b32.bits(ex2_emulation(x)))


def test_sm100_row_sum_follows_fadd_reduce_tree_order():
    """Independent scalar model of ``utils.fadd_reduce`` (arch >= 100) in plain fp32 steps."""
    from fa4verify.kernels.twin.forward import _row_sum_sm100
    rng = np.random.default_rng(14)
    P = (rng.random((3, 128)) ** 8).astype(np.float32)
    init = rng.random(3).astype(np.float32) * 50
    first = np.array([False, False, True])
    got = _row_sum_sm100(P, init, np.ones(3, np.float32), first, False, False, None)
    f = np.float32
    for r in range(3):
        acc = [[P[r, 0], P[r, 1]], [P[r, 2], P[r, 3]], [P[r, 4], P[r, 5]], [P[r, 6], P[r, 7]]]
        if not first[r]:
            acc[0][0] = f(init[r] + P[r, 0])
        for i in range(8, 128, 8):
            for a in range(4):
                acc[a] = [f(acc[a][0] + P[r, i + 2 * a]), f(acc[a][1] + P[r, i + 2 * a + 1])]
        s0 = [f(acc[0][0] + acc[1][0]), f(acc[0][1] + acc[1][1])]
        s2 = [f(acc[2][0] + acc[3][0]), f(acc[2][1] + acc[3][1])]
        s = [f(s0[0] + s2[0]), f(s0[1] + s2[1])]
        assert got[r] == f(s[0] + s[1])


def test_fully_masked_rows_give_zero_output_and_minus_inf_lse():
    rng = np.random.default_rng(15)
    q, k, v = bf16(rng, (1, 200, 1, 64)), bf16(rng, (1, 100, 1, 64)), bf16(rng, (1, 100, 1, 64))
    for arch in ("sm90", "sm100"):
        r = ta.forward(q, k, v, arch=arch, causal=True)   # bottom-right: rows < 100 see nothing
        assert (r.out[:, :99] == 0).all()
        assert np.isneginf(r.lse[..., :99]).all()
        assert np.isfinite(r.lse[..., 100:]).all()


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_varlen_equals_per_sequence_batches_and_handles_empty_sequences(arch):
    rng = np.random.default_rng(16)
    lq, lk = [50, 0, 130], [70, 20, 200]
    q = bf16(rng, (sum(lq), 2, 64))
    k = bf16(rng, (sum(lk), 2, 64))
    v = bf16(rng, (sum(lk), 2, 64))
    cq, ck = np.cumsum([0] + lq), np.cumsum([0] + lk)
    r = ta.forward(q, k, v, arch=arch, causal=True, cu_seqlens_q=cq, cu_seqlens_k=ck)
    assert r.out.shape == (sum(lq), 2, 64) and r.lse.shape == (2, sum(lq))
    for i in range(3):
        if lq[i] == 0:
            continue
        s = ta.forward(q[None, cq[i]:cq[i + 1]], k[None, ck[i]:ck[i + 1]], v[None, ck[i]:ck[i + 1]],
                       arch=arch, causal=True, exact_stages=ALL_FWD)
        o, l = ref_fp64(q[None, cq[i]:cq[i + 1]], k[None, ck[i]:ck[i + 1]], v[None, ck[i]:ck[i + 1]],
                        causal=True)
        assert np.allclose(s.out, o, atol=1e-12)
        got = r.out[cq[i]:cq[i + 1]]
        assert np.abs(got - o[0]).max() <= 2 * 2.0**-8 * np.abs(o).max() + 1e-6


def test_torch_bf16_inputs_give_the_same_result_as_float32_arrays():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(17)
    q, k, v = bf16(rng, (1, 40, 2, 32)), bf16(rng, (1, 90, 2, 32)), bf16(rng, (1, 90, 2, 32))
    a = ta.forward(q, k, v, arch="sm100")
    b = ta.forward(*(torch.from_numpy(x).to(torch.bfloat16) for x in (q, k, v)), arch="sm100")
    assert b.config.dtype == "bf16"
    assert np.array_equal(a.out, b.out) and np.array_equal(a.lse, b.lse)
