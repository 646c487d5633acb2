"""The streamed float64 reference (oracles/reference_gpu.py): its a-priori bound holds against
the certified CPU reference, is far below the bf16 budgets, is +inf (undecided) where it cannot
hold, and its exp/log assumption holds on this device; the streamed statistics equal BudgetStats."""
import math

import mpmath
import numpy as np
import pytest

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

from fa4verify.judge.attention import arrays_from, dense_problem, judge_backward, judge_forward  # noqa: E402
from fa4verify.judge.long_context import judge_long_context  # noqa: E402
from fa4verify.oracles import attention as orc  # noqa: E402
from fa4verify.oracles import reference_gpu as rg  # noqa: E402

CASES = [  # b, sq, sk, h, hk, d, causal, logit scale
    (1, 70, 90, 4, 2, 32, True, 1.0),      # GQA, causal bottom-right, ragged tiles
    (2, 48, 48, 2, 1, 16, False, 4.0),     # MQA, batch 2
    (1, 65, 65, 2, 2, 64, True, 30.0),     # adversarial: huge logits (|s| ~ 1e3)
]


def _inputs(b, sq, sk, h, hk, d, sc, seed=1):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(b, sq, h, d, generator=g) * sc).bfloat16()
    k = (torch.randn(b, sk, hk, d, generator=g) * sc).bfloat16()
    v = torch.randn(b, sk, hk, d, generator=g).bfloat16()
    do = torch.randn(b, sq, h, d, generator=g).bfloat16()
    return q, k, v, do


def _bf(x):
    return x.float().numpy().astype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("case", CASES)
def test_streamed_bound_contains_the_certified_cpu_reference(case):
    b, sq, sk, h, hk, d, causal, sc = case
    q, k, v, do = _inputs(b, sq, sk, h, hk, d, sc)
    f = rg.forward(q, k, v, causal=causal, block=32, block_k=24)
    bw = rg.backward(q, k, v, do, causal=causal, block=32, block_k=24, fwd=f)
    r = orc.backward(_bf(q), _bf(k), _bf(v), None, _bf(do), causal=causal)
    pairs = [(f.out, f.bound, r.forward.out, r.forward.bound), (f.lse, f.lse_bound, r.forward.lse, r.forward.lse_bound),
             (bw.dq, bw.dq_bound, r.dq, r.dq_bound), (bw.dk, bw.dk_bound, r.dk, r.dk_bound),
             (bw.dv, bw.dv_bound, r.dv, r.dv_bound)]
    for val, bnd, ref, rb in pairs:
        val, bnd = val.numpy(), bnd.numpy()
        assert np.isfinite(bnd).all()
        fin = np.isfinite(ref)
        assert (np.abs(val - ref)[fin] <= (bnd + rb)[fin]).all()


def test_streamed_bound_is_far_below_bf16_budgets():
    q, k, v, do = _inputs(1, 96, 96, 2, 2, 32, 1.0)
    f = rg.forward(q, k, v, causal=True, block=32)
    bw = rg.backward(q, k, v, do, causal=True, block=32, fwd=f)
    u_bf16 = 2.0 ** -8
    assert float((f.bound / f.pav).max()) < 1e-6 * u_bf16
    for val, bnd in ((bw.dq, bw.dq_bound), (bw.dk, bw.dk_bound), (bw.dv, bw.dv_bound)):
        assert float(bnd.max()) < 1e-6 * u_bf16 * float(val.abs().max())


@pytest.mark.parametrize("engine", ["host", "device"])
def test_bound_is_infinite_and_judge_undecided_when_logits_are_too_large(engine):
    q, k, v, do = _inputs(1, 16, 16, 1, 1, 16, 2.0 ** 14)
    f = rg.forward(q, k, v, causal=False, block=8)
    assert torch.isinf(f.bound).any() and torch.isinf(f.lse_bound).any()
    prob = dense_problem(q.float().numpy(), k.float().numpy(), v.float().numpy(), arch="sm90", dtype="bf16")
    out = f.out.bfloat16().double().numpy()
    j = judge_long_context(prob, q, k, v, out, f.lse.float().numpy(), block=8, engine=engine, chunk=5)
    assert j.verdicts["out"].status == "undecided"
    assert "oracle bound(s) non-finite" in j.verdicts["out"].reason
    assert j.status != "pass"


