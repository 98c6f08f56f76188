"""The rewrite IR: one small graph type that every layer speaks.

A `Graph` is a list of `Node`s in topological order. Each node has

* ``kind``: ``"placeholder"`` (a graph input), ``"constant"`` (a tensor or scalar known at compile
  time, kept in ``attrs["value"]``), ``"call"`` (an ATen overload, a Python operator on sizes such
  as ``operator.mul``, ``operator.getitem`` on a multi-output node, or a higher-order op such as
  ``torch.ops.higher_order.cond``) or ``"output"``;
* ``target``: the callable for ``"call"`` nodes;
* ``args``/``kwargs``: nested tuples/lists/dicts holding `Node` references, Python scalars,
  dtypes, devices, and `Graph` objects (the branches and bodies of control-flow ops);
* ``meta``: what the node produces, symbolically. A `TensorMeta` (dtype, device, shape as a
  tuple of sympy expressions), a `SymMeta` (a Python int/float/bool whose value is a sympy
  expression over the graph's size symbols), a tuple of those for multi-output ops, or None;
* ``waits``: control edges (``rewrite.scope.wait_tensor``): nodes that must have run before this
  one, though it reads none of their values. Pruning, copying, topological order and the e-graph
  honour them like data edges (`Node.deps` is both kinds; `rewrite.waits` orders a graph by both);
* ``stream``: the tag of the stream the node runs on (``rewrite.scope.stream_switch``), or None
  for the caller's stream. Like ``value``, it is a property over its attribute (``attrs["stream"]``,
  its name in the export format and in user passes' view of attrs), so whatever copies ``attrs``
  (cloning, the FX round trip, the file format) carries it; rewrite reads and writes it through
  the property only;
* ``attrs``: everything else a pass wants to keep with the node (its module path, its placeholder
  name, its constant value, the stream's priority).

The graph also owns its size symbols: for each sympy symbol, where it can be read off the inputs
(input index, dimension) and its known range.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Callable, Iterator

import sympy
import torch

from .ops import COLLECTIVE_NAMESPACES, target_name

__all__ = [
    "TensorMeta",
    "SymMeta",
    "Node",
    "Graph",
    "SymbolInfo",
    "MIN_INT64",
    "map_nodes",
    "iter_nodes",
    "iter_instances",
    "iter_metas",
    "op_name",
    "target_name",
    "is_side_effect",
    "same_meta",
    "reads_any",
]


@dataclasses.dataclass(frozen=True)
class TensorMeta:
    dtype: torch.dtype
    shape: tuple | None  # of sympy.Expr; None: unknown rank (a while_loop carry whose rank changes)
    device: torch.device = torch.device("cpu")

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    def is_static(self) -> bool:
        return self.shape is not None and all(isinstance(s, (int, sympy.Integer)) or getattr(s, "is_Integer", False) for s in self.shape)

    def numel(self):
        if self.shape is None:
            return None
        return sympy.Mul(*self.shape) if self.shape else sympy.Integer(1)

    def subs(self, mapping: dict) -> "TensorMeta":
        if self.shape is None:
            return self
        return TensorMeta(self.dtype, tuple(sympy.sympify(s).subs(mapping) for s in self.shape), self.device)

    def __str__(self):
        dt = short_dtype(self.dtype)
        dev = "" if self.device.type == "cpu" else f"@{self.device}"
        if self.shape is None:
            return f"{dt}[*]{dev}"
        return f"{dt}[{', '.join(str(s) for s in self.shape)}]{dev}"


@dataclasses.dataclass(frozen=True)
class SymMeta:
    """A scalar computed from sizes; ``expr`` is its value as a sympy expression."""

    expr: Any  # sympy.Expr (int/float/bool valued)
    pytype: type = int

    def subs(self, mapping: dict) -> "SymMeta":
        return SymMeta(sympy.sympify(self.expr).subs(mapping), self.pytype)

    def __str__(self):
        return f"{self.pytype.__name__}={self.expr}"


def same_meta(a, b) -> bool:
    """``str(a) == str(b)``: how passes compare metas (a size 8 and sympy's 8 agree). Static tensor
    metas, most of a graph's, are compared field by field exactly as they print: formatting sympy
    shapes was most of a constant-folding pass."""
    if isinstance(a, TensorMeta) and isinstance(b, TensorMeta) and _int_shape(a.shape) and _int_shape(b.shape):
        return (short_dtype(a.dtype) == short_dtype(b.dtype) and len(a.shape) == len(b.shape)
                and all(int(x) == int(y) for x, y in zip(a.shape, b.shape))
                and (a.device.type == "cpu" if b.device.type == "cpu" else str(a.device) == str(b.device)))
    return str(a) == str(b)


def _int_shape(shape) -> bool:
    return shape is not None and all(type(s) is int or isinstance(s, sympy.Integer) for s in shape)


# The smallest value a SymInt can take (int64): the lower bound of an int symbol unbounded below.
MIN_INT64 = -(2**63)


@dataclasses.dataclass
class SymbolInfo:
    """Where a size symbol comes from and what is known about it."""

    input_index: int | None  # graph input whose size holds the symbol (None: only a SymInt input)
    dim: int | None
    lower: int = 0
    upper: int | None = None  # None: unbounded
    scalar_input_index: int | None = None  # a SymInt placeholder carrying the value, if any


_ids = itertools.count()


class Node:
    __slots__ = ("kind", "target", "args", "kwargs", "meta", "attrs", "waits", "name", "graph", "id")

    def __init__(self, kind: str, target=None, args=(), kwargs=None, meta=None, attrs=None, name=None, waits=(),
                 stream: str | None = None):
        assert kind in ("placeholder", "constant", "call", "output"), kind
        self.kind = kind
        self.target = target
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.meta = meta
        self.attrs = dict(attrs or {})
        self.waits: tuple[Node, ...] = tuple(waits)
        if stream is not None:  # None: the tag ``attrs`` carries, if any
            self.stream = stream
        self.id = next(_ids)
        self.name = name or f"n{self.id}"
        self.graph: Graph | None = None

    # -- helpers -----------------------------------------------------------------------------
    @property
    def inputs(self) -> list["Node"]:
        """The nodes this node reads, in argument order, without duplicates."""
        seen, out = set(), []
        _gather_nodes(self.args, seen, out)
        if self.kwargs:
            _gather_nodes(self.kwargs.values(), seen, out)
        return out

    @property
    def deps(self) -> list["Node"]:
        """What must run before this node: its inputs, then the nodes it waits for."""
        data = self.inputs
        if not self.waits:
            return data
        seen = {n.id for n in data}
        return data + [w for w in self.waits if w.id not in seen and not seen.add(w.id)]

    @property
    def value(self):
        return self.attrs.get("value")

    @property
    def stream(self) -> str | None:
        """The node's stream tag; None: the default stream (the caller's)."""
        return self.attrs.get("stream")

    @stream.setter
    def stream(self, tag: str | None) -> None:
        if tag is None:
            self.attrs.pop("stream", None)
        else:
            self.attrs["stream"] = tag

    @property
    def op(self) -> str:
        return op_name(self)

    def __repr__(self):
        return f"%{self.name}"


def iter_instances(obj, cls) -> Iterator:
    """Every instance of ``cls`` inside a nested list/tuple/dict structure, in order."""
    if isinstance(obj, cls):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from iter_instances(x, cls)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from iter_instances(x, cls)


def iter_nodes(obj) -> Iterator[Node]:
    """All `Node`s inside a nested args structure (does not descend into subgraphs)."""
    return iter_instances(obj, Node)


def _gather_nodes(values, seen: set, out: list) -> None:
    """Append the `Node`s inside ``values`` (nested lists/tuples/dicts) to ``out``, once each.

    A loop rather than the `iter_nodes` generator: passes ask every node for its inputs on every
    sweep, and a generator frame per nesting level was most of that time on large graphs."""
    for a in values:
        if isinstance(a, Node):
            if a.id not in seen:
                seen.add(a.id)
                out.append(a)
        elif isinstance(a, (list, tuple)):
            _gather_nodes(a, seen, out)
        elif isinstance(a, dict):
            _gather_nodes(a.values(), seen, out)


def reads_any(node: Node, test: Callable[[Node], bool]) -> bool:
    """Whether ``test`` holds for some `Node` among ``node``'s arguments (nested ones included),
    stopping at the first: a loop, like `Node.inputs`, for passes that ask it of every node."""
    return _any_node(node.args, test) or (bool(node.kwargs) and _any_node(node.kwargs.values(), test))


def _any_node(values, test) -> bool:
    for a in values:
        if isinstance(a, Node):
            if test(a):
                return True
        elif isinstance(a, (list, tuple)):
            if _any_node(a, test):
                return True
        elif isinstance(a, dict):
            if _any_node(a.values(), test):
                return True
    return False


_CONTAINERS = (tuple, list, dict)


def map_nodes(obj, fn: Callable[[Node], Any]):
    """Rebuild a nested args structure with every `Node` replaced by ``fn(node)``."""
    if isinstance(obj, Node):
        return fn(obj)
    # leaves are handled inline: most arguments are flat tuples of nodes and scalars
    if isinstance(obj, tuple):
        return tuple([fn(x) if isinstance(x, Node) else map_nodes(x, fn) if isinstance(x, _CONTAINERS) else x
                      for x in obj])
    if isinstance(obj, list):
        return [fn(x) if isinstance(x, Node) else map_nodes(x, fn) if isinstance(x, _CONTAINERS) else x for x in obj]
    if isinstance(obj, dict):
        return {k: map_nodes(v, fn) for k, v in obj.items()}
    return obj


def iter_metas(meta) -> Iterator:
    """The `TensorMeta`/`SymMeta` leaves of a node's meta (multi-output ops hold a tuple)."""
    if isinstance(meta, (tuple, list)):
        for m in meta:
            yield from iter_metas(m)
    elif meta is not None:
        yield meta


