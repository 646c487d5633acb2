"""One spelling per dtype and per arch across CLI, TOML, JSON and code (issue #18, item 6).

* dtype: ``bf16``, ``fp16``, ``fp8`` (:data:`fa4verify.kernels.facts.DTYPES`). The pre-#18 spelling
  ``fp8_e4m3`` appears nowhere in the tree except the one place that accepts it on input,
  ``error_budgets/loader.py``'s ``DTYPE_ALIASES`` (the bit-format names ``to_fp8_e4m3fn`` and
  torch's ``float8_e4m3fn`` are formats, not the dtype vocabulary).
* arch: ``sm90``, ``sm100``, ``sm103`` (:data:`fa4verify.kernels.facts.ARCHS`). A compiler target
  string (``"sm_90a"``) is a string literal only in the modules of :data:`COMPILE_TARGET_MODULES`,
  which address the compiler, and ``FLASH_ATTENTION_ARCH`` spellings (``"sm_90"``) only in
  ``kernels/facts.py``.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from fa4verify.kernels import facts

ROOT = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".py", ".toml", ".json", ".md", ".txt", ".sh", ".cfg", ".ini", ".yml", ".yaml"}
SKIP_DIRS = {".git", ".venv", "__pycache__", "build", "dist", ".tox", ".eggs"}

STRAY_DTYPE = re.compile(r"fp8_e4m3(?!fn)")
COMPILE_TARGET = re.compile(r"^sm_\d+a$")
FA4_ARCH_ENV = re.compile(r"^sm_\d+$")

#: module (path from the repo root) -> why it may spell a compiler target string literally
COMPILE_TARGET_MODULES = {
    "kernels/facts.py": "ptx_target / arch_of_ptx_target: the one mapping",
    "fa4verify/cli/sass.py": "`fa4verify sass --arch` selects the compiler target",
    "fa4verify/compile/census.py": "compile-only census cases are compiler targets",
    "fa4verify/checks/census.py": "census checks name the compiled targets",
    "fa4verify/compile/production.py": "compile-only runs take a compiler target",
    "fa4verify/compile/census_atomics.py": "compile-only atomics census",
}


def _text_files():
    for p in sorted(ROOT.rglob("*")):
        rel = p.relative_to(ROOT)
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts):
            continue
        if p.is_file() and p.suffix in TEXT_SUFFIXES:
            yield rel, p


def _alias_block_lines() -> range:
    """The lines of the ``DTYPE_ALIASES = {...}`` statement in the budget loader, with the
    ``#:`` comment right above it."""
    path = ROOT / "error_budgets" / "loader.py"
    lines = path.read_text(encoding="utf-8").splitlines()
    for node in ast.parse("\n".join(lines)).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "DTYPE_ALIASES" for t in node.targets):
            first = node.lineno
            while first > 1 and lines[first - 2].startswith("#:"):
                first -= 1
            return range(first, node.end_lineno + 1)
    pytest.fail("error_budgets/loader.py has no DTYPE_ALIASES")


def test_the_old_fp8_spelling_is_accepted_in_one_place_only():
    alias = _alias_block_lines()
    me = Path(__file__).resolve().relative_to(ROOT)
    stray = []
    for rel, p in _text_files():
        if rel == me:
            continue
        for i, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if STRAY_DTYPE.search(line) and not (rel.as_posix() == "error_budgets/loader.py" and i in alias):
                stray.append(f"{rel}:{i}: {line.strip()[:100]}")
    assert not stray, "the dtype is spelled 'fp8' (facts.DTYPES):\n" + "\n".join(stray)


def test_the_scan_finds_a_stray_spelling(tmp_path):
    assert STRAY_DTYPE.search('dtype = "fp8_e4m3"') and not STRAY_DTYPE.search("b32.to_fp8_e4m3fn(x)")


