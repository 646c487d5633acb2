"""Import direction, read from the source (AST, no import): the checks, the audit runner, the judge
core and the pytest plugin never import the CLI (``fa4verify.cli``), directly or through any
module they import -- lazy imports inside functions and ``importlib.import_module("...")`` with
a constant name included.

The module graph is built from every ``.py`` file of the installed packages, each named as
pyproject's ``package-dir`` installs it (``kernels/`` is ``fa4verify.kernels``, ...). Importing
``a.b.c`` also runs ``a`` and ``a.b``, so a package's ``__init__`` is an edge too.
"""
from __future__ import annotations

import ast
import sys
from collections import deque
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]

#: What must stay free of the CLI (module names and package prefixes).
CLI_FREE = ("fa4verify.checks", "fa4verify.audit", "fa4verify.judge", "fa4verify.pytest_plugin")
CLI = "fa4verify.cli"


def _package_dirs() -> dict[str, Path]:
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = {name: ROOT / rel for name, rel in tool["package-dir"].items()}
    assert set(dirs) >= {"fa4verify", "fa4verify.kernels", "fa4verify.oracles", "fa4verify.error_budgets"}
    return dirs


def _modules() -> dict[str, Path]:
    """Every module name -> its file; nested package dirs (``kernels/`` inside ``fa4verify``'s
    namespace) are named by the longest package-dir prefix."""
    dirs = _package_dirs()
    mods: dict[str, Path] = {}
    for pkg, d in dirs.items():
        for f in sorted(d.rglob("*.py")):
            rel = f.relative_to(d).with_suffix("").parts
            if "__pycache__" in rel or any(p.startswith(".") for p in rel):
                continue
            name = ".".join((pkg, *rel))
            if rel[-1] == "__init__":
                name = ".".join((pkg, *rel[:-1]))
            mods[name] = f
    return mods


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Module names ``name`` imports anywhere in its file (absolute, relative and
    ``importlib.import_module`` with a constant), restricted to modules of this project, each
    with the packages above it."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
              == "import_module" and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            targets = [node.args[0].value]
        for t in targets:
            parts = t.split(".")
            for i in range(1, len(parts) + 1):
                m = ".".join(parts[:i])
                if m in known:
                    out.add(m)
    out.discard(name)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {m: _imports(m, f, known) for m, f in mods.items()}


def _in(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _paths_to(graph: dict[str, set[str]], start: str, bad) -> list[list[str]]:
    """The shortest import chain from ``start`` to each module in ``bad`` it reaches."""
    prev = {start: None}
    q = deque([start])
    hits = []
    while q:
        m = q.popleft()
        if _in(m, bad):
            chain = [m]
            while prev[chain[-1]] is not None:
                chain.append(prev[chain[-1]])
            hits.append(chain[::-1])
            continue
        for n in sorted(graph.get(m, ())):
            if n not in prev:
                prev[n] = m
                q.append(n)
    return hits


def test_the_module_graph_sees_the_packages_and_their_imports():
    """The scan is not vacuous: it finds the rooms, the CLI, and known edges (lazy ones too)."""
    g = _graph()
    assert {"fa4verify.cli", "fa4verify.cli.exp2", "fa4verify.checks.exp2", "fa4verify.pytest_plugin",
            "fa4verify.judge.verdict", "fa4verify.kernels.adapter", "fa4verify.oracles"} <= set(g)
    assert "fa4verify.cli" in g["fa4verify.cli.exp2"]                     # module-level import
    assert "fa4verify.exp2.mufu_stats" in g["fa4verify.checks.exp2"]           # function-level import
    assert "fa4verify.audit.report_files" in g["fa4verify.pytest_plugin"]
    assert "fa4verify.kernels.evidence" in g["fa4verify.exp2.mufu_stats"]      # kernels/ named as installed


def test_checks_audit_judge_and_plugin_never_import_the_cli():
    g = _graph()
    starts = sorted(m for m in g if _in(m, CLI_FREE))
    assert len(starts) > 20, starts
    offenders = {s: chain for s in starts for chain in _paths_to(g, s, (CLI,))}
    assert not offenders, "\n".join(" -> ".join(c) for c in offenders.values())


def test_the_scan_catches_a_lazy_cli_import(tmp_path):
    """The same scan on a module that imports the CLI inside a function (as checks/exp2.py did)
    finds it: the test above can fail."""
    f = tmp_path / "exp2.py"
    f.write_text("def mufu(ctx):\n    from fa4verify.cli.exp2 import mufu_section\n    return mufu_section()\n")
    g = _graph()
    known = set(g)
    g["fa4verify.checks.exp2"] = _imports("fa4verify.checks.exp2", f, known)
    assert ["fa4verify.checks.exp2", "fa4verify.cli"] in _paths_to(g, "fa4verify.checks.exp2", (CLI,))
    f.write_text("import importlib\n\ndef w():\n    return importlib.import_module('fa4verify.cli.audit')\n")
    assert "fa4verify.cli.audit" in _imports("fa4verify.checks.x", f, known)
    f.write_text("from ..cli import audit\n")
    assert "fa4verify.cli" in _imports("fa4verify.checks.x", f, known)
