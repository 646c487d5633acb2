"""The long-context judgement's device engine (Note [Device engine] in
fa4verify/judge/long_context_device.py), run here with device='cpu': StreamedCompare is compare()
over slabs, TorchBackend evaluates every budget formula as numpy does, and the device engine
gives the host engine's budgets (to float64 rounding) and verdicts (exactly), planted faults
included; the check's evidence (phase seconds, histograms) builds from CPU results."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fa4verify import error_budgets as eb  # noqa: E402
from fa4verify.error_budgets.loader import representative_statistics  # noqa: E402
from fa4verify.judge.attention import dense_problem  # noqa: E402
from fa4verify.judge.long_context import judge_long_context  # noqa: E402
from fa4verify.judge.verdict import HIST_EDGES, StreamedCompare, compare  # noqa: E402


# ------------------------------------------------------------------ StreamedCompare == compare
def _nasty(rng, shape):
    """Reference, actual, oracle bound, budget with every case of Note [Undecided] planted."""
    ref = rng.standard_normal(shape)
    act = ref + rng.standard_normal(shape) * 0.01
    ob = np.abs(rng.standard_normal(shape)) * 1e-6
    bu = np.abs(rng.standard_normal(shape)) * 0.02
    flat = [x.reshape(-1) for x in (ref, act, ob, bu)]
    n = flat[0].size
    pick = lambda m: rng.choice(n, size=m, replace=False)   # noqa: E731
    r_, a_, o_, b_ = flat
    i = pick(3); r_[i] = np.nan                          # unjudged (or judged under nan="match")
    i = pick(2); r_[i] = np.inf; a_[i[0]] = np.inf       # one inf reference matched, one not
    i = pick(2); a_[i] = np.nan                          # NaN actual: over (ratio inf, a tie)
    i = pick(2); b_[i] = -1e-3                           # negative budget: unjudged
    i = pick(2); o_[i] = np.inf                          # uncertified oracle: unjudged
    i = pick(2); o_[i] = 0.0; b_[i] = 0.0; a_[i] = r_[i] + 1e-9   # zero allowance, nonzero error
    i = pick(2); a_[i] = r_[i]                           # exact
    return ref, act, ob, bu


def _slabs(rng, n):
    cuts = sorted(set(rng.integers(1, n, size=4).tolist()))
    edges = [0] + cuts + [n]
    sl = [(edges[j], edges[j + 1]) for j in range(len(edges) - 1)]
    rng.shuffle(sl)
    return sl


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("axis", [1, 2])
@pytest.mark.parametrize("nan", ["unjudged", "match"])
def test_streamed_compare_over_slabs_equals_compare(seed, axis, nan):
    rng = np.random.default_rng(seed)
    shape = (2, 23, 3, 7) if axis == 1 else (2, 3, 29)
    ref, act, ob, bu = _nasty(rng, shape)
    want = compare("x", act, ref, oracle_bound=ob, budget=bu, nan=nan)
    sc = StreamedCompare("x", shape, axis, nan=nan)
    t = lambda x, s0, s1: torch.as_tensor(np.take(x, range(s0, s1), axis=axis))   # noqa: E731
    for s0, s1 in _slabs(rng, shape[axis]):
        sc.add(t(act, s0, s1), t(ref, s0, s1), t(ob, s0, s1), t(bu, s0, s1), s0)
    got = sc.verdict()
    assert want.status == "fail" and want.n_unjudged > 0
    # status, counts, tightness, worst, violations, reason (repr: a NaN actual != itself under ==)
    assert repr(got) == repr(want)
    h = sc.histogram()
    assert len(h["counts"]) == len(HIST_EDGES) + 1 and h["edges"][-1] == math.inf
    with np.errstate(invalid="ignore", divide="ignore"):
        share = ob / (ob + bu)
    assert sc.oracle_bound_share == np.max(share[np.isfinite(share)])


def test_streamed_compare_undecided_and_pass_like_compare():
    rng = np.random.default_rng(5)
    ref = rng.standard_normal((1, 40, 2, 4))
    act = ref + 1e-4
    bu = np.full(ref.shape, 1e-3)
    for budget in (bu, np.where(np.arange(ref.size).reshape(ref.shape) == 17, np.nan, bu)):
        want = compare("o", act, ref, oracle_bound=0.0, budget=budget)
        sc = StreamedCompare("o", ref.shape, 1)
        for s0 in range(0, 40, 16):
            sl = slice(s0, s0 + 16)
            sc.add(torch.as_tensor(act[:, sl]), torch.as_tensor(ref[:, sl]), 0.0, torch.as_tensor(budget[:, sl]), s0)
        assert repr(sc.verdict()) == repr(want)
        assert want.status in ("pass", "undecided")
    assert sum(sc.histogram()["counts"]) == want.n_compared


# ------------------------------------------------------------------ TorchBackend == numpy
@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_torch_backend_evaluates_every_budget_formula_like_numpy(arch):
    bs = eb.load("bf16", arch)
    rng = np.random.default_rng(0)
    be = eb.TorchBackend("cpu")
    for base in representative_statistics():
        st = {n: (x * rng.uniform(0.5, 2.0, 6) if n not in ("d", "dv", "tile_n", "max_offset", "x_max") else x)
              for n, x in base.items()}
        for name in bs.names():
            want = np.asarray(bs.evaluate(name, st), np.float64)
            got = bs.evaluate(name, {n: (torch.as_tensor(x) if isinstance(x, np.ndarray) else x) for n, x in st.items()},
                              be)
            assert isinstance(got, torch.Tensor) and got.dtype == torch.float64
            np.testing.assert_allclose(np.broadcast_to(got.numpy(), np.broadcast(want, got.numpy()).shape),
                                       np.broadcast_to(want, np.broadcast(want, got.numpy()).shape),
                                       rtol=1e-14, atol=0, err_msg=name)


def test_torch_backend_divides_by_zero_like_numpy():
    from fa4verify.error_budgets.loader import Formula
    f = Formula("a / b + gamma(n, u)", where=("t", "t"), known={"a": (), "b": (), "n": (), "u": ()})
    env = {"a": 1.0, "b": 0.0, "n": 2.0 ** 60, "u": 2.0 ** -53}
    with np.errstate(all="ignore"):
        want = float(f.evaluate({n: np.float64(x) for n, x in env.items()}))
    assert float(f.evaluate(env, eb.TorchBackend("cpu"))) == want == math.inf


# ------------------------------------------------------------------ device engine == host engine
def _inputs(b, sq, sk, h, hk, d, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).bfloat16() for s in ((b, sq, h, d), (b, sk, hk, d), (b, sk, hk, d), (b, sq, h, d))]


def _same(host, dev, names):
    for n in names:
        a, b = host.verdicts[n], dev.verdicts[n]
        assert (a.status, a.n_compared, a.n_over, a.n_unjudged, a.max_abs_err) == \
            (b.status, b.n_compared, b.n_over, b.n_unjudged, b.max_abs_err), n
        assert math.isclose(a.tightness, b.tightness, rel_tol=1e-12), n
        assert [e.index for e in a.violations] == [e.index for e in b.violations], n
        assert math.isclose(host.oracle_bound_rel[n], dev.oracle_bound_rel[n], rel_tol=1e-12), n
        # per element: the same budgets to float64 rounding (so the same per-element verdicts)
        np.testing.assert_allclose(dev.budgets[n], host.budgets[n], rtol=1e-12, atol=0, err_msg=n)
        assert sum(dev.histograms[n]["counts"]) == b.n_compared


@pytest.mark.slow   # ~10-30 s on the 2-core box (both engines, fwd + bwd at 512)
@pytest.mark.parametrize("causal", [True, False])
def test_device_engine_equals_host_engine_fwd_bwd(causal):
    from fa4verify.checks.long_context import _torch32
    q, k, v, do = _inputs(1, 512, 512, 2, 2, 64)
    prob = dense_problem(q.float().numpy(), k.float().numpy(), v.float().numpy(), arch="sm90", dtype="bf16",
                         causal=causal)
    out, lse, dq, dk, dv = _torch32(q, k, v, do, causal)
    kw = dict(dout=do, dq=dq, dk=dk, dv=dv, block=256)
    host = judge_long_context(prob, q, k, v, out.float().numpy(), lse.numpy(), engine="host",
                              **{**kw, "dq": dq.float().numpy(), "dk": dk.float().numpy(), "dv": dv.float().numpy()})
    dev = judge_long_context(prob, q, k, v, out, lse, engine="device", chunk=200, keep_budgets=True, **kw)
    assert host.status == dev.status == "pass"
    _same(host, dev, ("out", "lse", "dq", "dk", "dv"))
    assert {"oracle_forward", "budget_forward", "compare_forward", "budget_derr", "oracle_backward",
            "budget_backward", "compare_backward", "total"} <= set(dev.seconds)


@pytest.mark.parametrize("case", [
    (2, 24, 40, 4, 2, 16, True, 1),     # batch 2, GQA, seqlen_q < seqlen_k (bottom-right causal)
    (2, 30, 21, 2, 1, 16, False, 3),    # MQA, row_stride 3 (judged rows and keys sampled)
])
def test_device_engine_equals_host_engine_gqa_batch_and_stride(case):
    from fa4verify.checks.long_context import _torch32
    b, sq, sk, h, hk, d, causal, stride = case
    q, k, v, do = _inputs(b, sq, sk, h, hk, d, seed=7)
    prob = dense_problem(q.float().numpy(), k.float().numpy(), v.float().numpy(), arch="sm90", dtype="bf16",
                         causal=causal)
    out, lse, dq, dk, dv = _torch32(q, k, v, do, causal)
    dv = dv.float()
    dv[1, 5, 0, 3] += 0.3                     # a planted dV fault in batch entry 1
    n = lambda x: x.float().numpy()   # noqa: E731
    host = judge_long_context(prob, q, k, v, n(out), n(lse), dout=do, dq=n(dq), dk=n(dk), dv=n(dv), block=16,
                              block_k=24, row_stride=stride, engine="host")
    dev = judge_long_context(prob, q, k, v, out, lse, dout=do, dq=dq, dk=dk, dv=dv, block=16, block_k=24,
                             row_stride=stride, engine="device", chunk=7, keep_budgets=True)
    _same(host, dev, ("out", "lse", "dq", "dk", "dv"))
    if stride == 1 or 5 % stride == 0:
        assert dev.verdicts["dv"].status == "fail"
        assert dev.verdicts["dv"].worst.index == (1, 5 // stride, 0, 3)
    assert dev.status == host.status


def test_device_engine_fails_a_planted_fault_like_the_host_engine():
    from fa4verify.checks.long_context import _torch32
    q, k, v, do = _inputs(1, 512, 512, 2, 2, 64, seed=4)
    prob = dense_problem(q.float().numpy(), k.float().numpy(), v.float().numpy(), arch="sm90", dtype="bf16", causal=True)
    out, lse, _, _, _ = _torch32(q, k, v, do, True)
    out = out.float()
    out[0, 300, 1, 5] += 0.05                    # one element, ~10x its budget
    out[0, 301:303, 0, :] *= 1.25                # a bias on two rows
    lse = lse.clone()
    lse[0, 1, 450] += 1e-3
    host = judge_long_context(prob, q, k, v, out.numpy(), lse.numpy(), block=256, engine="host")
    dev = judge_long_context(prob, q, k, v, out, lse, block=256, engine="device", chunk=128, keep_budgets=True)
    assert host.verdicts["out"].status == dev.verdicts["out"].status == "fail"
    assert host.verdicts["lse"].status == dev.verdicts["lse"].status == "fail"
    assert dev.verdicts["out"].worst.index[:2] in ((0, 300), (0, 301), (0, 302))
    assert dev.verdicts["lse"].worst.index == (0, 1, 450)
    assert dev.histograms["out"]["counts"][-1] == dev.verdicts["out"].n_over > 1
    _same(host, dev, ("out", "lse"))


def test_device_engine_is_the_default_and_refuses_unknown_engines():
    q, k, v, do = _inputs(1, 32, 32, 1, 1, 16)
    prob = dense_problem(q.float().numpy(), k.float().numpy(), v.float().numpy(), arch="sm90", dtype="bf16")
    from fa4verify.oracles import reference_gpu as rg
    f = rg.forward(q, k, v, block=16)
    j = judge_long_context(prob, q, k, v, f.out.bfloat16(), f.lse.float(), block=16)
    assert j.fingerprint["engine"] == "device" and j.status == "pass" and j.budgets == {}
    with pytest.raises(ValueError, match="engine"):
        judge_long_context(prob, q, k, v, f.out, f.lse, engine="gpu")


# ------------------------------------------------------------------ the check's evidence on CPU
def test_check_evidence_has_phase_seconds_and_histograms():
    from fa4verify.checks.long_context import PHASES, evidence, run_case
    res = [(s, run_case(s, nheads=2, nheads_kv=1, head_dim=16, device="cpu", kernel="torch32", block=32, chunk=40))
           for s in (64, 96)]
    r = evidence(res, where="CPU", dtype="bf16")
    assert r.status == "pass"
    timing = r.details["phase_seconds"]
    assert [t["seqlen"] for t in timing] == [64, 96]
    for t in timing:
        assert {"oracle_forward", "budget_forward", "compare_forward", "oracle_backward", "budget_backward",
                "compare_backward", "total"} <= set(t) <= {"seqlen", *PHASES}
        assert all(x >= 0 for x in t.values())
    hist = r.details["tightness_histogram"]
    assert {(h["seqlen"], h["tensor"]) for h in hist} == {(s, n) for s in (64, 96) for n in ("out", "lse", "dq", "dk", "dv")}
    for h in hist:
        n_cmp = r.metrics[f"s{h['seqlen']}_n_compared"]
        assert 0 < sum(v for c, v in h.items() if c not in ("seqlen", "tensor")) <= n_cmp
        assert h["> 1"] == 0
    assert r.metrics["s96_seconds_total"] >= r.metrics["s96_seconds_oracle_forward"]
    assert r.details["plot"]["kind"] == "lines"
