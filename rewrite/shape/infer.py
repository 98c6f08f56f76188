"""`infer_meta` (one op) and `infer_graph` (every node of a graph, in order).

Order of questions for one op: Python size arithmetic (``operator.mul`` on sizes) -> higher-order
ops (``while_loop``, ``cond``) -> inputs of unknown rank -> a hand rule (`rules.RULES`, or the
elementwise rule for pointwise ops) -> torch's meta kernel under a ShapeEnv (`meta_kernels.py`).
"""
from __future__ import annotations

import itertools
import logging
import operator
import re

import sympy
import torch
from torch.fx.node import map_aggregate

from ..ir import Graph, Node, SymMeta, TensorMeta, format_meta, iter_instances, map_nodes, meta_of_value
from ..ops import is_pointwise, target_name
from .context import ShapeContext, ShapeInferenceError, to_expr
from .meta_kernels import probe_dtype
from .rules import RULES, SCALAR_RULES, NoRule, bind, elementwise

log = logging.getLogger("rewrite")

__all__ = ["infer_meta", "infer_graph", "simplify_meta", "metas_agree", "ShapeMismatch"]


class ShapeMismatch(ShapeInferenceError):
    """`infer_graph(check=True)` inferred a meta different from the one recorded on the node."""


def simplify_meta(meta, ctx: ShapeContext):
    def leaf(m):
        if isinstance(m, TensorMeta) and m.shape is not None:
            return TensorMeta(m.dtype, tuple(ctx.simplify(s) for s in m.shape), m.device)
        if isinstance(m, SymMeta):
            return SymMeta(ctx.simplify(m.expr), m.pytype)
        return m
    return map_aggregate(meta, leaf)


