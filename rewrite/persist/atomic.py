"""Atomic publishing: readers see a file (or a set of files) whole, old or new, never half written.

One file: `atomic_write_bytes` / `atomic_write_text` write a temporary file beside the target and
rename it into place (``exclusive=True``: link it into place only where no file is yet, so of
processes racing to create one file the first wins and the others read theirs).

A set of files (an export folder, a cache entry): `write_files`, all of its files or none of them.

Each file being atomic is not enough: a new weight file beside an old graph file is a broken
export (the graph file's checksums name the old weights). `write_files` therefore

1. checks every target first (a folder or a special file in the way is an error before anything
   is written);
2. writes every file into a staging folder inside the export folder (same file system), so a full
   disk or a read-only folder fails while the export is untouched;
3. moves the files into place in order (the graph file last), moving each file it replaces into
   the staging folder;
4. on any error, moves the replaced files back, removes the new ones and the folders it created,
   and raises `ExportError`; the staging folder is always removed.

A process killed in the middle of step 3 can still leave a mix; every other failure leaves the
folder as it was.
"""
from __future__ import annotations

import os
import shutil
import stat
import tempfile

from .errors import ExportError

__all__ = ["atomic_write_bytes", "atomic_write_text", "write_files"]


def atomic_write_bytes(path: str, data: bytes, *, durable: bool = True, exclusive: bool = False) -> bool:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never half of it.

    ``durable=False`` skips the fsync (~1 ms a file): for files that are a log or scratch, written
    by the thousand, where surviving a power cut buys nothing. The file has mode 0600 (mkstemp's).
    ``exclusive=True`` publishes only where ``path`` does not exist yet (``os.link``, atomic):
    returns False, leaving the other file, when another process made it first.
    """
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        if not exclusive:
            os.replace(tmp, path)
            return True
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str, text: str, *, durable: bool = True, exclusive: bool = False) -> bool:
    return atomic_write_bytes(path, text.encode("utf-8"), durable=durable, exclusive=exclusive)


def _make_folders(path: str, created: list) -> None:
    """``os.makedirs(path)``, appending each folder it creates to ``created`` (outermost first)."""
    missing = []
    # A relative name ends at '' (the working directory, which exists): never mkdir('').
    while path and not os.path.isdir(path):
        if os.path.lexists(path):
            raise ExportError(f"{path} exists and is not a folder")
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder)
        except FileExistsError:  # another rank of a multi-rank export made it just now
            if not os.path.isdir(folder):
                raise
            continue
        created.append(folder)


def _check_target(path: str, rel: str) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        kind = "a folder" if stat.S_ISDIR(mode) else "a special file"
        raise ExportError(f"cannot write {rel}: {path} is {kind}; remove it or export to another folder")


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_files(folder: str, files: list[tuple[str, bytes]]) -> None:
    """Write ``files`` ((path relative to ``folder``, bytes), in commit order) into ``folder`` as one unit."""
    for rel, _ in files:
        _check_target(os.path.join(folder, rel), rel)
        parent = os.path.dirname(os.path.join(folder, rel))
        if os.path.lexists(parent) and not os.path.isdir(parent):
            raise ExportError(f"cannot write {rel}: {parent} is not a folder")
    created: list[str] = []
    moved: list[tuple[str, str | None]] = []  # (target, where its old file went, or None)
    staging = None
    try:
        _make_folders(folder, created)
        staging = tempfile.mkdtemp(prefix=".rewrite-export-", dir=folder)
        for i, (_, data) in enumerate(files):
            _write(os.path.join(staging, f"{i}.new"), data)
        for i, (rel, _) in enumerate(files):
            target = os.path.join(folder, rel)
            _make_folders(os.path.dirname(target), created)
            backup = None
            if os.path.lexists(target):
                backup = os.path.join(staging, f"{i}.old")
                os.replace(target, backup)
            moved.append((target, backup))
            os.replace(os.path.join(staging, f"{i}.new"), target)
    except BaseException as e:
        _roll_back(moved, created, staging)
        staging = None
        if isinstance(e, OSError):
            raise ExportError(f"cannot write the export to {folder}: {e}; the folder was left as it was") from e
        raise
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def _roll_back(moved: list, created: list, staging: str | None) -> None:
    """Undo `write_files`: old files back, new files and created folders gone (best effort, never raises)."""
    for target, backup in reversed(moved):
        try:
            if backup is not None and os.path.lexists(backup):
                os.replace(backup, target)
            elif backup is None and os.path.lexists(target):
                os.unlink(target)
        except OSError:
            pass
    if staging is not None:
        shutil.rmtree(staging, ignore_errors=True)
    for folder in reversed(created):
        try:
            os.rmdir(folder)
        except OSError:
            pass
