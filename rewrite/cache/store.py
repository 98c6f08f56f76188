"""A cache folder: entries this user's rewrite signed, written whole, read as hostile.

A cache folder may come from someone else (a cloned repo, a shared machine), so one rule decides
what is used (docs/export_format.md, "Compile caches"):

* **An entry is used only when its signature verifies.** ``signature.json`` lists the sha256 of
  every file of the entry (``key.json`` included), the key's fields and the entry's place in the
  folder, with an HMAC-SHA256 over them under this user's secret (`rewrite.persist.signing`, the
  key that signs static-kernel artifacts). Every file is then read through the verified `Entry`:
  its bytes are read once, their sha256 compared with the signed one, and only those bytes are
  decoded. An unsigned entry, a signature that does not verify (another user's, forged, copied to
  another place or key), a file whose digest differs, or no signing key: each is a miss with one log
  line saying why, and the entry is compiled again; never loaded "with more checks".
* **Folders.** The root must be a folder of this user's that others cannot write into
  (`check_private_folder`); missing, it is made with mode 0700. Where the user named it
  (``config.cache.dir``, ``cache_compile(cache_dir=...)``) a refused root is a `CacheFolderError`;
  the default ``.rewrite_cache`` is refused with one warning and no caching. Levels below the root
  are made and read only as real folders (`confined_folder`): a symlinked ``{cache}/{model}`` or
  ``graphs/`` is a miss and is never written through.
* **Writes.** An entry is staged in a scratch folder beside its place (``.tmp-*``, carrying a signed
  marker) and renamed into place. Only an entry whose signature verifies, or a scratch folder whose
  marker does, is ever moved or deleted (`python -m rewrite cache clear` too); anything else in the
  way is left as it is, with a warning, and the entry is not cached.
* **Bounds.** A miss reads at most `MAX_SIBLINGS` sibling ``key.json`` files of at most
  `MAX_KEY_BYTES` each (for its log line); a signature file is at most `MAX_SIGNATURE_BYTES`; a graph
  file at most 64 MiB; an entry holds at most ``MAX_GEARS`` gear graphs (graph_files.py).

A folder that cannot be written (read-only, full disk) turns caching off for that folder in this
process, with one warning. Threads: one `CacheDir` per folder, a lock per entry (compiles of
different entries never wait for each other); no lock is held while reading or decoding files.
"""
from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
import threading
import time
import unicodedata

from ..persist import signing
from ..persist.atomic import write_files
from ..persist.checks import MAX_JSON_BYTES, at, expect_object, expect_str, read_file
from ..persist.document import parse_json
from ..persist.errors import ExportError
from ..persist.folders import FolderRefused, check_private_folder, confined_folder, private_folder
from .key import diff

log = logging.getLogger("rewrite")

__all__ = ["CacheDir", "CacheFolderError", "Entry", "KEY_FILE", "SIGNATURE_FILE", "counters", "count", "entries",
           "read_key", "clear", "describe_entries", "printable"]

KEY_FILE = "key.json"
KEY_FORMAT = "rewrite.cache.key"
KEY_VERSION = 1
SIGNATURE_FILE = "signature.json"
SIGNATURE_FORMAT = "rewrite.cache.signature"
SIGNATURE_VERSION = 2
SCRATCH_MARKER = "scratch.json"  # in a staging or trash folder: signed, so `clear` knows it is ours
SCRATCH_FORMAT = "rewrite.cache.scratch"
SCRATCH_PREFIXES = (".tmp-", ".trash-")

MAX_SIBLINGS = 64  # sibling entries whose key.json a miss reads to name the nearest one
MAX_KEY_BYTES = 64 << 10  # one key.json
MAX_SIGNATURE_BYTES = 1 << 20  # one signature.json (a digest per file: thousands of weight files fit)
MAX_ENTRY_FILES = 100_000  # files one signature may list (a graph file lists at most MAX_NODES weights)
MAX_DEPTH = 6  # folder levels below the root that `entries` and `clear` walk

_counters_lock = threading.Lock()
counters: collections.Counter = collections.Counter()


def count(name: str, n: int = 1) -> None:
    """Count a cache event (hits, misses, writes, damaged, untrusted, ...) in `counters`, read by tests and reports."""
    with _counters_lock:
        counters[name] += n


class CacheFolderError(ValueError):
    """A cache folder the user named that rewrite refuses to keep a cache in (another user's, open to others)."""


