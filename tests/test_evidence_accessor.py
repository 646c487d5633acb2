"""``fa4verify.kernels.evidence``: the one accessor of the recorded GPU evidence (package data).

The wheel install itself is tests/test_wheel_install.py; here: the paths every reader uses, and
the branch for a package that is not a plain directory (zip import), where the evidence is
copied out to a real directory once per process.
"""
from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from fa4verify.kernels import evidence, golden

SRC = Path(__file__).resolve().parents[1] / "kernels" / "evidence"


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_every_reader_resolves_into_the_package_evidence():
    root = evidence.evidence_dir()
    assert root.is_dir() and (root / "__init__.py").is_file()
    assert golden.golden_dir() == evidence.evidence_path("golden") == root / "golden"
    for name in ("golden/probe_outputs.npz", "golden/exparg_outputs.npz", "golden/mufu_stats.json",
                 "golden/hd_sweep_h200.json", "golden/hd_sweep_seqlens_h200.json",
                 "golden/production_figures.json", "determinism/h200_manifest.json"):
        assert evidence.evidence_path(name).is_file(), name
    from fa4verify.exp2 import mufu_stats
    assert mufu_stats.MUFU_STATS == evidence.evidence_path("golden/mufu_stats.json")
    assert mufu_stats.mufu_section()["status"] == "recorded"


def test_zip_installed_evidence_is_copied_to_a_real_directory(tmp_path, monkeypatch):
    """A Traversable that is not a pathlib.Path (zipfile.Path, as for a zip import)."""
    zpath = tmp_path / "ev.zip"
    files = sorted(p for p in SRC.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                   and p.suffix in (".json", ".md", ".txt"))
    assert files
    with zipfile.ZipFile(zpath, "w") as z:
        for p in files:
            z.write(p, "fa4verify/kernels/evidence/" + p.relative_to(SRC).as_posix())
        z.writestr("fa4verify/kernels/evidence/__init__.py", "")
    zroot = zipfile.Path(zpath, "fa4verify/kernels/evidence/")
    monkeypatch.setattr(evidence.resources, "files", lambda name: zroot)
    monkeypatch.setattr(evidence, "_root", None)
    try:
        d = evidence.evidence_dir()
        assert isinstance(d, Path) and d.is_dir() and not d.is_relative_to(SRC)
        for p in files:
            rel = p.relative_to(SRC).as_posix()
            assert _sha(evidence.evidence_path(rel)) == _sha(p), rel
        assert evidence.evidence_dir() is d                      # made once per process
    finally:
        monkeypatch.setattr(evidence, "_root", None)   # undone at teardown: the real package again


@pytest.mark.parametrize("name", ["golden/no_such_file.json", "determinism/none.json"])
def test_missing_evidence_is_a_path_that_does_not_exist(name):
    p = evidence.evidence_path(name)
    assert not p.exists() and p.parent.is_dir()
