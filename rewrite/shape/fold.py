"""Folding shape computations, and substituting values for size symbols.

`fold_shape_computations` is GE's "constant folding cooperating with InferShape" (seed 003: Shape
-> Gather -> Reshape): in ATen graphs the Shape/Gather chain is ``sym_size.int`` and Python
arithmetic on sizes feeding ``view``'s size list. Inference gives each of those nodes a `SymMeta`;
wherever that expression is a plain number, its readers get the number instead
(``view(x, [%mul, 32])`` -> ``view(x, [128, 32])``) and the node goes. Inference runs again, since
readers may now be foldable too, until nothing changes.

Shapes can also travel as small integer tensors (``_shape_as_tensor``, then ``index_select`` =
GE's Gather, ``select``, ``item()``): those computations are evaluated once every tensor they read
is known, so the seed's chain folds in that form too.

`substitute` is how a dynamic graph becomes a static one (gears): a copy whose metas have symbols
replaced by values; `fold_shape_computations` on that copy then turns every size computation,
including the SymInt inputs Dynamo passes, into constants.
"""
from __future__ import annotations

import logging

import sympy
import torch
from torch.fx.node import map_aggregate

from ..ir import Graph, Node, SymMeta, TensorMeta, is_side_effect, iter_instances, map_nodes
from ..ops import is_nondeterministic, is_overload
from .context import ShapeContext, to_expr
from .infer import infer_graph

log = logging.getLogger("rewrite")

__all__ = ["fold_shape_computations", "substitute", "known_value"]

# Rounds of (infer shapes, fold sizes): each round folds what the previous one made known.
FOLD_ROUNDS = 10


def known_value(meta):
    """The Python value of a SymMeta whose expression is a number, else None."""
    if not isinstance(meta, SymMeta):
        return None
    e = to_expr(meta.expr)
    if e in (sympy.true, sympy.false):
        return bool(e)
    if not e.is_Number:
        return None
    if meta.pytype is int:
        if not e.is_Integer:
            return None
        return int(e)
    if meta.pytype is float:
        return float(e)
    return None


def fold_shape_computations(graph: Graph, symbols=None) -> int:
    """Replace every size computation whose value is known by that value; returns nodes folded.

    Folded are call nodes producing a size/scalar (``sym_size.int``, ``operator.mul`` on sizes,
    ``sym_numel``...) and SymInt placeholders whose value is known (after `substitute`): their
    readers get plain numbers. Folded call nodes are removed; placeholders stay (the calling
    convention needs them). Subgraphs of control-flow ops are folded too. Alternates with
    `infer_graph` until a round folds nothing.
    """
    ctx = ShapeContext.of(symbols if symbols is not None else graph.symbols)
    total = 0
    for _ in range(FOLD_ROUNDS):
        infer_graph(graph, ctx)
        folded = _fold_once(graph) + _fold_shape_tensors(graph)
        total += folded
        if not folded:
            break
    _drop_proven_assertions(graph)
    if total:
        log.debug("shape: folded %d size computation(s) in graph %s", total, graph.name)
    return total


def _fold_once(graph: Graph) -> int:
    users = graph.users()
    waited = graph.waited_on()
    folded = 0
    for node in list(graph.nodes):
        for sub in _subgraphs((node.args, node.kwargs)):
            folded += _fold_once(sub)
        if node.kind not in ("call", "placeholder") or node.id in waited:
            continue
        value = known_value(node.meta)
        if value is None or (node.kind == "call" and is_side_effect(node)):
            continue
        readers = users.get(node.id, [])
        if node.kind == "placeholder" and not readers:
            continue
        _give_readers_the_value(graph, node, value, readers)
        if node.kind == "call":
            graph.remove(node)
        folded += 1
    return folded


def _give_readers_the_value(graph: Graph, node: Node, value, readers) -> None:
    """Readers get the plain number in place of ``node``; a graph output gets a constant node."""
    for reader in readers:
        if reader.kind == "output":
            const = graph.constant(value, before=reader)
            reader.args = map_nodes(reader.args, lambda n: const if n is node else n)
        else:
            reader.args = map_nodes(reader.args, lambda n: value if n is node else n)
            reader.kwargs = map_nodes(reader.kwargs, lambda n: value if n is node else n)


SHAPE_TENSOR_LIMIT = 64  # elements: larger integer tensors are data, left to the e-graph's folding
_INPUT_LIMIT = 4096


def _is_shape_tensor(meta) -> bool:
    """A small static integer tensor: what shapes look like when they travel as tensors."""
    return (isinstance(meta, TensorMeta) and meta.is_static() and not meta.dtype.is_floating_point
            and not meta.dtype.is_complex and int(meta.numel()) <= SHAPE_TENSOR_LIMIT)


