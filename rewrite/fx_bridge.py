"""Conversion between torch.fx graphs (what Dynamo / AOTAutograd hand us) and the rewrite IR."""
from __future__ import annotations

import re

import sympy
import torch
import torch.fx

from .ir import MIN_INT64, Graph, Node, SymbolInfo, SymMeta, TensorMeta, map_nodes

__all__ = ["from_fx", "to_fx", "meta_from_val", "dynamo_input_names", "argument_path", "CompileError"]


class CompileError(RuntimeError):
    """Compilation failed; the message names the node and the reason."""


def _expr(v):
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return v.node.expr
    if isinstance(v, bool):
        return sympy.true if v else sympy.false
    return sympy.sympify(v)


def meta_from_val(val):
    """FX ``meta['val']`` (FakeTensor, SymInt, tuple...) -> TensorMeta / SymMeta / tuple / None."""
    if isinstance(val, torch.Tensor):
        return TensorMeta(val.dtype, tuple(_expr(s) for s in val.shape), val.device)
    if isinstance(val, (torch.SymBool, bool)):
        return SymMeta(_expr(val), bool)
    if isinstance(val, (torch.SymInt, int)):
        return SymMeta(_expr(val), int)
    if isinstance(val, (torch.SymFloat, float)):
        return SymMeta(_expr(val), float)
    if isinstance(val, (tuple, list)):
        return tuple(meta_from_val(v) for v in val)
    return None


def dynamo_input_names(gm: torch.fx.GraphModule | None, count: int = 0) -> list[str]:
    """What the user calls each input of a Dynamo graph: Dynamo's source name (``L['x']``,
    ``L['self']._parameters['weight']``), or the placeholder's own name where Dynamo recorded none;
    at least ``count`` names, ``input {i}`` for inputs past the graph's placeholders (or without a graph)."""
    names = []
    for n in gm.graph.nodes if gm is not None else ():
        if n.op == "placeholder":
            name = getattr(getattr(n.meta.get("grapharg"), "source", None), "name", None)
            name = name() if callable(name) else name
            names.append(name or n.name)
    return names + [f"input {i}" for i in range(len(names), count)]


def argument_path(source: str) -> str:
    """A Dynamo source name as the caller spells the argument: ``L['x']`` -> ``x``, ``L['args'][0]`` ->
    ``args[0]``, ``L['kwargs']['mask']`` -> ``mask``, ``L['inputs']['ids']`` -> ``inputs['ids']``;
    any other name as it is."""
    m = re.fullmatch(r"L\['([A-Za-z_][A-Za-z0-9_]*)'\](.*)", source)
    if m is None:
        return source
    head, rest = m.groups()
    if head == "kwargs":
        k = re.fullmatch(r"\['([A-Za-z_][A-Za-z0-9_]*)'\](.*)", rest)
        if k is not None:
            return k.group(1) + k.group(2)
    return head + rest


def _shape_env(gm: torch.fx.GraphModule):
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        vals = val if isinstance(val, (tuple, list)) else [val]
        for v in vals:
            if isinstance(v, torch.Tensor) and getattr(v, "fake_mode", None) is not None:
                if v.fake_mode.shape_env is not None:
                    return v.fake_mode.shape_env
            if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                return v.node.shape_env
    return None


