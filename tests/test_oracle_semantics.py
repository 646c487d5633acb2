"""The oracle's semantics equal FA4's: masks, windows, softcap, sinks, GQA/MQA, varlen, layouts.

FA4's own reference (``flash_attn.cute.testing.attention_ref``) runs here on CPU torch in float64
(``upcast=False`` keeps float64). Its learnable-sink branch hard-codes float32
(``scores.to(torch.float32)``), so for sinks the test uses a float64 transcription of exactly those
lines (``_sink_ref64``); everything else is FA4's code unchanged.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from fa4verify.oracles import attention
from fa4verify.oracles.semantics import resolve_window, visible_mask

torch = pytest.importorskip("torch")


def _attention_ref():
    """FA4's float reference (the tests that call it are marked ``fa4``)."""
    from flash_attn.cute import testing
    return testing.attention_ref


def _bf16(shape, gen, scale=1.0):
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(torch.bfloat16)


def _sink_ref64(q, k, v, sink, causal, window):
    """float64 transcription of attention_ref's learnable-sink branch (testing.py:438-451)."""
    ref = _attention_ref()
    # scores and masks from attention_ref itself: P with return_lse gives us nothing pre-softmax,
    # so recompute the masked scores the same way attention_ref does.
    from flash_attn.cute.testing import construct_local_mask
    from einops import repeat
    g = q.shape[2] // k.shape[2]
    kk = repeat(k.double(), "b s h d -> b s (h g) d", g=g)
    vv = repeat(v.double(), "b s h d -> b s (h g) d", g=g)
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = torch.einsum("bthd,bshd->bhts", q.double() * scale, kk)
    w = (window[0], 0) if causal else window
    if w[0] is not None or w[1] is not None:
        lm = construct_local_mask(q.shape[1], k.shape[1], w, 0, None, None, device="cpu")
        scores.masked_fill_(lm, float("-inf"))
    s = sink.double().reshape(-1, 1, 1)
    mx = torch.maximum(s, torch.amax(scores, dim=-1, keepdim=True))
    un = torch.exp(scores - mx)
    norm = un.sum(dim=-1, keepdim=True) + torch.exp(s - mx)
    lse = torch.log(norm.squeeze(-1)) + mx.squeeze(-1)
    out = torch.einsum("bhts,bshd->bthd", un / norm, vv)
    del ref
    return out.numpy(), lse.numpy()


CASES = [
    dict(),
    dict(causal=True),
    dict(window_size=(2, 1)),
    dict(window_size=(None, 2)),
    dict(window_size=(3, None)),
    dict(window_size=(1, 0)),
    dict(window_size=(-1, 3)),
    dict(causal=True, window_size=(2, None)),
    dict(softcap=1.5),
    dict(softcap=5.0, causal=True),
]


@pytest.mark.fa4
@pytest.mark.parametrize("shape", [(2, 5, 7, 4, 2, 8), (1, 9, 4, 3, 1, 16), (1, 6, 6, 2, 2, 4)],
                         ids=["sq<sk-gqa", "sq>sk-mqa", "square-mha"])
@pytest.mark.parametrize("kw", CASES, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "plain")
def test_forward_matches_fa4_attention_ref_in_float64(shape, kw):
    ref = _attention_ref()
    b, sq, sk, h, hk, d = shape
    gen = torch.Generator().manual_seed(hash((shape, str(kw))) % 2**31)
    q, k, v = _bf16((b, sq, h, d), gen, 2.0), _bf16((b, sk, hk, d), gen, 2.0), _bf16((b, sk, hk, d), gen)
    r = attention.forward(q, k, v, **kw)
    left, right = resolve_window(kw.get("causal", False), kw.get("window_size", (None, None)))
    o, _, lse = ref(q.double(), k.double(), v.double(), causal=False, window_size=(left, right),
                    softcap=kw.get("softcap", 0.0), upcast=False, return_lse=True)
    o, lse = o.numpy(), lse.numpy()
    # attention_ref's own float64 rounding: a few ulp of sum|P||V| ~ 1e-14 here
    assert np.all(np.abs(r.out - o) <= r.bound + 1e-13), np.abs(r.out - o).max()
    fin = np.isfinite(lse)
    assert np.array_equal(fin, np.isfinite(r.lse))
    assert np.all(np.abs(r.lse[fin] - lse[fin]) <= r.lse_bound[fin] + 1e-13)
    # fully masked rows (rows of attention_ref with lse = -inf) give exactly 0
    rows_masked = ~fin.transpose(0, 2, 1)  # (b, sq, h)
    assert np.all(r.out[rows_masked] == 0) and np.all(r.bound[rows_masked] == 0)


