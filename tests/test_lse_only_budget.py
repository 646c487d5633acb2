"""The pass ``autograd_lse_only`` (a loss through the LSE alone: FA4's public autograd path takes
dO = 0) is judged with budgets of its own dO = 0, and the first-order dQ / dK budgets carry the
absolute error of the softcap factor ``1 - tanh.approx(x / c)^2`` (DERIVATIONS.md#bwd-composition).
Found on the H200 at 6f502c4: plan row 138 (hd 200, softcap 30, outliers) failed in 279 dQ
elements where a saturated softcap makes FA4's factor 0 and the exact one ~1e-8 -- the judge had
compared the dO = 0 oracle against budgets of the real dO, and the first-order budget had no term
for that factor. CPU twin (the twin forms the factor from its tanh.approx model)."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify.coverage import cases
from fa4verify.fuzz import check_problem
from fa4verify.fuzz.violation import Violation
from fa4verify.problem import AttentionProblem, ValueSpec
from fa4verify.targets import TwinTarget

PROPS = ("runs", "fwd_budget", "bwd_budget", "bwd_stages")


class _AutogradTwin(TwinTarget):
    """The twin with a public autograd path (the driver's kernels): dO = 0 for a loss through the
    LSE alone; ``keep_dout``: the planted fault of reading the real dO there."""

    def __init__(self, keep_dout: bool = False):
        super().__init__()
        self.keep_dout = keep_dout

    def autograd_unsupported(self, problem):
        return None

    def backward_autograd(self, problem, a, *, deterministic=True, dlse=None, lse_only=False):
        fwd = self.forward(problem, a)
        b = dict(a, dout=np.zeros_like(a["dout"])) if lse_only and not self.keep_dout else a
        kw = {} if dlse is None else {"dlse": dlse}
        return self.backward(problem, b, fwd, deterministic=deterministic, **kw)


def _saturated_softcap() -> AttentionProblem:
    # row 138's values and softcap at one batch entry and one KV head (its rows with one key of
    # nearly all the weight and |x / c| past tanh.approx's saturation)
    vs = ValueSpec("outliers", 1174656166, cases._VALUE_PARAMS.get("outliers", ()))
    return AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=261, seqlen_k=247, nheads=4, nheads_kv=1,
                            head_dim=200, head_dim_v=200, softcap=30.0, softmax_scale=0.005, values=vs)


def test_a_loss_through_the_lse_alone_is_judged_with_its_own_budgets():
    out = check_problem(_saturated_softcap(), _AutogradTwin(), properties=PROPS)
    assert "bwd_stages" in out.ran and not out.undecided, out


def test_a_public_path_that_reads_the_real_do_there_fails():
    with pytest.raises(Violation) as ei:
        check_problem(_saturated_softcap(), _AutogradTwin(keep_dout=True), properties=PROPS)
    assert ei.value.prop == "bwd_budget" and ei.value.metrics.get("pass") == "autograd_lse_only", ei.value


def test_the_softcap_factor_term_is_there_with_softcap_only(monkeypatch):
    from fa4verify import judge
    from fa4verify.fuzz.properties import _budget
    for cap in (30.0, 0.0):
        p = _saturated_softcap().replace(softcap=cap, seqlen_q=64, seqlen_k=64)
        a = p.materialize()
        ref_out, _ref_lse, st, _ = judge.forward_allowances(p, a, budgets=_budget(p))
        ob = judge.oracle_backward(p, a)
        seen = {}
        cls = type(st.budget)
        orig = cls.evaluate

        def spy(self, name, stats, *args, _orig=orig, **kw):
            if name in ("backward_dq", "backward_dk"):
                seen[name] = float(np.max(stats["abs_tanh_dsk" if name == "backward_dq" else "abs_tanh_dsq"]))
            return _orig(self, name, stats, *args, **kw)
        monkeypatch.setattr(cls, "evaluate", spy)
        with np.errstate(invalid="ignore", over="ignore"):
            st.backward(ob, ref_out.budget, ref_out.bound, probabilistic=False)
        monkeypatch.setattr(cls, "evaluate", orig)
        assert set(seen) == {"backward_dq", "backward_dk"}
        assert (min(seen.values()) > 0) if cap else (max(seen.values()) == 0), (cap, seen)
    for name in ("backward_dq", "backward_dk", "backward_dq_accum"):
        b = st.budget.get(name)
        assert ("abs_tanh_dsq" if name == "backward_dk" else "abs_tanh_dsk") in b.stats and "tanh_rel" in b.text, name


def test_the_zero_do_statistics_are_those_built_from_zero_do():
    """``BudgetStats.with_zero_dout`` (the pass's statistics without rebuilding them) gives the
    allowances, interval fallbacks and power limits a fresh build from dO = 0 gives, bit for bit,
    with a gradient through the LSE; and they differ from the real dO's (the pass judges its own)."""
    from fa4verify import judge
    from fa4verify.fuzz.properties import _budget, _seeded_dlse
    p = _saturated_softcap().replace(seqlen_q=96, seqlen_k=80)
    a = p.materialize()
    a0 = dict(a, dout=np.zeros_like(a["dout"]))
    ref_out, _l, st, ofwd = judge.forward_allowances(p, a, budgets=_budget(p))
    ref0, _l0, st0, _ = judge.forward_allowances(p, a0, budgets=_budget(p), oracle=ofwd)
    assert np.array_equal(ref_out.budget, ref0.budget)
    dl = _seeded_dlse(p, ofwd)
    ob0 = judge.oracle_backward(p, a0, dlse=dl)
    # the kernel's own forward outputs and the SM90 MMA model, as production's passes give them
    # (the modelled scores are cached on the statistics the copy shares)
    kw = dict(probabilistic=False, dlse=dl, kernel_fwd=(ofwd.out, ofwd.lse), tensor_core="sm90")
    with np.errstate(invalid="ignore", over="ignore"):
        fresh = st0.backward(ob0, ref0.budget, ref0.bound, **kw)
        st.backward(ob0, ref_out.budget, ref_out.bound, **kw)     # per-call state first
        reused = st.with_zero_dout(a0)
        got = reused.backward(ob0, ref_out.budget, ref_out.bound, **kw)
        real = st.backward(ob0, ref_out.budget, ref_out.bound, **kw)
    assert st._s_kernel, "the MMA model's scores were not cached (the interval path did not run)"
    for n in fresh:
        assert np.array_equal(fresh[n], got[n], equal_nan=True), n
        assert np.array_equal(st0.bwd_fallback[n], reused.bwd_fallback[n]), n
    assert all(np.array_equal(st0.bwd_blind_above[n], reused.bwd_blind_above[n]) for n in st0.bwd_blind_above)
    assert any(not np.array_equal(fresh[n], real[n], equal_nan=True) for n in fresh)


def test_the_lse_only_budgets_skip_no_term_but_the_zero_ones(monkeypatch):
    """With dO = 0 the first-order budgets form no product with dO (each exactly 0); they equal
    the ones every product is formed for (stacked blocks and the plain loop alike)."""
    import copy as _copy

    from fa4verify import judge
    from fa4verify.fuzz.properties import _budget
    from fa4verify.judge import stats as stats_mod
    from fa4verify.problem import AttentionProblem, ValueSpec
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=4, seqlen_q=9, seqlen_k=13, seqlens_q=(1, 9, 4, 0),
                         seqlens_k=(13, 5, 0, 7), nheads=4, nheads_kv=2, head_dim=32, head_dim_v=32, causal=True,
                         softcap=20.0, values=ValueSpec("normal", 3))
    a = p.materialize()
    dl = (np.random.default_rng(1).standard_normal(p.fully_masked_rows().shape) * 0.5).astype(np.float32)
    of, (ob, obd) = judge.oracle_pass(p, a, (None, dl))
    ref_out, _lse, st, _ = judge.forward_allowances(p, a, budgets=_budget(p), oracle=of)
    st0 = st.with_zero_dout(dict(a, dout=np.zeros_like(a["dout"])))

    def run():
        with np.errstate(invalid="ignore", over="ignore"):
            return _copy.copy(st0)._backward_first_order(ob, ref_out.budget, ref_out.bound, probabilistic=True,
                                                         dl_t=st0._lse_tokens(dl))
    fast = run()
    monkeypatch.setattr(stats_mod, "_all_zero", lambda x: False)
    full = run()
    assert fast.keys() == full.keys()
    for n in fast:
        np.testing.assert_allclose(fast[n], full[n], rtol=1e-13, atol=0, err_msg=n)
    assert any(np.any(full[n] > 0) for n in full)
