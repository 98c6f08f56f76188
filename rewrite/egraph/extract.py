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
follow (`_improve`): e-classes switch, alone or together with the others that read the same new
value, where the graph's marginal cost goes down. The optimizer then compares the rebuilt graph's exact DAG cost with the input's and keeps
the cheaper.

Compile-time terms cost nothing: an e-class whose choice is a constant, a literal, or a call whose
children are all compile-time and that folding evaluates (`rewrite.cost.folds_at_compile_time`) is
computed once by the folding pass after extraction. That is how a rule builds new weights (a
concatenated QKV weight, a scale folded into a weight) that extraction can weigh at their run-time
price: none.
"""
from __future__ import annotations

import heapq
import random

from ..cost import dispatch_overhead, folds_at_compile_time, numel, op_cost
from ..ops import target_from_name
from .decode import Decoder
from .snapshot import Snapshot
from .terms import Tables, is_call


class ExtractionError(RuntimeError):
    """Some root e-class has no acyclic term (should not happen: originals are always there)."""


def extract(snap: Snapshot, tables: Tables, roots: list) -> dict:
    """Choose an e-node for every e-class reachable from ``roots``."""
    choice, kids, readers, own, known = _cheapest(snap, tables, roots)
    _improve(choice, snap.classes.__getitem__, kids, readers, own, known, roots)
    return {cls: snap.classes[cls][i] for cls, i in choice.items()}


def _cheapest(snap: Snapshot, tables: Tables, roots: list):
    """The Dijkstra-like selection: (choice: e-class -> e-node index, children per e-node, readers
    per e-class, the own-cost function, the compile-time e-classes) before any improvement pass."""
    dec = Decoder(snap, tables)
    classes = snap.classes
    is_class = classes.__contains__
    # children per e-node (distinct, non-primitive), readers per e-class
    kids: dict[tuple[str, int], tuple[str, ...]] = {}
    readers: dict[str, list[tuple[str, int]]] = {}
    share: dict[str, int] = {}
    for cls, nodes in classes.items():
        for i, node in enumerate(nodes):
            ch = [c for c in node.children if is_class(c)]
            ch = kids[(cls, i)] = tuple(dict.fromkeys(ch)) if len(ch) > 1 else tuple(ch)
            for c in ch:
                readers.setdefault(c, []).append((cls, i))
                share[c] = share.get(c, 0) + 1
    waiting = {key: len(ch) for key, ch in kids.items()}
    best: dict[str, tuple[float, int]] = {}
    known: dict = {}  # e-class computed at compile time -> its elements if it comes from frozen weights, else 0
    own_cache: dict = {}
    calls: dict = {}  # (class, index) -> the call's key (op name and metas), read off the snapshot once
    heap: list = []
    counter = 0
    pinned_cost = dispatch_overhead()

    signatures: dict = {}  # (op name, out meta key, in meta keys) -> a number: own_cache's keys stay cheap to hash

    def call_key(cls: str, i: int, node) -> tuple:
        key = calls.get((cls, i))
        if key is None:
            op_name, arg_classes, _ = dec.call_parts(node)
            parts = (op_name, snap.meta_key(cls), tuple(snap.meta_key(c) for c in arg_classes))
            key = calls[(cls, i)] = (signatures.setdefault(parts, len(signatures)), *parts)
        return key

    def own(cls: str, i: int) -> tuple[float, int | None]:
        """(run-time cost, None or the weight elements it holds when computed at compile time)."""
        node = classes[cls][i]
        children = kids[(cls, i)]
        folds = all(c in known for c in children)
        weights = sum(known[c] for c in children) if folds else 0
        if is_call(node.op):
            signature, op_name, out_key, in_keys = call_key(cls, i, node)
            key = (signature, folds, weights)
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
    return choice, kids, readers, own, known


IMPROVEMENT_PASSES = 2
MAX_MOVES = 256  # switches per extraction (each re-sorts the choice topologically: O(graph))


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
    stack, seen = [c for c in starts if index.get(c, bound) >= bound], set()
    while stack:
        cls = stack.pop()
        if cls == target:
            return True
        if cls in seen:
            continue
        seen.add(cls)
        stack.extend(c for c in kids[(cls, choice[cls])] if index.get(c, bound) >= bound)
    return False


def _reachable(starts, choice: dict, kids: dict, stop: set) -> list:
    """The chosen e-classes reachable from ``starts`` without passing through ``stop``."""
    out, seen, stack = [], set(), [c for c in starts if c not in stop]
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        out.append(cls)
        stack.extend(c for c in kids[(cls, choice[cls])] if c not in stop and c not in seen)
    return out


def _best_move(cls, choice, nodes_of, kids, readers, own, live, saved, fits):
    """The switch of ``cls`` (with the others joining it) that saves the most, or None."""
    op, chosen = nodes_of(cls)[choice[cls]].children[:1], set(kids[(cls, choice[cls])])
    best, best_gain = None, 1e-12
    for i in range(len(nodes_of(cls))):
        children = kids[(cls, i)]
        if i == choice[cls] or not fits(cls, i):
            continue
        if nodes_of(cls)[i].children[:1] == op and set(children) == chosen:
            continue  # the same op on the same values (x + y, y + x): costs the same
        new = _reachable(children, choice, kids, live)  # what the graph does not compute yet
        added = set(new)
        keep = {k for c in (*children, *new) for k in (c, *kids[(c, choice[c])])}  # what the new choice still reads
        move = {cls: i}
        gain = saved(cls, keep) - own(cls, i)[0] - sum(own(c, choice[c])[0] for c in new)
        for c in new:  # others that could read the new values
            for p, j in readers.get(c, ()):
                if p in live and p not in move and j != choice[p] and fits(p, j):
                    extra = [e for e in _reachable(kids[(p, j)], choice, kids, live) if e not in added]
                    g = saved(p, keep) - own(p, j)[0] - sum(own(e, choice[e])[0] for e in extra)
                    if g > 0:
                        move[p], gain = j, gain + g
                        added.update(extra)
        if gain > best_gain:
            best, best_gain = (move, children), gain
    return best


def _improve(choice: dict, nodes_of, kids: dict, readers: dict, own, known: dict, roots: list) -> None:
    """Switch e-classes, alone or in groups, where the graph as chosen so far gets cheaper.

    A candidate e-node that reads values the graph does not compute yet (a merged GEMM and its
    split) costs those values in full; every other e-class with an e-node reading them joins the
    move when that alone saves it something (the other members of the merge). The move is made
    when the graph's cost goes down: the candidates' own costs and the new values against the
    current choices and what only they read. So three GEMMs become one merged GEMM when the three
    together gain, and a fourth sibling does not pay for a merge that only it would read.

    No cycle: a class switches to an e-node only when no chosen path leads from the e-node's
    children back to the class (a search pruned by a topological index of the current choice,
    sorted again after each move).
    """
    moves = 0
    for _ in range(IMPROVEMENT_PASSES):
        live = set(_reachable([r for r in roots if r in choice], choice, kids, set()))
        index = _topological(choice, kids)
        reads: dict = {}  # e-class -> how many live choices read it
        for cls in live:
            for c in kids[(cls, choice[cls])]:
                reads[c] = reads.get(c, 0) + 1

        def saved(cls, keep):
            """What leaving the current choice of ``cls`` saves: its own cost, and that of the
            children only it reads (unless the replacement reads them too: ``keep``)."""
            return own(cls, choice[cls])[0] + sum(own(c, choice[c])[0] for c in kids[(cls, choice[cls])]
                                                  if reads.get(c, 0) == 1 and c not in keep)

        def fits(cls, i) -> bool:
            return not _reaches(kids[(cls, i)], cls, choice, kids, index)

        switched = False
        for cls in sorted(live, key=index.__getitem__):
            if len(nodes_of(cls)) == 1:
                continue  # nothing to switch to
            best = _best_move(cls, choice, nodes_of, kids, readers, own, live, saved, fits)
            if best is None:
                continue
            move, children = best
            for p, j in move.items():
                for c in kids[(p, choice[p])]:
                    reads[c] -= 1
                choice[p] = j
                folds = own(p, j)[1]
                if folds is not None:
                    known[p] = folds
                else:
                    known.pop(p, None)
            new = _reachable(children, choice, kids, live)
            live.update(new)
            for p in [*new, *move]:  # what now reads what
                for c in kids[(p, choice[p])]:
                    reads[c] = reads.get(c, 0) + 1
            switched, moves = True, moves + 1
            if moves >= MAX_MOVES:
                return
            index.clear()
            index.update(_topological(choice, kids))
        if not switched:
            return


VARIANT_PICKS = ("cheapest", "costliest", "random")
MAX_VARIANT_SWITCHES = 4096  # e-classes switched per variant (each re-sorts the choice: O(graph))
RANDOM_WRAP_CHANCE = 0.3  # a random variant wraps a live e-class in one of its cyclic e-nodes this often


def extract_variant(snap: Snapshot, tables: Tables, roots: list, pick: str = "cheapest",
                    seed: int = 0) -> tuple[dict, dict]:
    """One of the many graphs the e-graph holds: ``(choice, wraps)`` for `rebuild`.

    ``choice`` maps every e-class reachable from ``roots`` to an e-node, as `extract` does;
    ``wraps`` maps some e-classes to a second e-node that reads the e-class itself (``x * 1`` in the
    class of ``x``, ``t(t(x))``): the rebuilt graph computes the class by its chosen e-node, then
    once more through the wrap, and readers use the wrapped value. One e-node per e-class can never
    give back ``x * 1`` or ``t(t(x))`` (an identity rule puts both forms in one e-class, so either
    would read itself); a wrap can.

    ``pick``: ``"cheapest"`` is `extract`'s graph (what the optimizer keeps; no wraps);
    ``"costliest"`` starts from the Dijkstra selection, switches each live e-class, children first,
    to its e-node of the highest own cost that closes no cycle (two GEMMs over one merged GEMM, a
    decomposed GELU over the fused one), then wraps each live e-class in its costliest cyclic call;
    ``"random"`` switches each live e-class to an e-node drawn with ``random.Random(seed)`` and
    wraps about `RANDOM_WRAP_CHANCE` of them. Every switch keeps the chosen e-nodes a DAG (the check
    `_improve` makes); classes that become live through a switch are switched too. Used by
    `rewrite.testing.check_backend` to hand a compiler several different graphs of equal value.
    """
    if pick not in VARIANT_PICKS:
        raise ValueError(f"pick={pick!r}: use one of {list(VARIANT_PICKS)}")
    if pick == "cheapest":
        return extract(snap, tables, roots), {}
    rng = random.Random(seed)
    choice, kids, _readers, own, _known = _cheapest(snap, tables, roots)
    classes = snap.classes
    live_roots = [r for r in roots if r in choice]
    index = _topological(choice, kids)
    todo = sorted(_reachable(live_roots, choice, kids, set()), key=index.__getitem__)  # children first
    if pick == "random":
        rng.shuffle(todo)
    seen, switches = set(), 0
    while todo and switches < MAX_VARIANT_SWITCHES:
        cls = todo.pop(0)
        if cls in seen:
            continue
        seen.add(cls)
        options = [i for i in range(len(classes[cls])) if all(c in choice for c in kids[(cls, i)])]
        if len(options) < 2:
            continue
        if pick == "costliest":
            options.sort(key=lambda i: (-own(cls, i)[0], -len(kids[(cls, i)]), -i))  # ties: newer forms
        else:
            rng.shuffle(options)
        for i in options:
            if i == choice[cls]:
                break  # the current e-node ranks first among those left: keep it
            if not _reaches(kids[(cls, i)], cls, choice, kids, index):
                choice[cls] = i
                switches += 1
                index = _topological(choice, kids)
                todo.extend(c for c in _reachable(kids[(cls, i)], choice, kids, seen) if c not in seen)
                break
    wraps: dict = {}
    live = sorted(_reachable(live_roots, choice, kids, set()), key=index.__getitem__)
    for cls in live:
        if not is_call(classes[cls][choice[cls]].op):
            continue  # an input keeps its identity: an update (copy_) must write to the input itself
        cyclic = [i for i in range(len(classes[cls])) if i != choice[cls] and is_call(classes[cls][i].op)
                  and all(c in choice for c in kids[(cls, i)]) and _reaches(kids[(cls, i)], cls, choice, kids, index)]
        if not cyclic:
            continue
        if pick == "costliest":
            wraps[cls] = classes[cls][max(cyclic, key=lambda i: (own(cls, i)[0], -i))]
        elif rng.random() < RANDOM_WRAP_CHANCE:
            wraps[cls] = classes[cls][rng.choice(cyclic)]
    return {cls: classes[cls][i] for cls, i in choice.items()}, wraps
