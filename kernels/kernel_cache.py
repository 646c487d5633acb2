"""FA4's persistent kernel cache, made safe to share or refused (Note [Kernel cache integrity]).
The one importer of ``flash_attn.cute`` for its persistent kernel cache (``cache_utils``).

Note [Kernel cache integrity]
-----------------------------
With ``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1`` FA4 (``flash_attn.cute.cache_utils``,
``JITPersistentCache``) links ``<dir>/<source fingerprint>/<name>/<sha256(key)>.o`` into the
process: native code, loaded with no owner, mode or hash check; the fingerprint and several
compile keys (``_bwd_preprocess``, tile_cumsum, blocks_to_batch, ...) carry no arch, and the
tuning table that switches FA4's exp2 emulation is in no key at all. :func:`install` (idempotent;
the adapter calls it before its first use of FA4) hardens every persistent cache of the process:

* **arch in the path**: ``get_cache_path()`` answers ``<dir>/<arch tag>`` (:func:`arch_tag`: the
  compile target ``CUTE_DSL_ARCH`` when set, else the current GPU's compute capability), and the
  caches FA4 already made are moved under it -- an sm90 and an sm100 host sharing a directory
  never serve each other's objects;
* **owner and mode**: every directory from the cache root down to a cache must be owned by this
  user and not group- or world-writable (:func:`unsafe_reason`); otherwise that cache is not
  read or written (in-memory only, one line on stderr) -- ``fa4verify audit`` refuses such a
  ``--kernel-cache`` up front (exit 2);
* **integrity manifest**: an export writes ``<hash>.o.sha256`` (sha256 of the object) beside the
  object; a load reads the object once into a private copy, checks it against the manifest and
  loads the copy -- a missing or different manifest is a miss (FA4 recompiles and its export
  replaces the entry), never an execution;
* **tuning variants**: :func:`tuning_variant` gives the forward/backward compile caches separate
  storage (``<name>-<variant>``, in-memory entries apart too) while a tuning switch is on
  (``adapter.exp2_emulation_disabled``), so a disk cache never serves the emulating kernel to
  the "disabled" run, and nothing has to be purged.

Counters (``STATS``: loads verified, refused, manifests written) are for tests and reports.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator, Optional

__all__ = ["install", "arch_tag", "unsafe_reason", "tuning_variant", "STATS", "MANIFEST_SUFFIX"]

MANIFEST_SUFFIX = ".sha256"
STATS = {"verified_loads": 0, "refused_loads": 0, "manifests_written": 0, "unsafe_dirs": 0}
_INSTALLED = False
_PRIVATE: Optional[str] = None
_WARNED: set[str] = set()


def unsafe_reason(path: str | os.PathLike) -> Optional[str]:
    """Why the directory ``path`` must not hold native code this process loads, or None: not a
    directory, owned by another user, or writable by group or others."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None                       # made by this process, with its umask
    except OSError as e:
        return f"cannot stat it ({e.strerror})"
    if stat.S_ISLNK(st.st_mode):
        try:
            st = os.stat(path)
        except OSError as e:
            return f"a dangling symbolic link ({e.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = " and ".join(w for w, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if st.st_mode & bit)
        return f"writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


#: the arch tag a process that must not initialise CUDA is told (the audit's zygote, whose forked
#: workers could not use a CUDA context it made: Note [Zygote environment], fa4verify.run.pool)
ARCH_ENV = "FA4VERIFY_CACHE_ARCH"


def arch_tag() -> str:
    """The arch a compiled object is for: ``CUTE_DSL_ARCH`` (the compile target, e.g. sm_100a)
    when set, else :data:`ARCH_ENV` when set, else the current CUDA device's compute capability
    (``sm90``, ``sm100``; this initialises CUDA), else ``nogpu``."""
    a = os.environ.get("CUTE_DSL_ARCH", "").strip()
    if a:
        return a.replace("_", "")
    a = os.environ.get(ARCH_ENV, "").strip()
    if a:
        return a
    try:
        import torch
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return f"sm{major}{minor}"
    except Exception:  # noqa: BLE001 - no device: no tag to read
        pass
    return "nogpu"


