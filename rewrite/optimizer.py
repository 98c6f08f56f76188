"""`optimize(graph, config, report)`: the graph-level optimization pipeline.

The e-graph optimizer (rules over egglog) plugs in here; until a pass knows an op, the op stays
an opaque node and is kept, CSE'd and pruned like any other.
"""
from __future__ import annotations

import logging

from .ir import Graph
from .report import GraphReport

log = logging.getLogger("rewrite")

__all__ = ["optimize"]


def optimize(graph: Graph, config, report: GraphReport) -> Graph:
    if not config.rules.enabled:
        return graph
    with report.stage("prune"):
        report.count("prune", graph.prune())
    return graph
