"""IR graph -> egglog, one short command per node through the node table (DESIGN.md's fast path).

Every IR node #k becomes ``(set (node k) <term>)`` followed by its analyses (meta, dtype, shape,
rank; splat for constants; sizes for list arguments), parsed a node at a time: parsing one big
program is quadratic. Nodes whose terms are textually equal are CSE'd here already (they would
hash-cons to one e-class anyway); the count goes to the report as "cse".
"""
from __future__ import annotations

import dataclasses
import logging

import torch

from ..dsl import canonical_call, dtype_str, register_target, shape_key, splat_key, target_name
from ..ir import Graph, Node, SymMeta, TensorMeta, is_side_effect, iter_nodes
from ..rules.cse import constant_key
from .terms import Tables, Unencodable, call_term, list_term, literal_term, quote

log = logging.getLogger("rewrite")

SPLAT_SIZE_LIMIT = 1 << 20
BATCH_COMMANDS = 16  # commands per egglog call while loading (measured best of 1, 16, 256)


@dataclasses.dataclass
class Loaded:
    """What the loader learnt about the graph: node indices, pinned nodes, CSE count."""

    index: dict[int, int]                 # IR node id -> node-table index k
    nodes: list[Node]                     # node-table index -> original IR node
    pinned: list[int]                     # node-table indices of pinned nodes, in graph order
    side_effects: list[int]               # pinned nodes that must survive without readers
    cse: int = 0
    commands: int = 0


