"""``fa4verify.oracles.binary32`` arithmetic equals MPFR (gmpy2 ``ieee(32)``) in every rounding mode, and
mpmath on normal-range results; double-rounding traps defeat a naive fp64 FMA but not the kit."""
from __future__ import annotations

import math

import numpy as np
import pytest

from fa4verify.oracles import binary32 as b32

gmpy2 = pytest.importorskip("gmpy2")
mpmath = pytest.importorskip("mpmath")

MODES = {"rn": gmpy2.RoundToNearest, "rm": gmpy2.RoundDown, "rp": gmpy2.RoundUp, "rz": gmpy2.RoundToZero}
_CTX = {}
for _k, _m in MODES.items():
    _CTX[_k] = gmpy2.ieee(32)
    _CTX[_k].round = _m
MIN_NORMAL = 2.0**-126


def _ftz(v: float) -> float:
    return math.copysign(0.0, v) if v != 0 and abs(v) < MIN_NORMAL else v


def ref_op(op: str, args: tuple[float, ...], rnd: str, flush: bool) -> float:
    if flush:
        args = tuple(_ftz(a) for a in args)
    ctx = _CTX[rnd]
    m = [gmpy2.mpfr(a) for a in args]
    r = float({"add": ctx.add, "sub": ctx.sub, "mul": ctx.mul, "fma": ctx.fma}[op](*m))
    return _ftz(r) if flush else r


def random_operands(n: int, arity: int, seed: int) -> list[np.ndarray]:
    """Random bit patterns, plus operands with nearby exponents (cancellation, ties) and specials."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    out = [a]
    for _ in range(arity - 1):
        near = (a.astype(np.int64) + rng.integers(-2**26, 2**26, n)) & 0xFFFFFFFF
        near ^= rng.integers(0, 2, n).astype(np.int64) << 31
        free = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.int64)
        out.append(np.where(rng.random(n) < 0.7, near, free).astype(np.uint32))
    # narrow the exponents of half the samples to the range where interesting roundings happen
    small = rng.random(n) < 0.5
    for i, x in enumerate(out):
        e = rng.integers(90, 170, n).astype(np.uint32)
        x2 = (x & 0x807FFFFF) | (e << 23)
        out[i] = np.where(small, x2, x).astype(np.uint32)
    special = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 1, 0x80000001, 0x00800000,
                        0x007FFFFF, 0x807FFFFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x3F800000, 0xBF800000,
                        0x33800000, 0xB3800000], dtype=np.uint32)
    grids = np.meshgrid(*([special] * arity), indexing="ij")
    return [np.concatenate([x, g.ravel()]).view(np.float32) for x, g in zip(out, grids)]


def _check(op: str, arrays: list[np.ndarray], rnd: str, flush: bool) -> None:
    fn = {"add": b32.add, "sub": b32.sub, "mul": b32.mul, "fma": b32.fma}[op]
    got = fn(*arrays, rnd, flush=flush)
    with np.errstate(invalid="ignore"):
        cols = [a.astype(np.float64).tolist() for a in arrays]
    ref = np.array([ref_op(op, t, rnd, flush) for t in zip(*cols)], dtype=np.float64).astype(np.float32)
    gn, rn_ = np.isnan(got), np.isnan(ref)
    same = (got.view(np.uint32) == ref.view(np.uint32)) | (gn & rn_)
    bad = np.flatnonzero(~same)
    assert bad.size == 0, f"{op}.{rnd}{'.ftz' if flush else ''}: {bad.size} mismatches, e.g. " + "; ".join(
        f"{[a[i] for a in arrays]} -> kit {got[i]!r} mpfr {ref[i]!r}" for i in bad[:4])
    assert np.all(got.view(np.uint32)[gn] == b32.CANONICAL_NAN_BITS), "NaN results must be canonical"


@pytest.mark.parametrize("rnd", ["rn", "rm", "rp", "rz"])
@pytest.mark.parametrize("op,arity", [("add", 2), ("sub", 2), ("mul", 2), ("fma", 3)])
def test_ops_equal_mpfr_ieee32(op, arity, rnd):
    _check(op, random_operands(12_000, arity, seed=hash((op, rnd)) % 2**31), rnd, flush=False)


@pytest.mark.parametrize("rnd", ["rn", "rm"])
@pytest.mark.parametrize("op,arity", [("add", 2), ("mul", 2), ("fma", 3)])
def test_ftz_ops_equal_mpfr_with_flushed_inputs_and_outputs(op, arity, rnd):
    rng = np.random.default_rng(11)
    n = 6000
    # operands around the subnormal boundary so that flushing matters
    arrays = [(rng.choice([-1, 1], n) * np.exp2(rng.uniform(-150, -120, n))).astype(np.float32)
              for _ in range(arity)]
    if op == "mul":
        arrays[1] = (rng.choice([-1, 1], n) * np.exp2(rng.uniform(-2, 2, n))).astype(np.float32)
    _check(op, arrays, rnd, flush=True)


def test_ftz_flushes_subnormal_results_after_rounding():
    tiny = np.float32(2.0**-140)
    assert b32.mul(tiny, np.float32(0.5), flush=True) == 0 and np.signbit(b32.mul(-tiny, np.float32(0.5), flush=True))
    assert b32.add(np.float32(2.0**-149), np.float32(0.0), flush=True) == 0
    assert b32.ftz(np.float32([-2.0**-149]))[0] == 0 and np.signbit(b32.ftz(np.float32([-2.0**-149]))[0])
    assert b32.ftz(np.float32([2.0**-126]))[0] == np.float32(2.0**-126)


def test_normal_range_results_equal_mpmath():
    """Second, independent reference: mpmath at 24 bits (no subnormals, so normal results only)."""
    rng = np.random.default_rng(2)
    n = 4000
    a, b, c = (rng.uniform(-4, 4, n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32), \
        rng.uniform(-4, 4, n).astype(np.float32), (rng.uniform(-4, 4, n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    mp = mpmath.mp
    modes = {"rn": "n", "rm": "f", "rp": "c", "rz": "d"}
    for rnd, mr in modes.items():
        got = b32.fma(a, b, c, rnd)
        got_add = b32.add(a, c, rnd)
        for i in range(n):
            exact = mp.fadd(mp.fmul(float(a[i]), float(b[i]), exact=True), float(c[i]), exact=True)
            r = mp.fadd(exact, 0, prec=24, rounding=mr)
            if r != 0 and abs(r) >= MIN_NORMAL:
                assert float(r) == float(got[i]), (rnd, a[i], b[i], c[i])
            s = mp.fadd(float(a[i]), float(c[i]), prec=24, rounding=mr)
            if s != 0 and abs(s) >= MIN_NORMAL:
                assert float(s) == float(got_add[i]), (rnd, a[i], c[i])


def double_rounding_traps() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(a, b, c, correct RN result) with a*b + c = c + ulp(c)/2 + ulp(c)/2^31 exactly.

    2^30 + 1 = 162565 * 6605, so a*b = 2^(e-1) + 2^(e-31) for a = 162565, b = 6605 * 2^(e-31).
    RN64 drops the 2^(e-31) term (a quarter of an fp64 ulp of c), leaving an fp32 tie which RNE
    sends to the even neighbour c (c has an even significand), while the correct RN32 is c + ulp(c).
    """
    rng = np.random.default_rng(9)
    m = (rng.integers(2**22, 2**23, 400) * 2).astype(np.float64)     # even 24-bit significands
    e = rng.integers(-90, 90, 400)
    c = np.ldexp(m, e)
    sign = rng.choice([-1.0, 1.0], 400)
    a = np.full(400, 162565.0)
    b = sign * np.ldexp(6605.0, e - 31)
    c = sign * c
    correct = c + sign * np.ldexp(1.0, e)
    assert np.all(162565 * 6605 == 2**30 + 1)
    return a.astype(np.float32), b.astype(np.float32), c.astype(np.float32), correct.astype(np.float32)