def printable(text: str) -> str:
    """``text`` with control and format characters escaped (``\\x1b``), so a label from a file cannot
    drive the terminal it is printed on (clear the screen, set the title, write the clipboard)."""
    out = []
    for ch in str(text):
        if unicodedata.category(ch)[0] == "C" or ch in "\u2028\u2029":
            out.append(ch.encode("unicode_escape").decode("ascii"))
        else:
            out.append(ch)
    return "".join(out)


def _parse_key(raw: bytes, path: str) -> dict:
    where = KEY_FILE
    data = parse_json(raw, where)
    if data.get("format") != KEY_FORMAT or data.get("version") != KEY_VERSION:
        raise ExportError(f"{path} is not a {KEY_FORMAT} version {KEY_VERSION} file")
    expect_object(data, where, required=("format", "version", "kind", "label", "fields", "created"))
    expect_str(data["kind"], at(where, "kind"), max_len=32)
    expect_str(data["label"], at(where, "label"), max_len=1024)
    expect_str(data["created"], at(where, "created"), max_len=64)
    for k, v in expect_object(data["fields"], at(where, "fields")).items():
        expect_str(v, at(at(where, "fields"), k), max_len=4096)
    return data


def read_key(folder: str) -> dict:
    """An entry's key record (at most `MAX_KEY_BYTES`), checked: ``{"kind", "label", "fields", "created"}``.
    Not trusted: only for messages and listings (`Entry` reads it against its signed digest)."""
    path = os.path.join(folder, KEY_FILE)
    return _parse_key(read_file(path, f"cache key file {path}", max_size=MAX_KEY_BYTES), path)


def _posix(rel: str) -> str:
    return "/".join(p for p in rel.split(os.sep) if p)


def _signed_text(rel: str, fields: dict, files: dict) -> bytes:
    return json.dumps({"format": SIGNATURE_FORMAT, "version": SIGNATURE_VERSION, "rel": _posix(rel),
                       "fields": fields, "files": files}, sort_keys=True).encode("utf-8")


def _real_folder(path: str) -> bool:
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return False
    return stat.S_ISDIR(mode) and not stat.S_ISLNK(mode)


def _real_folders(root: str, rel: str, *, missing_ok: bool = False) -> bool:
    """Whether every level of ``rel`` below ``root`` is a real folder (no symlink leads out); with
    ``missing_ok``, levels from the first missing one on do not count (nothing is there to follow)."""
    path = root
    for part in _posix(rel).split("/"):
        path = os.path.join(path, part)
        if missing_ok and not os.path.lexists(path):
            return True
        if not _real_folder(path):
            return False
    return True


class Entry:
    """An entry whose signature verified: its folder, signed key fields and the signed digest of each file."""

    def __init__(self, folder: str, rel: str, fields: dict, files: dict):
        self.folder, self.rel, self.fields, self.files = folder, rel, fields, files

    def has(self, name: str) -> bool:
        return name in self.files

    def digests_under(self, prefix: str) -> dict:
        """{name relative to ``prefix``: sha256} of the signed files below ``prefix`` ("gears/")."""
        return {name[len(prefix):]: d for name, d in self.files.items() if name.startswith(prefix)}

    def read(self, name: str, max_size: int = MAX_JSON_BYTES) -> bytes:
        """The bytes of file ``name``, read once and returned only when they have the signed sha256."""
        expected = self.files.get(name)
        path = os.path.join(self.folder, *name.split("/"))
        if expected is None:
            raise ExportError(f"{path}: the entry's signature does not list this file")
        data = read_file(path, f"cache file {path}", max_size=max_size)
        if hashlib.sha256(data).hexdigest() != expected:
            raise ExportError(f"{path} does not have the sha256 its entry's signature lists (edited or replaced)")
        return data

    def read_json(self, name: str, max_size: int = MAX_JSON_BYTES) -> dict:
        return parse_json(self.read(name, max_size), name)


def open_entry(folder: str, rel: str) -> tuple[Entry | None, str]:
    """(the verified entry, "") or (None, why it is not one this user's rewrite wrote at ``rel``). Never raises."""
    path = os.path.join(folder, SIGNATURE_FILE)
    if not os.path.lexists(path):
        return None, f"it is not signed (no {SIGNATURE_FILE})"
    try:
        data = parse_json(read_file(path, f"cache signature file {path}", max_size=MAX_SIGNATURE_BYTES),
                          SIGNATURE_FILE)
        if data.get("format") != SIGNATURE_FORMAT or data.get("version") != SIGNATURE_VERSION:
            return None, f"{SIGNATURE_FILE} is not a {SIGNATURE_FORMAT} version {SIGNATURE_VERSION} file"
        expect_object(data, SIGNATURE_FILE, required=("format", "version", "rel", "fields", "files", "hmac"))
        fields = expect_object(data["fields"], at(SIGNATURE_FILE, "fields"))
        files = expect_object(data["files"], at(SIGNATURE_FILE, "files"))
        if len(files) > MAX_ENTRY_FILES:
            return None, f"{SIGNATURE_FILE} lists {len(files)} files; at most {MAX_ENTRY_FILES} are allowed"
        if not (isinstance(data["hmac"], str) and all(isinstance(v, str) for v in (*fields.values(), *files.values()))):
            return None, f"{SIGNATURE_FILE} is malformed"
        if not signing.verify(_signed_text(rel, fields, files), data["hmac"]):
            return None, "its signature does not verify (written by another user, edited, or moved to another place)"
    except signing.TrustError as e:
        return None, f"its signature cannot be checked: {e}"
    except (ExportError, OSError) as e:
        return None, f"its signature cannot be read: {e}"
    return Entry(folder, rel, dict(fields), dict(files)), ""