def is_nondeterministic(node: Node) -> bool:
    t = node.target
    return isinstance(t, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in t.tags


def must_pin(node: Node) -> bool:
    """Nodes rules must not touch or merge: side effects, randomness, explicit waits, mutation."""
    if node.kind != "call":
        return False
    t = node.target
    return (is_side_effect(node) or is_nondeterministic(node) or bool(node.attrs.get("wait_for"))
            or (isinstance(t, torch._ops.OpOverload) and t._schema.is_mutable)
            or (not isinstance(t, torch._ops.OpOverload) and bool(node.kwargs)))


class Loader:
    def __init__(self, egraph, tables: Tables):
        self.egraph = egraph
        self.tables = tables
        self.loaded = Loaded({}, [], [], [])
        self._const_index: dict = {}
        self._seen_terms: dict[str, int] = {}
        self._splat_done: set[str] = set()
        self._batch: list[str] = []

    def run(self, cmds: list[str]) -> None:
        """Queue commands; they are sent in batches of a few nodes (each egglog call has a fixed
        cost that grows with the number of declared tables, and one huge program parses in
        quadratic time)."""
        self._batch.extend(cmds)
        self.loaded.commands += len(cmds)
        if len(self._batch) >= BATCH_COMMANDS:
            self.flush()

    def flush(self) -> None:
        if self._batch:
            self.egraph.run_program(*self.egraph.parse_program("".join(self._batch)))
            self._batch = []

    def node_term(self, node: Node) -> str:
        return f"(node {self.loaded.index[node.id]})"

    def load(self, graph: Graph) -> Loaded:
        placeholder_index = {p.id: i for i, p in enumerate(graph.placeholders)}
        for node in graph.nodes:
            if node.kind == "output":
                continue
            k = len(self.loaded.nodes)
            self.loaded.index[node.id] = k
            self.loaded.nodes.append(node)
            cmds: list[str] = []
            if node.kind == "placeholder":
                term = f"(Input {placeholder_index[node.id]})"
            elif node.kind == "constant":
                term = self.constant_term(node, cmds)
            else:
                term = None if must_pin(node) else self.call_term(node, cmds)
                if term is None:
                    term = self.pinned_term(node, k)
                    self.loaded.pinned.append(k)
                    if is_side_effect(node):
                        self.loaded.side_effects.append(k)
            previous = self._seen_terms.get(term)
            if previous is not None and node.kind == "call":
                self.loaded.cse += 1
            else:
                self._seen_terms.setdefault(term, k)
            cmds.insert(0, f"(set (node {k}) {term})")
            cmds.extend(self.meta_commands(f"(node {k})", node.meta))
            self.run(cmds)
        self.flush()
        return self.loaded

    # -- terms ------------------------------------------------------------------------------
    def constant_term(self, node: Node, cmds: list[str]) -> str:
        value = node.value
        if not isinstance(value, torch.Tensor):
            try:
                return literal_term(value, self.tables, self.node_term)
            except Unencodable:
                return self.tables.opaque_term(value)
        key = constant_key(value)
        idx = self._const_index.get(key)
        if idx is None:
            idx = len(self.tables.constants)
            self.tables.constants.append(value)
            self._const_index[key] = idx
            if value.numel() <= SPLAT_SIZE_LIMIT:
                s = splat_key(value)
                if s is not None:
                    cmds.append(f'(set (splat (Const {idx})) "{s}")')
        return f"(Const {idx})"

    def call_term(self, node: Node, cmds: list[str]) -> str | None:
        """The Call term of an unpinned node, or None if an argument has no term form."""
        try:
            args, kwargs = canonical_call(node.target, node.args, node.kwargs)
            values = list(args) + list(kwargs.values())
            items = [literal_term(v, self.tables, self.node_term) for v in values]
        except (Unencodable, ValueError) as e:
            log.debug("e-graph: node %s (%s) kept opaque: %s", node.name, node.op, e)
            return None
        for v, item in zip(values, items):
            self.literal_analyses(v, item, cmds)
        stream = self.tables.stream(node.attrs.get("stream"))
        register_target(node.target)
        return call_term(target_name(node.target), items, quote(stream))

    def pinned_term(self, node: Node, k: int) -> str:
        deps = list(node.inputs) + [w for w in node.attrs.get("wait_for", ()) if isinstance(w, Node)]
        return f"(Pinned {k} {list_term([self.node_term(d) for d in deps])})"

    # -- analyses -----------------------------------------------------------------------------
    def literal_analyses(self, value, term: str, cmds: list[str]) -> None:
        """``sizes`` of size lists and ``splat`` of scalar literals, so conditions can see them."""
        if isinstance(value, (list, tuple)) and value:
            sizes = []
            for v in value:
                if isinstance(v, Node) and isinstance(v.meta, SymMeta) and v.meta.pytype is int:
                    sizes.append(v.meta.expr)
                elif isinstance(v, int) and not isinstance(v, bool):
                    sizes.append(v)
                else:
                    return
            key = shape_key(sizes)
            if len(key) < 200 and '"' not in key:
                cmds.append(f'(set (sizes {term}) "{key}")')
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and term not in self._splat_done:
            s = splat_key(value)
            if s is not None:
                self._splat_done.add(term)
                cmds.append(f'(set (splat {term}) "{s}")')

    def meta_commands(self, handle: str, meta) -> list[str]:
        return meta_commands(self.tables, handle, meta)


def meta_commands(tables: Tables, handle: str, meta) -> list[str]:
    """egglog commands that record ``meta`` for the e-class named by ``handle``."""
    key = tables.meta_key(meta)
    if key is None:
        return []
    cmds = [f'(set (meta {handle}) "{key}")']
    if isinstance(meta, TensorMeta) and key not in tables.described:
        tables.described.add(key)
        skey = shape_key(meta.shape)
        cmds.append(f'(set (dtype "{key}") "{dtype_str(meta.dtype)}")')
        cmds.append(f'(set (rank "{key}") {len(meta.shape)})')
        if len(skey) < 200 and '"' not in skey:
            cmds.append(f'(set (shape "{key}") "{skey}")')
    return cmds


def load_graph(egraph, tables: Tables, graph: Graph) -> Loaded:
    return Loader(egraph, tables).load(graph)


__all__ = ["Loaded", "load_graph", "must_pin", "meta_commands", "is_nondeterministic", "iter_nodes"]
