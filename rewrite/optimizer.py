"""`optimize(graph, unit)`: the graph-level optimization pipeline, run by one schedule.

`SCHEDULE` is the one declarative value that says what runs, in which order, how often and under
which limits, the finishing passes included; `python -m rewrite rules` prints it, and `optimize`
runs exactly it. It lists the values that run: the `Pass` values of `rewrite.passes` (one contract,
``run(step) -> {what: count}``, each with its name, timing bucket and description) and, for the
saturation, ``Run(ruleset, iterations)`` for each ruleset of `rewrite.rules.LIBRARY`, in its order, with
the counts that are not the default written here next to their ruleset objects.
First the graph's subgraphs (branches and loop bodies). Then rounds of two steps,
each run to its own fixpoint: the hand-written passes of `rewrite.passes` (they need torch or the
IR's structure: dead-edge elimination, size and constant folding, computed DSL rules, constant
de-duplication, pruning) swept until a sweep changes nothing, then one e-graph run (CSE + the DSL
rulesets of `rewrite.rules`, each for its iterations, + DAG-aware extraction) under the
``config.rules`` limits. The steps alternate because each feeds the other: a rule exposes a
foldable op, a fold exposes a rule (GE's "constant folding and InferShape alternate until nothing
folds"). Once both have run, a step that changes nothing ends the rounds: the graph is then a
fixpoint of both. Last, the finishing passes, once each, in order: what the e-graph may not
decide (layouts, aliasing at the graph's edges, in-place updates).

The unit's execution policy (`rewrite.policy`, resolved once per unit) decides how the graph is
priced: a graph headed for static kernels is costed under `rewrite.cost.for_static_kernels`, where
an op without a static kernel also pays for the run of kernels it splits; every ruleset is offered,
and extraction keeps what pays there.

Called for every graph by the backend and, through the pipeline, for every gear, so an
already-optimized graph must be cheap: one fixpoint check of the passes and one e-graph run that
fires nothing.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import threading

from .cost import SYMBOL_SIZE, current, for_static_kernels, graph_cost
from .dsl import RuleSet
from .egraph import Limits, run_egraph
from .ir import Graph
from .ops import STRIDE_READERS, is_mutable
from .passes import (CHANNELS_LAST, COMPUTED_RULES, DEAD_EDGE, DEDUP, FOLD, FOLD_SIZES, FRESH_OUTPUTS, PRUNE, REINPLACE,
                     TRIVIAL_RESTRIDES, VIEWS_AS_RESHAPES, Pass, Step)
from .rules import LIBRARY, algebra, check_user_rulesets, gemm, left_out, without
from .unit import CompileUnit

log = logging.getLogger("rewrite")

__all__ = ["optimize", "run_passes", "library_runs", "offered_runs", "SCHEDULE", "Schedule", "Pass", "Sweep", "Run", "Saturation", "Step",
           "describe_schedule", "egraph_unsupported"]


@dataclasses.dataclass(frozen=True)
class Sweep:
    """`Pass` values (`rewrite.passes`) in order, swept until a sweep changes nothing (at most ``max_sweeps`` times)."""

    passes: tuple
    max_sweeps: int


@dataclasses.dataclass(frozen=True)
class Run:
    """One ruleset of a saturation, run up to ``iterations`` times per saturation round."""

    ruleset: RuleSet
    iterations: int


@dataclasses.dataclass(frozen=True)
class Saturation:
    """One e-graph run over ``runs`` in order (then ``config.rules.extra``, each for its own
    ``RuleSet.iterations``), under ``config.rules``' node, time and iteration limits; extraction keeps
    the result only when it is no costlier."""

    runs: tuple  # Run values (egglog's separation: rules are declared in rewrite.rules, scheduled here)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """``first`` once; rounds of (sweep, saturation) until a step changes nothing, at most ``rounds``;
    then ``finishing`` once, in order."""

    first: tuple
    sweep: Sweep
    saturation: Saturation
    rounds: int
    finishing: tuple


def _optimize_subgraphs(step: Step) -> dict:
    """Branches and loop bodies of control-flow ops are graphs too: optimized first, with the same unit.
    The one pass defined here rather than in `rewrite.passes`: it is this schedule, run on each subgraph."""
    for n in step.graph.nodes:
        if n.kind == "call" and any(isinstance(a, Graph) for a in n.args):
            n.args = tuple(optimize(a, step.unit) if isinstance(a, Graph) else a for a in n.args)
    return {}  # counted by the subgraphs' own passes, in the same report


SUBGRAPHS = Pass("subgraphs", "subgraphs", _optimize_subgraphs,
                 "branches and loop bodies of control-flow ops are optimized first, by this same schedule")

# How often a library ruleset runs per saturation round: 8, but for these, each with why. The order is
# `rewrite.rules.LIBRARY`'s, its one home (shape ops, algebra, GEMMs, fused kernels: why is written there).
_DEFAULT_ITERATIONS = 8
_FEWER_ITERATIONS = (
    Run(algebra.COMMUTATIVITY, 1),  # once: it only doubles add/mul e-nodes
    # once: a multi-pattern rule whose members are original nodes in graph order, so each set of sibling GEMMs
    # matches once and merged GEMMs never merge again
    Run(gemm.MERGE_PARALLEL, 1),
    Run(gemm.FOLD_SCALES, 4),  # moving scales into weights: a chain of views is at most that deep in the zoo
)
for _run in _FEWER_ITERATIONS:  # a count for a ruleset the library no longer holds would be ignored silently
    if not any(_run.ruleset is rs for rs in LIBRARY):
        raise AssertionError(f"rewrite.optimizer: ruleset {_run.ruleset.name} has a count but is not in rewrite.rules.LIBRARY")


def _run_of(ruleset: RuleSet) -> Run:
    """``ruleset``'s run in the saturation: its entry in `_FEWER_ITERATIONS`, else `_DEFAULT_ITERATIONS`."""
    return next((r for r in _FEWER_ITERATIONS if r.ruleset is ruleset), Run(ruleset, _DEFAULT_ITERATIONS))


