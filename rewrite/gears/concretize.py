"""Concretization: a symbolic graph plus one value per size symbol -> a static graph.

Every meta is substituted; a scalar node whose value becomes a number (a SymInt input, or size
arithmetic such as ``mul(s0, 3)``) is replaced at its uses by that number, so views and factories
get literal sizes and the arithmetic becomes dead. The result is then re-folded and re-optimized
by the caller: fixed sizes open folds the symbolic graph could not do.
"""
from __future__ import annotations

import sympy

from ..ir import Graph, SymMeta, TensorMeta, map_nodes

__all__ = ["concretize", "subs_meta"]


def subs_meta(meta, values: dict):
    if isinstance(meta, (TensorMeta, SymMeta)):
        return meta.subs(values)
    if isinstance(meta, (tuple, list)):
        return type(meta)(subs_meta(m, values) for m in meta)
    return meta


def _as_python(meta: SymMeta):
    """The Python number a scalar meta has become, or None while it still holds symbols."""
    expr = sympy.sympify(meta.expr)
    if expr.free_symbols:
        return None
    if meta.pytype is bool or expr in (sympy.true, sympy.false):
        return bool(expr)
    if meta.pytype is float:
        return float(expr)
    if not expr.is_Integer:
        raise ValueError(f"size expression {meta.expr} became {expr}, which is not an integer")
    return int(expr)


def concretize(graph: Graph, values: dict) -> Graph:
    """A copy of ``graph`` with ``values`` ({symbol: int}) substituted for the size symbols."""
    values = {s: sympy.Integer(v) for s, v in values.items()}
    g = graph.copy()
    _substitute(g, values)
    g.name = f"{graph.name}_" + "_".join(f"{s}{int(v)}" for s, v in sorted(values.items(), key=lambda kv: str(kv[0])))
    return g


def _substitute(g: Graph, values: dict) -> None:
    literal: dict[int, object] = {}  # node id -> the Python number that replaces it
    swap = lambda n: literal.get(n.id, n)  # noqa: E731
    for n in g.nodes:
        n.meta = subs_meta(n.meta, values)
        if literal:
            n.args = map_nodes(n.args, swap)
            n.kwargs = map_nodes(n.kwargs, swap)
        for sub in _subgraphs(n.args):
            _substitute(sub, values)
        if n.kind in ("placeholder", "call") and isinstance(n.meta, SymMeta):
            number = _as_python(n.meta)
            if number is not None:
                literal[n.id] = number
    # Symbols that are now numbers are no longer graph symbols.
    g.symbols = {s: info for s, info in g.symbols.items() if s not in values}
    g.prune()


def _subgraphs(obj):
    if isinstance(obj, Graph):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            yield from _subgraphs(x)

