"""From an optimized graph to the callable that runs it: the one assembly the backend and the loader share.

A compiled model (`rewrite.backend`) and a loaded export or ``cache_compile`` entry
(`rewrite.export.loader`) both end here, so they cannot disagree on how a graph runs: the unit's
execution policy (`rewrite.policy`) picks the program (`exec.program_for`), a graph with size
symbols becomes one static graph per gear (`gears.compile_dynamic`), each static graph is built
by `exec.build_executable`, and the program then builds what its gears share (static kernels)
in one go. A graph's dynamic dims are recorded by `gears.traffic` (its dispatcher, or a wrapper). The driver writes the graph dumps at these stage boundaries; the executors write none.
"""
from __future__ import annotations

import contextlib

from . import exec as rexec
from . import gears as rgears
from .distributed import guard_collectives
from .dump import dump_graph
from .ir import Graph
from .unit import CompileUnit

__all__ = ["build_callable"]


def build_callable(graph: Graph, unit: CompileUnit, gear_spec=None, gear_graphs: dict | None = None):
    """The callable of optimized ``graph`` (static, or symbolic with ``gear_spec``'s gears) under ``unit``'s policy.

    ``gear_graphs`` (gear key -> optimized static graph): the compile cache's hook, see `gears.compile_dynamic`.
    """
    program = rexec.program_for(unit)

    def build_static(g: Graph):
        fn = rexec.build_executable(g, unit, program=program)
        code = g.output.attrs.get(rexec.STREAM_CODE)
        if code is not None:  # the py dump shows the code the scheduler generated per stream, waits included
            dump_graph(g, unit, "streams", source=code)
        return fn

    if graph.is_static() or gear_spec is None:
        with _stage(unit, "codegen"):
            fn = build_static(graph)
        # Sizes of its dynamic dims go to `rewrite.gears.recording` while one is open (fn itself if none).
        fn = rgears.traffic.recorded(fn, graph, unit)
    else:
        fn = rgears.compile_dynamic(graph, gear_spec, unit, build_static, gear_graphs=gear_graphs)
    if program is not None:
        with _stage(unit, "plan"):
            program.finalize()
    # A graph with collectives names the rank that failed when a peer's collective is missing (rewrite.distributed).
    return guard_collectives(fn, graph)


def _stage(unit: CompileUnit, name: str):
    return unit.report.stage(name) if unit.report is not None else contextlib.nullcontext()
