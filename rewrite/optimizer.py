"""`optimize(graph, config, report)`: the graph-level optimization pipeline, run by one schedule.

`SCHEDULE` is the one declarative value that says what runs, in which order, how often and under
which limits; `python -m rewrite rules` prints it. A round is two steps, each run to its own
fixpoint: the hand-written passes of `rewrite.passes` (they need torch or the IR's structure:
dead-edge elimination, size and constant folding, computed DSL rules, constant de-duplication,
pruning) swept until a sweep changes nothing, then one e-graph run (CSE + the DSL rulesets of
`rewrite.rules` + DAG-aware extraction) under the ``config.rules`` limits. The steps alternate
because each feeds the other: a rule exposes a foldable op, a fold exposes a rule (GE's
"constant folding and InferShape alternate until nothing folds"). Once both have run, a step that
changes nothing ends the schedule: the graph is then a fixpoint of both.

Called for every graph by the backend and again per gear, so an already-optimized graph must be
cheap: one fixpoint check of the passes and one e-graph run that fires nothing.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import threading
from typing import Callable

from .boundary import keep_outputs_fresh, views_as_reshapes
from .config import CompilerConfig
from .cost import SYMBOL_SIZE, current, graph_cost
from .egraph import Limits, run_egraph
from .ir import Graph
from .ops import STRIDE_READERS, is_mutable
from .passes import (apply_computed_rules, channels_last_convolutions, dedup_constants, eliminate_dead_edges,
                     fold_constants, fold_sizes, reinplace_buffer_updates)
from .policy import resolve_policy
from .report import GraphReport
from .rules import LIBRARY, check_user_rulesets, left_out, without

log = logging.getLogger("rewrite")

__all__ = ["optimize", "run_passes", "SCHEDULE", "Schedule", "Pass", "Sweep", "Saturation", "describe_schedule",
           "egraph_unsupported"]


@dataclasses.dataclass(frozen=True)
class Pass:
    """A hand-written pass: ``run(graph, config, rulesets) -> {what: how many changes}``."""

    name: str
    stage: str  # the report's timing bucket
    run: Callable
    doc: str


@dataclasses.dataclass(frozen=True)
class Sweep:
    """Passes in order, swept until a sweep changes nothing (at most ``max_sweeps`` times)."""

    passes: tuple
    max_sweeps: int


@dataclasses.dataclass(frozen=True)
class Saturation:
    """One e-graph run over ``rulesets`` (then ``config.rules.extra``) in order, each up to its
    ``iterations`` per saturation round, under ``config.rules``' node, time and iteration limits;
    extraction keeps the result only when it is no costlier."""

    rulesets: tuple  # RuleSet values (egglog's separation: rules are declared in rewrite.rules, run here)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Rounds of (sweep, saturation) until a step changes nothing, at most ``rounds`` rounds."""

    sweep: Sweep
    saturation: Saturation
    rounds: int


def _counted(name: str, fn) -> Callable:
    return lambda graph, config, rulesets: {name: fn(graph)}


SCHEDULE = Schedule(
    sweep=Sweep(passes=(
        Pass("dead_edge", "dead_edge", _counted("dead_edge", eliminate_dead_edges),
             "torch.cond with a compile-time predicate -> the selected branch inlined"),
        Pass("fold_sizes", "fold", _counted("fold_sizes", fold_sizes),
             "size computations whose value is a constant expression become constants"),
        Pass("fold", "fold", lambda graph, config, rulesets: {"fold": fold_constants(graph, config.rules.fold_size_limit)},
             "ops whose inputs are all constants are evaluated with torch (size cap: rules.fold_size_limit)"),
        Pass("computed_rules", "computed_rules", lambda graph, config, rulesets: apply_computed_rules(graph, rulesets),
             "DSL rules with computed (Python) replacements, matched on the IR"),
        Pass("dedup", "dedup", _counted("dedup", dedup_constants),
             "constants with identical contents become one constant"),
        Pass("prune", "prune", _counted("prune", Graph.prune),
             "only what reaches an output or has a side effect survives"),
    ), max_sweeps=16),
    # the library in its order: shape ops, algebra, GEMMs, fused kernels (see rewrite.rules)
    saturation=Saturation(rulesets=LIBRARY),
    rounds=4,
)


