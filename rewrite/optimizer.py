"""`optimize(graph, config, report)`: the graph-level optimization pipeline.

Rounds of (Python passes on the IR to a fixpoint) then (one e-graph run: CSE + the DSL rulesets +
DAG-aware extraction), until a round changes nothing. The Python passes are those that need
torch or the IR's structure: dead-edge elimination, constant and size folding, computed DSL
rules, constant de-duplication, pruning. They alternate with the e-graph because each feeds the
other: a rule exposes a foldable op, a fold exposes a rule (GE's "constant folding and InferShape
alternate until nothing folds").

Called for every graph by the backend and again per gear, so an already-optimized graph must be
cheap: one fixpoint check of the passes and one e-graph run that fires nothing.
"""
from __future__ import annotations

import logging

import torch

from .boundary import keep_outputs_fresh, views_as_reshapes
from .config import CompilerConfig
from .egraph import Limits, run_egraph
from .egraph.pyrules import apply_computed_rules
from .ir import Graph
from .report import GraphReport
from .rules import check_user_rulesets, default_rulesets
from .rules.cse import dedup_constants
from .rules.dead_edge import eliminate_dead_edges
from .rules.folding import fold_constants, fold_sizes

log = logging.getLogger("rewrite")

__all__ = ["optimize", "run_passes", "MAX_ROUNDS"]

MAX_ROUNDS = 4          # e-graph rounds per graph
MAX_PASS_SWEEPS = 16    # sweeps of the Python passes per round (each sweep that changes nothing ends it)


def optimize(graph: Graph, config: CompilerConfig, report: GraphReport) -> Graph:
    if not config.rules.enabled:
        return graph
    rulesets = default_rulesets() + check_user_rulesets(config.rules.extra)
    limits = Limits(config.rules.node_limit, float(config.rules.time_limit_s), config.rules.iteration_limit)
    original, graph = graph, graph.copy()
    _optimize_subgraphs(graph, config, report)
    rewritten = False
    for round_no in range(MAX_ROUNDS):
        changed = run_passes(graph, config, report, rulesets)
        if round_no > 0 and not changed:
            break
        reason = egraph_unsupported(graph)
        if reason:
            log.info("graph %s: e-graph skipped: %s", graph.name, reason)
            report.notes.append(f"e-graph skipped: {reason}")
            break
        graph, fired = run_egraph(graph, rulesets, limits, report)
        rewritten = rewritten or bool(fired)
        if not fired:
            break
    if rewritten:
        # The e-graph equates values, not layouts: a view may now read a differently-strided tensor.
        views_as_reshapes(graph)
    # x*1 -> x must not hand the caller its own input; CSE must not hand back one tensor twice.
    report.count("fresh_outputs", keep_outputs_fresh(original, graph))
    return graph


def run_passes(graph: Graph, config: CompilerConfig, report: GraphReport, rulesets=()) -> bool:
    """The Python passes to a fixpoint (in place); returns whether anything changed."""
    changed = False
    for _ in range(MAX_PASS_SWEEPS):
        counts = {}
        with report.stage("dead_edge"):
            counts["dead_edge"] = eliminate_dead_edges(graph)
        with report.stage("fold"):
            counts["fold_sizes"] = fold_sizes(graph)
            counts["fold"] = fold_constants(graph, config.rules.fold_size_limit)
        with report.stage("computed_rules"):
            for name, n in apply_computed_rules(graph, rulesets).items():
                counts[name] = n
        with report.stage("dedup"):
            counts["dedup"] = dedup_constants(graph)
        with report.stage("prune"):
            counts["prune"] = graph.prune()
        for what, n in counts.items():
            report.count(what, n)
        if not any(counts.values()):
            break
        changed = True
    return changed


_STRIDE_READERS = frozenset({torch.ops.aten.as_strided.default, torch.ops.aten.as_strided_.default,
                             torch.ops.aten.as_strided_scatter.default, torch.ops.aten.sym_stride.int,
                             torch.ops.aten.sym_stride.default, torch.ops.aten.stride.int})


def egraph_unsupported(graph: Graph) -> str | None:
    """Why the e-graph cannot take this graph, or None.

    Mutations are supported only at the tail (AOTAutograd's functional form: inputs are updated by
    ``copy_`` after every read). Elsewhere, reordering around a mutation could change results.
    """

    seen_mutation = None
    for n in graph.nodes:
        if n.kind != "call":
            continue
        t = n.target
        if t in _STRIDE_READERS:
            # The e-graph equates equal values of different layouts; these ops read the layout.
            return f"node {n.name} ({n.op}) reads strides"
        mutable = isinstance(t, torch._ops.OpOverload) and t._schema.is_mutable
        if mutable:
            seen_mutation = n
        elif seen_mutation is not None:
            return f"node {n.name} ({n.op}) runs after the mutation {seen_mutation.name} ({seen_mutation.op})"
    return None


def _optimize_subgraphs(graph: Graph, config: CompilerConfig, report: GraphReport) -> None:
    """Branches and loop bodies of control-flow ops are graphs too: optimize them first."""
    for n in graph.nodes:
        if n.kind == "call" and any(isinstance(a, Graph) for a in n.args):
            n.args = tuple(optimize(a, config, report) if isinstance(a, Graph) else a for a in n.args)
