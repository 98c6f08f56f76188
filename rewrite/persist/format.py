"""The graph part of the export format: a rewrite `Graph` <-> plain JSON data.

The format is documented in docs/export_format.md; every change to what is written bumps
`FORMAT_VERSION`. Reading is strict, because a graph file may be hostile: every field is checked
against the format (checks.py) before it is used, ops come from an allow-list and each call is
checked against its op's schema (allowlist.py), shape expressions are parsed by the format's own
grammar (expr.py), and nothing read from a file is evaluated as Python. A field that does not fit
is an `ExportError` naming the file and the field.

Constants are not encoded here: the caller passes ``encode_constant(node)`` /
``decode_constant(data, where)`` so the exporter decides what goes inline and what goes to a
weight file (see weights.py).
"""
from __future__ import annotations

import base64
import logging
import math
from typing import Callable

import sympy
import torch

from .. import ops
from ..ir import Graph, Node, SymbolInfo, SymMeta, TensorMeta
from ..waits import StreamCycleError, order_with_waits, resolve_waits
from .allowlist import check_call, check_size_growth, resolve_op
from .checks import (MAX_INT64, MAX_NODES, MAX_NUMEL, MAX_STRING, MIN_INT64, at, decode_device, decode_dtype, describe, dtype_name,
                     expect_bool, expect_int, expect_list, expect_name, expect_object, expect_shape, expect_str, fail)
from .errors import ExportError
from .expr import FUNCTIONS, check_round_trip, parse_expr

log = logging.getLogger("rewrite")

__all__ = [
    "FORMAT_VERSION",
    "READABLE_VERSIONS",
    "encode_graph",
    "decode_graph",
    "encode_meta",
    "decode_meta",
    "encode_inline_tensor",
    "decode_inline_tensor",
    "resolve_op",
    "target_name",
]

# 2: ops are named as everywhere else in rewrite (`rewrite.ops.target_name`: ``mul``, not
#    ``operator.mul``); wait edges are the node field ``waits``, not an attribute.
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)

MAX_INLINE_BYTES = 16 << 20  # an inline tensor's data


def target_name(target, node_name: str = "?") -> str:
    """The name under which a node's callable is written (`rewrite.ops.target_name`)."""
    if isinstance(target, (torch._ops.OpOverload, torch._ops.HigherOrderOperator)):
        return ops.target_name(target)
    name = ops.target_name(target)
    if ops.SIZE_FUNCTIONS.get(name) is not target:
        raise ExportError(
            f"node {node_name} calls {getattr(target, '__qualname__', target)!r}, which the export format cannot "
            f"represent; allowed are ATen/custom op overloads, higher-order ops and {sorted(ops.SIZE_FUNCTIONS)}")
    return name


# -- scalars, dtypes and nested arguments ---------------------------------------------------------------

_LAYOUTS = {"strided": torch.strided, "sparse_coo": torch.sparse_coo}
_MEMORY_FORMATS = {"contiguous_format": torch.contiguous_format, "channels_last": torch.channels_last,
                   "preserve_format": torch.preserve_format, "channels_last_3d": torch.channels_last_3d}
_FLOATS = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}
_ARG_KINDS = ("node", "tuple", "dict", "float", "dtype", "device", "layout", "memory_format", "tensor", "graph")


def encode_arg(a, where: str):
    """A nested op argument as JSON data; see docs/export_format.md "Arguments"."""
    if a is None or isinstance(a, (bool, str)):
        return a
    if isinstance(a, int):
        if not MIN_INT64 <= a <= MAX_INT64:
            raise ExportError(f"{where}: integer {a} does not fit in 64 bits")
        return a
    if isinstance(a, float):
        return a if math.isfinite(a) else {"float": repr(a)}
    if isinstance(a, Node):
        return {"node": a.name}
    if isinstance(a, list):
        return [encode_arg(x, where) for x in a]
    if isinstance(a, tuple):
        return {"tuple": [encode_arg(x, where) for x in a]}
    if isinstance(a, dict):
        if not all(isinstance(k, str) for k in a):
            raise ExportError(f"{where}: dict argument with non-string keys {list(a)} cannot be exported")
        return {"dict": {k: encode_arg(v, where) for k, v in a.items()}}
    if isinstance(a, torch.dtype):
        return {"dtype": dtype_name(a, where)}
    if isinstance(a, torch.device):
        return {"device": str(a)}
    if isinstance(a, torch.layout):
        return {"layout": str(a).replace("torch.", "")}
    if isinstance(a, torch.memory_format):
        return {"memory_format": str(a).replace("torch.", "")}
    if isinstance(a, torch.Tensor):
        return {"tensor": encode_inline_tensor(a)}
    raise ExportError(f"{where}: argument {a!r} of type {type(a).__name__} cannot be exported; allowed are "
                      "None, bool, int, float, str, lists/tuples/dicts of those, nodes, dtypes, devices, "
                      "layouts, memory formats and small tensors")


