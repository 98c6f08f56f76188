"""From an optimized graph to the callable that runs it: the one assembly the backend and the loader share.

A compiled model (`rewrite.backend`) and a loaded export or ``cache_compile`` entry
(`rewrite.export.loader`) both end here, so they cannot disagree on how a graph runs: the unit's
execution policy (`rewrite.policy`) picks the program (`exec.program_for`), a graph with size
symbols becomes one static graph per gear (`gears.compile_dynamic`), each static graph is built
by `exec.build_executable`, and the program then builds what its gears share (static kernels)
in one go. A graph's dynamic dims are recorded by `gears.traffic` while a recording is open (its
dispatcher, or a wrapper around a graph without gears).

The driver hands the stages below it what they need instead of their reaching up for it: gears get
the optimizer to re-optimize each gear's static graph with (`Stages.optimize_gear`, whose counts land
in the unit's report under that gear) and the dump to write each gear's graph with; the executor gets
a hook for the code it generated per stream. Every graph dump of a compile goes through `Stages.dump`
(the backend's "before" and "after" too).
"""
from __future__ import annotations

import dataclasses

from . import exec as rexec
from . import gears as rgears
from .distributed import guard_collectives
from .dump import dump_graph
from .ir import Graph
from .report import GraphReport
from .unit import CompileUnit

__all__ = ["build_callable", "Stages"]


@dataclasses.dataclass(frozen=True)
class Stages:
    """What the driver hands the stages of one unit: how a gear's graph is optimized, where dumps go, and
    whom to tell once every static graph of the unit is made (the program predicts their shared memory)."""

    unit: CompileUnit
    program: object = None  # exec.PlannedProgram, when the unit's policy plans graphs

    @classmethod
    def for_unit(cls, unit: CompileUnit) -> "Stages":
        """The one `Stages` of a compile of ``unit``, with the program its policy picks (`exec.program_for`)."""
        return cls(unit, rexec.program_for(unit))

    def gears_made(self, graphs: list) -> None:
        """Every static graph (gear) of the unit is made and none is built yet: the memory they will share is
        predicted now, from their metas (`exec.memory.PoolMemory`, in the unit's report)."""
        if self.program is not None:
            self.program.predict_memory(graphs)

    def dump(self, graph: Graph, stage: str, source: str | None = None) -> None:
        """Write ``graph`` at stage boundary ``stage`` when ``config.debug.graph_dump`` asks for it."""
        dump_graph(graph, self.unit, stage, source=source)

    def optimize_gear(self, graph: Graph, key: tuple) -> Graph:
        """Re-optimize gear ``key``'s static graph (fixed sizes fold further); its counts land in the unit's
        report under the gear (``report.gear_applied[key]``), its time in the report's "gears" stage."""
        from .optimizer import optimize  # here: a load whose gears all come from the cache never imports it

        report = GraphReport(graph.name)
        out = optimize(graph, dataclasses.replace(self.unit, report=report))
        self.unit.report.gear_applied[key] = dict(report.applied)
        for note in report.notes:
            self.unit.report.note(f"gear {key}: {note}")
        return out


def build_callable(graph: Graph, stages: Stages, gear_spec=None, gear_graphs: dict | None = None):
    """The callable of optimized ``graph`` (static, or symbolic with ``gear_spec``'s gears) under the policy of
    ``stages.unit``; ``stages``: the compile's one `Stages` (`Stages.for_unit`), which its driver also dumps through.

    ``gear_graphs`` (gear key -> optimized static graph): the compile cache's hook, see `gears.compile_dynamic`.
    """
    unit, program = stages.unit, stages.program

    def build_static(g: Graph):
        # the py dump of a multi-stream graph shows the code the scheduler generated per stream, waits included
        return rexec.build_executable(g, unit, program=program,
                                      show_code=lambda source: stages.dump(g, "streams", source))

    if graph.is_static() or gear_spec is None:
        if graph.is_static():
            stages.gears_made([graph])
        with unit.report.stage("codegen"):
            fn = build_static(graph)
        # Sizes of its dynamic dims go to `rewrite.gears.recording` while one is open (fn itself if none).
        fn = rgears.traffic.recorded(fn, graph, unit)
    else:
        fn = rgears.compile_dynamic(graph, gear_spec, unit, build_static, stages, gear_graphs=gear_graphs)
    if program is not None:
        with unit.report.stage("plan"):
            program.finalize()
    # A graph with collectives names the rank that failed when a peer's collective is missing (rewrite.distributed).
    return guard_collectives(fn, graph)
