"""``fa4verify.gates.assert_attention_within_budget``: passes correctly rounded outputs, catches
injected errors with a numpy-testing-style message, honours fixture budgets."""
from __future__ import annotations

import importlib
import os
import re

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")
importlib.import_module("fa4verify.oracles.attention")
importlib.import_module("fa4verify.error_budgets")

from fa4verify import assert_attention_within_budget as reexported  # noqa: E402
from fa4verify.gates import GateSummary, assert_attention_within_budget  # noqa: E402
from fa4verify.oracles.attention import forward  # noqa: E402

FIX = os.path.join(os.path.dirname(__file__), "fixtures")
TIGHT = os.path.join(FIX, "budget_gate_tight.toml")
BF16 = ml_dtypes.bfloat16


def problem(seed=0, b=1, m=48, n=48, h=2, hk=2, d=32):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, m, h, d)).astype(BF16)
    k = rng.standard_normal((b, n, hk, d)).astype(BF16)
    v = rng.standard_normal((b, n, hk, d)).astype(BF16)
    return q, k, v


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
@pytest.mark.parametrize("causal, hk, n", [(False, 2, 48), (True, 1, 80)])
def test_correctly_rounded_output_is_within_the_shipped_budget(arch, causal, hk, n):
    q, k, v = problem(hk=hk, n=n)
    o = forward(q, k, v, causal=causal)
    out = o.out.astype(BF16)  # the best a bf16 kernel can do
    s = assert_attention_within_budget(out, q, k, v, causal=causal, arch=arch, oracle=o)
    assert isinstance(s, GateSummary) and s.count_over == 0
    assert s.n == out.size and 0 < s.tightness <= 1.0
    assert s.max_ulp <= 0.5 + 1e-9  # RNE: at most half a bf16 ulp from the exact value


def test_injected_errors_are_reported_with_indices_values_ulps_and_case():
    q, k, v = problem()
    o = forward(q, k, v)
    bad = o.out.copy()
    bad[0, 7, 1, 3] += 0.25     # (b, m, h, d)
    bad[0, 2, 0, 30] -= 0.125
    with pytest.raises(AssertionError) as ei:
        assert_attention_within_budget(bad.astype(BF16), q, k, v, arch="sm90", oracle=o)
    text = str(ei.value)
    assert "budget 'forward_out' (bf16, sm90" in text
    assert "|out - O_oracle| <= forward_out(stats) + oracle.bound" in text
    assert f"Mismatched elements: 2 / {bad.size} (" in text
    lines = [ln for ln in text.splitlines() if ln.startswith("  (")]
    # reported in (b, h, m, d) order: (0, 0, 2, 30) before (0, 1, 7, 3)
    assert lines[0].startswith("  (0, 0, 2, 30): kernel") and lines[1].startswith("  (0, 1, 7, 3): kernel")
    ulps = [float(x) for x in re.findall(r"\(([0-9.e+-]+) bf16 ulps\)", text)]
    assert len(ulps) == 2 and min(ulps) > 1
    assert "Max: |err|" in text and "at (b, h, m, d) = (0, 1, 7, 3)" in text
    assert "Case: dtype=bf16 arch=sm90 batch=1 seqlen_q=48 seqlen_k=48 nheads=2" in text


def test_only_the_first_five_violations_are_listed():
    q, k, v = problem()
    o = forward(q, k, v)
    bad = o.out + 1.0
    with pytest.raises(AssertionError) as ei:
        reexported(bad.astype(BF16), q, k, v, arch="sm100", oracle=o)
    text = str(ei.value)
    assert f"Mismatched elements: {bad.size} / {bad.size} (100%)" in text
    assert len([ln for ln in text.splitlines() if ln.startswith("  (")]) == 5


def test_a_fixture_budget_tighter_than_rounding_rejects_a_correctly_rounded_output():
    q, k, v = problem()
    o = forward(q, k, v)
    out = o.out.astype(BF16)
    with pytest.raises(AssertionError, match="Mismatched elements"):
        assert_attention_within_budget(out, q, k, v, budget=TIGHT, oracle=o)


