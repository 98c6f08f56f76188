"""Which artifacts may be loaded: only those this user's processes wrote.

An artifact holds a compiled library, and loading a library runs its code, so checking its
structure is not enough: anyone who can write into the build folder could put code there. Every
artifact is therefore signed with an HMAC-SHA256 under a secret only this user can read (32 random
bytes in ``$XDG_CACHE_HOME/rewrite/static_kernels.key``, default ``~/.cache``; created on first
use with mode 0600, atomically, so processes starting together agree on one). An artifact whose
signature does not verify (another user's, tampered with, or damaged) is never loaded: its
kernels are built anew. This is the model of Jupyter's trusted notebooks.

The compile cache signs its entries with the same key (`rewrite.cache.store`): there a signature
only spares re-inferring the shapes recorded in a graph file; nothing from a cache file is ever run.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import stat

__all__ = ["secret", "sign", "verify", "key_path", "TrustError"]

KEY_BYTES = 32


class TrustError(RuntimeError):
    """The signing key cannot be created or is not private to this user."""


def key_path() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "rewrite", "static_kernels.key")


def _read(path: str) -> bytes:
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077 or st.st_size != KEY_BYTES:
        raise TrustError(f"{path} must be a regular file of {KEY_BYTES} bytes owned by this user with mode 0600; "
                         "remove it to have a new one made")
    with open(path, "rb") as f:
        return f.read(KEY_BYTES)


def secret() -> bytes:
    """This user's signing key, made on first use."""
    path = key_path()
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, os.urandom(KEY_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # atomic, and fails if another process made the key first: then use theirs
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    except OSError as e:
        raise TrustError(f"cannot create the static-kernel signing key {path}: {e}") from e
    return _read(path)


def sign(data: bytes) -> str:
    return hmac.new(secret(), data, hashlib.sha256).hexdigest()


def verify(data: bytes, signature: str) -> bool:
    return hmac.compare_digest(sign(data), signature)