def _from_table(table: dict, value, where: str, what: str):
    if not isinstance(value, str) or value not in table:
        raise fail(where, f"unknown {what} {describe(value)}; allowed are {sorted(table)}")
    return table[value]


def decode_arg(d, nodes: dict[str, Node], where: str, subgraph_decoder=None):
    """An argument from its JSON data (inverse of `encode_arg`); ``nodes`` are the nodes defined so far."""
    if isinstance(d, str):
        return expect_str(d, where, max_len=MAX_STRING)
    if d is None or isinstance(d, (bool, int, float)):
        return d
    if isinstance(d, list):
        return [decode_arg(x, nodes, at(where, i), subgraph_decoder) for i, x in enumerate(d)]
    if not isinstance(d, dict) or len(d) != 1:
        raise fail(where, f"malformed argument: expected a JSON scalar, a list or an object with one key of "
                          f"{list(_ARG_KINDS)}, got {describe(d)}")
    (key, value), = d.items()
    inner = at(where, key)
    if key == "node":
        if not isinstance(value, str) or value not in nodes:
            name = repr(value) if isinstance(value, str) else describe(value)
            raise fail(inner, f"reads node {name[:80]}, which is not defined before it")
        return nodes[value]
    if key == "tuple":
        return tuple(decode_arg(x, nodes, at(inner, i), subgraph_decoder)
                     for i, x in enumerate(expect_list(value, inner)))
    if key == "dict":
        return {k: decode_arg(v, nodes, at(inner, k), subgraph_decoder)
                for k, v in expect_object(value, inner).items()}
    if key == "float":
        return _from_table(_FLOATS, value, inner, "float")
    if key == "dtype":
        return decode_dtype(value, inner)
    if key == "device":
        return decode_device(value, inner)
    if key == "layout":
        return _from_table(_LAYOUTS, value, inner, "layout")
    if key == "memory_format":
        return _from_table(_MEMORY_FORMATS, value, inner, "memory format")
    if key == "tensor":
        return decode_inline_tensor(value, inner)
    if key == "graph" and subgraph_decoder is not None:
        return subgraph_decoder(value, inner)
    raise fail(where, f"unknown argument kind {key!r}; allowed are {list(_ARG_KINDS)}")


def encode_inline_tensor(t: torch.Tensor) -> dict:
    """A small tensor written into the graph file: dtype, shape and its raw little-endian bytes."""
    device = t.device
    t = t.detach().to("cpu").contiguous()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    record = {"dtype": dtype_name(t.dtype), "shape": list(t.shape), "data": base64.b64encode(raw).decode("ascii")}
    if device.type != "cpu":  # a CUDA graph's small constants stay on its device (no field: the CPU)
        record["device"] = str(device)
    return record


