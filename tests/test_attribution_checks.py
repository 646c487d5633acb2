"""CPU twin against the budgets: local stage budgets, composed end-to-end budgets vs the oracle,
attribution, the forward/backward P mismatch, and budget-catching faults. Small shapes only."""
from __future__ import annotations

import importlib

import numpy as np
import pytest

importlib.import_module("fa4verify.kernels.twin")
ta = importlib.import_module("fa4verify.kernels.twin.attention")
A = importlib.import_module("fa4verify.stages.budgets")
importlib.import_module("fa4verify.oracles.attention")


def _over(fc):
    return {s: (t.n_over, round(t.max_ratio, 3), t.worst) for s, t in fc.stages.items()
            if t.n_over}


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
@pytest.mark.parametrize("acc,mufu", [("exact-then-round", "correctly-rounded"),
                                      ("sequential", "perturbed"), ("pairwise", "perturbed")])
def test_every_forward_stage_within_budget_for_every_model_setting(arch, acc, mufu):
    q, k, v = A.gen_inputs("outliers", batch=1, seqlen_q=96, seqlen_k=200, nheads=1, hdim=64,
                           seed=1)
    fc = A.check_forward(q, k, v, arch=arch, causal=True, accumulation=acc, mufu=mufu, seed=3)
    assert fc.stages_ok, _over(fc)
    assert fc.out_over == 0 and fc.lse_over == 0, (fc.out_ratio, fc.lse_ratio)
    expected = {"s_accum", "exp_arg", "exp2", "p_cast", "row_sum", "pv_accum", "rcp",
                "normalize", "o_cast", "lse", "rescale"}
    if arch == "sm100":
        expected.add("exp2_emu")
    assert expected <= {s for s, t in fc.stages.items() if t.n > 0}
    # the P cast and the output cast are the tight stages (a loose budget would show up here)
    assert fc.stages["p_cast"].max_ratio > 0.5 and fc.stages["o_cast"].max_ratio > 0.5


@pytest.mark.parametrize("dist", A.DISTRIBUTIONS)
def test_sm100_twin_within_composed_forward_budget_for_each_input_distribution(dist):
    q, k, v = A.gen_inputs(dist, batch=1, seqlen_q=128, seqlen_k=384, nheads=1, hdim=64, seed=2)
    fc = A.check_forward(q, k, v, arch="sm100", causal=False)
    assert fc.ok, (_over(fc), fc.out_ratio, fc.lse_ratio)
    assert 0.05 < fc.out_ratio <= 1.0


def test_fp8_old_threshold_fails_the_p_cast_budget_current_setting_passes():
    """FA #2577: rescale_threshold 4 with max_offset 8 lets P reach 2^12 > 448 (e4m3 max)."""
    import math
    from fa4verify.oracles import binary32 as b32
    d, n = 64, 512
    q = np.zeros((1, 8, 1, d), np.float32)
    q[..., 0] = 1.0
    k = np.zeros((1, n, 1, d), np.float32)
    blk = np.arange(n) // 128
    k[0, :, 0, 0] = (3 - blk) * 3.0 + (np.arange(n) % 128) / 256.0
    k = b32.to_fp8_e4m3fn(k)
    v = b32.to_fp8_e4m3fn(np.random.default_rng(8).standard_normal((1, n, 1, d)).astype(np.float32))
    kw = dict(arch="sm100", dtype="fp8", softmax_scale=1.0, e2e=False)
    new = A.check_forward(q, k, v, **kw)
    old = A.check_forward(q, k, v, mutations={"fp8_old_threshold"}, **kw)
    assert new.stages["p_cast"].n_over == 0 and new.stages_ok, _over(new)
    assert old.stages["p_cast"].n_over > 0
    assert old.config["p_max"] > 448 >= new.config["p_max"]
    assert math.isfinite(old.stages["p_cast"].max_ratio) and old.stages["p_cast"].max_ratio > 10


@pytest.mark.parametrize("mutation,stage,arch", [("p_cast_rz", "p_cast", "sm90"),
                                                 ("rcp_low_precision", "rcp", "sm90"),
                                                 ("poly_degree_2", "exp2_emu", "sm100")])
def test_stage_faults_are_caught_by_their_local_budget(mutation, stage, arch):
    q, k, v = A.gen_inputs("normal", batch=1, seqlen_q=64, seqlen_k=256, nheads=1, hdim=64)
    ok = A.check_forward(q, k, v, arch=arch, e2e=False)
    bad = A.check_forward(q, k, v, arch=arch, mutations={mutation}, e2e=False)
    assert ok.stages[stage].n_over == 0
    assert bad.stages[stage].n_over > 0


@pytest.mark.parametrize("mutation,dist", [("causal_top_left", "normal"),
                                           ("causal_off_by_one", "normal"),
                                           ("rescale_skipped", "peaked"),
                                           ("tail_tile_dropped", "normal")])
