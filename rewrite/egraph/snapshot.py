"""A read-only view of the e-graph: e-classes, their e-nodes, and their analyses.

Built from ``egraph.freeze()``: a few milliseconds and ~50 ms of row iteration for a 10,000-node
graph, against ~0.6 s for ``serialize(...).to_json()`` + ``json.loads`` (measured here). Used by
extraction (every e-class), and to infer metas of e-classes that rules created (``for_inference``:
only what inference reads, a small part of a large graph's e-graph).

An e-class is named by an int, numbered here. An e-node's children are e-class numbers, and its
primitive arguments (op names, stream tags, integers) their text, as `Snapshot.string` gives them.
egglog's own ``(sort, Value)`` handles are translated once per row: hashing one runs Rust code
through Python, and extraction hashes e-class names millions of times.
"""
from __future__ import annotations

from typing import NamedTuple

from .terms import ANALYSES

# E-nodes that stand for a Python value rather than a computed tensor or size.
VALUE_OPS = frozenset({"Int", "Flt", "Atom", "Lst", "Tup", "Opaque"})

_PRIMITIVE_SORTS = {"String": "value_to_string", "i64": "value_to_i64", "f64": "value_to_f64", "bool": "value_to_bool"}


def _text_of(decode):
    """``str(decode(value))`` memoized by Value: op names and stream tags repeat on every row."""
    cache: dict = {}

    def get(value):
        out = cache.get(value)
        if out is None:
            out = cache[value] = str(decode(value))
        return out
    return get


def raw_metas(functions) -> dict:
    """The ``meta`` function of a frozen e-graph: e-class Value -> its (undecoded) meta key."""
    return {row.inputs[0]: row.output for row in functions["meta"].rows}


class ENode(NamedTuple):
    op: str
    children: tuple  # e-class numbers (int), or the text of primitive arguments (str)


class Snapshot:
    def __init__(self, egraph, for_inference: bool = False, functions=None, metas: dict | None = None):
        """``for_inference``: index only the e-nodes meta inference and naming read: those of
        e-classes without a meta or without a ``Ref`` (what rules created), literals and lists.
        The e-classes of the graph's own nodes (a meta and a ``Ref`` each) are skipped: after
        the first rounds they are nearly all of the e-graph. ``functions``: ``egraph.freeze().functions``
        (each ``.functions`` converts every table: ~30 ms for a 50,000-node graph), and ``metas``:
        `raw_metas` of them, if the caller has them already."""
        if functions is None:
            functions = egraph.freeze().functions
        self.classes: dict[int, list[ENode]] = {}
        self.node_table: dict[int, int] = {}         # reference index -> e-class (not for_inference)
        self.analysis: dict[str, dict] = {name: {} for name in ANALYSES}
        self._text = {sort: _text_of(getattr(egraph, fn)) for sort, fn in _PRIMITIVE_SORTS.items()}
        self._meta_text = _text_of(egraph.value_to_string)
        self._meta_keys: dict[int, str | None] = {}   # e-class -> its meta key, decoded once
        self._refs: dict | None = None                # e-class -> its first Ref (full snapshots)
        # for_inference: what the meta and Ref functions hold, by egglog Value; few are read, so
        # they are not translated to e-class numbers
        self._metas_by_value: dict | None = None
        self._refs_by_value: dict | None = None
        self.call_parts: dict[int, tuple] = {}        # `Decoder.call_parts` memo: id(e-node) -> (e-node, parts)
        self._ids: dict[str, dict] = {"Term": {}, "TList": {}}  # sort -> egglog Value -> e-class number
        self.values: list = []  # e-class number -> its egglog Value (what names it beyond this snapshot)
        values = self.values

        def class_of(table: dict, value) -> int:
            c = table.get(value)
            if c is None:
                c = table[value] = len(values)
                values.append(value)
            return c
        self._class_of = class_of

        skip = ()
        if for_inference:
            refs = self._refs_by_value = {}
            for row in functions["Ref"].rows:
                refs.setdefault(row.output, row.inputs[0])
            self._metas_by_value = metas if metas is not None else raw_metas(functions)
            skip = self._metas_by_value.keys() & refs.keys()  # a meta and a Ref: the graph's own nodes
        for name, fn in functions.items():
            sorts = fn.input_sorts
            out_sort = fn.output_sort
            if name in ANALYSES:
                if not (for_inference and name in ("Ref", "meta")):
                    self._analysis_rows(name, fn, sorts, out_sort)
            elif out_sort in ("Term", "TList"):  # skips rule bookkeeping and the loader's Row* relations
                rows = fn.rows
                if skip and out_sort == "Term" and name not in VALUE_OPS:
                    rows = [row for row in rows if row.output not in skip]
                self._term_rows(name, rows, sorts, self._ids[out_sort])

    def _term_rows(self, name: str, rows, sorts, out_ids: dict) -> None:
        classes, class_of = self.classes, self._class_of
        # per argument: the e-class table of its sort, or the decoder of its primitive sort
        columns = [(self._ids.get(sort), self._text.get(sort)) for sort in sorts]
        for row in rows:
            children = tuple([class_of(ids, v) if ids is not None else text(v)
                              for (ids, text), v in zip(columns, row.inputs)])
            node = ENode(name, children)
            cls = class_of(out_ids, row.output)
            bucket = classes.get(cls)
            if bucket is None:
                classes[cls] = [node]
            else:
                bucket.append(node)

    def _analysis_rows(self, name, fn, sorts, out_sort) -> None:
        class_of = self._class_of
        if name == "Ref":
            to_int, terms = self._text["i64"], self._ids["Term"]
            for row in fn.rows:
                self.node_table[int(to_int(row.inputs[0]))] = class_of(terms, row.output)
        elif name == "Pending":
            a_ids, b_ids = self._ids[sorts[0]], self._ids[sorts[1]]
            table = self.analysis["Pending"]
            for row in fn.rows:
                a, b = row.inputs
                table.setdefault(class_of(a_ids, a), []).append(class_of(b_ids, b))
        elif name == "meta":
            # kept raw: most metas are never read, and decoding a string crosses into Rust
            table, ids = self.analysis["meta"], self._ids[sorts[0]]
            for row in fn.rows:
                table[class_of(ids, row.inputs[0])] = row.output
        # the other analyses (dtype, shape, rank, sizes, splat) are read only inside egglog

    def ref_index(self, cls: int) -> int | None:
        """The reference number of a ``Ref`` of e-class ``cls``, or None if it has none."""
        if self._refs_by_value is not None:
            k = self._refs_by_value.get(self.values[cls])
            return None if k is None else int(self._text["i64"](k))
        if self._refs is None:  # node_table reversed on first use
            self._refs = {}
            for k, c in self.node_table.items():
                self._refs.setdefault(c, k)
        return self._refs.get(cls)

    @staticmethod
    def string(child) -> str | None:
        """The text of a primitive child (op names, stream tags, numbers); None for an e-class."""
        return child if isinstance(child, str) else None

    def meta_key(self, cls: int) -> str | None:
        key = self._meta_keys.get(cls, False)
        if key is False:
            if self._metas_by_value is not None:
                raw = self._metas_by_value.get(self.values[cls])
            else:
                raw = self.analysis["meta"].get(cls)
            key = self._meta_keys[cls] = None if raw is None else self._meta_text(raw)
        return key

    def pending(self) -> dict:
        return self.analysis["Pending"]

    def size(self) -> int:
        return sum(len(v) for v in self.classes.values())
