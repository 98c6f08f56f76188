"""A cache folder: entries written whole or not at all, read as hostile, degraded on a bad disk.

An entry is a folder holding ``key.json`` (the key's fields, so a miss can name the field that
changed and ``python -m rewrite cache info`` can show them) and the entry's files. Writing goes
through `rewrite.persist.atomic.write_files` into a staging folder beside the entry, which is then renamed
into place: two processes writing one entry both succeed, the first rename wins and the other
drops its copy, so readers only ever see a complete entry. A damaged or truncated entry is a miss
(logged) and is replaced by the next write. A folder that cannot be written (read-only, full disk)
turns caching off for that folder in this process, with one warning.

Signature: an entry also holds ``signature.json``, the sha256 of each of its files and an HMAC-SHA256
of those and of the key's fields under this user's secret (`rewrite.persist.signing`, the key that
signs static-kernel artifacts). A graph file whose bytes match a verified signature was written by
this user's rewrite for this very key, with metas its own shape inference computed, so readers skip
re-deriving them (`trusted_digests`); every other check of the file format still runs. An entry
without a valid signature (another user's, copied from elsewhere, edited) is read with every check.

Threads: one `CacheDir` per folder, a lock per entry (compiles of different entries never wait
for each other); no lock is held while reading or decoding files.
"""
from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time

from ..persist import signing
from ..persist.atomic import write_files
from ..persist.checks import at, expect_object, expect_str, read_json
from ..persist.errors import ExportError
from .key import diff, key_hash

log = logging.getLogger("rewrite")

__all__ = ["CacheDir", "KEY_FILE", "counters", "count", "entries", "read_key"]

KEY_FILE = "key.json"
KEY_FORMAT = "rewrite.cache.key"
KEY_VERSION = 1
SIGNATURE_FILE = "signature.json"
SIGNATURE_FORMAT = "rewrite.cache.signature"
MAX_SCAN = 500  # entries compared when a miss looks for the nearest one

_counters_lock = threading.Lock()
counters: collections.Counter = collections.Counter()


def count(name: str, n: int = 1) -> None:
    """Count a cache event (hits, misses, writes, damaged, ...) in `counters`, read by tests and reports."""
    with _counters_lock:
        counters[name] += n


def read_key(folder: str) -> dict:
    """An entry's key record, checked: ``{"kind", "label", "fields", "created"}``."""
    where = KEY_FILE
    data, _ = read_json(os.path.join(folder, KEY_FILE), "cache key file", where)
    if data.get("format") != KEY_FORMAT or data.get("version") != KEY_VERSION:
        raise ExportError(f"{os.path.join(folder, KEY_FILE)} is not a {KEY_FORMAT} version {KEY_VERSION} file")
    expect_object(data, where, required=("format", "version", "kind", "label", "fields", "created"))
    expect_str(data["kind"], at(where, "kind"), max_len=32)
    expect_str(data["label"], at(where, "label"), max_len=1024)
    for k, v in expect_object(data["fields"], at(where, "fields")).items():
        expect_str(v, at(at(where, "fields"), k), max_len=4096)
    return data


def entries(root: str):
    """(relative path, key record or the error that made it unreadable) of every entry under ``root``."""
    root = os.path.abspath(root)
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        if os.path.relpath(folder, root).count(os.sep) > 6:
            dirs[:] = []
        if KEY_FILE in files:
            dirs[:] = []
            try:
                yield os.path.relpath(folder, root), read_key(folder)
            except ExportError as e:
                yield os.path.relpath(folder, root), e