def test_device_exp_log_within_the_assumed_ulps():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-745, 0, 3000), rng.uniform(-1, 1, 1000)])
    y = np.exp(np.concatenate([rng.uniform(-700, 700, 3000), rng.uniform(-1e-3, 1e-3, 1000)]))
    ex = torch.exp(torch.tensor(x, dtype=torch.float64)).numpy()
    lg = torch.log(torch.tensor(y, dtype=torch.float64)).numpy()
    mp = mpmath.mp.clone() if hasattr(mpmath.mp, "clone") else mpmath.mp
    with mpmath.workprec(120):
        worst = 0.0
        for xi, e in zip(x, ex):
            t = mpmath.exp(mpmath.mpf(float(xi)))
            if t > 2.0 ** -1022:
                worst = max(worst, float(abs(mpmath.mpf(float(e)) - t) / t))
        for yi, l_ in zip(y, lg):
            t = mpmath.log(mpmath.mpf(float(yi)))
            if t != 0:
                worst = max(worst, float(abs(mpmath.mpf(float(l_)) - t) / abs(t)))
    assert worst <= rg.EPS_F, worst
    del mp


@pytest.mark.parametrize("engine", ["host", "device"])
def test_streamed_statistics_equal_budgetstats_and_verdicts_agree(engine):
    b, sq, sk, h, hk, d = 1, 60, 80, 4, 2, 32
    q, k, v, do = _inputs(b, sq, sk, h, hk, d, 1.0, seed=3)
    n = lambda x: x.float().numpy()   # noqa: E731
    prob = dense_problem(n(q), n(k), n(v), arch="sm90", dtype="bf16", causal=True)
    a = arrays_from(n(q), n(k), n(v), n(do))
    jf0 = judge_forward(prob, a, np.zeros((b, sq, h, d)), None)
    out = jf0.ref_out.value.astype(ml_dtypes.bfloat16).astype(np.float64)
    out[0, 7, 1, 3] += 0.5                     # one violation: both judges must fail it
    lse = jf0.ref_lse.value.astype(np.float32)
    jf = judge_forward(prob, a, out, lse)
    jb0 = judge_backward(prob, a, np.zeros((b, sq, h, d)), np.zeros((b, sk, hk, d)), np.zeros((b, sk, hk, d)), forward=jf)
    dq, dk, dv = (x.astype(ml_dtypes.bfloat16).astype(np.float64) for x in (jb0.oracle.dq, jb0.oracle.dk, jb0.oracle.dv))
    dk[0, 11, 1, 2] -= 0.25                    # and one in dK
    jb = judge_backward(prob, a, dq, dk, dv, forward=jf)
    L = judge_long_context(prob, q, k, v, out, lse, dout=do, dq=dq, dk=dk, dv=dv, block=16, block_k=24,
                           engine=engine, chunk=13, keep_budgets=True)
    # the long-context judge streams the five output budgets (not the stage-tap or sharper-tier ones)
    ref = {"out": jf.ref_out.budget, "lse": jf.ref_lse.budget,
           **{n: jb.budgets[n] for n in ("dq", "dk", "dv")}}
    assert set(L.budgets) >= set(ref)
    for name, want in ref.items():
        np.testing.assert_allclose(L.budgets[name], want, rtol=1e-9, atol=0)
    mine = {"out": jf.out, "lse": jf.lse, "dq": jb.dq, "dk": jb.dk, "dv": jb.dv}
    for name, v_ in mine.items():
        assert L.verdicts[name].status == v_.status
        assert L.verdicts[name].n_compared == v_.n_compared
        assert L.verdicts[name].n_over == v_.n_over
    assert L.verdicts["out"].status == "fail" and L.verdicts["out"].worst.index == (0, 7, 1, 3)
    assert L.verdicts["dk"].status == "fail" and L.verdicts["dk"].worst.index == (0, 11, 1, 2)


@pytest.mark.parametrize("engine", ["host", "device"])
def test_row_stride_judges_the_sampled_rows_only(engine):
    q, k, v, do = _inputs(1, 50, 50, 2, 2, 16, 1.0)
    prob = dense_problem(q.float().numpy(), k.float().numpy(), v.float().numpy(), arch="sm90", dtype="bf16", causal=True)
    f = rg.forward(q, k, v, causal=True, block=16)
    out = f.out.bfloat16().double().numpy()
    j = judge_long_context(prob, q, k, v, out, f.lse.float().numpy(), row_stride=4, block=16, engine=engine, chunk=5)
    assert list(j.rows) == list(range(0, 50, 4)) + [49]
    assert j.verdicts["out"].n_compared == len(j.rows) * 2 * 16
    assert j.status == "pass"
    assert math.isfinite(j.tightness)
