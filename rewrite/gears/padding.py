"""Padding a shape up to a larger gear, when the graph provably keeps the padded rows to themselves.

Padding dimension ``s`` of the inputs from ``n`` to a gear ``g > n`` and slicing the outputs back
is only correct if no output element at a real row ever reads a padded row: no reduction, matmul
contraction, attention, cumulative op or gather runs across ``s``. `row_states` proves that with a
forward dataflow over the IR. Each value gets one state per symbol:

* ``INDEP``: neither its shape nor its data depends on ``s``;
* ``Row(dim, k)``: dimension ``dim`` has size ``s*k`` and element ``i`` along it belongs to row
  ``i // k`` and depends only on that row of the inputs (``k > 1`` after flattening the row dim
  with the dims after it, as ``[s, 32, 384] -> [32*s, 384]`` before a matmul does);
* ``SYM``: a scalar whose value depends on ``s`` (size arithmetic); it may only feed shape arguments.

A ``Row`` whose dim also holds an outer factor (``outer``: ``[b, s, 32] -> [b*s, 32]`` before a matmul puts each
batch's positions one after another) keeps element ``i``'s row as ``(i // k) % s``. A ``Row`` knows the value its
padded positions hold (``pad``) where that is one known value: the inputs are padded with zeros.

Padding a *sequence* (keys mixed by attention) is proven by the attention rule (`_attention`): ``q``, ``k`` and ``v``
have their rows on the sequence dim, and every padded key is masked out for every real query, by the attention
mask (a `Pair`: a value with the rows of ``s`` in two dims, whose padded key positions hold a masked value, as
transformers' masks built from the padded ``attention_mask`` do) or by ``is_causal`` (padding goes at the end). A
masked key's weight is exactly zero, so padded keys and values never reach a real query. What padded positions
hold is what the model computes for a token of id 0 with mask 0: finite, as for the tokenizer's own padding.

A ``Row`` with ``index=True`` holds the row number itself along its dim (``arange(s)`` and views of it), which
lets a gather such as ``mask[arange(s)[:, None], j]`` (transformers' mask functions) read each row from its own
row. Only the transfers in `_KEEP_VALUES` pass that mark on; every other result is a plain ``Row``.

Each op family's transfer function is in `_TRANSFER` (pointwise ops share one); an op not in the
table that touches a non-``INDEP`` value stops the proof with a reason naming the node, and padding
is refused.
"""
from __future__ import annotations

import contextvars
import dataclasses
import itertools
import math
import operator

import sympy
import torch

from .. import ops
from ..ir import Graph, Node, SymMeta, TensorMeta, iter_instances, iter_metas, map_nodes

aten = torch.ops.aten

__all__ = ["plan_padding", "row_states", "row_states_and_mixing", "tied_positions", "size_output", "NotRowwise", "Row",
           "INDEP", "SYM", "Padder"]


class _Marker:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


INDEP = _Marker("INDEP")
SYM = _Marker("SYM")


@dataclasses.dataclass(frozen=True)
class Row:
    dim: int
    k: sympy.Expr = sympy.Integer(1)
    # its values along ``dim`` are the row numbers 0, 1, ... (k == 1); not part of equality: a row is a row
    index: bool = dataclasses.field(default=False, compare=False)
    outer: sympy.Expr = sympy.Integer(1)  # dim has size outer*s*k: element i belongs to row (i // k) % s
    pad: object = dataclasses.field(default=None, compare=False)  # the value at every padded position, if known


@dataclasses.dataclass(frozen=True)
class Pair:
    """A value with the rows of ``s`` in two dims (an attention mask ``[batch, 1, query, key]``), each element depending
    only on its own two rows. ``pads[d]``: the value at padded positions of dim ``d`` where the other dim is real
    (None: not known)."""

    dims: tuple
    pads: tuple = (None, None)

    def pad_of(self, dim: int):
        return self.pads[self.dims.index(dim)]


_STATES: "contextvars.ContextVar[dict]" = contextvars.ContextVar("rewrite_padding_states")
# Where the proof running relied on padded positions being masked out (attention's masked keys, a sum of values
# that are 0 where padded): such rows pad, but do not split (a part would miss the other parts' real keys).
_MIXED: "contextvars.ContextVar[list]" = contextvars.ContextVar("rewrite_padding_mixed")


class NotRowwise(Exception):
    """The proof failed; the message names the node and why."""


# -- helpers -------------------------------------------------------------------------------------

def _has(expr, s) -> bool:
    return s in sympy.sympify(expr).free_symbols


def _shape(meta) -> tuple:
    return tuple(sympy.sympify(x) for x in meta.shape)


def _row_of_shape(shape, s) -> Row | None:
    """The Row state of a value whose data does not depend on rows (constant along ``s``)."""
    dims = [d for d, size in enumerate(shape) if _has(size, s)]
    if not dims:
        return None
    if len(dims) > 1:
        raise NotRowwise(f"{s} appears in {len(dims)} dimensions of shape {shape}")
    k = sympy.simplify(shape[dims[0]] / s)
    if not _is_factor(k, s):
        raise NotRowwise(f"dimension {dims[0]} has size {shape[dims[0]]}, not a multiple of {s}")
    return Row(dims[0], k)


def _is_factor(k, s) -> bool:
    """A block size: a positive integer or a product of other sizes (free of ``s``)."""
    if _has(k, s):
        return False
    if k.is_Integer:
        return k > 0
    return k.is_Mul or k.is_Symbol or k.is_Pow and k.exp.is_Integer and k.exp > 0


def _prod(xs):
    return sympy.Mul(*xs) if xs else sympy.Integer(1)


def _reshape(state: Row, in_shape, out_shape, s) -> Row:
    """Where a row dim lands after a reshape (flat order is kept: the elements before a row's block, ``prefix``, and
    the block, ``stride``, must divide evenly into the new dims; what remains of them in the row's new dim is its
    ``outer`` and ``k``)."""
    stride = state.k * _prod(in_shape[state.dim + 1:])
    prefix = state.outer * _prod(in_shape[:state.dim])
    for e in range(len(out_shape)):
        k = sympy.simplify(stride / _prod(out_shape[e + 1:]))
        outer = sympy.simplify(prefix / _prod(out_shape[:e]))
        if not _is_factor(k, s) or not _is_factor(outer, s):
            continue
        if sympy.simplify(out_shape[e] - outer * s * k) == 0:
            keep = k == 1 and outer == 1  # each element keeps its row coordinate
            return Row(e, k, state.index and keep, outer, state.pad if keep else None)
    raise NotRowwise(f"reshape {list(in_shape)} -> {list(out_shape)} mixes the rows of {s} with other dims")