def from_fx(gm: torch.fx.GraphModule, name: str = "graph") -> Graph:
    """Convert an FX GraphModule (with ``meta['val']`` on its nodes) to a rewrite `Graph`."""
    g = Graph(name)
    env: dict[torch.fx.Node, Node] = {}
    remap = lambda n: env[n]  # noqa: E731
    for fx_node in gm.graph.nodes:
        meta = meta_from_val(fx_node.meta.get("val", fx_node.meta.get("example_value")))
        try:
            if fx_node.op == "placeholder":
                node = g.placeholder(fx_node.name, meta)
            elif fx_node.op == "get_attr":
                value = _fetch_attr(gm, fx_node.target)
                if isinstance(value, torch.fx.GraphModule):
                    value = from_fx(value, name=f"{name}.{fx_node.target}")
                node = g.constant(value, meta if meta is not None else None)
                node.name = fx_node.name
            elif fx_node.op == "call_function":
                args = torch.fx.node.map_arg(fx_node.args, remap)
                kwargs = torch.fx.node.map_arg(fx_node.kwargs, remap)
                # Subgraph arguments of higher-order ops are inlined as Graph objects.
                args = map_nodes(args, lambda n: n.value if n.kind == "constant" and isinstance(n.value, Graph) else n)
                args = _non_negative_dims(fx_node.target, args)
                node = g.call(fx_node.target, args, kwargs, meta)
                node.name = fx_node.name
                stack = fx_node.meta.get("nn_module_stack")
                if stack:
                    node.attrs["module_stack"] = [path for path, _ in stack.values()]
                    node.attrs["module_types"] = [_class_name(t) for _, t in stack.values()]
            elif fx_node.op == "output":
                outs = torch.fx.node.map_arg(fx_node.args[0], remap)
                g.set_output(tuple(outs) if isinstance(outs, list) else outs)
                continue
            else:
                raise CompileError(f"node {fx_node.name}: unsupported FX op kind {fx_node.op!r} "
                                   "(expected placeholder, get_attr, call_function or output)")
        except CompileError:
            raise
        except Exception as e:  # name the node that broke conversion
            raise CompileError(f"node {fx_node.name} ({fx_node.target}): cannot convert to the rewrite IR: {e}") from e
        # A graph that came from the IR (to_fx) gets its nodes' attributes and wait edges back.
        kept = fx_node.meta.get(_IR_ATTRS)
        if kept:
            node.attrs.update({k: v for k, v in kept.items() if k not in node.attrs})
        waits = fx_node.meta.get(_IR_WAITS)
        if waits:
            node.waits = tuple(env[w] for w in waits if w in env)
        env[fx_node] = node
    # Subgraph constants referenced only by HOP args are no longer needed as nodes.
    g.prune()
    _collect_symbols(g, _shape_env(gm))
    return g


def _non_negative_dims(target, args: tuple) -> tuple:
    """``permute(x, [1, 0, -1, -2])`` -> ``permute(x, [1, 0, 3, 2])``: one spelling per call, so rules
    (written with non-negative dims) and CSE see the same call."""
    if target is torch.ops.aten.permute.default and len(args) == 2 and isinstance(args[1], (list, tuple)):
        rank = getattr(getattr(args[0], "meta", None), "rank", None)
        if rank and all(isinstance(d, int) and -rank <= d < rank for d in args[1]):
            return (args[0], [d % rank for d in args[1]])
    return args