def test_algorithmic_faults_break_the_composed_forward_budget(mutation, dist):
    q, k, v = A.gen_inputs(dist, batch=1, seqlen_q=150, seqlen_k=300, nheads=1, hdim=64)
    fc = A.check_forward(q, k, v, arch="sm90", causal=True, mutations={mutation})
    assert fc.out_over > 0 or fc.lse_over > 0


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_backward_stages_and_gradients_within_budget(arch):
    q, k, v, do = A.gen_inputs("normal", batch=1, seqlen_q=96, seqlen_k=160, nheads=2, hdim=64,
                               seed=4, with_dout=True)
    bc = A.check_backward(q, k, v, do, arch=arch, causal=True)
    assert all(t.n_over == 0 for t in bc.stages.values()), _over(bc)
    assert {"d_pre", "bwd_exp2", "ds", "ds_cast", "dq_accum"} <= set(bc.stages)
    assert all(n == 0 for n in bc.over.values()), bc.ratios
    assert max(bc.ratios.values()) > 0.05


def test_attribution_p_cast_and_o_cast_dominate_and_emulation_is_below_one_fortieth():
    """Expectation TESTED (DERIVATIONS.md#fwd-composition): on SM100 bf16 the P cast and the
    output cast dominate the forward error, and the exp2 emulation's isolated error is below
    1/40 of the P cast's."""
    q, k, v = A.gen_inputs("normal", batch=1, seqlen_q=64, seqlen_k=256, nheads=1, hdim=64)
    rows, summ = A.attribute_forward(q, k, v, arch="sm100",
                                     stages=("exp2", "exp2_emu", "p_cast", "row_sum", "o_cast"))
    by = {r.stage: r for r in rows}
    assert summ["dominant"] in ("p_cast", "o_cast")
    top = sorted(rows, key=lambda r: -r.isolated_rms)[:2]
    assert {r.stage for r in top} == {"p_cast", "o_cast"}
    assert by["exp2_emu"].isolated_rms > 0
    assert summ["emu_over_pcast"] < 1 / 40
    assert by["exp2_emu"].lse_isolated_max > by["row_sum"].lse_isolated_max


def test_fwd_bwd_p_mismatch_is_bounded_by_the_emulation_error():
    q, k, v, do = A.gen_inputs("normal", batch=1, seqlen_q=64, seqlen_k=256, nheads=1, hdim=64,
                               with_dout=True)
    m = A.fwd_bwd_p_mismatch(q, k, v, do, arch="sm100")
    assert m["n_emulated_compared"] > 0
    assert 1e-5 < m["p_rel_max"] <= 8.8e-5
    for g in ("dq", "dk", "dv"):
        assert m[f"grad_effect_{g}"] < m[f"grad_error_{g}"]


def test_dq_shuffled_order_is_detectable_by_comparing_runs():
    q, k, v, do = A.gen_inputs("normal", batch=1, seqlen_q=128, seqlen_k=1024, nheads=1,
                               hdim=32, with_dout=True)
    fr = ta.forward(q, k, v, arch="sm90")
    a = ta.backward(q, k, v, fr.out, do, lse=fr.lse, arch="sm90", deterministic=True)
    b = ta.backward(q, k, v, fr.out, do, lse=fr.lse, arch="sm90", deterministic=True)
    assert np.array_equal(a.stages["dq_accum"], b.stages["dq_accum"])
    runs = [ta.backward(q, k, v, fr.out, do, lse=fr.lse, arch="sm90", deterministic=True,
                        mutations={"dq_shuffled_order"}).stages["dq_accum"] for _ in range(3)]
    assert any(not np.array_equal(r, a.stages["dq_accum"]) for r in runs)


def test_fp16_peaked_backward_within_budget_including_subnormal_p_floor():
    """Regression: with fp16, P far below 2^-14 loses relative precision in the cast; the
    composed dV/dQ/dK budgets must carry the absolute floor (DERIVATIONS.md#bwd-composition)."""
    q, k, v, do = A.gen_inputs("peaked", batch=1, seqlen_q=128, seqlen_k=256, nheads=1, hdim=64,
                               dtype="fp16", with_dout=True)
    bc = A.check_backward(q, k, v, do, arch="sm90", dtype="fp16", causal=True)
    assert all(n == 0 for n in bc.over.values()), bc.ratios
    assert bc.ratios["dv"] > 0.3      # the floor term is what holds dV in: not a loose budget


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_local_window_and_gqa_within_budget(arch):
    q, k, v = A.gen_inputs("outliers", batch=1, seqlen_q=100, seqlen_k=300, nheads=2, hdim=64,
                           seed=6)
    k, v = k[:, :, :1].copy(), v[:, :, :1].copy()          # MQA: one KV head
    fc = A.check_forward(q, k, v, arch=arch, window_size=(80, 20))
    assert fc.ok, (_over(fc), fc.out_ratio, fc.lse_ratio)


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_softcap_forward_within_budget(arch):
    q, k, v = A.gen_inputs("outliers", batch=1, seqlen_q=64, seqlen_k=256, nheads=1, hdim=64,
                           seed=7)
    fc = A.check_forward(q, k, v, arch=arch, causal=True, softcap=5.0, mufu="perturbed")
    assert fc.ok, (_over(fc), fc.out_ratio, fc.lse_ratio)
    assert fc.stages["softcap"].n > 0 and fc.stages["softcap"].max_ratio > 0.1


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_learnable_sink_forward_within_budget(arch):
    q, k, v = A.gen_inputs("normal", batch=1, seqlen_q=200, seqlen_k=100, nheads=2, hdim=64,
                           seed=8)
    sink = np.array([1.5, -3.0], np.float32)
    fc = A.check_forward(q, k, v, arch=arch, causal=True, learnable_sink=sink)  # rows < 100 empty
    assert fc.ok, (_over(fc), fc.out_ratio, fc.lse_ratio)
