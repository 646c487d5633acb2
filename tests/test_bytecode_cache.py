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
    sys.modules.pop("fakepkg_bc", None)      # another test's copy (find_spec would return its spec)
    for k in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX", bytecode.SWITCH, bytecode.OURS):
        monkeypatch.setenv(k, "x")          # recorded, so enable()'s own settings are undone after
        monkeypatch.delenv(k)
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


def _child_value(pkg) -> str:
    env = dict(os.environ, PYTHONPATH=str(pkg.parent))
    return subprocess.run([sys.executable, "-c", "import fakepkg_bc; print(fakepkg_bc.VALUE)"],
                          env=env, capture_output=True, text=True, check=True).stdout.strip()


def test_enable_points_imports_at_the_prefix_and_writes_nothing_itself(pkg, tmp_path):
    base = tmp_path / "cache"
    prefix = bytecode.enable(str(base), package="fakepkg_bc", writable=read_only(pkg.parent))
    assert prefix == os.path.abspath(base / "pycache")
    assert sys.pycache_prefix == prefix and os.environ["PYTHONPYCACHEPREFIX"] == prefix
    assert sys.dont_write_bytecode and os.environ["PYTHONDONTWRITEBYTECODE"] == "1"
    assert _child_value(pkg) == "42"
    assert not any(f.endswith(".pyc") for _r, _d, fs in os.walk(prefix) for f in fs)   # imports write none
    assert not (pkg / "__pycache__").exists()


def test_filled_bytecode_is_checked_against_the_source(pkg, tmp_path):
    """The zygote's checked-hash bytecode is used, and a same-size, same-mtime rewrite of the
    source (a planted one-character fault) is compiled again, never served from the cache."""
    import importlib
    import importlib.util
    import py_compile
    prefix = bytecode.enable(str(tmp_path / "c"), package="fakepkg_bc", writable=read_only(pkg.parent))
    importlib.import_module("fakepkg_bc")
    src = str(pkg / "__init__.py")
    pending = bytecode.missing()
    assert src in pending
    assert bytecode.fill_some(pending, n=10**6) >= 1
    pyc = importlib.util.cache_from_source(src)
    assert pyc.startswith(prefix) and os.path.exists(pyc) and not (pkg / "__pycache__").exists()
    assert src not in bytecode.missing()
    st = os.stat(src)
    (pkg / "__init__.py").write_text("VALUE = 41 - 1\n")              # same size
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))                  # same mtime
    assert _child_value(pkg) == "40"
    # the control: timestamp bytecode at that place would have served the old module
    (pkg / "__init__.py").write_text("VALUE = 41 + 1\n")
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    py_compile.compile(src, cfile=pyc, invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
    (pkg / "__init__.py").write_text("VALUE = 41 - 1\n")
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _child_value(pkg) == "42"


def test_nothing_is_filled_without_our_prefix(pkg, tmp_path, monkeypatch):
    import importlib
    importlib.import_module("fakepkg_bc")
    assert bytecode.missing() == []
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path / "theirs"))     # a user's own prefix
    assert bytecode.missing() == []


def test_an_in_process_main_changes_no_bytecode_setting(pkg, tmp_path, monkeypatch):
    from fa4verify.cli import main
    monkeypatch.chdir(tmp_path)
    main(["budgets", "--help"])
    assert sys.pycache_prefix is None and "PYTHONPYCACHEPREFIX" not in os.environ
    assert not (tmp_path / ".fa4verify-cache").exists()


def test_a_users_prefix_and_the_switch_win(pkg, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path / "theirs"))
    assert bytecode.enable(str(tmp_path / "c"), package="fakepkg_bc", writable=read_only(pkg.parent)) is None
    monkeypatch.delenv("PYTHONPYCACHEPREFIX")
    monkeypatch.setenv(bytecode.SWITCH, "off")
    assert bytecode.enable(str(tmp_path / "c"), package="fakepkg_bc", writable=read_only(pkg.parent)) is None
    assert sys.pycache_prefix is None


def test_told_not_to_write_bytecode_uses_the_prefix(pkg, tmp_path, monkeypatch):
    """PYTHONDONTWRITEBYTECODE on a writable install without bytecode: the cache is used."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    assert "told not to write" in bytecode.needs_cache("fakepkg_bc")
    prefix = bytecode.enable(str(tmp_path / "c"), package="fakepkg_bc")
    assert prefix is not None and sys.pycache_prefix == prefix
    assert os.environ["PYTHONDONTWRITEBYTECODE"] == "1"


def test_nothing_set_where_python_writes_bytecode_itself(pkg, tmp_path):
    assert bytecode.enable(str(tmp_path / "c"), package="fakepkg_bc") is None
    assert sys.pycache_prefix is None and "PYTHONPYCACHEPREFIX" not in os.environ


def test_fill_stops_at_its_time_budget(pkg, tmp_path):
    bytecode.enable(str(tmp_path / "c"), package="fakepkg_bc", writable=read_only(pkg.parent))
    pending = [str(pkg / "__init__.py")] * 5
    assert bytecode.fill_some(pending, n=10**6, seconds=0.0) == 0 and len(pending) == 5
    assert bytecode.fill_some(pending, n=2) == 2 and len(pending) == 3
