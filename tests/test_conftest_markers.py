"""tests/conftest.py is the one place that decides "CUDA there", "FA4 installed" and "extended run",
and skips ``gpu`` / ``fa4`` / ``slow(extended=...)`` tests with the reason; no test file hand-rolls
those skips; the markers are registered and strict."""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import conftest as C

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"


class _Item:
    """The part of a pytest item :func:`conftest.skip_reason` reads."""

    def __init__(self, *marks):
        self._marks = {m.mark.name: m.mark for m in marks}

    def get_closest_marker(self, name):
        return self._marks.get(name)


def _ini() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]


def test_markers_are_registered_and_strict():
    names = {m.split(":")[0].strip() for m in _ini()["markers"]}
    assert names == {"gpu", "slow", "fa4"}
    assert "--strict-markers" in _ini()["addopts"].split()


def test_gpu_tests_skip_with_the_adapters_reason_exactly_when_cuda_is_unusable():
    from fa4verify.kernels import adapter
    ok, why = adapter.cuda_status()
    got = C.skip_reason(_Item(pytest.mark.gpu))
    if ok:  # pragma: no cover - GPU machine
        assert got is None
    else:
        assert got == f"no CUDA device: {why}" and why


def test_fa4_tests_skip_naming_the_missing_distribution(monkeypatch):
    import importlib.util
    installed = all(importlib.util.find_spec(m) is not None for m in C.FA4_PACKAGES)
    assert (C.skip_reason(_Item(pytest.mark.fa4)) is None) == installed
    monkeypatch.setitem(C.FA4_PACKAGES, "fa4verify_no_such_module", "no-such-dist")
    C.fa4_status.cache_clear()
    try:
        got = C.skip_reason(_Item(pytest.mark.fa4))
    finally:
        C.fa4_status.cache_clear()
    assert got is not None and got.startswith("no-such-dist") and got.endswith(
        "not installed (pip install 'fa4verify[fa4]')"), got


def test_extended_slow_tests_need_fa4verify_slow(monkeypatch):
    ext = _Item(pytest.mark.slow(extended="the full compile matrix"))
    monkeypatch.delenv("FA4VERIFY_SLOW", raising=False)
    assert C.skip_reason(ext) == "extended run: set FA4VERIFY_SLOW=1 for the full compile matrix"
    assert C.skip_reason(_Item(pytest.mark.slow)) is None          # plain slow: runs (CI's tier)
    monkeypatch.setenv("FA4VERIFY_SLOW", "1")
    assert C.skip_reason(ext) is None


def test_a_run_of_marked_tests_skips_with_their_reasons(tmp_path):
    """End to end in a fresh pytest: the copied conftest and the pyproject markers."""
    d = tmp_path / "suite"
    d.mkdir()
    shutil.copy(TESTS / "conftest.py", d / "conftest.py")
    markers = "\n".join(f"    {m}" for m in _ini()["markers"])
    (d / "pytest.ini").write_text(f"[pytest]\naddopts = -ra --strict-markers\nmarkers =\n{markers}\n")
    (d / "test_marked.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.gpu
        def test_gpu():
            pass

        @pytest.mark.slow(extended="a long thing")
        def test_extended():
            pass

        @pytest.mark.slow
        def test_slow():
            pass

        def test_no_cuda(no_cuda):
            pass
    """))
    env = {k: v for k, v in os.environ.items() if k != "FA4VERIFY_SLOW"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                        "-p", "no:fa4verify", "-rs", str(d)], cwd=d, capture_output=True, text=True, env=env,
                       timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "extended run: set FA4VERIFY_SLOW=1 for a long thing" in out
    from fa4verify.kernels import adapter
    ok, why = adapter.cuda_status()
    assert "2 passed, 2 skipped" in out                      # slow runs; extended and one more skip
    if ok:  # pragma: no cover - GPU machine: the gpu test runs, the no_cuda one skips
        assert f"a CUDA device is present ({why})" in out and "no CUDA device" not in out
    else:
        assert f"no CUDA device: {why}" in out and "a CUDA device is present" not in out


def _hand_rolled_skips(src: str) -> list[tuple[int, str]]:
    """CUDA / FA4 / FA4VERIFY_SLOW skips written in a test file instead of by marker."""
    def seg(n) -> str:
        return ast.get_source_segment(src, n) or ""

    out = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.If) and "cuda.is_available()" in seg(node.test) and any(
                isinstance(c, ast.Call) and getattr(c.func, "attr", "") == "skip"
                for b in node.body for c in ast.walk(b)):
            out.append((node.lineno, "if cuda.is_available(): pytest.skip"))
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "importorskip" and node.args \
                and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).split(".")[0] in (
                    "flash_attn", "cutlass"):
            out.append((node.lineno, f"importorskip({node.args[0].value!r})"))
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "skipif" and (
                "find_spec(\"flash_attn\")" in seg(node) or "find_spec('flash_attn')" in seg(node)
                or "FA4VERIFY_SLOW" in seg(node) or "SLOW" in [getattr(a, "id", "") for a in ast.walk(node)]):
            out.append((node.lineno, "skipif(flash_attn / FA4VERIFY_SLOW)"))
    return sorted(out)


def test_the_lint_finds_hand_rolled_skips():
    src = textwrap.dedent("""
        import importlib.util, os, pytest
        SLOW = os.environ.get("FA4VERIFY_SLOW") == "1"
        a = pytest.mark.skipif(importlib.util.find_spec("flash_attn") is None, reason="x")
        b = pytest.mark.skipif(not SLOW, reason="y")
        def test_t():
            import torch
            if not torch.cuda.is_available():
                pytest.skip("no CUDA")
            i = pytest.importorskip("flash_attn.cute.interface")
    """)
    assert [w for _, w in _hand_rolled_skips(src)] == [
        "skipif(flash_attn / FA4VERIFY_SLOW)", "skipif(flash_attn / FA4VERIFY_SLOW)",
        "if cuda.is_available(): pytest.skip", "importorskip('flash_attn.cute.interface')"]


def test_no_test_file_hand_rolls_a_cuda_fa4_or_slow_skip():
    offenders = [f"{p.name}:{ln} {what}" for p in sorted(TESTS.glob("test_*.py"))
                 for ln, what in _hand_rolled_skips(p.read_text())]
    assert not offenders, "use the gpu / fa4 / slow(extended=...) markers (tests/conftest.py):\n" + \
        "\n".join(offenders)
