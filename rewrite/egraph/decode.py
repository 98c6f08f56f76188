"""Reading e-classes back as Python: argument values, metas, and egglog handles for e-classes.

An e-node's argument list is a cons list of e-classes; `Decoder.args` walks it without recursion
(a ``cat`` of a thousand tensors is a thousand-deep list).
"""
from __future__ import annotations

import sympy

from ..dsl import target_from_name
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


def split_args(target, values: list) -> tuple[list, dict]:
    """Canonical flat argument list -> (args, kwargs) by the target's schema."""
    import torch

    if not isinstance(target, torch._ops.OpOverload):
        return list(values), {}
    args, kwargs = [], {}
    i = 0
    for a in target._schema.arguments:
        if i >= len(values):
            break
        if a.kwarg_only:
            kwargs[a.name] = values[i]
        else:
            args.append(values[i])
        i += 1
    return args, kwargs


def strip_defaults(target, args: list, kwargs: dict) -> tuple[tuple, dict]:
    """Drop trailing arguments equal to their schema default, so rebuilt calls read like eager ones."""
    import torch

    if not isinstance(target, torch._ops.OpOverload):
        return tuple(args), kwargs
    schema_args = target._schema.arguments
    positional = [a for a in schema_args if not a.kwarg_only]
    args = list(args)
    while args and len(args) <= len(positional):
        a = positional[len(args) - 1]
        if a.has_default_value() and _is_default(args[-1], a.default_value):
            args.pop()
        else:
            break
    out_kwargs = {}
    for a in schema_args:
        if a.kwarg_only and a.name in kwargs:
            v = kwargs[a.name]
            if not (a.has_default_value() and _is_default(v, a.default_value)):
                out_kwargs[a.name] = v
    return tuple(args), out_kwargs


def _is_default(value, default) -> bool:
    from ..ir import Node

    if isinstance(value, Node) or isinstance(default, Node):
        return False
    if isinstance(value, (list, tuple)) and isinstance(default, (list, tuple)):
        return list(value) == list(default) and all(type(x) is type(y) for x, y in zip(value, default))
    return type(value) is type(default) and value == default


def target_of(op_name: str):
    return target_from_name(op_name)
