"""Note [Rule-cut blocks in the mask lists] (fa4verify/problem/calls.py): on SM 10.x FA4's forward
masks only each list's first block among the full ones, so a block-sparse call under a causal or
window rule lists the blocks the rule cuts as mask blocks; the backward and SM90 keep every listed
block full; the twin's forward walks the mask list first, as FA4 does."""
from __future__ import annotations

import types

import numpy as np
import pytest

from fa4verify.oracles.block_sparse import dense_mask
from fa4verify.problem import AttentionProblem, CallForm, ValueSpec
from fa4verify.problem.masks import window_keep_mask

MASKS = [dict(causal=True), dict(window_size=(40, 0)), dict(window_size=(None, 17)), dict(window_size=(30, 50)),
         dict(causal=True, window_size=(100, 0))]
LENGTHS = [(200, 300), (256, 256), (300, 200), (130, 384)]


def _problem(arch="sm100", lengths=(200, 300), keep=0.7, **mask):
    return AttentionProblem(arch=arch, dtype="bf16", batch=2, seqlen_q=lengths[0], seqlen_k=lengths[1], nheads=2,
                            nheads_kv=1, head_dim=64, head_dim_v=64, values=ValueSpec("normal", seed=5),
                            call=CallForm(block_size=(128, 128), block_seed=7, block_keep=keep, block_per_batch=True),
                            **mask)


