"""The term language the IR becomes inside egglog, and the tables that map Python values to terms.

One sort ``Term`` covers everything an argument can be, so a pattern variable matches a tensor, a
size or a list alike::

    (Call3 "aten.mul.Tensor" a b (Int 1) "s")             an op: name, canonical args, stream tag
    (Input 3)  (Const 7)                                   graph input #3, constant #7 (by content)
    (Int 2)  (Flt "0.5")  (Atom "dtype:float32")           literals (floats by repr: -0.0 != 0.0)
    (Lst ...)  (Tup ...)                                   Python lists / tuples of terms
    (Opaque 4)                                             a value egglog cannot see (a subgraph)
    (Pinned 12 (Cons ... ))                                a node rules must not touch (side effect,
                                                           nondeterministic, waits on another node);
                                                           its id keeps it unique, its list keeps
                                                           its inputs alive

Analyses keyed by e-class (set from Python, so conditions are checked inside the e-graph):
``meta`` (the full TensorMeta/SymMeta, as a key into `Tables.metas`), ``sizes`` (a list argument
read as a shape), ``splat`` (a constant whose elements all equal one number). ``dtype``, ``shape``
(the canonical sympy shape string), ``rank``, ``device`` (its type: "cpu", "cuda") and ``dim`` (one size,
by index, as a sympy string) are keyed by the meta key, so they are set once
per distinct meta rather than once per node (each egglog command costs ~0.1 ms): a condition
reads ``(dtype (meta x))``. ``Scalar`` holds Python numbers and 0-dim constants; the ``facts``
ruleset (run after loading and at the start of every round) fills the relations of ``made_by``
conditions (which ops compute an e-class). ``node`` names the e-class of IR node #k; ``Pending`` holds
(matched, replacement) pairs whose replacement metas Python infers; each op-replacement rule's
accept rule (in the ``accept`` ruleset) unions its pairs once their metas are known and equal.
"""
from __future__ import annotations

import math

import torch

from ..ops import dtype_str, shape_key
from ..ir import Graph, SymMeta, TensorMeta

PRELUDE = """
(sort Term)
(sort TList)
(constructor Nil () TList)
(constructor Cons (Term TList) TList)
(constructor Call0 (String String) Term)
(constructor Call1 (String Term String) Term)
(constructor Call2 (String Term Term String) Term)
(constructor Call3 (String Term Term Term String) Term)
(constructor Call4 (String Term Term Term Term String) Term)
(constructor Call5 (String Term Term Term Term Term String) Term)
(constructor Call6 (String Term Term Term Term Term Term String) Term)
(constructor Call7 (String Term Term Term Term Term Term Term String) Term)
(constructor Call8 (String Term Term Term Term Term Term Term Term String) Term)
(constructor Call9 (String Term Term Term Term Term Term Term Term Term String) Term)
(constructor Call10 (String Term Term Term Term Term Term Term Term Term Term String) Term)
(constructor Call11 (String Term Term Term Term Term Term Term Term Term Term Term String) Term)
(constructor Call12 (String Term Term Term Term Term Term Term Term Term Term Term Term String) Term)
(constructor CallN (String TList String) Term)
(constructor Input (i64) Term)
(constructor Const (i64) Term)
(constructor Int (i64) Term)
(constructor Flt (String) Term)
(constructor Atom (String) Term)
(constructor Lst (TList) Term)
(constructor Tup (TList) Term)
(constructor Opaque (i64) Term)
(constructor Pinned (i64 TList) Term)
(constructor Ref (i64) Term)
(constructor LRef (i64) TList)
(function meta (Term) String :merge old)
(function dtype (String) String :merge old)
(function shape (String) String :merge old)
(function rank (String) i64 :merge old)
(function device (String) String :merge old)
(function dim (String i64) String :merge old)
(function sizes (Term) String :merge old)
(function splat (Term) String :merge old)
(relation Pending (Term Term))
(relation Scalar (Term))
(ruleset accept)
(ruleset facts)
"""

# Term constructors other than calls (what the node limit counts, with the calls).
TERM_CONSTRUCTORS = frozenset({"Nil", "Cons", "Input", "Const", "Int", "Flt", "Atom", "Lst", "Tup", "Opaque", "Pinned"})

# Ops have one constructor per arity (``Call0`` .. ``Call12``; ``CallN`` with a cons list beyond):
# matching through a cons list of arguments made egglog's joins quadratic in the graph size
# (0.9 s against 2 ms for one rule on a 10,000-node graph).
MAX_CALL_ARITY = 12


CALL_CONSTRUCTORS = frozenset([f"Call{k}" for k in range(MAX_CALL_ARITY + 1)] + ["CallN"])


def is_call(op: str) -> bool:
    return op in CALL_CONSTRUCTORS


def call_term(op_name: str, items: list[str], stream: str) -> str:
    """Term text of a call of ``op_name`` on argument terms ``items`` (``stream`` is egglog text)."""
    if len(items) <= MAX_CALL_ARITY:
        return f"(Call{len(items)} {' '.join([quote(op_name)] + items + [stream])})"
    return f"(CallN {quote(op_name)} {list_term(items)} {stream})"


# Functions of the prelude that are analyses, not term constructors (extraction ignores them).
ANALYSES = frozenset({"Ref", "LRef", "meta", "dtype", "shape", "rank", "device", "dim", "sizes", "splat", "Pending"})