def _norm(d: int, rank: int) -> int:
    return d % rank if rank else 0


def _bound(node: Node) -> dict:
    """The node's arguments by schema name, defaults filled in (in schema order)."""
    return ops.bind_arguments(node.target, node.args, node.kwargs)


# -- transfer functions: (node, its args with each node replaced by its state, s) -> state --------

def _tensor_states(node, states) -> list:
    """(input node, its state) pairs, flattened: ``node.args`` and ``states`` walked side by side."""
    out = []

    def walk(a, st):
        if isinstance(a, Node):
            out.append((a, st))
        elif isinstance(a, (list, tuple)):
            for x, y in zip(a, st):
                walk(x, y)
    walk(node.args, states)
    return out


def _check_no_sym(node, inputs):
    for n, st in inputs:
        if st is SYM:
            raise NotRowwise(f"node %{node.name} ({node.op}) computes with a value that depends on the padded size")


def _pointwise(node, states, s):
    """Broadcasting elementwise ops: every row input must put its row on the same output dim; or, with rows on two
    dims (a query's row against a key's, as attention masks are built), the result is a `Pair`. The value at padded
    positions is computed from the inputs' where they are known (`_pad_value`)."""
    inputs = _tensor_states(node, states)
    _check_no_sym(node, inputs)
    rank = len(node.meta.shape)
    dims = {}  # output dim -> the rows found there (outer and k must agree)
    for n, st in inputs:
        if not isinstance(st, (Row, Pair)):
            continue  # INDEP, a size scalar among them
        shift = rank - len(n.meta.shape)
        if isinstance(st, Row):
            dims.setdefault(st.dim + shift, set()).add(dataclasses.replace(st, dim=st.dim + shift, index=False, pad=None))
        elif isinstance(st, Pair):
            for d in st.dims:
                dims.setdefault(d + shift, set()).add(Row(d + shift))
    if any(len(rows) > 1 for rows in dims.values()) or len(dims) > 2 or (
            len(dims) == 2 and any(r != Row(r.dim) for rows in dims.values() for r in rows)):
        found = sorted({r for rows in dims.values() for r in rows}, key=str)
        raise NotRowwise(f"node %{node.name} ({node.op}) combines rows of {s} on different dims {found}")
    if not dims:
        return INDEP
    if len(dims) == 1:
        ((d, (row,)),) = dims.items()
        return dataclasses.replace(row, pad=_pad_value(node, inputs, d, rank))
    pair = tuple(sorted(dims))
    return Pair(pair, tuple(_pad_value(node, inputs, d, rank) for d in pair))


_SUMS = frozenset({aten.sum.dim_IntList, aten.sum.default})
# Products: a factor known to be 0 at the padded positions makes the product 0 there, whatever the other factor
# holds (a finite value: what the model computes for a padding token)
_PRODUCTS = frozenset({aten.mul.Tensor})

# Comparisons of two row-number values: at a real row against a padded one, the real number is the smaller.
_COMPARISONS = {aten.lt.Tensor, aten.le.Tensor, aten.gt.Tensor, aten.ge.Tensor, aten.eq.Tensor, aten.ne.Tensor}


def _along(n, st, d: int, rank: int) -> tuple[bool, object]:
    """Whether input ``n`` (state ``st``) has rows on output dim ``d`` of a rank-``rank`` broadcast, and the value it
    holds at their padded positions (None: not known)."""
    shift = rank - len(n.meta.shape)
    if isinstance(st, Row) and st.dim + shift == d:
        return True, st.pad
    if isinstance(st, Pair) and d - shift in st.dims:
        return True, st.pad_of(d - shift)
    return False, None


def _pad_value(node, inputs, d: int, rank: int):
    """The value of a pointwise ``node`` at the padded positions of output dim ``d`` (its other row dim, if any, real),
    when every input is known there: an input with rows on ``d`` holds its ``pad``; a scalar constant its value; a
    bool input not padded along ``d`` may hold either value (the result must be the same for both); two row-number
    inputs compared take 0 (real) and 1 (padded). None when not known."""
    value = _evaluated_pad(node, inputs, d, rank)
    if value is None and node.target in _PRODUCTS and _finite_operands(node) and any(
            isinstance(n.meta, TensorMeta) and _along(n, st, d, rank) == (True, 0) for n, st in inputs):
        return 0  # 0 times what the model computed for a padding token (finite), or a finite constant
    return value


def _finite_operands(node) -> bool:
    """Whether every scalar and constant operand of ``node`` is finite (0 * inf is nan, not 0)."""
    for a in node.args:
        if isinstance(a, Node):
            value = a.value if a.kind == "constant" else None
            if isinstance(value, torch.Tensor) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
                return False
        elif isinstance(a, float) and not math.isfinite(a):
            return False
    return True


def _scalar_value(n: Node):
    """The one value of a scalar tensor the graph holds as a constant or makes with ``scalar_tensor``, else None."""
    if n.kind == "constant" and isinstance(n.value, torch.Tensor) and n.value.numel() == 1:
        return n.value.item()
    if n.kind == "call" and n.target is aten.scalar_tensor.default and isinstance(n.args[0], (int, float, bool)):
        return n.args[0]
    return None


def _evaluated_pad(node, inputs, d: int, rank: int):
    """`_pad_value` by running the op on the inputs' values at the padded positions, where they are all known."""
    choices = []
    order = [n for n, _ in inputs]
    compared_rows = node.target in _COMPARISONS and all(isinstance(st, Row) and st.index for _, st in inputs)
    if any(isinstance(v, Node) for v in node.kwargs.values()):
        return None
    for n, st in inputs:
        if not isinstance(n.meta, TensorMeta):
            return None
        on_d, pad = _along(n, st, d, rank)
        if on_d:
            value = 1 if compared_rows else pad
            choices.append([value] if value is not None else None)
        elif compared_rows:
            choices.append([0])
        elif _scalar_value(n) is not None:
            choices.append([_scalar_value(n)])
        elif n.meta.dtype == torch.bool:
            choices.append([False, True])
        else:
            choices.append(None)
        if choices[-1] is None:
            return None
    results = set()
    for combo in itertools.product(*choices):
        try:
            values = {id(n): torch.tensor(v, dtype=n.meta.dtype) for n, v in zip(order, combo)}
            args = map_nodes(node.args, lambda n: values[id(n)])
            out = node.target(*args, **node.kwargs)
        except Exception:  # noqa: BLE001 - an op that will not run on scalars: its pad is not known
            return None
        if not isinstance(out, torch.Tensor) or out.numel() != 1:
            return None
        value = out.item()
        results.add("nan" if value != value else value)
    return results.pop() if len(results) == 1 and "nan" not in results else None


