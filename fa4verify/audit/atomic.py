"""Safe input and output files for every fa4verify command (and the pytest plugin).

Outputs
    :func:`check_outputs` validates a command's output paths *before any work*: each one is
    writable, is not a directory, a symlink, a device node, a FIFO or a socket (those are never
    replaced), and no two outputs -- and no output and an input -- name the same file (compared by
    device/inode when the file exists, else by the resolved real path of its directory).
    :func:`write_all` writes several files all-or-none: every file is written to a temporary file
    in its destination directory first; only when all of them are on disk are they renamed over
    their destinations, together, with SIGINT held off for the renames, and a failed rename puts
    back the files already replaced (Note [Reports under signals]); a replaced file keeps its
    mode, a new one follows the umask (Note [Report permissions]). :func:`staged` does the same for files that a library
    function writes itself (it hands out the temporary paths).

Inputs
    are read by :mod:`fa4verify.error_budgets.input_files` (``read_input``: a regular file under a
    size limit; a FIFO, ``/dev/zero`` or a directory is refused instead of hanging or exhausting
    memory), beside the budget loader that needs it.

Every problem is an :class:`~fa4verify.errors.OutputPathError` (here) or
:class:`~fa4verify.error_budgets.input_files.InputPathError` (``OSError``) whose message is one line; the CLI turns it into ``<prog>: error: <message>`` and exit 2.
"""
from __future__ import annotations

import contextlib
import os
import signal
import stat
import tempfile
import threading
from typing import Iterable, Iterator, Mapping, Sequence

from fa4verify.error_budgets.input_files import as_str as _as_str, file_kind as _kind
from fa4verify.errors import OutputPathError


def check_writable(path, *, allow_dash: bool = False) -> None:
    """Raise :class:`OutputPathError` if ``path`` cannot or must not be written.

    Refused: an empty name, a name with a NUL byte, an existing directory, symlink (its target is
    never replaced, nor the link), device node, FIFO or socket, a read-only file, a missing or
    read-only directory. ``"-"`` (stdout) is accepted with ``allow_dash``."""
    path = _as_str(path)
    if path == "":
        raise OutputPathError("empty file name")
    if "\0" in path:
        raise OutputPathError(f"{path!r}: file name contains a NUL byte")
    if path == "-" and allow_dash:
        return
    ap = os.path.abspath(path)
    try:
        st = os.lstat(ap)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise OutputPathError(f"{path}: {e.strerror or e}") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise OutputPathError(f"{path}: is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise OutputPathError(f"{path}: is {_kind(st.st_mode)}, not a regular file "
                                  "(refusing to replace it)")
        if not os.access(ap, os.W_OK):
            raise OutputPathError(f"{path}: file is not writable")
    d = os.path.dirname(ap)
    if not os.path.isdir(d):
        raise OutputPathError(f"{path}: directory {d} does not exist")
    if not os.access(d, os.W_OK | os.X_OK):
        raise OutputPathError(f"{path}: directory {d} is not writable")


def file_identity(path) -> tuple:
    """What makes two paths the same file: (device, inode) of an existing file (hard links and
    symlinks included), else the resolved real path."""
    path = _as_str(path)
    ap = os.path.abspath(path)
    try:
        st = os.stat(ap)
        return ("inode", st.st_dev, st.st_ino)
    except OSError:
        return ("path", os.path.join(os.path.realpath(os.path.dirname(ap)), os.path.basename(ap)))


def same_file(a, b) -> bool:
    """``os.path.samefile`` when both exist, else the resolved real paths are equal."""
    return file_identity(a) == file_identity(b)


