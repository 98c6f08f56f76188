"""Hypothesis strategies for random graphs, inputs and tensors.

Rule checks and pass tests need values that break unsound rewrites, not just random floats: every
tensor drawn here is seasoned with NaN, +-inf, -0.0 and the extreme integers, and `graphs()` builds
graphs from the ops rules rewrite (elementwise, scalar, shape, reduction and matmul ops) with the
literals identity rules look for, such as ``x * 1`` and ``permute(permute(x))``. Every op's output
meta comes from torch's meta kernels, so a drawn graph is valid by construction.

The dtype tuples here are ordered for shrinking (hypothesis shrinks towards the first element), so
they differ on purpose from the dtype groups of `rewrite.ops`; the op table below, which only asks
whether a dtype is in a group, uses those.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from typing import Callable, Sequence

import sympy
import torch
from hypothesis import strategies as st

from ..passes.boundary import alias_base
from ..ir import Graph, Node, TensorMeta, map_nodes
from ..ops import FLOATS, INTS

aten = torch.ops.aten

FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES + (torch.bool,)
# The dtypes random graphs are built over: what real models use on CPU, plus a narrow int to
# catch overflow.
GRAPH_DTYPES = (torch.float32, torch.float64, torch.int64, torch.int32, torch.int8, torch.bool)

MAX_DIM = 4  # largest size of one dimension in generated tensors
MAX_RANK = 4


def fuzz_examples(default: int) -> int:
    """How many random examples a fuzz test runs: ``REWRITE_FUZZ_EXAMPLES`` (`make fuzz`) or ``default``."""
    raw = os.environ.get("REWRITE_FUZZ_EXAMPLES")
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"REWRITE_FUZZ_EXAMPLES={raw!r} is not an integer; set a positive example count") from None
    if value <= 0:
        raise ValueError(f"REWRITE_FUZZ_EXAMPLES={value} must be a positive example count")
    return value


# ================================================================================================
# Values: tensors seasoned with the values that break unsound rules
# ================================================================================================

def special_values(dtype: torch.dtype) -> list:
    """The values most likely to expose an unsound rewrite for ``dtype``."""
    if dtype == torch.bool:
        return [False, True]
    if dtype.is_floating_point:
        fi = torch.finfo(dtype)
        return [math.nan, math.inf, -math.inf, -0.0, 0.0, 1.0, -1.0, fi.max, -fi.max, fi.tiny, 0.5]
    ii = torch.iinfo(dtype)
    return sorted({ii.min, ii.max, 0, 1, -1 if ii.min < 0 else 2, ii.min + 1, ii.max - 1})


def make_tensor(shape: Sequence[int], dtype: torch.dtype, seed: int, special_fraction: float) -> torch.Tensor:
    """A reproducible random tensor; about ``special_fraction`` of its elements are special values."""
    gen = torch.Generator().manual_seed(seed)
    shape = tuple(int(s) for s in shape)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) < 0.5
    if dtype.is_floating_point:
        base = (torch.randn(shape, generator=gen, dtype=torch.float64) * 3).to(dtype)
    else:
        ii = torch.iinfo(dtype)
        lo, hi = max(ii.min, -100), min(ii.max, 100)
        base = torch.randint(lo, hi + 1, shape, generator=gen, dtype=torch.int64).to(dtype)
    if special_fraction > 0 and base.numel():
        specials = torch.tensor(special_values(dtype), dtype=torch.float64 if dtype.is_floating_point else torch.int64)
        mask = torch.rand(shape, generator=gen) < special_fraction
        pick = torch.randint(0, len(specials), shape, generator=gen)
        base = torch.where(mask, specials[pick].to(dtype), base)
    return base


@st.composite
def tensors(draw, shape: Sequence[int], dtype: torch.dtype, specials: bool = True) -> torch.Tensor:
    """A tensor of ``shape`` and ``dtype``; with ``specials`` some elements are NaN/inf/-0.0/extremes."""
    seed = draw(st.integers(0, 2**31 - 1))
    fraction = draw(st.sampled_from([0.0, 0.1, 0.5, 1.0])) if specials else 0.0
    return make_tensor(shape, dtype, seed, fraction)


def graph_inputs(graph: Graph, specials: bool = True):
    """A strategy for a list of inputs matching ``graph``'s placeholders (static shapes only)."""
    parts = []
    for p in graph.placeholders:
        meta = p.meta
        if not isinstance(meta, TensorMeta):
            raise ValueError(f"graph_inputs: placeholder {p.name} has meta {meta!r}; only tensor inputs are supported")
        if not meta.is_static():
            raise ValueError(f"graph_inputs: placeholder {p.name} has symbolic shape {meta}; substitute sizes first")
        parts.append(tensors([int(s) for s in meta.shape], meta.dtype, specials))
    return st.tuples(*parts).map(list)


