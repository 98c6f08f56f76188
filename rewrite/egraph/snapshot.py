"""A read-only view of a serialized e-graph: e-classes, their e-nodes, and their analyses.

Built from ``egraph.serialize([]).to_json()`` (milliseconds even for big graphs). Used twice:
to find e-classes created by rules that still lack a meta, and by extraction.
"""
from __future__ import annotations

import json
from typing import NamedTuple

from .terms import ANALYSES


class ENode(NamedTuple):
    op: str
    children: tuple  # e-class ids (Term / TList / primitive classes)


class Snapshot:
    def __init__(self, egraph):
        raw = json.loads(egraph.serialize([]).to_json())["nodes"]
        node_class = {nid: n["eclass"] for nid, n in raw.items()}
        self.classes: dict[str, list[ENode]] = {}
        self.primitive: dict[str, str] = {}          # primitive class -> literal text as egglog prints it
        self.node_table: dict[int, str] = {}         # IR node index -> e-class
        self.analysis: dict[str, dict] = {name: {} for name in ANALYSES}
        for nid, n in raw.items():
            if nid.startswith("primitive-"):
                self.primitive[n["eclass"]] = n["op"]
        for nid, n in raw.items():
            op, cls = n["op"], n["eclass"]
            if cls in self.primitive:
                continue
            children = tuple(node_class[c] for c in n["children"])
            if op == "node":
                self.node_table[int(self.primitive[children[0]])] = cls
            elif op == "Pending":
                self.analysis["Pending"].setdefault(children[0], []).append(children[1])
            elif op in ANALYSES:
                self.analysis[op][children[0]] = self.string(cls)
            else:
                self.classes.setdefault(cls, []).append(ENode(op, children))

    def string(self, cls: str) -> str | None:
        """The Python value of a primitive class: strings unquoted, numbers as text."""
        text = self.primitive.get(cls)
        if text is None:
            return None
        return text[1:-1] if text.startswith('"') else text

    def meta_key(self, cls: str) -> str | None:
        return self.analysis["meta"].get(cls)

    def pending(self) -> dict:
        return self.analysis["Pending"]

    def size(self) -> int:
        return sum(len(v) for v in self.classes.values())