def _identity(node, states, s):
    st = states[0]
    _check_no_sym(node, _tensor_states(node, states))
    return st


def _reduction(node, states, s):
    """Reductions over ``dim`` (all dims when there is none): fine unless the row dim is reduced."""
    st = states[0]
    _check_no_sym(node, _tensor_states(node, states))
    if not isinstance(st, Row):
        return INDEP
    rank = len(node.args[0].meta.shape)
    args = _bound(node)
    dims = args.get("dim")
    dims = [dims] if isinstance(dims, int) else list(dims or [])
    dims = [_norm(d, rank) for d in dims] if dims else list(range(rank))
    if st.dim in dims and node.target in _SUMS and st.pad == 0 and not isinstance(node.meta, tuple):
        _MIXED.get().append(f"%{node.name} sums over the rows of {s}")
        return INDEP  # a sum whose padded positions hold 0 (masked pooling: (x * mask).sum(1)) is the real rows' sum
    if st.dim in dims:
        raise NotRowwise(f"node %{node.name} ({node.op}) reduces across the rows of {s} (dim {st.dim})")
    new = Row(st.dim if args.get("keepdim", False) else st.dim - sum(d < st.dim for d in dims), st.k, outer=st.outer)
    return tuple(new for _ in node.meta) if isinstance(node.meta, tuple) else new


def _along_dim(node, states, s):
    """Ops that mix values along one dim and keep the rank (softmax, cumsum, sort, topk): fine off
    the row dim. Every output (sort's values and indices) keeps the input's row dim."""
    st = states[0]
    _check_no_sym(node, _tensor_states(node, states))
    if isinstance(st, Row) and _norm(_bound(node)["dim"], len(node.args[0].meta.shape)) == st.dim:
        if node.target not in ops.SCANS | ops.SCANS_WITH_INDICES or st.k != 1 or st.outer != 1:
            raise NotRowwise(f"node %{node.name} ({node.op}) mixes values along the rows of {s}")
        # a running total (roberta's position ids: cumsum of the mask): row i reads rows 0..i only, and padding
        # goes after the real rows, so every real row's value is the same; the rows pad but do not split
        _MIXED.get().append(f"%{node.name} scans along the rows of {s}")
        st = dataclasses.replace(st, index=False, pad=None)
    return tuple(st for _ in node.meta) if isinstance(node.meta, tuple) else st


def _layer_norm(node, states, s):
    st = states[0]
    _check_no_sym(node, _tensor_states(node, states))
    for other in states[2:4]:
        if isinstance(other, Row):
            raise NotRowwise(f"node %{node.name} ({node.op}): weight or bias depends on the rows of {s}")
    if not isinstance(st, Row):
        return tuple(INDEP for _ in node.meta)
    rank = len(node.args[0].meta.shape)
    if st.dim >= rank - len(node.args[1]):
        raise NotRowwise(f"node %{node.name} ({node.op}) normalizes across the rows of {s}")
    return (st, st, st)


def _mm(node, states, s):
    a, b = states[-2], states[-1]
    _check_no_sym(node, _tensor_states(node, states))
    out = INDEP
    if isinstance(a, Row):
        if a.dim != 0 or isinstance(b, Row):
            raise NotRowwise(f"node %{node.name} ({node.op}) contracts over the rows of {s}")
        out = a
    elif isinstance(b, Row):
        if b.dim != 1:
            raise NotRowwise(f"node %{node.name} ({node.op}) contracts over the rows of {s}")
        out = b
    if len(states) == 3 and isinstance(states[0], Row):  # addmm's bias broadcasts against the product
        bias = Row(states[0].dim + 2 - len(node.args[0].meta.shape), states[0].k, outer=states[0].outer)
        if out is not INDEP and bias != out:
            raise NotRowwise(f"node %{node.name} ({node.op}): bias rows and product rows of {s} differ")
        out = bias
    return out


def _bmm(node, states, s):
    a, b = states[0], states[1]
    _check_no_sym(node, _tensor_states(node, states))
    if isinstance(a, Row) and isinstance(b, Row):
        if a == b and a.dim == 0:
            return a
    elif isinstance(a, Row) and a.dim in (0, 1):
        return a
    elif isinstance(b, Row) and b.dim in (0, 2):
        return b
    elif not isinstance(a, Row) and not isinstance(b, Row):
        return INDEP
    raise NotRowwise(f"node %{node.name} ({node.op}) contracts over the rows of {s}")


def _attention(node, states, s):
    """SDPA(q, k, v, ...): rows may be batch or head dims of all of q, k, v (and the mask); or the sequence dim of
    q, k and v (dim 2 of ``[batch, heads, seq, dim]``) when every padded key is masked out for every real query
    (`_keys_masked`): then each real query reads real keys only, and the output keeps the query's rows."""
    inputs = _tensor_states(node, states)
    _check_no_sym(node, inputs)
    rows = {st for _, st in inputs if isinstance(st, Row)}
    pairs = [st for _, st in inputs if isinstance(st, Pair)]
    if not rows and not pairs:
        return tuple(INDEP for _ in node.meta) if isinstance(node.meta, tuple) else INDEP
    q, k, v = states[0], states[1], states[2]
    plain = {dataclasses.replace(r, index=False, pad=None) for r in rows}
    if not pairs and len(plain) == 1 and next(iter(plain)).dim in (0, 1) and q == k == v:
        row = dataclasses.replace(next(iter(plain)), pad=None)
    elif q == k == v == Row(2) and _keys_masked(node, s):
        _MIXED.get().append(f"%{node.name} attends across the rows of {s}, padded keys masked")
        row = Row(2)
    else:
        raise NotRowwise(f"node %{node.name} ({node.op}) attends across the rows of {s}")
    return tuple(row for _ in node.meta) if isinstance(node.meta, tuple) else row


