"""Imports run one way (issue #18, item 2), checked on the source by an AST scan.

* No module under ``kernels/`` (the subject), ``oracles/`` (the truth) or ``error_budgets/`` (the
  tolerance) imports the judge: every ``fa4verify.*`` import there is ``fa4verify.kernels``, ``fa4verify.oracles`` or
  ``fa4verify.error_budgets``; and ``oracles/`` never imports ``fa4verify.kernels``.
* ``flash_attn`` (FA4) is imported by exactly one module per concern, the modules named in
  :data:`FA4_IMPORTERS`, and each of them names its concern in its docstring.

The scan reads every ``import``/``from ... import`` statement (at any depth: lazy imports inside
functions count) and every ``importlib.import_module("...")`` / ``__import__("...")`` call with a
literal name; relative imports are resolved against the module's installed name.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: source directory -> installed package name (pyproject's ``package-dir``)
PACKAGE_DIRS = {"fa4verify": "fa4verify", "kernels": "fa4verify.kernels",
                "oracles": "fa4verify.oracles", "error_budgets": "fa4verify.error_budgets"}

#: concern -> the one module that imports ``flash_attn.cute`` for it (its docstring names it).
FA4_IMPORTERS = {
    "production kernels": "fa4verify.kernels.adapter",
    "FA4's parameters": "fa4verify.kernels.fa4_params",
    "the probes' device functions": "fa4verify.kernels.fa4_device",
    "its persistent kernel cache": "fa4verify.kernels.kernel_cache",
}

SUBJECT_OR_TRUTH_MAY_IMPORT = ("fa4verify.kernels", "fa4verify.oracles", "fa4verify.error_budgets")


def _modules(src_dir: str):
    base = ROOT / src_dir
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(base).with_suffix("")
        parts = list(rel.parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        yield ".".join([PACKAGE_DIRS[src_dir], *parts]), path, is_pkg


def _imports(name: str, path: Path, is_pkg: bool) -> list[tuple[int, str]]:
    """``(line, absolute module name)`` of every import in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if is_pkg else name.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.append((node.lineno, mod))
            # ``from fa4verify import gates`` imports fa4verify.gates
            found += [(node.lineno, f"{mod}.{a.name}") for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            f = node.func
            fname = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if fname in ("import_module", "__import__"):
                found.append((node.lineno, node.args[0].value))
    return found


def _all_modules():
    for d in PACKAGE_DIRS:
        yield from _modules(d)


def _is_within(mod: str, prefixes) -> bool:
    return any(mod == p or mod.startswith(p + ".") for p in prefixes)


def test_scan_sees_the_modules_it_judges():
    names = {n for n, _p, _k in _all_modules()}
    # the scan must reach the twin package, the binary32 kit and the probes, or it proves nothing
    for must in ("fa4verify.kernels.twin.forward", "fa4verify.kernels.twin.backward",
                 "fa4verify.oracles.binary32", "fa4verify.kernels.probes.probe_cvt",
                 "fa4verify.error_budgets.loader",
                 "fa4verify.kernels.adapter", "fa4verify.compile.census"):
        assert must in names, must


def test_scan_resolves_relative_imports_and_lazy_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from . import reference as r\nfrom ..judge import compare\n"
                 "def g():\n    import flash_attn.cute\n    importlib.import_module('fa4verify.gates')\n")
    got = {m for _l, m in _imports("fa4verify.oracles.m", f, False)}
    assert {"fa4verify.oracles", "fa4verify.oracles.reference", "fa4verify.judge",
            "fa4verify.judge.compare", "flash_attn.cute", "fa4verify.gates"} <= got


@pytest.mark.parametrize("src_dir", ["kernels", "oracles", "error_budgets"])
def test_subject_truth_and_tolerance_never_import_the_judge(src_dir):
    bad = []
    for name, path, is_pkg in _modules(src_dir):
        for line, mod in _imports(name, path, is_pkg):
            if _is_within(mod, ("fa4verify",)) and mod != "fa4verify" \
                    and not _is_within(mod, SUBJECT_OR_TRUTH_MAY_IMPORT):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {mod}")
            if mod == "fa4verify":   # ``import fa4verify`` / ``from fa4verify import x``
                bad.append(f"{path.relative_to(ROOT)}:{line} imports the fa4verify package itself")
    assert not bad, "wrong-way imports (the judge is imported by kernels/oracles, never the reverse):\n" \
        + "\n".join(bad)


def test_oracles_never_import_the_subject():
    bad = [f"{p.relative_to(ROOT)}:{line} imports {mod}"
           for name, p, k in _modules("oracles") for line, mod in _imports(name, p, k)
           if _is_within(mod, ("fa4verify.kernels",))]
    assert not bad, "\n".join(bad)


def test_one_importer_of_flash_attn_per_concern():
    importers: dict[str, list[str]] = {}
    for name, path, is_pkg in _all_modules():
        for line, mod in _imports(name, path, is_pkg):
            if _is_within(mod, ("flash_attn",)):
                importers.setdefault(name, []).append(f"{path.relative_to(ROOT)}:{line} {mod}")
    assert set(importers) == set(FA4_IMPORTERS.values()), (
        "flash_attn is imported outside the one importer per concern:\n"
        + "\n".join(f"{m}: {v}" for m, v in sorted(importers.items())
                    if m not in FA4_IMPORTERS.values()))


@pytest.mark.parametrize("concern", sorted(FA4_IMPORTERS))
def test_each_importer_names_its_concern_in_its_docstring(concern):
    mod = FA4_IMPORTERS[concern]
    for name, path, _k in _all_modules():
        if name == mod:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
            flat = " ".join(doc.split())
            assert f"The one importer of ``flash_attn.cute`` for {concern}" in flat, (mod, concern)
            return
    pytest.fail(f"{mod} not found")


def test_twin_backward_uses_no_private_of_the_forward():
    """The fp32 helpers both passes use are public (``twin/fp32.py``): the backward imports no
    ``_name`` from the forward module and reads no ``tf._name`` attribute of it."""
    path = ROOT / "kernels" / "twin" / "backward.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    fwd = "fa4verify.kernels.twin.forward"
    aliases = set()
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            for a in node.names:
                if mod == fwd and a.name.startswith("_"):
                    bad.append(f"line {node.lineno}: from {mod} import {a.name}")
                if mod == "fa4verify.kernels.twin" and a.name == "forward":
                    aliases.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            aliases |= {a.asname for a in node.names if a.name == fwd and a.asname}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in aliases and node.attr.startswith("_"):
            bad.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    assert aliases, "the backward no longer imports the forward module: update this test"
    assert not bad, "\n".join(bad)
