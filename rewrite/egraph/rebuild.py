"""Chosen e-nodes -> a new IR Graph with the input's placeholders (order, names) and output structure.

Nodes are built by an explicit-stack post-order walk (no recursion, so a 10,000-deep chain is
fine). A rebuilt node that computes the same op on the same stream as an original node of its
e-class takes that node's name and attrs, so dumps and module paths stay readable. Pinned nodes are
re-created from their original node with their arguments remapped. Emission order: the
nondeterministic pinned nodes in their original order (the random stream is consumed as in
eager), then the collectives other than ``wait_tensor`` in their original order (the ranks issue
them in one order), then everything the outputs need, then everything the side effects read (unless it reads
a side effect itself), then the side effects in their original order: functional graphs mutate
inputs only at their tail, after every read, so no value may be computed between two writes.
"""
from __future__ import annotations

from ..ir import Graph, Node, map_nodes, meta_of_value
from ..ops import is_nondeterministic, issues_collective, split_args, strip_defaults, target_from_name, target_name
from .decode import VALUE_OPS, Decoder
from .load import Loaded
from .snapshot import ENode, Snapshot
from .terms import Tables, is_call


class Rebuilder:
    def __init__(self, snap: Snapshot, tables: Tables, choice: dict[str, ENode], loaded: Loaded, source: Graph,
                 wraps: dict[str, ENode] | None = None):
        self.snap = snap
        self.tables = tables
        self.choice = choice
        self.wraps = dict(wraps or {})  # e-class -> a call computing it again from itself (extract_variant)
        self.loaded = loaded
        self.source = source
        self.dec = Decoder(snap, tables)
        self.graph = Graph(source.name)
        self.graph.symbols = dict(source.symbols)
        self.values: dict[str, object] = {}       # e-class -> built value (Node or Python value)
        self.originals: dict[str, list[Node]] = {}
        for k, cls in snap.node_table.items():
            if k < len(loaded.nodes):  # references past the nodes name argument values
                self.originals.setdefault(cls, []).append(loaded.nodes[k])
        self.placeholders = []
        for p in source.placeholders:
            q = Node("placeholder", meta=p.meta, attrs=dict(p.attrs), name=p.name)
            self.placeholders.append(self.graph.add(q))
        self.body: list[Node] = []
        self._names = {p.name for p in source.placeholders}

    def class_of(self, node: Node) -> str:
        return self.snap.node_table[self.loaded.index[node.id]]

    # -- walking ------------------------------------------------------------------------------
    def deps(self, cls: str) -> list[str]:
        node = self.choice[cls]
        if is_call(node.op):
            return self.dec.call_parts(node)[1]
        if node.op in ("Lst", "Tup", "Pinned"):
            return self.dec.list_items(node.children[-1])
        return []

    def build(self, root: str):
        stack = [root]
        while stack:
            cls = stack[-1]
            if isinstance(cls, tuple):  # ("wrap", e-class): its value is built; compute it again through the wrap
                wrapped = cls[1]
                missing = [d for d in self.dec.call_parts(self.wraps[wrapped])[1] if d not in self.values]
                if missing:
                    stack.extend(reversed(missing))
                    continue
                stack.pop()
                self.values[wrapped] = self.make_call(wrapped, self.wraps.pop(wrapped))
                continue
            if cls in self.values:
                stack.pop()
                continue
            missing = [d for d in self.deps(cls) if d not in self.values]
            if missing:
                stack.extend(reversed(missing))
                continue
            stack.pop()
            self.values[cls] = self.make(cls)
            if cls in self.wraps and isinstance(self.values[cls], Node):
                stack.append(("wrap", cls))
        return self.values[root]

    # -- making one value ---------------------------------------------------------------------
    def make(self, cls: str):
        node = self.choice[cls]
        op = node.op
        if op == "Input":
            return self.placeholders[int(self.snap.string(node.children[0]))]
        if op == "Const":
            value = self.tables.constants[int(self.snap.string(node.children[0]))]
            orig = next((o for o in self.originals.get(cls, ()) if o.kind == "constant"), None)
            attrs = dict(orig.attrs) if orig is not None else {}
            attrs["value"] = value
            return self.emit(Node("constant", meta=self.meta(cls, orig), attrs=attrs,
                                  name=orig.name if orig is not None else None))
        if op in VALUE_OPS:
            return self.dec.literal(node, lambda c: self.values[c])
        if op == "Pinned":
            return self.make_pinned(cls, node)
        if is_call(op):
            return self.make_call(cls, node)
        raise ValueError(f"cannot rebuild e-node {op}")

    def meta(self, cls: str, orig: Node | None):
        m = self.dec.meta(cls)
        return m if m is not None else (orig.meta if orig is not None else None)

    def make_call(self, cls: str, node: ENode) -> Node:
        op_name, arg_classes, stream = self.dec.call_parts(node)
        target = target_from_name(op_name)
        args, kwargs = split_args(target, [self.values[c] for c in arg_classes])
        args, kwargs = strip_defaults(target, args, kwargs)
        tag = self.tables.streams.get(stream) if stream else None
        orig = next((o for o in self.originals.get(cls, ())
                     if o.kind == "call" and (o.target is target or target_name(o.target) == op_name)
                     and o.stream == tag), None)
        new = Node("call", target, args, kwargs, self.meta(cls, orig), orig.attrs if orig is not None else None,
                   name=orig.name if orig is not None else None, stream=tag)
        return self.emit(new)

    def make_pinned(self, cls: str, node: ENode) -> Node:
        k = int(self.snap.string(node.children[0]))
        orig = self.loaded.nodes[k]
        built = {d.id: self.values[c] for d, c in zip(orig.deps, self.deps(cls))}
        remap = lambda n: built[n.id]  # noqa: E731
        waits = [built[w.id] for w in orig.waits if isinstance(built.get(w.id), Node)]
        new = Node("call", orig.target, map_nodes(orig.args, remap), map_nodes(orig.kwargs, remap),
                   orig.meta, dict(orig.attrs), name=orig.name, waits=waits)
        return self.emit(new)

    def emit(self, node: Node) -> Node:
        if node.name in self._names:
            node.name = f"{node.name}_{node.id}"
        self._names.add(node.name)
        self.graph.add(node)
        return node

    # -- the whole graph ----------------------------------------------------------------------
    def run(self) -> Graph:
        pinned = [self.loaded.nodes[k] for k in self.loaded.pinned]
        side = {self.loaded.nodes[k].id for k in self.loaded.side_effects}
        random = [n for n in pinned if is_nondeterministic(n.target) and n.id not in side]
        live = self.live_classes([self.class_of(n) for n in self.output_nodes()]
                                 + [self.class_of(n) for n in pinned if n.id in side])
        for n in random:
            if self.class_of(n) in live:
                self.build(self.class_of(n))
        # Collectives in their original order: every rank must issue them in one order (its process
        # group pairs the ranks' calls by sequence), and building the outputs first would issue them
        # in the order the outputs read them. Their waits are built where their results are needed.
        for n in pinned:
            if n.id in side and issues_collective(n.target):
                self.build(self.class_of(n))
        outputs = map_nodes(self.source.outputs, self.output_value)
        effects = [self.class_of(n) for n in pinned if n.id in side]
        # Every value a side effect reads is built before the first side effect writes: building
        # each effect's inputs just before it would compute a later copy_'s input after an
        # earlier copy_ had overwritten the placeholder that input reads.
        after = self.after_effects(effects)
        for cls in effects:
            for d in self.deps(cls):
                if d not in after:
                    self.build(d)
        for cls in effects:
            self.build(cls)
        self.graph.set_output(outputs)
        self.graph.validate()
        return self.graph

    def output_value(self, n: Node) -> Node:
        """The rebuilt output for original output ``n``; a value that became a Python literal
        (a size folded to a number) is returned through a constant node, as before."""
        value = self.build(self.class_of(n))
        if isinstance(value, Node):
            return value
        return self.emit(Node("constant", meta=meta_of_value(value), attrs={"value": value}))

    def output_nodes(self) -> list[Node]:
        out = []
        map_nodes(self.source.outputs, lambda n: out.append(n) or n)
        return out

    def after_effects(self, effects: list[str]) -> set[str]:
        """Classes that are side effects or read one (directly or not): built in effect order."""
        effect_set, after, done = set(effects), set(), set()
        stack = list(effects)
        while stack:
            cls = stack[-1]
            if cls in done:
                stack.pop()
                continue
            missing = [d for d in self.deps(cls) if d not in done]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            done.add(cls)
            if cls in effect_set or any(d in after for d in self.deps(cls)):
                after.add(cls)
        return after

    def live_classes(self, roots: list[str]) -> set[str]:
        live: set[str] = set()
        stack = list(roots)
        while stack:
            cls = stack.pop()
            if cls in live:
                continue
            live.add(cls)
            stack.extend(self.deps(cls))
        return live


def rebuild(snap, tables, choice, loaded, source: Graph, wraps: dict | None = None) -> Graph:
    return Rebuilder(snap, tables, choice, loaded, source, wraps).run()


__all__ = ["rebuild", "Rebuilder"]
