"""Production FA4 (SM90 path on an H200) forward and backward within the composed error budgets.

Run on a GPU machine: ``pytest -m gpu tests/test_gpu_budget_production.py -s``; each case prints
one line labelled "measured on H200" with the measured/budget tightness.  Without CUDA and FA4
the ``gpu`` marker skips it with the reason (tests/conftest.py).  The grid is the one of ``benchmarks/bench_twin.py --grid`` (bf16; hd 64/128/256; seqlen
128..8192; causal and not; standard-normal, outliers, deeply negative scores, peaked rows).
Forward: ``|out - O_oracle| <= forward_out(stats) + oracle.bound`` and the same for the LSE
(``fa4verify.stages.budgets.check_forward_outputs``).  Backward (seqlen <= 2048; SM90 hd 256
backward is xfail upstream): ``|g - g_oracle| <= backward_g(stats) + oracle.bound`` for dQ, dK, dV
against the exact gradient.  Set ``FA4VERIFY_GPU_BUDGET_SEQLENS`` (comma list) to shrink the grid.
"""
from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.gpu


SEQLENS = [int(x) for x in os.environ.get("FA4VERIFY_GPU_BUDGET_SEQLENS",
                                          "128,512,2048,8192").split(",") if x]
HDIMS = (64, 128, 256)
DISTS = ("normal", "outliers", "negative", "peaked")


@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen", SEQLENS)
@pytest.mark.parametrize("hd", HDIMS)
def test_production_forward_within_composed_budget(hd, seqlen, causal, dist):
    from fa4verify.stages import budgets as A
    from fa4verify.kernels import adapter
    fc, arch = A.production_forward_case(adapter, dist, hdim=hd, seqlen=seqlen, causal=causal,
                                         nheads=2 if seqlen <= 2048 else 1, dtype="bf16", seed=0)
    print(f"[{fc.where}] fwd {arch} hd{hd} L{seqlen} {'causal' if causal else 'full'} {dist}: "
          f"out tightness {fc.out_ratio:.3f} ({fc.out_over} over), lse tightness "
          f"{fc.lse_ratio:.3f} ({fc.lse_over} over), max|err| {fc.max_abs_err:.3g}")
    assert fc.out_over == 0, f"{fc.out_over} output elements over budget (tightness {fc.out_ratio:.3g})"
    assert fc.lse_over == 0, f"{fc.lse_over} LSE rows over budget (tightness {fc.lse_ratio:.3g})"


@pytest.mark.parametrize("dist", ("normal", "outliers"))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen", [s for s in SEQLENS if s <= 2048])
@pytest.mark.parametrize("hd", HDIMS)
def test_production_backward_within_composed_budget(hd, seqlen, causal, dist):
    from fa4verify.stages import budgets as A
    from fa4verify.kernels import adapter
    bc, arch = A.production_backward_case(adapter, dist, hdim=hd, seqlen=seqlen, causal=causal,
                                          nheads=2, dtype="bf16", seed=1)
    print(f"[{bc.where}] bwd {arch} hd{hd} L{seqlen} {'causal' if causal else 'full'} {dist}: "
          f"tightness dQ {bc.ratios['dq']:.3f} dK {bc.ratios['dk']:.3f} dV {bc.ratios['dv']:.3f}; "
          f"rel err dQ {bc.rel_err['dq']:.2e} dK {bc.rel_err['dk']:.2e} dV {bc.rel_err['dv']:.2e}")
    assert not any(bc.over.values()), f"over budget: {bc.over} (tightness {bc.ratios})"