def _shape_tensor_value(node: Node):
    """The value of a shape-tensor computation whose inputs are all known, else None.

    ``_shape_as_tensor(x)`` of a static ``x`` is known from its meta (GE's Shape op); other ops
    (``index_select`` = Gather, ``select``, ``cat``, arithmetic, ``_local_scalar_dense`` = item)
    are evaluated when every tensor they read is a constant.
    """
    target = node.target
    if not is_overload(target) or is_nondeterministic(target) or is_side_effect(node):
        return None
    if target is torch.ops.aten._shape_as_tensor.default:
        x = node.args[0]
        if isinstance(x, Node) and isinstance(x.meta, TensorMeta) and x.meta.is_static():
            return torch.tensor([int(d) for d in x.meta.shape], dtype=torch.int64)
        return None
    if not (_is_shape_tensor(node.meta) or (isinstance(node.meta, SymMeta) and node.meta.pytype is int)):
        return None
    inputs = node.inputs
    if not inputs or any(i.kind != "constant" for i in inputs):
        return None
    for i in inputs:
        if isinstance(i.value, torch.Tensor) and i.value.numel() > _INPUT_LIMIT:
            return None
    read = lambda n: n.value  # noqa: E731
    return target(*map_nodes(node.args, read), **map_nodes(node.kwargs, read))


def _fold_shape_tensors(graph: Graph) -> int:
    """Shape computations carried by tensors become constants (seed 003's Shape -> Gather chain)."""
    folded = 0
    waited = graph.waited_on()
    for node in list(graph.nodes):
        if node.kind != "call" or node.id in waited:
            continue
        value = _shape_tensor_value(node)
        if value is None:
            continue
        if isinstance(value, torch.Tensor):
            const = graph.constant(value, before=node)
            graph.replace_all_uses(node, const)
        else:  # a Python number (item()): readers take it directly, as for folded sizes
            _give_readers_the_value(graph, node, value, [r for r in graph.nodes if node in r.inputs])
        graph.remove(node)
        folded += 1
    return folded


def _drop_proven_assertions(graph: Graph) -> None:
    """Runtime shape assertions Dynamo left (``_assert_scalar``) that folding made ``True`` are
    proven and go. (One made ``False`` already failed inference: the sizes substituted break a
    fact the model relies on, such as a sequence longer than its position table.)"""
    for node in list(graph.nodes):
        if node.kind == "call" and node.target is torch.ops.aten._assert_scalar.default and node.args[0] is True:
            graph.remove(node)


def _subgraphs(obj):
    return iter_instances(obj, Graph)


# -- substitution ----------------------------------------------------------------------------

def _all_symbols(graph: Graph) -> set:
    syms = set(graph.symbols) | graph.free_symbols()
    for node in graph.nodes:
        for sub in _subgraphs((node.args, node.kwargs)):
            syms |= _all_symbols(sub)
    return syms


def _normalize_mapping(graph: Graph, mapping) -> dict:
    if not isinstance(mapping, dict):
        raise TypeError(f"substitute: mapping must be a dict of symbol -> int, got {type(mapping).__name__}")
    by_name = {s.name: s for s in _all_symbols(graph)}
    out = {}
    for key, value in mapping.items():
        name = key.name if isinstance(key, sympy.Symbol) else key
        if not isinstance(name, str) or name not in by_name:
            raise KeyError(f"substitute: {key!r} is not a size symbol of graph {graph.name}; "
                           f"its symbols are {sorted(by_name)}")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"substitute: value for {name} must be a non-negative int, got {value!r}")
        sym = by_name[name]
        info = graph.symbols.get(sym)
        if info is not None and info.upper is not None and value > info.upper:
            raise ValueError(f"substitute: {name} = {value} is above its known upper bound {info.upper} "
                             f"in graph {graph.name}")
        out[sym] = sympy.Integer(value)
    return out


def substitute_meta(meta, mapping: dict):
    def leaf(m):
        if isinstance(m, TensorMeta) and m.shape is not None:
            return TensorMeta(m.dtype, tuple(to_expr(s).xreplace(mapping) for s in m.shape), m.device)
        if isinstance(m, SymMeta):
            e = to_expr(m.expr).xreplace(mapping)
            return SymMeta(sympy.simplify(e) if e.free_symbols == set() and not e.is_Number else e, m.pytype)
        return m
    return map_aggregate(meta, leaf)


def _substitute_in_place(graph: Graph, mapping: dict) -> None:
    for node in graph.nodes:
        node.meta = substitute_meta(node.meta, mapping)
        for sub in _subgraphs((node.args, node.kwargs)):
            _substitute_in_place(sub, mapping)
    for sym in mapping:
        graph.symbols.pop(sym, None)


def rename_symbols(graph: Graph, mapping: dict) -> Graph:
    """A copy of ``graph`` in which some size symbols are others (``{symbol: symbol}``), in every meta: what the
    graph is when the calls it serves always have those sizes equal (a model's input_ids and attention_mask
    batch, traced as two symbols). For proofs that hold only then; the copy is not for running."""
    g = graph.copy()
    _substitute_in_place(g, mapping)
    return g


def substitute(graph: Graph, mapping: dict) -> Graph:
    """A copy of ``graph`` with size symbols replaced by values in every meta (subgraphs too).

    ``mapping``: ``{symbol: value}``; a key may be the sympy Symbol of ``graph.symbols`` or its
    name (``"s0"``), since symbols made elsewhere may carry other assumptions. Values are
    non-negative ints, at most the symbol's known upper bound (a bound is a fact about the model,
    e.g. its position table). Values below Dynamo's lower bound of 2 are allowed: that bound is
    Dynamo's choice to specialize 0 and 1, and gears of 1 must work.
    Substituted symbols leave ``graph.symbols``. The copy's node args are untouched: call
    `fold_shape_computations` on it to turn size computations into constants.
    """
    subs = _normalize_mapping(graph, mapping)
    g = graph.copy()
    _substitute_in_place(g, subs)
    return g
