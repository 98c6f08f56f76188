"""What the compiler did: op counts, passes and rules applied, time per stage.

A `CompileReport` collects one `GraphReport` per compiled graph (forward, backward, one per
Dynamo graph after a graph break). `rewrite.explain` returns one; the backend logs a summary.
`GearGraphs` says, per geared function, how many Dynamo graphs serve its gears and, for each graph
after the first, the guard that failed and the source line that raised it (`rewrite.gears.graphs`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import time

log = logging.getLogger("rewrite")

__all__ = ["CompileReport", "GraphReport", "GearGraphs", "Retrace"]


class _Notes:
    """The one door for what a stage wants the user to read: ``report.note(msg)``."""

    notes: list

    def note(self, msg: str, level: int = logging.INFO) -> None:
        """Log ``msg`` (at INFO unless ``level`` says otherwise) and keep it in the report."""
        log.log(level, "%s", msg)
        self.notes.append(msg)


@dataclasses.dataclass
class GraphReport(_Notes):
    name: str
    ops_before: dict = dataclasses.field(default_factory=dict)
    ops_after: dict = dataclasses.field(default_factory=dict)
    # pass or rule name -> how many times it fired (or nodes it removed)
    applied: dict = dataclasses.field(default_factory=dict)
    stage_seconds: dict = dataclasses.field(default_factory=dict)
    # gear (tuple of symbol values) -> op counts of that gear's static graph
    gears: dict = dataclasses.field(default_factory=dict)
    # gear -> what re-optimizing that gear's static graph fired (pass and rule counts, as ``applied``)
    gear_applied: dict = dataclasses.field(default_factory=dict)
    notes: list = dataclasses.field(default_factory=list)
    # (before, after) predicted seconds of the graph by the calibrated cost model (rewrite.cost)
    predicted_cost: tuple | None = None
    # What the last e-graph run's extraction kept (rewrite.egraph): a rule that fired in the e-graph
    # may be in no kept graph, so "fired" alone overstated what changed (issue 30).
    kept: str | None = None
    # The size the cost model priced the graph's symbolic sizes at (rewrite.cost.SYMBOL_SIZE), when it has any
    symbolic_size_stand_in: int | None = None
    # The memory the gears of this graph share (rewrite.exec.cuda_graphs.PoolMemory on CUDA), once known
    memory: object = None


    @contextlib.contextmanager
    def stage(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.stage_seconds[name] = self.stage_seconds.get(name, 0.0) + time.perf_counter() - t0

    def count(self, what: str, n: int = 1) -> None:
        if n:
            self.applied[what] = self.applied.get(what, 0) + n

    def __str__(self) -> str:
        before, after = sum(self.ops_before.values()), sum(self.ops_after.values())
        lines = [f"graph {self.name}: {before} ops -> {after} ops"]
        names = sorted(set(self.ops_before) | set(self.ops_after))
        if names:
            width = max(len(n) for n in names)
            lines.append(f"  {'op':<{width}}  before  after")
            for n in names:
                b, a = self.ops_before.get(n, 0), self.ops_after.get(n, 0)
                mark = "" if a == b else "  *"
                lines.append(f"  {n:<{width}}  {b:>6}  {a:>5}{mark}")
        if self.predicted_cost and self.predicted_cost[1] is not None:
            before, after = self.predicted_cost
            # A cost ratio, not a speed-up: spelt out so it is not read as the demo table's "x".
            ratio = f" ({after / before:.0%} of the cost before)" if before else ""
            stand_in = (f"; symbolic sizes priced as {self.symbolic_size_stand_in}, whatever sizes run"
                        if self.symbolic_size_stand_in else "")
            lines.append(f"  predicted cost: {before * 1e6:.1f} us -> {after * 1e6:.1f} us{ratio}{stand_in}")
        if self.applied:
            lines.append("  fired: " + ", ".join(f"{k} x{v}" for k, v in sorted(self.applied.items()))
                         + " (rule matches in the e-graph and pass counts)")
        if self.kept:
            lines.append(f"  kept: {self.kept}")
        if self.gears:
            lines.append("  gears:")
            for gear, counts in self.gears.items():
                fired = self.gear_applied.get(gear)
                lines.append(f"    {gear}: {sum(counts.values())} ops"
                             + (("; re-optimized: " + ", ".join(f"{k} x{v}" for k, v in sorted(fired.items())))
                                if fired else ""))
        if self.memory is not None:
            lines.append(f"  memory: {self.memory}")
        if self.stage_seconds:
            lines.append("  time: " + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in self.stage_seconds.items()))
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


@dataclasses.dataclass
class Retrace:
    """Why Dynamo traced another graph for a geared function: the guard of an earlier graph that a call failed.

    ``guard``, ``where`` and ``source`` are read from Dynamo's recompile reason (``text``), e.g. guard
    ``x.size()[0] != 1``, where ``model.py:12``, source ``if x.shape[0] == 1:``; each is None when the
    reason does not name it (a tensor-match failure names no source line; "reason unknown" names nothing).
    """

    graph: int  # which of the function's Dynamo graphs this one is (2, 3, ...)
    text: str  # Dynamo's reason as it wrote it (first line), or "reason unknown"
    guard: str | None = None
    where: str | None = None  # file name and line of the code that raised the guard
    source: str | None = None  # that line of code
    in_torch: bool = False  # torch recorded only its own line (``where`` is in torch): no line of the model's code

    def __str__(self) -> str:
        if self.guard is None:
            return f"graph {self.graph} was traced for a reason Dynamo did not record ({self.text})"
        origin = ""
        if self.in_torch:
            origin = f" (raised inside torch at {self.where}; torch recorded no line of the model's code)"
        elif self.where or self.source:
            origin = " (from " + " ".join(p for p in (self.where, f"`{self.source}`" if self.source else None) if p) + ")"
        return f"graph {self.graph} was traced because guard `{self.guard}` failed{origin}"


@dataclasses.dataclass
class GearGraphs:
    """The Dynamo graphs of one geared function (one Python code object Dynamo compiled)."""

    function: str  # the function's name (``forward``)
    where: str  # its file name and first line
    gears: list  # the declared gears: sizes for one geared dim, tuples (in input, dim order) for several
    graphs: int = 1  # Dynamo graphs compiled for it, the first geared one included
    retraces: list = dataclasses.field(default_factory=list)  # a `Retrace` per graph after the first

    def __str__(self) -> str:
        gears = "[" + ", ".join(str(g) for g in self.gears) + "]"
        if self.graphs == 1:
            return f"gears: {self.function}: 1 Dynamo graph serves gears {gears}"
        return "; ".join([f"gears: {self.function}: {self.graphs} Dynamo graphs serve gears {gears}"]
                         + [str(r) for r in self.retraces])


@dataclasses.dataclass
class CompileReport(_Notes):
    graphs: list = dataclasses.field(default_factory=list)
    graph_breaks: int = 0
    result: object = None  # what the compiled call returned, when `rewrite.explain` made the call
    # One `GearGraphs` per function that was compiled with gears (`rewrite.inference.set_dim_gears`)
    gear_graphs: list = dataclasses.field(default_factory=list)
    notes: list = dataclasses.field(default_factory=list)
    # The slow paths of the compiled function (rewrite.ledger.Stats), when `rewrite.explain` made the calls
    stats: object = None

    def new_graph(self, name: str) -> GraphReport:
        r = GraphReport(name)
        self.graphs.append(r)
        return r

    @property
    def ops_before(self) -> int:
        return sum(sum(g.ops_before.values()) for g in self.graphs)

    @property
    def ops_after(self) -> int:
        return sum(sum(g.ops_after.values()) for g in self.graphs)

    def applied(self) -> dict:
        out: dict = {}
        for g in self.graphs:
            for k, v in g.applied.items():
                out[k] = out.get(k, 0) + v
        return out

    def __str__(self) -> str:
        head = f"rewrite: {len(self.graphs)} graph(s), {self.ops_before} ops -> {self.ops_after} ops"
        return "\n".join([head] + [str(g) for g in self.gear_graphs] + [f"note: {n}" for n in self.notes]
                         + ([str(self.stats)] if self.stats is not None else []) + [str(g) for g in self.graphs])