class CacheDir:
    """One cache folder (one object per folder per process: `CacheDir.get`)."""

    _instances: dict = {}
    _instances_lock = threading.Lock()

    @classmethod
    def get(cls, root: str) -> "CacheDir":
        path = os.path.realpath(os.path.expanduser(root))
        with cls._instances_lock:
            if path not in cls._instances:
                cls._instances[path] = cls(path)
            return cls._instances[path]

    def __init__(self, root: str):
        self.root = root
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        self.disabled: str | None = None  # why writing was turned off

    def lock(self, rel: str) -> threading.Lock:
        """The lock of one entry: held while it is compiled and written, so threads compile it once."""
        with self._locks_lock:
            return self._locks.setdefault(rel, threading.Lock())

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    # -- reading ------------------------------------------------------------------------------
    def lookup(self, rel: str, fields: dict, what: str) -> str | None:
        """The entry folder when it holds a key equal to ``fields``; else None, with a log line saying why."""
        folder = self.path(rel)
        if not os.path.lexists(os.path.join(folder, KEY_FILE)):
            count("misses")
            nearest = self._nearest(os.path.dirname(folder), fields) if rel.count(os.sep) else None
            if nearest is None:
                log.info("cache miss for %s: no entry in %s", what, self.root)
            else:
                name, changed = nearest
                log.info("cache miss for %s: the nearest entry %s differs in %s", what, name, ", ".join(changed))
            return None
        try:
            record = read_key(folder)
        except ExportError as e:
            count("misses")
            count("damaged")
            log.warning("cache entry %s is damaged (%s); compiling again", folder, e)
            return None
        changed = diff(fields, record["fields"])
        if changed:
            count("misses")
            log.info("cache miss for %s: entry %s was written for another %s", what, folder, ", ".join(changed))
            return None
        return folder

    def _nearest(self, parent: str, fields: dict):
        best = None
        try:
            names = sorted(os.listdir(parent))[:MAX_SCAN]
        except OSError:
            return None
        for name in names:
            if name.startswith("."):
                continue
            try:
                other = read_key(os.path.join(parent, name))["fields"]
            except (ExportError, OSError):
                continue
            changed = diff(fields, other)
            if best is None or len(changed) < len(best[1]):
                best = (name, changed)
        return best

    def trusted_digests(self, folder: str, fields: dict) -> dict[str, str]:
        """{file: sha256} of the entry's files when its signature verifies for ``fields``; else {} (then
        readers check everything). Never raises: an unsigned or wrongly signed entry is merely untrusted."""
        try:
            data, _ = read_json(os.path.join(folder, SIGNATURE_FILE), "cache signature file", SIGNATURE_FILE)
            expect_object(data, SIGNATURE_FILE, required=("format", "files", "hmac"))
            files = expect_object(data["files"], at(SIGNATURE_FILE, "files"))
            if data["format"] != SIGNATURE_FORMAT or not isinstance(data["hmac"], str) or not all(
                    isinstance(v, str) for v in files.values()):
                return {}
            if not signing.verify(_signed_text(fields, files), data["hmac"]):
                log.debug("cache entry %s: its signature does not verify; every file is checked", folder)
                return {}
            return dict(files)
        except (ExportError, OSError, signing.TrustError) as e:
            log.debug("cache entry %s is not signed by this user (%s); every file is checked", folder, e)
            return {}

    def damaged(self, folder: str, error: Exception) -> None:
        """Report a damaged entry (it is a miss, and the next write replaces it)."""
        count("damaged")
        count("misses")
        log.warning("cache entry %s is damaged or does not fit (%s: %s); compiling again", folder,
                    type(error).__name__, str(error)[:300])
        self.remove(os.path.relpath(folder, self.root))  # so the next write replaces it

    # -- writing ------------------------------------------------------------------------------
    def write(self, rel: str, fields: dict, files: list[tuple[str, bytes]], *, kind: str, label: str) -> bool:
        """Write an entry as a whole (``files`` plus its key); False when caching is off for this folder."""
        if self.disabled:
            return False
        target = self.path(rel)
        record = {"format": KEY_FORMAT, "version": KEY_VERSION, "kind": kind, "label": label, "fields": fields,
                  "created": time.strftime("%Y-%m-%d %H:%M:%S")}
        key_bytes = (json.dumps(record, indent=1, sort_keys=True) + "\n").encode("utf-8")
        parent = os.path.dirname(target)
        staging = None
        try:
            os.makedirs(parent, exist_ok=True)
            staging = tempfile.mkdtemp(prefix=f".tmp-{os.path.basename(target)}-", dir=parent)
            write_files(staging, list(files) + _signature(fields, files) + [(KEY_FILE, key_bytes)])
            self._publish(staging, target, fields)
            staging = None
        except (OSError, ExportError) as e:
            self.disabled = f"{type(e).__name__}: {e}"
            count("write_failures")
            log.warning("rewrite compile cache: cannot write to %s (%s); caching is off for this folder in this "
                        "process", self.root, self.disabled)
            return False
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
        count("writes")
        return True

    def _publish(self, staging: str, target: str, fields: dict) -> None:
        """Rename the staged entry into place; an entry another writer put there first is kept when good."""
        for _ in range(3):
            try:
                os.rename(staging, target)
                return
            except OSError:
                if not os.path.lexists(target):
                    raise
            try:
                if diff(fields, read_key(target)["fields"]) == []:
                    shutil.rmtree(staging, ignore_errors=True)  # someone wrote the same entry first: keep theirs
                    return
            except ExportError:
                pass
            # a damaged entry, or one for another key at this fixed place (cache_compile): replace it
            trash = tempfile.mkdtemp(prefix=f".trash-{os.path.basename(target)}-", dir=os.path.dirname(target))
            try:
                os.rename(target, os.path.join(trash, "old"))
            except OSError:
                pass  # another process moved it first
            finally:
                shutil.rmtree(trash, ignore_errors=True)
        os.rename(staging, target)

    def remove(self, rel: str) -> None:
        """Remove an entry (a damaged one that cannot be read); never anything that is not an entry."""
        folder = self.path(rel)
        if os.path.isdir(folder) and not os.path.islink(folder) and os.path.lexists(os.path.join(folder, KEY_FILE)):
            trash = tempfile.mkdtemp(prefix=".trash-", dir=os.path.dirname(folder))
            try:
                os.rename(folder, os.path.join(trash, "old"))
            except OSError:
                pass
            shutil.rmtree(trash, ignore_errors=True)