def _keys_masked(node, s) -> bool:
    """Whether every padded key position is masked out for every real query: ``is_causal`` (padding goes after the
    real keys, which a real query's causal window never passes), or an attention mask that is a `Pair` over
    (query, key) = dims (2, 3), or a `Row` on the key dim 3, whose value at padded keys is False (a bool mask) or
    an additive mask low enough that its weight is exactly zero (-inf, or the dtype's most negative values)."""
    args = _bound(node)
    if args.get("dropout_p", 0.0):
        return False
    mask = args.get("attn_mask")
    if args.get("is_causal", False) and mask is None:
        return True
    if not isinstance(mask, Node):
        return False
    st = _STATES.get()[mask.id]
    rank = len(mask.meta.shape)
    key_dim = rank - 1
    if isinstance(st, Pair) and st.dims == (rank - 2, rank - 1):
        pad = st.pad_of(key_dim)
    elif isinstance(st, Row) and st.dim == key_dim and st.k == 1 and st.outer == 1:
        pad = st.pad
    else:
        return False
    if pad is None:
        return False
    if mask.meta.dtype == torch.bool:
        return pad is False or pad == 0
    return pad == float("-inf") or (mask.meta.dtype.is_floating_point and pad <= torch.finfo(mask.meta.dtype).min / 2)


def _view(node, states, s):
    st = states[0]
    if not isinstance(st, Row):
        return _row_of_shape(_shape(node.meta), s) or INDEP
    return _reshape(st, _shape(node.args[0].meta), _shape(node.meta), s)


def _expand(node, states, s):
    st = states[0]
    out_shape = _shape(node.meta)
    if isinstance(st, Pair):
        shift = len(out_shape) - len(node.args[0].meta.shape)
        if [d for d, x in enumerate(out_shape) if _has(x, s)] != [d + shift for d in st.dims] or \
                any(out_shape[d + shift] != s for d in st.dims):
            raise NotRowwise(f"node %{node.name} ({node.op}) expands to {list(out_shape)}, repeating rows of {s}")
        return Pair(tuple(d + shift for d in st.dims), st.pads)
    if not isinstance(st, Row):  # the same data repeated along the new size: constant per row
        return _row_of_shape(out_shape, s) or INDEP
    new = dataclasses.replace(st, dim=st.dim + len(out_shape) - len(node.args[0].meta.shape))
    # the input has the rows in one dim only, so another dim of s in the output is a repeat of the input's values
    grown = [d for d, x in enumerate(out_shape) if _has(x, s) and d != new.dim]
    if len(grown) == 1 and out_shape[grown[0]] == s and out_shape[new.dim] == s and st.k == 1 and st.outer == 1:
        # a key mask [b, 1, 1, s] repeated for every query [b, 1, s, s]: the same values along the new rows
        dims = tuple(sorted((new.dim, grown[0])))
        return Pair(dims, tuple(st.pad if d == new.dim else None for d in dims))
    if st.outer != 1 or _row_of_shape(out_shape, s) != new:
        raise NotRowwise(f"node %{node.name} ({node.op}) expands to {list(out_shape)}, repeating rows of {s}")
    return new


def _permute(node, states, s):
    st = states[0]
    if not isinstance(st, Row):
        return st
    dims = [_norm(d, len(node.meta.shape)) for d in node.args[1]]
    return dataclasses.replace(st, dim=dims.index(st.dim))


def _transpose(node, states, s):
    st = states[0]
    if not isinstance(st, Row):
        return st
    rank = len(node.meta.shape)
    a, b = (0, 1) if node.target in ops.MATRIX_TRANSPOSES else (_norm(d, rank) for d in node.args[1:3])
    return dataclasses.replace(st, dim=b if st.dim == a else a if st.dim == b else st.dim)


def _unsqueeze(node, states, s):
    st = states[0]
    if not isinstance(st, Row):
        return st
    d = _norm(node.args[1], len(node.meta.shape))
    if isinstance(st, Pair):
        return Pair(tuple(x + (d <= x) for x in st.dims), st.pads)
    return dataclasses.replace(st, dim=st.dim + (d <= st.dim))


def _squeeze(node, states, s):
    st = states[0]
    if not isinstance(st, Row):
        return st
    return _reshape(st, _shape(node.args[0].meta), _shape(node.meta), s)


def _slice(node, states, s):
    st = states[0]
    args = _bound(node)
    if not isinstance(st, Row):
        start, step = args["start"], args["step"]
        if any(x is SYM for x in states[1:]):
            # The first s entries of a table (position ids): row i is entry i whatever the padding.
            if start in (0, None) and step == 1 and states[3] is SYM:
                return _row_of_shape(_shape(node.meta), s) or INDEP
            raise NotRowwise(f"node %{node.name} ({node.op}) slices by a size that depends on {s}")
        return st
    rank = len(node.args[0].meta.shape)
    dim = _norm(args["dim"], rank)
    if dim != st.dim:
        if any(x is SYM for x in states[1:]):
            raise NotRowwise(f"node %{node.name} ({node.op}) slices by a size that depends on {s}")
        return st
    if sympy.simplify(_shape(node.meta)[dim] - _shape(node.args[0].meta)[dim]) == 0:
        return st  # a full slice of the row dim is the identity
    raise NotRowwise(f"node %{node.name} ({node.op}) slices the rows of {s}")


def _select(node, states, s):
    st = states[0]
    if not isinstance(st, Row):
        return st
    dim = _norm(node.args[1], len(node.args[0].meta.shape))
    index = node.args[2]
    if dim != st.dim:
        return dataclasses.replace(st, dim=st.dim - (dim < st.dim), index=False)
    if isinstance(index, int) and index >= 0 and st.k == 1 and st.outer == 1:
        return INDEP  # one real row, the same whatever the padding
    raise NotRowwise(f"node %{node.name} ({node.op}) picks row {index} of {s}, which depends on the padded size")


def _embedding(node, states, s):
    weight, indices = states[0], states[1]
    if isinstance(weight, Row):
        raise NotRowwise(f"node %{node.name} ({node.op}) looks up rows of {s}")
    return indices


def _index_select(node, states, s):
    x, index = states[0], states[2]
    dim = _norm(node.args[1], len(node.args[0].meta.shape))
    if isinstance(index, Row):
        if isinstance(x, Row) or index.outer != 1:
            raise NotRowwise(f"node %{node.name} ({node.op}) indexes rows of {s} by rows of {s}")
        return Row(dim, index.k)
    if isinstance(x, Row) and x.dim == dim:
        raise NotRowwise(f"node %{node.name} ({node.op}) selects among the rows of {s}")
    return x


