"""Reading e-classes back as Python: argument values and metas.

An e-node's argument list is a cons list of e-classes; `Decoder.args` walks it without recursion
(a ``cat`` of a thousand tensors is a thousand-deep list).
"""
from __future__ import annotations

import sympy

from ..ir import SymMeta
from .snapshot import VALUE_OPS, ENode, Snapshot
from .terms import Tables


class Decoder:
    def __init__(self, snap: Snapshot, tables: Tables):
        self.snap = snap
        self.tables = tables

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

    def call_parts(self, node: ENode) -> tuple[str, tuple, str]:
        """(op name, argument e-classes, stream string) of a Call e-node.

        Remembered per e-node (in the snapshot): extraction and rebuilding ask for each chosen
        call several times."""
        entry = self.snap.call_parts.get(id(node))
        if entry is not None and entry[0] is node:
            return entry[1]
        op_cls, stream_cls = node.children[0], node.children[-1]
        args = tuple(self.list_items(node.children[1])) if node.op == "CallN" else node.children[1:-1]
        parts = (self.snap.string(op_cls), args, self.snap.string(stream_cls))
        self.snap.call_parts[id(node)] = (node, parts)  # the e-node is held: its id cannot be reused
        return parts

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


def literal_meta(node: ENode, snap: Snapshot):
    """Metas of scalar literals, so a size expression can be replaced by a literal."""
    if node.op == "Int":
        return SymMeta(sympy.Integer(int(snap.string(node.children[0]))), int)
    if node.op == "Flt":
        return SymMeta(sympy.Float(float(snap.string(node.children[0]))), float)
    return None
