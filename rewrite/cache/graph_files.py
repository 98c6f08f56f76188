"""Optimized IR graphs as cache files, in the export format (no pickle, nothing evaluated).

One JSON file holds several graphs (the symbolic graph, one static graph per gear) encoded by the
export format's `encode_graph`; constants are written like an export's weights (`WeightWriter`,
safetensors beside the file, each with its sha256), except tensors the caller already holds
(frozen weights of this process, an export's weights): those are written as references
``{"weight": "@name"}`` and read back from the caller's tensors, so the cache never copies them.
The key says the referenced tensors are the same (checksums of frozen weights), so the values are.

Reading happens only from an entry whose signature verified (`store.Entry`): the graph file's
bytes must have the signed sha256, and every weight file it names must be listed in the signature
with the sha256 its record gives (the weight reader compares the bytes it reads with it). On top
of that the file format's checks still run (`rewrite.persist`: size and depth bounds, allow-listed
ops checked against their schemas, the shape grammar, at most ``MAX_GEARS`` gear graphs); the
recorded shapes are not inferred again, as they are this user's rewrite's own for this key. Passes'
bookkeeping attributes the export format drops (which constant is a weight or was folded from one:
the cost model and the memory planner read them) are kept in a side table and checked on the way in.
"""
from __future__ import annotations

import json
import os

import torch

from ..ir import Graph
from ..persist.checks import (MAX_NUMEL, at, expect_bool, expect_int, expect_list, expect_name, expect_object,
                              expect_shape, expect_str, fail)
from ..persist.document import check_header
from ..persist.errors import ExportError
from ..persist.format import FORMAT_VERSION, decode_graph, encode_arg, encode_graph, encode_inline_tensor
from ..persist.weights import INLINE_NUMEL, WeightReader, WeightWriter
from .store import Entry

__all__ = ["GRAPHS_FILE", "encode_graphs", "decode_graphs", "check_error", "LiveWeightWriter", "LiveWeightReader"]

GRAPHS_FILE = "graphs.json"
GRAPHS_FORMAT = "rewrite.cache.graphs"
LIVE = "@"

# Bookkeeping attributes of constants kept by the cache (the export format drops them), with their checks.
_BOOKKEEPING = {
    "weight_name": lambda v, where: expect_str(v, where, max_len=1024),
    "derived_from": lambda v, where: expect_str(v, where, max_len=1024),
    "from_weights": expect_bool,
    "stream_inner_parallel": expect_bool,
}


def _storage_key(t: torch.Tensor) -> tuple:
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


class LiveWeightWriter(WeightWriter):
    """Constants of several graphs: live tensors by reference, the rest into weight files (deduplicated)."""

    def __init__(self, live: dict, folder: str = ""):
        super().__init__({}, folder)
        tensors = {name: t for name, t in live.items() if isinstance(t, torch.Tensor)}
        self.live_by_storage = {_storage_key(t): name for name, t in tensors.items()}
        self.live_by_ptr = {(t.untyped_storage().data_ptr(), t.dtype): name for name, t in tensors.items()}
        self.live_tensors = tensors
        self.live_records: dict[str, dict] = {}
        self.prefix = ""

    def encode_constant(self, node) -> dict:
        value = node.value
        if not isinstance(value, torch.Tensor):
            return {"value": encode_arg(value, f"constant {node.name}")}
        name = self.live_by_storage.get(_storage_key(value))
        if name is not None:
            self.live_records[name] = {"dtype": str(value.dtype).replace("torch.", ""), "shape": list(value.shape)}
            return {"weight": LIVE + name}
        name = self.live_by_ptr.get((value.untyped_storage().data_ptr(), value.dtype))
        if name is not None:  # a view of a live tensor (a transposed weight): by reference too
            base = self.live_tensors[name]
            self.live_records[name] = {"dtype": str(base.dtype).replace("torch.", ""), "shape": list(base.shape)}
            return {"view": {"of": name, "shape": list(value.shape), "stride": list(value.stride()),
                             "offset": value.storage_offset()}}
        if value.numel() <= INLINE_NUMEL and not any(k in node.attrs for k in ("weight_name", "derived_from")):
            return {"tensor": encode_inline_tensor(value)}
        return {"weight": self._add(f"{self.prefix}{node.name}", value)}


