"""production.combine (Note [Combine on the GPU]): per-chunk forwards merged by a combine, judged by
the one judge against the chunks' oracles, the exact combine of the same partials and the full
problem's oracle. CPU: a stand-in with FA4's surface (float32 attention, the combine twin) passes;
a combine whose first weight is biased, or a forward that drops a chunk's last key, fails."""
from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fa4verify.checks.combine import result, run_combine  # noqa: E402

SMALL = (1, 16, 2, 64, 96)


class StandIn:
    device = "cpu"
    arch = "sm90"

    def __init__(self, weight_bias: float = 0.0, drop_last_key: bool = False, nan_when_empty: bool = False):
        self.weight_bias, self.drop_last_key, self.nan_when_empty = weight_bias, drop_last_key, nan_when_empty

    def forward(self, q, k, v):
        if self.drop_last_key:
            k, v = k[:, :-1], v[:, :-1]
        s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) / math.sqrt(q.shape[-1])
        out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), v.double())
        return out.to(q.dtype), torch.logsumexp(s, -1).float()

    def combine(self, op, lp, out_dtype):
        from fa4verify.kernels import twin_combine
        r = twin_combine.combine(op.numpy(), lp.numpy(), out_dtype="bf16" if out_dtype == torch.bfloat16 else "fp16")
        out = torch.from_numpy(np.asarray(r.out, np.float32))
        if self.weight_bias:           # the planted fault: split 0's weight off by a factor
            w0 = torch.from_numpy(np.asarray(r.weights[0], np.float32))[..., None]
            out = out + self.weight_bias * w0 * op[0]
        lse = torch.from_numpy(np.asarray(r.lse, np.float32))
        if self.nan_when_empty:        # the combine without its lse_max == -inf guard
            lse = torch.where(torch.isneginf(lp).all(0), torch.full_like(lse, float("nan")), lse)
        return out.to(out_dtype), lse


def test_a_correct_combine_passes_every_verdict():
    rows = run_combine(StandIn(), shape=SMALL, splits=(2, 3))
    r = result(rows, "CPU")
    assert r.status == "pass", r.summary
    names = {vd.name for row in rows for vd in row["verdicts"]}
    assert {"partial_out", "partial_lse", "combine_out", "combine_lse", "combine_out (empty rows)",
            "combine_lse (empty rows)"} <= names and len(rows) == 2
    assert 0 < r.tightness <= 1


@pytest.mark.parametrize("fault", [dict(weight_bias=2.0 ** -6), dict(drop_last_key=True),
                                   dict(nan_when_empty=True)])
def test_a_planted_fault_fails(fault):
    r = result(run_combine(StandIn(**fault), shape=SMALL, splits=(2, 3)), "CPU")
    assert r.status == "fail", r.summary
    if "nan_when_empty" in fault:      # Note [Empty rows in the combine]: only the emptied rows see it
        assert "combine_lse (empty rows) fail" in r.summary, r.summary


class _Raises(StandIn):
    def combine(self, op, lp, out_dtype):
        raise RuntimeError("boom")


def test_an_exception_in_fa4s_code_is_a_failure_and_one_in_fa4verifys_is_an_error(monkeypatch):
    from fa4verify import blame
    monkeypatch.setattr(blame, "origin", lambda e: blame.FA4)
    r = result(run_combine(_Raises(), shape=SMALL, splits=(2,)), "CPU")
    assert r.status == "fail" and "raised in FA4" in r.summary, r.summary
    monkeypatch.setattr(blame, "origin", lambda e: blame.FA4VERIFY)
    with pytest.raises(RuntimeError, match="boom"):
        run_combine(_Raises(), shape=SMALL, splits=(2,))


class IndexedStandIn(StandIn):
    """A stand-in with the indexed combine (Notes [The varlen combine], [Used rows and virtual
    batches]): ``cu_seqlens`` / ``seqused`` / ``virtual_batch_idx`` as FA4 reads them, into the
    caller's ``out`` (rows it does not write keep what was there). Faults: ``drop_offset``: every
    sequence's merged rows written from row 0 (the red-team fault
    ``combine_varlen_out_offset_dropped``); ``slot_length``: the used length read with the slot's
    index instead of the batch's; ``past_used``: ``seqused`` ignored (every row merged);
    ``ignore_vbi``: the slot mapping ignored (slot i merges batch i)."""

    def __init__(self, drop_offset=False, slot_length=False, past_used=False, ignore_vbi=False):
        super().__init__()
        self.drop_offset, self.slot_length = drop_offset, slot_length
        self.past_used, self.ignore_vbi = past_used, ignore_vbi

    def combine_indexed(self, op, lp, out_dtype, out=None, cu_seqlens=None, seqused=None, virtual_batch_idx=None):
        packed = cu_seqlens is not None
        o4, l4 = (op[:, None], lp[:, None]) if packed else (op, lp)
        full_o, full_l = self.combine(o4, l4, out_dtype)
        res = torch.full_like(full_o, float("nan")) if out is None else (out[None] if packed else out)
        lse = torch.full_like(full_l, float("nan"))
        B = len(cu_seqlens) - 1 if packed else op.shape[1]
        slots = (virtual_batch_idx.tolist() if virtual_batch_idx is not None and not self.ignore_vbi
                 else list(range(B)))
        for i, r in enumerate(slots):
            lr = i if self.slot_length else r
            n = (seqused[lr].item() if seqused is not None and not self.past_used else
                 (cu_seqlens[lr + 1] - cu_seqlens[lr]).item() if packed else op.shape[2])
            if packed:
                src = dst = cu_seqlens[r].item()
                if self.drop_offset:
                    dst = 0
                res[0, dst:dst + n], lse[0, dst:dst + n] = full_o[0, src:src + n], full_l[0, src:src + n]
            else:
                res[r, :n], lse[r, :n] = full_o[r, :n], full_l[r, :n]
        return (res[0], lse[0]) if packed else (res, lse)


