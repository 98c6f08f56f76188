"""Wait ordering: the order a graph's nodes may run in when wait edges (`Node.waits`) count too.

Wait edges are part of the IR (`rewrite.scope.wait_tensor` and ``wait`` put them there), so their
order is too: the executor (`rewrite.exec.streams`, the single-stream code generator) runs nodes in
it, and the export format refuses a file whose waits close a cycle, without either importing the
other.
"""
from __future__ import annotations

import heapq

from .fx_bridge import CompileError
from .ir import Graph, Node

__all__ = ["StreamCycleError", "resolve_waits", "order_with_waits"]


class StreamCycleError(CompileError):
    """The wait edges together with the data edges form a cycle."""


def resolve_waits(graph: Graph) -> dict:
    """node id -> the graph's nodes it waits for.

    A wait on a node that is no longer in the graph is an error: an optimization dropped what the
    user asked for.
    """
    by_id = {n.id: n for n in graph.nodes}
    out = {}
    for n in graph.nodes:
        deps = []
        for w in n.waits:
            target = by_id.get(w.id)
            if target is None:
                raise CompileError(
                    f"graph {graph.name}: {n} ({n.op}) waits for %{w.name}, which is not in the graph "
                    "any more; a pass removed a node a wait_tensor refers to")
            if target.kind in ("call",) and target is not n:
                deps.append(target)
        if deps:
            out[n.id] = deps
    return out


def order_with_waits(graph: Graph, waits: dict) -> list:
    """The graph's nodes in a topological order of data plus wait edges (stable w.r.t. graph order)."""
    index = {n.id: i for i, n in enumerate(graph.nodes)}
    preds: dict[int, list[Node]] = {}
    for n in graph.nodes:
        preds[n.id] = list(n.inputs) + waits.get(n.id, [])
    succs: dict[int, list[Node]] = {n.id: [] for n in graph.nodes}
    indegree = {}
    for n in graph.nodes:
        ps = [p for p in preds[n.id] if p.id in index]
        indegree[n.id] = len(ps)
        for p in ps:
            succs[p.id].append(n)
    ready = [(index[n.id], n) for n in graph.nodes if indegree[n.id] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, n = heapq.heappop(ready)
        order.append(n)
        for s in succs[n.id]:
            indegree[s.id] -= 1
            if indegree[s.id] == 0:
                heapq.heappush(ready, (index[s.id], s))
    if len(order) != len(graph.nodes):
        stuck = {n.id for n in graph.nodes} - {n.id for n in order}
        raise StreamCycleError(f"graph {graph.name}: wait_tensor creates a cycle: {_find_cycle(graph, preds, stuck, waits)}")
    return order


def _find_cycle(graph: Graph, preds: dict, stuck: set, waits: dict) -> str:
    """Describe one cycle among the ``stuck`` nodes, e.g. ``%a -> %b (waits for) -> %a``."""
    nodes = {n.id: n for n in graph.nodes}
    start = min(stuck, key=lambda i: graph.nodes.index(nodes[i]))
    path, seen = [nodes[start]], {start: 0}
    while True:
        cur = path[-1]
        nxt = next(p for p in preds[cur.id] if p.id in stuck)
        if nxt.id in seen:
            cycle = path[seen[nxt.id]:] + [nxt]
            break
        seen[nxt.id] = len(path)
        path.append(nxt)
    # path follows "depends on" edges; print it in execution direction.
    cycle = cycle[::-1]
    parts = [f"%{cycle[0].name}"]
    for a, b in zip(cycle, cycle[1:]):
        how = "waited for by" if any(w is a for w in waits.get(b.id, ())) else "read by"
        parts.append(f"{how} %{b.name}")
    return " -> ".join(parts)