def _warn(key: str, msg: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        print(f"fa4verify: kernel cache: {msg}", file=sys.stderr)


def _chain_unsafe(cache_path: Path, root: Path) -> Optional[str]:
    """The first directory from ``root`` down to ``cache_path`` that is unsafe, with why."""
    try:
        rel = cache_path.relative_to(root)
    except ValueError:
        rel = None
    chain = [root] + ([root.joinpath(*rel.parts[:i + 1]) for i in range(len(rel.parts))] if rel else [cache_path])
    for d in chain:
        why = unsafe_reason(d)
        if why:
            return f"{d}: {why}"
    return None


def _private_dir() -> str:
    global _PRIVATE
    if _PRIVATE is None or not os.path.isdir(_PRIVATE):
        import atexit
        import shutil
        _PRIVATE = tempfile.mkdtemp(prefix="fa4verify-kernels-")   # 0700, this process's
        atexit.register(shutil.rmtree, _PRIVATE, True)
    return _PRIVATE


def _manifest(obj: Path) -> Path:
    return obj.with_name(obj.name + MANIFEST_SUFFIX)


def _write_manifest(obj: Path, digest: str) -> None:
    man = _manifest(obj)
    tmp = man.with_name(f".{man.name}.{os.getpid()}.tmp")
    tmp.write_text(digest + "\n")
    os.replace(tmp, man)
    STATS["manifests_written"] += 1


def _private_mkdir(path: Path) -> None:
    """``path`` and its missing parents made 0700 (FA4 makes them 0777 less the umask: with a
    umask of 002 group-writable, and then refused by :func:`unsafe_reason`)."""
    missing = []
    p = Path(path)
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            d.mkdir(mode=0o700)


def _patch(cu: Any) -> None:
    """Replace JITPersistentCache's load and export with verified ones (class-wide: every
    instance, present and future); its directories are made private."""
    cls = cu.JITPersistentCache
    orig_export = cls._try_export_to_storage
    orig_init = cls.__init__

    def __init__(self, cache_path):
        _private_mkdir(Path(cache_path))
        orig_init(self, cache_path)

    cls.__init__ = __init__

    def _safe(self) -> bool:
        root = Path(getattr(self, "_fa4verify_root", self.cache_path))
        why = _chain_unsafe(self.cache_path, root)
        if why:
            STATS["unsafe_dirs"] += 1
            _warn(why, f"{why}: not used (compiled kernels stay in memory)")
            return False
        return True

    def _try_load_from_storage(self, key) -> bool:
        if not _safe(self):
            return False
        sha = self._key_to_hash(key)
        obj = self.cache_path / f"{sha}.o"
        with cu.FileLock(self._lock_path(sha), exclusive=False, timeout=self.LOCK_TIMEOUT_SECONDS, label=sha):
            try:
                data = obj.read_bytes()
            except FileNotFoundError:
                return False
            except OSError as e:
                _warn(str(obj), f"{obj}: unreadable ({e.strerror}); recompiling")
                self._unloadable.add(sha)
                return False
            try:
                want = _manifest(obj).read_text().strip()
            except OSError:
                want = None
            got = hashlib.sha256(data).hexdigest()
            if want != got:
                STATS["refused_loads"] += 1
                _warn(str(obj), f"{obj}: {'no integrity manifest' if want is None else 'sha256 differs from its manifest'}; "
                                "not loaded (recompiling)")
                self._unloadable.add(sha)       # the export replaces it
                return False
            # load a private copy: the file checked is the file loaded (no swap after the check)
            copy = os.path.join(_private_dir(), f"{sha}.o")
            with open(copy, "wb") as f:
                f.write(data)
            try:
                m = cu.cute.runtime.load_module(copy, enable_tvm_ffi=True)
                fn = getattr(m, self.EXPORT_FUNCTION_PREFIX)
            except Exception as e:  # noqa: BLE001 - FA4's own rule: a bad entry is a miss
                _warn(str(obj), f"{obj}: unloadable ({type(e).__name__}); recompiling")
                self._unloadable.add(sha)
                return False
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(copy)
            STATS["verified_loads"] += 1
            cu.JITCache.__setitem__(self, key, fn)
            return True

    def _try_export_to_storage(self, key, fn) -> None:
        if not _safe(self):
            return
        sha = self._key_to_hash(key)
        obj = self.cache_path / f"{sha}.o"

        def ident():
            try:
                s = os.stat(obj)
                return (s.st_ino, s.st_mtime_ns, s.st_size)
            except OSError:
                return None

        before = ident()
        orig_export(self, key, fn)
        with cu.FileLock(self._lock_path(sha), exclusive=True, timeout=self.LOCK_TIMEOUT_SECONDS, label=sha):
            after = ident()
            if after is not None and after != before:       # this process's export put it there
                _write_manifest(obj, hashlib.sha256(obj.read_bytes()).hexdigest())

    cls._try_load_from_storage = _try_load_from_storage
    cls._try_export_to_storage = _try_export_to_storage


def _persistent_caches(cu: Any) -> list[tuple[Any, str, Any]]:
    """``(owner, attribute, cache)`` for every persistent compile cache FA4's loaded modules hold."""
    out = []
    for name, mod in list(sys.modules.items()):
        if not name.startswith("flash_attn.cute") or mod is None:
            continue
        for obj in list(vars(mod).values()):
            c = getattr(obj, "compile_cache", None)
            if isinstance(c, cu.JITPersistentCache):
                out.append((obj, "compile_cache", c))
    return out


def install() -> None:
    """Harden FA4's persistent kernel cache in this process (Note [Kernel cache integrity]);
    nothing when the cache is off. Idempotent."""
    global _INSTALLED
    if _INSTALLED:
        return
    from flash_attn.cute import cache_utils as cu
    _INSTALLED = True
    if not getattr(cu, "CUTE_DSL_CACHE_ENABLED", False):
        return
    _patch(cu)
    orig_root = cu.get_cache_path()
    why = unsafe_reason(orig_root)
    if why:
        _warn(str(orig_root), f"{orig_root}: {why}: not used (compiled kernels stay in memory)")
    tag = arch_tag()
    arch_root = orig_root / tag

    def get_cache_path() -> Path:
        _private_mkdir(arch_root)
        return arch_root

    cu.get_cache_path = get_cache_path
    for _, _, c in _persistent_caches(cu):
        try:
            rel = c.cache_path.relative_to(orig_root)
        except ValueError:
            continue
        if rel.parts and rel.parts[0] == tag:
            continue
        old = c.cache_path
        c.cache_path = arch_root / rel
        _private_mkdir(c.cache_path)
        c._fa4verify_root = orig_root
        for d in (old, old.parent):     # FA4 made them at import; left empty, they go
            with contextlib.suppress(OSError):
                d.rmdir()
    cu.JITPersistentCache._fa4verify_root = orig_root


@contextlib.contextmanager
def tuning_variant(variant: str, names: tuple[str, ...] = ("_flash_attn_fwd", "_flash_attn_bwd")) -> Iterator[None]:
    """While the block runs, the compile caches of ``names`` (functions of FA4's interface) are
    fresh ones -- persistent under ``<name>-<variant>`` when FA4's disk cache is on, in memory
    otherwise -- and the originals, with their kernels, come back after: a kernel compiled under a
    tuning switch FA4's compile key does not see is never served outside it, or inside it from
    outside (Note [Kernel cache integrity])."""
    from flash_attn.cute import cache_utils as cu
    from flash_attn.cute import interface
    install()
    saved = []
    for n in names:
        fn = getattr(interface, n, None)
        c = getattr(fn, "compile_cache", None)
        if c is None:
            continue
        # a counting proxy around FA4's cache (fa4verify.audit.kernel_timing.TimedCache: an
        # ``_inner`` cache and a ``_name``) gets a proxy of its kind around the variant
        inner = c.__dict__.get("_inner", c) if hasattr(c, "__dict__") else c
        if isinstance(inner, cu.JITPersistentCache):
            new = cu.JITPersistentCache(inner.cache_path.with_name(f"{inner.cache_path.name}-{variant}"))
            new._fa4verify_root = getattr(inner, "_fa4verify_root", inner.cache_path)
        else:
            new = cu.JITCache()
        if inner is not c:
            new = type(c)(new, f"{c.__dict__.get('_name', n)}-{variant}")
        saved.append((fn, c))
        fn.compile_cache = new
    try:
        yield
    finally:
        for fn, c in saved:
            fn.compile_cache = c