def infer_meta(target, args, kwargs=None, symbols=None, *, use_rules: bool | None = None):
    """The meta of ``target(*args, **kwargs)``.

    ``args``/``kwargs`` are shaped like a Node's, with `TensorMeta`/`SymMeta` where the IR has
    Nodes and plain Python values elsewhere (subgraphs of control-flow ops are `Graph` objects).
    ``symbols``: a `ShapeContext` or a ``Graph.symbols`` dict (ranges used to simplify).
    Returns a TensorMeta, a SymMeta or a tuple of them (multi-output ops). ``use_rules=False``
    skips the hand rules and asks the meta kernel (tests compare the two); None: the context's
    ``use_rules``.
    Raises `ShapeInferenceError` naming the op when the shape cannot be inferred.
    """
    ctx = ShapeContext.of(symbols)
    kwargs = dict(kwargs or {})
    op = target_name(target)
    if use_rules is None:
        use_rules = ctx.use_rules
    if target is operator.getitem:
        container, index = args
        if isinstance(container, (tuple, list)):
            ctx.stats["getitem"] += 1
            return container[index]
        raise ShapeInferenceError(f"getitem: expects a multi-output value, got {container}")
    if isinstance(target, torch._ops.HigherOrderOperator):
        from .control_flow import infer_higher_order

        ctx.stats["control flow"] += 1
        return infer_higher_order(target, args, kwargs, ctx)
    if _has_unknown_rank((args, kwargs)):
        ctx.stats["unknown rank"] += 1
        return _unknown_rank_meta(target, args, kwargs, ctx)
    if use_rules:
        meta = _by_hand_rule(target, args, kwargs, ctx, op)
        if meta is not _NO_RULE:
            ctx.stats["rule"] += 1
            return meta
    ctx.stats["kernel"] += 1
    ctx.kernel_ops[op] += 1
    try:
        return ctx.kernels.run(target, args, kwargs)
    except ShapeInferenceError:
        raise
    except Exception as e:
        raise ShapeInferenceError(f"{op}: its meta kernel failed on inputs {_describe(args, kwargs)}: "
                                  f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e


_NO_RULE = object()


def _by_hand_rule(target, args, kwargs, ctx: ShapeContext, op: str):
    """The hand rule's answer, or ``_NO_RULE`` when there is none or it cannot decide.

    A rule tripping over arguments it does not expect (a size given as a tensor, an unusual
    overload) also defers to the meta kernel, which has the final word and the precise error.
    """
    try:
        if target in SCALAR_RULES:
            return SCALAR_RULES[target](ctx, args)
        rule = RULES.get(target)
        if rule is not None:
            return simplify_meta(rule(ctx, bind(target, args, kwargs), op), ctx)
        if is_pointwise(target):
            return simplify_meta(elementwise(ctx, target, args, kwargs), ctx)
    except NoRule:
        pass
    except (TypeError, AttributeError, IndexError, KeyError) as e:
        log.debug("shape: hand rule for %s did not apply (%s: %s); asking the meta kernel", op, type(e).__name__, e)
    return _NO_RULE


def _describe(args, kwargs) -> str:
    parts = [str(a) for a in args] + [f"{k}={v}" for k, v in kwargs.items()]
    return "(" + ", ".join(parts) + ")"


def _has_unknown_rank(obj) -> bool:
    return any(t.shape is None for t in iter_instances(obj, TensorMeta))


def _unknown_rank_meta(target, args, kwargs, ctx: ShapeContext):
    """An op reading a tensor of unknown rank: its dtype from probes, its rank only when certain.

    The op runs on meta tensors where the unknown-rank inputs have rank 1, 2, 3, 4 (all sizes 1,
    which broadcast with anything). If every probe that works gives the same output rank, the
    output has that rank (sizes: fresh symbols, or none at rank 0); otherwise the output rank is
    unknown too.
    """
    results = []
    for rank in (1, 2, 3, 4):
        try:
            results.append(probe_dtype(target, args, kwargs, unknown_rank=rank))
        except Exception:
            continue
    tensors = list(iter_instances((args, kwargs), TensorMeta))
    device = tensors[0].device if tensors else torch.device("cpu")
    if not results:
        first = tensors[0]
        return TensorMeta(first.dtype, None, device)

    minted = itertools.count()  # numbers the sizes minted here, for stable names

    def merge(outs):
        head = outs[0]
        if isinstance(head, torch.Tensor):
            ranks = {o.dim() for o in outs}
            if len(ranks) == 1:
                return TensorMeta(head.dtype, tuple(ctx.symbol_at_site(next(minted)) for _ in range(head.dim())), device)
            return TensorMeta(head.dtype, None, device)
        if isinstance(head, (tuple, list)):
            return tuple(merge([o[i] for o in outs]) for i in range(len(head)))
        if isinstance(head, bool):
            return SymMeta(sympy.Ne(ctx.symbol_at_site(next(minted)), 0), bool)  # a bool only the run knows
        if isinstance(head, int):
            return SymMeta(ctx.symbol_at_site(next(minted)), int)
        return meta_of_value(head)

    return merge(results)


# -- graphs ----------------------------------------------------------------------------------

def metas_agree(a, b, ctx: ShapeContext) -> bool:
    """Are two metas the same (dtype, device, rank, and sizes provably equal)?"""
    if isinstance(a, TensorMeta) and isinstance(b, TensorMeta):
        if a.dtype != b.dtype or a.device.type != b.device.type:
            return False
        if a.shape is None or b.shape is None:
            return a.shape is None and b.shape is None
        return len(a.shape) == len(b.shape) and all(ctx.equal(x, y) is True for x, y in zip(a.shape, b.shape))
    if isinstance(a, SymMeta) and isinstance(b, SymMeta):
        return a.pytype == b.pytype and (to_expr(a.expr) == to_expr(b.expr) or ctx.equal(a.expr, b.expr) is True)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(metas_agree(x, y, ctx) for x, y in zip(a, b))
    return a is None and b is None


def _arg_meta(node: Node):
    if node.meta is None and node.kind == "constant":
        return node.value
    if node.meta is None:
        raise ShapeInferenceError(f"{node} ({node.op}) has no meta; infer the nodes it reads first")
    return node.meta


def infer_graph(graph: Graph, symbols=None, *, check: bool = False, strict: bool = False,
                missing_only: bool = False) -> None:
    """(Re)compute every node's meta in order, placeholders' metas being the given input metas.

    ``symbols``: a `ShapeContext` to share (subgraphs of control flow share their parent's);
    by default one over ``graph.symbols``. ``check=True`` raises `ShapeMismatch` where the new
    meta differs from the one already on the node (tests compare with what Dynamo recorded).
    An op whose shape cannot be inferred keeps the meta it has (logged); with ``strict=True``, or
    when it has none, the error is raised, naming the node. ``missing_only=True`` infers only the
    nodes that have no meta (nodes a user's FX pass added without ``meta['val']``).
    """
    ctx = ShapeContext.of(symbols if symbols is not None else graph.symbols)
    for node in graph.nodes:
        if node.kind in ("placeholder", "output") or (missing_only and node.meta is not None):
            continue
        if node.kind == "constant":
            if isinstance(node.value, (torch.Tensor, int, float, bool)):
                node.meta = meta_of_value(node.value)
            continue
        args = map_nodes(node.args, _arg_meta)
        kwargs = map_nodes(node.kwargs, _arg_meta)
        minted = len(ctx.data_dependent)
        outer_site, ctx.site = ctx.site, _site(graph, node)
        try:
            meta = infer_meta(node.target, args, kwargs, ctx)
            if len(ctx.data_dependent) > minted and node.meta is not None:
                # A data-dependent size: the recorded symbol is the one readers and the runtime use.
                for s in ctx.data_dependent[minted:]:
                    ctx.symbols.pop(s, None)
                del ctx.data_dependent[minted:]
                continue
        except ShapeInferenceError as e:
            if strict or node.meta is None:
                raise ShapeInferenceError(f"node {node} in graph {graph.name}: {e}") from e
            log.debug("shape: node %s keeps its recorded meta %s: %s", node, node.meta, e)
            continue
        finally:
            ctx.site = outer_site
        if check and node.meta is not None and not metas_agree(meta, node.meta, ctx):
            raise ShapeMismatch(f"node {node} ({node.op}) in graph {graph.name}: inferred {format_meta(meta)}, "
                                f"recorded {format_meta(node.meta)}")
        node.meta = meta


def _site(graph: Graph, node: Node) -> str:
    return re.sub(r"\W+", "_", f"{graph.name}_{node.name}").strip("_")
