"""docs/architecture.md is the module map: every module it names exists, and every .py file of the
four packages (fa4verify/, kernels/, oracles/, error_budgets/) is named there, under its folder."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("fa4verify", "kernels", "oracles", "error_budgets")


def _named() -> set[str]:
    named, folder = set(), None
    for line in DOC.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^### `([\w/]+)/`\s*$", line)
        if m:
            folder = m.group(1)
            continue
        m = re.match(r"^\* `([\w]+\.py)` -- \S", line)
        if m:
            assert folder is not None, f"{line!r} before any '### `folder/`' heading"
            named.add(f"{folder}/{m.group(1)}")
    return named


def _on_disk() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
            if "__pycache__" not in p.parts}


def test_every_module_named_exists():
    missing = sorted(_named() - _on_disk())
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def test_every_package_module_is_named():
    unnamed = sorted(_on_disk() - _named())
    assert not unnamed, ("modules missing from docs/architecture.md (add one line each under their "
                         f"folder's heading): {unnamed}")


def test_the_parser_sees_the_map():
    assert {"kernels/adapter.py", "oracles/binary32.py", "error_budgets/loader.py",
            "fa4verify/judge/verdict.py"} <= _named()
