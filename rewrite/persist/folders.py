"""The per-user cache folder: where rewrite keeps what it made for this user on this machine.

One computation for everything that lives there (the cost model's calibration, the signing key,
the kernels of tiered-up graphs), so they can never end up in folders that disagree:
``$REWRITE_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/rewrite``, else ``~/.cache/rewrite``.
"""
from __future__ import annotations

import os

__all__ = ["user_cache_dir"]


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
