"""The e-graph optimizer: IR -> egglog -> saturate under limits -> DAG-aware extraction -> IR.

``run_egraph(graph, rulesets, limits, report)`` is the one entry point (the optimizer calls it once
per round). Stages are timed in the report as ``egraph.load``, ``egraph.saturate`` and
``egraph.extract``; rule firings are counted under the rule names: replacements that passed the
meta guard (a root re-matched after a merge counts again), CSE under ``cse``. Whatever goes wrong
inside, the input graph is returned unchanged and the reason is logged: the e-graph
may only ever make a graph better, never wrong.

Where things are: `rewrite.egraph.run` holds the engine (`Engine`, cached per thread: egglog's EGraph
is bound to its thread, and egglog does not survive fork(), see "Threads and processes" there) and the
runs (`EGraphRun`, `run_egraph`, `equivalent_graphs`). A rule reaches the engine as plain data, and
`encode` writes the egglog text of rules (the DSL writes none); `terms` is the term language and its
prelude, `load` puts a graph into the e-graph in bulk, `saturate` runs the schedule with meta inference
(`names` and `decode` carry e-classes in and out of Python), `snapshot` is a read-only view of the
e-graph, `extract` picks the cheapest DAG (or a variant) and `rebuild` makes the IR graph of it.
"""
from __future__ import annotations

from .extract import VARIANT_PICKS
from .run import EGraphRun, Engine, compile_rulesets, engine_for, equivalent_graphs, run_egraph
from .saturate import Limits

__all__ = ["run_egraph", "Limits", "EGraphRun", "Engine", "engine_for", "compile_rulesets", "equivalent_graphs",
           "VARIANT_PICKS"]