# ================================================================================================
# The op catalogue random graphs are built from
# ================================================================================================

def _meta_tensor(meta: TensorMeta) -> torch.Tensor:
    return torch.empty([int(s) for s in meta.shape], dtype=meta.dtype, device="meta")


def infer_meta(target, args, kwargs=None, env: dict | None = None):
    """Output meta of ``target(*args)`` where Node arguments stand for tensors: torch's meta kernels.

    ``env`` maps node ids to the meta tensors computed so far, so strides propagate (a ``view`` of
    a transposed tensor is rejected here, as it would be at run time); the result's meta tensor is
    added to it under the key ``"last"``.
    """
    env = {} if env is None else env

    def lower(node: Node) -> torch.Tensor:
        return env[node.id] if node.id in env else _meta_tensor(node.meta)

    out = target(*map_nodes(tuple(args), lower), **map_nodes(dict(kwargs or {}), lower))
    if isinstance(out, torch.Tensor):
        env["last"] = out
        return TensorMeta(out.dtype, tuple(sympy.Integer(s) for s in out.shape))
    raise TypeError(f"{target} returned {type(out).__name__}; random graphs use single-tensor ops only")


def shape_of(node: Node) -> tuple[int, ...]:
    return tuple(int(s) for s in node.meta.shape)


@st.composite
def reshapes(draw, shape: Sequence[int]) -> list[int]:
    """A random shape with the same number of elements (sometimes the same shape, sometimes with -1)."""
    n = math.prod(shape)
    if draw(st.integers(0, 3)) == 0:
        return list(shape)
    if n == 0:  # an empty tensor (an empty slice): any shape with a zero in it
        return draw(st.sampled_from([list(shape), [0], [2, 0], [0, 3, 1]]))
    rank = draw(st.integers(0 if n == 1 else 1, MAX_RANK))
    dims, rest = [], n
    for _ in range(max(rank - 1, 0)):
        divisors = [d for d in range(1, rest + 1) if rest % d == 0]
        d = draw(st.sampled_from(divisors))
        dims.append(d)
        rest //= d
    if rank:
        dims.append(rest)
    dims = draw(st.permutations(dims)) if dims else []
    if dims and n > 0 and draw(st.booleans()):
        dims = list(dims)
        dims[draw(st.integers(0, len(dims) - 1))] = -1
    return list(dims)


@st.composite
def permutations_of(draw, rank: int) -> list[int]:
    if rank == 0:
        return []
    return list(draw(st.permutations(range(rank))))


def draw_dim(draw, rank: int, extra: int = 0) -> int:
    """A dimension index in [-rank-extra, rank+extra-1], or 0 for rank 0."""
    r = rank + extra
    return draw(st.integers(-r, r - 1)) if r else 0


@dataclasses.dataclass(frozen=True)
class OpGen:
    """How to draw one op application: ``draw_args(draw, x, pool, emit)`` returns ``(target, args,
    kwargs)`` or None when the op does not fit ``x``.

    ``x`` is the tensor node the op is applied to; ``pool`` holds every tensor node so far (for
    binary ops and cat); ``emit(target, args)`` adds a helper node. ``dtypes`` restricts the
    dtypes of ``x`` the op is drawn for.
    """

    name: str
    draw_args: Callable
    dtypes: tuple = ALL_DTYPES
    min_rank: int = 0


def _same_shape_partner(draw, x: Node, pool: list[Node], same_dtype: bool = False, bool_ok: bool = True) -> Node:
    """An operand that broadcasts with ``x``: a node of the same shape if one exists, else x."""
    candidates = [n for n in pool if shape_of(n) == shape_of(x)
                  and (not same_dtype or n.meta.dtype == x.meta.dtype)
                  and (bool_ok or n.meta.dtype != torch.bool)]
    return draw(st.sampled_from(candidates)) if candidates else x


def _scalar_for(draw, dtype: torch.dtype):
    """A scalar operand, biased to the identities and absorbing elements rules look for."""
    if dtype.is_floating_point:
        return draw(st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.0, 0.5, 0, 1, -1, 3]))
    return draw(st.sampled_from([0, 1, -1, 2, 3]))


def _unary(op):
    return lambda draw, x, pool, emit: (op, (x,), {})


def _binary(op, bool_ok: bool = True):
    # The meta kernel of sub accepts a bool operand; the real kernel refuses it.
    return lambda draw, x, pool, emit: (op, (x, _same_shape_partner(draw, x, pool, bool_ok=bool_ok)), {})


