"""MLA (qv), top-k gather and fp8 descale semantics (fa4verify.oracles.mla / .descale) against an
independent float64 reference written differently: explicit loops over query tokens and key
slots for the forward, torch float64 autograd on the gather-then-dense formula for the backward."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from fa4verify.oracles import descale as dsc
from fa4verify.oracles import mla

BF = ml_dtypes.bfloat16


def _bf(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(BF)


def _loop_reference(q, k, v, qv, idx, scale, causal, dedupe=False, seqused=None):
    """O (b, s, h, dv), LSE (b, s, h) by explicit loops: for each token and head, the logit of
    every valid slot is scale * (sum q*k + sum qv*v) (math.fsum), then a softmax over the slots."""
    q, k, v, qv = (None if t is None else np.asarray(t, np.float64) for t in (q, k, v, qv))
    b, s, h, dv = qv.shape
    sk, hk = v.shape[1], v.shape[2]
    out = np.zeros((b, s, h, dv))
    lse = np.full((b, s, h), -np.inf)
    for bi in range(b):
        kl = sk if seqused is None else int(seqused[bi])
        for i in range(s):
            lim = min(kl, i + 1 + kl - s) if causal else kl
            slots = range(sk) if idx is None else idx[bi, i]
            keys = [int(j) for j in slots if 0 <= j < lim]
            if dedupe:
                keys = list(dict.fromkeys(keys))
            for hh in range(h):
                g = hh // (h // hk)
                if not keys:
                    continue
                x = []
                for j in keys:
                    acc = math.fsum(qv[bi, i, hh] * v[bi, j, g])
                    if q is not None:
                        acc = math.fsum([acc] + list(q[bi, i, hh] * k[bi, j, g]))
                    x.append(scale * acc)
                x = np.array(x)
                m = x.max()
                e = np.exp(x - m)
                lse[bi, i, hh] = m + math.log(math.fsum(e))
                p = np.exp(x - lse[bi, i, hh])
                out[bi, i, hh] = sum(p[t] * v[bi, j, g] for t, j in enumerate(keys))
    return out, lse


def _check_fwd(r, o_ref, lse_ref, slack=1e-12):
    assert np.all(np.isfinite(r.bound))
    fin = np.isfinite(lse_ref)
    assert np.array_equal(fin, np.isfinite(r.lse))
    assert np.all(np.abs(r.lse[fin] - lse_ref[fin]) <= r.lse_bound[fin] + slack)
    # the loop reference itself is float64 (not exact): compare within the bound plus its own error
    assert np.all(np.abs(r.out - o_ref) <= r.bound + slack)
    assert np.all(r.out[~fin] == 0)


@pytest.mark.parametrize("causal", [False, True])
def test_mla_logits_are_q_dot_k_plus_qv_dot_v(causal):
    rng = np.random.default_rng(1 + causal)
    b, s, sk, h, hk, d, dv = 2, 5, 7, 4, 2, 8, 16
    q, qv = _bf(rng, (b, s, h, d)), _bf(rng, (b, s, h, dv))
    k, v = _bf(rng, (b, sk, hk, d)), _bf(rng, (b, sk, hk, dv))
    r = mla.forward(q, k, v, qv, causal=causal)
    assert r.softmax_scale == 1.0 / math.sqrt(d + dv)
    o_ref, lse_ref = _loop_reference(q, k, v, qv, None, r.softmax_scale, causal)
    _check_fwd(r, o_ref, lse_ref)
    assert r.out.shape == (b, s, h, dv) and r.lse.shape == (b, s, h)


def test_mla_deepseek_shape_64_plus_512_default_scale_is_1_over_24():
    rng = np.random.default_rng(7)
    b, s, sk, h = 1, 3, 9, 2
    q, qv = _bf(rng, (b, s, h, 64)), _bf(rng, (b, s, h, 512), 0.3)
    k, v = _bf(rng, (b, sk, 1, 64)), _bf(rng, (b, sk, 1, 512), 0.3)
    r = mla.forward(q, k, v, qv, causal=True)
    assert r.softmax_scale == 1.0 / 24.0
    o_ref, lse_ref = _loop_reference(q, k, v, qv, None, r.softmax_scale, True)
    _check_fwd(r, o_ref, lse_ref)
    assert float(np.max(r.bound)) < 1e-12


def test_mla_without_rope_part_uses_qv_dot_v_and_scale_1_over_sqrt_dv():
    rng = np.random.default_rng(3)
    qv = _bf(rng, (1, 4, 2, 16))
    v = _bf(rng, (1, 6, 1, 16))
    r = mla.forward(None, None, v, qv)
    assert r.softmax_scale == 1.0 / 4.0
    o_ref, lse_ref = _loop_reference(None, None, v, qv, None, r.softmax_scale, False)
    _check_fwd(r, o_ref, lse_ref)
    with pytest.raises(ValueError, match="both"):
        mla.forward(_bf(rng, (1, 4, 2, 8)), None, v, qv)


def _indices(rng, b, s, sk, topk):
    idx = np.stack([np.stack([rng.permutation(sk + 4)[:topk] - 2 for _ in range(s)]) for _ in range(b)])
    idx[0, 0, :] = -1                              # a token with only empty slots
    idx[..., -1] = -1                              # a sentinel in every row
    return idx.astype(np.int32)                    # entries in [-2, sk + 1]: out-of-range slots too


@pytest.mark.parametrize("causal", [False, True])
def test_gather_query_sees_only_its_valid_slots(causal):
    rng = np.random.default_rng(11 + causal)
    b, s, sk, h, d, dv, topk = 2, 6, 10, 3, 8, 16, 5
    q, qv = _bf(rng, (b, s, h, d)), _bf(rng, (b, s, h, dv))
    k, v = _bf(rng, (b, sk, 1, d)), _bf(rng, (b, sk, 1, dv))
    idx = _indices(rng, b, s, sk, topk)
    r = mla.forward(q, k, v, qv, gather_kv_indices=idx, causal=causal)
    o_ref, lse_ref = _loop_reference(q, k, v, qv, idx, r.softmax_scale, causal)
    _check_fwd(r, o_ref, lse_ref)
    assert np.all(np.isneginf(r.lse[0, 0])) and np.all(r.out[0, 0] == 0)


def test_gather_listing_every_key_equals_dense_mla():
    rng = np.random.default_rng(5)
    b, s, sk, h, d, dv = 1, 4, 6, 2, 8, 16
    q, qv = _bf(rng, (b, s, h, d)), _bf(rng, (b, s, h, dv))
    k, v = _bf(rng, (b, sk, 1, d)), _bf(rng, (b, sk, 1, dv))
    idx = np.broadcast_to(rng.permutation(sk), (b, s, sk)).astype(np.int32)
    for causal in (False, True):
        g = mla.forward(q, k, v, qv, gather_kv_indices=idx, causal=causal)
        dn = mla.forward(q, k, v, qv, causal=causal)
        assert np.all(np.abs(g.out - dn.out) <= g.bound + dn.bound)
        assert np.all(np.abs(g.lse - dn.lse) <= g.lse_bound + dn.lse_bound)


def test_gather_duplicates_count_per_slot_or_once():
    rng = np.random.default_rng(9)
    b, s, sk, h, d, dv = 1, 2, 5, 1, 4, 8
    q, qv = _bf(rng, (b, s, h, d)), _bf(rng, (b, s, h, dv))
    k, v = _bf(rng, (b, sk, 1, d)), _bf(rng, (b, sk, 1, dv))
    idx = np.array([[[0, 3, 3, -1], [4, 1, 1, 1]]], np.int32)
    slots = mla.forward(q, k, v, qv, gather_kv_indices=idx)
    sets = mla.forward(q, k, v, qv, gather_kv_indices=idx, duplicates="set")
    for r, dedupe in ((slots, False), (sets, True)):
        o_ref, lse_ref = _loop_reference(q, k, v, qv, idx, r.softmax_scale, False, dedupe=dedupe)
        _check_fwd(r, o_ref, lse_ref)
    assert np.all(np.abs(slots.lse - sets.lse) > 1e-3)          # the readings differ here


def test_gather_honours_seqused_k():
    rng = np.random.default_rng(13)
    b, s, sk, h, d, dv = 2, 3, 8, 2, 4, 8
    q, qv = _bf(rng, (b, s, h, d)), _bf(rng, (b, s, h, dv))
    k, v = _bf(rng, (b, sk, 1, d)), _bf(rng, (b, sk, 1, dv))
    idx = np.broadcast_to(np.arange(sk), (b, s, sk)).astype(np.int32)
    used = np.array([5, 8], np.int32)
    r = mla.forward(q, k, v, qv, gather_kv_indices=idx, seqused_k=used, causal=True)
    o_ref, lse_ref = _loop_reference(q, k, v, qv, idx, r.softmax_scale, True, seqused=used)
    _check_fwd(r, o_ref, lse_ref)


def test_gather_index_shape_is_checked():
    rng = np.random.default_rng(0)
    q, qv = _bf(rng, (1, 2, 1, 4)), _bf(rng, (1, 2, 1, 8))
    k, v = _bf(rng, (1, 3, 1, 4)), _bf(rng, (1, 3, 1, 8))
    with pytest.raises(ValueError, match="gather_kv_indices"):
        mla.forward(q, k, v, qv, gather_kv_indices=np.zeros((1, 3, 4), np.int32))
    with pytest.raises(ValueError, match="duplicates"):
        mla.forward(q, k, v, qv, gather_kv_indices=np.zeros((1, 2, 4), np.int32), duplicates="bag")


def _torch_grads(q, k, v, qv, idx, dout, scale, causal):
    """float64 autograd of the gather-then-dense formula (each slot a key)."""
    import torch
    t = {n: torch.tensor(np.asarray(a, np.float64), requires_grad=True) for n, a in
         (("q", q), ("k", k), ("v", v), ("qv", qv))}
    b, s, h, dv = qv.shape
    sk = v.shape[1]
    outs = []
    for bi in range(b):
        rows = []
        for i in range(s):
            lim = min(sk, i + 1 + sk - s) if causal else sk
            keys = [int(j) for j in idx[bi, i] if 0 <= j < lim]
            if not keys:
                rows.append(torch.zeros(h, dv, dtype=torch.float64))
                continue
            kk = t["k"][bi, keys, 0]                      # (n, d)  one KV head
            vv = t["v"][bi, keys, 0]                      # (n, dv)
            x = scale * (t["q"][bi, i] @ kk.T + t["qv"][bi, i] @ vv.T)   # (h, n)
            rows.append(torch.softmax(x, dim=-1) @ vv)
        outs.append(torch.stack(rows))
    o = torch.stack(outs)
    (o * torch.tensor(np.asarray(dout, np.float64))).sum().backward()
    return {n: x.grad.numpy() for n, x in t.items()}, o.detach().numpy()


@pytest.mark.parametrize("causal", [False, True])
def test_gather_backward_equals_float64_autograd(causal):
    rng = np.random.default_rng(21 + causal)
    b, s, sk, h, d, dv, topk = 1, 5, 9, 3, 8, 16, 4
    q, qv = _bf(rng, (b, s, h, d)), _bf(rng, (b, s, h, dv))
    k, v = _bf(rng, (b, sk, 1, d)), _bf(rng, (b, sk, 1, dv))
    idx = _indices(rng, b, s, sk, topk)
    idx[0, 2, :2] = 4                                   # a duplicated key
    do = _bf(rng, (b, s, h, dv))
    g, o = _torch_grads(q, k, v, qv, idx, do, 1 / math.sqrt(d + dv), causal)
    r = mla.backward(q, k, v, qv, None, do, gather_kv_indices=idx, causal=causal)
    slack = 1e-12
    for name, val, bnd in (("q", r.dq, r.dq_bound), ("k", r.dk, r.dk_bound), ("v", r.dv, r.dv_bound),
                           ("qv", r.dqv, r.dqv_bound)):
        assert np.all(np.isfinite(bnd)), name
        assert np.all(np.abs(val - g[name]) <= bnd + slack), (name, np.abs(val - g[name]).max())
    assert np.all(np.abs(r.forward.out - o) <= r.forward.bound + slack)
    # keys no slot lists get no gradient
    listed = {int(j) for j in idx[0].ravel() if 0 <= j < sk}
    for j in set(range(sk)) - listed:
        assert np.all(r.dk[0, j] == 0) and np.all(r.dv[0, j] == 0)


def test_dense_mla_backward_equals_float64_autograd():
    rng = np.random.default_rng(31)
    b, s, sk, h, d, dv = 1, 4, 6, 2, 8, 16
    q, qv = _bf(rng, (b, s, h, d)), _bf(rng, (b, s, h, dv))
    k, v = _bf(rng, (b, sk, 1, d)), _bf(rng, (b, sk, 1, dv))
    do = _bf(rng, (b, s, h, dv))
    idx = np.broadcast_to(np.arange(sk), (b, s, sk)).astype(np.int32)
    g, _ = _torch_grads(q, k, v, qv, idx, do, 1 / math.sqrt(d + dv), True)
    r = mla.backward(q, k, v, qv, None, do, causal=True)
    for name, val, bnd in (("q", r.dq, r.dq_bound), ("k", r.dk, r.dk_bound), ("v", r.dv, r.dv_bound),
                           ("qv", r.dqv, r.dqv_bound)):
        assert np.all(np.abs(val - g[name]) <= bnd + 1e-12), name


# -- fp8 descale -------------------------------------------------------------------------------

def _fp8(rng, shape):
    return (rng.standard_normal(shape) * 2).astype(ml_dtypes.float8_e4m3fn)


def test_descale_scales_logits_by_qd_kd_and_output_by_vd():
    from fa4verify.oracles import attention
    rng = np.random.default_rng(41)
    b, s, sk, h, hk, d = 2, 4, 6, 4, 2, 16
    q, k, v = _fp8(rng, (b, s, h, d)), _fp8(rng, (b, sk, hk, d)), _fp8(rng, (b, sk, hk, d))
    qd, kd, vd = (rng.uniform(0.01, 3.0, (b, hk)).astype(np.float32) for _ in range(3))
    dd = dsc.descaled(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd)
    r = attention.forward(dd["q"], dd["k"], dd["v"], causal=True)
    # independent: explicit loops with the factors applied to the logit and to the output
    qf, kf, vf = (np.asarray(t, np.float64) for t in (q, k, v))
    scale = 1 / math.sqrt(d)
    for bi in range(b):
        for hh in range(h):
            g = hh // (h // hk)
            for i in range(s):
                lim = i + 1 + sk - s
                x = np.array([scale * float(qd[bi, g]) * float(kd[bi, g]) * math.fsum(qf[bi, i, hh] * kf[bi, j, g])
                              for j in range(lim)])
                p = np.exp(x - x.max())
                p /= p.sum()
                o = float(vd[bi, g]) * (p @ vf[bi, :lim, g])
                assert np.all(np.abs(r.out[bi, i, hh] - o) <= r.bound[bi, i, hh] + 1e-12)
                assert abs(r.lse[bi, hh, i] - (x.max() + math.log(np.exp(x - x.max()).sum()))) < 1e-12


def test_descale_products_are_exact_and_shapes_checked():
    rng = np.random.default_rng(43)
    q = _fp8(rng, (1, 2, 2, 8))
    qd = np.array([[0.3, 7.0]], np.float32)
    dd = dsc.descaled(q, q, q, q_descale=qd)
    want = np.asarray(q, np.float64) * np.repeat(qd.astype(np.float64), 1, axis=1)[:, None, :, None]
    assert np.array_equal(dd["q"], want) and np.array_equal(dd["k"], np.asarray(q, np.float64))
    with pytest.raises(ValueError, match=r"q_descale: expected shape \(1, 2\)"):
        dsc.descaled(q, q, q, q_descale=np.ones((2, 2), np.float32))
    with pytest.raises(ValueError, match="finite"):
        dsc.descaled(q, q, q, k_descale=np.array([[np.inf, 1]], np.float32))
    wide = rng.standard_normal((1, 2, 2, 8))                # float64 values x fp32 factors: not exact
    with pytest.raises(ValueError, match="not exact"):
        dsc.descaled(wide, wide, wide, v_descale=np.array([[0.1, 0.3]], np.float32))


def test_mla_descale_folds_into_q_and_the_shared_latent_descale():
    rng = np.random.default_rng(47)
    b, s, sk, h, d, dv = 1, 3, 5, 2, 8, 16
    q, qv = _fp8(rng, (b, s, h, d)), _fp8(rng, (b, s, h, dv))
    k, v = _fp8(rng, (b, sk, 1, d)), _fp8(rng, (b, sk, 1, dv))
    qd, kvd = np.array([[0.5]], np.float32), np.array([[1.75]], np.float32)
    r = mla.forward(q, k, v, qv, q_descale=qd, k_descale=kvd, v_descale=kvd)
    f = lambda t, x: np.asarray(t, np.float64) * float(x[0, 0])   # noqa: E731
    o_ref, lse_ref = _loop_reference(f(q, qd), f(k, kvd), f(v, kvd), f(qv, qd), None, r.softmax_scale, False)
    _check_fwd(r, o_ref, lse_ref)
