"""One errors module: every exception class of the judge package lives in ``fa4verify/errors.py``,
except the few that one module raises and catches itself (listed below with the reason). A new
exception class elsewhere fails here: put it in ``errors.py`` or say why it is local."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "fa4verify"

#: (module, class) -> why it is not in fa4verify/errors.py
LOCAL = {
    ("fa4verify/audit/registry.py", "SkipCheck"): "the check protocol: ctx.skip() raises it, the engine catches it",
    ("fa4verify/judge/verdict.py", "UndecidedError"): "the judge's verdict, raised with its verdicts by the gates",
    ("fa4verify/fuzz/violation.py", "Violation"): "a property's failure, carrying its evidence (a result, not an error)",
    ("fa4verify/pytest_plugin.py", "AuditCheckFailure"): "how the plugin reports a failed check to pytest",
    ("fa4verify/cli/_common.py", "OneLineUsageError"): "click's usage error, one line",
    ("fa4verify/mutants/source.py", "EditError"): "a source patch that does not apply, raised and caught by the patcher",
    ("fa4verify/run/pool.py", "TaskDied"): "the pool's outcome of a killed task, read by the engine",
    ("fa4verify/run/pool.py", "PoolClosed"): "the pool's own state",
}
_BASES = {"Exception", "BaseException", "RuntimeError", "ValueError", "OSError", "AssertionError",
          "NotImplementedError", "ArithmeticError", "ClickException", "TypeError", "KeyError", "LookupError"}


def _exception_classes() -> set[tuple[str, str]]:
    out = set()
    for f in sorted(PKG.rglob("*.py")):
        rel = f.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                names = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases}
                if names & _BASES or any(n.endswith(("Error", "Exception")) for n in names):
                    out.add((rel, node.name))
    return out


def test_every_shared_exception_is_in_the_errors_module():
    stray = sorted((m, c) for m, c in _exception_classes()
                   if m != "fa4verify/errors.py" and not c.startswith("_") and (m, c) not in LOCAL)
    assert not stray, f"exception classes outside fa4verify/errors.py (move them, or list why local): {stray}"


def test_the_local_list_is_current():
    gone = sorted(set(LOCAL) - _exception_classes())
    assert not gone, f"LOCAL names classes that are not there any more: {gone}"


def test_one_name_per_concept():
    from fa4verify import errors
    names = [c for m, c in _exception_classes()]
    assert len(names) == len(set(names)), sorted(n for n in set(names) if names.count(n) > 1)
    assert set(errors.__all__) == {c for m, c in _exception_classes() if m == "fa4verify/errors.py"}