def _gather(node, states, s):
    """``gather(x, dim, index)``: output element ``[..., i, ...]`` reads ``x`` at the index's value along ``dim`` and at
    its own coordinates elsewhere. Rows stay apart when ``x`` has none (a lookup: a token-type table read at the
    position ids), or when ``x`` and the index have their rows on one dim other than ``dim``."""
    x, index = states[0], states[2]
    _check_no_sym(node, _tensor_states(node, states))
    dim = _norm(_bound(node)["dim"], len(node.args[0].meta.shape))
    if not isinstance(x, Row):
        if isinstance(index, Row) and index.outer != 1:
            raise NotRowwise(f"node %{node.name} ({node.op}) gathers by flattened rows of {s}")
        return Row(index.dim, index.k) if isinstance(index, Row) else INDEP
    if x.dim != dim and x.k == 1 and x.outer == 1 and (index == Row(x.dim) or
                                     (index is INDEP and _row_of_shape(_shape(node.meta), s) == Row(x.dim))):
        return Row(x.dim)
    raise NotRowwise(f"node %{node.name} ({node.op}) gathers across the rows of {s}")


def _cat(node, states, s):
    tensors = [n for n in node.args[0]]
    dim = _norm(_bound(node)["dim"], len(node.meta.shape))
    # parts with nothing along ``dim`` add nothing: a legacy empty 1-D tensor, or an empty KV cache that a prefill
    # concatenates its keys to
    rows = [st for n, st in zip(tensors, states[0]) if not _empty_1d(n) and not _empty_along(n, dim)]
    if not any(isinstance(st, Row) for st in rows):
        return INDEP
    if len(rows) == 1:  # the only part with elements: the result is that part
        return rows[0]
    if len(set(rows)) != 1 or rows[0].dim == dim:
        raise NotRowwise(f"node %{node.name} ({node.op}) concatenates across or mixes the rows of {s}")
    return dataclasses.replace(rows[0], index=all(st.index for st in rows), pad=None)  # row numbers only if every part holds them


def _empty_along(n: Node, dim: int) -> bool:
    shape = tuple(n.meta.shape) if isinstance(n.meta, TensorMeta) else ()
    return dim < len(shape) and isinstance(shape[dim], int) and shape[dim] == 0


def _empty_1d(n: Node) -> bool:
    """cat skips legacy empty 1-D tensors (shape [0])."""
    return isinstance(n.meta, TensorMeta) and tuple(n.meta.shape) == (0,)


def _split(node, states, s):
    st = states[0]
    if not isinstance(st, Row):
        return tuple(st for _ in node.meta)
    dim = _norm(_bound(node)["dim"], len(node.args[0].meta.shape))
    if dim == st.dim:
        raise NotRowwise(f"node %{node.name} ({node.op}) splits the rows of {s}")
    return tuple(st for _ in node.meta)


def _factory(node, states, s):
    """zeros/ones/full/empty/arange over sizes: the same value in every row (arange: the row index)."""
    args = _bound(node)
    if node.target in ops.RANGES:
        if any(x is SYM for x in states) and (args.get("start", 0) != 0 or args.get("step", 1) != 1):
            raise NotRowwise(f"node %{node.name} ({node.op}) counts with a start or step depending on {s}")
        if args.get("start", 0) == 0 and args.get("step", 1) == 1 and _shape(node.meta) == (s,):
            return Row(0, index=True)  # arange(s): the row numbers
        return _row_of_shape(_shape(node.meta), s) or INDEP
    shaped_like_input = node.target in ops.LIKE_FACTORIES | ops.NEW_FACTORIES
    for name, st in zip(args, states):  # schema order: the i-th name is the i-th positional argument's
        if st is SYM and name not in ("size", "end", "start"):
            raise NotRowwise(f"node %{node.name} ({node.op}) fills with a value that depends on {s}")
        if isinstance(st, Row) and not shaped_like_input:
            raise NotRowwise(f"node %{node.name} ({node.op}) reads rows of {s}")
    return _row_of_shape(_shape(node.meta), s) or INDEP


def _index(node, states, s):
    """``x[i0, i1, ...]`` (``aten.index.Tensor``; a None index takes the whole dim). Rows stay apart when every
    index with rows has them on one broadcast dim and either ``x`` has no rows (a lookup, as ``embedding``) or
    ``x``'s row dim is indexed by the row numbers themselves (``mask[arange(s)[:, None], j]``): the element of
    output row r then reads row r of ``x`` only, at indices that depend on row r or on no row."""
    x, indices, nodes = states[0], list(states[1]), list(node.args[1])
    _check_no_sym(node, _tensor_states(node, states))
    used = [d for d, n in enumerate(nodes) if n is not None]
    if not used or any(nodes[d].meta.dtype in (torch.bool, torch.uint8) for d in used):
        raise NotRowwise(f"node %{node.name} ({node.op}) indexes by a mask (its result's size depends on the values)")
    width = max(len(nodes[d].meta.shape) for d in used)
    row_dims = set()  # the broadcast dims that index rows
    for d in used:
        st = indices[d]
        if isinstance(st, Row):
            if st.k != 1 or st.outer != 1:
                raise NotRowwise(f"node %{node.name} ({node.op}) indexes by flattened rows of {s}")
            row_dims.add(st.dim + width - len(nodes[d].meta.shape))
    if not isinstance(x, Row) and any(isinstance(st, Row) and st.index for st in indices):
        _MIXED.get().append(f"%{node.name} looks up a table by the row numbers of {s}")
    if isinstance(x, Row) and not (x.k == 1 and x.outer == 1 and x.dim in used and isinstance(indices[x.dim], Row)
                                   and indices[x.dim].index):
        raise NotRowwise(f"node %{node.name} ({node.op}) reads the rows of {s} by indices other than the row numbers")
    if len(row_dims) > 1:
        raise NotRowwise(f"node %{node.name} ({node.op}) indexes by rows of {s} on different dims")
    if not row_dims:
        return INDEP  # neither x nor the indices have rows (x with rows has its row numbers as an index)
    (bdim,) = row_dims
    adjacent = used == list(range(used[0], used[-1] + 1))  # the broadcast dims stand where the indices stood
    found = Row((used[0] if adjacent else 0) + bdim, pad=x.pad if isinstance(x, Row) else None)
    if _row_of_shape(_shape(node.meta), s) != found:
        raise NotRowwise(f"node %{node.name} ({node.op}): its rows of {s} land on dim {found.dim} of shape "
                         f"{list(_shape(node.meta))}")
    return found