def _with_scalar(op):
    return lambda draw, x, pool, emit: (op, (x, _scalar_for(draw, x.meta.dtype)), {})


def _pow_scalar(draw, x, pool, emit):
    exps = [1, 2, 3, 0, 0.5, 1.0, 2.0, -1.0] if x.meta.dtype.is_floating_point else [0, 1, 2, 3]
    return aten.pow.Tensor_Scalar, (x, draw(st.sampled_from(exps))), {}


def _view(op):
    return lambda draw, x, pool, emit: (op, (x, draw(reshapes(shape_of(x)))), {})


def _permute(draw, x, pool, emit):
    return aten.permute.default, (x, draw(permutations_of(x.meta.rank))), {}


def _transpose(draw, x, pool, emit):
    r = x.meta.rank
    return aten.transpose.int, (x, draw_dim(draw, r), draw_dim(draw, r)), {}


def _unsqueeze(draw, x, pool, emit):
    return aten.unsqueeze.default, (x, draw_dim(draw, x.meta.rank, extra=1)), {}


def _squeeze(draw, x, pool, emit):
    shape = shape_of(x)
    ones = [d for d, s in enumerate(shape) if s == 1]
    if ones and draw(st.booleans()):
        return aten.squeeze.dims, (x, draw(st.lists(st.sampled_from(ones), min_size=1, max_size=len(ones), unique=True))), {}
    if shape and draw(st.booleans()):
        return aten.squeeze.dim, (x, draw_dim(draw, len(shape))), {}
    return aten.squeeze.default, (x,), {}


def _expand(draw, x, pool, emit):
    shape = shape_of(x)
    new = [draw(st.integers(1, 3)) if s == 1 else s for s in shape]
    if draw(st.booleans()):
        new = [-1 if draw(st.booleans()) else s for s in new]
    lead = draw(st.lists(st.integers(1, 3), max_size=max(0, MAX_RANK - len(shape))))
    return aten.expand.default, (x, lead + new), {}


def _slice(draw, x, pool, emit):
    shape = shape_of(x)
    dim = draw(st.integers(0, len(shape) - 1))
    size = shape[dim]
    start = draw(st.sampled_from([0, 0, 1, -1, None]))
    end = draw(st.sampled_from([size, 2**63 - 1, -1, 1, None]))
    step = draw(st.sampled_from([1, 1, 2]))
    return aten.slice.Tensor, (x, dim, start, end, step), {}


def _cat(draw, x, pool, emit):
    dim = draw_dim(draw, x.meta.rank)
    d = dim % x.meta.rank
    mates = [n for n in pool if n.meta.rank == x.meta.rank and n.meta.dtype == x.meta.dtype
             and all(a == b for i, (a, b) in enumerate(zip(shape_of(n), shape_of(x))) if i != d)]
    parts = [x] + draw(st.lists(st.sampled_from(mates), max_size=2))
    return aten.cat.default, (parts, dim), {}


def _to_copy(draw, x, pool, emit):
    return aten._to_copy.default, (x,), {"dtype": draw(st.sampled_from(GRAPH_DTYPES))}


def _sum(draw, x, pool, emit):
    r = x.meta.rank
    dims = draw(st.lists(st.integers(0, r - 1), min_size=1, max_size=r, unique=True))
    return aten.sum.dim_IntList, (x, dims, draw(st.booleans())), {}


def _amax(draw, x, pool, emit):
    r = x.meta.rank
    return aten.amax.default, (x, [draw(st.integers(0, r - 1))], draw(st.booleans())), {}


def _mean(draw, x, pool, emit):
    r = x.meta.rank
    return aten.mean.dim, (x, [draw(st.integers(0, r - 1))], draw(st.booleans())), {}


def _mm(draw, x, pool, emit):
    k = shape_of(x)[1]
    mates = [n for n in pool if n.meta.rank == 2 and shape_of(n)[0] == k and n.meta.dtype == x.meta.dtype]
    # No matrix of matching size yet: multiply by x's own transpose.
    other = draw(st.sampled_from(mates)) if mates else emit(aten.permute.default, (x, [1, 0]))
    return aten.mm.default, (x, other), {}


def _where(draw, x, pool, emit):
    conds = [n for n in pool if n.meta.dtype == torch.bool and shape_of(n) == shape_of(x)]
    cond = draw(st.sampled_from(conds)) if conds else None
    if cond is None:
        return None
    return aten.where.self, (cond, x, _same_shape_partner(draw, x, pool, same_dtype=True)), {}


_NUMBERS = FLOATS + INTS

