"""DAG-aware extraction: pick one e-node per e-class, cheapest first, never a cycle.

egglog's own extractor sums tree costs, so a shared subgraph is paid once per reader: a
100-layer residual chain costs 2^100 and saturates u64. Here an e-class's cost is shared among the
e-nodes that read it (a class read by k e-nodes charges each reader 1/k of its cost) and repeated
children of one e-node count once (``x + x`` pays for ``x`` once), which keeps costs linear in the
graph size and close to the real DAG cost.

The selection is Knuth's generalisation of Dijkstra: an e-node becomes a candidate only when every
child e-class already has its choice, so the chosen e-nodes always form a DAG. Sharing makes costs
non-monotone (three GEMMs merged into one are each charged a third of it, less than the merged
GEMM itself, which Dijkstra only finalizes after the cheaper originals), so improvement passes
follow: in children-first order, an e-class switches to an e-node that costs less given what the
graph already computes, when no chosen path leads from that e-node's children back to it (a
search pruned by the topological index of the current choice). The optimizer then compares the rebuilt graph's exact DAG cost with the input's and keeps
the cheaper.

Compile-time terms cost nothing: an e-class whose choice is a constant, a literal, or a call whose
children are all compile-time and that folding evaluates (`rewrite.cost.folds_at_compile_time`) is
computed once by the folding pass after extraction. That is how a rule builds new weights (a
concatenated QKV weight, a scale folded into a weight) that extraction can weigh at their run-time
price: none.
"""
from __future__ import annotations

import heapq

from ..cost import dispatch_overhead, folds_at_compile_time, numel, op_cost
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
    known: dict = {}  # e-class computed at compile time -> its elements if it comes from frozen weights, else 0
    own_cache: dict = {}
    heap: list = []
    counter = 0
    pinned_cost = dispatch_overhead()

    def own(cls: str, i: int) -> tuple[float, int | None]:
        """(run-time cost, None or the weight elements it holds when computed at compile time)."""
        node = classes[cls][i]
        children = kids[(cls, i)]
        folds = all(c in known for c in children)
        weights = sum(known[c] for c in children) if folds else 0
        if is_call(node.op):
            op_name, arg_classes, _ = dec.call_parts(node)
            out_key = snap.meta_key(cls)
            in_keys = tuple(snap.meta_key(c) for c in arg_classes)
            key = (op_name, out_key, in_keys, folds, weights)
            if key not in own_cache:
                metas = tables.metas
                target, out = target_from_name(op_name), metas.get(out_key)
                if folds and folds_at_compile_time(target, out, weights):
                    own_cache[key] = (0.0, numel(out) if weights else 0)
                else:
                    own_cache[key] = (op_cost(target, out, [metas.get(k) for k in in_keys if k is not None]), None)
            return own_cache[key]
        if node.op == "Pinned":
            return pinned_cost, None  # always kept: its cost is the same in every choice
        if node.op in ("Input", "Opaque"):
            return 0.0, None
        if node.op == "Const":
            index = int(snap.string(node.children[0]))
            return 0.0, numel(snap_meta(cls)) if index in tables.weights else 0
        return 0.0, weights if folds else None  # literals, and lists of compile-time values

    def snap_meta(cls: str):
        return tables.metas.get(snap.meta_key(cls))

    def push(cls: str, i: int) -> None:
        nonlocal counter
        cost, folds = own(cls, i)
        cost += sum(best[c][0] / share[c] for c in kids[(cls, i)])
        counter += 1
        heapq.heappush(heap, (cost, counter, cls, i, folds))

    for key, n in waiting.items():
        if n == 0:
            push(*key)
    while heap:
        cost, _, cls, i, folds = heapq.heappop(heap)
        if cls in best:
            continue
        best[cls] = (cost, i)
        if folds is not None:
            known[cls] = folds
        for parent in readers.get(cls, ()):
            waiting[parent] -= 1
            if waiting[parent] == 0 and parent[0] not in best:
                push(*parent)
    missing = [r for r in roots if r not in best and r in classes]
    if missing:
        raise ExtractionError(f"no acyclic term for e-classes {missing[:5]}")
    choice = {cls: i for cls, (_, i) in best.items()}
    _improve(choice, {cls: len(nodes) for cls, nodes in classes.items()}, kids, share, own, known, roots)
    return {cls: classes[cls][i] for cls, i in choice.items()}


