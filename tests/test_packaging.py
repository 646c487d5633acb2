"""The wheel ships every subpackage: ``[tool.setuptools] packages`` in pyproject.toml lists each
package directory of the checkout (fa4verify's own, and kernels/, oracles/, error_budgets/
installed under fa4verify through ``package-dir``). A package missing there imports from the
checkout but not from a wheel install (the slow wheel test would only see the modules it runs)."""
from __future__ import annotations

from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_directory_is_in_the_wheel():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    dirs = {v: k for k, v in cfg["package-dir"].items()}          # source dir -> package name
    found = set()
    for src, pkg in dirs.items():
        for init in (ROOT / src).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / src).parts
            found.add(".".join((pkg,) + rel))
    assert "fa4verify.coverage" in found
    assert found - listed == set(), f"packages missing from pyproject's [tool.setuptools] packages: {sorted(found - listed)}"
    assert listed - found == set(), f"listed packages with no directory: {sorted(listed - found)}"