def test_nan_in_the_output_is_a_violation():
    q, k, v = problem()
    o = forward(q, k, v)
    bad = o.out.copy()
    bad[0, 0, 0, 0] = np.nan
    with pytest.raises(AssertionError, match=r"Mismatched elements: 1 /"):
        assert_attention_within_budget(bad.astype(BF16), q, k, v, oracle=o)


def test_the_gate_computes_the_oracle_itself_and_infers_the_dtype():
    q, k, v = problem(m=16, n=16)
    out = forward(q, k, v).out.astype(BF16)
    assert assert_attention_within_budget(out, q, k, v).count_over == 0


@pytest.mark.parametrize("kw, msg", [
    ({"arch": "sm80"}, "arch"), ({"dtype": "fp32"}, "dtype"), ({"softcap": -5.0}, "softcap"),
    ({"softcap": float("nan")}, "softcap"),
])
def test_bad_arguments_are_value_errors(kw, msg):
    q, k, v = problem(m=8, n=8)
    with pytest.raises(ValueError, match=msg):
        assert_attention_within_budget(np.zeros((1, 8, 2, 32), BF16), q, k, v, **kw)


def test_wrong_output_shape_is_a_value_error():
    q, k, v = problem(m=8, n=8)
    with pytest.raises(ValueError, match="out: shape"):
        assert_attention_within_budget(np.zeros((1, 8, 2, 16), BF16), q, k, v)


def test_softcap_correctly_rounded_output_passes_and_a_shifted_one_fails():
    q, k, v = problem(m=24, n=40)
    o = forward(q, k, v, softcap=5.0)
    s = assert_attention_within_budget(o.out.astype(BF16), q, k, v, softcap=5.0, arch="sm90", oracle=o)
    assert s.status == "pass" and s.count_over == 0
    with pytest.raises(AssertionError, match="Mismatched elements"):
        assert_attention_within_budget((o.out + 0.05).astype(BF16), q, k, v, softcap=5.0, arch="sm90", oracle=o)


# --------------------------------------------------------------------- Note [Undecided] at the gate
from fa4verify.judge import UndecidedError  # noqa: E402


def test_all_nan_q_with_a_zero_output_is_undecided_not_a_pass():
    q, k, v = problem(m=8, n=8)
    qn = np.full(q.shape, np.nan, dtype=BF16)
    with pytest.raises(UndecidedError, match="undecided") as ei:
        assert_attention_within_budget(np.zeros((1, 8, 2, 32), BF16), qn, k, v, arch="sm90")
    assert "NaN" in str(ei.value)


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_logits_scaled_1e7_with_a_zero_output_are_undecided(arch):
    q, k, v = problem(m=8, n=8)
    q7 = (q.astype(np.float32) * 1e7).astype(BF16)
    k7 = (k.astype(np.float32) * 1e7).astype(BF16)
    with pytest.raises(AssertionError) as ei:
        assert_attention_within_budget(np.zeros((1, 8, 2, 32), BF16), q7, k7, v, arch=arch)
    # a zero output is wrong; the judge must never call it a pass. Either it can judge some
    # elements (fail) or it cannot (undecided); with bound inf it is undecided
    assert isinstance(ei.value, UndecidedError) or "Mismatched" in str(ei.value)
    if isinstance(ei.value, UndecidedError):
        assert "undecided" in str(ei.value)


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_logits_scaled_1000_with_the_exact_oracle_output_never_fail(arch):
    q, k, v = problem(m=8, n=8)
    q3 = (q.astype(np.float32) * 1000).astype(BF16)
    k3 = (k.astype(np.float32) * 1000).astype(BF16)
    o = forward(q3, k3, v)
    try:
        s = assert_attention_within_budget(o.out, q3, k3, v, arch=arch, oracle=o, dtype="bf16")
    except UndecidedError as e:
        assert "undecided" in str(e)
    else:
        assert s.status == "pass" and s.count_over == 0


def test_nothing_compared_is_undecided():
    from fa4verify.judge import compare
    v = compare("x", np.zeros(0), np.zeros(0))
    assert v.status == "undecided" and "nothing compared" in v.reason
