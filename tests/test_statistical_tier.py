"""The statistical tier (fa4verify.judge.statistical) and the sharper probabilistic budgets, on the
CPU twin: ulp units, the null test (twin vs twin with two MUFU seeds passes at the stated alpha),
bias detection, undecided policy, probabilistic budgets hold and are sharper, campaign entry."""
from __future__ import annotations

import json
import math

import ml_dtypes
import numpy as np
import pytest

from fa4verify import judge
from fa4verify.problem import AttentionProblem, ValueSpec
from fa4verify.judge import statistical as S
from fa4verify.targets import TwinTarget


def _problem(seed, *, s=128, hd=64, causal=False):
    return AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=s, seqlen_k=s, nheads=2, nheads_kv=2,
                            head_dim=hd, head_dim_v=hd, causal=causal, values=ValueSpec("normal", seed))


def test_ulp_of_matches_numpy_spacing_for_fp16_and_bf16_grid():
    x = np.array([1.0, 1.5, 2.0, 3.0e-3, -7.25, 1024.0, 60000.0])
    assert np.array_equal(S.ulp_of(x, "fp16"), np.spacing(np.abs(x).astype(np.float16)).astype(np.float64))
    b = np.abs(x).astype(ml_dtypes.bfloat16)
    up = (b.view(np.uint16) + 1).view(ml_dtypes.bfloat16)      # the next bf16 above (bit increment)
    assert np.array_equal(S.ulp_of(b.astype(np.float64), "bf16"), up.astype(np.float64) - b.astype(np.float64))
    assert np.isnan(S.ulp_of(np.array([0.0, 2.0 ** -130, np.inf]), "bf16")).all()


def test_radial_error_is_positive_for_a_magnitude_increase():
    ref = np.array([[1.0, -1.0, 0.5, -0.25]])
    e, r = S.ulp_errors(ref * (1 + 2.0 ** -9), ref, "bf16")
    assert np.all(r > 0) and np.allclose(np.abs(e), r)


def test_null_twin_vs_twin_two_seeds_passes_at_stated_alpha_and_pvalues_are_not_tiny():
    """Null test: 'production' = twin with MUFU seed 1, prediction = twin with seed 2 (errors that
    the prediction does not model, zero-mean). No fail at the audit's alpha (Bonferroni over 4
    problems x 4 tensors), and at the per-test level 0.01 the false-alarm count stays within what
    a 1 % rate allows (<= 3 of 16, binomial tail 5e-4)."""
    at = S.alpha_per_test(S.DEFAULT_ALPHA, 4 * 4)
    fails, loose = 0, 0
    for seed in range(4):
        p = _problem(seed, causal=bool(seed % 2))
        a = p.materialize()
        A, B = TwinTarget(mufu="perturbed", seed=1 + seed), TwinTarget(mufu="perturbed", seed=100 + seed)
        fa, fb = A.forward(p, a), B.forward(p, a)
        ga, gb = A.backward(p, a, fa), B.backward(p, a, fb)
        of, ob = judge.oracle_forward(p, a), judge.oracle_backward(p, a)
        for n, x, y, r in (("out", fa.out, fb.out, of.out), ("dq", ga.dq, gb.dq, ob.dq),
                           ("dk", ga.dk, gb.dk, ob.dk), ("dv", ga.dv, gb.dv, ob.dv)):
            v = S.stat_compare(n, x, y, r, "bf16", alpha_test=at)
            assert v.status != "undecided", v.reason
            fails += v.status == "fail"
            loose += S.stat_compare(n, x, y, r, "bf16", alpha_test=0.01, margin_ulp=0.0).status == "fail"
    assert fails == 0
    assert loose <= 3


@pytest.mark.parametrize("k", [9, 12, 14])
def test_output_bias_is_caught_by_the_statistical_tier_and_missed_by_the_worst_case(k):
    p = _problem(7)
    a = p.materialize()
    f = TwinTarget(mufu="perturbed", seed=3).forward(p, a)
    pred = TwinTarget().forward(p, a).out
    jf = judge.judge_forward(p, a, f.out, f.lse)
    o = f.out * (1 + 2.0 ** -k)      # a fault before the output cast (not re-rounded)
    st = S.stat_compare("out", o, pred, jf.ref_out.value, "bf16", alpha_test=S.alpha_per_test(1e-6, 4))
    assert st.status == "fail" and st.radial_diff > 0, st.summary()
    wc = judge.compare("out", o, jf.ref_out.value, oracle_bound=jf.ref_out.bound, budget=jf.ref_out.budget)
    assert wc.status == "pass"   # the point: a per-element maximum does not see it
    assert S.stat_compare("out", f.out, pred, jf.ref_out.value, "bf16", alpha_test=1e-8).status == "pass"


