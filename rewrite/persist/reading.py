"""The one way rewrite opens a file someone else may have written: bounded, regular, not a symlink.

Export folders, compile caches, static-kernel artifacts, the cost model's figures file and the
signing key may all come from someone else (a cloned repo, a shared machine), so they are opened
the same way: ``O_NOFOLLOW`` (a symlink is refused, never followed), ``O_NONBLOCK`` (opening a FIFO
planted under the expected name returns at once instead of waiting for a writer forever), then
``fstat`` on the opened file: only a regular file is read, and only once its size is known to fit.
Checking the opened descriptor, not the name, leaves no gap between the check and the read.

Each caller keeps its own limits (``size``, ``max_size``, ``private``) and its own error type: a
refusal is a `FileRefused` whose message says what is wrong with the file ("is not a regular
file", "has 9 bytes, expected 32 ..."), for the caller to prefix with the file's name. A missing
file is Python's own ``FileNotFoundError`` (some callers then create the file).
"""
from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

__all__ = ["FileRefused", "open_regular", "read_regular"]


class FileRefused(OSError):
    """A file that is not read: a symlink, a special file, the wrong size, another user's..."""


def open_regular(path: str, *, size: int | None = None, max_size: int | None = None,
                 private: bool = False) -> BinaryIO:
    """``path`` opened for reading, once it is known to be a regular file (no symlink) of ``size``
    bytes (or at most ``max_size``), and with ``private``, owned by this user and closed to others."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise FileRefused("is a symlink, not a regular file (cannot open it: links are not followed)") from None
        raise FileRefused(f"cannot be opened: {e.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileRefused("is not a regular file")
        if private and (info.st_uid != os.getuid() or info.st_mode & 0o077):
            raise FileRefused("is not private to this user (another owner, or open to group or others)")
        if size is not None and info.st_size != size:
            raise FileRefused(f"has {info.st_size} bytes, expected {size} (truncated or replaced)")
        if max_size is not None and info.st_size > max_size:
            raise FileRefused(f"has {info.st_size} bytes; at most {max_size} are allowed")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str, *, size: int | None = None, max_size: int | None = None,
                 private: bool = False) -> bytes:
    """The bytes of ``path``, opened by `open_regular` with the same limits; never more than it had when opened."""
    with open_regular(path, size=size, max_size=max_size, private=private) as f:
        expected = os.fstat(f.fileno()).st_size
        data = f.read(expected + 1)
    if len(data) != expected:
        raise FileRefused("changed size while it was read")
    return data
