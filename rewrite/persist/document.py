"""What every JSON file of rewrite's is checked for before its contents: an export's graph file and
manifest, a compile cache's graph file. Shared by the export loader and the cache, so both refuse
the same files with the same messages.

`parse_json` (from `checks`) parses bytes already read: a compile cache reads each file of an entry
once, compares its sha256 with the one the entry's signature lists, and only then decodes those same
bytes (no second read that could see other bytes)."""
from __future__ import annotations

import os

from ..ir import Graph
from . import checks
from .checks import describe, fail, parse_json
from .errors import ExportError
from .format import FORMAT_VERSION, READABLE_VERSIONS

__all__ = ["read_json", "parse_json", "check_header", "check_metas"]


def read_json(path: str, what: str) -> tuple[dict, bytes]:
    """A JSON object file, checked for size, depth and well-formed numbers (`checks.read_json`);
    ``what`` names its kind in messages ("graph file")."""
    return checks.read_json(path, f"{what} {path}", os.path.basename(path))


def check_header(data: dict, where: str, expected_format: str) -> int:
    """The format and version fields; returns the version."""
    fmt, version = data.get("format"), data.get("version")
    if fmt != expected_format:
        raise ExportError(f"{where} is not a {expected_format} file (format field is {describe(fmt)})")
    if isinstance(version, bool) or not isinstance(version, int):
        raise ExportError(f"{where}: version: expected an integer format version, got {describe(version)}")
    if version > FORMAT_VERSION:
        raise ExportError(f"{where} was written in format version {version}, but this rewrite reads versions up to "
                          f"{FORMAT_VERSION}; upgrade rewrite to load it")
    if version not in READABLE_VERSIONS:
        raise ExportError(f"{where}: version: {version} is not a format version this rewrite reads "
                          f"({list(READABLE_VERSIONS)})")
    return version


def check_metas(graph: Graph, where: str) -> None:
    """The recorded shapes must be what the ops compute (shape inference), so no meta in a file can
    make the executor or the folding of a geared load plan for sizes the ops do not produce."""
    _check_metas(graph, where)


def _check_metas(graph: Graph, where: str) -> None:
    # Every caller's one path to shape inference of a file's graph: the tests count its calls (a
    # signed cache entry must not reach it) by replacing this name.
    from ..shape import ShapeInferenceError, infer_graph  # imported when a file is checked, not with rewrite

    try:
        infer_graph(graph, check=True)
    except ShapeInferenceError as e:
        raise fail(where, f"the recorded shapes do not match the ops: {e}") from None
    except Exception as e:  # noqa: BLE001 - a meta kernel refusing the file's arguments
        raise fail(where, f"the shapes of the graph cannot be computed: {type(e).__name__}: {e}") from None