def _assertion(node, states, s):
    """``_assert_scalar(cond, msg)``: a runtime check on sizes that Dynamo leaves in a graph with unbacked sizes
    (a ShapeVar's range: ``u0 <= 32``). It has no value and reads no row, so it never mixes rows; without this
    rule every ShapeVar-declared graph refused padding and ran its sizes between gears on the dynamic graph. A
    padded call runs a gear's static graph, whose own assertions held when that gear was built. A condition
    computed from rows (not from sizes) still refuses."""
    for n, st in _tensor_states(node, states):
        if isinstance(st, Row):
            raise NotRowwise(f"node %{node.name} ({node.op}) asserts on the rows of {s}")
    return INDEP


def _getitem(node, states, s):
    st = states[0]
    return st[node.args[1]] if isinstance(st, tuple) else st


def _size_arith(node, states, s):
    return SYM if isinstance(node.meta, SymMeta) and _has(node.meta.expr, s) else INDEP


# Factories whose values are the same in every run: a random one would draw other numbers once padded.
_DETERMINISTIC_FACTORIES = frozenset(t for t in ops.FACTORIES | ops.LIKE_FACTORIES if not ops.is_nondeterministic(t))

# Op family -> transfer function, single ops after the families; other ops (not pointwise) stop the proof.
_TRANSFER = ops.family_table(
    (ops.RESHAPES, _view),
    (ops.EXPANDS, _expand),
    (ops.PERMUTES, _permute),
    (ops.TRANSPOSES | ops.MATRIX_TRANSPOSES, _transpose),
    (ops.UNSQUEEZES, _unsqueeze),
    (ops.SQUEEZES, _squeeze),
    (ops.SLICES, _slice),
    (ops.SELECTS, _select),
    (ops.ALIASES | ops.COPIES, _identity),
    (ops.REDUCTIONS | {aten.linalg_vector_norm.default}, _reduction),  # the norm: sentence embeddings' normalize
    (ops.SOFTMAXES | ops.SCANS | ops.SCANS_WITH_INDICES | ops.SORTS | ops.TOP_K, _along_dim),
    (ops.LAYER_NORMS, _layer_norm),
    (ops.ATTENTION, _attention),
    (ops.SPLITS | ops.SPLITS_WITH_SIZES | {aten.chunk.default}, _split),
    (ops.RANGES | ops.FULLS | ops.SCALAR_TENSORS | ops.NEW_FACTORIES | _DETERMINISTIC_FACTORIES, _factory),
    (ops.SIZE_QUERIES | ops.SIZE_ARITHMETIC, _size_arith),
    ({aten.mm.default, aten.addmm.default}, _mm),
    ({aten.bmm.default}, _bmm),
    ({aten.embedding.default}, _embedding),
    ({aten.index_select.default}, _index_select),
    ({aten.gather.default}, _gather),
    ({aten.index.Tensor}, _index),
    ({aten.cat.default}, _cat),
    ({operator.getitem}, _getitem),
    ({aten._assert_scalar.default}, _assertion),
    # they broadcast like pointwise ops, though masked_fill.Tensor carries no pointwise tag
    ({aten.where.self, aten.masked_fill.Scalar, aten.masked_fill.Tensor}, _pointwise),
)


# Transfers whose result holds its input's values, rearranged or selected: a row-number mark (Row.index)
# passes through them; any other transfer's result is a plain Row.
_KEEP_VALUES = frozenset({_identity, _view, _expand, _permute, _transpose, _unsqueeze, _squeeze, _slice, _select,
                          _split, _getitem, _cat, _index_select, _factory})


def _exact_indices(meta) -> bool:
    """Whether the value's dtype holds every row number exactly (a cast to int8 or float16 would not)."""
    return all(m.dtype in (torch.int64, torch.int32) for m in iter_metas(meta) if isinstance(m, TensorMeta))


def _plain(state):
    if isinstance(state, tuple):
        return tuple(_plain(x) for x in state)
    return dataclasses.replace(state, index=False) if isinstance(state, Row) and state.index else state


def _transfer_for(node: Node):
    transfer = _TRANSFER.get(node.target)
    if transfer is None and ops.is_pointwise(node.target):
        return _pointwise
    return transfer


def _touches(meta, s) -> bool:
    """Whether the value's shape or size value mentions ``s``."""
    for m in iter_metas(meta):
        if isinstance(m, TensorMeta) and any(_has(x, s) for x in m.shape):
            return True
        if isinstance(m, SymMeta) and _has(m.expr, s):
            return True
    return False


# Transfers that know a `Pair` (a value with rows in two dims); any other op that reads one stops the proof.
_KNOW_PAIRS = frozenset({_pointwise, _expand, _unsqueeze, _identity, _attention, _getitem})


def row_states(graph: Graph, s) -> dict:
    """The state of every node for symbol ``s``; raises NotRowwise naming the node that mixes rows."""
    return row_states_and_mixing(graph, s)[0]


def row_states_and_mixing(graph: Graph, s, unknown_pads: frozenset = frozenset()) -> tuple[dict, list]:
    """`row_states`, and where the rows are mixed with padded positions masked out (pads, but cannot split).
    ``unknown_pads``: input indices whose padded positions may hold any value (not zeros)."""
    env: dict = {}
    mixed: list = []
    tokens = _STATES.set(env), _MIXED.set(mixed)
    try:
        return _row_states(graph, s, env, unknown_pads), mixed
    finally:
        _STATES.reset(tokens[0])
        _MIXED.reset(tokens[1])


