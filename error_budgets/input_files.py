"""Bounded, safe reading of input files (budget files, reports, manifests, cases).

:func:`read_input` reads a regular file under a size limit: a FIFO, ``/dev/zero``, a directory or a
device is refused with a one-line :class:`InputPathError` (``OSError``) instead of hanging or
exhausting memory. It lives here, beside the budget loader that needs it, because the tolerance side
(``error_budgets/``) must not import the judge; the CLI and the audit import it from here (the
outputs side is :mod:`fa4verify.audit.atomic`).
"""
from __future__ import annotations

import os
import stat

#: Largest input file read by default (reports, manifests, cases): 256 MiB.
MAX_INPUT_BYTES = 256 << 20


class InputPathError(OSError):
    """An input path that cannot or must not be read (one-line message)."""


def file_kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def as_str(path) -> str:
    p = os.fspath(path)
    return p.decode("utf-8", "surrogateescape") if isinstance(p, bytes) else p


def check_readable(path, *, limit: int = MAX_INPUT_BYTES) -> os.stat_result:
    """Raise :class:`InputPathError` unless ``path`` is a readable regular file (a symlink to
    one is fine) of at most ``limit`` bytes."""
    path = as_str(path)
    if path == "":
        raise InputPathError("empty file name")
    try:
        st = os.stat(path)
    except OSError as e:
        raise InputPathError(f"{path}: cannot read ({e.strerror or e})") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputPathError(f"{path}: is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise InputPathError(f"{path}: is {file_kind(st.st_mode)}, not a regular file")
    if st.st_size > limit:
        raise InputPathError(f"{path}: larger than {limit:,} bytes ({st.st_size:,})")
    return st


def read_input(path, *, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (:class:`InputPathError` else)."""
    check_readable(path, limit=limit)
    path = as_str(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        raise InputPathError(f"{path}: cannot read ({e.strerror or e})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):   # swapped after the check
            raise InputPathError(f"{path}: is {file_kind(st.st_mode)}, not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise InputPathError(f"{path}: larger than {limit:,} bytes")
    return data


def read_input_text(path, *, limit: int = MAX_INPUT_BYTES) -> str:
    data = read_input(path, limit=limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputPathError(f"{as_str(path)}: not UTF-8 text (a binary file?)") from None
