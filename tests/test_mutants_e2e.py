"""The end-to-end verifiers of the mutant suite agree with fa4verify's judge: the forward budget
path used for NaN problems (``_fwd_budget_own``: per head, the judge's statistics, FA4's NaN
semantics) gives the same verdicts as ``attribution.check_forward_outputs`` on every finite quick problem, for the
unmutated twin and for mutants that move the output or the LSE ("CPU twin")."""
from __future__ import annotations

import importlib

import numpy as np
import pytest

from fa4verify import mutants as M
from fa4verify.mutants import columns


@pytest.mark.parametrize("mutation", [(), ("row_sum_rounded_p",), ("causal_off_by_one",)])
def test_own_forward_budget_path_agrees_with_the_judge(mutation):
    assert M.twin_module() is not None, "fa4verify.kernels.twin.attention failed to load (fa4verify's own module)"
    importlib.import_module("fa4verify.stages.budgets")
    verdicts = []
    for p in M.battery("quick"):
        if p.kind == "nan" or p.seqlen_k > 400:
            continue
        d = M.make_inputs(p, 0)
        for arch in p.archs:
            run = M.run_twin(d, arch, mutation, bwd=False)
            env = M.ProblemEnv(data=d, arch=arch, base=run)
            b = M.load_budgets(p.dtype, arch)
            judge = columns._fwd_budget_judge(env, run, b)
            own = columns._fwd_budget_own(env, run, b)
            verdicts.append((p.name, arch, judge.status, own.status))
            assert judge.status == own.status, (p.name, arch, judge, own)
            # same inequality and statistics, evaluated per head: the figures agree
            assert own.figure == pytest.approx(judge.figure, rel=1e-6), (p.name, arch)
    assert verdicts


def test_nan_semantics_emulated_lane_nan_is_masked_mufu_lane_nan_poisons():
    """Note [NaN in emulated lanes]: on SM100 the unmutated twin passes the NaN problem (the
    emulated-column NaN contributes P = 0, the MUFU-column NaN poisons its head), and the
    mutant that turns those NaNs into P = 1 fails it; on SM90 every NaN poisons its head."""
    assert M.twin_module() is not None, "fa4verify.kernels.twin.attention failed to load (fa4verify's own module)"
    p = next(x for x in M.battery("quick") if x.kind == "nan")
    d = M.make_inputs(p, 0)
    for arch in ("sm90", "sm100"):
        base = M.run_twin(d, arch, (), bwd=False)
        env = M.ProblemEnv(data=d, arch=arch, base=base)
        assert columns._v_fwd_budget(env, base).status == "pass", arch
        oc = env.oracle_fwd
        assert oc is not None
        if arch == "sm100":
            assert oc.dropped_keys == (p.nan_cols[0],)
            assert np.isfinite(base.out[:, :, 0]).all() and np.isnan(base.out[:, :, 1]).all()
        else:
            assert oc.dropped_keys == () and np.isnan(base.out).all()
    mut = M.run_twin(d, "sm100", ("nan_to_zero_emulated",), bwd=False)
    env = M.ProblemEnv(data=d, arch="sm100", base=base)
    assert columns._v_fwd_budget(env, mut).status == "fail"
