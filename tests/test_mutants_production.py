"""Production column of the mutant suite (``fa4verify mutants --target production``): on a GPU,
FA4 itself must pass every fa4verify verifier (zero false alarms), and the faults a caller can
express through FA4's API (``PRODUCTION_KNOBS``) are reported. Figures: "measured on <GPU>"."""
from __future__ import annotations

import pytest

from fa4verify import mutants as M


def _gpu_or_skip():
    try:
        import torch
    except ImportError as exc:  # pragma: no cover
        pytest.skip(f"no CUDA device: torch not importable ({exc})")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: torch.cuda.is_available() is False")
    try:
        M.production_arch()
    except M.Unavailable as exc:
        pytest.skip(str(exc))


def test_knob_mutants_apply_only_where_they_change_the_call():
    ps = {p.name: p for p in M.battery("quick")}
    top = M.get_mutant("causal_top_left")
    assert M.production_applies(top, ps["causal_sq_lt_sk"])
    assert not M.production_applies(top, ps["tile_edge"])
    tail = M.get_mutant("tail_tile_dropped")
    assert M.production_applies(tail, ps["tile_edge"])
    assert not M.production_applies(tail, ps["causal_sq_lt_sk"])
    assert not M.production_applies(M.get_mutant("p_cast_rz"), ps["tile_edge"])


@pytest.mark.gpu
def test_production_fa4_raises_no_false_alarm_and_knob_mutants_are_reported(tmp_path):
    _gpu_or_skip()
    res = M.run_suite("quick", target="production")
    assert res.where.startswith("measured on ")
    fa = res.false_alarms()
    fa4 = {v: [(r.problem, r.detail) for r in rows] for v, rows in fa.items()
           if rows and M._spec(v).group == "fa4verify"}
    assert not fa4, fa4
    assert set(res.mutants) == set(M.PRODUCTION_KNOBS)
    M.write_json(res, str(tmp_path / "mutants_production.json"))
    for m in res.mutants:
        cell, _ = res.fa4verify_cell(m)
        assert cell.status in ("caught", "missed"), (m, cell)
    for m in ("causal_top_left", "causal_off_by_one", "tail_tile_dropped"):
        assert res.fa4verify_cell(m)[0].status == "caught", (m, res.fa4verify_cell(m))