def _row_states(graph: Graph, s, env: dict, unknown_pads: frozenset = frozenset()) -> dict:
    index = {n.id: i for i, n in enumerate(graph.placeholders)}
    for node in graph.nodes:
        if node.kind == "placeholder":
            if isinstance(node.meta, TensorMeta):
                shape = _shape(node.meta)
                dims = [d for d, x in enumerate(shape) if _has(x, s)]
                if len(dims) > 1 or (dims and shape[dims[0]] != s):
                    raise NotRowwise(f"input %{node.name} has shape {list(shape)}; padding {s} needs it in one dim as "
                                     f"exactly {s}")
                pad = None if index[node.id] in unknown_pads else 0  # padded with zeros (Padder)
                env[node.id] = Row(dims[0], pad=pad) if dims else INDEP
            elif isinstance(node.meta, SymMeta) and _has(node.meta.expr, s):
                if sympy.sympify(node.meta.expr) != s:
                    raise NotRowwise(f"input %{node.name} is {node.meta.expr}; padding {s} needs it to be {s}")
                env[node.id] = SYM
            else:
                env[node.id] = INDEP
            continue
        if node.kind == "constant":
            env[node.id] = INDEP
            continue
        if node.kind == "output":
            continue
        states = map_nodes(node.args, lambda n: env[n.id])
        if all(x is INDEP for x in iter_instances(states, (Row, _Marker))) and not _touches(node.meta, s):
            env[node.id] = INDEP
            continue
        transfer = _transfer_for(node)
        if transfer is None:
            raise NotRowwise(f"node %{node.name} ({node.op}) is not known to keep the rows of {s} independent")
        if transfer not in _KNOW_PAIRS and any(True for _ in iter_instances(states, (Pair,))):
            raise NotRowwise(f"node %{node.name} ({node.op}) reads a value with the rows of {s} in two dims")
        for v in node.kwargs.values():
            if isinstance(v, Node) and env[v.id] is not INDEP and transfer not in (_factory, _attention):
                raise NotRowwise(f"node %{node.name} ({node.op}) takes a keyword argument depending on {s}")
        keeps = transfer in _KEEP_VALUES and _exact_indices(node.meta)
        if not keeps and transfer is not _index and any(st.index for st in iter_instances(states, (Row,))):
            # a part of a split would count its rows from 0: the values differ from the whole call's
            _MIXED.get().append(f"%{node.name} computes with the row numbers of {s}")
        try:
            result = transfer(node, states, s)
            env[node.id] = result if keeps else _plain(result)
        except NotRowwise as e:
            if f"%{node.name} " in str(e):
                raise
            raise NotRowwise(f"node %{node.name} ({node.op}): {e}") from None
    return env


# -- the runtime side ----------------------------------------------------------------------------

@dataclasses.dataclass
class _SymbolPlan:
    inputs: list  # (input index, dim) tensors to pad
    scalars: list  # SymInt input indices to replace by the gear value
    split_refusal: str | None = None  # why the rows cannot run as separate parts (gear_fallback="fit"), or None
    assumes: tuple = ()  # groups of key positions the proof took as one size each: a call pads only if they are equal
    # (input index, dim) of the one input whose zeros at padded positions the proof needs, whatever the others hold
    # there (an attention mask): positions where it is zero at a row's end may be skipped (gears.regroup); () if none
    masks: tuple = ()


class Padder:
    """Pads inputs up to a gear and slices outputs back, for the symbols proven row-independent."""

    def __init__(self, graph: Graph, symbols: list, plans: dict, output_states: list, output_metas: list):
        self.symbols = symbols  # GearSymbol list (dispatch key order)
        self.plans = plans  # key position -> _SymbolPlan (only paddable symbols; one plan for an axis proven together)
        self.output_states = output_states  # per output: {key position: Row or INDEP}
        self.output_metas = output_metas

    def can_pad(self, position: int) -> bool:
        return position in self.plans

    def plan_of(self, position: int) -> int:
        """Which proof serves this position (positions proven as one size share one)."""
        return id(self.plans[position])

    def can_split(self, position: int) -> bool:
        """Whether rows of this position run as separate parts: independent, not only with padding masked out."""
        return position in self.plans and self.plans[position].split_refusal is None

    def make(self, key: tuple, target: tuple, fn):
        from .spec import GearError

        padded_plans = [self.plans[p] for p, (have, want) in enumerate(zip(key, target)) if have != want]
        for group in {g for plan in padded_plans for g in plan.assumes}:
            if len({key[p] for p in group}) > 1:
                names = ", ".join(f"{self.symbols[p].label} = {key[p]}" for p in group)
                raise GearError(f"{names} are one gear axis, proven paddable only when the sizes are equal")
        pads = []  # (input index, dim, amount)
        scalars = {}
        seen_plans = set()
        for pos, (have, want) in enumerate(zip(key, target)):
            if have == want or id(self.plans[pos]) in seen_plans:
                continue
            plan = self.plans[pos]
            seen_plans.add(id(plan))
            pads.extend((i, d, want - have) for i, d in plan.inputs)
            scalars.update({i: want for i in plan.scalars})
        real = {s.symbol: v for s, v in zip(self.symbols, key)}
        padded = {s.symbol for s, have, want in zip(self.symbols, key, target) if have != want}
        slices, fixed = {}, {}
        for j, (states, meta) in enumerate(zip(self.output_states, self.output_metas)):
            if isinstance(meta, SymMeta):
                fixed[j] = size_output(meta, real)
                continue
            for pos, st in states.items():
                if isinstance(st, Row) and key[pos] != target[pos]:
                    if st.outer != 1:
                        raise GearError(f"cannot pad to gear {target}: output {j} interleaves the rows of "
                                        f"{self.symbols[pos].label} with another dim")
                    k = sympy.sympify(st.k)
                    if k.free_symbols & padded or k.subs(real).free_symbols:
                        raise GearError(f"cannot pad to gear {target}: output {j} has rows in blocks of {k}, "
                                        f"a size that is padded too or is no gear")
                    k = k.subs(real)
                    slices[(j, st.dim)] = int(k) * key[pos]
        slices = [(j, d, n) for (j, d), n in slices.items()]

        def run_padded(*args):
            args = list(args)
            for i, d, amount in pads:
                x = args[i]
                shape = list(x.shape)
                shape[d] = amount
                args[i] = torch.cat([x, x.new_zeros(shape)], dim=d)
            for i, v in scalars.items():
                args[i] = v
            outs = list(fn(*args))
            for j, d, n in slices:
                outs[j] = outs[j].narrow(d, 0, n)
            for j, v in fixed.items():
                outs[j] = v
            return tuple(outs)
        return run_padded


def size_output(meta: SymMeta, sizes: dict):
    """The value of an output that is a size expression (``meta``), at the real ``sizes`` ({symbol: value}): a padded,
    split or regrouped call returns the call's own sizes, not the gear's."""
    return meta.pytype(sympy.sympify(meta.expr).subs(sizes))


def tied_positions(gears: list, n: int) -> list[list[int]]:
    """Groups of dispatch-key positions whose symbols take one value in every gear: one gear axis that the trace
    kept as several symbols (bert's input_ids and attention_mask batch). Each position is in one group."""
    groups: list = []
    for p in range(n):
        for g in groups:
            if all(key[g[0]] == key[p] for key in gears):
                g.append(p)
                break
        else:
            groups.append([p])
    return groups


