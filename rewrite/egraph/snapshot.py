"""A read-only view of the e-graph: e-classes, their e-nodes, and their analyses.

Built from ``egraph.freeze()``: a few milliseconds and ~50 ms of row iteration for a 10,000-node
graph, against ~0.6 s for ``serialize(...).to_json()`` + ``json.loads`` (measured here). Used by
extraction (every e-class), and to infer metas of e-classes that rules created (``for_inference``:
only what inference reads, a small part of a large graph's e-graph).

An e-class is named by ``(sort, Value)``. An e-node's children are ``(sort, Value)`` pairs too;
primitive ones (op names, stream tags, integers) are decoded on demand by `Snapshot.string`.
"""
from __future__ import annotations

from typing import NamedTuple

from .terms import ANALYSES

# E-nodes that stand for a Python value rather than a computed tensor or size.
VALUE_OPS = frozenset({"Int", "Flt", "Atom", "Lst", "Tup", "Opaque"})

_PRIMITIVE_SORTS = {"String": "value_to_string", "i64": "value_to_i64", "f64": "value_to_f64", "bool": "value_to_bool"}


def _cached(decode, cache: dict):
    """``decode`` memoized by Value: op names and stream tags repeat on every row."""
    def get(value):
        key = (decode, value)
        out = cache.get(key)
        if out is None:
            out = cache[key] = decode(value)
        return out
    return get


class ENode(NamedTuple):
    op: str
    children: tuple  # e-class keys, or ("prim", value) for primitive arguments


class Snapshot:
    def __init__(self, egraph, for_inference: bool = False):
        """``for_inference``: index only the e-nodes meta inference and naming read: those of
        e-classes without a meta or without a ``Ref`` (what rules created), literals and lists.
        The e-classes of the graph's own nodes (a meta and a ``Ref`` each) are skipped: after
        the first rounds they are nearly all of the e-graph."""
        frozen = egraph.freeze()
        functions = frozen.functions
        self.classes: dict[tuple, list[ENode]] = {}
        self.node_table: dict[int, tuple] = {}       # reference index -> e-class (not for_inference)
        self.analysis: dict[str, dict] = {name: {} for name in ANALYSES}
        self._decoders = {sort: _cached(getattr(egraph, fn), {}) for sort, fn in _PRIMITIVE_SORTS.items()}
        self._refs: dict | None = None                # Term Value -> raw reference of its first Ref
        skip = ()
        if for_inference:
            self._refs = {}
            for row in functions["Ref"].rows:
                self._refs.setdefault(row.output, row.inputs[0])
            metas = {row.inputs[0] for row in functions["meta"].rows}
            skip = metas & self._refs.keys()  # Term Values of e-classes with a meta and a Ref
        for name, fn in functions.items():
            sorts = fn.input_sorts
            out_sort = fn.output_sort
            if name in ANALYSES:
                if not (for_inference and name == "Ref"):
                    self._analysis_rows(name, fn, sorts, out_sort)
            elif out_sort in ("Term", "TList"):  # skips rule bookkeeping and the loader's Row* relations
                classes = self.classes
                if skip and out_sort == "Term" and name not in VALUE_OPS:
                    rows = [row for row in fn.rows if row.output not in skip]
                else:
                    rows = fn.rows
                for row in rows:
                    # children stay (sort, Value) pairs; primitives are decoded only when read
                    node = ENode(name, tuple(zip(sorts, row.inputs)))
                    key = (out_sort, row.output)
                    bucket = classes.get(key)
                    if bucket is None:
                        classes[key] = [node]
                    else:
                        bucket.append(node)

    def _analysis_rows(self, name, fn, sorts, out_sort) -> None:
        if name == "Ref":
            to_int = self._decoders["i64"]
            for row in fn.rows:
                self.node_table[to_int(row.inputs[0])] = (out_sort, row.output)
        elif name == "Pending":
            for row in fn.rows:
                a, b = row.inputs
                self.analysis["Pending"].setdefault((sorts[0], a), []).append((sorts[1], b))
        elif name == "meta":
            # kept raw: most metas are never read, and decoding a string crosses into Rust
            table = self.analysis["meta"]
            for row in fn.rows:
                table[(sorts[0], row.inputs[0])] = row.output
        # the other analyses (dtype, shape, rank, sizes, splat) are read only inside egglog

    def ref_index(self, cls) -> int | None:
        """The reference number of a ``Ref`` of e-class ``cls``, or None if it has none."""
        if cls[0] != "Term":
            return None
        if self._refs is None:  # a full snapshot: node_table reversed on first use
            self._refs = {}
            for k, c in self.node_table.items():
                self._refs.setdefault(c[1], k)
        k = self._refs.get(cls[1])
        if k is None or isinstance(k, int):
            return k
        return int(self._decoders["i64"](k))  # for_inference keeps them raw: few are read

    def string(self, child) -> str | None:
        """The Python value of a primitive child, as a string (op names, stream tags, numbers)."""
        decode = self._decoders.get(child[0]) if isinstance(child, tuple) and child else None
        return None if decode is None else str(decode(child[1]))

    def is_primitive(self, child) -> bool:
        return isinstance(child, tuple) and bool(child) and child[0] in self._decoders

    def literal_text(self, child) -> str:
        """egglog text of a primitive child."""
        value = self._decoders[child[0]](child[1])
        if isinstance(value, str):
            return f'"{value}"'
        return str(value)

    def meta_key(self, cls) -> str | None:
        raw = self.analysis["meta"].get(cls)
        return None if raw is None else self._decoders["String"](raw)

    def pending(self) -> dict:
        return self.analysis["Pending"]

    def size(self) -> int:
        return sum(len(v) for v in self.classes.values())
