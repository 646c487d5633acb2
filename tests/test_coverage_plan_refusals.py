"""The plan never rests a backward tuple on a row whose backward FA4 cannot build (on the H200,
seed 2: the only dense / no-mask row had head dim 104, whose SM90 backward does not compile, so
coverage.production reported the (dense, none, bwd) hole, undecided)."""
from __future__ import annotations

import pytest

from fa4verify.coverage import planner
from fa4verify.coverage.space import is_local, space_for
from fa4verify.kernels.features import sm90_bwd_does_not_build


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_no_planned_backward_runs_where_fa4s_sm90_backward_does_not_build(seed):
    space = space_for("sm90", "bf16")
    pl = planner.plan(space, seed=seed)
    assert not pl.uncoverable
    for row in pl.rows:
        hd, mask = space.hd[row["hd"]], row["mask"]
        if sm90_bwd_does_not_build(*hd, mask in ("causal", "causal_left"), is_local(mask)):
            assert "bwd" not in space.passes(row), row
    cov = planner.coverage(space, pl.rows)
    assert not cov["holes"], cov["holes"]


def test_the_rule_is_what_the_sweep_measured():
    assert sm90_bwd_does_not_build(104, 104, False, False) and sm90_bwd_does_not_build(112, 112, False, False)
    assert not sm90_bwd_does_not_build(104, 104, True, False)      # causal: m_block 64, not measured
    assert not sm90_bwd_does_not_build(96, 96, False, False) and not sm90_bwd_does_not_build(128, 128, False, False)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_forward_only_row_never_asks_fa4_for_a_backward(seed):
    """H200, FA4 4.0.0b36, seeds 0-2 (main 39c3549): a block-sparse row at head dim 104 (no SM90
    backward builds there, so the space runs it forward only and keeps det=on) called FA4's
    deterministic backward anyway; FA4 refused the call ("Deterministic not implemented for
    block-sparse backward") and the row's forward pairs became holes: coverage undecided."""
    from fa4verify.checks.coverage import row_backward
    space = space_for("sm90", "bf16")
    rows = planner.plan(space, seed=seed).rows
    bwd = row_backward(space, rows)
    for i, row in enumerate(rows):
        assert bwd[i] == ("bwd" in space.passes(row))
        if row["form"] == "block_sparse" and row["det"] == "on":
            assert not bwd[i], row
    assert any(r["form"] == "block_sparse" and r["det"] == "on" for r in rows)   # the case the GPU met


def test_a_case_without_backward_never_calls_the_targets_backward(monkeypatch):
    from fa4verify.checks import fuzz as cf
    from fa4verify.problem import AttentionProblem
    from fa4verify.targets import TwinTarget

    class NoBackward(TwinTarget):
        def backward(self, *a, **k):
            raise AssertionError("the backward of a forward-only row was called")

    monkeypatch.setattr(cf, "_target", lambda name: NoBackward())
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=17, seqlen_k=33, nheads=1,
                         nheads_kv=1, head_dim=64, head_dim_v=64)
    head = {"arch": "sm90", "profile": "ci", "seed": 0, "where": "CPU twin", "extra": {}, "properties": None,
            "deadline": None}
    out = cf.run_example(None, cf.DrawnCase(0, p, "twin", head, True, False))["outcome"]
    assert out["status"] == "ran", out
    called = cf.run_example(None, cf.DrawnCase(0, p, "twin", head, True, True))["outcome"]   # the control
    assert called["status"] == "violation" and "forward-only row was called" in called["failure"]["message"]


@pytest.fixture
def fresh_rules():
    from fa4verify.kernels import facts
    facts._source_defines.cache_clear()
    yield
    facts._source_defines.cache_clear()


