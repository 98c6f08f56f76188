"""The static-kernel artifact ``static_kernel_{datetime}.run``: one self-describing zip archive.

Members, exactly these and stored uncompressed:

* ``manifest.json``: format name and version, when and for what it was built (torch version,
  device key, generator version), every kernel (key, C symbol, signature), and the size and
  SHA-256 of the other members;
* ``manifest.hmac``: the manifest's HMAC-SHA256 under this user's key (`rewrite.persist.signing`);
* ``kernels.c``: the generated source, for readers; ``kernels.so``: the compiled library.

Reading treats the file as hostile: a regular file (no symlink) of bounded size, opened by
`rewrite.persist.reading`; the member list
is exactly the expected one, with bounded sizes, no compression, no encryption; the signature is
checked before the manifest is parsed; every manifest field is checked (`signature.check` for
kernel signatures; a kernel's key must be the hash of its signature and context; symbols are
``k_`` plus hex); member hashes must match. Any failure is an `ArtifactError` naming the file
and the field, and the caller builds the kernels anew. An artifact built for another torch,
device or generator is `Stale`. Nothing here unpickles, and nothing is extracted to a path taken
from the archive.

Written to a temporary name in the same folder and renamed into place, so no reader ever sees a
half-written artifact.
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import io
import json
import os
import re
import zipfile

from ..persist import signing
from ..persist.atomic import atomic_write_bytes
from ..persist.reading import open_regular
from .signature import SignatureError, check, kernel_key

__all__ = ["Artifact", "ArtifactError", "Stale", "write", "read", "NAME", "FORMAT"]

FORMAT = "rewrite.static_kernels"
VERSION = 1
NAME = re.compile(r"^static_kernel_\d{8}_\d{6}_\d{6}_\d+\.run$")
MEMBERS = {"manifest.json": 16 << 20, "manifest.hmac": 128, "kernels.c": 256 << 20, "kernels.so": 512 << 20}
MAX_FILE = sum(MEMBERS.values()) + (1 << 20)
MAX_KERNELS = 100_000
_SYMBOL = re.compile(r"^k_[0-9a-f]{24}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class ArtifactError(ValueError):
    """An artifact is damaged, forged or malformed; the message names the file and what is wrong."""


class Stale(ArtifactError):
    """An artifact built for another torch version, device or code generator."""


@dataclasses.dataclass
class Artifact:
    path: str
    kernels: dict  # key -> (symbol, signature)
    library: bytes
    source: str


def symbol_of(key: str) -> str:
    return "k_" + key[:24]


def file_name(now: datetime.datetime | None = None) -> str:
    now = now or datetime.datetime.now()
    return f"static_kernel_{now:%Y%m%d_%H%M%S_%f}_{os.getpid()}.run"


def write(folder: str, kernels: dict, context: dict, source: str, library: bytes) -> str:
    """Write an artifact holding ``kernels`` (key -> signature) into ``folder``; returns its path."""
    files = {"kernels.c": source.encode(), "kernels.so": library}
    manifest = {
        "format": FORMAT, "version": VERSION, "created": datetime.datetime.now().isoformat(timespec="seconds"),
        "context": context,
        "kernels": [{"key": k, "symbol": symbol_of(k), "signature": sig} for k, sig in sorted(kernels.items())],
        "files": {name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in files.items()},
    }
    text = json.dumps(manifest, sort_keys=True, indent=1).encode()
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr("manifest.json", text)
        z.writestr("manifest.hmac", signing.sign(text).encode())
        for name, data in files.items():
            z.writestr(name, data)
    path = os.path.join(folder, file_name())
    atomic_write_bytes(path, archive.getvalue())  # a temporary name no reader looks for, then a rename
    return path


def _fail(path: str, why: str):
    raise ArtifactError(f"static-kernel artifact {path}: {why}")


def _member(z: zipfile.ZipFile, path: str, name: str) -> bytes:
    info = z.getinfo(name)
    if info.file_size > MEMBERS[name] or info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
        _fail(path, f"member {name} is too large, compressed or encrypted")
    with z.open(info) as f:
        data = f.read(MEMBERS[name] + 1)
    if len(data) != info.file_size:
        _fail(path, f"member {name} is truncated")
    return data


def _no_duplicate_keys(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError(f"duplicate keys {sorted(k for k in keys if keys.count(k) > 1)}")
    return dict(pairs)


def read(path: str, context: dict) -> Artifact:
    """The artifact at ``path``, checked as described in the module docstring."""
    try:
        opened = open_regular(path, max_size=MAX_FILE)
    except FileNotFoundError as e:
        _fail(path, f"cannot be read ({e})")
    except OSError as e:  # refused (`FileRefused`): a symlink, a special file, too large
        _fail(path, str(e))
    try:
        with opened, zipfile.ZipFile(opened) as z:
            names = z.namelist()
            if sorted(names) != sorted(MEMBERS) or len(set(names)) != len(names):
                _fail(path, f"members are {sorted(names)}; expected exactly {sorted(MEMBERS)}")
            mac = _member(z, path, "manifest.hmac").decode("ascii", "replace")
            text = _member(z, path, "manifest.json")
            if not signing.verify(text, mac):
                _fail(path, "signature does not verify (not written by this user's rewrite, or changed since)")
            manifest = _manifest(path, text, context)
            files = {name: _member(z, path, name) for name in ("kernels.c", "kernels.so")}
    except zipfile.BadZipFile as e:
        _fail(path, f"is not a zip archive ({e})")
    for name, data in files.items():
        entry = manifest["files"][name]
        if len(data) != entry["bytes"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
            _fail(path, f"member {name} does not match its hash in the manifest")
    kernels = {k["key"]: (k["symbol"], k["signature"]) for k in manifest["kernels"]}
    return Artifact(path, kernels, files["kernels.so"], files["kernels.c"].decode("utf-8", "replace"))


def _manifest(path: str, text: bytes, context: dict) -> dict:
    try:
        m = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except ValueError as e:
        _fail(path, f"manifest.json is not valid JSON ({e})")
    if not isinstance(m, dict) or set(m) != {"format", "version", "created", "context", "kernels", "files"}:
        _fail(path, "manifest.json must have exactly format, version, created, context, kernels, files")
    if m["format"] != FORMAT or m["version"] != VERSION:
        raise Stale(f"static-kernel artifact {path}: format {m['format']!r} version {m['version']!r}; "
                    f"this rewrite reads {FORMAT!r} version {VERSION}")
    if m["context"] != context:
        raise Stale(f"static-kernel artifact {path}: built for {m['context']}, this process is {context}")
    files = m["files"]
    if not isinstance(files, dict) or set(files) != {"kernels.c", "kernels.so"}:
        _fail(path, "manifest field files must describe exactly kernels.c and kernels.so")
    for name, entry in files.items():
        if not (isinstance(entry, dict) and set(entry) == {"bytes", "sha256"} and type(entry["bytes"]) is int
                and isinstance(entry["sha256"], str) and _HEX64.match(entry["sha256"])):
            _fail(path, f"manifest field files.{name} must be {{bytes: int, sha256: hex}}")
    kernels = m["kernels"]
    if not isinstance(kernels, list) or len(kernels) > MAX_KERNELS:
        _fail(path, f"manifest field kernels must be a list of at most {MAX_KERNELS}")
    for i, k in enumerate(kernels):
        if not (isinstance(k, dict) and set(k) == {"key", "symbol", "signature"}):
            _fail(path, f"kernels[{i}] must have exactly key, symbol, signature")
        if not (isinstance(k["key"], str) and _HEX64.match(k["key"]) and isinstance(k["symbol"], str)
                and _SYMBOL.match(k["symbol"]) and k["symbol"] == symbol_of(k["key"])):
            _fail(path, f"kernels[{i}]: key must be 64 hex digits and symbol k_ + its first 24")
        try:
            check(k["signature"])
        except SignatureError as e:
            _fail(path, f"kernels[{i}]: {e}")
        if kernel_key(k["signature"], context) != k["key"]:
            _fail(path, f"kernels[{i}]: key is not the hash of its signature")
    return m
