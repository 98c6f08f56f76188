"""Symbolic shape inference: every value's shape as sympy expressions over the graph's size symbols.

Public API (other layers call these):

* ``infer_meta(target, args, kwargs, symbols=None) -> meta``: one op (hand rules, else torch's
  meta kernel under a ShapeEnv that knows the symbols).
* ``infer_graph(graph, check=False) -> None``: every node's meta, recomputed in order.
* ``fold_shape_computations(graph) -> int``: size arithmetic with a known value becomes constants
  (alternating with inference until nothing changes).
* ``substitute(graph, {symbol_or_name: int}) -> Graph``: a copy with symbols replaced by values
  in every meta (a gear's static graph is ``fold_shape_computations(substitute(g, gear))``).
* ``rename_symbols(graph, {symbol: symbol}) -> Graph``: a copy where sizes every call has equal are one symbol
  (for the padding proof of a gear axis that the trace kept as two symbols).

Unknown rank (a ``while_loop`` carry whose rank changes) is ``TensorMeta(dtype, shape=None)``; a
size only the run knows is a fresh symbol registered in ``graph.symbols``.
"""
from .context import ShapeContext, ShapeInferenceError
from .control_flow import infer_cond, infer_while_loop
from .fold import fold_shape_computations, known_value, rename_symbols, substitute
from .infer import ShapeMismatch, infer_graph, infer_meta, metas_agree

__all__ = [
    "infer_meta",
    "infer_graph",
    "fold_shape_computations",
    "substitute",
    "rename_symbols",
    "known_value",
    "metas_agree",
    "infer_while_loop",
    "infer_cond",
    "ShapeContext",
    "ShapeInferenceError",
    "ShapeMismatch",
]
