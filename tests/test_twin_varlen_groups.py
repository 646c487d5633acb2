"""Note [Equal sequences as a batch] (fa4verify/targets.py): the twin runs a varlen problem's
sequences of equal lengths as one batched call; every output equals, bit for bit, the twin's
sequence-at-a-time run of the same problem."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify.problem import AttentionProblem, CallForm, ValueSpec
from fa4verify.targets import TwinTarget


class OneAtATime(TwinTarget):
    """The twin with every sequence a call of its own (the grouping's reference)."""

    def _segment_groups(self, problem, a):
        return [[s] for s in self._segments(problem, a) if s[1].stop > s[1].start]


LENS = ((5, 9), (5, 9), (0, 4), (7, 3), (5, 9), (7, 3), (1, 0), (1, 0), (12, 12), (5, 9))

CASES = {
    "plain": dict(),
    "causal_gqa": dict(causal=True, nheads=4, nheads_kv=2),
    "window": dict(window_size=(3, 1)),
    "packed_gqa": dict(nheads=4, nheads_kv=1, call=CallForm(pack_gqa=True)),
    "sm100": dict(arch="sm100", causal=True),
}


def _problem(**kw) -> AttentionProblem:
    base = dict(arch="sm90", dtype="bf16", batch=len(LENS), seqlen_q=max(q for q, _ in LENS),
                seqlen_k=max(k for _, k in LENS), nheads=2, nheads_kv=2, head_dim=64, head_dim_v=64,
                seqlens_q=tuple(q for q, _ in LENS), seqlens_k=tuple(k for _, k in LENS),
                values=ValueSpec("normal", seed=11))
    base.update(kw)
    return AttentionProblem(**base)


def test_the_groups_are_the_equal_lengths():
    p = _problem()
    groups = TwinTarget()._segment_groups(p, p.materialize())
    assert sorted(len(g) for g in groups) == [1, 2, 2, 4]       # (0, 4) has no query row: no call
    for g in groups:
        assert len({(sq.stop - sq.start, sk.stop - sk.start) for _b, sq, sk in g}) == 1


@pytest.mark.parametrize("name", sorted(CASES))
def test_grouped_equals_one_at_a_time_bit_for_bit(name):
    p = _problem(**CASES[name])
    a = p.materialize()
    tw, ref = TwinTarget(), OneAtATime()
    f, f1 = tw.forward(p, a), ref.forward(p, a)
    np.testing.assert_array_equal(f.out, f1.out)
    np.testing.assert_array_equal(f.lse, f1.lse)
    dl = np.random.default_rng(3).standard_normal(np.shape(f.lse)).astype(np.float32) * 0.5
    for dlse in (None, dl):
        g, g1 = tw.backward(p, a, f, dlse=dlse), ref.backward(p, a, f1, dlse=dlse)
        for n in ("dq", "dk", "dv"):
            np.testing.assert_array_equal(getattr(g, n), getattr(g1, n), err_msg=f"{name} {n} dlse={dlse is not None}")


def test_a_mutated_twin_a_perturbed_mufu_and_a_sink_run_one_at_a_time():
    p = _problem()
    a = p.materialize()
    n_seq = sum(1 for q, _k in LENS if q)
    assert len(TwinTarget(mufu="perturbed")._segment_groups(p, a)) == n_seq
    assert len(TwinTarget()._segment_groups(p.replace(sink=True), a)) == n_seq
    mut = sorted(getattr(TwinTarget()._ta, "MUTATIONS", ()))
    if mut:
        assert len(TwinTarget(mutations=mut[:1])._segment_groups(p, a)) == n_seq


def test_on_sm100_the_grouped_sequences_take_fa4s_varlen_emulation_setting():
    """FA4's SM 10.x forward of a varlen call (``cu_seqlens_q``) with packed GQA at hd > 64 and no
    rule emulates exp2 on other columns than a batched call (``flash_fwd_sm100.py``, ``ex2_emu_freq``:
    32 against the tuned 10): the sequences run as a batch take the varlen setting, as the twin's
    own ``cu_seqlens`` path does (red-team review: 24 emulated columns where FA4 has 8)."""
    from fa4verify.kernels.twin import forward as tf
    p = AttentionProblem(arch="sm100", dtype="bf16", batch=2, seqlen_q=40, seqlen_k=70, nheads=4, nheads_kv=1,
                         head_dim=128, head_dim_v=128, seqlens_q=(40, 33), seqlens_k=(70, 50),
                         values=ValueSpec("normal", seed=11), call=CallForm(pack_gqa=True))
    a = p.materialize()
    f = TwinTarget().forward(p, a)
    r = tf.forward(a["q"], a["k"], a["v"], arch="sm100", pack_gqa=True,
                   cu_seqlens_q=np.array([0, 40, 73], np.int32), cu_seqlens_k=np.array([0, 70, 120], np.int32))
    assert len(r.config.emulated_columns) == 8
    np.testing.assert_array_equal(f.out, np.asarray(r.out, np.float64))
    np.testing.assert_array_equal(f.lse, np.asarray(r.lse, np.float64))


@pytest.mark.parametrize("call, varlen_q", [
    (CallForm(block_size=(256, 256), block_seed=3, block_keep=1.0), False),   # a dense call's varlen rewrite
    (CallForm(seqused_k=True, kv_capacity=96, q_batched=True), False),        # batched Q without used lengths
    (CallForm(seqused_k=True, kv_capacity=96), True),                         # packed Q: cu_seqlens_q
])
def test_a_rearranged_call_takes_the_emulation_setting_of_the_kernel_fa4_runs(call, varlen_q):
    """Red-team review (thirty-fourth session): the twin runs a dense block-sparse call as a varlen
    rewrite and a batched layout as a varlen problem, but FA4 runs the call's own kernel, whose exp2
    emulation setting takes ``cu_seqlens_q`` / ``seqused_q`` only (``flash_fwd_sm100.py``,
    ``ex2_emu_freq``): packed GQA at hd 128, no rule: 24 emulated columns as a dense call, not the
    varlen 8 the rewrite had."""
    from fa4verify.kernels.twin.exp2 import emulated_columns
    lens = dict(batch=2, seqlen_q=256, seqlen_k=80, seqlens_q=(256, 256), seqlens_k=(80, 64)) \
        if call.seqused_k else dict(batch=1, seqlen_q=256, seqlen_k=512)
    p = AttentionProblem(arch="sm100", dtype="bf16", nheads=4, nheads_kv=2, head_dim=128, head_dim_v=128,
                         values=ValueSpec("normal", seed=5), call=call, **lens)
    t = TwinTarget()
    seen = []
    orig = t._ta.forward

    def spy(*args, **kw):
        r = orig(*args, **kw)
        seen.append(r.config.emulated_columns)
        return r
    t._ta.forward = spy
    t.forward(p, p.materialize())
    want = tuple(int(i) for i in np.flatnonzero(emulated_columns(head_dim=128, head_dim_v=128, pack_gqa=True,
                                                                 varlen_q=varlen_q, use_2cta=False)))
    assert seen and all(tuple(s) == want for s in seen) and len(want) == (8 if varlen_q else 24)
