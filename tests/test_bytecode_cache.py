"""Note [Bytecode cache] (fa4verify.run.bytecode): a prefix only where the installation needs one."""
import os
import subprocess
import sys

import pytest

from fa4verify.run import bytecode


@pytest.fixture
def pkg(tmp_path, monkeypatch):
    """A package ``fakepkg_bc`` with source and no bytecode, importable from tmp_path."""
    d = tmp_path / "site" / "fakepkg_bc"
    d.mkdir(parents=True)
    (d / "__init__.py").write_text("VALUE = 41 + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for k in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX", bytecode.SWITCH):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    return d


def read_only(site):
    return lambda d: not str(d).startswith(str(site))


def test_needs_cache_only_for_an_unwritable_install_without_bytecode(pkg):
    assert bytecode.needs_cache("fakepkg_bc") is None                     # writable: Python writes it
    why = bytecode.needs_cache("fakepkg_bc", writable=read_only(pkg.parent))
    assert why is not None and "not writable" in why and "fakepkg_bc" in why
    assert bytecode.needs_cache("no_such_package_bc") is None


def test_present_bytecode_needs_no_cache(pkg):
    import py_compile
    import importlib.util
    src = str(pkg / "__init__.py")
    py_compile.compile(src, cfile=importlib.util.cache_from_source(src))
    assert bytecode.needs_cache("fakepkg_bc", writable=read_only(pkg.parent)) is None


def test_enable_sets_the_prefix_for_this_process_and_its_children(pkg, tmp_path, monkeypatch):
    base = tmp_path / "cache"
    prefix = bytecode.enable(str(base), package="fakepkg_bc", writable=read_only(pkg.parent))
    assert prefix == os.path.abspath(base / "pycache")
    assert sys.pycache_prefix == prefix and os.environ["PYTHONPYCACHEPREFIX"] == prefix
    # a child compiles the read-only package's module into the prefix, not next to the source
    env = dict(os.environ, PYTHONPATH=str(pkg.parent))
    out = subprocess.run([sys.executable, "-c", "import fakepkg_bc; print(fakepkg_bc.VALUE)"],
                         env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "42"
    written = [os.path.join(r, f) for r, _d, fs in os.walk(prefix) for f in fs if f.endswith(".pyc")]
    assert any("fakepkg_bc" in w for w in written)
    assert not (pkg / "__pycache__").exists()


def test_a_users_prefix_and_the_switch_win(pkg, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path / "theirs"))
    assert bytecode.enable(str(tmp_path / "c"), package="fakepkg_bc", writable=read_only(pkg.parent)) is None
    monkeypatch.delenv("PYTHONPYCACHEPREFIX")
    monkeypatch.setenv(bytecode.SWITCH, "off")
    assert bytecode.enable(str(tmp_path / "c"), package="fakepkg_bc", writable=read_only(pkg.parent)) is None
    assert sys.pycache_prefix is None


def test_told_not_to_write_bytecode_writes_it_only_under_the_prefix(pkg, tmp_path, monkeypatch):
    """PYTHONDONTWRITEBYTECODE (writable install, no bytecode): the cache is used, children
    write only under the prefix and nothing lands beside the source."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    assert "told not to write" in bytecode.needs_cache("fakepkg_bc")
    prefix = bytecode.enable(str(tmp_path / "c"), package="fakepkg_bc")
    assert prefix is not None and "PYTHONDONTWRITEBYTECODE" not in os.environ
    assert sys.dont_write_bytecode is False and sys.pycache_prefix == prefix
    env = dict(os.environ, PYTHONPATH=str(pkg.parent))
    subprocess.run([sys.executable, "-c", "import fakepkg_bc"], env=env, check=True)
    assert any(f.endswith(".pyc") for _r, _d, fs in os.walk(prefix) for f in fs)
    assert not (pkg / "__pycache__").exists()


def test_nothing_set_where_python_writes_bytecode_itself(pkg, tmp_path):
    assert bytecode.enable(str(tmp_path / "c"), package="fakepkg_bc") is None
    assert sys.pycache_prefix is None and "PYTHONPYCACHEPREFIX" not in os.environ