def optimize(graph: Graph, config: CompilerConfig, report: GraphReport) -> Graph:
    """The schedule on a copy of ``graph``; records the predicted cost before and after in ``report``."""
    if not config.rules.enabled:
        return graph
    with _cyclic_gc_paused():
        return _optimize(graph, config, report)


# Optimizing allocates millions of small objects (graph copies, e-graph snapshots, extraction
# tables), almost all freed by reference counting. Python's cyclic collector still counts them and
# walks the whole heap every few hundred thousand: three full walks, ~0.8 s of the 50,000-node
# benchmark's ~5 s. It is paused while any thread optimizes (torch's get_state_dict does the same);
# what cycles the optimizer leaves (discarded graphs: nodes point at their graph) are collected
# after. A count, not a flag: compiles on several threads overlap, and the last one out restores
# the collector as the first one in found it.
_gc_lock = threading.Lock()
_gc_pausers = 0
_gc_was_enabled = False


@contextlib.contextmanager
def _cyclic_gc_paused():
    global _gc_pausers, _gc_was_enabled
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_was_enabled:
                gc.enable()


def _optimize(graph: Graph, config: CompilerConfig, report: GraphReport) -> Graph:
    rulesets = without(list(SCHEDULE.saturation.rulesets) + check_user_rulesets(config.rules.extra),
                       config.rules.disabled)
    if resolve_policy(config).static_kernels:
        # oneDNN's fused linear saves the post-op's dispatch; where graphs run on static kernels a GEMM
        # and its post-op are both C kernels in one native run, and the fused linear, which has no
        # static kernel, becomes an ATen call that splits that run (benchmarks/zoo.py, phi at batch 8:
        # 0.795 ms with it, 0.551 ms without). So it is only offered to graphs that run ATen code.
        rulesets = [rs for rs in rulesets if rs.name != "fused.linear"]
    report.predicted_cost = (graph_cost(graph), None)
    if graph.symbols:  # the cost model prices a symbolic size as a stand-in value: the report says so
        report.symbolic_size_stand_in = SYMBOL_SIZE
    original, graph = graph, graph.copy()
    _optimize_subgraphs(graph, config, report)
    rewritten = False
    for round_no in range(SCHEDULE.rounds):
        changed = run_passes(graph, config, report, rulesets)
        if round_no > 0 and not changed:  # the e-graph's output is a fixpoint of the sweep too
            break
        graph, fired = _saturate(graph, config, report, rulesets)
        rewritten = rewritten or fired
        if not fired:
            break
    if rewritten:
        # The e-graph equates values, not layouts: a view may now read a differently-strided tensor.
        views_as_reshapes(graph)
    # x*1 -> x must not hand the caller its own input; CSE must not hand back one tensor twice.
    report.count("fresh_outputs", keep_outputs_fresh(original, graph))
    # Last: the e-graph and the sweep see functional updates (a buffer's write-back is a pinned effect).
    report.count("reinplace", reinplace_buffer_updates(graph))
    # Layouts are not values: decided on the final graph, by kernels measured at its static shapes.
    report.count("channels_last", channels_last_convolutions(graph, _kernel_times()))
    report.predicted_cost = (report.predicted_cost[0], graph_cost(graph))
    _save_kernel_times()
    return graph


def _kernel_times():
    return current().kernel_times


def _save_kernel_times() -> None:
    """Keep the kernels this optimization measured at its shapes for the next process (rewrite.cost.kernel_times)."""
    times = _kernel_times()
    if times is not None:
        times.save()


