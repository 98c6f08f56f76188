"""Naming e-classes from Python in bulk: the metas of new e-classes go in as rows, like the graph.

Meta inference (`rewrite.egraph.saturate`) sets the meta of e-classes that rules created. egglog
is told which e-class by a term that denotes it, and one command per e-class costs ~0.1 ms however
commands are grouped (5,000 new e-classes in a 50,000-node graph: 0.5 s). Instead each e-class to
set gets a number, and rows say how egglog finds it from what it can look up::

    NameRef x k                  x names the e-class of (Ref k)
    NameCall2 x op a b s         x names the e-class of (Call2 op A B s), A and B named a and b
    NameInt x 3, NameCons l h t  ...one relation per term constructor
    NameMeta x key               the meta of the e-class named x is key

The ``name`` ruleset resolves them by lookups only (``(Named x class)``; no term is built and no
e-class merged, so the e-graph is exactly what the commands made) and sets the metas. A name
resolves after as many iterations as it is deep, so the ruleset runs to saturation.

Which e-classes get a meta is exactly what the commands did: an e-class is spelled by its first
e-node down to e-classes that have a ``Ref``, and one whose spelling is deeper than
`MAX_DEPTH` (or cyclic) gets none.
"""
from __future__ import annotations

import re

from .snapshot import Snapshot
from .terms import PRELUDE

# E-nodes on the longest path of a spelling, at most (deeper ones were never set: a command nested
# that deep parses slowly, and a cyclic e-class has no finite spelling).
MAX_DEPTH = 201

_NAMED = {"Term": "Named", "TList": "LNamed"}  # how a named e-class of each sort is looked up


def _constructors() -> dict[str, tuple[tuple, str]]:
    """Term constructors of the prelude: name -> (input sorts, output sort); ``Ref``/``LRef`` are
    the loader's names, not spellings."""
    out = {}
    for m in re.finditer(r"^\(constructor (\w+) \(([^)]*)\) (\w+)\)$", PRELUDE, re.M):
        if m.group(1) not in ("Ref", "LRef"):
            out[m.group(1)] = (tuple(m.group(2).split()), m.group(3))
    return out


def _name_rule(op: str, sorts: tuple, out_sort: str) -> list[str]:
    """``Name<op>``: a row per e-class spelled with ``op``; its e-class arguments are names."""
    cols = [f"c{i}" for i in range(len(sorts))]
    lookups = [f"({_NAMED[s]} {c} v{i})" for i, (s, c) in enumerate(zip(sorts, cols)) if s in _NAMED]
    args = [f"v{i}" if s in _NAMED else c for i, (s, c) in enumerate(zip(sorts, cols))]
    relation = " ".join(["i64"] + ["i64" if s in _NAMED else s for s in sorts])
    query = " ".join([f"(Name{op} {' '.join(['x'] + cols)})", *lookups, f"(= v ({' '.join([op] + args)}))"])
    return [f"(relation Name{op} ({relation}))",
            f"(rule ({query}) (({_NAMED[out_sort]} x v)) :ruleset name)"]


# Declared once per engine, after the term language.
NAME_PRELUDE = "\n".join([
    "(ruleset name)",
    "(relation Named (i64 Term))",
    "(relation LNamed (i64 TList))",
    "(relation NameRef (i64 i64))", "(rule ((NameRef x k) (= v (Ref k))) ((Named x v)) :ruleset name)",
    "(relation NameMeta (i64 String))", "(rule ((NameMeta x m) (Named x v)) ((set (meta v) m)) :ruleset name)",
] + [line for op, (sorts, out) in _constructors().items() for line in _name_rule(op, sorts, out)])


class Namer:
    """Numbers and rows naming e-classes of one snapshot; numbers start at ``first`` (a name is
    never reused while the e-graph lives: two e-classes under one number would read as one)."""

    def __init__(self, snap: Snapshot, first: int):
        self.snap = snap
        self.next = first
        self.rows: dict[str, list[str]] = {}
        self._names: dict[int, int] = {}    # e-class -> its number
        self._depths: dict[int, object] = {}  # e-class -> e-nodes spelled below it (None: cyclic; OPEN: being walked)

    def can_name(self, cls: int) -> bool:
        depth = self._depth(cls)
        return depth is not None and depth <= MAX_DEPTH

    def set_meta(self, cls: int, key: str) -> None:
        self._row("NameMeta", self.name(cls), key)

    def name(self, cls: int) -> int:
        """The number of e-class ``cls`` (its rows, and those of what it is spelled with, once)."""
        names = self._names
        if cls in names:
            return names[cls]
        stack = [cls]  # post-order without recursion: spellings may be 200 deep
        while stack:
            c = stack[-1]
            if c in names:
                stack.pop()
                continue
            ref = self.snap.ref_index(c)
            if ref is not None:
                names[c] = x = self._fresh()
                self._row("NameRef", x, ref)
                stack.pop()
                continue
            node = self.snap.classes[c][0]
            missing = [k for k in _classes_in(node) if k not in names]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            # snapshot children: e-class numbers (int) or the text of primitives (str)
            cols = [k if isinstance(k, str) else names[k] for k in node.children]
            names[c] = x = self._fresh()
            self._row(f"Name{node.op}", x, *cols)
        return names[cls]

    def _fresh(self) -> int:
        self.next += 1
        return self.next - 1

    def _row(self, relation: str, *cols) -> None:
        self.rows.setdefault(relation, []).append("\t".join(map(str, cols)))

    def _depth(self, cls: int):
        """How many e-nodes deep the spelling of ``cls`` goes (0: a Ref names it)."""
        depths = self._depths
        if cls in depths and depths[cls] is not _OPEN:
            return depths[cls]
        stack = [cls]
        while stack:
            c = stack[-1]
            state = depths.get(c)
            if c in depths and state is not _OPEN:
                stack.pop()
                continue
            if self.snap.ref_index(c) is not None:
                depths[c] = 0
                stack.pop()
                continue
            children = _classes_in(self.snap.classes[c][0])
            if state is None:
                depths[c] = _OPEN
                stack.extend(k for k in children if k not in depths)
                continue
            stack.pop()  # every child is done, or open: on the walk's path, a cycle
            child_depths = [depths[k] for k in children]
            depths[c] = (None if any(d is None or d is _OPEN for d in child_depths)
                         else 1 + max(child_depths, default=0))
        return depths[cls]


_OPEN = object()


def _classes_in(node) -> list[int]:
    return [k for k in node.children if not isinstance(k, str)]