def _signed_text(fields: dict, files: dict) -> bytes:
    return json.dumps({"format": SIGNATURE_FORMAT, "fields": fields, "files": files}, sort_keys=True).encode("utf-8")


def _signature(fields: dict, files: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """The signature file of an entry (empty when this user has no signing key: the entry is then unsigned)."""
    digests = {rel: hashlib.sha256(data).hexdigest() for rel, data in files}
    try:
        mac = signing.sign(_signed_text(fields, digests))
    except signing.TrustError as e:
        log.debug("compile cache: entries are not signed (%s); readers check every file", e)
        return []
    record = {"format": SIGNATURE_FORMAT, "files": digests, "hmac": mac}
    return [(SIGNATURE_FILE, json.dumps(record, indent=1, sort_keys=True).encode("utf-8"))]


def digest_of(raw: bytes) -> str:
    """The sha256 a signature lists for a file's bytes (compare with `CacheDir.trusted_digests`)."""
    return hashlib.sha256(raw).hexdigest()


def entry_name(fields: dict) -> str:
    return key_hash(fields)


def _size(folder: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(folder):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def find(root: str, key: str) -> list[tuple[str, object]]:
    """Entries whose relative path, folder name (or a prefix of it) or label is ``key``."""
    out = []
    for rel, record in entries(root):
        label = record.get("label") if isinstance(record, dict) else None
        if key in (rel, label) or os.path.basename(rel).startswith(key):
            out.append((rel, record))
    return out


def clear(root: str) -> int:
    """Remove every entry under ``root`` (and leftovers of interrupted writes); returns how many.

    Only folders holding a key file and this module's own ``.tmp-``/``.trash-`` folders are removed,
    so pointing it at a wrong folder does not delete anything else.
    """
    root = os.path.abspath(root)
    n = 0
    for rel, _ in list(entries(root)):
        CacheDir(root).remove(rel)
        n += 1
    for folder, dirs, _ in os.walk(root):
        for d in list(dirs):
            if d.startswith((".tmp-", ".trash-")):
                shutil.rmtree(os.path.join(folder, d), ignore_errors=True)
                dirs.remove(d)
    for folder, dirs, files in sorted(os.walk(root, topdown=False), reverse=False):
        if folder != root and not os.listdir(folder):
            try:
                os.rmdir(folder)
            except OSError:
                pass
    return n


def describe_entries(root: str) -> str:
    lines = []
    for rel, record in entries(root):
        if isinstance(record, dict):
            lines.append(f"{rel}  {record['kind']}  {record['label']}  {record['created']}  "
                         f"{_size(os.path.join(root, rel)) / 1e6:.2f} MB")
        else:
            lines.append(f"{rel}  damaged: {record}")
    return "\n".join(lines) if lines else f"no cache entries in {root}"