# Every op random graphs use, as a table: name, how to draw its arguments, which dtypes of the
# first operand it is drawn for (a set: the order does not matter), the rank it needs.
OPS: tuple[OpGen, ...] = (
    OpGen("neg", _unary(aten.neg.default), _NUMBERS),
    OpGen("abs", _unary(aten.abs.default), _NUMBERS),
    OpGen("relu", _unary(aten.relu.default), _NUMBERS),
    *(OpGen(name, _unary(getattr(aten, name).default), FLOATS)
      for name in ("exp", "log", "sqrt", "rsqrt", "reciprocal", "tanh", "sigmoid", "sin", "floor")),
    OpGen("bitwise_not", _unary(aten.bitwise_not.default), INTS + (torch.bool,)),
    OpGen("logical_not", _unary(aten.logical_not.default)),
    OpGen("add", _binary(aten.add.Tensor), _NUMBERS),
    OpGen("sub", _binary(aten.sub.Tensor, bool_ok=False), _NUMBERS),
    OpGen("mul", _binary(aten.mul.Tensor)),
    OpGen("div", _binary(aten.div.Tensor), _NUMBERS),
    OpGen("maximum", _binary(aten.maximum.default)),
    OpGen("minimum", _binary(aten.minimum.default)),
    OpGen("lt", _binary(aten.lt.Tensor), _NUMBERS),
    OpGen("eq", _binary(aten.eq.Tensor)),
    OpGen("where", _where),
    OpGen("add_scalar", _with_scalar(aten.add.Tensor), _NUMBERS),
    OpGen("sub_scalar", _with_scalar(aten.sub.Tensor), _NUMBERS),
    OpGen("mul_scalar", _with_scalar(aten.mul.Tensor), _NUMBERS),
    OpGen("div_scalar", _with_scalar(aten.div.Tensor), FLOATS),
    OpGen("pow_scalar", _pow_scalar, _NUMBERS),
    OpGen("view", _view(aten.view.default)),
    OpGen("reshape", _view(aten.reshape.default)),
    OpGen("unsafe_view", _view(aten._unsafe_view.default)),
    OpGen("permute", _permute),
    OpGen("transpose", _transpose, min_rank=1),
    OpGen("t", _unary(aten.t.default), min_rank=2),
    OpGen("unsqueeze", _unsqueeze),
    OpGen("squeeze", _squeeze),
    OpGen("expand", _expand),
    OpGen("slice", _slice, min_rank=1),
    OpGen("cat", _cat, min_rank=1),
    OpGen("clone", _unary(aten.clone.default)),
    OpGen("alias", _unary(aten.alias.default)),
    OpGen("to_copy", _to_copy),
    OpGen("sum", _sum, _NUMBERS, min_rank=1),
    OpGen("amax", _amax, _NUMBERS, min_rank=1),
    OpGen("mean", _mean, FLOATS, min_rank=1),
    OpGen("mm", _mm, FLOATS, min_rank=2),
)


def _full_like(draw, x, pool, emit):
    value = _scalar_for(draw, x.meta.dtype) if x.meta.dtype != torch.bool else draw(st.booleans())
    return aten.full_like.default, (x, value), {}


# Tensors of one value shaped like another: what constant-folding passes recognise (``x + zeros``,
# ``x * ones``). Not in `OPS` (rewrite's own fuzzers draw from OPS); `check_fx_pass` adds them.
FILL_OPS: tuple[OpGen, ...] = (
    OpGen("zeros_like", _unary(aten.zeros_like.default)),
    OpGen("ones_like", _unary(aten.ones_like.default)),
    OpGen("full_like", _full_like),
)


def _applicable(gen: OpGen, x: Node) -> bool:
    if x.meta.dtype not in gen.dtypes or x.meta.rank < gen.min_rank:
        return False
    if gen.name in ("t", "mm"):
        return x.meta.rank == 2
    return True


@st.composite
def shapes(draw, min_rank: int = 0, max_rank: int = 3, max_dim: int = MAX_DIM) -> list[int]:
    return draw(st.lists(st.integers(1, max_dim), min_size=min_rank, max_size=max_rank))


