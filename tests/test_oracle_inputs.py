"""Bad inputs raise ValueError naming the argument and the values; NaN/Inf propagate as documented
(Note [Oracle NaN policy] in ``oracles.semantics``)."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify.oracles import attention


def _x(*shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


Q, K, V = _x(2, 4, 4, 8), _x(2, 5, 2, 8, seed=1), _x(2, 5, 2, 8, seed=2)


@pytest.mark.parametrize("args,kw,match", [
    ((Q[0], K, V), {}, r"q: expected 4-D .* got shape \(4, 4, 8\)"),
    ((Q, K, V[:, :4]), {}, r"k, v: leading dims"),
    ((Q, K[..., :4], V), {}, r"q, k: headdim must match, got q headdim 8 and k headdim 4"),
    ((_x(2, 4, 3, 8), K, V), {}, r"nheads \(3\) must be a positive multiple of nheads_kv \(2\)"),
    ((Q, K.astype(np.float16), V), {}, r"q, k, v: dtypes must match, got q=float32, k=float16"),
    ((Q.astype(np.int32), K, V), {}, r"q: dtype int32 not supported"),
    ((Q.astype(np.complex64), K, V), {}, r"q: dtype complex64 not supported"),
    ((Q[:1], K, V), {}, r"q, k: batch must match, got q batch 1 and k batch 2"),
    ((Q, K, V), dict(learnable_sink=np.zeros(3, np.float32)), r"learnable_sink: expected shape \(4,\)"),
    ((Q, K, V), dict(softcap=-1.0), r"softcap: must be finite and >= 0, got -1.0"),
    ((Q, K, V), dict(softmax_scale=float("nan")), r"softmax_scale: must be finite"),
    ((Q, K, V), dict(window_size=(1, 2, 3)), r"window_size: must be a pair"),
    ((Q, K, V), dict(window_size=(1.5, None)), r"window_size: left must be an int or None"),
])
def test_bad_argument_raises_value_error_naming_it(args, kw, match):
    with pytest.raises(ValueError, match=match):
        attention.forward(*args, **kw)


QV, KV = _x(7, 4, 8), _x(6, 2, 8, seed=3)


@pytest.mark.parametrize("cuq,cuk,match", [
    ([0, 3, 7], [0, 2, 5], r"cu_seqlens_k: last entry 5 must equal the token count 6"),
    ([1, 3, 7], [0, 2, 6], r"cu_seqlens_q: must start at 0, got 1"),
    ([0, 5, 3, 7], [0, 2, 4, 6], r"cu_seqlens_q: must be non-decreasing"),
    ([0, 3, 7], [0, 1, 2, 6], r"cu_seqlens_q, cu_seqlens_k: lengths must match, got 3 and 4"),
    (np.array([0.0, 3.0, 7.0]), [0, 2, 6], r"cu_seqlens_q: must be a 1-D integer tensor"),
])
def test_bad_cu_seqlens_raise_value_error_naming_them(cuq, cuk, match):
    with pytest.raises(ValueError, match=match):
        attention.forward(QV, KV, KV, cu_seqlens_q=np.asarray(cuq), cu_seqlens_k=np.asarray(cuk))


def test_backward_checks_dout_out_and_dlse_shapes():
    with pytest.raises(ValueError, match=r"dout: expected shape \(2, 4, 4, 8\), got \(2, 4, 4, 7\)"):
        attention.backward(Q, K, V, None, _x(2, 4, 4, 7))
    with pytest.raises(ValueError, match=r"out: expected shape"):
        attention.backward(Q, K, V, _x(2, 4, 4), _x(2, 4, 4, 8))
    with pytest.raises(ValueError, match=r"dlse: expected shape \(2, 4, 4\)"):
        attention.backward(Q, K, V, None, _x(2, 4, 4, 8), dlse=np.zeros((2, 4)))


@pytest.mark.parametrize("precision", ["fast", 80])
def test_nan_in_a_visible_key_poisons_exactly_the_rows_that_see_it(precision):
    q, k, v = _x(1, 4, 2, 4), _x(1, 4, 1, 4, seed=1), _x(1, 4, 1, 4, seed=2)
    v[0, 2, 0, 1] = np.nan                          # key 2 of kv head 0; causal: rows 2, 3 see it
    r = attention.forward(q, k, v, causal=True, precision=precision)
    assert np.all(np.isnan(r.out[0, 2:])) and np.all(np.isinf(r.bound[0, 2:]))
    assert np.all(np.isnan(r.lse[0, :, 2:]))
    assert np.all(np.isfinite(r.out[0, :2])) and np.all(np.isfinite(r.bound[0, :2]))
    clean = attention.forward(q, k, np.nan_to_num(v), causal=True)
    assert np.array_equal(clean.out[0, :2], r.out[0, :2]) or precision != "fast"


def test_nan_in_a_masked_key_does_not_matter():
    q, k, v = _x(1, 4, 1, 4), _x(1, 4, 1, 4, seed=1), _x(1, 4, 1, 4, seed=2)
    v2, k2 = v.copy(), k.copy()
    v2[0, 3] = np.inf
    k2[0, 3] = np.nan                               # only row 3 sees key 3 under causal
    a = attention.forward(q, k, v, causal=True)
    b = attention.forward(q, k2, v2, causal=True)
    assert np.array_equal(a.out[0, :3], b.out[0, :3]) and np.all(np.isnan(b.out[0, 3]))


def test_nan_in_dout_poisons_its_row_dq_and_the_keys_that_row_sees():
    q, k, v, do = _x(1, 4, 1, 4), _x(1, 4, 1, 4, seed=1), _x(1, 4, 1, 4, seed=2), _x(1, 4, 1, 4, seed=3)
    do[0, 1, 0, 0] = np.nan                         # row 1 sees keys 0, 1 (causal)
    b = attention.backward(q, k, v, None, do, causal=True)
    assert np.all(np.isnan(b.dq[0, 1])) and np.all(np.isfinite(b.dq[0, [0, 2, 3]]))
    assert np.all(np.isnan(b.dk[0, :2])) and np.all(np.isfinite(b.dk[0, 2:]))
    assert np.all(np.isnan(b.dv[0, :2])) and np.all(np.isinf(b.dv_bound[0, :2]))


def test_fp8_inputs_are_taken_exactly():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k, v = (x.astype(ml_dtypes.float8_e4m3fn) for x in (Q, K, V))
    a = attention.forward(q, k, v, causal=True)
    b = attention.forward(*(x.astype(np.float32) for x in (q, k, v)), causal=True)
    assert np.array_equal(a.out, b.out) and np.all(a.bound <= b.bound)
