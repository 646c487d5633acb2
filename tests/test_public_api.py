"""The public API of ``fa4verify`` (issue #18, item 6): real signatures, an ``__all__``, a light import."""
from __future__ import annotations

import importlib
import inspect
import subprocess
import sys

import pytest

import fa4verify


def test_all_lists_exactly_the_public_names_and_each_resolves():
    assert isinstance(fa4verify.__all__, list) and len(set(fa4verify.__all__)) == len(fa4verify.__all__)
    for name in fa4verify.__all__:
        assert getattr(fa4verify, name) is not None, name
    public = {n for n in dir(fa4verify) if not n.startswith("_")}
    assert public <= set(fa4verify.__all__) | {"annotations", "importlib", "TYPE_CHECKING", "Any"} \
        | {m for m in public if inspect.ismodule(getattr(fa4verify, m, None))}, public


@pytest.mark.parametrize("name, home", [
    ("assert_attention_within_budget", "fa4verify.gates"),
    ("GateSummary", "fa4verify.gates"),
    ("UndecidedError", "fa4verify.judge"),
    ("Verdict", "fa4verify.judge"),
    ("compare", "fa4verify.judge"),
    ("BudgetStats", "fa4verify.judge"),
    ("AttentionProblem", "fa4verify.problem"),
])
def test_reexport_is_the_home_modules_own_object(name, home):
    assert name in fa4verify.__all__
    assert getattr(fa4verify, name) is getattr(importlib.import_module(home), name)


def test_gate_signature_shows_its_real_parameters():
    from fa4verify import gates
    sig = inspect.signature(fa4verify.assert_attention_within_budget)
    assert sig == inspect.signature(gates.assert_attention_within_budget)
    params = sig.parameters
    assert list(params)[:4] == ["out", "q", "k", "v"]
    assert {"dtype", "arch", "causal", "softmax_scale", "window_size", "budget"} <= set(params)
    assert all(p.kind is not inspect.Parameter.VAR_POSITIONAL and p.kind is not inspect.Parameter.VAR_KEYWORD
               for p in params.values()), sig
    assert params["arch"].default == "sm90" and params["dtype"].kind is inspect.Parameter.KEYWORD_ONLY


def test_compare_signature_is_not_a_wrapper():
    from fa4verify.judge import verdict
    assert inspect.signature(fa4verify.compare) == inspect.signature(verdict.compare)
    assert fa4verify.compare.__module__ == "fa4verify.judge.verdict"


def test_unknown_attribute_raises_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        fa4verify.not_a_name  # noqa: B018


def test_importing_the_package_stays_light():
    code = ("import sys, fa4verify; "
            "bad = [m for m in ('numpy', 'torch', 'flash_attn', 'cutlass') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