IMPROVEMENT_PASSES = 4
MAX_REORDERS = 256  # topological re-sorts per extraction (one after each switch that needs a cycle check)


def _topological(choice: dict, kids: dict) -> dict:
    """Index of every chosen e-class in a children-first order of the current choice."""
    index: dict = {}
    for root in choice:
        if root in index:
            continue
        stack = [(root, False)]
        while stack:
            cls, done = stack.pop()
            if cls in index:
                continue
            if done:
                index[cls] = len(index)
                continue
            stack.append((cls, True))
            stack.extend((c, False) for c in kids[(cls, choice[cls])] if c not in index)
    return index


def _reaches(starts, target, choice: dict, kids: dict, index: dict) -> bool:
    """Whether a chosen path leads from ``starts`` to ``target``; every class on such a path comes
    after ``target`` in the children-first ``index``, which prunes the search to a small region."""
    bound = index[target]
    stack, seen = [c for c in starts if index[c] >= bound], set()
    while stack:
        cls = stack.pop()
        if cls == target:
            return True
        if cls in seen:
            continue
        seen.add(cls)
        stack.extend(c for c in kids[(cls, choice[cls])] if index[c] >= bound)
    return False


def _reachable(starts, choice: dict, kids: dict, seen: set) -> set:
    """The chosen e-classes reachable from ``starts`` that are not in ``seen`` (added to it)."""
    new, stack = set(), [c for c in starts if c not in seen]
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        new.add(cls)
        stack.extend(c for c in kids[(cls, choice[cls])] if c not in seen)
    return new


def _improve(choice: dict, sizes: dict, kids: dict, share: dict, own, known: dict, roots: list) -> None:
    """Switch e-classes to e-nodes that cost less in the graph as chosen so far (see the module doc).

    Costs are marginal: what the graph already computes (``live``) is free to read, and what only
    the current choice reads (read once) is saved by leaving it; what the graph does not compute
    yet is charged its share-based estimate. So once one member of a merged GEMM reads the merge,
    its siblings read it too instead of each keeping a merge of its own.
    """
    reorders = 0
    for _ in range(IMPROVEMENT_PASSES):
        index = _topological(choice, kids)
        order = sorted(index, key=index.__getitem__)
        cost: dict = {}
        for cls in order:
            cost[cls] = own(cls, choice[cls])[0] + sum(cost[c] / share[c] for c in kids[(cls, choice[cls])])
        live: set = set()
        _reachable([r for r in roots if r in choice], choice, kids, live)
        readers: dict = {}  # live e-class -> how many live choices read it
        for cls in live:
            for c in kids[(cls, choice[cls])]:
                readers[c] = readers.get(c, 0) + 1
        switched = stale = False
        for cls in order:
            if cls not in live:
                continue
            chosen = kids[(cls, choice[cls])]
            current = own(cls, choice[cls])[0] + sum(cost[c] for c in chosen if readers.get(c, 0) == 1)
            for i in range(sizes[cls]):
                children = kids[(cls, i)]
                if i == choice[cls] or any(c not in cost for c in children):
                    continue
                own_cost, folds = own(cls, i)
                candidate = own_cost + sum(0.0 if c in live else cost[c] / share[c] for c in children)
                if candidate >= current * (1 - 1e-9) - 1e-15:
                    continue
                if stale:
                    if reorders >= MAX_REORDERS:
                        return
                    index, stale, reorders = _topological(choice, kids), False, reorders + 1
                if _reaches(children, cls, choice, kids, index):
                    continue
                for c in kids[(cls, choice[cls])]:
                    readers[c] -= 1
                choice[cls], current, switched, stale = i, candidate, True, True
                if folds is not None:
                    known[cls] = folds
                else:
                    known.pop(cls, None)
                for reader in _reachable(children, choice, kids, live) | {cls}:  # what now reads what
                    for c in kids[(reader, choice[reader])]:
                        readers[c] = readers.get(c, 0) + 1
        if not switched:
            return