def check_outputs(pairs: Iterable[tuple[str, "str | None"]], *,
                  inputs: Iterable[tuple[str, "str | None"]] = (),
                  duplicate_message: str | None = None,
                  allow_dash: Sequence[str] = ()) -> None:
    """Check a command's ``(option, path)`` outputs before any work.

    Each given output is writable (:func:`check_writable`; ``"-"`` only for the options in
    ``allow_dash``), no two outputs are the same file, and no output is the same file as one of
    the ``(label, path)`` ``inputs``. ``None`` paths are ignored; ``""`` is an error. Raises
    :class:`OutputPathError` with a one-line message naming the option (``"--json <why>"``)."""
    outs = [(o, _as_str(p)) for o, p in pairs if p is not None]
    for opt, p in outs:
        try:
            check_writable(p, allow_dash=opt in allow_dash)
        except OutputPathError as e:
            raise OutputPathError(f"{opt} {e}") from None
    files = [(o, p) for o, p in outs if p != "-" or o not in allow_dash]
    ids = [file_identity(p) for _, p in files]
    for i in range(len(files)):
        for j in range(i):
            if ids[i] == ids[j]:
                raise OutputPathError(duplicate_message or
                                      f"{files[j][0]} {files[j][1]} and {files[i][0]} "
                                      f"{files[i][1]} name the same file")
    for label, ip in inputs:
        if ip is None or _as_str(ip) in ("", "-"):
            continue
        iid = file_identity(ip)
        for (opt, p), oid in zip(files, ids):
            if oid == iid:
                raise OutputPathError(f"{opt} {p} is the same file as the input {label} {ip} "
                                      "(refusing to overwrite an input)")


def check_output_dir(opt: str, path) -> str:
    """An output *directory* (created if missing) that a command will write files into: raise
    :class:`OutputPathError` unless it is (or can be made) a writable directory. Returns the
    absolute path. A probe file is created and removed, so an unwritable place such as
    ``/proc/x`` fails here, before any work."""
    p = _as_str(path)
    if p == "":
        raise OutputPathError(f"{opt} empty directory name")
    ap = os.path.abspath(p)
    if os.path.lexists(ap) and not os.path.isdir(ap):
        raise OutputPathError(f"{opt} {p}: exists and is not a directory")
    try:
        os.makedirs(ap, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".fa4verify-probe-", dir=ap)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise OutputPathError(f"{opt} {p}: cannot write into this directory "
                              f"({e.strerror or e})") from None
    return ap


# ------------------------------------------------------------------------------------ outputs
def _temp_for(path: str) -> str:
    ap = os.path.abspath(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(ap)}.", suffix=".tmp",
                               dir=os.path.dirname(ap))
    os.close(fd)
    return tmp


