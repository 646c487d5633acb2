"""Atomic file writes: a temp file in the destination directory, fsync, then ``os.replace``.

A reader never sees a partial file, and an error while writing leaves no file behind (the
previous content, if any, stays).
"""
from __future__ import annotations

import os
import tempfile
from typing import Iterable


class OutputPathError(OSError):
    """An output path that cannot be written (missing directory, no permission, a directory)."""


def check_writable(path: str) -> None:
    """Raise :class:`OutputPathError` (one-line message) if ``path`` cannot be written.

    Checked before an audit starts, so a bad ``--json``/``--html`` path costs nothing."""
    ap = os.path.abspath(path)
    d = os.path.dirname(ap)
    if os.path.isdir(ap):
        raise OutputPathError(f"{path}: is a directory")
    if not os.path.isdir(d):
        raise OutputPathError(f"{path}: directory {d} does not exist")
    if not os.access(d, os.W_OK | os.X_OK):
        raise OutputPathError(f"{path}: directory {d} is not writable")
    if os.path.exists(ap) and not os.access(ap, os.W_OK):
        raise OutputPathError(f"{path}: file is not writable")


def check_outputs(pairs: Iterable[tuple[str, "str | None"]], *,
                  duplicate_message: str = "output files must be different") -> None:
    """Check a command's ``(option, path)`` outputs before any work: the given paths are distinct
    and each is writable. Raises :class:`OutputPathError` with a one-line message naming the
    option (``"--json <why>"``); ``None`` paths are ignored."""
    pairs = list(pairs)
    paths = [p for _, p in pairs if p]
    if len(set(paths)) != len(paths):
        raise OutputPathError(duplicate_message)
    for opt, p in pairs:
        if p:
            try:
                check_writable(p)
            except OutputPathError as e:
                raise OutputPathError(f"{opt} {e}") from None


def atomic_write_bytes(path: str, data: bytes) -> None:
    ap = os.path.abspath(path)
    d = os.path.dirname(ap)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(ap)}.", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, ap)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def atomic_write_text(path: str, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def write_all(outputs: Iterable[tuple[str, bytes]]) -> None:
    """Write several files atomically; if one fails, remove the ones this call created."""
    done: list[tuple[str, bool]] = []
    try:
        for path, data in outputs:
            existed = os.path.exists(path)
            atomic_write_bytes(path, data)
            done.append((path, existed))
    except BaseException:
        for p, existed in done:
            if not existed:
                try:
                    os.unlink(p)
                except OSError:
                    pass
        raise