_SAFE = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-[](),+*/ @#<>=")


class Unencodable(Exception):
    """A value has no term form (the node becomes pinned)."""


class Tables:
    """Python objects behind the integer / string keys used in terms."""

    def __init__(self):
        self.atoms: dict[str, object] = {}          # atom string -> Python value
        self.opaque: list[object] = []              # Opaque index -> object
        self._opaque_ids: dict[int, int] = {}
        self.metas: dict[str, object] = {}          # meta key -> TensorMeta / SymMeta / tuple
        self.constants: list[object] = []           # Const index -> value (tensor or scalar)
        self.weights: set[int] = set()              # Const indices holding frozen weights (or values folded from them)
        self.streams: dict[str, object] = {}        # stream string -> original tag
        self.described: set[str] = set()            # meta keys whose dtype/shape/rank are set
        self._meta_texts: dict = {}
        self._safe_meta_keys: dict[int, tuple] = {}  # id(meta) -> (meta, key) where key is the meta's text

    # -- strings that must be safe inside egglog string literals ------------------------------
    def safe_string(self, text: str, table: dict, value) -> str:
        if all(ch in _SAFE for ch in text) and len(text) < 200:
            key = text
        else:
            key = f"#{len(table)}"
            while key in table and table[key] is not value:
                key += "_"
        table.setdefault(key, value)
        return key

    def atom(self, value) -> str:
        return f'(Atom "{self.atom_key(value)}")'

    def atom_key(self, value) -> str:
        if value is None:
            text = "None"
        elif isinstance(value, bool):
            text = f"bool:{value}"
        elif isinstance(value, torch.dtype):
            text = f"dtype:{dtype_str(value)}"
        elif isinstance(value, torch.device):
            text = f"device:{value}"
        elif isinstance(value, (torch.layout, torch.memory_format)):
            text = f"{type(value).__name__}:{value}"
        elif isinstance(value, str):
            text = f"str:{value}"
        elif isinstance(value, int):
            text = f"bigint:{value}"
        else:
            raise Unencodable(type(value).__name__)
        return self.safe_string(text, self.atoms, value)

    def stream(self, tag) -> str:
        if tag is None:
            return ""
        return self.safe_string(f"s:{tag}", self.streams, tag)

    def opaque_term(self, value) -> str:
        return f"(Opaque {self.opaque_index(value)})"

    def opaque_index(self, value) -> int:
        idx = self._opaque_ids.get(id(value))
        if idx is None:
            idx = len(self.opaque)
            self.opaque.append(value)
            self._opaque_ids[id(value)] = idx
        return idx

    def meta_key(self, meta) -> str | None:
        """Canonical string of a meta (registered so it can be read back); None if no meta."""
        if meta is None:
            return None
        # The loader asks once per node, and hashing a meta hashes its sympy shape: metas whose
        # key is their own text (registered once, the same every time) are remembered by identity.
        known = self._safe_meta_keys.get(id(meta))
        if known is not None and known[0] is meta:
            return known[1]
        try:
            text = self._meta_texts.get(meta)
        except TypeError:  # unhashable (a list of metas)
            text = None
        if text is None:
            text = _meta_text(meta)
            try:
                self._meta_texts[meta] = text
            except TypeError:
                pass
        if text is None:
            return None
        key = self.safe_string(text, self.metas, meta)
        if key == text:
            self._safe_meta_keys[id(meta)] = (meta, key)  # the meta is held: its id is not reused
        return key


def _meta_text(meta) -> str | None:
    if isinstance(meta, TensorMeta):
        return f"T:{dtype_str(meta.dtype)}:{meta.device}:{shape_key(meta.shape)}"
    if isinstance(meta, SymMeta):
        return f"S:{meta.pytype.__name__}:{meta.expr}"
    if isinstance(meta, (tuple, list)):
        parts = [_meta_text(m) for m in meta]
        if any(p is None for p in parts):
            return None
        return "(" + ";".join(parts) + ")"
    return None


def quote(text: str) -> str:
    return f'"{text}"'


def literal_term(value, tables: Tables, node_term) -> str:
    """Term text of an argument value; ``node_term(node)`` gives the term of an IR node."""
    from ..ir import Node

    if isinstance(value, Node):
        return node_term(value)
    if isinstance(value, bool) or value is None:
        return tables.atom(value)
    if isinstance(value, int):
        if -(2 ** 63) <= value < 2 ** 63:
            return f"(Int {value})"
        return tables.atom(value)
    if isinstance(value, float):
        return f'(Flt "{float_key(value)}")'
    if isinstance(value, list):
        return f"(Lst {list_term([literal_term(v, tables, node_term) for v in value])})"
    if isinstance(value, tuple):
        return f"(Tup {list_term([literal_term(v, tables, node_term) for v in value])})"
    if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format, str)):
        return tables.atom(value)
    if isinstance(value, (Graph, torch.Tensor)) or callable(value):
        return tables.opaque_term(value)
    raise Unencodable(type(value).__name__)


def float_key(value: float) -> str:
    if math.isnan(value):
        return "nan"
    return repr(float(value))


def list_term(items: list[str]) -> str:
    out = "(Nil)"
    for item in reversed(items):
        out = f"(Cons {item} {out})"
    return out
