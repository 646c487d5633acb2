"""Note [One-hot LSE chain] (error_budgets/interval.py, DERIVATIONS.md#one-hot-chain): the
enclosure of the dominant key's backward P against FA4's SM90 chain simulated here in fp32, every
variant FA4's source admits (fused or unfused exponent argument, contracted finalize or not, both
kernel multipliers), with MUFU and lg2 errors drawn inside their bounds. CPU, exact arithmetic."""
from __future__ import annotations

import math

import numpy as np
import pytest

from fa4verify import error_budgets as eb
from fa4verify.error_budgets import interval as ivm

C = eb.load("bf16", "sm90").constants
F = np.float32


def f32(x):
    return float(F(x))


def _simulate(m, kappa, rng, theta, contracted, bwd_fused):
    """FA4's chain on a one-hot row whose dominant fp32 score is ``m``: (L, the backward's P)."""
    mufu, lg2_abs = float(C["mufu_ex2_rel"]), float(C["lg2_abs"])
    z = m * kappa                                        # exact in float64
    a1 = f32(z)
    x_fwd = (z - a1) if theta else 0.0                   # fma(S, k, -RN(m k)) exact, or RN(RN(S k) - RN(m k)) = 0
    l = 2.0 ** x_fwd * (1 + rng.uniform(-mufu, mufu))   # ex2.approx
    g = math.log2(l) + rng.uniform(-lg2_abs, lg2_abs)   # lg2.approx
    l2 = f32((z if contracted else a1) + g)
    L = f32(l2 * ivm.LN2_F32)
    lam = f32(L * ivm.LOG2E_F32)
    x = f32(z - lam) if bwd_fused else f32(a1 - lam)
    return L, 2.0 ** x * (1 + rng.uniform(-mufu, mufu))


@pytest.mark.parametrize("e", [8, 14, 18, 21, 22, 23])
def test_the_chain_encloses_every_variant_of_fa4s_chain(e):
    rng = np.random.default_rng(e)
    scale = 1 / math.sqrt(64)
    widths = []
    for _ in range(200):
        m = f32(rng.choice([-1, 1]) * rng.uniform(1, 2) * 2.0 ** e / ivm.chain_kappa(scale, False)[0])
        kappa = rng.choice(ivm.chain_kappa(scale, False))
        theta, contracted, bwd_fused = (bool(b) for b in rng.integers(0, 2, 3))
        L, P = _simulate(m, kappa, rng, theta, contracted, bwd_fused)
        lk = 30
        lo = np.full((1, lk), -1e30)
        hi = np.full((1, lk), -1e30 + 1)
        lo[0, 7], hi[0, 7] = m - abs(m) * 2.0 ** -20, m + abs(m) * 2.0 ** -20
        lo[0, :7] = hi[0, :7] = m - 2.0 ** 12 / kappa - abs(m)     # the others far below
        lo[0, 8:] = hi[0, 8:] = m - 2.0 ** 12 / kappa - abs(m)
        rows, cols, plo, phi = ivm.one_hot_chain(lo, hi, np.ones((1, lk), bool), ivm.chain_kappa(scale, False),
                                                 np.array([L]), None, np.array([1.0]), C)
        assert list(rows) == [0] and list(cols) == [7], (m, L)
        assert plo[0] <= P <= phi[0], (e, m, theta, contracted, bwd_fused, plo[0], P, phi[0])
        widths.append(math.log2(phi[0] / plo[0]))
    # two ulps of the LSE in log2 units (1 at |L c| ~ 2^22) where the worst-case roundings admit
    # 2^+-1.25 on each side (~5 u |L c|, DERIVATIONS.md#backward-interval)
    assert max(widths) <= 2.0 ** (e - 22) * 1.01 + 2.0 ** -12, max(widths)


def test_an_lse_the_chain_cannot_give_leaves_the_row_to_the_other_bounds():
    """FA4's LSE off by 2^6 ulps: no fp32 score reproduces it; the row is not decided by the chain
    (the forward's own check judges the LSE), never enclosed around a wrong value."""
    rng = np.random.default_rng(0)
    scale = 0.125
    kappa = ivm.chain_kappa(scale, False)
    m = f32(3.0 * 2.0 ** 21 / kappa[0])
    L, _ = _simulate(m, kappa[0], rng, True, False, True)
    bad = float(np.nextafter(F(L), F(np.inf)))
    for _ in range(63):
        bad = float(np.nextafter(F(bad), F(np.inf)))
    lo = np.array([[m - abs(m) * 2.0 ** -30, -1e30]])
    hi = np.array([[m + abs(m) * 2.0 ** -30, -1e30]])
    rows, *_ = ivm.one_hot_chain(lo, hi, np.ones((1, 2), bool), kappa, np.array([bad]), None, np.array([1.0]), C)
    assert rows.size == 0


def test_rows_without_a_dominant_key_are_left_to_the_other_bounds():
    scale = 0.125
    kappa = ivm.chain_kappa(scale, False)
    m = f32(2.0 ** 20)
    lo = np.array([[m, m - 1.0]])            # the runner-up 1 score unit below: weight ~ 2^-0.18, not one-hot
    hi = lo.copy()
    L = f32(f32(f32(m * kappa[0]) + 0.9) * ivm.LN2_F32)
    rows, *_ = ivm.one_hot_chain(lo, hi, np.ones((1, 2), bool), kappa, np.array([L]), None, np.array([1.0]), C)
    assert rows.size == 0