@pytest.mark.parametrize("lengths", LENGTHS)
@pytest.mark.parametrize("mask", MASKS)
def test_mask_blocks_are_the_cut_blocks_and_the_meaning_is_unchanged(mask, lengths):
    """Brute force per block: a mask block is a listed one where the rule drops an in-bounds pair
    (or the short last key block); the lists FA4 gets (full blocks whole, mask blocks under the
    rule) keep exactly the problem's keep-mask."""
    p = _problem(lengths=lengths, **mask)
    sq, sk = lengths
    rule = window_keep_mask(sq, sk, causal=p.causal, window_size=p.window_size)
    for b in range(p.batch):
        listed = p.call.block_mask(sq, sk, seq=b)
        got = p.rule_mask_blocks(listed, sq, sk)
        for i, j in zip(*np.nonzero(listed)):
            tile = rule[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            tail = sk % 128 and j == (sk - 1) // 128
            assert got[i, j] == bool(not tile.all() or tail), (i, j)
        assert not (got & ~listed).any()
        full = dense_mask(listed & ~got, (128, 128), sq, sk)
        masked = dense_mask(got, (128, 128), sq, sk) & rule
        np.testing.assert_array_equal(full | masked, p.keep_masks()[b])


def test_only_sm100_family_under_a_rule_splits():
    assert _problem(causal=True).rule_blocks_in_mask_lists
    assert _problem(arch="sm103", window_size=(40, 0)).rule_blocks_in_mask_lists
    assert not _problem(arch="sm90", causal=True).rule_blocks_in_mask_lists
    assert not _problem().rule_blocks_in_mask_lists          # no rule: the lists as drawn


@pytest.mark.parametrize("arch", ["sm100", "sm90"])
def test_the_production_target_lists_cut_blocks_as_mask_blocks_in_the_sm100_forward_only(arch):
    from fa4verify.targets import ProductionTarget
    seen = []

    def bst(block_mask, *, batch, nheads, block_size, direction, device, deterministic, partial=None):
        seen.append((direction, None if partial is None else np.asarray(partial)))
        return "tensors"
    stand_in = types.SimpleNamespace(block_sparse_tensors=bst, sm90_bwd_sparse_block_size=lambda d, dv: (128, 128))
    t = ProductionTarget(adapter=stand_in, device="cpu")
    p = _problem(arch=arch, window_size=(40, 0))
    a = {k: np.zeros(1, np.float32) for k in ("q", "k", "v", "dout")}
    a["learnable_sink"] = None
    t._call_kw(p, a)
    t._call_kw(p, a, backward=True)
    (d_f, part_f), (d_b, part_b) = seen
    assert (d_f, d_b) == ("fwd", "bwd") and part_b is None
    if arch == "sm90":
        assert part_f is None
    else:
        want = np.stack([p.rule_mask_blocks(p.call.block_mask(200, 300, seq=b), 200, 300) for b in range(2)])
        assert want.any() and np.array_equal(part_f, want)


def test_the_varlen_lists_split_per_sequence():
    from fa4verify.targets import ProductionTarget
    seen = []

    def bstv(block_masks, *, nheads, block_size, device, partial=None):
        seen.append((block_masks, partial))
        return "tensors"
    stand_in = types.SimpleNamespace(block_sparse_tensors_varlen=bstv)
    t = ProductionTarget(adapter=stand_in, device="cpu")
    p = AttentionProblem(arch="sm100", dtype="bf16", batch=2, seqlens_q=(200, 130), seqlens_k=(300, 384),
                         seqlen_q=200, seqlen_k=384, nheads=2, nheads_kv=2, head_dim=64, head_dim_v=64,
                         window_size=(30, 50), values=ValueSpec("normal", seed=5),
                         call=CallForm(block_size=(128, 128), block_seed=7, block_keep=0.8))
    a = dict(p.materialize())
    t._call_kw(p, a)
    (masks, part), = seen
    for m, pt, (lq, lk) in zip(masks, part, [(200, 300), (130, 384)]):
        np.testing.assert_array_equal(pt, p.rule_mask_blocks(m, lq, lk))


def test_the_twin_forward_walks_full_blocks_then_mask_blocks_each_ascending():
    from fa4verify.judge import keep_pattern
    # every block listed; query block 0 keeps keys [112 + i, 512 + i]: blocks 2 and 3 whole, the
    # others cut or dropped
    p = _problem(lengths=(256, 768), keep=1.0, window_size=(400, 0))
    rw = keep_pattern.rewrite(p, lists=True, walk="sm100_forward")
    rb = keep_pattern.rewrite(p, lists=True)
    listed = p.call.block_mask(256, 768, seq=0)
    cut = p.rule_mask_blocks(listed, 256, 768)
    assert cut[0].tolist() == [True, True, False, False, True, True]
    k0 = 0
    for r, lk in enumerate(rw["seqlens_k"][:2]):       # batch entry 0's two query blocks
        keys = rw["k_index"][k0:k0 + lk, 1]
        want = [c for c in range(6) if listed[r, c] and not cut[r, c]] + [c for c in range(6) if cut[r, c]]
        assert [int(x) // 128 for x in keys[::128]] == want
        k0 += lk
    # the window's left edge cuts lower blocks than the diagonal: the walk differs from index order
    assert not np.array_equal(rw["k_index"], rb["k_index"])
    assert sorted(map(tuple, rw["k_index"])) == sorted(map(tuple, rb["k_index"]))
    with pytest.raises(ValueError, match="walk"):
        keep_pattern.rewrite(p, lists=True, walk="backward")


def test_the_twin_forward_on_causal_lists_equals_the_dense_causal_call():
    """Causal at seqlen_q = seqlen_k with every block listed: the cut blocks are the diagonal ones, the
    highest of each list, so FA4's mask-list-first walk is the dense causal walk; the SM100 twin's
    forward equals the dense causal call's bit for bit (another path to the same arithmetic)."""
    from fa4verify.targets import TwinTarget
    t = TwinTarget()
    p = _problem(lengths=(384, 384), keep=1.0, causal=True)
    d = p.replace(call=None)
    a = p.materialize()
    f, fd = t.forward(p, a), t.forward(d, a)
    np.testing.assert_array_equal(f.out, fd.out)
    np.testing.assert_array_equal(f.lse, fd.lse)


def test_the_twin_on_windowed_lists_stays_inside_the_budgets():
    """Left window: the walk differs from the index order and the twin's sm100 forward on it passes
    the judge against the oracle."""
    from fa4verify.fuzz.properties import check_problem
    from fa4verify.targets import TwinTarget
    p = _problem(lengths=(256, 768), keep=0.8, window_size=(400, 0))
    out = check_problem(p, TwinTarget(), properties=("runs", "fwd_budget", "bwd_budget", "masked_rows"))
    assert {"fwd_budget", "bwd_budget"} <= set(out.ran) and not out.undecided


@pytest.mark.parametrize("mask", [dict(window_size=(400, 0)), dict(causal=True)])
def test_the_twin_masking_as_fa4_fails_the_lists_passed_all_full(mask):
    """The twin masks as FA4's SM 10.x forward does (the rule inside mask blocks and the first full
    block it walks); with every listed block full -- the lists fa4verify passed before, planted as
    ``rule_cut_blocks_listed_full`` -- the cut keys below the first block are attended and the judge
    fails the forward against the oracle; with the rule-cut blocks as mask blocks it passes."""
    from fa4verify.fuzz.properties import check_problem
    from fa4verify.fuzz.violation import Violation
    from fa4verify.targets import TwinTarget
    p = _problem(lengths=(256, 768), keep=0.8, **mask)
    props = ("runs", "fwd_budget", "masked_rows")
    out = check_problem(p, TwinTarget(), properties=props, backward=False)
    assert "fwd_budget" in out.ran and not out.undecided
    with pytest.raises(Violation):
        check_problem(p, TwinTarget(mutations={"rule_cut_blocks_listed_full"}), properties=props, backward=False)
    # SM90 masks every listed block: the planted lists change nothing there
    p90 = p.replace(arch="sm90")
    a = p90.materialize()
    f, g = TwinTarget().forward(p90, a), TwinTarget(mutations={"rule_cut_blocks_listed_full"}).forward(p90, a)
    np.testing.assert_array_equal(f.out, g.out)


def test_mask_blocks_against_the_dense_rule_on_random_windows_lengths_and_blocks():
    """The corner test of :meth:`AttentionProblem.rule_mask_blocks` against the dense keep-mask, block
    by block, over 300 random (lengths, block size, causal, window with None / negative sides)."""
    rng = np.random.default_rng(34)
    side = lambda: None if rng.random() < 0.3 else int(rng.integers(-40, 400))   # noqa: E731
    for _ in range(300):
        sq, sk = (int(x) for x in rng.integers(1, 700, 2))
        bq, bk = (int(rng.choice([64, 128, 256])) for _ in range(2))
        causal = bool(rng.random() < 0.4)
        ws = (side(), side()) if not causal or rng.random() < 0.5 else (None, None)
        try:
            p = AttentionProblem(arch="sm100", dtype="bf16", batch=1, seqlen_q=sq, seqlen_k=sk, nheads=1,
                                 nheads_kv=1, head_dim=64, head_dim_v=64, causal=causal, window_size=ws,
                                 call=CallForm(block_size=(bq, bk), block_seed=1, block_keep=1.0))
        except ValueError:
            continue          # a window FA4 refuses
        rule = np.zeros((-(-sq // bq) * bq, -(-sk // bk) * bk), bool)
        inb = np.zeros_like(rule)
        rule[:sq, :sk] = window_keep_mask(sq, sk, causal=causal, window_size=p.window_size)
        inb[:sq, :sk] = True
        whole = (rule | ~inb).reshape(rule.shape[0] // bq, bq, rule.shape[1] // bk, bk).all(axis=(1, 3))
        want = ~whole
        if sk % bk:
            want[:, (sk - 1) // bk] = True
        listed = np.ones(whole.shape, bool)
        np.testing.assert_array_equal(p.rule_mask_blocks(listed, sq, sk), want, err_msg=f"{sq, sk, bq, bk, causal, ws}")
