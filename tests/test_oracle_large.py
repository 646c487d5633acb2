"""The fast reference's bounds hold at sizes where its blocking matters (several row blocks of
512, key blocks of 256): compared with an independent x87 ``longdouble`` (64-bit significand)
evaluation of the same formulas, whose own error (~n 2^-63 of the natural scale) is covered by an
explicit 2^-50 margin on the natural scale (``oracles.stats``)."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify.oracles import attention, stats
from fa4verify.oracles.semantics import resolve_window, visible_mask

ml_dtypes = pytest.importorskip("ml_dtypes")
LD = np.longdouble
MARGIN = 2.0 ** -50

if np.finfo(LD).nmant < 63:  # pragma: no cover - not x86
    pytest.skip("longdouble is not x87 extended precision here", allow_module_level=True)


def _ld_reference(q, k, v, do, *, scale, causal, window, softcap, sink, dlse):
    """Straightforward forward + backward in longdouble; (b, s, h, d) layouts, dlse (b, h, sq)."""
    q, k, v, do = (np.asarray(t, dtype=np.float64).astype(LD) for t in (q, k, v, do))
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    g = h // hk
    left, right = resolve_window(causal, window)
    mask = visible_mask(sq, sk, left, right)
    out = np.zeros(q.shape[:3] + (v.shape[-1],), LD)
    lse = np.zeros((b, h, sq), LD)
    dq, dk, dv = np.zeros(q.shape, LD), np.zeros(k.shape, LD), np.zeros(v.shape, LD)
    dsink = np.zeros(h, LD)
    sc = LD(scale)
    for bi in range(b):
        for hi in range(h):
            kk, vv = k[bi, :, hi // g], v[bi, :, hi // g]
            x = (q[bi, :, hi] @ kk.T) * sc
            if softcap > 0:
                y = LD(softcap) * np.tanh(x / LD(softcap))
                f = 1 / np.cosh(x / LD(softcap)) ** 2
            else:
                y, f = x, None
            if mask is not None:
                y = np.where(mask, y, -np.inf)
            m = y.max(axis=1)
            s_ = LD(float(sink[hi])) if sink is not None else None
            if s_ is not None:
                m = np.maximum(m, s_)
            e = np.exp(y - m[:, None])
            l = e.sum(axis=1) + (np.exp(s_ - m) if s_ is not None else 0)
            P = e / l[:, None]
            O = P @ vv
            out[bi, :, hi] = O
            lse[bi, hi] = m + np.log(l)
            D = (do[bi, :, hi] * O).sum(axis=1)
            Dp = D - (dlse[bi, hi].astype(LD) if dlse is not None else 0)
            dS = P * (do[bi, :, hi] @ vv.T - Dp[:, None])
            if f is not None:
                dS = dS * f
            dq[bi, :, hi] = sc * (dS @ kk)
            dk[bi, :, hi // g] += sc * (dS.T @ q[bi, :, hi])
            dv[bi, :, hi // g] += P.T @ do[bi, :, hi]
            if s_ is not None:
                dsink[hi] += -(np.exp(s_ - m) / l * Dp).sum()
    return dict(out=out, lse=lse, dq=dq, dk=dk, dv=dv, dsink=dsink)


@pytest.mark.parametrize("dtype,kw", [
    ("bf16", dict(causal=True)),
    ("fp32", dict(window_size=(300, 40), softcap=3.0, sink=True, dlse=True)),
], ids=["bf16-causal", "fp32-window-softcap-sink-dlse"])
def test_fast_reference_within_bound_of_longdouble_at_multi_block_sizes(dtype, kw):
    rng = np.random.default_rng(4)
    dt = {"bf16": ml_dtypes.bfloat16, "fp32": np.float32}[dtype]
    b, sq, sk, h, hk, d = 1, 600, 700, 2, 1, 16
    mk = lambda *s: (rng.standard_normal(s) * 1.5).astype(np.float32).astype(dt)  # noqa: E731
    q, k, v, do = mk(b, sq, h, d), mk(b, sk, hk, d), mk(b, sk, hk, d), mk(b, sq, h, d)
    sink = mk(h) if kw.get("sink") else None
    dlse = rng.standard_normal((b, h, sq)) * 0.3 if kw.get("dlse") else None
    causal, window, cap = kw.get("causal", False), kw.get("window_size", (None, None)), kw.get("softcap", 0.0)
    r = attention.backward(q, k, v, None, do, causal=causal, window_size=window, softcap=cap,
                           learnable_sink=sink, dlse=dlse)
    f = r.forward
    ref = _ld_reference(q, k, v, do, scale=f.softmax_scale, causal=causal, window=window,
                        softcap=cap, sink=sink, dlse=dlse)
    sf = stats.forward_stats(q, k, v, causal=causal, window_size=window, softcap=cap, learnable_sink=sink)
    sb = stats.backward_stats(q, k, v, None, do, causal=causal, window_size=window, softcap=cap,
                              learnable_sink=sink, dlse=dlse)
    sc = abs(f.softmax_scale)
    checks = [("out", f.out, f.bound, sf.sum_abs_pv),
              ("lse", f.lse, f.lse_bound, np.maximum(1.0, np.abs(f.lse))),
              ("dq", r.dq, r.dq_bound, sc * sb.sum_pg_k), ("dk", r.dk, r.dk_bound, sc * sb.sum_pg_q),
              ("dv", r.dv, r.dv_bound, sb.sum_abs_p_do)]
    for name, got, bnd, scale in checks:
        err = np.abs(got.astype(LD) - ref[name]).astype(np.float64)
        assert np.all(err <= bnd + MARGIN * scale), (name, float((err - bnd).max()))
        # and the bound itself is small on this well-scaled problem
        assert np.all(bnd <= 2.0 ** -40 * scale + 1e-300), (name, float(np.log2((bnd / scale).max())))
    if sink is not None:
        err = np.abs(r.dsink.astype(LD) - ref["dsink"]).astype(np.float64)
        assert np.all(err <= r.dsink_bound + MARGIN * np.abs(r.dsink).sum())


def test_row_blocks_without_visible_keys_match_the_arbiter():
    """seqlen_q = 1100 > seqlen_k = 6 with causal: the first two row blocks of 512 see no key."""
    rng = np.random.default_rng(8)
    mk = lambda *s: rng.standard_normal(s).astype(np.float32).astype(ml_dtypes.bfloat16)  # noqa: E731
    q, k, v, do = mk(1, 1100, 2, 3), mk(1, 6, 1, 3), mk(1, 6, 1, 3), mk(1, 1100, 2, 3)
    sink = mk(2)
    fast = attention.backward(q, k, v, None, do, causal=True, learnable_sink=sink)
    arb = attention.backward(q, k, v, None, do, causal=True, learnable_sink=sink, precision=80)
    for n in ("dq", "dk", "dv", "d", "dsink"):
        a, b = getattr(fast, n), getattr(arb, n)
        assert np.all(np.abs(a - b) <= getattr(fast, n + "_bound") + getattr(arb, n + "_bound")), n
    assert np.all(np.abs(fast.forward.out - arb.forward.out) <= fast.forward.bound + arb.forward.bound)
    assert np.all(fast.forward.out[0, :1094] == 0) and np.all(fast.dq[0, :1094] == 0)
    assert np.array_equal(fast.forward.lse[0, :, :1094], np.repeat(sink.astype(np.float64)[:, None], 1094, 1))