def run_passes(graph: Graph, config: CompilerConfig, report: GraphReport, rulesets=()) -> bool:
    """The schedule's sweep to a fixpoint (in place); returns whether anything changed."""
    changed = False
    for _ in range(SCHEDULE.sweep.max_sweeps):
        counts = {}
        for p in SCHEDULE.sweep.passes:
            with report.stage(p.stage):
                counts.update(p.run(graph, config, rulesets))
        for what, n in counts.items():
            report.count(what, n)
        if not any(counts.values()):
            break
        changed = True
    return changed


def _saturate(graph: Graph, config: CompilerConfig, report: GraphReport, rulesets) -> tuple[Graph, bool]:
    reason = egraph_unsupported(graph)
    if reason:
        log.info("graph %s: e-graph skipped: %s", graph.name, reason)
        report.notes.append(f"e-graph skipped: {reason}")
        return graph, False
    limits = Limits(config.rules.node_limit, float(config.rules.time_limit_s), config.rules.iteration_limit)
    graph, fired = run_egraph(graph, rulesets, limits, report)
    return graph, bool(fired)


def egraph_unsupported(graph: Graph) -> str | None:
    """Why the e-graph cannot take this graph, or None.

    Mutations are supported only at the tail (AOTAutograd's functional form: inputs are updated by
    ``copy_`` after every read). Elsewhere, reordering around a mutation could change results.
    """
    seen_mutation = None
    for n in graph.nodes:
        if n.kind != "call":
            continue
        if n.target in STRIDE_READERS:
            # The e-graph equates equal values of different layouts; these ops read the layout.
            return f"node {n.name} ({n.op}) reads strides"
        if is_mutable(n.target):
            seen_mutation = n
        elif seen_mutation is not None:
            return f"node {n.name} ({n.op}) runs after the mutation {seen_mutation.name} ({seen_mutation.op})"
    return None


def _optimize_subgraphs(graph: Graph, config: CompilerConfig, report: GraphReport) -> None:
    """Branches and loop bodies of control-flow ops are graphs too: optimize them first."""
    for n in graph.nodes:
        if n.kind == "call" and any(isinstance(a, Graph) for a in n.args):
            n.args = tuple(optimize(a, config, report) if isinstance(a, Graph) else a for a in n.args)


def describe_schedule(extra=()) -> str:
    """A readable listing of the schedule, its passes, rulesets and rules (``python -m rewrite rules``)."""
    sweep, sat = SCHEDULE.sweep, SCHEDULE.saturation
    lines = [f"Schedule: up to {SCHEDULE.rounds} rounds of (sweep, saturation); once both have run, a step "
             "that changes nothing ends it.", "",
             f"1. Sweep: these passes in order, repeated until a sweep changes nothing (at most {sweep.max_sweeps}):"]
    width = max(len(p.name) for p in sweep.passes)
    lines += [f"     {p.name:<{width}}  {p.doc}" for p in sweep.passes]
    sets = list(sat.rulesets) + list(extra)
    total = sum(len(rs) for rs in sets)
    lines += ["", f"2. Saturation: one e-graph run under config.rules limits (node_limit, time_limit_s, "
              "iteration_limit); CSE is no pass: equal computations are one e-class (reports count it as cse).",
              f"   Rulesets ({len(sets)} sets, {total} rules; run in this order, each up to its iterations per round):"]
    for rs in sets:
        head = f"     {rs.name}  ({len(rs)} rules, {rs.iterations} iterations)"
        if rs.description:
            head += f"  - {rs.description}"
        lines.append(head)
        lines += [f"       {r!r}" for r in rs.rules]
    missing = left_out()
    if missing:
        lines += ["", "   Left out in this build (the kernel or its shape function is missing):"]
        lines += [f"     {why}" for why in missing]
    lines += ["", "   Switch a rule, a ruleset or a whole family (the ruleset name up to its first dot) off by name: "
              "config.rules.disabled = [...]."]
    return "\n".join(lines)
