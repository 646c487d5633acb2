"""The check registry: decorator validation, discovery (import errors captured), contexts."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from fa4verify.audit import registry
from fa4verify.audit.registry import (CheckContext, CheckResult, CheckSpec, check, discover,
                                      unmet_need)

FIX = os.path.join(os.path.dirname(__file__), "fixtures")


def test_registry_import_is_light():
    code = ("import sys; import fa4verify.audit.registry, fa4verify._options, fa4verify.pytest_plugin; "
            "bad = [m for m in ('torch', 'numpy', 'flash_attn', 'cutlass', 'matplotlib') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("kw, msg", [
    ({"needs": {"tpu"}}, "unknown needs"),
    ({"profiles": {"nightly"}}, "bad profiles"),
    ({"profiles": set()}, "bad profiles"),
    ({"archs": {"sm80"}}, "bad archs"),
])
def test_check_decorator_rejects_bad_arguments(kw, msg):
    with pytest.raises(ValueError, match=msg):
        check("reg.bad", title="x", **kw)


@pytest.mark.parametrize("bad_id", ["Upper.case", "has space", "", ".leading"])
def test_check_ids_are_validated(bad_id):
    with pytest.raises(ValueError, match="check id"):
        check(bad_id)


def test_duplicate_id_from_another_function_is_rejected():
    @check("reg.dup", title="first")
    def first(ctx):
        return CheckResult("pass")

    with pytest.raises(ValueError, match="duplicate check id 'reg.dup'"):
        @check("reg.dup", title="second")
        def second(ctx):
            return CheckResult("pass")


@pytest.mark.parametrize("kw, msg", [
    ({"status": "ok"}, "status"),
    ({"status": "pass", "where": "on my laptop"}, "where"),
    ({"status": "pass", "metrics": {"x": [1, 2]}}, "metric value"),
    ({"status": "pass", "details": {"x": object()}}, "JSON-able"),
])
def test_check_result_is_validated(kw, msg):
    with pytest.raises((ValueError, TypeError), match=msg):
        CheckResult(**kw)


def test_check_result_converts_numpy_values_and_roundtrips():
    np = pytest.importorskip("numpy")
    r = CheckResult("fail", where="CPU twin", metrics={"max_ulp": np.float32(3.5), "n": np.int64(7)},
                    details={"a": np.arange(3), "plot": {"kind": "lines", "x": (1, 2)}},
                    tightness=np.float64(1.25))
    assert type(r.metrics["max_ulp"]) is float and type(r.metrics["n"]) is int
    assert r.details["a"] == [0, 1, 2] and r.details["plot"]["x"] == [1, 2]
    assert CheckResult.from_dict(r.to_dict()) == r


def test_rng_depends_on_seed_and_check_id_only():
    a = CheckContext(seed=5, check_id="x.a").rng().integers(0, 2**31, 4).tolist()
    a2 = CheckContext(seed=5, check_id="x.a", dtype="fp16").rng().integers(0, 2**31, 4).tolist()
    b = CheckContext(seed=5, check_id="x.b").rng().integers(0, 2**31, 4).tolist()
    c = CheckContext(seed=6, check_id="x.a").rng().integers(0, 2**31, 4).tolist()
    assert a == a2
    assert a != b and a != c


def test_progress_without_a_display_counts():
    ctx = CheckContext()
    with ctx.progress(10, "work") as bar:
        bar.advance(3)
        bar.advance(4)
    assert bar.completed == 7


def test_discover_captures_an_import_error_as_an_error_check():
    specs = discover(modules=[os.path.join(FIX, "audit_checks_broken.py"),
                              os.path.join(FIX, "audit_checks_undecided.py")], include_package=False)
    ids = [s.id for s in specs]
    assert "import.audit_checks_broken" in ids and "fixture.undecided" in ids
    broken = next(s for s in specs if s.id == "import.audit_checks_broken")
    res = broken.func(CheckContext())
    assert res.status == "error" and "cannot be imported" in res.summary


def test_discover_imports_every_module_of_a_package(tmp_path, monkeypatch):
    pkg = tmp_path / "fakechecks_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "alpha.py").write_text(textwrap.dedent("""
        from fa4verify.audit.registry import check, CheckResult
        @check("fakepkg.alpha", title="alpha")
        def run(ctx):
            return CheckResult("pass", where="CPU")
    """))
    (pkg / "beta.py").write_text("import no_such_module_fa4verify_test\n")
    (pkg / "_private.py").write_text("raise RuntimeError('must not be imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    specs = discover("fakechecks_pkg")
    assert [s.id for s in specs] == ["fakepkg.alpha", "import.beta"]


def test_unmet_needs_give_the_standard_reasons(monkeypatch):
    spec = CheckSpec(id="n.cuda", title="", needs=frozenset({"cpu", "cuda"}),
                     profiles=registry.PROFILES, func=lambda c: None, module="m")
    assert unmet_need(spec, "cpu", cuda=False) == "no CUDA device (torch.cuda.is_available() is False)"
    assert "--device cpu" in unmet_need(spec, "cpu", cuda=True)
    assert unmet_need(spec, "cuda", cuda=True) is None
    spec2 = CheckSpec(id="n.g", title="", needs=frozenset({"gmpy2", "fa4"}),
                      profiles=registry.PROFILES, func=lambda c: None, module="m")
    monkeypatch.setattr(registry, "_importable", lambda name: name != "gmpy2")
    assert unmet_need(spec2, "cpu") == "gmpy2 missing (pip install gmpy2)"
    monkeypatch.setattr(registry, "_importable", lambda name: name != "flash_attn.cute")
    assert unmet_need(spec2, "cpu").startswith("FA4 missing")


def test_every_shipped_check_module_imports():
    """Each module in fa4verify.checks must import cleanly (else the audit reports an error)."""
    broken = [s.id for s in discover() if s.id.startswith("import.")]
    assert broken == []