@pytest.mark.parametrize("has_fit", [True, False])
def test_the_sparse_kv_rule_is_read_from_the_release_that_runs(tmp_path, monkeypatch, fresh_rules, has_fit):
    """4.0.0b33 added ``_fit_sm90_fwd_tile_to_block_sparsity``; b30..b32 (measured on the H200:
    "Block sparsity requires sparse_block_size[1] to be a multiple of tile_n") have none."""
    from fa4verify.kernels import fa4_params, facts
    for f in ("utils.py", "flash_fwd_sm100.py"):
        (tmp_path / f).write_text("")
    fit = ("def _fit_sm90_fwd_tile_to_block_sparsity(cfg, sparse_block_size_q, sparse_block_size_kv):\n"
           "    return cfg\n") if has_fit else ""
    (tmp_path / "interface.py").write_text("def _tile_size_fwd_sm90(head_dim, head_dim_v, c, l, q=None):\n"
                                           "    return None\n" + fit)
    monkeypatch.setattr(fa4_params, "fa4_source_dir", lambda: tmp_path)
    assert facts.sm90_fwd_fits_sparse_kv() is has_fit


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_before_b33_a_block_sparse_row_takes_the_forward_block_and_runs_forward_only_where_tiles_differ(
        monkeypatch, seed):
    """On b31/b32 (H200, 2026-12-02) 21 coverage holes came from block-sparse rows on the backward's
    block, which those releases' SM90 forward refuses. With their rule the plan gives such a row the
    forward's block and no backward, and still covers every supported tuple."""
    from fa4verify.coverage import cases
    from fa4verify.kernels import facts
    from fa4verify.checks.coverage import row_backward
    monkeypatch.setattr(facts, "sm90_fwd_fits_sparse_kv", lambda: False)
    space = space_for("sm90", "bf16")
    pl = planner.plan(space, seed=seed)
    rows, problems = cases.plan_problems(space, pl.rows, seed=seed)
    bwd = row_backward(space, rows)
    seen = set()
    for i, (row, p) in enumerate(zip(rows, problems)):
        if row["form"] != "block_sparse":
            continue
        hd, hdv = space.hd[row["hd"]]
        # a causal or windowed row takes the forward's masked tile (Note [Block lists with causal
        # or a window]); the plan's backward rule reads the unmasked one
        from fa4verify.coverage.space import is_local
        causal, local = row["mask"] == "causal", is_local(row["mask"])
        fwd_n = cases.sm90_fwd_sparse_tile_n(hd, hdv, False, False)
        bwd_n = cases.sm90_bwd_sparse_block(hd, hdv)[1]
        assert fwd_n == (128 if hd <= 128 else facts.sm90_fwd_tile(hd, hdv, False, False)[1])   # b32's table
        assert p.call.block_size[1] == cases.sm90_fwd_sparse_tile_n(hd, hdv, causal, local), (row, p.call.block_size)
        # b32's tiles; FA4's SM90 GQA backward needs hd == hdv; at hd 104 / 112 it builds with a
        # causal or window mask only
        builds = hd not in (104, 112) or row["mask"] != "none"
        if bwd[i]:
            assert p.call.block_size[1] == bwd_n, row        # one block mask serves both passes
        assert bwd[i] == (fwd_n == bwd_n and builds and hd <= 128
                          and (hd == hdv or row["gqa"] == "1")), row
        seen.add(fwd_n == bwd_n)
    assert not planner.coverage(space, rows)["holes"]
    assert seen == {True, False}, seen      # both kinds of row planned: shared block and forward-only


@pytest.mark.parametrize("takes_sink", [True, False])
def test_the_sink_backward_rule_is_read_from_the_release_that_runs(tmp_path, monkeypatch, takes_sink):
    """4.0.0b26 added ``learnable_sink`` to ``_flash_attn_bwd``; 4.0.0b20..b25 have a sink in the
    forward only (on the H200, 2026-12-03, b23..b25: 242 coverage holes from sink rows whose
    backward the adapter refused, named)."""
    from fa4verify.kernels import fa4_params, facts
    sink = ", learnable_sink=None" if takes_sink else ""
    (tmp_path / "interface.py").write_text(f"def _flash_attn_bwd(q, k, v, out, dout, lse, causal=False{sink}):\n"
                                           "    return None\n")
    monkeypatch.setattr(fa4_params, "fa4_source_dir", lambda: tmp_path)
    facts.parsed_source.cache_clear()
    try:
        assert facts.bwd_takes_sink() is takes_sink
    finally:
        facts.parsed_source.cache_clear()