SCHEDULE = Schedule(
    first=(SUBGRAPHS,),
    sweep=Sweep(passes=(DEAD_EDGE, FOLD_SIZES, FOLD, TRIVIAL_RESTRIDES, COMPUTED_RULES, DEDUP, PRUNE), max_sweeps=16),
    saturation=Saturation(runs=tuple(_run_of(rs) for rs in LIBRARY)),
    rounds=4,
    finishing=(VIEWS_AS_RESHAPES, FRESH_OUTPUTS, REINPLACE, CHANNELS_LAST),
)


def optimize(graph: Graph, unit: CompileUnit) -> Graph:
    """The schedule on a copy of ``graph`` for ``unit``; records the predicted cost before and after in the unit's
    report (a graph built outside the backend: `CompileUnit.detached`)."""
    if not unit.config.rules.enabled:
        return graph
    with _cyclic_gc_paused(), for_static_kernels(unit.policy.static_kernels):
        return _optimize(graph, unit)


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


def library_runs() -> list:
    """The library's rulesets as the schedule runs them: (RuleSet, iterations) pairs, in order."""
    return [(r.ruleset, r.iterations) for r in SCHEDULE.saturation.runs]


def offered_runs(unit: CompileUnit) -> list:
    """The (ruleset, iterations) runs the saturation offers ``unit``: the schedule's, then the user's
    rulesets, minus what ``config.rules.disabled`` names."""
    config = unit.config
    runs = library_runs() + [(rs, rs.iterations) for rs in check_user_rulesets(config.rules.extra)]
    return without(runs, config.rules.disabled)  # checks every name against everything there is


