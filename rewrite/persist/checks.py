"""Reading untrusted files (exports, cache entries): one validator per concept, each error naming the file and field.

An export folder may come from anyone (docs/export_format.md, "Security"), so every value read from
it goes through one of these before it is used:

* **fields**: `expect_object` / `expect_list` / `expect_str` / `expect_int` / `expect_bool` check a
  JSON value's type and bounds; `at` names a field one level down (``export.json: graph.nodes[3]``);
* **names**: `expect_name` (identifiers: nodes, symbols, graphs), `expect_file_name` (the export
  name and other plain file names);
* **tables**: `decode_dtype` and `decode_device` map a string through a fixed table, never
  ``getattr(torch, ...)``;
* **files**: `confined_path` keeps a relative path inside the export folder (no '..', no absolute
  path, no symlink out of it); `read_file` reads a regular file only after its size is known to fit;
  `read_json` parses with bounded size, depth and numbers.
"""
from __future__ import annotations

import json
import keyword
import math
import os
import re

import torch

from .. import ops
from .errors import ExportError
from .reading import read_regular

__all__ = [
    "FILE_NAME",
    "MAX_INT64", "MIN_INT64", "MAX_DEPTH", "MAX_ITEMS", "MAX_JSON_BYTES", "MAX_NODES", "MAX_NUMEL", "MAX_STRING",
    "at", "describe", "fail", "expect_object", "expect_list", "expect_str", "expect_int", "expect_bool",
    "expect_name", "expect_file_name", "expect_sha256", "expect_shape", "decode_dtype", "dtype_name", "decode_device",
    "confined_path", "read_file", "read_json", "parse_json",
]

MAX_INT64 = 2**63 - 1
MIN_INT64 = -(2**63)
MAX_DEPTH = 100  # nesting of JSON arrays/objects in one file
MAX_ITEMS = 1_000_000  # entries of one list or object (nodes of a graph, weights, gears...)
MAX_JSON_BYTES = 64 << 20  # a graph file or manifest
MAX_NODES = 100_000  # nodes of one graph file, subgraphs included (and weights it lists)
MAX_STRING = 64 << 10  # characters of a string argument
MAX_NUMEL = 2**48  # elements of one tensor (a weight, an inline tensor or a node's recorded shape)
MAX_NAME = 256  # characters of a name

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_PATH_PART = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")


def fail(where: str, problem: str) -> ExportError:
    """The error for field ``where``: raise it (``raise fail(where, "expected ...")``)."""
    return ExportError(f"{where}: {problem}")


def at(where: str, key) -> str:
    """The name of a field one level down: ``export.json`` + ``graph`` -> ``export.json: graph``, then ``graph[3]``."""
    if isinstance(key, int) or not _IDENTIFIER.fullmatch(str(key)):
        return f"{where}[{str(key)[:60]!r}]" if not isinstance(key, int) else f"{where}[{key}]"
    return f"{where}.{key}" if ": " in where else f"{where}: {key}"


def describe(value) -> str:
    """A JSON value's kind, for messages: 'a list', 'an int', 'null'..."""
    if value is None:
        return "null"
    kinds = ((bool, "a bool"), (int, "an int"), (float, "a float"), (str, "a string"), (list, "a list"),
             (dict, "an object"))
    kind = next((name for t, name in kinds if isinstance(value, t)), type(value).__name__)
    return f"{kind} ({_short(value)})" if isinstance(value, (bool, int, float, str)) else kind


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def expect_object(value, where: str, required=(), optional=()) -> dict:
    """A JSON object; with ``required``/``optional`` given, exactly those keys (all required ones)."""
    if not isinstance(value, dict):
        raise fail(where, f"expected an object, got {describe(value)}")
    if required or optional:
        allowed = set(required) | set(optional)
        unknown = sorted(k for k in value if k not in allowed)
        if unknown:
            raise fail(where, f"unknown field(s) {unknown}; allowed are {sorted(allowed)}")
        missing = [k for k in required if k not in value]
        if missing:
            raise fail(where, f"missing field(s) {missing}")
    return value


