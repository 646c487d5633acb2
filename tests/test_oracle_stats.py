"""Problem statistics are consistent with the oracle and with their documented definitions."""
from __future__ import annotations

import numpy as np

from fa4verify.oracles import attention, stats
from fa4verify.oracles.semantics import visible_mask


def _x(*shape, seed=0, s=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * s).astype(np.float32)


def test_forward_stats_bound_the_output_and_reproduce_lse():
    q, k, v = _x(2, 5, 4, 8, s=2), _x(2, 3, 2, 8, seed=1), _x(2, 3, 2, 6, seed=2)
    sink = _x(4, seed=3)
    kw = dict(causal=True, softcap=4.0, learnable_sink=sink)
    f = attention.forward(q, k, v, **kw)
    s = stats.forward_stats(q, k, v, **kw)
    assert s.sum_abs_pv.shape == f.out.shape and s.row_max.shape == f.lse.shape
    assert np.all(np.abs(f.out) <= s.sum_abs_pv * (1 + 1e-12))
    # lse = m + log(row_sum + sink_term), with m = sink for rows without keys
    m = np.where(np.isfinite(s.row_max), s.row_max, sink[None, :, None])
    assert np.allclose(m + np.log(s.row_sum + s.sink_term), f.lse, rtol=0, atol=1e-12)
    assert np.allclose(s.sum_p + s.sink_term / (s.row_sum + s.sink_term), 1.0, atol=1e-12)
    vis = visible_mask(5, 3, None, 0).sum(axis=1)
    assert np.array_equal(s.n_visible, np.broadcast_to(vis, (2, 4, 5)))
    assert np.all(s.max_abs_logit <= s.max_abs_score * f.softmax_scale * (1 + 1e-15))
    assert np.all(s.max_abs_score <= s.max_sum_abs_qk * (1 + 1e-15))


def test_backward_stats_match_oracle_d_and_bound_the_gradients():
    q, k, v, do = _x(1, 6, 2, 8), _x(1, 6, 1, 8, seed=1), _x(1, 6, 1, 8, seed=2), _x(1, 6, 2, 8, seed=3)
    b = attention.backward(q, k, v, None, do, causal=True)
    s = stats.backward_stats(q, k, v, None, do, causal=True)
    assert np.allclose(s.d, b.d, rtol=0, atol=1e-13)
    assert np.all(np.abs(b.dq) <= b.dq.dtype.type(abs(1 / np.sqrt(8))) * s.sum_abs_ds_k * (1 + 1e-12))
    assert np.all(np.abs(b.dk) <= (1 / np.sqrt(8)) * s.sum_abs_ds_q * (1 + 1e-12))
    assert np.all(np.abs(b.dv) <= s.sum_abs_p_do * (1 + 1e-12))
    assert np.all(np.abs(s.d) <= s.sum_abs_do_o)
    assert s.sum_abs_ds_q.shape == k.shape and s.sum_abs_p_do.shape == v.shape


def test_varlen_stats_use_varlen_layouts():
    q, k, v = _x(5, 2, 4), _x(4, 2, 4, seed=1), _x(4, 2, 4, seed=2)
    cq, ck = np.array([0, 2, 2, 5]), np.array([0, 1, 4, 4])
    s = stats.forward_stats(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck)
    assert s.row_max.shape == (2, 5) and s.sum_abs_pv.shape == (5, 2, 4)
    assert np.all(s.n_visible[:, 2:] == 0) and np.all(s.n_visible[:, :2] == 1)
    assert np.all(s.sum_abs_pv[2:] == 0) and np.all(np.isneginf(s.lse[:, 2:]))


def test_row_blocked_stats_equal_a_direct_full_matrix_computation():
    q, k, v = _x(1, 1100, 1, 8), _x(1, 900, 1, 8, seed=1), _x(1, 900, 1, 4, seed=2)
    s = stats.forward_stats(q, k, v, causal=True)
    S = q[0, :, 0].astype(float) @ k[0, :, 0].astype(float).T / np.sqrt(8)
    m = visible_mask(1100, 900, None, 0)
    S[~m] = -np.inf
    mx = S.max(axis=1)
    fin = np.isfinite(mx)
    P = np.zeros_like(S)
    P[fin] = np.exp(S[fin] - mx[fin, None])
    P[fin] /= P[fin].sum(axis=1, keepdims=True)
    assert np.allclose(s.sum_abs_pv[0, :, 0], P @ np.abs(v[0, :, 0].astype(float)), rtol=1e-12, atol=0)
    assert np.array_equal(s.n_visible[0, 0], m.sum(axis=1))
    assert np.array_equal(np.isfinite(s.row_max[0, 0]), fin)
