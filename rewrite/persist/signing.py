"""This user's signing key: HMAC-SHA256 signatures over what only this user's rewrite wrote.

A static-kernel artifact holds a compiled library, and loading a library runs its code, so
checking its structure is not enough: anyone who can write into the build folder could put code
there. Every artifact is therefore signed under a secret only this user can read (32 random bytes
in ``static_kernels.key`` in the per-user cache folder, `rewrite.persist.folders`; created on
first use with mode 0600, atomically, so processes starting together agree on one). An artifact
whose signature does not verify (another user's, tampered with, or damaged) is never loaded: its
kernels are built anew. This is the model of Jupyter's trusted notebooks.

The compile cache signs its entries with the same key (`rewrite.cache.store`): an entry is used only
when its signature verifies over every file's sha256 and the key; anything else is a miss.
"""
from __future__ import annotations

import hashlib
import hmac
import os

from .atomic import atomic_write_bytes
from .folders import user_cache_dir
from .reading import read_regular

__all__ = ["secret", "sign", "verify", "key_path", "TrustError"]

KEY_BYTES = 32


class TrustError(RuntimeError):
    """The signing key cannot be created or is not private to this user."""


def key_path() -> str:
    return user_cache_dir("static_kernels.key")


def _read(path: str) -> bytes:
    try:
        return read_regular(path, size=KEY_BYTES, private=True)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise TrustError(f"{path} {e}: it must be a regular file of {KEY_BYTES} bytes owned by this user with mode "
                         "0600; remove it to have a new one made") from None


def secret() -> bytes:
    """This user's signing key, made on first use."""
    path = key_path()
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        # Linked into place only where no key is yet: when another process made one first, use theirs.
        atomic_write_bytes(path, os.urandom(KEY_BYTES), exclusive=True)
    except OSError as e:
        raise TrustError(f"cannot create the static-kernel signing key {path}: {e}") from e
    return _read(path)


def sign(data: bytes) -> str:
    return hmac.new(secret(), data, hashlib.sha256).hexdigest()


def verify(data: bytes, signature: str) -> bool:
    return hmac.compare_digest(sign(data), signature)