@pytest.mark.fa4
@pytest.mark.parametrize("causal,window", [(False, (None, None)), (True, (None, None)), (False, (1, 1))])
def test_learnable_sink_matches_fa4_reference_formula(causal, window):
    gen = torch.Generator().manual_seed(7)
    q, k, v = _bf16((2, 6, 4, 8), gen, 2.0), _bf16((2, 4, 2, 8), gen, 2.0), _bf16((2, 4, 2, 8), gen)
    sink = (torch.randn(4, generator=gen) * 2).to(torch.bfloat16)
    r = attention.forward(q, k, v, causal=causal, window_size=window, learnable_sink=sink)
    o, lse = _sink_ref64(q, k, v, sink, causal, window)
    assert np.all(np.abs(r.out - o) <= r.bound + 1e-13)
    assert np.all(np.abs(r.lse - lse) <= r.lse_bound + 1e-13)


def test_sink_rows_without_keys_have_lse_equal_sink_and_zero_output():
    gen = torch.Generator().manual_seed(3)
    q, k, v = _bf16((1, 5, 2, 4), gen), _bf16((1, 2, 2, 4), gen), _bf16((1, 2, 2, 4), gen)
    sink = torch.tensor([0.5, -1.25], dtype=torch.float32)
    r = attention.forward(q, k, v, causal=True, learnable_sink=sink)  # rows 0..2 see no key
    assert np.all(r.out[0, :3] == 0)
    assert np.array_equal(r.lse[0, :, :3], np.array([[0.5] * 3, [-1.25] * 3]))


def _sink_off_case(precision):
    """A causal MHA call with seqlen_q > seqlen_k (rows 0..2 see no key), head 0's sink -inf,
    head 1's finite; its forward and backward (with dLSE), and the same call without a sink."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = _bf16((1, 5, 2, 8), gen), _bf16((1, 2, 2, 8), gen), _bf16((1, 2, 2, 8), gen)
    do = _bf16((1, 5, 2, 8), gen)
    dlse = torch.randn(1, 2, 5, generator=gen, dtype=torch.float64).to(torch.float32)
    sink = torch.tensor([-math.inf, 0.75], dtype=torch.float32)
    kw = dict(causal=True, precision=precision)
    f = attention.forward(q, k, v, learnable_sink=sink, **kw)
    f0 = attention.forward(q, k, v, **kw)
    b = attention.backward(q, k, v, None, do, learnable_sink=sink, dlse=dlse, **kw)
    b0 = attention.backward(q, k, v, None, do, dlse=dlse, **kw)
    return f, f0, b, b0, dlse.double().numpy()


@pytest.mark.parametrize("precision", ["fast", 80])
def test_a_sink_of_minus_inf_is_no_sink_and_its_gradient_the_limit(precision):
    """Note [A sink of -inf]: the head's O, LSE, dQ, dK, dV are those without a sink (exactly: the
    same operations), its fully masked rows O = 0 and LSE = -inf; dsink is the limit of a finite
    sink's, the sum of dLSE over the rows no key reaches (D = 0 there); nothing NaN."""
    f, f0, b, b0, dlse = _sink_off_case(precision)
    assert np.isfinite(f.out).all() and np.isfinite(b.dq).all() and np.isfinite(b.dsink).all()
    assert np.array_equal(f.out[:, :, 0], f0.out[:, :, 0]) and np.array_equal(f.lse[:, 0], f0.lse[:, 0])
    assert np.all(f.lse[0, 0, :3] == -np.inf) and np.all(f.out[0, :3, 0] == 0)
    for n in ("dq", "dk", "dv"):
        assert np.array_equal(getattr(b, n)[:, :, 0], getattr(b0, n)[:, :, 0]), n
    want = dlse[0, 0, :3].sum()
    assert abs(float(b.dsink[0]) - want) <= float(b.dsink_bound[0]) + 1e-300
    assert float(b.dsink_bound[0]) <= 1e-12 * max(1.0, abs(want))
    # the finite sink's head is judged as before: its dsink is not the -inf head's formula
    assert np.isfinite(b.dsink[1]) and float(b.dsink[1]) != dlse[0, 1, :3].sum()