def _fetch_attr(gm, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _collect_symbols(g: Graph, shape_env) -> None:
    """Record, for each size symbol, an input it can be read from and its known range."""
    for idx, p in enumerate(g.placeholders):
        if isinstance(p.meta, TensorMeta):
            for d, s in enumerate(p.meta.shape):
                if isinstance(s, sympy.Symbol):
                    info = g.symbols.setdefault(s, SymbolInfo(None, None))
                    if info.input_index is None:
                        info.input_index, info.dim = idx, d
        elif isinstance(p.meta, SymMeta) and isinstance(p.meta.expr, sympy.Symbol):
            info = g.symbols.setdefault(p.meta.expr, SymbolInfo(None, None))
            info.scalar_input_index = idx
    for s in g.free_symbols():
        info = g.symbols.setdefault(s, SymbolInfo(None, None))
        if shape_env is not None and s in getattr(shape_env, "var_to_range", {}):
            r = shape_env.var_to_range[s]
            lower = _finite_int(r.lower)
            # Unbounded below: a plain int argument (not a size); SymInts are int64 underneath.
            info.lower = lower if lower is not None else MIN_INT64
            info.upper = _finite_int(r.upper)


def _finite_int(bound) -> int | None:
    """A range bound as an int, or None when it is infinite (sympy's oo or torch's int_oo)."""
    if getattr(bound, "is_finite", None) is False or getattr(bound, "is_infinite", None):
        return None
    try:
        return int(bound)
    except (TypeError, ValueError, AttributeError, OverflowError):
        return None


_IR_ATTRS, _IR_WAITS = "rewrite_attrs", "rewrite_waits"  # FX node meta keys to_fx fills and from_fx reads


def fake_value(meta, fake_mode):
    """An FX ``meta['val']`` for an IR meta: FakeTensors (contiguous) and SymInts of ``fake_mode``'s
    ShapeEnv; None where the meta has no such form."""
    shape_env = fake_mode.shape_env

    def size(e):
        e = sympy.sympify(e)
        if e.is_Integer:
            return int(e)
        if shape_env is None:
            raise CompileError(f"symbolic size {e} needs a ShapeEnv")
        hint = int(shape_env.guarding_hint_or_throw(e)) if shape_env.has_guarding_hint(e) else None
        return shape_env.create_symintnode(e, hint=hint)

    if isinstance(meta, TensorMeta) and meta.shape is not None:
        with fake_mode:
            return torch.empty([size(s) for s in meta.shape], dtype=meta.dtype, device=meta.device)
    if isinstance(meta, SymMeta) and meta.pytype is int:
        return size(meta.expr)
    if isinstance(meta, tuple):
        return tuple(fake_value(m, fake_mode) for m in meta)
    return None


def to_fx(g: Graph, fake_mode=None) -> torch.fx.GraphModule:
    """Convert a rewrite `Graph` back to a runnable FX GraphModule.

    Each FX node keeps its IR node's attributes and wait edges in its meta (`from_fx` restores
    them); with ``fake_mode`` (the FakeTensorMode the graph was traced under) every node also gets
    ``meta['val']``, as FX passes expect.
    """
    root = torch.nn.Module()
    fx_graph = torch.fx.Graph()
    env: dict[int, torch.fx.Node] = {}
    counter = [0]

    def attr(value, prefix):
        name = f"{prefix}{counter[0]}"
        counter[0] += 1
        if isinstance(value, torch.Tensor):
            root.register_buffer(name, value)
        else:
            setattr(root, name, value)
        return fx_graph.get_attr(name)

    def leaf(x):
        if isinstance(x, Node):
            return env[x.id]
        return attr(to_fx(x), "subgraph") if isinstance(x, Graph) else x

    def lower(obj):
        return torch.fx.node.map_aggregate(obj, leaf)

    for n in g.nodes:
        if n.kind == "placeholder":
            fx_node = fx_graph.placeholder(n.name)
        elif n.kind == "constant":
            v = n.value
            fx_node = attr(v, "_const") if isinstance(v, torch.Tensor) else leaf(v)
        elif n.kind == "call":
            fx_node = fx_graph.call_function(n.target, lower(n.args), lower(n.kwargs))
        else:
            fx_graph.output(lower(n.args[0]))
            continue
        if isinstance(fx_node, torch.fx.Node):
            extra = {k: v for k, v in n.attrs.items() if k != "value"}
            if extra:
                fx_node.meta[_IR_ATTRS] = extra
            if n.waits:
                fx_node.meta[_IR_WAITS] = [env[w.id] for w in n.waits if isinstance(env.get(w.id), torch.fx.Node)]
            if fake_mode is not None and n.meta is not None:
                val = fake_value(n.meta, fake_mode)
                if val is not None:
                    fx_node.meta["val"] = val
        env[n.id] = fx_node
    return torch.fx.GraphModule(root, fx_graph)


def _class_name(t) -> str:
    """A module class of Dynamo's ``nn_module_stack``: a class, or its repr ``"<class 'pkg.Name'>"``."""
    if isinstance(t, type):
        return t.__qualname__
    return str(t).rsplit(".", 1)[-1].strip("'<>")
