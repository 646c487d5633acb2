"""The exp2 verifiers of the mutant suite: the emulated exp2 (mutated or not) against the H200
golden bits (bit-exact gate) and against its certified error bound (exp2 certification)."""
from __future__ import annotations

import numpy as np

from fa4verify.mutants.catalogue import Mutant
from fa4verify.mutants.twin_runs import twin_module
from fa4verify.mutants.verdict import NA, Verdict
from fa4verify.errors import DependencyMissing

def exp2_inputs(profile: str = "quick", seed: int = 2026) -> np.ndarray:
    """Fixed fp32 inputs for the exp2 gates: a uniform sample of [-127, 8] (2^16 values for
    ``quick``, 2^20 for ``full``) plus the edge cases of Note [exp2 emulation] (integers,
    signed zeros, tiny negatives, the (-127, -126) band, -inf, NaN)."""
    rng = np.random.default_rng(seed)
    n = 1 << (16 if profile == "quick" else 20)
    x = rng.uniform(-127.0, 8.0, n).astype(np.float32)
    edges = np.concatenate([
        np.arange(-130, 9, dtype=np.float32),
        np.array([0.0, -0.0, -2.0**-25, -2.0**-30, -1e-38, 1e-38, 2.0**-24, -126.5, -126.99,
                  -127.5, 0.5, 0.999999, 7.999999, -np.inf, np.nan, -np.nan], np.float32),
        -np.ldexp(np.ones(20, np.float32), -np.arange(1, 21)).astype(np.float32),
    ])
    return np.concatenate([x, edges]).astype(np.float32)


def _emulated_exp2_fn():
    """The twin's emulated exp2 with mutations (``twin_attention.emulated_exp2(x, muts)``)."""
    tw = twin_module()
    fn = getattr(tw, "emulated_exp2", None) if tw is not None else None
    if fn is None:
        raise DependencyMissing("twin_attention.emulated_exp2 not available")
    return fn


def _bits_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise: same float32 bits, or both NaN (NaN payloads are not compared)."""
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


def golden_exp2(profile: str = "quick") -> tuple[np.ndarray, np.ndarray, str]:
    """H200 golden bits of FA4's degree-3 emulation (``kernels/evidence/golden/probe_outputs.npz``,
    written by ``scripts/gpu_golden.py``, "measured on NVIDIA H200"): ``(x, y_bits, source)``,
    with x float32. The probe ran ``flash_attn.cute.utils.ex2_emulation`` (the scalar variant);
    the packed ``ex2_emulation_2`` the SM100 kernels run differs from it only on negative
    subnormal inputs (Note [exp2 emulation] in ``kernels/twin.py``), which are left out here.
    ``quick`` keeps every 8th stored input (~126k), ``full`` all (~1.0M)."""
    try:
        from fa4verify.kernels import golden
    except ImportError as exc:
        raise DependencyMissing(f"fa4verify.kernels.golden not available ({exc})") from None
    path = golden.golden_dir() / "probe_outputs.npz"
    if not path.exists():
        raise DependencyMissing(f"no golden vectors at {path}")
    g = golden.load(path)
    xb = np.asarray(g.arrays["x"], np.uint32)
    yb = np.asarray(g.arrays["ex2_emulation_deg3"], np.uint32)
    x = xb.view(np.float32)
    keep = ~((x < 0) & (np.abs(x) < np.float32(2.0**-126)) & (x != 0))
    if profile == "quick":
        keep &= (np.arange(x.size) % 8) == 0
    src = f"{path.name}, {g.provenance.get('where', 'GPU bits')}"
    return x[keep], yb[keep], src


def _v_exp2_golden(m: Mutant | None, profile: str) -> Verdict:
    """Bit-exact gate of the emulated exp2: the function the twin's forward uses (mutated or
    not) against the H200 golden bits (:func:`golden_exp2`). Figure: differing inputs (NaN
    payloads are not compared)."""
    if m is not None and not m.emulation:
        return NA
    fn = _emulated_exp2_fn()
    x, want_bits, src = golden_exp2(profile)
    got = np.asarray(fn(x, frozenset() if m is None else frozenset({m.name})), np.float32)
    want = want_bits.view(np.float32)
    eq = _bits_equal(got, want)
    n_bad = int((~eq).sum())
    if n_bad == 0:
        return Verdict("pass", 0, f"{x.size} inputs bit-identical to the golden bits ({src})")
    i = int(np.flatnonzero(~eq)[0])
    return Verdict("fail", n_bad, f"{n_bad}/{x.size} inputs differ from the golden bits ({src}); "
                                  f"first x={float(x[i])!r}: {float(got[i])!r} vs "
                                  f"{float(want[i])!r}")


def _certified_bound() -> tuple[float, str]:
    """The certified max relative error of FA4's degree-3 emulation: the budgets' ``emu_rel``
    (``error_budgets/loader.py`` CONSTANTS, "certified by ``fa4verify exp2``": 8.77e-5 measured
    over every fp32 input, rounded up)."""
    try:
        from fa4verify.error_budgets.loader import CONSTANTS
    except ImportError as exc:
        raise DependencyMissing(f"fa4verify.error_budgets.loader not available ({exc})") from None
    return float(CONSTANTS["emu_rel"]), "error_budgets emu_rel"


def exp2_cert_inputs(profile: str = "quick") -> np.ndarray:
    """Sorted main-domain inputs of the exp2 certification check: every multiple of 2^-16
    (quick) / 2^-20 (full) in [0, 1) -- the emulation's error on [n, n+1) is that of the fraction
    (Note [Fast exhaustive sweep] (R1) in ``fa4verify.exp2.cert``) -- plus the finite inputs of
    :func:`exp2_inputs` in [-126, 8]."""
    k = 16 if profile == "quick" else 20
    f = (np.arange(1 << k, dtype=np.float64) / (1 << k)).astype(np.float32)
    x = exp2_inputs(profile)
    x = x[np.isfinite(x) & (x >= -126.0) & (x <= 8.0)]
    return np.unique(np.concatenate([f, x]).astype(np.float32))


def _v_exp2_cert(m: Mutant | None, profile: str) -> Verdict:
    """``fa4verify.exp2.cert``'s statistics (``direct_stats``: max relative error, bf16 wrong
    count against the correctly rounded 2^x) of the emulation the twin's forward uses (mutated or
    not) on :func:`exp2_cert_inputs`, against the certified bound and against the unmutated
    emulation on the same inputs. Figure: max relative error / certified bound; fails above 1 or
    when the bf16 wrong count exceeds the unmutated one."""
    if m is not None and not m.poly:
        return NA
    try:
        from fa4verify.exp2 import cert
    except ImportError as exc:
        raise DependencyMissing(f"fa4verify.exp2.cert not available ({exc})") from None
    bound, src = _certified_bound()
    fn = _emulated_exp2_fn()
    x = exp2_cert_inputs(profile)
    y = np.exp2(x.astype(np.float64))
    st = cert.direct_stats(x, fn(x, frozenset() if m is None else frozenset({m.name})), y=y)
    base = st if m is None else cert.direct_stats(x, fn(x, frozenset()), y=y)
    ratio = st.max_rel / bound
    ok = ratio <= 1.0 and st.wrong_bf16 <= base.wrong_bf16
    return Verdict("pass" if ok else "fail", ratio,
                   f"max rel err {st.max_rel:.5g} (at x={st.argmax_rel:.7g}) vs certified "
                   f"{bound:.3g} ({src}); bf16 wrong {st.wrong_bf16}/{st.n} vs unmutated "
                   f"{base.wrong_bf16}")
