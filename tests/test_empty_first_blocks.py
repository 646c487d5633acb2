"""Note [Rows empty in the first blocks] (fa4verify.coverage.cases._empty_first_blocks_edges): on a
forward tile taller than wide, the first rows of an unpacked causal M tile can meet no key in the
first two KV tiles it processes; the edges built for it pass on the clean twin and fail with the
twin's model of source mutant causal_loop_check_inf_local_only, and the rows the twin turns NaN are
the rows rows_without_early_keys counts (an independent walk of the twin's own block loop)."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify.checks.coverage import PLAN_PROPERTIES
from fa4verify.coverage.cases import edge_problems, rows_without_early_keys
from fa4verify.coverage.space import space_for
from fa4verify.fuzz import check_problem
from fa4verify.fuzz.violation import Violation
from fa4verify.targets import TwinTarget
from fa4verify.kernels import facts


def _edges(arch):
    return {n: (p, b) for n, p, b in edge_problems(space_for(arch, "bf16")) if n.startswith("empty_first_blocks")}


def test_every_tall_causal_tile_of_sm90_has_its_edge():
    sp = space_for("sm90", "bf16")
    want = set()
    for mask in ("causal", "causal_left"):
        local = mask == "causal_left"
        for name in sp.values["hd"]:
            if sp.why_not({"hd": name, "mask": mask, "form": "dense"}) is None:
                tm, tn = facts.fwd_tile("sm90", "bf16", *sp.hd[name], not local, local)
                if tm > tn:
                    want.add(f"empty_first_blocks_{tm}x{tn}" + ("_left" if local else ""))
    got = _edges("sm90")
    assert want and set(got) == want
    for n, (p, bwd) in got.items():
        assert bwd and p.causal and p.nheads == p.nheads_kv and p.seqlen_k == p.seqlen_q + 1
    assert "empty_first_blocks_192x128" in got and "empty_first_blocks_128x80" in got


def test_square_tiles_get_none():
    assert not _edges("sm100")          # FA4's SM100 forward tile is 128 x 128 (or wider)


def test_the_row_count_by_hand():
    # 192 x 128 tile, 384 queries, 385 keys: M tile 1 (rows 192..383) starts at KV tile 3 (key 384
    # alone), then tile 2 (256..383); rows 192..254 see keys <= 255 only
    assert rows_without_early_keys((192, 128), 384, 385) == 63
    assert rows_without_early_keys((128, 128), 384, 385) == 0          # a square tile never has one
    assert rows_without_early_keys((192, 128), 384, 385, blocks=3) == 0
    # a left window: rows see [r + 1 - 128, r + 1]
    assert rows_without_early_keys((192, 128), 384, 385, window_left=128) == 63


@pytest.mark.parametrize("edge", ["empty_first_blocks_192x128", "empty_first_blocks_128x80"])
def test_the_edge_passes_clean_and_fails_the_dropped_check(edge):
    p, _bwd = _edges("sm90")[edge]
    check_problem(p, TwinTarget(), properties=PLAN_PROPERTIES, backward=False)
    with pytest.raises(Violation):
        check_problem(p, TwinTarget(["check_inf_dropped_causal"]), properties=PLAN_PROPERTIES, backward=False)


def test_the_twin_turns_exactly_the_counted_rows_nan():
    p, _ = _edges("sm90")["empty_first_blocks_192x128"]
    o = np.asarray(TwinTarget(["check_inf_dropped_causal"]).forward(p, p.materialize()).out, np.float64)
    bad = np.isnan(o).any(axis=-1)                        # (b, s, h)
    tiles = facts.fwd_tile("sm90", "bf16", p.head_dim, p.head_dim_v, True, False)
    assert bad.sum() == p.nheads * rows_without_early_keys(tiles, p.seqlen_q, p.seqlen_k) == 2 * 63
