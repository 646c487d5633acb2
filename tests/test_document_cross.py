"""Note [Aux indices by side] (fa4verify.coverage.cases._mod_edges): the document pair reads the
queries' document ids at query indices and the keys' at key indices, on calls of either length;
the edges document_more_keys / document_more_queries are calls where an index wrapped at the other
side's length (the tenth red-team round's mask.py faults) reads another entry, and the oracle's
answer under that wrap differs far beyond any budget."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify import mods
from fa4verify.coverage.cases import edge_problems
from fa4verify.coverage.space import space_for
from fa4verify.judge.attention import oracle_forward
from fa4verify.kernels.mods import ModShape


def test_documents_cover_the_same_share_of_both_sides():
    pair = mods.get("document")
    for sq, sk in ((8, 8), (97, 328), (328, 97), (1, 40), (40, 1), (0, 5)):
        q_ids, k_ids = pair.make_aux(ModShape(3, 2, sq, sk), seed=11)
        assert q_ids.shape == (3, sq) and k_ids.shape == (3, sk)
        for b in range(3):
            for ids in (q_ids[b], k_ids[b]):
                assert (np.diff(ids) >= 0).all()
            if sq == sk:
                assert (q_ids[b] == k_ids[b]).all()          # self-attention: one set of ids
            if min(sq, sk) >= 8:
                # the document of relative position x is the same on both sides (to a position)
                x = np.linspace(0, 0.999, 50)
                qd = q_ids[b][(x * sq).astype(int)]
                kd = k_ids[b][(x * sk).astype(int)]
                assert np.abs(qd.astype(int) - kd.astype(int)).max() <= 1


@pytest.mark.parametrize("edge", ["document_more_keys", "document_more_queries"])
def test_an_index_wrapped_at_the_other_length_changes_the_answer(edge):
    got = {n: (p, b) for n, p, b in edge_problems(space_for("sm90", "bf16"))}
    p, bwd = got[edge]
    assert bwd and p.mods == ("document",) and p.seqlen_q != p.seqlen_k
    a = p.materialize()
    q_ids, k_ids = mods.aux_for(p, mods.get("document"))
    sq, sk = p.seqlen_q, p.seqlen_k
    if sk > sq:      # the key index wrapped at seqlen_q
        wrapped = [q_ids, k_ids[:, np.arange(sk) % sq]]
    else:            # the query index wrapped at seqlen_k
        wrapped = [q_ids[:, np.arange(sq) % sk], k_ids]
    right = oracle_forward(p, a)
    wrong = oracle_forward(p, dict(a, mod_aux={"document": wrapped}))
    same = oracle_forward(p, dict(a, mod_aux={"document": [q_ids, k_ids]}))
    assert np.array_equal(np.nan_to_num(right.out), np.nan_to_num(same.out))
    assert np.nanmax(np.abs(np.nan_to_num(wrong.out) - np.nan_to_num(right.out))) > 0.1