def _scratch(parent: str, prefix: str) -> str:
    """A new scratch folder (mode 0700) in ``parent``, marked as ours by a signed marker before anything goes in."""
    path = tempfile.mkdtemp(prefix=prefix, dir=parent)
    try:
        name = os.path.basename(path)
        mac = signing.sign(json.dumps({"format": SCRATCH_FORMAT, "name": name}, sort_keys=True).encode())
        with open(os.path.join(path, SCRATCH_MARKER), "x") as f:
            json.dump({"format": SCRATCH_FORMAT, "name": name, "hmac": mac}, f)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return path


def _is_scratch(path: str) -> bool:
    """Whether ``path`` is a staging or trash folder this user's rewrite made (its marker verifies)."""
    if not (os.path.basename(path).startswith(SCRATCH_PREFIXES) and _real_folder(path)):
        return False
    try:
        marker = os.path.join(path, SCRATCH_MARKER)
        data = parse_json(read_file(marker, f"scratch marker {marker}", max_size=4096), SCRATCH_MARKER)
        name = os.path.basename(path)
        text = json.dumps({"format": SCRATCH_FORMAT, "name": name}, sort_keys=True).encode()
        return data.get("name") == name and isinstance(data.get("hmac"), str) and signing.verify(text, data["hmac"])
    except (ExportError, OSError, signing.TrustError):
        return False


def _discard(folder: str) -> None:
    """Move ``folder`` (an entry known to be ours) into a marked trash folder beside it and delete that."""
    trash = _scratch(os.path.dirname(folder), f".trash-{os.path.basename(folder)}-")
    try:
        os.rename(folder, os.path.join(trash, "old"))
    except OSError:
        pass  # another process moved it first
    finally:
        shutil.rmtree(trash, ignore_errors=True)


