"""Reading e-classes back as Python: argument values, metas, and egglog handles for e-classes.

An e-node's argument list is a cons list of e-classes; `Decoder.args` walks it without recursion
(a ``cat`` of a thousand tensors is a thousand-deep list).
"""
from __future__ import annotations

import sympy

from ..ir import SymMeta
from .snapshot import ENode, Snapshot
from .terms import Tables

# E-nodes that stand for a Python value rather than a computed tensor or size.
VALUE_OPS = frozenset({"Int", "Flt", "Atom", "Lst", "Tup", "Opaque"})


class Decoder:
    def __init__(self, snap: Snapshot, tables: Tables):
        self.snap = snap
        self.tables = tables
        self._reverse_table: dict[str, int] | None = None

    # -- structure ----------------------------------------------------------------------------
    def list_items(self, tlist_cls: str) -> list[str]:
        """Element e-classes of a cons-list e-class."""
        out = []
        cls = tlist_cls
        while True:
            node = self.snap.classes[cls][0]
            if node.op == "Nil":
                return out
            out.append(node.children[0])
            cls = node.children[1]

    def call_parts(self, node: ENode) -> tuple[str, list[str], str]:
        """(op name, argument e-classes, stream string) of a Call e-node."""
        op_cls, stream_cls = node.children[0], node.children[-1]
        args = self.list_items(node.children[1]) if node.op == "CallN" else list(node.children[1:-1])
        return self.snap.string(op_cls), args, self.snap.string(stream_cls)

    def literal(self, node: ENode, value_of) -> object:
        """Python value of a literal e-node; ``value_of(cls)`` decodes child classes."""
        op = node.op
        if op == "Int":
            return int(self.snap.string(node.children[0]))
        if op == "Flt":
            return float(self.snap.string(node.children[0]))
        if op == "Atom":
            return self.tables.atoms[self.snap.string(node.children[0])]
        if op == "Opaque":
            return self.tables.opaque[int(self.snap.string(node.children[0]))]
        if op in ("Lst", "Tup"):
            items = [value_of(c) for c in self.list_items(node.children[0])]
            return items if op == "Lst" else tuple(items)
        raise KeyError(op)

    def meta(self, cls: str):
        key = self.snap.meta_key(cls)
        return None if key is None else self.tables.metas.get(key)

    # -- handles: egglog expressions naming an e-class ---------------------------------------
    def handle(self, cls, depth: int = 0) -> str:
        """An egglog expression that denotes e-class ``cls`` (to set analyses on new classes)."""
        if self._reverse_table is None:
            self._reverse_table = {}
            for k, c in self.snap.node_table.items():
                self._reverse_table.setdefault(c, k)
        if self.snap.is_primitive(cls):
            return self.snap.literal_text(cls)
        if cls in self._reverse_table:
            return f"(Ref {self._reverse_table[cls]})"
        if depth > 200:
            raise RecursionError("e-class handle too deep")
        node = self.snap.classes[cls][0]
        parts = " ".join(self.handle(c, depth + 1) for c in node.children)
        return f"({node.op} {parts})" if parts else f"({node.op})"


def literal_meta(node: ENode, snap: Snapshot):
    """Metas of scalar literals, so a size expression can be replaced by a literal."""
    if node.op == "Int":
        return SymMeta(sympy.Integer(int(snap.string(node.children[0]))), int)
    if node.op == "Flt":
        return SymMeta(sympy.Float(float(snap.string(node.children[0]))), float)
    return None