def expect_list(value, where: str, max_len: int = MAX_ITEMS, length: int | None = None) -> list:
    if not isinstance(value, list):
        raise fail(where, f"expected a list, got {describe(value)}")
    if length is not None and len(value) != length:
        raise fail(where, f"expected a list of {length}, got {len(value)} entries")
    if len(value) > max_len:
        raise fail(where, f"has {len(value)} entries; at most {max_len} are allowed")
    return value


def expect_str(value, where: str, max_len: int = MAX_NAME, pattern: re.Pattern | None = None,
               allowed: str = "") -> str:
    if not isinstance(value, str):
        raise fail(where, f"expected a string, got {describe(value)}")
    if len(value) > max_len:
        raise fail(where, f"is {len(value)} characters long; at most {max_len} are allowed")
    if pattern is not None and not pattern.fullmatch(value):
        raise fail(where, f"{_short(value)} is not allowed; expected {allowed or pattern.pattern}")
    return value


def expect_int(value, where: str, lo: int = MIN_INT64, hi: int = MAX_INT64) -> int:
    """An int (never a bool) in ``[lo, hi]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(where, f"expected an int, got {describe(value)}")
    if not lo <= value <= hi:
        raise fail(where, f"{value} is out of range; allowed are {lo}..{hi}")
    return value


def expect_bool(value, where: str) -> bool:
    if not isinstance(value, bool):
        raise fail(where, f"expected true or false, got {describe(value)}")
    return value


def expect_name(value, where: str, dotted: bool = False) -> str:
    """An identifier (node, symbol and placeholder names; graph names may be ``dotted``); never a keyword."""
    pattern, allowed = (_DOTTED, "identifiers joined by '.'") if dotted else (_IDENTIFIER, "an identifier")
    expect_str(value, where, pattern=pattern, allowed=f"{allowed} (letters, digits, '_')")
    if any(keyword.iskeyword(part) for part in value.split(".")):
        raise fail(where, f"{value!r} is a Python keyword, not allowed as a name")
    return value


def expect_file_name(value, where: str) -> str:
    """A plain file name: letters, digits, '_', '.', '-', not starting with '.' (no path, no '..')."""
    return expect_str(value, where, pattern=FILE_NAME,
                      allowed="a plain file name (letters, digits, '_', '.', '-'; not starting with '.')")


def expect_sha256(value, where: str) -> str:
    return expect_str(value, where, pattern=_SHA256, allowed="64 lowercase hex digits")


def expect_shape(value, where: str) -> list[int]:
    """A static shape: non-negative ints whose product fits `MAX_NUMEL`."""
    dims = expect_list(value, where, max_len=64)
    numel = 1
    for i, d in enumerate(dims):
        numel *= expect_int(d, at(where, i), 0, MAX_NUMEL)
    if numel > MAX_NUMEL:
        raise fail(where, f"{dims} has {numel} elements; at most {MAX_NUMEL} are allowed")
    return dims


# -- fixed tables ---------------------------------------------------------------------------------

_DTYPES = {ops.dtype_str(d): d for d in ops.ALL_DTYPES + ops.COMPLEX + ops.FLOAT8 + ops.WIDE_UNSIGNED}
_DEVICE = re.compile(r"cpu|cuda(:[0-9]{1,4})?")


def dtype_name(dtype: torch.dtype, where: str = "dtype") -> str:
    """How a dtype is written; a dtype the format has no name for is an error (written files are read back)."""
    name = ops.dtype_str(dtype)
    if _DTYPES.get(name) is not dtype:
        raise ExportError(f"{where}: dtype {dtype} cannot be exported; allowed are {sorted(_DTYPES)}")
    return name


def decode_dtype(name, where: str) -> torch.dtype:
    if not isinstance(name, str) or name not in _DTYPES:
        raise fail(where, f"unknown dtype {_short(name)}; allowed are {sorted(_DTYPES)}")
    return _DTYPES[name]


def decode_device(name, where: str) -> torch.device:
    """'cpu', 'cuda' or 'cuda:N'; CUDA only where this process has that device."""
    expect_str(name, where, pattern=_DEVICE, allowed="'cpu', 'cuda' or 'cuda:N'")
    device = torch.device(name)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            raise fail(where, f"device {name!r} is not available in this process ({count} CUDA device(s))")
    return device


# -- files ------------------------------------------------------------------------------------------

def confined_path(folder: str, rel, where: str) -> str:
    """``folder/rel`` for a relative path from a file, refused unless it stays inside ``folder``.

    ``rel`` is '/'-separated parts of letters, digits, '_', '.', '-' (none starting with '.', so no
    '..' and no hidden files, at most 4 deep); symlinks are resolved and refused when they lead out.
    """
    expect_str(rel, where, max_len=1024)
    parts = rel.split("/")
    if len(parts) > 4 or not all(_PATH_PART.fullmatch(p) for p in parts):
        raise fail(where, f"path {_short(rel)} is not allowed; expected a relative path inside the export "
                          "folder ('/'-separated names of letters, digits, '_', '.', '-'; no '..', no absolute path)")
    root = os.path.realpath(folder)
    path = os.path.realpath(os.path.join(root, *parts))
    if os.path.commonpath([root, path]) != root:
        raise fail(where, f"path {rel!r} leads out of the export folder (through a symlink) to {path}")
    return path


def read_file(path: str, what: str, size: int | None = None, max_size: int | None = None) -> bytes:
    """The bytes of a regular file, read only once its size is known to be ``size`` (or at most ``max_size``).

    ``what`` names the file in messages ("weight file x.safetensors for weight 'w'"). FIFOs, devices
    and folders are refused before any read (`rewrite.persist.reading`), so a crafted entry cannot
    block or stream without end.
    """
    try:
        return read_regular(path, size=size, max_size=max_size)
    except FileNotFoundError:
        raise ExportError(f"{what} is missing") from None
    except OSError as e:
        raise ExportError(f"{what} {e}") from None


def _refuse_constant(name):
    raise ValueError(f"{name} is not allowed (write non-finite floats as {{\"float\": ...}})")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 19:
        raise ValueError(f"integer {text[:24]}... has more than 19 digits")
    value = int(text)
    if not MIN_INT64 <= value <= MAX_INT64:
        raise ValueError(f"integer {value} does not fit in 64 bits")
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:24]} overflows a float")
    return value


def _unique_keys(pairs: list) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        duplicate = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"key {duplicate!r} appears twice in one object")
    return out


def _check_depth(data, where: str) -> None:
    """Refuse nesting deeper than MAX_DEPTH (iteratively: the check itself must not recurse)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise fail(where, f"is nested more than {MAX_DEPTH} levels deep")
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        stack.extend((c, depth + 1) for c in children if isinstance(c, (list, dict)))
        if isinstance(value, (list, dict)) and len(value) > MAX_ITEMS:
            raise fail(where, f"holds a list or object of {len(value)} entries; at most {MAX_ITEMS} are allowed")


def read_json(path: str, what: str, where: str) -> tuple[dict, bytes]:
    """A JSON object file, at most MAX_JSON_BYTES, checked by `parse_json`; returns it and its bytes.

    ``what`` names the file for I/O errors ("graph file /x/export.json"), ``where`` for its fields ("export.json").
    """
    raw = read_file(path, what, max_size=MAX_JSON_BYTES)
    return parse_json(raw, where), raw


def parse_json(raw: bytes, where: str) -> dict:
    """A JSON object from bytes already read: at most MAX_DEPTH deep, 64-bit ints, finite floats, unique keys.
    The caller bounds the size it read; ``where`` names the file in messages."""
    try:
        data = json.loads(raw.decode("utf-8"), parse_int=_bounded_int, parse_float=_finite_float,
                          parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise fail(where, f"is nested more than {MAX_DEPTH} levels deep") from None
    except (ValueError, UnicodeDecodeError) as e:  # json.JSONDecodeError is a ValueError
        raise fail(where, f"is not valid JSON (truncated or edited?): {e}") from None
    _check_depth(data, where)
    expect_object(data, where)
    return data