@st.composite
def graphs(draw, max_inputs: int = 3, max_ops: int = 8, dtypes: Sequence[torch.dtype] = GRAPH_DTYPES,
           ops: Sequence[OpGen] = OPS, constants: bool = True, mutations: bool = True,
           all_sinks: bool = False) -> Graph:
    """A random valid graph: 1..max_inputs tensor inputs, 1..max_ops ops from ``ops``, 1-3 outputs.

    With ``all_sinks`` every op result nothing else reads is returned too, so no op is dead code
    (a pass checker wants every rewritten op to reach an output).

    Every op's output meta comes from torch's meta kernels (with strides), so the graph is valid
    by construction. Some inputs share a shape (so binary ops, cat and where find partners), small
    constant tensors are mixed in (so folding has work to do), and with ``mutations`` some graphs
    end by updating an input with ``copy_``, the functional form AOTAutograd gives to in-place
    updates of inputs (so a rewrite that returns an input where a fresh value was due shows up).
    """
    if not ops:
        raise ValueError("graphs(): ops must name at least one OpGen from rewrite.testing.OPS")
    g = Graph("random")
    pool: list[Node] = []
    base_shape = draw(shapes())
    main_dtype = draw(st.sampled_from(list(dtypes)))
    for i in range(draw(st.integers(1, max_inputs))):
        shape = base_shape if draw(st.booleans()) else draw(shapes())
        dtype = main_dtype if draw(st.integers(0, 3)) else draw(st.sampled_from(list(dtypes)))
        p = g.placeholder(f"x{i}", TensorMeta(dtype, tuple(sympy.Integer(s) for s in shape)))
        pool.append(p)
    if constants and draw(st.integers(0, 3)) == 0:
        shape = draw(st.sampled_from([shape_of(n) for n in pool] + [()]))
        value = draw(tensors(shape, main_dtype, specials=False))
        pool.append(g.constant(value))
    made: list[Node] = []

    env: dict = {}  # node id -> meta tensor (with strides)

    def add(target, args, kwargs, meta: TensorMeta) -> Node:
        """Add a call whose meta `infer_meta` just computed (its meta tensor is ``env["last"]``)."""
        node = g.call(target, args, kwargs, meta=meta)
        env[node.id] = env.pop("last")
        pool.append(node)
        return node

    def emit(target, args):
        return add(target, args, None, infer_meta(target, args, env=env))

    n_ops = draw(st.integers(1, max_ops))
    attempts = 0
    while len(made) < n_ops and attempts < n_ops * 6:
        attempts += 1
        # Prefer the newest values so graphs grow deep chains (where rewrite rules interact).
        x = draw(st.sampled_from(pool[-3:] if draw(st.booleans()) else pool))
        candidates = [o for o in ops if _applicable(o, x)]
        if not candidates:
            continue
        gen = draw(st.sampled_from(candidates))
        drawn = gen.draw_args(draw, x, pool, emit)
        if drawn is None:
            continue
        target, args, kwargs = drawn
        try:
            meta = infer_meta(target, args, kwargs, env=env)
        except Exception:  # the meta kernel rejected this combination: draw another op
            continue
        if math.prod(int(s) for s in meta.shape) > 4096:
            continue
        made.append(add(target, args, kwargs, meta))
    if not made:
        made.append(g.call(aten.clone.default, (pool[0],), meta=pool[0].meta))
    extra = draw(st.lists(st.sampled_from(made), max_size=2, unique_by=lambda n: n.id))
    outs = [made[-1]] + [n for n in extra if n is not made[-1]]
    if all_sinks:
        users = g.users()
        outs += [n for n in made if not users[n.id] and all(n is not o for o in outs)]
    if mutations and draw(st.integers(0, 3)) == 0:
        # AOTAutograd's functional form: every input update is a copy_ at the tail, after all reads.
        # Up to two of them, so a pass that reorders updates and reads has something to break.
        inputs = [p for p in g.placeholders if p.meta.dtype != torch.bool]
        targets = draw(st.lists(st.sampled_from(inputs), max_size=2, unique_by=lambda n: n.id)) if inputs else []
        for target in targets:
            # Not a view of an input: copy_ refuses overlapping source and destination, and a view
            # of an input updated earlier would read the update (AOTAutograd never emits that).
            sources = [n for n in made if shape_of(n) == shape_of(target)
                       and n.meta.dtype == target.meta.dtype and alias_base(n) is None]
            if sources:
                g.call(aten.copy_.default, (target, draw(st.sampled_from(sources))), meta=target.meta)
    g.set_output(tuple(outs))
    g.validate()
    return g


@contextlib.contextmanager
def shrinking_limited_to(seconds: float):
    """Hypothesis's shrink time limit (five minutes; documented as monkeypatchable), for one check only.

    Each shrink step draws and traces a graph (~40 ms), and most of the reduction comes early."""
    from hypothesis.internal.conjecture import engine

    saved = engine.MAX_SHRINKING_SECONDS
    engine.MAX_SHRINKING_SECONDS = seconds
    try:
        yield
    finally:
        engine.MAX_SHRINKING_SECONDS = saved
