"""The mutant catalogue and the problem battery of ``fa4verify mutants`` (fa4verify/mutants.py):
the catalogue names what the twin implements, and every battery problem does what its note says
(a problem that stopped exposing its fault would silently turn a detection into a miss)."""
from __future__ import annotations

import numpy as np

from fa4verify import mutants as M

ISSUE_MUTANTS = ("poly_degree_2", "poly_coeff_ulp", "p_cast_rz", "rescale_skipped",
                 "fp8_old_threshold", "nan_to_zero_emulated", "causal_top_left",
                 "causal_off_by_one", "tail_tile_dropped", "row_sum_rounded_p",
                 "rcp_low_precision", "d_from_fp32_o", "dq_shuffled_order")


def _twin():
    tw = M.twin_module()
    assert tw is not None, "fa4verify.kernels.twin.attention failed to load (fa4verify's own module)"
    return tw


def test_catalogue_is_the_issue_list_in_order():
    assert M.MUTANT_NAMES == ISSUE_MUTANTS
    assert len(set(M.MUTANT_NAMES)) == len(M.MUTANT_NAMES)


def test_every_catalogued_mutant_is_implemented_by_the_twin():
    tw = _twin()
    missing = [n for n in M.MUTANT_NAMES if n not in tw.MUTATIONS]
    assert not missing, f"not implemented in the twin: {missing}"


def test_production_knobs_only_for_api_expressible_faults():
    """Only faults a caller can produce through FA4's public API have a production knob."""
    assert set(M.PRODUCTION_KNOBS) == {"causal_top_left", "causal_off_by_one",
                                       "tail_tile_dropped", "dq_shuffled_order"}


def test_battery_inputs_are_deterministic_and_representable():
    from fa4verify.oracles import binary32 as b32
    for p in M.battery("full"):
        a, b = M.make_inputs(p, seed=5), M.make_inputs(p, seed=5)
        for x, y in ((a.q, b.q), (a.k, b.k), (a.v, b.v), (a.dout, b.dout)):
            assert np.array_equal(x, y, equal_nan=True)
        fin = np.isfinite(a.k)
        rnd = b32.to_bf16 if p.dtype == "bf16" else b32.to_fp8_e4m3fn
        for x in (a.q, a.v):
            assert np.array_equal(rnd(x), x)
        assert np.array_equal(rnd(a.k)[fin], a.k[fin])
        assert np.array_equal(b32.to_bf16(a.dout), a.dout)
    assert not np.array_equal(M.make_inputs(M.battery()[0], 1).q, M.make_inputs(M.battery()[0], 2).q)


def test_battery_covers_the_edges_the_issue_names():
    ps = M.battery("quick")
    assert any(p.seqlen_k % 128 for p in ps), "a partial KV tile"
    assert any(p.seqlen_q != p.seqlen_k and p.causal and p.seqlen_q < p.seqlen_k for p in ps)
    assert any(p.causal and p.seqlen_q > p.seqlen_k for p in ps)
    assert any(p.kind == "peaked" and min(p.growth) < 8 < max(p.growth) for p in ps)
    assert any(p.kind == "nan" for p in ps)
    assert any(p.dtype == "fp8" for p in ps)


def test_peaked_rows_rescale_exactly_when_growth_exceeds_the_threshold():
    """On the SM100 twin, rows whose max grows by more than 8 log2 units per tile are rescaled,
    rows growing by less are not (unless a warp neighbour forces the vote); the peak P reaches
    about 2^growth for sub-threshold rows."""
    tw = _twin()
    p = next(x for x in M.battery("quick") if x.name == "peaked_rescale")
    d = M.make_inputs(p, 0)
    r = tw.forward(d.q, d.k, d.v, arch="sm100", dtype="bf16")
    groups = np.arange(p.seqlen_q) % len(p.growth)
    pmax = r.stages["p_max"][0, 0]
    for j, g in enumerate(p.growth):
        sel = groups == j
        if g < 8:
            # the first-visited tile's own max is noise (|x| < ~0.02 log2 units); bf16 keys
            # round the peak by < 2^-8 relative
            assert np.all(np.abs(np.log2(pmax[sel]) - g) < 0.06), (g, pmax[sel])
        else:
            assert np.all(pmax[sel] <= 1.01), (g, pmax[sel])
    # growth above the threshold forces a rescale in every row of those groups
    n = r.stages["n_rescale"][0, 0]
    assert np.all(n[np.isin(groups, [j for j, g in enumerate(p.growth) if g > 8])] >= 1)


def test_fp8_peaks_stay_below_the_old_threshold():
    """fp8_peaked: growth below 4 log2 units, where FA #2577's threshold 4 skipped the rescale."""
    tw = _twin()
    p = next(x for x in M.battery("quick") if x.name == "fp8_peaked")
    d = M.make_inputs(p, 0)
    base = tw.forward(d.q, d.k, d.v, arch="sm100", dtype="fp8")
    old = tw.forward(d.q, d.k, d.v, arch="sm100", dtype="fp8",
                     mutations={"fp8_old_threshold"})
    assert base.stages["p_max"].max() <= 256.0
    assert old.stages["p_max"].max() > 448.0  # beyond e4m3's largest finite value


def test_nan_problem_puts_one_nan_key_in_an_emulated_and_one_in_a_mufu_column():
    from fa4verify.kernels.twin import emulated_columns
    p = next(x for x in M.battery("quick") if x.name == "nan_scores")
    emu = emulated_columns(head_dim=p.head_dim, causal=p.causal)
    assert emu[p.nan_cols[0]] and not emu[p.nan_cols[1]]
    d = M.make_inputs(p, 0)
    assert np.isnan(d.k[:, p.nan_cols[0], 0]).any() and np.isnan(d.k[:, p.nan_cols[1], 1]).any()
    assert np.isfinite(d.q).all() and np.isfinite(d.v).all()