@pytest.mark.parametrize("seed", [0, 1])
def test_without_a_sink_backward_sink_rows_run_forward_only_and_nothing_is_a_hole(monkeypatch, seed):
    from fa4verify.checks.coverage import row_backward
    from fa4verify.kernels import facts
    monkeypatch.setattr(facts, "bwd_takes_sink", lambda: False)
    space = space_for("sm90", "bf16")
    pl = planner.plan(space, seed=seed)
    assert not pl.uncoverable
    bwd = row_backward(space, pl.rows)
    assert {r["sink"] for r in pl.rows} == {"off", "fp32", "bf16"}   # the forward still covers the sink
    for i, row in enumerate(pl.rows):
        if row["sink"] != "off":
            assert not bwd[i] and row["det"] == "on", row     # det=off is a backward setting
    cov = planner.coverage(space, pl.rows)
    assert not cov["holes"], cov["holes"]
    _, why = planner.required_tuples(space)
    assert "learnable_sink" in why[(("det", "off"), ("sink", "fp32"))]
    assert "learnable_sink" in why[(("det", "off"), ("sink", "bf16"))]


@pytest.mark.parametrize("refuses", [True, False])
def test_the_varlen_score_mod_backward_rule_is_read_from_the_release_that_runs(tmp_path, monkeypatch, refuses):
    from fa4verify.kernels import fa4_params, facts
    body = ('    assert cu_seqlens_q is None and cu_seqlens_k is None, (\n'
            '        "varlen + score_mod not supported in bwd yet"\n    )\n') if refuses else "    pass\n"
    (tmp_path / "interface.py").write_text("def _flash_attn_bwd(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None):\n"
                                           + body)
    monkeypatch.setattr(fa4_params, "fa4_source_dir", lambda: tmp_path)
    facts._source_contains.cache_clear()
    try:
        assert facts.bwd_takes_varlen_score_mod() is not refuses
    finally:
        facts._source_contains.cache_clear()


@pytest.mark.parametrize("seed", [0, 1])
def test_without_a_varlen_score_mod_backward_varlen_softcap_rows_run_forward_only(monkeypatch, seed):
    """4.0.0b20..b23 on the H200 (2026-12-03): 13 planned rows refused by FA4 ("varlen + score_mod
    not supported in bwd yet"; softcap is a score_mod there), 67 holes. With the release's rule
    those rows run forward only and every supported tuple is still covered."""
    from fa4verify.checks.coverage import row_backward
    from fa4verify.coverage import cases
    from fa4verify.kernels import facts
    monkeypatch.setattr(facts, "bwd_takes_varlen_score_mod", lambda: False)
    space = space_for("sm90", "bf16")
    pl = planner.plan(space, seed=seed)
    assert not pl.uncoverable
    rows, problems = cases.plan_problems(space, pl.rows, seed=seed)
    bwd = row_backward(space, rows)
    hit = 0
    for i, (row, p) in enumerate(zip(rows, problems)):
        score = p.softcap or (p.mods and p.mod_pairs()[0] is not None)      # FA4's score_mod, softcap included
        if score and p.seqlens_q is not None and not (p.call and p.call.seqused_q):   # cu_seqlens
            assert not bwd[i], row
            hit += 1
    assert hit
    assert any(bwd[i] and r["softcap"] == "on" for i, r in enumerate(rows))   # dense softcap rows keep it
    assert not planner.coverage(space, rows)["holes"]
