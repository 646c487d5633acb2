"""Recorded GPU evidence about the subject (FA4 and the probe kernels), shipped as package data.

Installed as ``fa4verify.kernels.evidence`` (source folder ``kernels/evidence/``), so a wheel
install carries it and every reader finds it without a source checkout:

* ``golden/`` -- probe golden vectors (``probe_outputs``, ``exparg_outputs``: ``.npz`` + provenance
  ``.json``, written by ``scripts/gpu_golden.py``), MUFU statistics (``mufu_stats.json``), the SM90
  backward head-dim sweeps (``hd_sweep_h200.json``, ``hd_sweep_seqlens_h200.json``), production
  figures (``production_figures.json``) and the SASS census (``census_sm90a_sm100a.json``);
* ``determinism/`` -- the deterministic-backward evidence (``h200_manifest.json``,
  ``h200_report.json``, log, ``nvidia-smi``; ``README.md`` there).

This is the one accessor: every reader goes through :func:`evidence_dir` / :func:`evidence_path`
(``fa4verify.kernels.golden.golden_dir()`` is ``evidence_path("golden")``). Standard library only:
``fa4verify.kernels`` never imports the judge.
"""
from __future__ import annotations

import atexit
import contextlib
import sys
import tempfile
from importlib import resources
from pathlib import Path
from typing import Optional

__all__ = ["evidence_dir", "evidence_path"]

_root: Optional[Path] = None
_stack = contextlib.ExitStack()
atexit.register(_stack.close)


def _copy_tree(src, dst: Path) -> None:
    """Copy a :class:`importlib.resources.abc.Traversable` tree to ``dst`` (zip installs, < 3.12)."""
    dst.mkdir(parents=True, exist_ok=True)
    for child in src.iterdir():
        if child.is_dir():
            _copy_tree(child, dst / child.name)
        elif child.name != "__init__.py" and not child.name.endswith((".pyc", ".pyo")):
            (dst / child.name).write_bytes(child.read_bytes())


def evidence_dir() -> Path:
    """A real filesystem directory holding the evidence (``golden/``, ``determinism/``).

    On an ordinary install (wheel or editable) this is the package's own folder; from a zip it is
    a temporary copy made once per process (``importlib.resources.as_file``) and removed at exit.
    """
    global _root
    if _root is None:
        res = resources.files(__name__)
        if isinstance(res, Path):
            _root = res
        elif sys.version_info >= (3, 12):          # as_file accepts directories from 3.12 on
            _root = Path(_stack.enter_context(resources.as_file(res)))
        else:
            tmp = Path(_stack.enter_context(tempfile.TemporaryDirectory(prefix="fa4v-evidence-")))
            _copy_tree(res, tmp)
            _root = tmp
    return _root


def evidence_path(name: str) -> Path:
    """Filesystem path of ``name`` (``"golden/mufu_stats.json"``, ``"determinism"``) in the evidence.

    The path may not exist (evidence not recorded yet); callers check and say so.
    """
    return evidence_dir().joinpath(*[p for p in name.split("/") if p])