def test_a_sink_of_plus_inf_or_nan_taints_its_head_only():
    """+inf and NaN stay non-finite input (Note [Oracle NaN policy]): their head is NaN, the other
    head's values stand."""
    gen = torch.Generator().manual_seed(6)
    q, k, v = _bf16((1, 4, 2, 8), gen), _bf16((1, 4, 2, 8), gen), _bf16((1, 4, 2, 8), gen)
    for bad in (math.inf, math.nan):
        r = attention.forward(q, k, v, learnable_sink=torch.tensor([bad, 0.5]))
        assert np.isnan(r.out[:, :, 0]).all() and np.isfinite(r.out[:, :, 1]).all()


@pytest.mark.fa4
def test_resolve_window_equals_fa4_interface():
    from flash_attn.cute import interface as iface
    for causal in (False, True):
        for left in (None, -3, -1, 0, 2):
            for right in (None, -2, -1, 0, 3):
                c, loc, wl, wr = iface._resolve_causal_local_window(causal, left, right)
                if c:   # FA4's causal flag means right = 0 with the given left
                    wr = 0
                assert resolve_window(causal, (left, right)) == (wl, wr), (causal, left, right)


def test_none_zero_window_is_causal_and_negative_pair_is_unbounded():
    gen = torch.Generator().manual_seed(1)
    q, k, v = _bf16((1, 5, 2, 8), gen), _bf16((1, 7, 2, 8), gen), _bf16((1, 7, 2, 8), gen)
    a = attention.forward(q, k, v, causal=True)
    b = attention.forward(q, k, v, window_size=(None, 0))
    assert np.array_equal(a.out, b.out) and np.array_equal(a.lse, b.lse)
    c = attention.forward(q, k, v)
    d = attention.forward(q, k, v, window_size=(-1, -5))
    assert np.array_equal(c.out, d.out)
    assert not np.array_equal(a.out, c.out)


def test_causal_mask_is_bottom_right_aligned():
    m = visible_mask(3, 5, None, 0)
    assert m.tolist() == [[True, True, True, False, False], [True, True, True, True, False], [True] * 5]
    m = visible_mask(5, 3, None, 0)
    assert m[:2].sum() == 0 and m[2].tolist() == [True, False, False]


def test_causal_with_seqlen_q_greater_than_seqlen_k_gives_fully_masked_rows_and_zero_grads():
    gen = torch.Generator().manual_seed(5)
    q, k, v, do = _bf16((1, 6, 2, 8), gen), _bf16((1, 3, 2, 8), gen), _bf16((1, 3, 2, 8), gen), _bf16((1, 6, 2, 8), gen)
    f = attention.forward(q, k, v, causal=True)
    assert np.all(f.out[0, :3] == 0) and np.all(np.isneginf(f.lse[0, :, :3]))
    assert np.all(np.isfinite(f.lse[0, :, 3:]))
    b = attention.backward(q, k, v, None, do, causal=True)
    assert np.all(b.dq[0, :3] == 0) and np.all(b.dq_bound[0, :3] == 0)


def test_default_scale_is_fa4_float64_inverse_sqrt_headdim():
    gen = torch.Generator().manual_seed(2)
    q, k, v = _bf16((1, 3, 1, 24), gen), _bf16((1, 3, 1, 24), gen), _bf16((1, 3, 1, 24), gen)
    a = attention.forward(q, k, v)
    b = attention.forward(q, k, v, softmax_scale=1.0 / math.sqrt(24))
    assert a.softmax_scale == 1.0 / math.sqrt(24)
    assert np.array_equal(a.out, b.out)


def test_gqa_equals_mha_with_repeated_kv_heads():
    gen = torch.Generator().manual_seed(11)
    q, k, v, do = _bf16((1, 5, 6, 8), gen), _bf16((1, 7, 2, 8), gen), _bf16((1, 7, 2, 8), gen), _bf16((1, 5, 6, 8), gen)
    kr, vr = k.repeat_interleave(3, dim=2), v.repeat_interleave(3, dim=2)
    a = attention.forward(q, k, v, causal=True)
    b = attention.forward(q, kr, vr, causal=True)
    assert np.array_equal(a.out, b.out) and np.array_equal(a.lse, b.lse)
    ga = attention.backward(q, k, v, None, do, causal=True)
    gb = attention.backward(q, kr, vr, None, do, causal=True)
    assert np.array_equal(ga.dq, gb.dq)
    dk_sum = gb.dk.reshape(1, 7, 2, 3, 8).sum(axis=3)
    assert np.all(np.abs(ga.dk - dk_sum) <= ga.dk_bound + gb.dk_bound.reshape(1, 7, 2, 3, 8).sum(axis=3))