def op_name(node: Node) -> str:
    """A short stable name for what the node does: ``aten.mm.default``, ``getitem``, ``placeholder``."""
    return target_name(node.target) if node.kind == "call" else node.kind


def is_side_effect(node: Node) -> bool:
    """Nodes that must survive pruning even when nothing reads them."""
    if node.kind in ("output", "placeholder"):
        return True
    if node.kind != "call":
        return False
    return _target_has_side_effect(node.target) or node.attrs.get("side_effect", False)


# target id -> (target, whether its calls always have a side effect). Asked for every node of every
# sweep, and hashing an OpOverload runs Python code; holding the target keeps its id from being
# reused. Emptied when FX's list of side-effectful functions changes (it only grows).
_target_effects: dict[int, tuple[Any, bool]] = {}
_target_effects_version = [0]
_EFFECT_NAMESPACES = ("rewrite_stream",) + COLLECTIVE_NAMESPACES


def _target_has_side_effect(t) -> bool:
    effectful = torch.fx.node._side_effectful_functions
    if len(effectful) != _target_effects_version[0]:
        _target_effects.clear()
        _target_effects_version[0] = len(effectful)
    entry = _target_effects.get(id(t))
    if entry is None or entry[0] is not t:
        # Runtime assertions (_assert_async, _assert_scalar, ...) and profiler/autocast markers:
        # FX's own list of calls that must run even though nothing reads their result. Collectives
        # too (FX lists only wait_tensor and point-to-point ops): a call on one rank needs its peer
        # calls on the others, so every rank must issue the same ones in the same order whatever its
        # values are. As effects they are never pruned, folded, merged with an equal call (two equal
        # all_reduces on one rank, say of zero biases, are two calls on a rank whose biases differ),
        # computed once by an execution plan, or moved past one another.
        always = t in effectful or (isinstance(t, torch._ops.OpOverload)
                                    and (t._schema.is_mutable or t.namespace in _EFFECT_NAMESPACES))
        entry = _target_effects[id(t)] = (t, always)
    return entry[1]


