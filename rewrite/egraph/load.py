"""IR graph -> egglog, in bulk: rows in tab-separated files, read by egglog's ``input`` command.

Every IR node #k and every argument value gets a reference ``(Ref r)``; the graph becomes rows of
small relations (``RowCall2 r "aten.add.Tensor" a b "stream"``, ``RowInt r 1``, ``RowMeta r
"T:float32:cpu:[8,16]"``...) and one run of the ``load`` ruleset unions each ``(Ref r)`` with the
term its row describes. Node order does not matter (references are unions, not lookups), so one
iteration loads the whole graph.

Measured here: a 20,000-node chain loads in ~0.13 s this way against ~3 s for one ``set`` command
per node (docs/design.md's node table; each command costs 0.1-0.2 ms whatever its size). Nodes whose
terms are equal get one reference (they would hash-cons to one e-class anyway); their number is
reported as "cse".
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ..cost import is_weight
from ..ir import Graph, Node, SymMeta, TensorMeta, is_side_effect
from ..ops import (ContentIndex, OpError, canonical_call, dtype_str, is_mutable, is_nondeterministic,
                   register_target, shape_key, splat_key)
from ..persist.atomic import atomic_write_text
from .terms import MAX_CALL_ARITY, Tables, Unencodable, float_key

log = logging.getLogger("rewrite")

SPLAT_SIZE_LIMIT = 1 << 20  # constants larger than this are not scanned for a splat value


def _call_row(k: int) -> tuple[str, str]:
    terms = " ".join(f"(Ref a{i})" for i in range(k))
    cols = " ".join(f"a{i}" for i in range(k))
    return (f"(relation RowCall{k} (i64 String {'i64 ' * k}String))",
            f"(rule ((RowCall{k} r op {cols} s)) ((union (Ref r) (Call{k} op {terms} s))) :ruleset load)")


# Row relations and the rules that turn rows into terms (declared once per engine).
LOAD_PRELUDE = "\n".join([
    "(ruleset load)",
    "(relation RowInput (i64 i64))", "(rule ((RowInput r i)) ((union (Ref r) (Input i))) :ruleset load)",
    "(relation RowConst (i64 i64))", "(rule ((RowConst r i)) ((union (Ref r) (Const i))) :ruleset load)",
    "(relation RowInt (i64 i64))", "(rule ((RowInt r v)) ((union (Ref r) (Int v)) (Scalar (Ref r))) :ruleset load)",
    "(relation RowFlt (i64 String))", "(rule ((RowFlt r v)) ((union (Ref r) (Flt v)) (Scalar (Ref r))) :ruleset load)",
    "(relation RowScalar (i64))", "(rule ((RowScalar r)) ((Scalar (Ref r))) :ruleset load)",
    "(relation RowAtom (i64 String))", "(rule ((RowAtom r v)) ((union (Ref r) (Atom v))) :ruleset load)",
    "(relation RowOpaque (i64 i64))", "(rule ((RowOpaque r v)) ((union (Ref r) (Opaque v))) :ruleset load)",
    "(relation RowNil (i64))", "(rule ((RowNil l)) ((union (LRef l) (Nil))) :ruleset load)",
    "(relation RowCons (i64 i64 i64))", "(rule ((RowCons l h t)) ((union (LRef l) (Cons (Ref h) (LRef t)))) :ruleset load)",
    "(relation RowLst (i64 i64))", "(rule ((RowLst r l)) ((union (Ref r) (Lst (LRef l)))) :ruleset load)",
    "(relation RowTup (i64 i64))", "(rule ((RowTup r l)) ((union (Ref r) (Tup (LRef l)))) :ruleset load)",
    "(relation RowCallN (i64 String i64 String))",
    "(rule ((RowCallN r op l s)) ((union (Ref r) (CallN op (LRef l) s))) :ruleset load)",
    "(relation RowPinned (i64 i64 i64))", "(rule ((RowPinned r k l)) ((union (Ref r) (Pinned k (LRef l)))) :ruleset load)",
    "(relation RowMeta (i64 String))", "(rule ((RowMeta r m)) ((set (meta (Ref r)) m)) :ruleset load)",
    "(relation RowSplat (i64 String))", "(rule ((RowSplat r v)) ((set (splat (Ref r)) v)) :ruleset load)",
    "(relation RowSizes (i64 String))", "(rule ((RowSizes r v)) ((set (sizes (Ref r)) v)) :ruleset load)",
    "(relation RowDesc (String String i64 String))",
    "(rule ((RowDesc m d n dev)) ((set (dtype m) d) (set (rank m) n) (set (device m) dev)) :ruleset load)",
    "(relation RowShape (String String))", "(rule ((RowShape m sh)) ((set (shape m) sh)) :ruleset load)",
    "(relation RowDim (String i64 String))", "(rule ((RowDim m i d)) ((set (dim m i) d)) :ruleset load)",
] + [line for k in range(MAX_CALL_ARITY + 1) for line in _call_row(k)])


@dataclasses.dataclass
class Loaded:
    """What the loader learnt about the graph: node references, pinned nodes, CSE count."""

    index: dict[int, int]                 # IR node id -> node index k (its reference is (Ref k))
    nodes: list[Node]                     # node index -> original IR node
    pinned: list[int]                     # node indices of pinned nodes, in graph order
    side_effects: list[int]               # pinned nodes that must survive without readers
    cse: int = 0
    rows: int = 0


def must_pin(node: Node) -> bool:
    """Nodes rules must not touch or merge: side effects, randomness, explicit waits, mutation."""
    if node.kind != "call":
        return False
    t = node.target
    return (is_side_effect(node) or _pinned_target(t) or bool(node.waits)
            or (not isinstance(t, torch._ops.OpOverload) and bool(node.kwargs)))


_pinned_targets: dict[int, tuple] = {}  # id(target) -> (target, nondeterministic or mutable); asked per node


def _pinned_target(t) -> bool:
    entry = _pinned_targets.get(id(t))
    if entry is None or entry[0] is not t:
        entry = _pinned_targets[id(t)] = (t, is_nondeterministic(t) or is_mutable(t))
    return entry[1]


class Loader:
    def __init__(self, tables: Tables, n_nodes: int):
        self.tables = tables
        self.loaded = Loaded({}, [], [], [])
        self.rows: dict[str, list[str]] = {}
        self.next_ref = n_nodes          # references 0..n-1 are the IR nodes themselves
        self.next_list = 0
        self._literal_refs: dict[tuple, int] = {}
        self._const_index = ContentIndex()
        self._canonical: dict[int, int] = {}   # node index -> index of the first equal node
        self._seen: dict[tuple, int] = {}
        self._op_names: dict[int, tuple] = {}   # id(target) -> (target, its registered name)

    def row(self, relation: str, *cols) -> None:
        self.rows.setdefault(relation, []).append("\t".join(map(str, cols)))

    # -- values -------------------------------------------------------------------------------
    def ref(self, value) -> int:
        """Reference of an argument value (an IR node or a literal), emitting its rows once."""
        if isinstance(value, Node):
            k = self.loaded.index[value.id]
            return self._canonical.get(k, k)
        key = _literal_key(value)
        if key is not None and key in self._literal_refs:
            return self._literal_refs[key]
        r = self.next_ref
        self.next_ref += 1
        if key is not None:
            self._literal_refs[key] = r
        self.literal_rows(r, value)
        return r

    def literal_rows(self, r: int, value) -> None:
        t = self.tables
        if isinstance(value, bool) or value is None:
            self.row("RowAtom", r, t.atom_key(value))
        elif isinstance(value, int):
            if -(2 ** 63) <= value < 2 ** 63:
                self.row("RowInt", r, value)
                self.row("RowSplat", r, splat_key(value))

            else:
                self.row("RowAtom", r, t.atom_key(value))
        elif isinstance(value, float):
            self.row("RowFlt", r, float_key(value))
            s = splat_key(value)
            if s is not None:
                self.row("RowSplat", r, s)

        elif isinstance(value, (list, tuple)):
            self.row("RowLst" if isinstance(value, list) else "RowTup", r, self.list_ref([self.ref(v) for v in value]))
            sizes = _sizes(value)
            if sizes is not None:
                self.row("RowSizes", r, sizes)
        elif isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format, str)):
            self.row("RowAtom", r, t.atom_key(value))
        elif isinstance(value, torch.Tensor) or callable(value) or isinstance(value, Graph):
            self.row("RowOpaque", r, t.opaque_index(value))
        else:
            raise Unencodable(type(value).__name__)

    def list_ref(self, refs: list[int]) -> int:
        tail = self.next_list
        self.next_list += 1
        self.row("RowNil", tail)
        for h in reversed(refs):
            cell = self.next_list
            self.next_list += 1
            self.row("RowCons", cell, h, tail)
            tail = cell
        return tail

    # -- nodes --------------------------------------------------------------------------------
    def load(self, graph: Graph) -> Loaded:
        placeholder_index = {p.id: i for i, p in enumerate(graph.placeholders)}
        body = [n for n in graph.nodes if n.kind != "output"]
        for k, node in enumerate(body):
            self.loaded.index[node.id] = k
            self.loaded.nodes.append(node)
        for k, node in enumerate(body):
            if node.kind == "placeholder":
                self.row("RowInput", k, placeholder_index[node.id])
            elif node.kind == "constant":
                self.constant_rows(k, node)
            elif must_pin(node) or not self.call_rows(k, node):
                self.pinned_rows(k, node)
            self.meta_rows(k, node.meta)
        self.loaded.rows = sum(len(v) for v in self.rows.values())
        return self.loaded

    def constant_rows(self, k: int, node: Node) -> None:
        value = node.value
        if not isinstance(value, torch.Tensor):
            try:
                self.literal_rows(k, value)
            except Unencodable:
                self.row("RowOpaque", k, self.tables.opaque_index(value))
            return
        idx = self._const_index.setdefault(value, len(self.tables.constants))
        if idx == len(self.tables.constants):
            self.tables.constants.append(value)
        if is_weight(node):
            self.tables.weights.add(idx)
        if value.dim() == 0:
            self.row("RowScalar", k)
        self.row("RowConst", k, idx)
        if value.numel() <= SPLAT_SIZE_LIMIT:
            s = tensor_splat(value)
            if s is not None:
                self.row("RowSplat", k, s)


    def call_rows(self, k: int, node: Node) -> bool:
        """Rows of an unpinned call; False if an argument has no term form (the node is pinned)."""
        try:
            args, kwargs = canonical_call(node.target, node.args, node.kwargs)
            refs = [self.ref(v) for v in list(args) + list(kwargs.values())]
        except (Unencodable, OpError) as e:
            log.debug("e-graph: node %s (%s) kept opaque: %s", node.name, node.op, e)
            return False
        op = self._op_name(node.target)
        stream = self.tables.stream(node.stream)
        key = (op, tuple(refs), stream)
        first = self._seen.setdefault(key, k)
        if first != k:
            self._canonical[k] = first
            self.loaded.cse += 1
        if len(refs) <= MAX_CALL_ARITY:
            self.row(f"RowCall{len(refs)}", k, op, *refs, stream)
        else:
            self.row("RowCallN", k, op, self.list_ref(refs), stream)
        return True

    def _op_name(self, target) -> str:
        """`register_target` once per target of the graph (formatting a name per node showed)."""
        entry = self._op_names.get(id(target))
        if entry is None or entry[0] is not target:
            entry = self._op_names[id(target)] = (target, register_target(target))
        return entry[1]

    def pinned_rows(self, k: int, node: Node) -> None:
        self.row("RowPinned", k, k, self.list_ref([self.ref(d) for d in node.deps]))
        self.loaded.pinned.append(k)
        if is_side_effect(node):
            self.loaded.side_effects.append(k)

    def meta_rows(self, r: int, meta) -> None:
        key = self.tables.meta_key(meta)
        if key is None:
            return
        self.row("RowMeta", r, key)
        if isinstance(meta, TensorMeta) and key not in self.tables.described:
            self.tables.described.add(key)
            skey = shape_key(meta.shape)
            self.row("RowDesc", key, dtype_str(meta.dtype), len(meta.shape), meta.device.type)
            if _safe(skey):
                self.row("RowShape", key, skey)
                for i, size in enumerate(_dims(meta)):
                    self.row("RowDim", key, i, size)

    # -- into egglog --------------------------------------------------------------------------
    def send(self, egraph) -> None:
        send_rows(egraph, self.rows, "(run-schedule (run load) (run facts))")


def send_rows(egraph, rows: dict[str, list[str]], then: str) -> None:
    """Fill relations with tab-separated ``rows`` (relation -> lines) through files and egglog's
    ``input`` command, then run ``then``."""
    folder = tempfile.mkdtemp(prefix="rewrite-egraph-")
    try:
        cmds = []
        for relation, lines in rows.items():
            path = os.path.join(folder, f"{relation}.tsv")
            # read once and deleted right away: no fsync
            atomic_write_text(path, "\n".join(lines) + "\n", durable=False)
            cmds.append(f'(input {relation} "{path}")')
        egraph.run_program(*egraph.parse_program("".join(cmds)))
        egraph.run_program(*egraph.parse_program(then))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


_splat_cache = WeakIdKeyDictionary()


def tensor_splat(value: torch.Tensor) -> str | None:
    """`splat_key` of a constant tensor, remembered per tensor (and its version counter)."""
    cached = _splat_cache.get(value)
    if cached is not None and cached[0] == value._version:
        return cached[1]
    s = splat_key(value)
    _splat_cache[value] = (value._version, s)
    return s


def _literal_key(value):
    """Hashable identity of a literal, so equal literals share one reference (None: never shared)."""
    if isinstance(value, (bool, int, str)) or value is None:
        return (type(value).__name__, value)
    if isinstance(value, float):
        return ("float", float_key(value))
    if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return (type(value).__name__, str(value))
    return None


def _sizes(value) -> str | None:
    """The list read as a shape (ints and SymInt nodes), for ``shape_is`` conditions."""
    if not value:
        return None
    if all(type(v) is int for v in value):  # what shape_key spells, without sympy's printer
        key = "[" + ",".join(map(str, value)) + "]"
        return key if _safe(key) else None
    sizes = []
    for v in value:
        if isinstance(v, Node) and isinstance(v.meta, SymMeta) and v.meta.pytype is int:
            sizes.append(v.meta.expr)
        elif isinstance(v, int) and not isinstance(v, bool):
            sizes.append(v)
        else:
            return None
    key = shape_key(sizes)
    return key if _safe(key) else None


def _dims(meta: TensorMeta) -> list[str]:
    """Each size of a shape as the string `shape_key` spells it (the ``dim`` analysis)."""
    return [shape_key([d])[1:-1] for d in meta.shape]


def _safe(text: str) -> bool:
    return len(text) < 200 and not any(ch in text for ch in '"\t\n\\')


def load_graph(egraph, tables: Tables, graph: Graph) -> Loaded:
    loader = Loader(tables, sum(1 for n in graph.nodes if n.kind != "output"))
    loaded = loader.load(graph)
    loader.send(egraph)
    return loaded


def describe_commands(tables: Tables, meta) -> list[str]:
    """egglog commands that set the analyses keyed by ``meta``'s key (dtype, rank, device, shape,
    dims) the first time the key is seen; the meta of an e-class itself goes in by `names`."""
    key = tables.meta_key(meta)
    if key is None or not isinstance(meta, TensorMeta) or key in tables.described:
        return []
    tables.described.add(key)
    skey = shape_key(meta.shape)
    cmds = [f'(set (dtype "{key}") "{dtype_str(meta.dtype)}")', f'(set (rank "{key}") {len(meta.shape)})',
            f'(set (device "{key}") "{meta.device.type}")']
    if _safe(skey):
        cmds.append(f'(set (shape "{key}") "{skey}")')
        cmds.extend(f'(set (dim "{key}" {i}) "{size}")' for i, size in enumerate(_dims(meta)))
    return cmds


__all__ = ["Loaded", "load_graph", "must_pin", "describe_commands", "send_rows", "LOAD_PRELUDE"]