def test_naive_fp64_fma_fails_every_trap_and_kit_fails_none():
    a, b, c, correct = double_rounding_traps()
    naive = (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)
    assert np.all(naive != correct), "the traps must defeat a naive float64-then-cast FMA"
    assert np.array_equal(b32.fma(a, b, c, "rn"), correct)
    # and MPFR agrees on what is correct
    ref = [ref_op("fma", (float(x), float(y), float(z)), "rn", False) for x, y, z in zip(a, b, c)]
    assert np.array_equal(np.float32(ref), correct)


def test_naive_fp64_directed_add_fails_the_round_down_trap():
    """add.rm(x, 1.5*2^23) for tiny negative x must give 1.5*2^23 - 1 (the floor trick of exp2)."""
    x = -np.exp2(np.arange(-60, -30, dtype=np.float64)).astype(np.float32)
    C = np.float32(12582912.0)
    s64 = x.astype(np.float64) + 12582912.0           # RN64 loses x entirely
    naive = np.where(s64.astype(np.float32).astype(np.float64) > s64,
                     np.nextafter(s64.astype(np.float32), np.float32(-np.inf)), s64.astype(np.float32))
    assert np.all(naive == C)
    assert np.all(b32.add(x, C, "rm") == np.float32(12582911.0))


def test_exact_zero_signs():
    z, nz = np.float32(0.0), np.float32(-0.0)
    one = np.float32(1.0)
    assert not np.signbit(b32.add(one, -one, "rn")) and np.signbit(b32.add(one, -one, "rm"))
    assert np.signbit(b32.add(nz, nz, "rn")) and not np.signbit(b32.add(z, nz, "rn"))
    assert np.signbit(b32.fma(nz, one, nz, "rp"))
    assert np.signbit(b32.sub(nz, z, "rz"))


def test_unknown_rounding_mode_is_rejected():
    with pytest.raises(ValueError, match="rounding"):
        b32.add(np.float32(1), np.float32(1), "rne")


def test_int32_bit_ops_wrap():
    assert b32.shl_i32(np.uint32(0x7F800000), 23) == 0
    assert b32.shl_i32(np.uint32(0xFFFFFF81), 23) == np.uint32((0xFFFFFF81 << 23) & 0xFFFFFFFF)
    assert b32.add_i32(np.uint32(0xFFFFFFFF), np.uint32(2)) == 1
    assert b32.from_bits(np.int64(-1)).view(np.uint32) == 0xFFFFFFFF
