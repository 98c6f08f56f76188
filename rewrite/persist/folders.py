"""Folders rewrite keeps files in: the per-user cache folder, and the rule every such folder must pass.

One computation for everything that lives there (the cost model's calibration, the signing key,
the kernels of tiered-up graphs), so they can never end up in folders that disagree:
``$REWRITE_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/rewrite``, else ``~/.cache/rewrite``.

A folder whose files decide what runs (a compile cache, a kernel build folder, the per-user cache)
must be this user's own: `check_private_folder` refuses a symlink, another user's folder, or one
that others may write into; `private_folder` makes a missing one with mode 0700; `confined_folder`
makes the levels below such a folder without following a symlink out of it.
"""
from __future__ import annotations

import os
import stat

__all__ = ["user_cache_dir", "FolderRefused", "check_private_folder", "private_folder", "confined_folder"]


def user_cache_dir(*parts: str, create: bool = False) -> str:
    """The per-user cache folder (module doc), or ``parts`` joined below it; with ``create``, made
    (mode 0700: only this user may read or plant files there) when missing."""
    root = os.environ.get("REWRITE_CACHE_DIR")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "rewrite")
    path = os.path.join(root, *parts)
    if create:
        os.makedirs(path, mode=0o700, exist_ok=True)
    return path


class FolderRefused(OSError):
    """A folder rewrite will not keep files in: a symlink, not a folder, another user's, or open to
    others' writes. The message names the folder and what is wrong with it."""


def check_private_folder(path: str) -> None:
    """Refuse ``path`` unless it is a real folder (not a symlink) owned by this user that no one else may
    write into: anyone who can write there can plant or swap files (ssh's and pip's rule)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise FolderRefused(f"{path} does not exist") from None
    if stat.S_ISLNK(info.st_mode):
        raise FolderRefused(f"{path} is a symlink; rewrite keeps its files only in a real folder")
    if not stat.S_ISDIR(info.st_mode):
        raise FolderRefused(f"{path} is not a folder")
    if info.st_uid != os.getuid():
        raise FolderRefused(f"{path} belongs to another user (uid {info.st_uid}); use a folder of your own")
    if info.st_mode & 0o022:
        raise FolderRefused(f"{path} may be written by other users (mode {stat.S_IMODE(info.st_mode):o}); "
                            f"make it private (chmod go-w) or use another folder")


def private_folder(path: str) -> str:
    """``path``, made (mode 0700, every missing level) when missing, then checked by `check_private_folder`."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    check_private_folder(path)
    return path


def confined_folder(root: str, rel: str) -> str:
    """The folder ``rel`` below ``root``, made level by level (mode 0700) where missing; refused when any
    level below ``root`` is a symlink or not a folder, so nothing written there lands outside ``root``."""
    path = root
    for part in [p for p in rel.split(os.sep) if p]:
        if part in (".", ".."):
            raise FolderRefused(f"{rel!r} leaves {root}")
        path = os.path.join(path, part)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
            raise FolderRefused(f"{path} is {'a symlink' if stat.S_ISLNK(info.st_mode) else 'not a folder'}; "
                                f"rewrite writes below {root} only into real folders")
    return path


def private_cache_folder(*parts: str) -> str:
    """The per-user cache folder (`user_cache_dir`), or ``parts`` below it, made (mode 0700) where
    missing and refused (`FolderRefused`) unless every level is this user's own and closed to others'
    writes. The cache folder itself is resolved first (``~/.cache`` may well be a link the user made to
    a larger disk) and its target checked; the levels below it are ours, so a symlink there is refused:
    a planted ``kernels -> /elsewhere`` would have our lock, records and artifacts land outside."""
    root = user_cache_dir()
    os.makedirs(root, mode=0o700, exist_ok=True)
    path = os.path.realpath(root)
    check_private_folder(path)
    for part in parts:
        path = confined_folder(path, part)
        check_private_folder(path)
    return path
