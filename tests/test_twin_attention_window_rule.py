"""The CPU twin resolves (causal, window_size) exactly as FA4 4.0.0b36
``interface._resolve_causal_local_window``: only a both-negative window is dropped, and that check
comes before ``causal`` sets right = 0; an empty window (e.g. (0, -1), or causal with left = -1)
gives fully masked rows (O = 0, LSE = -inf), as the oracle says."""
from __future__ import annotations

import importlib
import itertools

import numpy as np
import pytest

from fa4verify.oracles import binary32 as b32

ta = importlib.import_module("fa4verify.kernels.twin.attention")
importlib.import_module("fa4verify.kernels.twin")
from fa4verify.kernels.twin import forward as twin_fwd  # noqa: E402

SIDES = (None, -3, -1, 0, 1, 5)


def bf16(rng, shape):
    return b32.to_bf16(rng.standard_normal(shape).astype(np.float32))


def _qkvdo(seed=0, sq=20, sk=24, d=8):
    rng = np.random.default_rng(seed)
    return bf16(rng, (1, sq, 1, d)), bf16(rng, (1, sk, 1, d)), bf16(rng, (1, sk, 1, d)), bf16(rng, (1, sq, 1, d))


@pytest.mark.fa4
@pytest.mark.parametrize("causal", [False, True])
def test_window_resolution_equals_fa4_interface_function(causal):
    from flash_attn.cute import interface as iface
    for wl, wr in itertools.product(SIDES, SIDES):
        want = iface._resolve_causal_local_window(causal, wl, wr)
        assert twin_fwd.resolve_causal_local_window(causal, (wl, wr)) == want, (causal, wl, wr)


@pytest.mark.parametrize("causal", [False, True])
def test_window_resolution_gives_the_oracle_visible_set(causal):
    """The twin's canonical window and the oracle's (oracles/semantics.resolve_window) see the
    same keys for every (causal, left, right)."""
    sem = importlib.import_module("fa4verify.oracles.semantics")
    sq, sk = 6, 9
    i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
    for wl, wr in itertools.product(SIDES, SIDES):
        is_causal, _local, l, r = twin_fwd.resolve_causal_local_window(causal, (wl, wr))
        ok = np.ones((sq, sk), bool)
        if is_causal or r is not None:                        # the twin's mask (twin_fwd.forward)
            ok &= j <= i + sk - sq + (0 if is_causal else r)
        if l is not None:
            ok &= j >= i + sk - sq - l
        ol, orr = sem.resolve_window(causal, (wl, wr))
        m = sem.visible_mask(sq, sk, ol, orr)
        want = np.ones((sq, sk), bool) if m is None else m
        assert np.array_equal(ok, want), (causal, wl, wr)


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
@pytest.mark.parametrize("causal,window", [(False, (0, -1)), (True, (-1, None)), (False, (-2, 1)),
                                           (True, (-1, 5))])
def test_empty_window_gives_fully_masked_rows_like_the_oracle(arch, causal, window):
    oracle = importlib.import_module("fa4verify.oracles.attention")
    q, k, v, do = _qkvdo(1)
    r = ta.forward(q, k, v, arch=arch, causal=causal, window_size=window)
    ref = oracle.forward(q, k, v, causal=causal, window_size=window)
    assert np.isneginf(ref.lse).all()                 # the oracle: every row sees no key
    assert np.isneginf(r.lse).all()
    assert (r.out == 0).all() and (ref.out == 0).all()
    g = ta.backward(q, k, v, r.out, do, lse=r.lse, arch=arch, causal=causal, window_size=window)
    for n in ("dq", "dk", "dv"):
        assert (getattr(g, n) == 0).all(), n


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
@pytest.mark.parametrize("causal,window", [(False, (-1, -2)), (True, (-3, -1))])
def test_both_negative_window_is_dropped(arch, causal, window):
    """Both sides negative: FA4 drops the window (before ``causal`` applies), so the result is
    bitwise the plain (causal or full) attention."""
    q, k, v, do = _qkvdo(2)
    r = ta.forward(q, k, v, arch=arch, causal=causal, window_size=window)
    p = ta.forward(q, k, v, arch=arch, causal=causal)
    assert np.array_equal(r.out, p.out) and np.array_equal(r.lse, p.lse)
    assert np.isfinite(r.lse).all()
    g = ta.backward(q, k, v, r.out, do, lse=r.lse, arch=arch, causal=causal, window_size=window)
    gp = ta.backward(q, k, v, p.out, do, lse=p.lse, arch=arch, causal=causal)
    for n in ("dq", "dk", "dv"):
        assert np.array_equal(getattr(g, n), getattr(gp, n)), n