def decode_inline_tensor(d, where: str = "constant") -> torch.Tensor:
    """The tensor of `encode_inline_tensor` data; its byte count is checked before base64 is decoded."""
    expect_object(d, where, required=("dtype", "shape", "data"), optional=("device",))
    dtype = decode_dtype(d["dtype"], at(where, "dtype"))
    device = decode_device(d.get("device", "cpu"), at(where, "device"))
    shape = expect_shape(d["shape"], at(where, "shape"))
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes > MAX_INLINE_BYTES:
        raise fail(at(where, "shape"), f"an inline tensor of {nbytes} bytes; at most {MAX_INLINE_BYTES} are allowed")
    text = expect_str(d["data"], at(where, "data"), max_len=4 * (nbytes // 3 + 1))
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError as e:
        raise fail(at(where, "data"), f"is not base64: {e}") from None
    if len(raw) != nbytes:
        raise fail(at(where, "data"), f"holds {len(raw)} bytes, expected {nbytes} for {d['dtype']}{shape}")
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape).clone().to(device)


# -- metas and shape expressions ------------------------------------------------------------------------

def _encode_expr(e, where: str):
    e = sympy.sympify(e)
    if e.is_Integer:
        return int(e)
    if e is sympy.true or e is sympy.false:
        return bool(e)
    if e.is_Float:
        return float(e)
    return check_round_trip(e, where)


def _decode_expr(value, symbols: dict[str, sympy.Symbol], where: str):
    if isinstance(value, bool):
        return sympy.true if value else sympy.false
    if isinstance(value, int):
        return sympy.Integer(value)
    if isinstance(value, float):
        return sympy.Float(value)
    return parse_expr(value, symbols, where)


def _decode_size(value, symbols: dict[str, sympy.Symbol], where: str) -> sympy.Expr:
    """One dimension of a tensor meta: a non-negative int or a size expression."""
    if isinstance(value, str):
        return parse_expr(value, symbols, where)
    return sympy.Integer(expect_int(value, where, 0, MAX_NUMEL))


def encode_meta(meta, where: str = "meta"):
    if meta is None:
        return None
    if isinstance(meta, TensorMeta):
        return {"dtype": dtype_name(meta.dtype, where),
                "shape": [_encode_expr(s, at(where, f"shape[{i}]")) for i, s in enumerate(meta.shape)],
                "device": str(meta.device)}
    if isinstance(meta, SymMeta):
        try:
            return {"sym": _encode_expr(meta.expr, where), "type": meta.pytype.__name__}
        except ExportError:
            if meta.pytype is int:
                raise
            # A float/bool size value outside the grammar (``ToFloat(s0)/2``) is left unknown: nothing
            # reads it back, and the value itself is computed when the graph runs.
            log.debug("export: %s: %s meta %s written as unknown", where, meta.pytype.__name__, meta.expr)
            return None
    if isinstance(meta, (tuple, list)):
        return [encode_meta(m, at(where, i)) for i, m in enumerate(meta)]
    raise ExportError(f"{where}: cannot export node meta {meta!r}")


_PYTYPES = {"int": int, "float": float, "bool": bool}


def decode_meta(d, symbols: dict[str, sympy.Symbol], where: str):
    """What a node produces: null, a tensor meta, a size meta or a list of those."""
    if d is None:
        return None
    if isinstance(d, list):
        return tuple(decode_meta(m, symbols, at(where, i)) for i, m in enumerate(expect_list(d, where, 10_000)))
    expect_object(d, where)
    key = _tensor_meta_key(d, symbols)
    if key is not None:
        meta = _tensor_metas.get(key)
        if meta is None:
            meta = _decode_tensor_meta(d, symbols, where)
            if len(_tensor_metas) >= _TENSOR_METAS_MAX:
                _tensor_metas.clear()
            _tensor_metas[key] = meta
        return meta
    if "dtype" in d:
        return _decode_tensor_meta(d, symbols, where)
    expect_object(d, where, required=("sym", "type"))
    pytype = _from_table(_PYTYPES, d["type"], at(where, "type"), "size type")
    return SymMeta(_decode_expr(d["sym"], symbols, at(where, "sym")), pytype)


def _decode_tensor_meta(d: dict, symbols: dict[str, sympy.Symbol], where: str) -> TensorMeta:
    expect_object(d, where, required=("dtype", "shape"), optional=("device",))
    dims = expect_list(d["shape"], at(where, "shape"), max_len=64)
    shape = tuple(_decode_size(s, symbols, at(at(where, "shape"), i)) for i, s in enumerate(dims))
    if math.prod(int(s) for s in shape if s.is_Integer) > MAX_NUMEL:
        raise fail(at(where, "shape"), f"{dims} has more than {MAX_NUMEL} elements")
    return TensorMeta(decode_dtype(d["dtype"], at(where, "dtype")), shape,
                      decode_device(d.get("device", "cpu"), at(where, "device")))


def _tensor_meta_key(d: dict, symbols: dict):
    """A tensor meta record as a hashable key (with the graph's symbol table when a size names a
    symbol), or None for any other record.

    Tensor metas repeat across nodes and gear graphs; one decoded (checked) `TensorMeta` is shared
    by all records equal to it (metas are immutable). Every part must be exactly a str or an int
    (``True == 1`` hashes alike, and a bool size must still be refused), so equal keys mean equal
    records and the checks that accepted the first accept every later one.
    """
    if len(d) > 3 or type(d.get("dtype")) is not str or type(d.get("device", "cpu")) is not str:
        return None
    if len(d) == 3 and "device" not in d:
        return None
    shape = d.get("shape")
    if type(shape) is not list or len(shape) > 64 or not all(type(s) is int or type(s) is str for s in shape):
        return None
    named = any(type(s) is str for s in shape)
    return d["dtype"], tuple(shape), d.get("device", "cpu"), tuple(symbols.items()) if named else None


# Decoded tensor metas by `_tensor_meta_key` (bounded; sharing is safe: metas are frozen).
_TENSOR_METAS_MAX = 4096
_tensor_metas: dict = {}


def make_symbol(name: str, lower: int = 0) -> sympy.Symbol:
    """Size symbols as torch creates them: integers, positive when their range says so."""
    return sympy.Symbol(name, integer=True, positive=True) if lower >= 1 else sympy.Symbol(name, integer=True)


# -- attributes -------------------------------------------------------------------------------------------

def _stream_tag(value, where: str):
    if not isinstance(value, str) or not value:  # as rewrite.scope.stream_switch says it
        raise fail(where, f"stream_tag must be a non-empty str, got {value!r}")
    return expect_str(value, where)


def _stream_priority(value, where: str):
    if isinstance(value, bool) or not isinstance(value, int):  # as rewrite.scope.stream_switch says it
        raise fail(where, f"stream_priority must be an int, got {value!r}")
    return expect_int(value, where)


def _module_stack(value, where: str):
    return [expect_str(s, at(where, i), max_len=1024) for i, s in enumerate(expect_list(value, where, 1000))]


# The attributes a graph file may carry (docs/export_format.md "Attributes"), each with its check;
# the same rules as `rewrite.scope.stream_switch` for streams.
ATTRS = {
    "stream": _stream_tag,
    "stream_priority": _stream_priority,
    "module_stack": _module_stack,
    "module_types": _module_stack,
    "module_path": lambda v, where: expect_str(v, where, max_len=1024),
    "side_effect": expect_bool,
}


def _encode_attrs(node: Node, keep: Callable[[str], bool]) -> dict:
    out = {}
    for key, value in node.attrs.items():
        if key not in ATTRS or not keep(key):
            continue  # passes' bookkeeping: never part of what the node computes
        out[key] = encode_arg(value, f"node {node.name} attribute {key!r}")
    return out


def _decode_attrs(node: Node, attrs, where: str, version: int) -> tuple:
    """Set the known attributes on ``node``; returns the node names of a version-1 ``wait_for``."""
    waits = ()
    for key, value in expect_object(attrs, where).items():
        inner = at(where, key)
        if key in ATTRS:
            node.attrs[key] = ATTRS[key](value, inner)
        elif key == "wait_for" and version == 1:  # version 1 kept wait edges as an attribute
            waits = tuple(_node_ref(v, at(inner, i)) for i, v in enumerate(expect_list(value, inner)))
        elif version >= 2:
            raise fail(inner, f"unknown attribute; allowed are {sorted(ATTRS)}")
    return waits


def _node_ref(value, where: str) -> str:
    """A version-1 ``{"node": name}`` reference."""
    expect_object(value, where, required=("node",))
    return expect_name(value["node"], at(where, "node"))


# -- graphs ---------------------------------------------------------------------------------------------

def encode_graph(g: Graph, encode_constant: Callable[[Node], dict], keep_attr: Callable[[str], bool]) -> dict:
    """``g`` as JSON data. Symbols are recorded by the placeholder they are read from."""
    placeholders = g.placeholders
    symbols = {}
    for sym, info in sorted(g.symbols.items(), key=lambda kv: str(kv[0])):
        entry = {"lower": info.lower, "upper": info.upper}
        if info.input_index is not None:
            entry["input"] = [placeholders[info.input_index].name, info.dim]
        if info.scalar_input_index is not None:
            entry["scalar_input"] = placeholders[info.scalar_input_index].name
        symbols[str(sym)] = entry
    nodes = []
    for n in g.nodes:
        where = f"node {n.name} ({n.op})"
        record: dict = {"name": n.name}
        if n.kind == "placeholder":
            record["op"] = "placeholder"
        elif n.kind == "constant":
            record["op"] = "constant"
            if isinstance(n.value, Graph):
                record["value"] = {"graph": encode_graph(n.value, encode_constant, keep_attr)}
            else:
                record["value"] = encode_constant(n)
        elif n.kind == "output":
            record["op"] = "output"
            record["args"] = [_encode_with_graphs(a, where, encode_constant, keep_attr) for a in n.args]
            nodes.append(record)
            continue
        else:
            record["op"] = target_name(n.target, n.name)
            record["args"] = [_encode_with_graphs(a, where, encode_constant, keep_attr) for a in n.args]
            if n.kwargs:
                record["kwargs"] = {k: _encode_with_graphs(v, where, encode_constant, keep_attr)
                                    for k, v in n.kwargs.items()}
        record["meta"] = encode_meta(n.meta, where)
        if n.waits:
            record["waits"] = [w.name for w in n.waits]
        attrs = _encode_attrs(n, keep_attr)
        if attrs:
            record["attrs"] = attrs
        nodes.append(record)
    return {"name": g.name, "symbols": symbols, "nodes": nodes}


def _encode_with_graphs(a, where, encode_constant, keep_attr):
    """`encode_arg`, plus subgraphs (branches and bodies of higher-order ops)."""
    if isinstance(a, Graph):
        return {"graph": encode_graph(a, encode_constant, keep_attr)}
    if isinstance(a, list):
        return [_encode_with_graphs(x, where, encode_constant, keep_attr) for x in a]
    if isinstance(a, tuple):
        return {"tuple": [_encode_with_graphs(x, where, encode_constant, keep_attr) for x in a]}
    return encode_arg(a, where)


# Fields of a node record, by kind: (required, optional).
_NODE_FIELDS = {
    "placeholder": (("name", "op"), ("meta", "waits", "attrs")),
    "constant": (("name", "op", "value"), ("meta", "waits", "attrs")),
    "output": (("name", "op", "args"), ()),
    "call": (("name", "op"), ("args", "kwargs", "meta", "waits", "attrs")),
}


def _decode_symbols(entries, where: str) -> dict[str, tuple[sympy.Symbol, dict]]:
    out = {}
    for name, entry in expect_object(entries, where).items():
        inner = at(where, name)
        if expect_name(name, inner) in FUNCTIONS:
            raise fail(inner, f"a symbol may not be named like a function of the shape grammar {sorted(FUNCTIONS)}")
        expect_object(entry, inner, required=("lower", "upper"), optional=("input", "scalar_input"))
        lower = expect_int(entry["lower"], at(inner, "lower"))
        if entry["upper"] is not None:
            expect_int(entry["upper"], at(inner, "upper"), lower)
        out[name] = (make_symbol(name, lower), entry)
    return out


def _bind_symbols(g: Graph, table: dict, where: str) -> None:
    """Record where each symbol is read from (a placeholder's dimension, or a size placeholder)."""
    index = {p.name: i for i, p in enumerate(g.placeholders)}
    for name, (sym, entry) in table.items():
        inner = at(where, name)
        info = SymbolInfo(None, None, entry["lower"], entry["upper"])
        if "input" in entry:
            pname, dim = expect_list(entry["input"], at(inner, "input"), length=2)
            p = g.placeholders[index[pname]] if isinstance(pname, str) and pname in index else None
            if p is None or not isinstance(p.meta, TensorMeta):
                raise fail(at(inner, "input"), f"{describe(pname)} is not a tensor input of the graph")
            info.input_index, info.dim = index[pname], expect_int(dim, at(at(inner, "input"), 1), 0, len(p.meta.shape) - 1)
        if "scalar_input" in entry:
            pname = entry["scalar_input"]
            p = g.placeholders[index[pname]] if isinstance(pname, str) and pname in index else None
            if p is None or not isinstance(p.meta, SymMeta):
                raise fail(at(inner, "scalar_input"), f"{describe(pname)} is not a size input of the graph")
            info.scalar_input_index = index[pname]
        g.symbols[sym] = info


class WaitCycleError(ExportError, StreamCycleError):
    """A graph file's wait edges close a cycle: the load-time form of the compile-time error."""


def _check_waits(g: Graph, where: str) -> None:
    """A wait edge that closes a cycle is refused with the compile-time error; others put nodes in order."""
    try:
        order_with_waits(g, resolve_waits(g))
    except StreamCycleError as e:
        raise WaitCycleError(f"{where}: {e}") from None
    g.topo_sort()


def decode_graph(d, decode_constant: Callable[[object, str], object], where: str = "graph",
                 version: int = FORMAT_VERSION) -> Graph:
    """Rebuild a `Graph` from `encode_graph` data; every field, reference, op and call is checked."""
    return _GraphReader(decode_constant, version).graph(d, where)


class _GraphReader:
    """Decodes a graph record and the subgraphs nested in it, at most MAX_NODES nodes in all."""

    def __init__(self, decode_constant: Callable[[object, str], object], version: int):
        self.decode_constant = decode_constant
        self.version = version
        self.count = 0

    def graph(self, d, where: str) -> Graph:
        expect_object(d, where, required=("name", "symbols", "nodes"))
        g = Graph(expect_name(d["name"], at(where, "name"), dotted=True))
        table = _decode_symbols(d["symbols"], at(where, "symbols"))
        symbols = {name: sym for name, (sym, _) in table.items()}
        records = expect_list(d["nodes"], at(where, "nodes"))
        self.count += len(records)
        if self.count > MAX_NODES:
            raise fail(at(where, "nodes"), f"the graph file holds more than {MAX_NODES} nodes")
        nodes: dict[str, Node] = {}
        waits = []
        for i, record in enumerate(records):
            node_where = at(at(where, "nodes"), i)
            expect_object(record, node_where)
            name = expect_name(record.get("name"), at(node_where, "name"))
            node_where = f"{node_where} ({name})"
            if name in nodes:
                raise fail(node_where, f"a second node named {name!r}")
            if i == len(records) - 1 and record.get("op") == "output":
                g.set_output(self.outputs(record, nodes, node_where))
                break
            nodes[name] = node = self.node(g, record, name, nodes, symbols, node_where)
            waits.append((node, self.waits(node, record, nodes, node_where), at(node_where, "waits")))
        else:
            raise fail(at(where, "nodes"), "the graph has no output node (it must be the last node)")
        self.resolve_waits(waits, nodes)
        _bind_symbols(g, table, at(where, "symbols"))
        check_size_growth(g, where)
        if any(n.waits for n in g.nodes):
            _check_waits(g, where)
        try:
            g.validate()
        except ValueError as e:
            raise fail(where, f"malformed graph: {e}") from None
        return g

    def node(self, g: Graph, record: dict, name: str, nodes: dict, symbols: dict, where: str) -> Node:
        op = expect_str(record.get("op"), at(where, "op"), max_len=200)
        kind = op if op in _NODE_FIELDS else "call"
        if kind == "output":
            raise fail(where, "the output node must be the last node")
        expect_object(record, where, *_NODE_FIELDS[kind])
        meta = decode_meta(record.get("meta"), symbols, at(where, "meta"))
        if kind == "placeholder":
            if not isinstance(meta, (TensorMeta, SymMeta)):
                raise fail(at(where, "meta"), "a graph input needs a tensor or size meta")
            return g.placeholder(name, meta)
        if kind == "constant":
            value = record["value"]
            if isinstance(value, dict) and "graph" in value:
                inner = at(where, "value")
                value = self.graph(expect_object(value, inner, ("graph",))["graph"], at(inner, "graph"))
            else:
                value = self.decode_constant(value, at(where, "value"))
            node = g.constant(value, meta)
        else:
            target = resolve_op(op, at(where, "op"))
            args = tuple(self.arg(a, nodes, at(at(where, "args"), j))
                         for j, a in enumerate(expect_list(record.get("args", []), at(where, "args"))))
            kwargs = {k: self.arg(v, nodes, at(at(where, "kwargs"), k))
                      for k, v in expect_object(record.get("kwargs", {}), at(where, "kwargs")).items()}
            check_call(target, args, kwargs, where)
            node = g.call(target, args, kwargs, meta)
        node.name = name
        return node

    def arg(self, data, nodes: dict, where: str):
        return decode_arg(data, nodes, where, self.graph)

    def outputs(self, record: dict, nodes: dict, where: str) -> tuple:
        expect_object(record, where, *_NODE_FIELDS["output"])
        inner = at(at(where, "args"), 0)
        outputs = decode_arg(expect_list(record["args"], at(where, "args"), length=1)[0], nodes, inner)
        if not isinstance(outputs, (tuple, list)) or not all(isinstance(o, Node) for o in outputs):
            raise fail(inner, "a graph returns a tuple of node references")
        return outputs

    def waits(self, node: Node, record: dict, nodes: dict, where: str) -> tuple:
        """Names of the nodes ``node`` waits for (resolved once the whole graph is read: they may come later)."""
        waits = tuple(expect_name(w, at(at(where, "waits"), j))
                      for j, w in enumerate(expect_list(record.get("waits", []), at(where, "waits"))))
        if "attrs" in record:
            waits += _decode_attrs(node, record["attrs"], at(where, "attrs"), self.version)
        return waits

    @staticmethod
    def resolve_waits(waits: list, nodes: dict) -> None:
        for node, names, where in waits:
            missing = [w for w in names if w not in nodes]
            if missing:
                raise fail(where, f"waits for {missing}, which are not nodes of this graph")
            node.waits = tuple(nodes[w] for w in names)
