"""The SM90 backward tile fa4verify reads (``kernels.facts.sm90_bwd_tile``) is FA4's own
(``_tile_size_bwd_sm90`` of the installed release), block-sparse calls included; the CPU twin's
backward of a block-sparse call takes it (red-team review, thirty-third session: the twin had the
dense table without the rule, 80 x 128 and 64 x 48 where FA4 runs 64 x 128 and 64 x 64)."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify.kernels import facts


@pytest.mark.fa4
def test_the_sm90_backward_tile_is_fa4s_for_every_head_dim_rule_and_sparse_q_block():
    from flash_attn.cute import interface
    checked = 0
    for hd in range(8, 257, 8):
        for hdv in sorted({hd, 64, 128, 256}):
            if hdv > 256:
                continue
            for causal, local in ((False, False), (True, False), (False, True)):
                for sq in (None, 64, 128, 192, 256):
                    cfg = interface._tile_size_bwd_sm90(hd, hdv, causal, local, sparse_block_size_q=sq)
                    assert facts.sm90_bwd_tile(hd, hdv, causal, local, sq) == (cfg.m_block_size, cfg.n_block_size), \
                        (hd, hdv, causal, local, sq)
                    checked += 1
    assert checked > 1000


def test_the_twin_backward_of_block_lists_takes_fa4s_sparse_tile(monkeypatch):
    """A block-sparse call at hd 256 under causal: FA4's backward tile is 64 x 64 (its KV block),
    which the twin's backward now runs; the dense table's 64 x 48 was what it ran before."""
    from fa4verify.kernels.twin import backward as tb
    from fa4verify.problem import AttentionProblem, CallForm, ValueSpec
    from fa4verify.targets import TwinTarget
    seen = []
    real = tb.sm90_bwd_tile

    def spy(*args):
        seen.append(real(*args))
        return seen[-1]
    monkeypatch.setattr(tb, "sm90_bwd_tile", spy)
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=128, seqlen_k=128, nheads=1, nheads_kv=1,
                         head_dim=256, head_dim_v=256, causal=True, values=ValueSpec("normal", 3),
                         call=CallForm(block_size=(64, 64), block_seed=1, block_keep=1.0))
    p.call.validate(p)
    a = p.materialize()
    t = TwinTarget()
    g = t.backward(p, a, t.forward(p, a))
    assert seen and set(seen) == {(64, 64)}
    assert np.isfinite(g.dq).all()
