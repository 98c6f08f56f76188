"""DAG-aware extraction: pick one e-node per e-class, cheapest first, never a cycle.

egglog's own extractor sums tree costs, so a shared subgraph is paid once per reader: a
100-layer residual chain costs 2^100 and saturates u64. Here an e-class's cost is shared among the
e-nodes that read it (a class read by k e-nodes charges each reader 1/k of its cost) and repeated
children of one e-node count once (``x + x`` pays for ``x`` once), which keeps costs linear in the
graph size and close to the real DAG cost.

The selection is Knuth's generalisation of Dijkstra: an e-node becomes a candidate only when every
child e-class already has its choice, so the chosen e-nodes always form a DAG. The optimizer then
compares the rebuilt graph's exact DAG cost with the input's and keeps the cheaper.
"""
from __future__ import annotations

import heapq

from ..cost import OP_OVERHEAD_S, op_cost
from ..ops import target_from_name
from .decode import Decoder
from .snapshot import Snapshot
from .terms import Tables, is_call


class ExtractionError(RuntimeError):
    """Some root e-class has no acyclic term (should not happen: originals are always there)."""


def extract(snap: Snapshot, tables: Tables, roots: list) -> dict:
    """Choose an e-node for every e-class reachable from ``roots``."""
    dec = Decoder(snap, tables)
    classes = snap.classes
    is_class = classes.__contains__
    # children per e-node (distinct, non-primitive), readers per e-class
    kids: dict[tuple[str, int], tuple[str, ...]] = {}
    readers: dict[str, list[tuple[str, int]]] = {}
    share: dict[str, int] = {}
    for cls, nodes in classes.items():
        for i, node in enumerate(nodes):
            ch = tuple(dict.fromkeys(c for c in node.children if is_class(c)))
            kids[(cls, i)] = ch
            for c in ch:
                readers.setdefault(c, []).append((cls, i))
                share[c] = share.get(c, 0) + 1
    waiting = {key: len(ch) for key, ch in kids.items()}
    best: dict[str, tuple[float, int]] = {}
    own_cache: dict = {}
    heap: list = []
    counter = 0

    def own(cls: str, i: int) -> float:
        node = classes[cls][i]
        if is_call(node.op):
            op_name, arg_classes, _ = dec.call_parts(node)
            out_key = snap.meta_key(cls)
            in_keys = tuple(snap.meta_key(c) for c in arg_classes)
            key = (op_name, out_key, in_keys)
            if key not in own_cache:
                metas = tables.metas
                own_cache[key] = op_cost(target_from_name(op_name), metas.get(out_key),
                                         [metas.get(k) for k in in_keys if k is not None])
            return own_cache[key]
        if node.op == "Pinned":
            return OP_OVERHEAD_S  # always kept: its cost is the same in every choice
        return 0.0

    def push(cls: str, i: int) -> None:
        nonlocal counter
        cost = own(cls, i) + sum(best[c][0] / share[c] for c in kids[(cls, i)])
        counter += 1
        heapq.heappush(heap, (cost, counter, cls, i))

    for key, n in waiting.items():
        if n == 0:
            push(*key)
    while heap:
        cost, _, cls, i = heapq.heappop(heap)
        if cls in best:
            continue
        best[cls] = (cost, i)
        for parent in readers.get(cls, ()):
            waiting[parent] -= 1
            if waiting[parent] == 0 and parent[0] not in best:
                push(*parent)
    missing = [r for r in roots if r not in best and r in classes]
    if missing:
        raise ExtractionError(f"no acyclic term for e-classes {missing[:5]}")
    return {cls: classes[cls][i] for cls, (_, i) in best.items()}