class CacheDir:
    """One cache folder (one object per folder per process: `CacheDir.get`)."""

    _instances: dict = {}
    _instances_lock = threading.Lock()

    @classmethod
    def get(cls, root: str, *, named: bool = True) -> "CacheDir":
        """The cache in ``root`` (the user's own path, symlinks in it resolved). ``named``: the user chose
        the folder, so a refused one is an error; else (a default folder) a warning and no caching."""
        path = os.path.realpath(os.path.expanduser(root))
        with cls._instances_lock:
            if path not in cls._instances:
                cls._instances[path] = cls(path)
            cache = cls._instances[path]
            cache.named = cache.named or named
            return cache

    def __init__(self, root: str):
        self.root = root
        self.named = False
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        self.disabled: str | None = None  # why writing was turned off

    def lock(self, rel: str) -> threading.Lock:
        """The lock of one entry: held while it is compiled and written, so threads compile it once."""
        with self._locks_lock:
            return self._locks.setdefault(rel, threading.Lock())

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def _root_usable(self, create: bool) -> bool:
        """Whether the root may hold a cache (made, mode 0700, when ``create``); a refused root raises
        `CacheFolderError` where the user named it, else turns caching off with one warning."""
        try:
            if create:
                private_folder(self.root)
            elif not os.path.lexists(self.root):
                return False
            else:
                check_private_folder(self.root)
            return True
        except FolderRefused as e:
            why = (f"compile cache folder refused: {e}. rewrite keeps a compile cache only in a folder of this user's "
                   "that other users cannot write into (as ssh and pip do)")
            if self.named:
                raise CacheFolderError(why) from None
            if self.disabled is None:
                self.disabled = why
                log.warning("rewrite %s; caching is off for this folder in this process", why)
            return False

    # -- reading ------------------------------------------------------------------------------
    def lookup(self, rel: str, fields: dict, what: str) -> Entry | None:
        """The verified entry at ``rel`` when it was signed for ``fields``; else None, with a log line saying why."""
        if not self._root_usable(create=False):
            count("misses")
            log.info("cache miss for %s: no cache folder %s", what, self.root)
            return None
        folder = self.path(rel)
        if not _real_folders(self.root, rel, missing_ok=True):
            count("misses")
            count("untrusted")
            log.warning("cache miss for %s: %s is reached through a symlink or is not a folder; rewrite reads "
                        "entries only from real folders inside %s", what, folder, self.root)
            return None
        if not os.path.lexists(folder):
            count("misses")
            nearest = self._nearest(os.path.dirname(folder), fields) if rel.count(os.sep) else None
            if nearest is None:
                log.info("cache miss for %s: no entry in %s", what, self.root)
            else:
                name, changed = nearest
                log.info("cache miss for %s: the nearest entry %s differs in %s", what, printable(name),
                         printable(", ".join(changed)))
            return None
        entry, why = open_entry(folder, rel)
        if entry is None:
            count("misses")
            count("untrusted")
            log.warning("cache miss for %s: entry %s is not used: %s; compiling again", what, folder, why)
            return None
        changed = diff(fields, entry.fields)
        if changed:
            count("misses")
            log.info("cache miss for %s: entry %s was written for another %s", what, folder,
                     printable(", ".join(changed)))
            return None
        try:
            _parse_key(entry.read(KEY_FILE, MAX_KEY_BYTES), os.path.join(folder, KEY_FILE))
        except ExportError as e:
            self.damaged(entry, e)
            return None
        return entry

    def _nearest(self, parent: str, fields: dict):
        """The sibling whose key differs in the fewest fields: at most `MAX_SIBLINGS` read (for a log line only)."""
        best = None
        try:
            with os.scandir(parent) as it:
                names = []
                for item in it:
                    if not item.name.startswith("."):
                        names.append(item.name)
                    if len(names) >= MAX_SIBLINGS:
                        break
        except OSError:
            return None
        for name in sorted(names):
            try:
                other = read_key(os.path.join(parent, name))["fields"]
            except (ExportError, OSError):
                continue
            changed = diff(fields, other)
            if best is None or len(changed) < len(best[1]):
                best = (name, changed)
        return best

    def damaged(self, entry: Entry, error: Exception) -> None:
        """Report a damaged entry of ours (a miss; it is removed, so the next write replaces it)."""
        count("damaged")
        count("misses")
        log.warning("cache entry %s is damaged or does not fit (%s: %s); compiling again", entry.folder,
                    type(error).__name__, printable(str(error)[:300]))
        self.remove(entry.rel)

    # -- writing ------------------------------------------------------------------------------
    def write(self, rel: str, fields: dict, files: list[tuple[str, bytes]], *, kind: str, label: str) -> bool:
        """Write a signed entry as a whole (``files`` plus its key); False when it is not cached (logged)."""
        if self.disabled:
            return False
        target = self.path(rel)
        record = {"format": KEY_FORMAT, "version": KEY_VERSION, "kind": kind, "label": label, "fields": fields,
                  "created": time.strftime("%Y-%m-%d %H:%M:%S")}
        files = list(files) + [(KEY_FILE, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode("utf-8"))]
        scratch = None
        try:
            if not self._root_usable(create=True):
                return False
            try:
                parent = confined_folder(self.root, os.path.dirname(rel))
            except FolderRefused as e:
                count("write_failures")
                log.warning("rewrite compile cache: %s is not cached: %s", printable(label), e)
                return False
            files.append((SIGNATURE_FILE, _signature(rel, fields, files)))
            scratch = _scratch(parent, f".tmp-{os.path.basename(target)}-")
            staged = os.path.join(scratch, "entry")
            os.mkdir(staged, 0o700)
            write_files(staged, files)
            for folder, dirs, _ in os.walk(staged):
                for d in dirs:
                    os.chmod(os.path.join(folder, d), 0o700)
            if not self._publish(staged, target, rel, fields, label):
                return False
        except (OSError, ExportError, signing.TrustError) as e:
            self.disabled = f"{type(e).__name__}: {e}"
            count("write_failures")
            log.warning("rewrite compile cache: cannot write to %s (%s); caching is off for this folder in this "
                        "process", self.root, self.disabled)
            return False
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
        count("writes")
        return True

    def _publish(self, staged: str, target: str, rel: str, fields: dict, label: str) -> bool:
        """Rename the staged entry into place. An entry of ours already there is kept when it has this key
        (another writer was first), else replaced; anything else in the way is left alone (False)."""
        for _ in range(3):
            try:
                os.rename(staged, target)
                return True
            except OSError:
                if not os.path.lexists(target):
                    raise
            entry, why = open_entry(target, rel) if _real_folder(target) else (None, "it is not a real folder")
            if entry is None:
                count("write_failures")
                log.warning("rewrite compile cache: %s is not cached: %s is in the way and is not an entry this "
                            "user's rewrite wrote (%s); it is left as it is (remove it to cache here)",
                            printable(label), target, why)
                return False
            if diff(fields, entry.fields) == []:
                return True  # someone wrote the same entry first: keep theirs
            _discard(target)  # ours, for another key at this fixed place (cache_compile): replace it
        os.rename(staged, target)
        return True

    def remove(self, rel: str) -> bool:
        """Remove the entry at ``rel`` when it is one this user's rewrite wrote (its signature verifies)."""
        folder = self.path(rel)
        if not _real_folders(self.root, rel) or open_entry(folder, rel)[0] is None:
            return False
        try:
            _discard(folder)
        except (OSError, signing.TrustError) as e:
            log.warning("rewrite compile cache: cannot remove entry %s: %s", folder, e)
            return False
        return True