def test_the_varlen_combine_is_judged_and_a_dropped_sequence_offset_fails():
    from fa4verify.checks.combine import varlen_lengths
    assert varlen_lengths(512) == (102, 204, 1, 205) and sum(varlen_lengths(16)) == 16
    rows = run_combine(IndexedStandIn(), shape=SMALL, splits=(2, 3))
    r = result(rows, "CPU")
    assert r.status == "pass", r.summary
    names = {vd.name for row in rows for vd in row["verdicts"]}
    assert any(n.startswith("combine_out (varlen") for n in names)
    assert {"combine_out (seqused)", "combine_out (virtual_batch_idx)",
            "combine_out (cu_seqlens+seqused+virtual_batch_idx)"} <= names, names
    r = result(run_combine(IndexedStandIn(drop_offset=True), shape=SMALL, splits=(2, 3)), "CPU")
    assert r.status == "fail" and "varlen" in r.summary, r.summary


@pytest.mark.parametrize("fault, where", [("slot_length", "cu_seqlens+seqused+virtual_batch_idx"),
                                          ("past_used", "rows outside the used ones"),
                                          ("ignore_vbi", "virtual_batch_idx, rows outside")])
def test_a_combine_that_misreads_its_index_arguments_fails(fault, where):
    """Note [Used rows and virtual batches]: a used length looked up with the kernel slot instead
    of the batch it maps to, a merge past the used rows, or a slot mapping ignored, each seen: on
    the rows FA4 must write (NaN when left unwritten) or on the rows it must leave alone."""
    r = result(run_combine(IndexedStandIn(**{fault: True}), shape=(2, 16, 2, 64, 96), splits=(2,)), "CPU")
    assert r.status == "fail", r.summary
    assert where in r.summary, r.summary


def test_used_rows_are_the_mapped_batches_first_used_rows():
    from fa4verify.checks.combine import used_rows
    assert used_rows([3, 3], [1, 2], None) == [(0, 0), (1, 0), (1, 1)]
    assert used_rows([2, 2, 2], None, [2, 0, 2]) == [(0, 0), (0, 1), (2, 0), (2, 1)]
    assert used_rows([2, 3], [1, 2], [1, 0], offsets=[0, 2]) == [(0, 0), (0, 2), (0, 3)]


class _BlockOffsetDropped(StandIn):
    """Source mutant combine_o_partial_kblock_offset_dropped: every 128-column block of the partial O
    is read from column 0."""
    def combine(self, op, lp, out_dtype):
        d = op.shape[-1]
        cols = torch.arange(d) % 128
        return super().combine(op[..., cols], lp, out_dtype)


class _SlotsPastFirstDropped(StandIn):
    """Source mutant combine_max_valid_split_first_slot: with more than 32 splits the splits from 32
    on are not accumulated, their weights still in the normaliser."""
    def combine(self, op, lp, out_dtype):
        from fa4verify.kernels import twin_combine
        r = twin_combine.combine(op.numpy(), lp.numpy(), out_dtype="bf16")
        w = np.asarray(r.weights, np.float64)                       # (S, ..., rows, heads)
        keep = np.arange(op.shape[0]) < 32
        out = np.einsum("s...,s...d->...d", w * keep.reshape((-1,) + (1,) * (w.ndim - 1)), op.numpy())
        return torch.from_numpy(out.astype(np.float32)).to(out_dtype), torch.from_numpy(np.asarray(r.lse, np.float32))


def test_synthetic_partials_pass_at_every_combine_shape():
    from fa4verify.checks.combine import SHAPES, shape_rows
    rows = shape_rows(StandIn())
    assert [r["num_splits"] for r in rows] == [f"{S} (hd {d}, synthetic)" for d, S in SHAPES]
    r = result(rows, "CPU")
    assert r.status == "pass", r.summary
    assert "synthetic partials (20 splits at hd 64, 40 splits at hd 128" in r.summary


@pytest.mark.parametrize("standin, shape", [(_BlockOffsetDropped, "hd 256"), (_SlotsPastFirstDropped, "hd 128")])
def test_combine_faults_past_the_forward_fed_shape_fail_only_the_synthetic_rows(standin, shape):
    """Note [Combine shapes]: the forward-fed shape (one head-dim block, one split slot per thread)
    cannot see either fault; the synthetic rows at the shape each needs do."""
    from fa4verify.checks.combine import shape_rows
    assert result(run_combine(standin(), shape=SMALL, splits=(2, 3)), "CPU").status == "pass"
    r = result(shape_rows(standin()), "CPU")
    assert r.status == "fail" and f"combine_out ({shape}) fail" in r.summary, r.summary