def _write_temp(path: str, data: bytes) -> str:
    tmp = _temp_for(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


#: Note [Reports under signals]: SIGINT, SIGTERM and SIGHUP are held while the renames run, so a
#: report set is all old or all new whatever signal comes (delivered right after); SIGTERM and
#: SIGHUP -- whose default action ends the process at once, with no cleanup -- are held for the
#: whole of :func:`write_all` (temporary files included: none is left behind). SIGINT keeps its
#: Python meaning before the renames (KeyboardInterrupt: no destination changes).
_RENAME_SIGNALS = {signal.SIGINT, signal.SIGTERM} | ({signal.SIGHUP} if hasattr(signal, "SIGHUP") else set())
_WRITE_SIGNALS = _RENAME_SIGNALS - {signal.SIGINT}


@contextlib.contextmanager
def _signals_held(signals=_RENAME_SIGNALS) -> Iterator[None]:
    """Defer ``signals`` to the end of the block, in the main thread: each is caught by a handler
    that only records it and re-sent to this process once the block is over, where the handler
    it had before (the default action, a Python handler, SIG_IGN) runs. A handler, not a signal
    mask: a process with other threads (numpy's BLAS pool) would get the signal in one of
    those."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def record(signum, frame):
        pending.append(signum)

    old = {}
    for sig in signals:
        prev = signal.getsignal(sig)
        if prev is None:             # a handler installed outside Python: left alone
            continue
        old[sig] = prev
        signal.signal(sig, record)
    try:
        yield
    finally:
        for sig, prev in old.items():
            signal.signal(sig, prev)
        for sig in dict.fromkeys(pending):
            os.kill(os.getpid(), sig)


def _umask() -> int:
    """The process umask, read without changing it where /proc allows (no window in which a
    thread would create files with umask 0)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def _mode_for(dest: str) -> int:
    """Note [Report permissions]: a replaced file keeps its mode (a 0600 report is never widened);
    a new one gets what ``open()`` would give it, 0666 less the umask."""
    try:
        st = os.lstat(dest)
        if stat.S_ISREG(st.st_mode):
            return stat.S_IMODE(st.st_mode)
    except OSError:
        pass
    return 0o666 & ~_umask()


def commit(staged_files: Sequence[tuple[str, str]]) -> None:
    """Rename ``(temporary, destination)`` pairs over their destinations, all or none.

    Each destination is re-checked first (still absent or a regular file); the previous content
    of each is kept as a hard link until every rename succeeded, and put back if one fails."""
    for tmp, dest in staged_files:
        check_writable(dest)
    backups: list[tuple[str, str]] = []      # (backup, dest)
    done: list[tuple[str, bool]] = []        # (dest, existed)
    with _signals_held():
        try:
            for tmp, dest in staged_files:
                ap = os.path.abspath(dest)
                existed = os.path.lexists(ap)
                if existed and len(staged_files) > 1:
                    b = _temp_for(ap)
                    os.unlink(b)
                    try:
                        os.link(ap, b)
                        backups.append((b, ap))
                    except OSError:
                        pass
                os.chmod(tmp, _mode_for(ap))
                os.replace(tmp, ap)
                done.append((ap, existed))
        except BaseException:
            restore = dict((d, b) for b, d in backups)
            for ap, existed in done:
                with contextlib.suppress(OSError):
                    if ap in restore:
                        os.replace(restore.pop(ap), ap)
                    elif not existed:
                        os.unlink(ap)
            for b in restore.values():
                with contextlib.suppress(OSError):
                    os.unlink(b)
            raise
        for b, _ in backups:
            with contextlib.suppress(OSError):
                os.unlink(b)


def write_all(outputs: Iterable[tuple[str, bytes]]) -> None:
    """Write several files all-or-none: every temporary file first, then the renames
    (:func:`commit`). On any error (or SIGINT) before the renames no destination changes."""
    temps: list[tuple[str, str]] = []
    with _signals_held(_WRITE_SIGNALS):     # Note [Reports under signals]
        try:
            for path, data in outputs:
                path = _as_str(path)
                check_writable(path)
                temps.append((_write_temp(path, data), path))
            commit(temps)
        except BaseException:
            for tmp, _ in temps:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            raise


@contextlib.contextmanager
def staged(paths: Mapping[str, "str | None"]) -> Iterator[dict[str, str]]:
    """Temporary paths, in each destination's directory, for files a library function writes
    itself; renamed over the destinations together when the block ends without an error,
    removed otherwise. ``None`` destinations (and ``"-"``) are skipped.

        with staged({"json": json_path}) as tmp:
            write_json(result, tmp["json"])
    """
    temps: dict[str, str] = {}
    try:
        for key, p in paths.items():
            if p is None or p == "-":
                continue
            check_writable(p)
            temps[key] = _temp_for(_as_str(p))
        yield dict(temps)
        commit([(temps[k], _as_str(paths[k])) for k in temps])   # type: ignore[arg-type]
    except BaseException:
        for tmp in temps.values():
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise


@contextlib.contextmanager
def output_lock(pairs: Iterable[tuple[str, "str | None"]]) -> Iterator[None]:
    """Note [One writer per report set]: an exclusive lock on each output (``(option, path)``;
    None skipped) for the whole run, so two audits never interleave one report set (the JSON
    of one with the HTML of the other). The second one does not wait -- it would redo the work
    only to replace the first one's reports -- it stops at once with an
    :class:`OutputPathError` naming the output and the holder's pid (exit 2). The lock is
    ``.<name>.fa4verify-lock`` beside the output, removed when the run ends."""
    import fcntl

    held: list[tuple[int, str]] = []
    try:
        for opt, p in sorted(((o, p) for o, p in pairs if p is not None and p != "-"),
                             key=lambda op: os.path.abspath(_as_str(op[1]))):
            ap = os.path.abspath(_as_str(p))
            lock = os.path.join(os.path.dirname(ap), f".{os.path.basename(ap)}.fa4verify-lock")
            while True:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    try:
                        holder = os.read(fd, 32).decode("ascii", "replace").strip() or "?"
                    finally:
                        os.close(fd)
                    raise OutputPathError(f"{opt} {p}: another fa4verify (pid {holder}) is writing "
                                          "this report now; wait for it or choose other outputs") from None
                try:        # the lock file may have been removed by its last holder meanwhile
                    same = os.fstat(fd).st_ino == os.stat(lock).st_ino
                except OSError:
                    same = False
                if same:
                    break
                os.close(fd)
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
            held.append((fd, lock))
        yield
    finally:
        for fd, lock in reversed(held):
            with contextlib.suppress(OSError):
                os.unlink(lock)
            os.close(fd)


def atomic_write_bytes(path: str, data: bytes) -> None:
    write_all([(path, data)])


def atomic_write_text(path: str, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))