def test_the_alias_table_maps_old_spellings_to_the_canonical_ones():
    from fa4verify.error_budgets import loader
    assert set(loader.DTYPE_ALIASES.values()) == set(facts.DTYPES)
    assert loader.DTYPE_ALIASES["fp8_e4m3"] == "fp8"
    assert loader.budget_path("fp8_e4m3", "sm100").name == "fp8_sm100.toml"
    assert loader.load("fp8_e4m3", "sm100").dtype == "fp8"


def test_budget_files_use_the_one_vocabulary():
    from fa4verify.error_budgets import loader
    pairs = loader.available()
    assert pairs and {d for d, _a in pairs} <= set(facts.DTYPES) and {a for _d, a in pairs} <= set(facts.ARCHS)
    for p in sorted((ROOT / "error_budgets").glob("*.toml")):
        if p.name.startswith("_"):
            continue
        dt, arch = p.stem.split("_", 1)
        bs = loader.load_file(p)
        assert (bs.dtype, bs.arch) == (dt, arch), p.name
        assert dt in facts.DTYPES and arch in facts.ARCHS, p.name


def test_deployment_profiles_use_the_one_vocabulary():
    try:
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover - python < 3.11
        import tomli as tomllib
    files = sorted((ROOT / "fa4verify" / "data" / "deployments").glob("*.toml"))
    assert files
    for p in files:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
        flat = {k: v for tbl in [data, *[v for v in data.values() if isinstance(v, dict)]]
                for k, v in tbl.items()}
        for key, allowed in (("dtypes", facts.DTYPES), ("dtype", facts.DTYPES),
                             ("archs", facts.ARCHS), ("arch", facts.ARCHS)):
            if key in flat:
                vals = flat[key] if isinstance(flat[key], list) else [flat[key]]
                assert set(vals) <= set(allowed), (p.name, key, vals)


def test_the_twin_speaks_fa4verify_dtypes():
    import numpy as np
    from fa4verify.kernels.twin import attention as ta, fp32
    assert fp32.DTYPES == facts.DTYPES
    ml = pytest.importorskip("ml_dtypes", reason="ml_dtypes (test extra) not installed")
    x = np.zeros((1, 2, 1, 8), dtype=ml.float8_e4m3fn)
    assert fp32.infer_dtype(x)[1] == "fp8"
    q = np.zeros((1, 2, 1, 8), np.float32)
    with pytest.raises(ValueError, match="fp8_e4m3"):
        ta.forward(q, q, q, arch="sm100", dtype="fp8_e4m3")


def _str_constants(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body \
                and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
            docs.add(id(node.body[0].value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


def test_compiler_target_strings_only_where_a_compiler_is_addressed():
    stray = []
    for rel, p in _text_files():
        r = rel.as_posix()
        if p.suffix != ".py" or not r.startswith(("fa4verify/", "kernels/", "oracles/", "error_budgets/")):
            continue
        allowed_target = r in COMPILE_TARGET_MODULES or r.startswith("kernels/probes/")
        for line, s in _str_constants(p):
            if COMPILE_TARGET.match(s) and not allowed_target:
                stray.append(f"{r}:{line}: {s!r} (compiler target outside COMPILE_TARGET_MODULES)")
            if FA4_ARCH_ENV.match(s) and r != "kernels/facts.py":
                stray.append(f"{r}:{line}: {s!r} (FLASH_ATTENTION_ARCH spelling: use facts.fa4_arch_env)")
    assert not stray, "\n".join(stray)


@pytest.mark.parametrize("arch", facts.ARCHS)
def test_compiler_target_round_trips(arch):
    t = facts.ptx_target(arch)
    assert COMPILE_TARGET.match(t) and facts.arch_of_ptx_target(t) == arch
    assert facts.arch_of_fa4_arch_env(facts.fa4_arch_env(arch)) == arch


def test_unknown_arch_spellings_are_rejected():
    with pytest.raises(ValueError):
        facts.ptx_target("sm_90a")
    with pytest.raises(ValueError):
        facts.arch_of_ptx_target("sm90")