class Graph:
    """A graph of `Node`s in topological order with one output node."""

    def __init__(self, name: str = "graph"):
        self.name = name
        self.nodes: list[Node] = []
        self.symbols: dict[sympy.Symbol, SymbolInfo] = {}

    # -- building ----------------------------------------------------------------------------
    def add(self, node: Node, before: Node | None = None) -> Node:
        node.graph = self
        if before is None:
            self.nodes.append(node)
        else:
            self.nodes.insert(self.nodes.index(before), node)
        return node

    def placeholder(self, name: str, meta=None) -> Node:
        return self.add(Node("placeholder", meta=meta, attrs={"name": name}, name=name))

    def constant(self, value, meta=None, before: Node | None = None) -> Node:
        if meta is None:
            meta = meta_of_value(value)
        return self.add(Node("constant", meta=meta, attrs={"value": value}), before=before)

    def call(self, target, args=(), kwargs=None, meta=None, attrs=None, before: Node | None = None,
             waits=(), stream: str | None = None) -> Node:
        return self.add(Node("call", target, args, kwargs, meta, attrs, waits=waits, stream=stream), before=before)

    def set_output(self, values) -> Node:
        for n in list(self.nodes):
            if n.kind == "output":
                self.nodes.remove(n)
        return self.add(Node("output", args=(values,), name="output"))

    # -- reading -----------------------------------------------------------------------------
    @property
    def placeholders(self) -> list[Node]:
        return [n for n in self.nodes if n.kind == "placeholder"]

    @property
    def output(self) -> Node:
        for n in reversed(self.nodes):
            if n.kind == "output":
                return n
        raise ValueError(f"graph {self.name} has no output node")

    @property
    def outputs(self):
        """The nested structure the graph returns (usually a tuple of nodes)."""
        return self.output.args[0]

    def users(self) -> dict[int, list[Node]]:
        """Map from node id to the nodes that read it."""
        out: dict[int, list[Node]] = {n.id: [] for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                out.setdefault(i.id, []).append(n)
        return out

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            if n.kind == "call":
                counts[n.op] = counts.get(n.op, 0) + 1
        return dict(sorted(counts.items()))

    def num_ops(self) -> int:
        return sum(1 for n in self.nodes if n.kind == "call")

    def free_symbols(self) -> set:
        syms = set()
        for n in self.nodes:
            for m in iter_metas(n.meta):
                if isinstance(m, TensorMeta):
                    for s in m.shape or ():
                        syms |= sympy.sympify(s).free_symbols
                elif isinstance(m, SymMeta):
                    syms |= sympy.sympify(m.expr).free_symbols
        return syms

    def is_static(self) -> bool:
        return not self.free_symbols()

    # -- editing -----------------------------------------------------------------------------
    def replace_all_uses(self, old: Node, new) -> None:
        """Make every reader of ``old`` read ``new`` (a Node or a Python value) instead.

        A node that waited for ``old`` waits for ``new`` when it is a node (a value has no time)."""
        self.replace_uses({old.id: new})

    def replace_uses(self, replacements: dict) -> None:
        """`replace_all_uses` for many nodes in one walk: ``replacements`` maps the id of a node to
        the node or value its readers read instead (201 frozen weights of BERT-base: one walk, not 201)."""
        swap = lambda n: replacements[n.id] if n.id in replacements else n  # noqa: E731
        for n in self.nodes:
            if n.id in replacements or not any(d.id in replacements for d in n.deps):
                continue  # only readers are rebuilt
            n.args = map_nodes(n.args, swap)
            n.kwargs = map_nodes(n.kwargs, swap)
            if any(w.id in replacements for w in n.waits):
                kept = tuple(w for w in n.waits if w.id not in replacements)
                n.waits = kept + tuple(r for w in n.waits if w.id in replacements
                                       and isinstance(r := replacements[w.id], Node))

    def waited_on(self) -> set[int]:
        """Ids of the nodes some node waits for (their timing is observable: keep them as they are)."""
        return {w.id for n in self.nodes for w in n.waits}

    def remove(self, node: Node) -> None:
        self.nodes.remove(node)

    def prune(self) -> int:
        """Drop nodes that neither reach the output nor have side effects. Returns how many."""
        live: set[int] = set()
        stack = [n for n in self.nodes if is_side_effect(n)]
        while stack:
            n = stack.pop()
            if n.id in live:
                continue
            live.add(n.id)
            stack.extend(n.deps)  # a waited-for node stays: the wait is an edge
        before = len(self.nodes)
        # Placeholders always stay: the calling convention depends on them.
        self.nodes = [n for n in self.nodes if n.id in live or n.kind == "placeholder"]
        return before - len(self.nodes)

    def topo_sort(self) -> None:
        """Re-establish topological order (stable: keeps the current order where it can)."""
        index = {n.id: i for i, n in enumerate(self.nodes)}
        done: set[int] = set()
        order: list[Node] = []

        for root in self.nodes:
            if root.id in done:
                continue
            stack = [(root, False)]
            while stack:
                n, expanded = stack.pop()
                if n.id in done:
                    continue
                if expanded:
                    done.add(n.id)
                    order.append(n)
                    continue
                stack.append((n, True))
                for i in sorted(n.deps, key=lambda x: -index.get(x.id, -1)):
                    if i.id not in done:
                        if i.id not in index:
                            raise ValueError(f"{n} reads {i}, which is not in graph {self.name}")
                        stack.append((i, False))
        placeholders = [n for n in order if n.kind == "placeholder"]
        rest = [n for n in order if n.kind not in ("placeholder", "output")]
        outs = [n for n in order if n.kind == "output"]
        self.nodes = placeholders + rest + outs

    def copy(self) -> "Graph":
        """A deep copy of the structure (tensor constants are shared, not cloned)."""
        g, _ = self.copy_with_map()
        return g

    def copy_with_map(self) -> tuple["Graph", dict[int, Node]]:
        g = Graph(self.name)
        g.symbols = {k: dataclasses.replace(v) for k, v in self.symbols.items()}
        mapping: dict[int, Node] = {}
        remap = lambda n: mapping[n.id]  # noqa: E731
        for n in self.nodes:
            args = _copy_args(n.args, mapping)
            kwargs = map_nodes(n.kwargs, remap) if n.kwargs else None
            m = Node(n.kind, n.target, args, kwargs, n.meta, n.attrs, name=n.name,
                     waits=[mapping[w.id] for w in n.waits])
            mapping[n.id] = m
            g.add(m)
        return g, mapping

    def validate(self) -> None:
        """Check structural invariants; raises ValueError naming the broken node."""
        seen: set[int] = set()
        outputs = 0
        for n in self.nodes:
            for i in n.deps:
                if i.id not in seen:
                    what = "reads" if i in n.inputs else "waits for"
                    raise ValueError(f"node {n} ({n.op}) {what} {i} before it is defined in graph {self.name}")
            if n.kind == "output":
                outputs += 1
            seen.add(n.id)
        if outputs != 1:
            raise ValueError(f"graph {self.name} must have exactly one output node, has {outputs}")

    # -- printing ----------------------------------------------------------------------------
    def __str__(self) -> str:
        return format_graph(self)


def _copy_args(obj, mapping: dict):
    """A node's args with nodes remapped and subgraphs (in tuples and lists) copied, in one walk."""
    if isinstance(obj, Node):
        return mapping[obj.id]
    if isinstance(obj, Graph):
        return obj.copy()
    if isinstance(obj, tuple):
        return tuple([mapping[x.id] if isinstance(x, Node) else _copy_args(x, mapping) for x in obj])
    if isinstance(obj, list):
        return [mapping[x.id] if isinstance(x, Node) else _copy_args(x, mapping) for x in obj]
    if isinstance(obj, dict):  # subgraphs inside dicts are shared, as they always were
        return {k: map_nodes(v, lambda n: mapping[n.id]) for k, v in obj.items()}
    return obj


def meta_of_value(value):
    """The meta of a concrete Python/tensor value."""
    if isinstance(value, torch.Tensor):
        return TensorMeta(value.dtype, tuple(sympy.Integer(s) for s in value.shape), value.device)
    if isinstance(value, bool):
        return SymMeta(sympy.true if value else sympy.false, bool)
    if isinstance(value, int):
        return SymMeta(sympy.Integer(value), int)
    if isinstance(value, float):
        return SymMeta(sympy.Float(value), float)
    if isinstance(value, (tuple, list)):
        return tuple(meta_of_value(v) for v in value)
    return None


# -- printing ------------------------------------------------------------------------------------

_SHORT_DTYPES = {
    torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
    torch.bool: "b8", torch.complex64: "c64", torch.complex128: "c128",
}


def short_dtype(dtype: torch.dtype) -> str:
    return _SHORT_DTYPES.get(dtype, str(dtype).replace("torch.", ""))

def format_arg(a) -> str:
    if isinstance(a, Node):
        return f"%{a.name}"
    if isinstance(a, Graph):
        return f"<graph {a.name}>"
    if isinstance(a, (list, tuple)):
        inner = ", ".join(format_arg(x) for x in a)
        return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' if len(a) == 1 else ''})"
    if isinstance(a, dict):
        return "{" + ", ".join(f"{k}: {format_arg(v)}" for k, v in a.items()) + "}"
    if isinstance(a, torch.dtype):
        return short_dtype(a)
    if isinstance(a, torch.Tensor):
        return f"tensor({str(a.dtype).replace('torch.', '')}{list(a.shape)})"
    return repr(a)


def format_meta(meta) -> str:
    if isinstance(meta, (tuple, list)):
        return "(" + ", ".join(format_meta(m) for m in meta) + ")"
    return "?" if meta is None else str(meta)


def format_value(v) -> str:
    if isinstance(v, torch.Tensor):
        if v.numel() <= 8:
            return f"tensor({v.tolist()}, {str(v.dtype).replace('torch.', '')})"
        return f"tensor(<{v.numel()} elements>)"
    return repr(v)


def format_graph(g: Graph, indent: str = "") -> str:
    lines = [f"{indent}graph {g.name}(" + ", ".join(f"%{p.name}: {format_meta(p.meta)}" for p in g.placeholders) + "):"]
    for n in g.nodes:
        extra = ""
        if n.stream not in (None, "0", 0):
            extra += f"  # stream={n.stream}"
        if n.waits:
            extra += f"  # waits for {', '.join('%' + w.name for w in n.waits)}"
        if n.kind == "placeholder":
            continue
        if n.kind == "output":
            lines.append(f"{indent}  return {format_arg(n.args[0])}")
            continue
        if n.kind == "constant":
            lines.append(f"{indent}  %{n.name}: {format_meta(n.meta)} = constant {format_value(n.value)}{extra}")
            continue
        args = [format_arg(a) for a in n.args] + [f"{k}={format_arg(v)}" for k, v in n.kwargs.items()]
        lines.append(f"{indent}  %{n.name}: {format_meta(n.meta)} = {n.op}({', '.join(args)}){extra}")
        for a in n.args:
            for sub in (a if isinstance(a, (list, tuple)) else [a]):
                if isinstance(sub, Graph):
                    lines.append(format_graph(sub, indent + "    "))
    return "\n".join(lines)

