"""Split-KV as a call form (Note [Split-KV as a call form], fa4verify.judge.split_combine): FA4's
cut of the keys, the twin's split forward judged end to end, planted faults caught, production's
partial capture and its model check. CPU only (the B200 runs it; compile-only here)."""
from __future__ import annotations

import types

import numpy as np
import pytest

from fa4verify.errors import HarnessError
from fa4verify.fuzz.properties import check_problem
from fa4verify.fuzz.violation import Violation
from fa4verify.kernels import facts
from fa4verify.problem import AttentionProblem, CallForm
from fa4verify.targets import TwinTarget, _check_split_model, split_kv_unmodelled

PROPS = ("runs", "fwd_budget", "finite", "masked_rows", "batch_invariance", "gqa_repeat", "key_permutation")


def _p(sk=3 * 128 + 7, S=3, sink=False, hd=64, **kw):
    return AttentionProblem(arch="sm100", dtype="bf16", batch=2, seqlen_q=33, seqlen_k=sk, nheads=4, nheads_kv=2,
                            head_dim=hd, head_dim_v=hd, sink=sink, call=CallForm(num_splits=S), **kw)


def test_key_ranges_are_fa4s_cut_in_whole_tiles():
    tn = facts.fwd_tile("sm100", "bf16", 64, 64, False, False)[1]
    # 4 tiles in 3 splits: 2 per split, the last split has none (LSE -inf)
    assert facts.split_kv_key_ranges("sm100", "bf16", 64, 64, 3 * tn + 7, 3) == \
        ((0, 2 * tn), (2 * tn, 3 * tn + 7), (3 * tn + 7, 3 * tn + 7))
    assert facts.split_kv_key_ranges("sm100", "bf16", 64, 64, 5, 2) == ((0, 5), (5, 5))
    assert facts.split_kv_key_ranges("sm100", "bf16", 64, 64, 4 * tn, 2) == ((0, 2 * tn), (2 * tn, 4 * tn))
    for bad in (dict(causal=True), dict(local=True)):
        with pytest.raises(ValueError, match="per query tile"):
            facts.split_kv_key_ranges("sm100", "bf16", 64, 64, 300, 2, **bad)
    with pytest.raises(ValueError, match="hd != hdv"):
        facts.split_kv_key_ranges("sm100", "bf16", 192, 128, 300, 2)
    with pytest.raises(ValueError, match="SM90"):
        facts.split_kv_key_ranges("sm90", "bf16", 64, 64, 300, 2)


def test_the_cut_is_the_installed_fa4s():
    """The rule the model follows, as the installed FA4's block_info.py writes it."""
    import pathlib
    try:
        import flash_attn.cute.block_info as bi
    except Exception:  # noqa: BLE001
        pytest.skip("FA4 (flash-attn-4) not installed")
    src = " ".join(pathlib.Path(bi.__file__).read_text().split())
    for text in ("(n_block_max - n_block_min + num_splits - 1) // num_splits",
                 "n_block_min = n_block_min + split_idx * num_n_blocks_per_split",
                 "n_block_max = cutlass.min(n_block_min + num_n_blocks_per_split, n_block_max)",
                 "n_block_max = cute.ceil_div(seqlen_info.seqlen_k, self.tile_n)"):
        assert text in src, text


@pytest.mark.parametrize("sink", [False, True])
@pytest.mark.parametrize("sk,S", [(3 * 128 + 7, 3), (200, 2), (67, 3)])
def test_the_twins_split_forward_passes_end_to_end(sk, S, sink):
    p = _p(sk, S, sink)
    o = check_problem(p, TwinTarget(), properties=PROPS, backward=False)
    assert {"tightness_out", "tightness_lse", "tightness_partial_out", "tightness_partial_lse",
            "tightness_combine_out", "tightness_combine_lse"} <= set(o.metrics)
    assert 0 < o.metrics["tightness_out"] < 1
    assert "key_permutation" in o.skipped and "split-KV" in o.skipped["key_permutation"]


@pytest.mark.parametrize("mutation,problem", [("split_range_overlap", dict(sk=3 * 128 + 7, S=3)),
                                              ("split_sink_every", dict(sk=300, S=2, sink=True))])
def test_a_planted_split_fault_fails(mutation, problem):
    p = _p(**problem)
    check_problem(p, TwinTarget(), properties=PROPS, backward=False)       # the clean twin passes
    with pytest.raises(Violation) as e:
        check_problem(p, TwinTarget([mutation]), properties=PROPS, backward=False)
    assert e.value.prop == "fwd_budget"


def test_unmodelled_splits_are_refused_by_name():
    assert "per query tile" in split_kv_unmodelled(_p(causal=True))
    assert "hd != hdv" in split_kv_unmodelled(
        AttentionProblem(arch="sm100", dtype="bf16", batch=1, seqlen_q=8, seqlen_k=300, nheads=2, nheads_kv=2,
                         head_dim=192, head_dim_v=128, call=CallForm(num_splits=2)))
    assert split_kv_unmodelled(_p()) is None
    with pytest.raises(ValueError):
        CallForm(num_splits=0)
    with pytest.raises(ValueError, match="plain call"):
        CallForm(num_splits=2, seqused_k=True, kv_capacity=8)


def test_production_model_check_blames_fa4verify():
    p = _p(sk=300, S=2)
    tn = facts.fwd_tile("sm100", "bf16", 64, 64, False, False)[1]
    parts = (np.zeros((2, 2, 33, 4, 64)), np.zeros((2, 2, 33, 4)))
    _check_split_model(p, types.SimpleNamespace(tile_mn=(128, tn)), parts)            # as modelled
    with pytest.raises(HarnessError, match="disagrees"):
        _check_split_model(p, types.SimpleNamespace(tile_mn=(128, tn // 2)), parts)
    with pytest.raises(HarnessError, match="disagrees"):
        _check_split_model(p, types.SimpleNamespace(tile_mn=(128, tn)), (parts[0][:1], parts[1][:1]))


def test_the_adapter_copies_what_fa4_hands_its_combine(monkeypatch):
    torch = pytest.importorskip("torch")
    from fa4verify.kernels import adapter
    seen = []

    def combine(out_partial, lse_partial, *rest, **kw):
        seen.append((out_partial, lse_partial))
        out_partial.zero_()               # what the combine does to its inputs must not reach the copy
    fake = types.SimpleNamespace(_flash_attn_fwd_combine=combine)
    monkeypatch.setattr(adapter, "fa4_interface", lambda: fake)
    op, lp = torch.ones(2, 1, 3, 2, 4), torch.full((2, 1, 3, 2), 5.0)
    with adapter._capture_partials(True) as got:
        fake._flash_attn_fwd_combine(op, lp, None, None)
    assert fake._flash_attn_fwd_combine is combine and seen
    assert torch.equal(got.value[0], torch.ones(2, 1, 3, 2, 4)) and torch.equal(got.value[1], lp)
    with adapter._capture_partials(False) as got:
        fake._flash_attn_fwd_combine(op, lp)
    assert got.value is None