class LiveWeightReader(WeightReader):
    """`WeightReader` plus references to tensors the caller holds.

    ``signed`` ({file: sha256} of a verified cache entry's files, relative to ``folder``): every weight
    file must be listed there with the sha256 its record gives, so the bytes the reader accepts are
    the ones this user's rewrite signed. None only for weights that never touched the disk."""

    def __init__(self, folder: str, records, live_records, live: dict, where: str, signed: dict | None = None):
        super().__init__(folder, records, where=at(where, "weights"))
        if signed is not None:
            for name, record in self.records.items():
                if signed.get(record["file"]) != record["sha256"]:
                    raise fail(at(at(where, "weights"), name), f"file {record['file'][:200]!r} is not listed with "
                               "this sha256 in the entry's signature")
        self.live = {}
        for name, record in expect_object(live_records, at(where, "live")).items():
            inner = at(at(where, "live"), name)
            expect_object(record, inner, required=("dtype", "shape"))
            t = live.get(name)
            if not isinstance(t, torch.Tensor) or str(t.dtype).replace("torch.", "") != record["dtype"] \
                    or list(t.shape) != record["shape"]:
                got = f"{t.dtype}{list(t.shape)}" if isinstance(t, torch.Tensor) else "nothing"
                raise fail(inner, f"refers to tensor {name!r} {record['dtype']}{record['shape']}; this process has {got}")
            self.live[name] = t

    def decode_constant(self, data, where: str):
        if isinstance(data, dict) and isinstance(data.get("weight"), str) and data["weight"].startswith(LIVE):
            name = data["weight"][len(LIVE):]
            if name not in self.live:
                raise fail(at(where, "weight"), f"refers to tensor {name[:80]!r}, which the live table does not list")
            return self.live[name]
        if isinstance(data, dict) and "view" in data:
            return self._view(data["view"], at(where, "view"))
        return super().decode_constant(data, where)

    def _view(self, data, where: str) -> torch.Tensor:
        expect_object(data, where, required=("of", "shape", "stride", "offset"))
        base = self.live.get(data["of"]) if isinstance(data["of"], str) else None
        if base is None:
            raise fail(at(where, "of"), "names no tensor of the live table")
        shape = expect_shape(data["shape"], at(where, "shape"))
        stride = [expect_int(s, at(at(where, "stride"), i), 0, MAX_NUMEL)
                  for i, s in enumerate(expect_list(data["stride"], at(where, "stride"), length=len(shape)))]
        offset = expect_int(data["offset"], at(where, "offset"), 0, MAX_NUMEL)
        extent = offset + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else offset
        if extent >= base.untyped_storage().nbytes() // base.element_size():
            raise fail(where, f"reaches element {extent} of {data['of']!r}, outside its storage")
        return base.as_strided(shape, stride, offset)


def _bookkeeping(g: Graph) -> dict:
    out = {}
    for n in g.nodes:
        kept = {k: v for k, v in n.attrs.items() if k in _BOOKKEEPING and v is not None}
        if kept:
            out[n.name] = kept
    return out


def encode_graphs(graphs: dict[str, Graph], live: dict | None = None, extra: dict | None = None) -> list[tuple[str, bytes]]:
    """The files of ``graphs`` (label -> graph): weight files first, then `GRAPHS_FILE` (commit order)."""
    writer = LiveWeightWriter(live or {})
    encoded, attrs = {}, {}
    for k, (label, g) in enumerate(graphs.items()):
        writer.prefix = f"g{k}_"
        encoded[label] = encode_graph(g, writer.encode_constant, keep_attr=lambda key: True)
        attrs[label] = _bookkeeping(g)
    data = {"format": GRAPHS_FORMAT, "version": FORMAT_VERSION, "graphs": encoded, "attrs": attrs,
            "weights": writer.records(), "live": writer.live_records, "extra": extra or {}}
    files = [(w.file, w.data) for w in writer.files.values()]
    files.append((GRAPHS_FILE, json.dumps(data, separators=(",", ":"), allow_nan=False).encode("utf-8")))
    return files


def decode_graphs(entry: Entry, prefix: str = "", live: dict | None = None, *, max_graphs: int,
                  static: bool = False) -> tuple[dict[str, Graph], dict]:
    """(label -> graph, the ``extra`` object) from the files `encode_graphs` wrote below ``prefix``
    ("" or "gears/") of a verified ``entry``.

    Anything that does not fit (bytes other than the signed ones included) is an `ExportError`
    naming the file and field. ``max_graphs``: more graphs are refused before any is decoded (an
    entry with thousands of gear graphs would cost seconds on every hit). ``static``: every graph
    must have fixed sizes (gear graphs).
    """
    where = prefix + GRAPHS_FILE
    data = entry.read_json(where)
    version = check_header(data, where, GRAPHS_FORMAT)
    expect_object(data, where, required=("format", "version", "graphs", "attrs", "weights", "live", "extra"))
    listed = expect_object(data["graphs"], at(where, "graphs"))
    if len(listed) > max_graphs:
        raise fail(at(where, "graphs"), f"holds {len(listed)} graphs; at most {max_graphs} are allowed")
    reader = LiveWeightReader(os.path.join(entry.folder, *prefix.split("/")), data["weights"], data["live"],
                              live or {}, where, signed=entry.digests_under(prefix))
    graphs = {}
    attrs = expect_object(data["attrs"], at(where, "attrs"))
    for label, record in listed.items():
        inner = at(at(where, "graphs"), label)
        expect_str(label, inner, max_len=256)
        g = decode_graph(record, reader.decode_constant, inner, version)
        if static and not g.is_static():
            raise fail(inner, "a gear graph must have fixed sizes")
        by_name = {n.name: n for n in g.nodes}
        for name, kept in expect_object(attrs.get(label, {}), at(at(where, "attrs"), label)).items():
            node_where = at(at(at(where, "attrs"), label), name)
            node = by_name.get(expect_name(name, node_where))
            if node is None:
                raise fail(node_where, "names no node of the graph")
            for key, value in expect_object(kept, node_where, optional=tuple(_BOOKKEEPING)).items():
                node.attrs[key] = _BOOKKEEPING[key](value, at(node_where, key))
        graphs[label] = g
    return graphs, expect_object(data["extra"], at(where, "extra"))


def check_error(e: Exception) -> bool:
    """Whether ``e`` is what reading a damaged cache file may raise (then the entry is a miss)."""
    return isinstance(e, (ExportError, OSError, LookupError, TypeError, ValueError, AttributeError, ArithmeticError,
                          RecursionError))