def _signature(rel: str, fields: dict, files: list[tuple[str, bytes]]) -> bytes:
    """The signature file of an entry (raises `signing.TrustError` when this user has no signing key)."""
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in files}
    mac = signing.sign(_signed_text(rel, fields, digests))
    record = {"format": SIGNATURE_FORMAT, "version": SIGNATURE_VERSION, "rel": _posix(rel), "fields": fields,
              "files": digests, "hmac": mac}
    return json.dumps(record, indent=1, sort_keys=True).encode("utf-8")


def _size(folder: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(folder):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def entries(root: str):
    """(relative path, key record or the error that made it unreadable) of every folder under ``root``
    holding a key or signature file, at most `MAX_DEPTH` levels down; symlinks are not followed."""
    root = os.path.abspath(root)
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        if os.path.relpath(folder, root).count(os.sep) >= MAX_DEPTH:
            dirs[:] = []
        if KEY_FILE in files or SIGNATURE_FILE in files:
            dirs[:] = []
            try:
                yield os.path.relpath(folder, root), read_key(folder)
            except ExportError as e:
                yield os.path.relpath(folder, root), e


def find(root: str, key: str) -> list[tuple[str, object]]:
    """Entries whose relative path, folder name (or a prefix of it) or label is ``key``."""
    out = []
    for rel, record in entries(root):
        label = record.get("label") if isinstance(record, dict) else None
        if key in (rel, label) or os.path.basename(rel).startswith(key):
            out.append((rel, record))
    return out


def clear(root: str) -> int:
    """Remove every entry under ``root`` that this user's rewrite wrote; returns how many.

    Only entries whose signature verifies and this module's scratch folders whose signed marker
    verifies are removed (then the folders left empty above them), so pointing it at a wrong folder
    deletes nothing else: not a folder merely holding a ``key.json``, not an unmarked ``.tmp-`` folder.
    """
    root = os.path.realpath(root)
    cache = CacheDir(root)
    n, emptied = 0, set()
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        for d in [d for d in dirs if d.startswith(SCRATCH_PREFIXES)]:
            dirs.remove(d)
            if _is_scratch(os.path.join(folder, d)):
                shutil.rmtree(os.path.join(folder, d), ignore_errors=True)
                emptied.add(folder)
        if rel.count(os.sep) >= MAX_DEPTH:
            dirs[:] = []
        if SIGNATURE_FILE in files and folder != root:
            dirs[:] = []
            if cache.remove(rel):
                n += 1
                emptied.add(os.path.dirname(folder))
    for folder in sorted(emptied, key=len, reverse=True):  # the folders our entries left empty, up to the root
        while folder != root and folder.startswith(root + os.sep):
            try:
                os.rmdir(folder)  # only when empty
            except OSError:
                break
            folder = os.path.dirname(folder)
    return n


def describe_entries(root: str) -> str:
    """`python -m rewrite cache ls`: one line per entry; every text from a file has its control characters escaped."""
    lines = []
    root = os.path.abspath(root)
    for rel, record in entries(root):
        if isinstance(record, dict):
            signed = open_entry(os.path.join(root, rel), rel)[0] is not None
            lines.append(printable(f"{rel}  {record['kind']}  {record['label']}  {record['created']}  "
                                   f"{_size(os.path.join(root, rel)) / 1e6:.2f} MB"
                                   + ("" if signed else "  (not signed by this user: never used)")))
        else:
            lines.append(printable(f"{rel}  damaged: {record}"))
    return "\n".join(lines) if lines else f"no cache entries in {printable(root)}"