def test_varlen_equals_per_sequence_batched_including_empty_sequences():
    gen = torch.Generator().manual_seed(13)
    lq, lk = [3, 0, 4, 2], [5, 2, 0, 2]
    H, Hk, d = 4, 2, 8
    q, k, v = _bf16((sum(lq), H, d), gen), _bf16((sum(lk), Hk, d), gen), _bf16((sum(lk), Hk, d), gen)
    do = _bf16((sum(lq), H, d), gen)
    cq = torch.tensor(np.concatenate([[0], np.cumsum(lq)]), dtype=torch.int32)
    ck = torch.tensor(np.concatenate([[0], np.cumsum(lk)]), dtype=torch.int32)
    f = attention.forward(q, k, v, causal=True, cu_seqlens_q=cq, cu_seqlens_k=ck)
    assert f.out.shape == (sum(lq), H, d) and f.lse.shape == (H, sum(lq))
    b = attention.backward(q, k, v, None, do, causal=True, cu_seqlens_q=cq, cu_seqlens_k=ck)
    assert b.dk.shape == k.shape and b.d.shape == (H, sum(lq))
    for i in range(4):
        qs, ks = slice(int(cq[i]), int(cq[i + 1])), slice(int(ck[i]), int(ck[i + 1]))
        if lq[i] == 0:
            continue
        fi = attention.forward(q[None, qs], k[None, ks], v[None, ks], causal=True)
        assert np.array_equal(fi.out[0], f.out[qs])
        assert np.array_equal(fi.lse[0], f.lse[:, qs])
        bi = attention.backward(q[None, qs], k[None, ks], v[None, ks], None, do[None, qs], causal=True)
        assert np.array_equal(bi.dq[0], b.dq[qs]) and np.array_equal(bi.dk[0], b.dk[ks])
    # keys of the empty-q sequence get zero gradients
    assert np.all(b.dk[int(ck[1]):int(ck[2])] == 0)


def test_torch_and_numpy_inputs_give_identical_results():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    gen = torch.Generator().manual_seed(17)
    q, k, v = _bf16((1, 4, 2, 8), gen), _bf16((1, 4, 2, 8), gen), _bf16((1, 4, 2, 8), gen)
    a = attention.forward(q, k, v, softcap=2.0)
    np_bf16 = [t.float().numpy().astype(ml_dtypes.bfloat16) for t in (q, k, v)]
    b = attention.forward(*np_bf16, softcap=2.0)
    assert np.array_equal(a.out, b.out) and np.array_equal(a.bound, b.bound)
    assert isinstance(a.out, np.ndarray) and a.out.dtype == np.float64


def test_lse_has_fa4_layout_batch_heads_seqlen():
    gen = torch.Generator().manual_seed(19)
    q, k, v = _bf16((2, 3, 4, 8), gen), _bf16((2, 5, 4, 8), gen), _bf16((2, 5, 4, 8), gen)
    r = attention.forward(q, k, v)
    assert r.lse.shape == (2, 4, 3)
    s = torch.einsum("bthd,bshd->bhts", q.double(), k.double()) / math.sqrt(8)
    assert np.allclose(r.lse, torch.logsumexp(s, -1).numpy(), rtol=0, atol=1e-13)


def test_varlen_q_with_batched_kv_equals_per_sequence_runs():
    gen = torch.Generator().manual_seed(23)
    lq = [2, 0, 3]
    q = _bf16((sum(lq), 2, 8), gen)
    k, v = _bf16((3, 4, 1, 8), gen), _bf16((3, 4, 1, 8), gen)
    cq = torch.tensor([0, 2, 2, 5], dtype=torch.int32)
    f = attention.forward(q, k, v, causal=True, cu_seqlens_q=cq)
    assert f.out.shape == (5, 2, 8) and f.lse.shape == (2, 5)
    for b in (0, 2):
        s = slice(int(cq[b]), int(cq[b + 1]))
        fb = attention.forward(q[None, s], k[b:b + 1], v[b:b + 1], causal=True)
        assert np.array_equal(fb.out[0], f.out[s]) and np.array_equal(fb.lse[0], f.lse[:, s])


def test_attention_module_doctest_examples_pass():
    import doctest

    import fa4verify.oracles.attention as mod

    res = doctest.testmod(mod)
    assert res.attempted > 0 and res.failed == 0