def _within_gears(graph: Graph, s, upper: int | None) -> Graph:
    """``graph`` where ``Min(c, s)`` is ``s`` when no gear of ``s`` exceeds ``c`` (a position table of ``c`` rows
    sliced to the sequence: every gear, and so every padded call, reads ``s`` of its rows)."""
    if upper is None:
        return graph
    mins = set()
    for node in graph.nodes:
        for m in iter_metas(node.meta):
            exprs = m.shape if isinstance(m, TensorMeta) and m.shape is not None else \
                [m.expr] if isinstance(m, SymMeta) else []
            for e in exprs:
                mins |= {x for x in sympy.preorder_traversal(sympy.sympify(e)) if type(x).__name__ == "Min"  # sympy's
                         # or torch's own (torch.utils._sympy)
                         and any(_is(a, s) for a in x.args)
                         and all(_is(a, s) or (a.is_Integer and a >= upper) for a in x.args)}
    if not mins:
        return graph
    from ..shape import rename_symbols

    return rename_symbols(graph, {m: next(a for a in m.args if _is(a, s)) for m in mins})


def _is(expr, s) -> bool:
    """``expr`` is the symbol ``s`` (by name: symbols made elsewhere may carry other assumptions)."""
    return isinstance(expr, sympy.Symbol) and expr.name == str(s)


_VIEWING = ops.VIEWS | ops.RESHAPES | ops.ALIASES  # a reshape of a contiguous input is a view too


def _output_viewing_an_input(graph: Graph) -> int | None:
    """The first output that is a view of a graph input (through views only), or None. Such an output is rebuilt by
    AOTAutograd from the caller's input with the sizes the graph gave it: a padded call's would not fit."""
    for j, out in enumerate(_outputs(graph)):
        node = out
        while isinstance(node, Node) and node.kind == "call" and node.target in _VIEWING and node.args:
            node = node.args[0]
        if isinstance(node, Node) and node.kind == "placeholder" and node is not out:
            return j
    return None


def _outputs(graph: Graph) -> list:
    outputs = graph.outputs
    return list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]


def _prove(graph: Graph, s, unknown_pads: frozenset = frozenset()):
    """(plan, each output's state) when ``graph`` keeps the rows of ``s`` independent; raises NotRowwise.
    ``unknown_pads``: input indices whose padded positions may hold anything (the proof must not need their zeros)."""
    env, mixed = row_states_and_mixing(graph, s, unknown_pads)
    states = []
    outputs = _outputs(graph)
    if any(isinstance(env.get(out.id), Row) and env[out.id].index for out in outputs if isinstance(out, Node)):
        mixed.append(f"an output holds the row numbers of {s}")
    for j, out in enumerate(outputs):
        st = env[out.id] if isinstance(out, Node) else INDEP
        if isinstance(out, Node) and isinstance(out.meta, TensorMeta) and not isinstance(st, Row) and st is not INDEP:
            raise NotRowwise(f"output {j} (%{out.name}) is not row-wise in {s}")
        states.append(st)
    placeholders = graph.placeholders
    plan = _SymbolPlan(inputs=[(i, env[p.id].dim) for i, p in enumerate(placeholders)
                               if isinstance(p.meta, TensorMeta) and isinstance(env[p.id], Row)],
                       scalars=[i for i, p in enumerate(placeholders) if env[p.id] is SYM],
                       split_refusal="; ".join(mixed[:2]) if mixed else None)
    return plan, states


def _masking_input(graph: Graph, s, plan: _SymbolPlan) -> tuple:
    """((input index, dim),) of the one input whose zeros at padded positions ``plan``'s proof needs, found by proving it
    again with every other input's padded positions holding anything; () when no one input suffices, or when the proof
    needs no input's zeros at all (``is_causal``: then no input says which positions are padding)."""
    if plan.split_refusal is None:
        return ()  # positions independent: nothing marks some of them as padding
    carried = frozenset(i for i, _ in plan.inputs)
    try:
        _prove(graph, s, carried)
        return ()
    except NotRowwise:
        pass
    for i, d in plan.inputs:
        try:
            _prove(graph, s, carried - {i})
        except NotRowwise:
            continue
        return ((i, d),)
    return ()


def plan_padding(graph: Graph, symbols: list, gears: list | None = None, find_masks: bool = False):
    """A Padder for the gear symbols that may be padded, and why the others may not (None if all may).
    ``find_masks``: also find each plan's attention mask (`_SymbolPlan.masks`, for ``padded_tokens="skip"``).

    Each symbol is proven alone first. Symbols that are one gear axis (equal in every gear of ``gears``) and that
    fail alone are proven together: on the graph with every such axis as one symbol (`rename_symbols`); a plan
    proven so pads only calls whose sizes are equal on each of those axes (`_SymbolPlan.assumes`)."""
    from ..shape import rename_symbols

    outputs = _outputs(graph)
    aliased = _output_viewing_an_input(graph)
    if aliased is not None:  # AOTAutograd rebuilds such an output from the caller's own tensor, at the gear's size
        return None, f"output {aliased} is a view of an input: torch rebuilds it from the caller's tensor"
    plans, refusals = {}, {}
    output_states = [dict() for _ in outputs]
    for pos, gs in enumerate(symbols):
        try:
            upper = max(g[pos] for g in gears) if gears else None
            proven = _within_gears(graph, gs.symbol, upper)
            plan, states = _prove(proven, gs.symbol)
        except NotRowwise as e:
            refusals[pos] = f"{gs.label} ({gs.symbol}): {e}"
            continue
        if find_masks:
            plan.masks = _masking_input(proven, gs.symbol, plan)
        plans[pos] = plan
        for j, st in enumerate(states):
            output_states[j][pos] = st
    tied = tuple(tuple(g) for g in (tied_positions(gears, len(symbols)) if gears else []) if len(g) > 1)
    # every gear axis the trace kept as several symbols made one size: the graph the calls that pad run
    merged = rename_symbols(graph, {symbols[p].symbol: symbols[g[0]].symbol for g in tied for p in g[1:]})
    for group in tied:
        if not any(p in refusals for p in group):
            continue
        s = symbols[group[0]].symbol
        try:
            proven = _within_gears(merged, s, max(g[group[0]] for g in gears))
            plan, states = _prove(proven, s)
        except NotRowwise as e:
            refusals[group[0]] += f" (with the gear axes' symbols as one size each: {e})"
            continue
        plan.assumes = tied
        if find_masks:
            plan.masks = _masking_input(proven, s, plan)
        for p in group:
            plans[p] = plan
            refusals.pop(p, None)
            for j, st in enumerate(states):
                output_states[j][p] = st
    refusal = "; ".join(refusals.values()) if refusals else None
    if not plans:
        return None, refusal
    metas = [o.meta if isinstance(o, Node) else None for o in outputs]
    return Padder(graph, symbols, plans, output_states, metas), refusal