def test_undecided_with_too_few_rows_or_non_finite_outputs():
    ref = np.ones((4, 8))
    v = S.stat_compare("x", ref, ref, ref, "bf16", alpha_test=1e-6)
    assert v.status == "undecided" and "rows" in v.reason
    big = np.ones((64, 8))
    v = S.stat_compare("x", np.full_like(big, np.nan), big, big, "bf16", alpha_test=1e-6)
    assert v.status == "undecided"
    assert judge.combine([v]) == "undecided"


def test_distribution_figures_are_exact_on_a_known_error():
    ref = np.full((50, 4), 1.0)                   # bf16 ulp at 1.0 is 2^-7
    act = ref + np.tile([2.0 ** -8, -2.0 ** -8, 2.0 ** -7, 0.0], (50, 1))
    d = S.distribution("x", act, ref, "bf16")
    assert d.n == 200 and d.n_rows == 50
    assert math.isclose(d.mean, 0.25) and math.isclose(d.max, 1.0)
    assert math.isclose(d.rms, math.sqrt((0.25 + 0.25 + 1.0) / 4))
    assert sum(d.hist) == 200


def test_sharper_tier_holds_on_the_clean_twin_and_is_sharper_than_the_worst_case():
    """The probabilistic backward budgets: the clean twin passes them and sits far closer to them
    than to the worst-case budgets (CPU twin, hd 64 and 128)."""
    for p in (_problem(1, s=256), _problem(2, hd=128, causal=True)):
        a = p.materialize()
        tw = TwinTarget()
        f = tw.forward(p, a)
        g = tw.backward(p, a, f)
        jf = judge.judge_forward(p, a, f.out, f.lse)
        jb = judge.judge_backward(p, a, g.dq, g.dk, g.dv, forward=jf)
        assert jb.prob is not None
        for n in ("dq", "dk", "dv"):
            assert jb.prob[n].status == "pass", jb.prob[n].summary()
            assert jb.prob[n].tightness >= 0.2, (n, jb.prob[n].tightness)
        assert jb.prob["dq"].tightness > 2 * jb.dq.tightness
        assert jb.prob["dk"].tightness > jb.dk.tightness


def test_sharper_tier_catches_a_dq_scale_fault_the_worst_case_misses():
    p = _problem(3, s=256)
    a = p.materialize()
    tw = TwinTarget()
    f = tw.forward(p, a)
    g = tw.backward(p, a, f)
    jf = judge.judge_forward(p, a, f.out, f.lse)
    bad = g.dq * (1 + 2.0 ** -6)
    jb = judge.judge_backward(p, a, bad, g.dk, g.dv, forward=jf)
    assert jb.dq.status == "pass" and jb.prob["dq"].status == "fail"


def test_campaign_entry_point_runs_on_cpu(tmp_path):
    from fa4verify.mutants import stat_campaign as C
    rc = C.main(["--target", "twin", "--problems", "2", "--sweep-problems", "1", "--out", str(tmp_path)])
    assert rc == 0
    res = json.loads((tmp_path / "stat_tier.json").read_text())
    assert res["problems"] == 2 and res["false_alarms"]["any"] == 0
    assert res["sweep"]["9"]["stat_caught"] == 1
    assert (tmp_path / "stat_tier.log").read_text().startswith("stat tier campaign")
    assert C.main(["--target", "twin", "--seqlens", "x", "--out", str(tmp_path)]) == 2


def test_html_report_renders_the_statistical_tier_figures():
    from fa4verify.audit import report_html as H
    p = _problem(5)
    a = p.materialize()
    f = TwinTarget(mufu="perturbed", seed=9).forward(p, a)
    of = judge.oracle_forward(p, a)
    v = S.tier_on(p, {"out": f.out}, {"out": of.out}, a, alpha_test=1e-6)
    r = {"id": "budgets.twin.backward", "status": "pass", "title": "t", "where": "CPU twin", "summary": "s",
         "tightness": 0.4, "details": {"statistical": [x.to_dict() for x in v]}}
    html = H._check_section(r)
    assert 'alt="statistical tier" src="data:image/png;base64,' in html
    assert H.plot_overview([r, {**r, "id": "x", "status": "fail", "tightness": 123.0}]) is not None
