"""The graph part of the export format: a rewrite `Graph` <-> plain JSON data.

The format is documented in docs/export_format.md; every change to what is written bumps
`FORMAT_VERSION`. Reading is strict: an op, a Python function, a dtype or a name inside a shape
expression that the format does not know is an error naming the node, never a silent guess, and
nothing read from a file is ever evaluated as Python (shape expressions are checked against the
graph's own symbol table before sympy parses them).

Constants are not encoded here: the caller passes ``encode_constant(node)`` /
``decode_constant(data, node_name)`` so the exporter decides what goes inline and what goes to a
weight file (see weights.py).
"""
from __future__ import annotations

import base64
import importlib
import math
import re
from typing import Callable

import sympy
import torch
import torch.utils._sympy.functions

from .. import ops
from ..ir import Graph, Node, SymbolInfo, SymMeta, TensorMeta
from .errors import ExportError

__all__ = [
    "FORMAT_VERSION",
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

# Version 1 wrote Python's operators as ``operator.<name>``.
_V1_OPERATOR_PREFIX = "operator."

# Custom-op namespaces that live in a rewrite module: importing it registers the ops.
_NAMESPACE_MODULES = {"rewrite_stream": "rewrite.scope"}

# Names a shape expression may use besides the graph's symbols: sympy's spelling of size math, and
# torch's own sympy functions (printed by name, e.g. ``ModularIndexing(s0, 1, 4)``).
_SHAPE_FUNCTIONS = {"Max", "Min", "floor", "ceiling", "Mod", "Abs", "True", "False", "Piecewise", "Eq", "Ne",
                    "And", "Or", "Not", "oo"}
_TORCH_SHAPE_FUNCTIONS = {}
for _name in ("FloorDiv", "CeilDiv", "CleanDiv", "ModularIndexing", "PythonMod", "IntTrueDiv", "FloatTrueDiv",
              "TruncToInt", "FloorToInt", "CeilToInt", "ToFloat", "PowByNatural", "Where"):
    _fn = getattr(torch.utils._sympy.functions, _name, None)
    if _fn is not None:
        _TORCH_SHAPE_FUNCTIONS[_name] = _fn
_SHAPE_FUNCTIONS |= set(_TORCH_SHAPE_FUNCTIONS)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SHAPE_CHARS = re.compile(r"^[A-Za-z0-9_+\-*/%(), .<>=!&|~]*$")


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


def resolve_op(name: str, node_name: str = "?"):
    """The callable an op name from a graph file stands for (inverse of `target_name`)."""
    if not isinstance(name, str):
        raise ExportError(f"node {node_name}: op {name!r} is not a string")
    if name.startswith(_V1_OPERATOR_PREFIX) and name[len(_V1_OPERATOR_PREFIX):] in ops.SIZE_FUNCTIONS:
        name = name[len(_V1_OPERATOR_PREFIX):]
    if name in ops.SIZE_FUNCTIONS:
        return ops.SIZE_FUNCTIONS[name]
    parts = name.split(".")
    if not ((parts[0] == "higher_order" and len(parts) == 2) or len(parts) == 3):
        raise ExportError(f"node {node_name}: op {name!r} is not of the form namespace.op.overload, "
                          "higher_order.op or one of the allowed Python functions")
    namespace = parts[0]
    if namespace in _NAMESPACE_MODULES:
        importlib.import_module(_NAMESPACE_MODULES[namespace])
    if namespace.startswith("_c10d") or namespace == "c10d":
        importlib.import_module("torch.distributed")  # registers the collective ops
    try:
        return ops.target_from_name(name)
    except ops.OpError:
        raise ExportError(f"node {node_name}: op {name!r} is not registered in this torch {torch.__version__} "
                          "(was the file written by a newer torch, or does it need an extension loaded?)") from None


# -- scalars, dtypes and nested arguments ---------------------------------------------------------------

def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _decode_dtype(name: str) -> torch.dtype:
    value = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(value, torch.dtype):
        raise ExportError(f"unknown dtype {name!r} in graph file")
    return value


_LAYOUTS = {"strided": torch.strided, "sparse_coo": torch.sparse_coo}
_MEMORY_FORMATS = {"contiguous_format": torch.contiguous_format, "channels_last": torch.channels_last,
                   "preserve_format": torch.preserve_format, "channels_last_3d": torch.channels_last_3d}


def encode_arg(a, where: str):
    """A nested op argument as JSON data; see docs/export_format.md "Arguments"."""
    if a is None or isinstance(a, (bool, str)):
        return a
    if isinstance(a, int):
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
        return {"dtype": _dtype_name(a)}
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


def decode_arg(d, nodes: dict[str, Node], where: str, subgraph_decoder=None):
    if d is None or isinstance(d, (bool, str, int, float)):
        return d
    if isinstance(d, list):
        return [decode_arg(x, nodes, where, subgraph_decoder) for x in d]
    if not isinstance(d, dict) or len(d) != 1:
        raise ExportError(f"{where}: malformed argument {d!r}")
    (key, value), = d.items()
    if key == "node":
        if value not in nodes:
            raise ExportError(f"{where}: reads node {value!r}, which is not defined before it")
        return nodes[value]
    if key == "tuple":
        return tuple(decode_arg(x, nodes, where, subgraph_decoder) for x in value)
    if key == "dict":
        return {k: decode_arg(v, nodes, where, subgraph_decoder) for k, v in value.items()}
    if key == "float":
        if value not in ("inf", "-inf", "nan"):
            raise ExportError(f"{where}: malformed float {value!r}")
        return float(value)
    if key == "dtype":
        return _decode_dtype(value)
    if key == "device":
        return torch.device(value)
    if key == "layout" and value in _LAYOUTS:
        return _LAYOUTS[value]
    if key == "memory_format" and value in _MEMORY_FORMATS:
        return _MEMORY_FORMATS[value]
    if key == "tensor":
        return decode_inline_tensor(value, where)
    if key == "graph" and subgraph_decoder is not None:
        return subgraph_decoder(value)
    raise ExportError(f"{where}: unknown argument kind {key!r}")


def encode_inline_tensor(t: torch.Tensor) -> dict:
    """A small tensor written into the graph file: dtype, shape and its raw little-endian bytes."""
    t = t.detach().to("cpu").contiguous()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return {"dtype": _dtype_name(t.dtype), "shape": list(t.shape), "data": base64.b64encode(raw).decode("ascii")}


def decode_inline_tensor(d: dict, where: str = "constant") -> torch.Tensor:
    try:
        dtype = _decode_dtype(d["dtype"])
        shape = [int(s) for s in d["shape"]]
        raw = base64.b64decode(d["data"], validate=True)
    except (KeyError, TypeError, ValueError) as e:
        raise ExportError(f"{where}: malformed inline tensor ({e})") from None
    numel = math.prod(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    if len(raw) != numel * itemsize:
        raise ExportError(f"{where}: inline tensor holds {len(raw)} bytes, expected {numel * itemsize} "
                          f"for {d['dtype']}{shape}")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape).clone()


# -- metas and shape expressions ------------------------------------------------------------------------

def _encode_expr(e):
    e = sympy.sympify(e)
    if e.is_Integer:
        return int(e)
    if e is sympy.true or e is sympy.false:
        return bool(e)
    if e.is_Float:
        return float(e)
    return str(e)


def _decode_expr(text, symbols: dict[str, sympy.Symbol], where: str):
    if isinstance(text, bool):
        return sympy.true if text else sympy.false
    if isinstance(text, int):
        return sympy.Integer(text)
    if isinstance(text, float):
        return sympy.Float(text)
    if not isinstance(text, str) or not _SHAPE_CHARS.match(text) or "__" in text:
        raise ExportError(f"{where}: malformed shape expression {text!r}")
    for ident in _IDENT.findall(text):
        if ident not in symbols and ident not in _SHAPE_FUNCTIONS:
            raise ExportError(f"{where}: shape expression {text!r} uses {ident!r}, which is neither a symbol of "
                              f"the graph ({sorted(symbols)}) nor an allowed function ({sorted(_SHAPE_FUNCTIONS)})")
    try:
        return sympy.sympify(text, locals={**_TORCH_SHAPE_FUNCTIONS, **symbols})
    except (sympy.SympifyError, SyntaxError, TypeError) as e:
        raise ExportError(f"{where}: cannot parse shape expression {text!r}: {e}") from None


def encode_meta(meta):
    if meta is None:
        return None
    if isinstance(meta, TensorMeta):
        return {"dtype": _dtype_name(meta.dtype), "shape": [_encode_expr(s) for s in meta.shape],
                "device": str(meta.device)}
    if isinstance(meta, SymMeta):
        return {"sym": _encode_expr(meta.expr), "type": meta.pytype.__name__}
    if isinstance(meta, (tuple, list)):
        return [encode_meta(m) for m in meta]
    raise ExportError(f"cannot export node meta {meta!r}")


_PYTYPES = {"int": int, "float": float, "bool": bool}


def decode_meta(d, symbols: dict[str, sympy.Symbol], where: str):
    if d is None:
        return None
    if isinstance(d, list):
        return tuple(decode_meta(m, symbols, where) for m in d)
    if "dtype" in d:
        return TensorMeta(_decode_dtype(d["dtype"]), tuple(_decode_expr(s, symbols, where) for s in d["shape"]),
                          torch.device(d.get("device", "cpu")))
    if "sym" in d and d.get("type") in _PYTYPES:
        return SymMeta(_decode_expr(d["sym"], symbols, where), _PYTYPES[d["type"]])
    raise ExportError(f"{where}: malformed meta {d!r}")


def make_symbol(name: str, lower: int = 0) -> sympy.Symbol:
    """Size symbols as torch creates them: integers, positive when their range says so."""
    return sympy.Symbol(name, integer=True, positive=True) if lower >= 1 else sympy.Symbol(name, integer=True)


# -- attributes -------------------------------------------------------------------------------------------

# attrs the IR keeps for its own bookkeeping, written elsewhere in the node record or not at all.
_INTERNAL_ATTRS = {"value", "name"}


def _encode_attrs(node: Node, keep: Callable[[str], bool]) -> dict:
    out = {}
    for key, value in node.attrs.items():
        if key in _INTERNAL_ATTRS or not keep(key):
            continue
        try:
            out[key] = encode_arg(value, f"node {node.name} attribute {key!r}")
        except ExportError:
            # An attribute only an in-process pass understands (an object, a callable) is not part
            # of the exported program; the op itself is fully described without it.
            continue
    return out


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
        record["meta"] = encode_meta(n.meta)
        if n.waits:
            record["waits"] = [w.name for w in n.waits]
        attrs = _encode_attrs(n, keep_attr)
        if attrs:
            record["attrs"] = attrs
        nodes.append(record)
    return {"name": g.name, "symbols": symbols, "nodes": nodes}


def _waited(name, nodes: dict, where: str) -> Node:
    if not isinstance(name, str) or name not in nodes:
        raise ExportError(f"{where}: waits for {name!r}, which is not a node defined before it")
    return nodes[name]


def _encode_with_graphs(a, where, encode_constant, keep_attr):
    """`encode_arg`, plus subgraphs (branches and bodies of higher-order ops)."""
    if isinstance(a, Graph):
        return {"graph": encode_graph(a, encode_constant, keep_attr)}
    if isinstance(a, list):
        return [_encode_with_graphs(x, where, encode_constant, keep_attr) for x in a]
    if isinstance(a, tuple):
        return {"tuple": [_encode_with_graphs(x, where, encode_constant, keep_attr) for x in a]}
    return encode_arg(a, where)


def decode_graph(d: dict, decode_constant: Callable[[dict, str], object]) -> Graph:
    """Rebuild a `Graph` from `encode_graph` data; every reference and op is checked."""
    try:
        g = Graph(d["name"])
        symbol_entries = d["symbols"]
        records = d["nodes"]
    except (KeyError, TypeError) as e:
        raise ExportError(f"graph record is missing {e}") from None
    symbols = {name: make_symbol(name, int(entry.get("lower") or 0)) for name, entry in symbol_entries.items()}
    nodes: dict[str, Node] = {}
    pending_attrs = []

    def subgraph(data):
        return decode_graph(data, decode_constant)

    for record in records:
        name, op = record.get("name"), record.get("op")
        where = f"node {name} ({op})"
        if not isinstance(name, str) or name in nodes:
            raise ExportError(f"{where}: missing or duplicate node name")
        meta = decode_meta(record.get("meta"), symbols, where) if op != "output" else None
        if op == "placeholder":
            node = g.placeholder(name, meta)
        elif op == "constant":
            value = record.get("value")
            if isinstance(value, dict) and "graph" in value:
                node = g.constant(subgraph(value["graph"]), meta)
            else:
                node = g.constant(decode_constant(value, name), meta)
            node.name = name
        elif op == "output":
            args = [decode_arg(a, nodes, where, subgraph) for a in record.get("args", [])]
            g.set_output(args[0])
            continue
        else:
            target = resolve_op(op, name)
            args = tuple(decode_arg(a, nodes, where, subgraph) for a in record.get("args", []))
            kwargs = {k: decode_arg(v, nodes, where, subgraph) for k, v in record.get("kwargs", {}).items()}
            node = g.call(target, args, kwargs, meta)
            node.name = name
        nodes[name] = node
        node.waits = tuple(_waited(w, nodes, where) for w in record.get("waits", ()))
        if record.get("attrs"):
            pending_attrs.append((node, record["attrs"], where))
    for node, attrs, where in pending_attrs:
        for key, value in attrs.items():
            decoded = decode_arg(value, nodes, f"{where} attribute {key!r}")
            if key == "wait_for":  # version 1 kept wait edges as an attribute
                node.waits += tuple(_waited(w.name, nodes, where) for w in decoded if isinstance(w, Node))
            else:
                node.attrs[key] = decoded
    placeholder_index = {p.name: i for i, p in enumerate(g.placeholders)}
    for name, entry in symbol_entries.items():
        info = SymbolInfo(None, None, int(entry.get("lower") or 0), entry.get("upper"))
        if "input" in entry:
            pname, dim = entry["input"]
            if pname not in placeholder_index:
                raise ExportError(f"symbol {name} is read from {pname!r}, which is not a graph input")
            info.input_index, info.dim = placeholder_index[pname], int(dim)
        if "scalar_input" in entry:
            if entry["scalar_input"] not in placeholder_index:
                raise ExportError(f"symbol {name} is read from {entry['scalar_input']!r}, which is not a graph input")
            info.scalar_input_index = placeholder_index[entry["scalar_input"]]
        g.symbols[symbols[name]] = info
    try:
        g.validate()
    except ValueError as e:
        raise ExportError(f"graph {g.name} in the file is malformed: {e}") from None
    return g
