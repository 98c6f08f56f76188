"""The default kernel backend: a graph becomes one straight-line Python function.

Each op is a direct call of its generated Python binding or ATen kernel (`rewrite.ops.kernel_of`),
constants and kernels are pre-bound as globals of the generated function, and every intermediate
is dropped right after its last reader so memory is released as early as eager would.
"""
from __future__ import annotations

import linecache
import math
import operator
from typing import Callable

import torch

from ..fx_bridge import CompileError
from ..ir import Graph, Node, TensorMeta
from ..ops import CONSTANT_OPERAND_FORMS, kernel_of

__all__ = ["generate_source", "compile_graph_to_python", "Emitter", "safe_name"]

_INLINE_BINARY = {
    operator.add: "+", operator.sub: "-", operator.mul: "*", operator.floordiv: "//",
    operator.truediv: "/", operator.mod: "%", operator.pow: "**", operator.eq: "==",
    operator.ne: "!=", operator.lt: "<", operator.le: "<=", operator.gt: ">", operator.ge: ">=",
}


class Emitter:
    """Writes a graph's nodes as Python lines, binding kernels, constants and subgraphs as globals.

    The other code generators (the planned executor, the CPU and CUDA stream schedulers) build
    their functions with it too, so every generated function names and calls things one way.
    """

    def __init__(self, graph: Graph, subgraph_compiler: Callable[[Graph], Callable], order: list | None = None):
        self.graph = graph
        self.order = graph.nodes if order is None else order  # the graph's nodes, in the order to emit them
        self.globals: dict[str, object] = {"torch": torch}
        self.names: dict[int, str] = {}
        self.lines: list[str] = []
        self.compile_subgraph = subgraph_compiler
        self._bound: dict[int, str] = {}

    def bind(self, value, prefix: str) -> str:
        key = id(value)
        if key in self._bound:
            return self._bound[key]
        name = f"{prefix}_{len(self.globals)}" if prefix[-1].isdigit() else f"{prefix}{len(self.globals)}"
        self.globals[name] = value
        self._bound[key] = name
        return name

    def render(self, a) -> str:
        if isinstance(a, Node):
            return self.names[a.id]
        if isinstance(a, Graph):
            return self.bind(self.compile_subgraph(a), "sub")
        if isinstance(a, list):
            return "[" + ", ".join(self.render(x) for x in a) + "]"
        if isinstance(a, tuple):
            inner = ", ".join(self.render(x) for x in a)
            return f"({inner},)" if len(a) == 1 else f"({inner})"
        if isinstance(a, dict):
            return "{" + ", ".join(f"{k!r}: {self.render(v)}" for k, v in a.items()) + "}"
        if a is None or isinstance(a, (bool, str)):
            return repr(a)
        if isinstance(a, int):
            return repr(a)
        if isinstance(a, float) and math.isfinite(a):
            return repr(a)
        return self.bind(a, "c")

    def emit(self) -> str:
        g = self.graph
        params = []
        for i, p in enumerate(n for n in self.order if n.kind == "placeholder"):
            self.names[p.id] = f"a{i}"
            params.append(f"a{i}")
        last_use: dict[int, int] = {}
        body = [n for n in self.order if n.kind != "placeholder"]
        for idx, n in enumerate(body):
            for i in n.inputs:
                last_use[i.id] = idx
        for idx, n in enumerate(body):
            if n.kind == "constant":
                self.names[n.id] = self.render(n.value)
                continue
            if n.kind == "output":
                self.lines.append(f"return {self.render(n.args[0])}")
                break
            var = f"v{len(self.names)}"
            self.names[n.id] = var
            try:
                expr = self.call_expr(n)
            except Exception as e:
                raise CompileError(f"node %{n.name} ({n.op}) in graph {g.name}: cannot generate code: {e}") from e
            self.lines.append(f"{var} = {expr}")
            dead = [i for i in n.inputs if last_use.get(i.id) == idx and i.kind == "call"]
            if dead:
                self.lines.append("del " + ", ".join(self.names[i.id] for i in dead))
        src = f"def {safe_name(g.name)}({', '.join(params)}):\n" + "\n".join("    " + ln for ln in self.lines) + "\n"
        return src

    def call_expr(self, n: Node) -> str:
        t = n.target
        args = [self.render(a) for a in n.args]
        kwargs = [f"{k}={self.render(v)}" for k, v in n.kwargs.items()]
        if t is operator.getitem and not kwargs:
            return f"{args[0]}[{args[1]}]"
        if t in _INLINE_BINARY and len(args) == 2 and not kwargs:
            return f"({args[0]} {_INLINE_BINARY[t]} {args[1]})"
        if t is operator.neg and len(args) == 1:
            return f"(-{args[0]})"
        for k, form in CONSTANT_OPERAND_FORMS.get(t, {}).items():
            if k < len(n.args) and isinstance(n.args[k], Node) and n.args[k].kind == "constant":
                args[k] = self.bind(form(n.args[k].value), "c")
        fn = kernel_of(t, all_tensors=all(isinstance(a, Node) and isinstance(a.meta, TensorMeta) for a in n.args))
        # Kernel globals are named after the op, so generated code and `py` dumps read well.
        return f"{self.bind(fn, safe_name(n.op) + '_')}({', '.join(args + kwargs)})"


def safe_name(name: str) -> str:
    """``name`` as a Python identifier (a graph's function name, a kernel global's prefix)."""
    out = "".join(ch if ch.isalnum() else "_" for ch in name)
    return out if out and not out[0].isdigit() else f"g_{out}"


def generate_source(graph: Graph, subgraph_compiler: Callable[[Graph], Callable] | None = None,
                    order: list | None = None) -> tuple[str, dict]:
    """Python source of the graph's function and the globals it needs.

    ``order``: the graph's nodes in another topological order to emit them in (e.g. one that
    honours wait edges); the graph's own order by default.
    """
    em = Emitter(graph, subgraph_compiler or compile_graph_to_python, order)
    return em.emit(), em.globals


_Emitter = Emitter  # its earlier name, which tests patch

_counter = [0]


def compile_graph_to_python(graph: Graph, subgraph_compiler: Callable[[Graph], Callable] | None = None,
                            order: list | None = None) -> Callable:
    """Compile a graph into a Python function ``f(*inputs) -> outputs`` (``order``: see `generate_source`)."""
    src, glb = generate_source(graph, subgraph_compiler, order)
    _counter[0] += 1
    filename = f"<rewrite-generated-{_counter[0]}-{safe_name(graph.name)}>"
    code = compile(src, filename, "exec")
    # Make tracebacks through generated code show the source line.
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    exec(code, glb)
    fn = glb[safe_name(graph.name)]
    fn.__rewrite_source__ = src
    return fn
