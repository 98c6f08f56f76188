"""Random FX graphs with the metadata real passes read, and inputs to run them on.

An FX pass reads more than ops: ``node.meta["val"]`` (a FakeTensor, symbolic under dynamic shapes:
shapes, strides, storage sharing), ``node.meta["tensor_meta"]``, ``sym_size`` nodes. A graph drawn
for a pass must carry all of it, or a pass either crashes for the wrong reason or never fires. So
graphs are not built as FX by hand: a static graph drawn by `graphs()` is traced by
``make_fx(tracing_mode="fake")``, and a dynamic one is a random program (`programs()`)
traced with ``make_fx(tracing_mode="symbolic")``, both with a decomposition table (core ATen by
default, or Inductor's). That gives the ATen graph AOTAutograd would give (``reshape`` as ``view``
or ``_unsafe_view``, ``zeros_like`` as ``full_like``...), metadata on every node, and, for dynamic
graphs, a ShapeEnv whose guards say which other sizes are valid.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import torch
import torch.fx
from hypothesis import strategies as st
from torch.fx.passes.shape_prop import _extract_tensor_metadata

from ..ir import Graph, map_nodes
from .dynamic import DYNAMIC_OPS, MAX_SIZE, InputSpec, Program, SizeConstraints, programs, trace_program
from .strategies import FILL_OPS, GRAPH_DTYPES, OPS, graphs, tensors

__all__ = ["FxCase", "fx_cases", "lower_graph", "select_ops", "case_sizes", "case_inputs", "decomposition_table",
           "SIZES_PER_GRAPH"]

SIZES_PER_GRAPH = 3  # concrete sizes each dynamic graph is run at (the drawn ones and two others)


@dataclasses.dataclass
class FxCase:
    """One drawn graph: the GraphModule a pass gets, what its inputs look like, where it came from."""

    gm: torch.fx.GraphModule
    inputs: tuple[InputSpec, ...]
    trace_sizes: dict[str, int]  # symbol -> size it was traced at; empty for a static graph
    origin: Graph | Program  # the IR graph or the program it was lowered from

    @property
    def dynamic(self) -> bool:
        return bool(self.trace_sizes)

    def shapes(self, sizes: dict[str, int]) -> list[tuple[int, ...]]:
        return [spec.shape(sizes) for spec in self.inputs]

    def __repr__(self):
        return f"FxCase(\n{self.origin}\n)"

    def _repr_pretty_(self, printer, cycle):  # what hypothesis prints for a falsifying example
        printer.text(repr(self))


def add_tensor_meta(gm: torch.fx.GraphModule) -> None:
    """``tensor_meta`` for every tensor-valued node that has a ``val`` but none (constants, from make_fx)."""
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and "tensor_meta" not in node.meta:
            node.meta["tensor_meta"] = _extract_tensor_metadata(val)


def decomposition_table(name) -> dict | None:
    """The decompositions graphs are traced with: ``"core"`` (to the core ATen opset, the default of
    `check_fx_pass`), ``"inductor"`` (Inductor's own table: the graphs its post-grad passes see),
    None (ATen as recorded, composite ops decomposed), or a table of one's own."""
    if name is None or isinstance(name, dict):
        return name
    if name == "core":
        return _core_table()
    if name == "inductor":
        from torch._inductor.decomposition import select_decomp_table

        return select_decomp_table()
    raise ValueError(f"decompositions={name!r}: use 'core', 'inductor', None or a decomposition table (dict)")


@functools.lru_cache(maxsize=1)
def _core_table() -> dict:
    from torch._decomp import core_aten_decompositions

    return dict(core_aten_decompositions())


def lower_graph(graph: Graph, decompositions: dict | None = None) -> torch.fx.GraphModule:
    """A static IR graph as the FX graph AOTAutograd would hand a pass: ATen ops, metadata on every node."""
    from torch.fx.experimental.proxy_tensor import make_fx

    examples = [torch.zeros([int(s) for s in p.meta.shape], dtype=p.meta.dtype) for p in graph.placeholders]
    # Constants of the graph are real tensors: make_fx keeps them as get_attr of the module.
    gm = make_fx(_interpreter(graph), decompositions, tracing_mode="fake", _allow_non_fake_inputs=True)(*examples)
    add_tensor_meta(gm)
    return gm


def _interpreter(graph: Graph):
    """``graph`` as a plain function of its inputs (make_fx traces a function faster than a module)."""
    def run(*args):
        env = {}
        inputs = iter(args)
        for node in graph.nodes:
            if node.kind == "placeholder":
                env[node.id] = next(inputs)
            elif node.kind == "constant":
                env[node.id] = node.value
            elif node.kind == "call":
                lookup = lambda n: env[n.id]  # noqa: E731
                env[node.id] = node.target(*map_nodes(node.args, lookup), **map_nodes(node.kwargs, lookup))
            else:
                return map_nodes(node.args[0], lambda n: env[n.id])
    return run


def select_ops(names: Sequence[str] | None, dynamic: bool) -> tuple:
    """The op generators named by ``names`` (all when None): `OPS` and `FILL_OPS` for static graphs,
    `DYNAMIC_OPS` for dynamic ones."""
    table = {o.name: o for o in (DYNAMIC_OPS if dynamic else OPS + FILL_OPS)}
    if names is None:
        return tuple(table.values())
    if isinstance(names, str):
        names = [names]
    chosen = []
    for n in names:
        name = getattr(n, "name", n)
        if name not in table:
            kind = "dynamic (rewrite.testing.dynamic.DYNAMIC_OPS)" if dynamic else "static (rewrite.testing.OPS)"
            raise ValueError(f"unknown op {name!r} for {kind} graphs; known: {', '.join(sorted(table))}")
        chosen.append(table[name])
    if not chosen:
        raise ValueError("ops must name at least one op")
    return tuple(chosen)


@st.composite
def fx_cases(draw, dynamic: bool = False, dtypes: Sequence[torch.dtype] | None = None, ops=None,
             max_inputs: int = 3, max_ops: int = 8, decompositions="core") -> FxCase:
    """A random graph lowered to FX (see the module docstring); ``ops`` as for `select_ops`,
    ``decompositions`` as for `decomposition_table`."""
    dtypes = tuple(dtypes or GRAPH_DTYPES)
    chosen = select_ops(ops, dynamic)
    table = decomposition_table(decompositions)
    if dynamic:
        program = draw(programs(max_inputs=max_inputs, max_ops=max_ops, dtypes=dtypes, ops=chosen))
        return FxCase(trace_program(program, table), program.inputs, dict(program.trace_sizes), program)
    graph = draw(graphs(max_inputs=max_inputs, max_ops=max_ops, dtypes=dtypes, ops=chosen, all_sinks=True))
    specs = tuple(InputSpec(p.name, p.meta.dtype, tuple(int(s) for s in p.meta.shape)) for p in graph.placeholders)
    return FxCase(lower_graph(graph, table), specs, {}, graph)


@st.composite
def case_sizes(draw, case: FxCase, constraints: SizeConstraints, count: int = SIZES_PER_GRAPH) -> list[dict]:
    """Size assignments to run ``case`` at: the traced sizes, then others its guards allow.

    The guards are read from ``constraints`` when this is drawn, so a pass that specialized a size
    with a guard (sound: Inductor would recompile) is only run where its guard holds.
    """
    found = [dict(case.trace_sizes)]
    if not case.dynamic:
        return found
    dtypes = [spec.dtype for spec in case.inputs]
    symbols = list(case.trace_sizes)
    for _ in range(count * 8):
        if len(found) >= count:
            break
        sizes = {s: draw(st.integers(2, MAX_SIZE)) for s in symbols}
        if sizes not in found and constraints.allows(case.shapes(sizes), dtypes):
            found.append(sizes)
    return found


def case_inputs(case: FxCase, sizes: dict[str, int], specials: bool = True):
    """A strategy for inputs of ``case`` at ``sizes``, seasoned with NaN, +-inf, -0.0, extreme ints."""
    return st.tuples(*[tensors(shape, spec.dtype, specials)
                       for shape, spec in zip(case.shapes(sizes), case.inputs)]).map(list)
