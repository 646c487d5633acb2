"""The class of red-team round 12's F2 (a backward handing the score pair a wrong argument while
everything else is right; docs/results/redteam16/): the edges ``score_head_mha`` and
``score_scalars_bwd`` are shown able to see it -- the float64 model of such a backward
(``fa4verify.fuzz.defect_models.model_backward``), rounded to bf16, fails the judge, and the right
backward passes the same judge."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify import mods
from fa4verify.fuzz import defect_models as dm
from fa4verify.kernels.mods import AuxValues


def _edge(name):
    from fa4verify.coverage.cases import edge_problems
    from fa4verify.coverage.space import registered_pairs, space_for
    score, mask, mask_bwd = registered_pairs()
    sp = space_for("sm90", "bf16", score_pairs=score, mask_pairs=mask, mask_pairs_bwd=mask_bwd)
    return next((p, b) for n, p, b in edge_problems(sp) if n == name)


def _bf16(x):
    import ml_dtypes
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def _judged(p, a, score_bwd):
    from fa4verify.judge import judge_backward, judge_forward
    from fa4verify.judge.attention import oracle_forward
    keep = dm._keeps(p, a)
    g = dm.model_backward(p, a, a["dout"], None, keep_fwd=keep, keep_bwd=keep,
                          score_fwd=dm._plain_score(p, a), score_bwd=score_bwd)
    o = oracle_forward(p, a)
    j = judge_forward(p, a, _bf16(o.out), o.lse)
    jb = judge_backward(p, a, _bf16(g["dq"]), _bf16(g["dk"]), _bf16(g["dv"]), forward=j)
    return [v.status for v in jb.verdicts]


@pytest.mark.parametrize("shift", [1, 4])
def test_score_head_mha_sees_a_score_mod_bwd_handed_another_head(shift):
    p, bwd = _edge("score_head_mha")
    assert bwd and p.nheads == p.nheads_kv == 8 and p.mods == ("head_scale",)
    p = p.replace(seqlen_q=40, seqlen_k=40)         # the same heads, a CPU-sized oracle
    a = p.materialize()
    pair = mods.get("head_scale")
    aux = mods.aux_for(p, pair, a)
    assert len(set(aux[0].tolist())) == 8            # every head its own temperature
    ki = np.arange(p.seqlen_k)[None, :]

    def wrong(b, h, rows, x):
        qi = rows[:, None]
        y = np.broadcast_to(pair.ref(x.copy(), b, h, qi, ki, aux), x.shape)
        return y, np.broadcast_to(pair.grad(x.copy(), b, (h + shift) % p.nheads, qi, ki, aux), x.shape)
    assert "fail" in _judged(p, a, wrong)
    assert set(_judged(p, a, dm._plain_score(p, a))) == {"pass"}


def test_score_scalars_bwd_sees_a_backward_recomputing_without_the_scalars():
    p, bwd = _edge("score_scalars_bwd")
    assert bwd and p.nheads == p.nheads_kv and p.mods == ("scalar_bias",)
    a = p.materialize()
    pair = mods.get("scalar_bias")
    aux = mods.aux_for(p, pair, a)
    assert all(s != 0 for s in aux.scalars)
    none = AuxValues(list(aux), (0.0, 0.0), aux.constants, aux.seqlens)
    ki = np.arange(p.seqlen_k)[None, :]

    def dropped(b, h, rows, x):            # the backward's S recomputation without the scalars
        qi = rows[:, None]
        return (np.broadcast_to(pair.ref(x.copy(), b, h, qi, ki, none), x.shape),
                np.broadcast_to(pair.grad(x.copy(), b, h, qi, ki, none), x.shape))
    assert "fail" in _judged(p, a, dropped)
    assert set(_judged(p, a, dm._plain_score(p, a))) == {"pass"}


def test_score_bwd_indices_tiles_sees_tile_local_query_indices_in_the_backward():
    """``rel_scale``'s derivative reads ``kv - q`` within its radius: on three backward M tiles
    and a bit, a backward that hands score_mod_bwd tile-local query indices (the M block's offset
    dropped) moves the band in every tile past the first."""
    from fa4verify.kernels import facts
    p, bwd = _edge("score_bwd_indices_tiles")
    tmb = facts.sm90_bwd_tile(p.head_dim, p.head_dim_v, False, False)[0]
    assert bwd and p.seqlen_q > 3 * tmb and p.nheads == p.nheads_kv
    a = p.materialize()
    pair = mods.get("rel_scale")
    aux = mods.aux_for(p, pair, a)
    ki = np.arange(p.seqlen_k)[None, :]

    def local(b, h, rows, x):
        qi = rows[:, None]
        return (np.broadcast_to(pair.ref(x.copy(), b, h, qi, ki, aux), x.shape),
                np.broadcast_to(pair.grad(x.copy(), b, h, qi % tmb, ki, aux), x.shape))
    assert "fail" in _judged(p, a, local)
    assert set(_judged(p, a, dm._plain_score(p, a))) == {"pass"}