def _optimize(graph: Graph, unit: CompileUnit) -> Graph:
    report = unit.report
    report.predicted_cost = (graph_cost(graph), None)
    if graph.symbols:  # the cost model prices a symbolic size as a stand-in value: the report says so
        report.symbolic_size_stand_in = SYMBOL_SIZE
    step = Step(graph.copy(), unit, offered_runs(unit), graph)
    _run_each(SCHEDULE.first, step)
    for round_no in range(SCHEDULE.rounds):
        changed = run_passes(step)
        if round_no > 0 and not changed:  # the e-graph's output is a fixpoint of the sweep too
            break
        step.graph, fired = _saturate(step)
        step.rewritten = step.rewritten or fired
        if not fired:
            break
    _run_each(SCHEDULE.finishing, step)
    report.predicted_cost = (report.predicted_cost[0], graph_cost(step.graph))
    _save_kernel_times()
    return step.graph


def _run_each(passes, step: Step) -> dict:
    counts: dict = {}
    for p in passes:
        with step.unit.report.stage(p.stage):
            counts.update(p.run(step))
    for what, n in counts.items():
        step.unit.report.count(what, n)
    return counts


def _save_kernel_times() -> None:
    """Keep the kernels this optimization measured at its shapes for the next process (rewrite.cost.kernel_times)."""
    times = current().kernel_times
    if times is not None:
        times.save()


def run_passes(step: Step) -> bool:
    """The schedule's sweep to a fixpoint (in place on ``step.graph``); returns whether anything changed."""
    changed = False
    for _ in range(SCHEDULE.sweep.max_sweeps):
        if not any(_run_each(SCHEDULE.sweep.passes, step).values()):
            break
        changed = True
    return changed


def _saturate(step: Step) -> tuple[Graph, bool]:
    graph, report, rules = step.graph, step.unit.report, step.unit.config.rules
    reason = egraph_unsupported(graph)
    if reason:
        report.note(f"e-graph skipped: {reason}")
        return graph, False
    graph, fired = run_egraph(graph, step.runs, Limits(rules.node_limit, float(rules.time_limit_s),
                                                        rules.iteration_limit), report)
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


def describe_schedule(extra=()) -> str:
    """A readable listing of the whole schedule: its passes, rulesets and rules, the finishing passes
    (``python -m rewrite rules``). ``extra``: user rulesets, listed after the library's."""
    sweep, sat = SCHEDULE.sweep, SCHEDULE.saturation

    def passes(ps) -> list[str]:
        width = max(len(p.name) for p in ps)
        return [f"     {p.name:<{width}}  {p.doc}" for p in ps]

    runs = [(r.ruleset, r.iterations) for r in sat.runs] + [(rs, rs.iterations) for rs in extra]
    total = sum(len(rs) for rs, _ in runs)
    lines = [f"Schedule: first pass, then up to {SCHEDULE.rounds} rounds of (sweep, saturation) (once both have run, "
             "a step that changes nothing ends them), then the finishing passes.", "",
             "0. First, once:"] + passes(SCHEDULE.first)
    lines += ["", f"1. Sweep: these passes in order, repeated until a sweep changes nothing (at most {sweep.max_sweeps}):"]
    lines += passes(sweep.passes)
    lines += ["", "2. Saturation: one e-graph run under config.rules limits (node_limit, time_limit_s, "
              "iteration_limit); CSE is no pass: equal computations are one e-class (reports count it as cse).",
              f"   Rulesets ({len(runs)} sets, {total} rules; run in this order, each up to its iterations per round):"]
    for rs, iterations in runs:
        head = f"     {rs.name}  ({len(rs)} rules, {iterations} iterations)"
        if rs.description:
            head += f"  - {rs.description}"
        lines.append(head)
        lines += [f"       {r!r}" for r in rs.rules]
    missing = left_out()
    if missing:
        lines += ["", "   Left out in this build (the kernel or its shape function is missing):"]
        lines += [f"     {why}" for why in missing]
    lines += ["", "   Switch a rule, a ruleset or a whole family (the ruleset name up to its first dot) off by name: "
              "config.rules.disabled = [...].", "", "3. Finishing passes, once each, in order:"]
    lines += passes(SCHEDULE.finishing)
    return "\n".join(lines)
