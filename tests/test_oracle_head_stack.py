"""Note [A group's heads as rows] (``oracles/reference.py``): the query heads of a KV head stacked
into one block give the values each head alone gives (up to BLAS's summation order) and bounds that
still enclose the mpmath arbiter's values; a mis-scattered head would not."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify.oracles import attention, reference


def _case(sink: bool, softcap: float = 0.0):
    rng = np.random.default_rng(4)
    lq, lk = (3, 1, 5), (4, 6, 2)
    cu_q, cu_k = np.r_[0, np.cumsum(lq)].astype(np.int32), np.r_[0, np.cumsum(lk)].astype(np.int32)
    q, do = (rng.standard_normal((sum(lq), 6, 8)).astype(np.float32) for _ in range(2))
    k, v = (rng.standard_normal((sum(lk), 2, 8)).astype(np.float32) for _ in range(2))
    dl = rng.standard_normal((6, sum(lq))).astype(np.float32)
    kw = dict(causal=True, softcap=softcap, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
              learnable_sink=rng.standard_normal(6).astype(np.float32) if sink else None)
    return (q, k, v, do), dl, kw


def _backward(monkeypatch, pairs: int, precision="fast", sink=True, softcap=0.0):
    monkeypatch.setattr(reference, "_HEAD_STACK_PAIRS", pairs)
    (q, k, v, do), dl, kw = _case(sink, softcap)
    return attention.backward(q, k, v, None, do, dlse=dl, precision=precision, **kw)


NAMES = ("dq", "dk", "dv", "dsink", "d")


@pytest.mark.parametrize("sink,softcap", [(True, 0.0), (False, 3.0)])
def test_stacked_heads_give_each_heads_values(monkeypatch, sink, softcap):
    alone = _backward(monkeypatch, 0, sink=sink, softcap=softcap)           # every head its own block
    stacked = _backward(monkeypatch, 1 << 16, sink=sink, softcap=softcap)
    for n in NAMES[:3] + ("d",) + (("dsink",) if sink else ()):
        a, s = np.asarray(getattr(alone, n), np.float64), np.asarray(getattr(stacked, n), np.float64)
        assert np.allclose(s, a, rtol=0, atol=1e-13 * np.abs(a).max()), n      # BLAS's order of sums
        ba, bs = getattr(alone, f"{n}_bound"), getattr(stacked, f"{n}_bound")
        assert np.all(bs <= 2 * ba + 1e-300) and np.all(ba <= 2 * bs + 1e-300), n     # the same order of size
    for n in ("out", "lse"):
        a, s = getattr(alone.forward, n), getattr(stacked.forward, n)
        assert np.allclose(s, a, rtol=0, atol=1e-13 * np.abs(a[np.isfinite(a)]).max()), n


def test_stacked_bounds_enclose_the_arbiter(monkeypatch):
    stacked = _backward(monkeypatch, 1 << 16)
    exact = _backward(monkeypatch, 1 << 16, precision=80)
    for n in NAMES:
        err = np.abs(np.asarray(getattr(stacked, n), np.float64) - np.asarray(getattr(exact, n), np.float64))
        assert np.all(err <= getattr(stacked, f"{n}_bound")), n


def test_a_mis_scattered_head_is_seen(monkeypatch):
    """The test above can fail: the stacked rows put back one head off (heads swapped within the
    group) give another head's dQ."""
    good = _backward(monkeypatch, 1 << 16)
    real_put = reference._put

    def swapped(dst, rs, hs, y):
        if len(hs) > 1:
            y = np.roll(y.reshape((len(hs), -1) + y.shape[1:]), 1, axis=0).reshape(y.shape)
        real_put(dst, rs, hs, y)
    monkeypatch.setattr(reference, "_put", swapped)
    bad = _backward(monkeypatch, 1 << 16)
    assert not np.allclose(bad.dq, good.dq, rtol=0, atol=1e-13 * np.abs(good.dq).max())
