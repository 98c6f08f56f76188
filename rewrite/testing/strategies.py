"""Property-based checking for rules and passes.

Three tools, all built on hypothesis and on the executor every compiled graph uses
(`rewrite.exec.codegen.compile_graph_to_python`):

* strategies: `graphs()` draws random valid `Graph`s over the ops in `OPS` (elementwise, scalar,
  shape, reduction and matmul ops, with the literals identity rules look for, such as ``x * 1``
  and ``permute(permute(x))``); `graph_inputs(graph)` draws inputs for one, seasoned with NaN,
  +-inf, -0.0 and the extreme integers;
* `assert_equivalent(before, after)`: runs a graph before and after a pass on the same inputs and
  raises an AssertionError naming the input, the output and the elements that differ;
* `check_rule(rule)` / `check_ruleset_module(name)`: instantiate a rule's pattern with random
  shapes, dtypes and values that satisfy its conditions and compare both sides bit for bit
  (NaN matches NaN, -0.0 must stay -0.0), printing a counterexample when they differ.

Checking a rule of your own::

    from rewrite.dsl import aten, is_float, rule, variables
    from rewrite.testing import check_rule
    x, = variables("x")
    check_rule(rule(aten.mul.Tensor(x, 0.0), aten.zeros_like.default(x), when=[is_float(x)]))
    # AssertionError: rule ... is unsound: ... expected -0.0, got 0.0
    # counterexample:  x = float16[]: -0.0

``python -m rewrite check-rules mypkg.my_rules`` does the same for every rule of a module.
"""
from __future__ import annotations

import dataclasses
import importlib
import logging
import math
import os
from typing import Any, Callable, Sequence

import sympy
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ..exec.codegen import compile_graph_to_python
from ..ir import Graph, Node, TensorMeta, format_graph

log = logging.getLogger("rewrite")
aten = torch.ops.aten

__all__ = [
    "FLOAT_DTYPES",
    "INT_DTYPES",
    "ALL_DTYPES",
    "OPS",
    "tensors",
    "graphs",
    "graph_inputs",
    "run_graph",
    "compare_outputs",
    "assert_equivalent",
    "check_rule",
    "check_ruleset",
    "check_ruleset_module",
    "RuleCheckReport",
    "ModuleCheckReport",
    "fuzz_examples",
    "make_tensor",
    "special_values",
    "infer_meta",
    "compare_tensors",
]

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

    def lower(a):
        if isinstance(a, Node):
            return env[a.id] if a.id in env else _meta_tensor(a.meta)
        if isinstance(a, (list, tuple)):
            return type(a)(lower(x) for x in a)
        return a

    out = target(*lower(args), **{k: lower(v) for k, v in (kwargs or {}).items()})
    if isinstance(out, torch.Tensor):
        env["last"] = out
        return TensorMeta(out.dtype, tuple(sympy.Integer(s) for s in out.shape))
    raise TypeError(f"{target} returned {type(out).__name__}; random graphs use single-tensor ops only")


def shape_of(node: Node) -> tuple[int, ...]:
    return tuple(int(s) for s in node.meta.shape)


def _numel(shape) -> int:
    return math.prod(shape)


@st.composite
def reshapes(draw, shape: Sequence[int]) -> list[int]:
    """A random shape with the same number of elements (sometimes the same shape, sometimes with -1)."""
    n = _numel(shape)
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


def _dim(draw, rank: int, extra: int = 0) -> int:
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
    return aten.transpose.int, (x, _dim(draw, r), _dim(draw, r)), {}


def _unsqueeze(draw, x, pool, emit):
    return aten.unsqueeze.default, (x, _dim(draw, x.meta.rank, extra=1)), {}


def _squeeze(draw, x, pool, emit):
    shape = shape_of(x)
    ones = [d for d, s in enumerate(shape) if s == 1]
    if ones and draw(st.booleans()):
        return aten.squeeze.dims, (x, draw(st.lists(st.sampled_from(ones), min_size=1, max_size=len(ones), unique=True))), {}
    if shape and draw(st.booleans()):
        return aten.squeeze.dim, (x, _dim(draw, len(shape))), {}
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
    dim = _dim(draw, x.meta.rank)
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


_FLOAT = FLOAT_DTYPES
_NUM = FLOAT_DTYPES + INT_DTYPES

# Every op random graphs use, as a table: name, how to draw its arguments, which dtypes of the
# first operand it is drawn for, the rank it needs.
OPS: tuple[OpGen, ...] = (
    OpGen("neg", _unary(aten.neg.default), _NUM),
    OpGen("abs", _unary(aten.abs.default), _NUM),
    OpGen("relu", _unary(aten.relu.default), _NUM),
    OpGen("exp", _unary(aten.exp.default), _FLOAT),
    OpGen("log", _unary(aten.log.default), _FLOAT),
    OpGen("sqrt", _unary(aten.sqrt.default), _FLOAT),
    OpGen("rsqrt", _unary(aten.rsqrt.default), _FLOAT),
    OpGen("reciprocal", _unary(aten.reciprocal.default), _FLOAT),
    OpGen("tanh", _unary(aten.tanh.default), _FLOAT),
    OpGen("sigmoid", _unary(aten.sigmoid.default), _FLOAT),
    OpGen("sin", _unary(aten.sin.default), _FLOAT),
    OpGen("floor", _unary(aten.floor.default), _FLOAT),
    OpGen("bitwise_not", _unary(aten.bitwise_not.default), INT_DTYPES + (torch.bool,)),
    OpGen("logical_not", _unary(aten.logical_not.default)),
    OpGen("add", _binary(aten.add.Tensor), _NUM),
    OpGen("sub", _binary(aten.sub.Tensor, bool_ok=False), _NUM),
    OpGen("mul", _binary(aten.mul.Tensor)),
    OpGen("div", _binary(aten.div.Tensor), _NUM),
    OpGen("maximum", _binary(aten.maximum.default)),
    OpGen("minimum", _binary(aten.minimum.default)),
    OpGen("lt", _binary(aten.lt.Tensor), _NUM),
    OpGen("eq", _binary(aten.eq.Tensor)),
    OpGen("where", _where),
    OpGen("add_scalar", _with_scalar(aten.add.Tensor), _NUM),
    OpGen("sub_scalar", _with_scalar(aten.sub.Tensor), _NUM),
    OpGen("mul_scalar", _with_scalar(aten.mul.Tensor), _NUM),
    OpGen("div_scalar", _with_scalar(aten.div.Tensor), _FLOAT),
    OpGen("pow_scalar", _pow_scalar, _NUM),
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
    OpGen("sum", _sum, _NUM, min_rank=1),
    OpGen("amax", _amax, _NUM, min_rank=1),
    OpGen("mean", _mean, _FLOAT, min_rank=1),
    OpGen("mm", _mm, _FLOAT, min_rank=2),
)


def _applicable(gen: OpGen, x: Node) -> bool:
    if x.meta.dtype not in gen.dtypes or x.meta.rank < gen.min_rank:
        return False
    if gen.name == "t":
        return x.meta.rank == 2
    if gen.name == "mm":
        return x.meta.rank == 2
    return True


@st.composite
def shapes(draw, min_rank: int = 0, max_rank: int = 3, max_dim: int = MAX_DIM) -> list[int]:
    return draw(st.lists(st.integers(1, max_dim), min_size=min_rank, max_size=max_rank))


@st.composite
def graphs(draw, max_inputs: int = 3, max_ops: int = 8, dtypes: Sequence[torch.dtype] = GRAPH_DTYPES,
           ops: Sequence[OpGen] = OPS, constants: bool = True, mutations: bool = True) -> Graph:
    """A random valid graph: 1..max_inputs tensor inputs, 1..max_ops ops from ``ops``, 1-3 outputs.

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

    def emit(target, args):
        node = g.call(target, args, meta=infer_meta(target, args, env=env))
        env[node.id] = env.pop("last")
        pool.append(node)
        return node

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
        if _numel(int(s) for s in meta.shape) > 4096:
            continue
        node = g.call(target, args, kwargs, meta=meta)
        env[node.id] = env.pop("last")
        pool.append(node)
        made.append(node)
    if not made:
        made.append(g.call(aten.clone.default, (pool[0],), meta=pool[0].meta))
    extra = draw(st.lists(st.sampled_from(made), max_size=2, unique_by=lambda n: n.id))
    outs = [made[-1]] + [n for n in extra if n is not made[-1]]
    if mutations and draw(st.integers(0, 3)) == 0:
        from ..boundary import alias_base

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


# ================================================================================================
# Running and comparing graphs
# ================================================================================================

def run_graph(graph: Graph, inputs: Sequence[torch.Tensor]):
    """Run ``graph`` with the default executor on clones of ``inputs`` (so mutations do not leak)."""
    fn = compile_graph_to_python(graph)
    args = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
    return _as_tuple(fn(*args)), args


def _as_tuple(out) -> tuple:
    if isinstance(out, (tuple, list)):
        return tuple(out)
    return (out,)


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for comparing results that may be rounded differently."""
    return {
        torch.float16: (1e-2, 1e-3),
        torch.bfloat16: (5e-2, 1e-2),
        torch.float32: (1e-4, 1e-5),
        torch.float64: (1e-9, 1e-12),
    }.get(dtype, (0.0, 0.0))


def compare_tensors(expected: torch.Tensor, actual: torch.Tensor, exact: bool) -> str | None:
    """None when they agree, else a description of the first disagreement.

    NaN matches NaN. With ``exact`` every other element must be equal and zeros must keep their
    sign; otherwise floats may differ by the dtype's tolerance (infinities must still match).
    """
    if not isinstance(actual, torch.Tensor):
        return f"expected a tensor, got {type(actual).__name__}: {actual!r}"
    if expected.dtype != actual.dtype:
        return f"dtype {actual.dtype} differs from expected {expected.dtype}"
    if expected.shape != actual.shape:
        return f"shape {tuple(actual.shape)} differs from expected {tuple(expected.shape)}"
    if expected.device != actual.device:
        return f"device {actual.device} differs from expected {expected.device}"
    e, a = expected.detach().cpu(), actual.detach().cpu()
    if e.dtype.is_floating_point:
        e64, a64 = e.double(), a.double()
        both_nan = e64.isnan() & a64.isnan()
        if exact:
            bad = ~both_nan & ((e64 != a64) | (torch.signbit(e64) != torch.signbit(a64)))
        else:
            rtol, atol = tolerance(e.dtype)
            close = torch.isclose(a64, e64, rtol=rtol, atol=atol, equal_nan=True)
            bad = ~close
    else:
        bad = e != a
    if not bad.any():
        return None
    idx = tuple(int(i) for i in bad.nonzero()[0])
    count = int(bad.sum())
    return (f"{count} of {e.numel()} elements differ; first at index {list(idx)}: "
            f"expected {e[idx].item()!r}, got {a[idx].item()!r}")


def compare_outputs(expected: Sequence, actual: Sequence, exact: bool = False) -> str | None:
    if len(expected) != len(actual):
        return f"{len(actual)} outputs, expected {len(expected)}"
    for i, (e, a) in enumerate(zip(expected, actual)):
        if isinstance(e, torch.Tensor):
            why = compare_tensors(e, a, exact)
        else:
            why = None if (e == a or (isinstance(e, float) and math.isnan(e) and math.isnan(a))) else f"expected {e!r}, got {a!r}"
        if why:
            return f"output {i}: {why}"
    return None


def _describe_inputs(inputs) -> str:
    lines = []
    for i, t in enumerate(inputs):
        if isinstance(t, torch.Tensor):
            lines.append(f"  input {i}: {str(t.dtype).replace('torch.', '')}{list(t.shape)} = {t.tolist()}")
        else:
            lines.append(f"  input {i}: {t!r}")
    return "\n".join(lines)


def _aliases(outputs, inputs) -> list[int | None]:
    """For each output, the index of the input whose storage it shares, or None."""
    ptrs = {t.untyped_storage().data_ptr(): i for i, t in enumerate(inputs)
            if isinstance(t, torch.Tensor) and t.numel()}
    out = []
    for o in outputs:
        if isinstance(o, torch.Tensor) and o.numel():
            out.append(ptrs.get(o.untyped_storage().data_ptr()))
        else:
            out.append(None)
    return out


def _check_pair(before: Graph, after: Graph, inputs, exact: bool, check_aliasing: bool) -> str | None:
    expected, in_before = run_graph(before, inputs)
    try:
        actual, in_after = run_graph(after, inputs)
    except Exception as e:  # noqa: BLE001 - a pass that breaks execution is the failure we report
        return f"the graph after the pass raised {type(e).__name__}: {e}"
    why = compare_outputs(expected, actual, exact)
    if why:
        return why
    # Inputs the graph mutates (copy_ / in-place ops) must end up the same too.
    for i, (b, a) in enumerate(zip(in_before, in_after)):
        if isinstance(b, torch.Tensor):
            why = compare_tensors(b, a, exact)
            if why:
                return f"input {i} after the call (mutated by the graph): {why}"
    if check_aliasing:
        for i, (ab, aa) in enumerate(zip(_aliases(expected, in_before), _aliases(actual, in_after))):
            if aa is not None and ab != aa:
                was = f"a view of input {ab}" if ab is not None else "a fresh tensor"
                return (f"output {i} shares memory with input {aa} after the pass but was {was} before: "
                        "the caller could change an input by writing to a result")
    return None


def assert_equivalent(graph_before: Graph, graph_after: Graph, inputs=None, *, exact: bool = False,
                      check_aliasing: bool = True, examples: int = 20, specials: bool = True) -> None:
    """Assert that two graphs compute the same outputs (and input mutations).

    With ``inputs`` the graphs are compared on those inputs only; otherwise on ``examples`` random
    inputs drawn by `graph_inputs` (including NaN, inf, -0.0 and extreme integers with
    ``specials``). Floats agree within the dtype's tolerance unless ``exact``. With
    ``check_aliasing`` an output that shares memory with an input after the pass must have shared
    it with the same input before (a fresh result that became a view is the dangerous direction;
    a view that became a fresh copy is allowed). Raises AssertionError with both graphs and the
    inputs.
    """
    def fail(why, ins):
        raise AssertionError(
            f"graphs are not equivalent: {why}\n{_describe_inputs(ins)}\n"
            f"--- before ---\n{format_graph(graph_before)}\n--- after ---\n{format_graph(graph_after)}")

    if len(graph_before.placeholders) != len(graph_after.placeholders):
        raise AssertionError(f"the pass changed the number of inputs: {len(graph_before.placeholders)} -> "
                             f"{len(graph_after.placeholders)}")
    if inputs is not None:
        why = _check_pair(graph_before, graph_after, inputs, exact, check_aliasing)
        if why:
            fail(why, inputs)
        return

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate, Phase.shrink])
    @given(graph_inputs(graph_before, specials))
    def run(ins):
        why = _check_pair(graph_before, graph_after, ins, exact, check_aliasing)
        if why:
            fail(why, ins)

    run()


# ================================================================================================
# check_rule: random instances of a rule's pattern, both sides compared bit for bit
# ================================================================================================

# Values a scalar or splat-constant operand is drawn from: identities, absorbing elements and the
# signed zeros that separate a sound rule from an almost-sound one.
SCALAR_CANDIDATES = (0, 1, -1, 2, 0.0, -0.0, 1.0, -1.0, 2.0, 0.5, math.inf, math.nan, True, False)


# Schema arguments typed as plain ints in the schema but holding enums: passing a random int
# there crashes the kernel, so they are drawn from their real values.
_ENUM_ARGUMENTS = {
    "memory_format": [None, torch.contiguous_format, torch.preserve_format],
    "layout": [None, torch.strided],
    "device": [None, torch.device("cpu")],
    "pin_memory": [None, False],
}


_TENSOR = object()  # "draw a tensor here" (None is a real value of optional arguments)


class _Invalid(Exception):
    """This random instance does not fit the pattern (the left side raised, or a condition failed)."""


def _condition_hints(rule) -> dict[str, dict]:
    """What the rule's own conditions say about each variable, to draw instances that satisfy them."""
    hints: dict[str, dict] = {}
    for c in rule.when:
        c.hint(hints)
    return hints


class _Instantiator:
    """Builds one random instance of a pattern: binds every variable to a concrete value.

    Tensor variables get random shapes, dtypes allowed by the rule's conditions, values with NaN,
    inf, -0.0 and extreme integers, and sometimes a non-contiguous or expanded layout. Size, dim
    and permutation arguments are drawn to fit the tensor they apply to, biased towards the
    shapes already in the instance (so ``shape_is`` conditions hold often enough).
    """

    def __init__(self, draw, rule, dtypes: Sequence[torch.dtype]):
        self.draw = draw
        self.rule = rule
        self.dtypes = tuple(dtypes)
        self.hints = _condition_hints(rule)
        self.binding: dict[str, Any] = {}
        self.shapes_seen: list[tuple] = []

    # -- tensors ---------------------------------------------------------------------------------
    def tensor(self, name: str, like: torch.Tensor | None) -> torch.Tensor:
        draw, h = self.draw, self.hints.get(name, {})
        value = h.get("value")
        if h.get("dtype_like") in self.binding and isinstance(self.binding[h["dtype_like"]], torch.Tensor):
            dtype = self.binding[h["dtype_like"]].dtype
        elif h.get("dtypes"):
            dtype = draw(st.sampled_from(h["dtypes"]))
        elif value is not None and isinstance(value, float) and (not value.is_integer() or math.copysign(1, value) < 0):
            dtype = draw(st.sampled_from(FLOAT_DTYPES))  # -0.0 and 0.5 only exist in floats
        elif value is not None:
            dtype = draw(st.sampled_from(INT_DTYPES if draw(st.booleans()) else FLOAT_DTYPES))
        elif like is not None and draw(st.booleans()):
            dtype = like.dtype
        else:
            dtype = draw(st.sampled_from(self.dtypes))
        if h.get("shape_like") in self.binding and isinstance(self.binding[h["shape_like"]], torch.Tensor):
            shape = tuple(self.binding[h["shape_like"]].shape)
        elif value is not None and draw(st.booleans()):
            shape = ()  # a constant operand is usually a 0-dim tensor: it broadcasts without changing the shape
        elif "rank" in h:
            shape = tuple(draw(shapes(min_rank=h["rank"], max_rank=h["rank"])))
        elif like is not None and draw(st.integers(0, 2)):
            shape = self._broadcastable_to(tuple(like.shape))
        else:
            shape = tuple(draw(shapes(max_rank=MAX_RANK)))
        if value is not None and draw(st.integers(0, 2)):
            t = torch.full(shape, value, dtype=torch.float64).to(dtype)
        else:
            t = draw(tensors(shape, dtype))
        return self._layout(t)

    def _typed_value(self, v):
        """``v`` as a Python int or float (the typing decides promotion; both must be tried)."""
        if isinstance(v, float) and (not v.is_integer() or math.copysign(1, v) < 0):
            return v
        return self.draw(st.sampled_from([int(v), float(v)]))

    def _broadcastable_to(self, shape: tuple) -> tuple:
        """``shape`` itself, or a shape that broadcasts against it (fewer dims, some set to 1)."""
        kind = self.draw(st.integers(0, 3))
        if kind <= 1 or not shape:
            return shape
        if kind == 2:
            return shape[self.draw(st.integers(0, len(shape))):]
        return tuple(1 if self.draw(st.booleans()) else s for s in shape)

    def _layout(self, t: torch.Tensor) -> torch.Tensor:
        """The same values in another memory layout: a transposed copy or an expanded row."""
        kind = self.draw(st.integers(0, 5))
        if kind == 0 and t.dim() >= 2:
            return t.transpose(0, 1).contiguous().transpose(0, 1)
        if kind == 1 and t.dim() >= 1 and t.shape[0] > 1:
            row = t[:1]
            return row.expand(t.shape)
        return t

    # -- non-tensor arguments ---------------------------------------------------------------------
    def argument(self, name: str, typ: str, arg_name: str, target, first: Any):
        """A value for an unbound variable at schema position ``arg_name: typ`` of ``target``.

        Returns ``_TENSOR`` for tensor positions (the caller draws a tensor there).
        """
        draw = self.draw
        rank = first.dim() if isinstance(first, torch.Tensor) else 0
        shape = tuple(first.shape) if isinstance(first, torch.Tensor) else ()
        base, optional, is_list = _schema_kind(typ)
        if base == "Tensor" or base == "Any":
            return _TENSOR
        if optional and draw(st.integers(0, 3)) == 0:
            return None
        if arg_name == "dtype":
            return draw(st.sampled_from(list(self.dtypes)))
        if arg_name in _ENUM_ARGUMENTS:
            return draw(st.sampled_from(_ENUM_ARGUMENTS[arg_name]))
        if is_list and base == "int":
            sizes_of = self.binding.get(self.hints.get(name, {}).get("sizes_of"))
            if isinstance(sizes_of, torch.Tensor) and draw(st.booleans()):
                return list(sizes_of.shape)  # what a shape_is(t, name) condition asks for
            if arg_name == "dims":
                return draw(permutations_of(rank))
            if arg_name == "dim":
                return draw(st.lists(st.integers(-rank, rank - 1), max_size=rank, unique=True)) if rank else []
            if "expand" in str(target) and draw(st.integers(0, 2)):
                return list(self._expansion(shape))
            if self.shapes_seen and draw(st.integers(0, 2)) == 0:
                candidates = [s for s in self.shapes_seen if _numel(s) == _numel(shape)]
                if candidates:
                    return list(draw(st.sampled_from(candidates)))
            return draw(reshapes(shape))
        if base == "int":
            if arg_name.startswith("dim"):
                r = rank + (1 if "unsqueeze" in str(target) else 0)
                return draw(st.integers(-r, r - 1)) if r else 0
            if arg_name == "end" and shape:
                return draw(st.sampled_from([2**63 - 1, max(shape), 1, -1, 0]))
            if arg_name == "step":
                return draw(st.sampled_from([1, 1, 2]))
            return draw(st.integers(-2, 4))
        if base == "number":
            if "value" in self.hints.get(name, {}) and draw(st.booleans()):
                return self._typed_value(self.hints[name]["value"])
            return draw(st.sampled_from([s for s in SCALAR_CANDIDATES if not isinstance(s, bool)]))
        if base == "bool":
            return draw(st.booleans())
        if base == "float":
            return draw(st.sampled_from([0.0, -0.0, 1.0, 0.5, -1.0]))
        raise _Invalid(f"cannot draw a value of schema type {typ!r} for {target}:{arg_name}")

    def _expansion(self, shape: tuple) -> tuple:
        draw = self.draw
        if self.shapes_seen and draw(st.booleans()):
            return draw(st.sampled_from(self.shapes_seen))
        new = tuple(draw(st.integers(1, 3)) if s == 1 else (-1 if draw(st.integers(0, 3)) == 0 else s) for s in shape)
        lead = tuple(draw(st.lists(st.integers(1, 3), max_size=max(0, MAX_RANK - len(shape)))))
        return lead + new

    def scalar_or_tensor(self, name: str, like) -> Any:
        """An operand in a Tensor position after the first: a Python scalar (as in ATen graphs) or a tensor."""
        h = self.hints.get(name, {})
        if "value" in h and self.draw(st.integers(0, 2)) == 0:
            return self._typed_value(h["value"])
        if self.draw(st.integers(0, 3)) == 0 and not h.get("dtypes") and "shape_like" not in h:
            return self.draw(st.sampled_from(SCALAR_CANDIDATES))
        return self.tensor(name, like)

    # -- walking the pattern ---------------------------------------------------------------------
    def build(self, pattern):
        from ..dsl import OpPattern, Var
        from ..ops import schema_types

        if not isinstance(pattern, OpPattern):
            raise TypeError(f"check_rule: left side must be an op pattern, got {pattern!r}")
        pos_types, kw_types = schema_types(pattern.target)
        names = _schema_names(pattern.target)
        if names[:2] == ["self", "dims"] and isinstance(pattern.args[0], Var) and isinstance(pattern.args[1], list) \
                and all(isinstance(i, int) for i in pattern.args[1]):
            # A literal permutation fixes the rank of the tensor it permutes.
            self.hints.setdefault(pattern.args[0].name, {}).setdefault("rank", len(pattern.args[1]))
        values: list = []
        first = None

        def value_for(p, typ: str | None, arg_name: str, index: int, in_list: bool = False):
            nonlocal first
            if isinstance(p, OpPattern):
                v = self.build(p)
            elif isinstance(p, Var):
                if p.name in self.binding:
                    v = self.binding[p.name]
                else:
                    t = typ or "Any"
                    v = self.argument(p.name, t, arg_name, pattern.target, first)
                    if v is _TENSOR:
                        if first is not None and index > 0 and not in_list:
                            v = self.scalar_or_tensor(p.name, first)
                        else:
                            v = self.tensor(p.name, first)
                    self.binding[p.name] = v
            elif isinstance(p, list):
                elem = _schema_kind(typ)[0] if typ else None
                v = [value_for(a, elem, arg_name, index + j, in_list=True) for j, a in enumerate(p)]
            else:
                v = p
            if first is None and isinstance(v, torch.Tensor):
                first = v
            if isinstance(v, torch.Tensor):
                self.shapes_seen.append(tuple(v.shape))
            return v

        for i, a in enumerate(pattern.args):
            typ = pos_types[i] if i < len(pos_types) else None
            values.append(value_for(a, typ, names[i] if i < len(names) else f"arg{i}", i))
        kwargs = {k: value_for(a, kw_types.get(k), k, 1) for k, a in pattern.kwargs.items()}
        try:
            out = pattern.target(*values, **kwargs)
        except Exception as e:  # noqa: BLE001 - an ill-formed random instance, not a rule bug
            raise _Invalid(f"{pattern.name} raised {type(e).__name__}: {e}") from None
        if isinstance(out, torch.Tensor):
            self.shapes_seen.append(tuple(out.shape))
        return out


def _schema_kind(typ: str) -> tuple[str, bool, bool]:
    """``"Optional[List[int]]"`` -> ``("int", True, True)``: base type, optional, list."""
    optional = is_list = False
    if typ.startswith("Optional[") and typ.endswith("]"):
        optional, typ = True, typ[len("Optional["):-1]
    if typ.endswith("?"):
        optional, typ = True, typ[:-1]
    if typ.startswith("List[") and typ.endswith("]"):
        is_list, typ = True, typ[len("List["):-1]
    elif typ.endswith("[]") or (typ.endswith("]") and "[" in typ):
        is_list, typ = True, typ[:typ.index("[")]
    if typ in ("SymInt", "int"):
        typ = "int"
    elif typ in ("Scalar", "number"):
        typ = "number"
    return typ, optional, is_list


def _schema_names(target) -> list[str]:
    if isinstance(target, torch._ops.OpOverload):
        return [a.name for a in target._schema.arguments if not a.kwarg_only]
    return []


@dataclasses.dataclass
class RuleCheckReport:
    """What `check_rule` found for one rule."""

    rule: str
    examples: int = 0  # random instances drawn
    valid: int = 0  # instances where the left side ran and the conditions held: compared
    guarded: int = 0  # instances the engine's dtype/shape guard would refuse (replacement differs)
    aliasing: int = 0  # instances where the replacement is a view of an input the left side was not
    error: str | None = None  # the counterexample, when the rule is unsound

    @property
    def ok(self) -> bool:
        return self.error is None

    def __str__(self):
        status = "ok" if self.ok else "UNSOUND"
        return (f"{self.rule}: {status}, {self.valid} of {self.examples} instances compared"
                f"{f', {self.guarded} refused by the dtype/shape guard' if self.guarded else ''}"
                f"{f', {self.aliasing} turn a fresh result into a view of an input' if self.aliasing else ''}")


def _describe_binding(binding: dict) -> str:
    lines = []
    for k, v in binding.items():
        if isinstance(v, torch.Tensor):
            layout = "" if v.is_contiguous() else f", strides {list(v.stride())}"
            lines.append(f"  {k} = {str(v.dtype).replace('torch.', '')}{list(v.shape)}{layout}: {v.tolist()}")
        else:
            lines.append(f"  {k} = {v!r}")
    return "\n".join(lines)


def _shares_storage(value, binding: dict) -> bool:
    if not isinstance(value, torch.Tensor) or value.numel() == 0:
        return False
    ptr = value.untyped_storage().data_ptr()
    return any(isinstance(t, torch.Tensor) and t.numel() and t.untyped_storage().data_ptr() == ptr
               for t in binding.values())


def check_rule(rule, examples: int = 100, dtypes: Sequence[torch.dtype] = ALL_DTYPES,
               min_valid: int | None = None) -> RuleCheckReport:
    """Check ``rule`` on random instances of its left side; raise AssertionError if it is unsound.

    For each instance the left side is evaluated with torch, the conditions are evaluated on the
    concrete values (``rule.conditions_hold``), and the right side (a pattern, or a computed
    replacement) is evaluated on the same binding. Where the replacement's dtype or shape differs
    from the left side's, the engine's guard would refuse it: counted, not compared. Everything
    else must agree bit for bit: NaN where NaN, the sign of every zero, every integer. A
    replacement that raises where the left side ran (e.g. a view of a non-viewable layout) is a
    counterexample too. The error message prints the rule, the variables and both results.

    Raises AssertionError as well when fewer than ``min_valid`` (default: a tenth of
    ``examples``, at least 3) instances could be compared, so a rule whose pattern the checker
    cannot instantiate never passes silently.
    """
    from ..dsl import Rule

    if not isinstance(rule, Rule):
        raise TypeError(f"check_rule takes a rewrite.dsl.Rule, got {type(rule).__name__}")
    if examples < 1:
        raise ValueError(f"check_rule: examples must be >= 1, got {examples}")
    report = RuleCheckReport(rule.name)
    min_valid = max(3, examples // 10) if min_valid is None else min_valid
    failures: list[str] = []

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate, Phase.shrink],
              report_multiple_bugs=False)
    @given(st.data())
    def run(data):
        report.examples += 1
        inst = _Instantiator(data.draw, rule, dtypes)
        try:
            lhs = inst.build(rule.lhs)
            if not rule.conditions_hold(dict(inst.binding)):
                raise _Invalid("conditions do not hold")
        except _Invalid:
            return
        binding = dict(inst.binding)
        rhs: Any = "<raised>"
        try:
            rhs = rule.apply(binding)
        except Exception as e:  # noqa: BLE001 - the left side ran, so the replacement must too
            why = f"the replacement raised {type(e).__name__}: {e}"
        else:
            if isinstance(lhs, torch.Tensor) and isinstance(rhs, torch.Tensor) and (
                    lhs.dtype != rhs.dtype or lhs.shape != rhs.shape):
                report.guarded += 1
                return
            if isinstance(lhs, torch.Tensor) and not _shares_storage(lhs, binding) and _shares_storage(rhs, binding):
                report.aliasing += 1
            why = compare_outputs((lhs,), (rhs,), exact=True)
            if why and why.startswith("output 0: "):
                why = why[len("output 0: "):]
        report.valid += 1
        if why:
            message = (f"rule {rule!r} is unsound: {why}\ncounterexample:\n{_describe_binding(binding)}\n"
                       f"  left side  = {_short(lhs)}\n  right side = {_short(rhs)}")
            failures.append(message)
            raise AssertionError(message)

    try:
        run()
    except AssertionError:
        report.error = failures[-1] if failures else "check failed"
        # Print the (shrunk) counterexample so a test log shows it even when the error is caught.
        print(report.error)
        raise AssertionError(report.error) from None
    if report.valid < min_valid:
        report.error = (f"rule {rule.name}: only {report.valid} of {report.examples} random instances could be "
                        f"compared (need {min_valid}); the checker cannot instantiate its pattern "
                        f"{rule.lhs!r} with conditions {list(rule.when)}")
        raise AssertionError(report.error)
    return report


def _short(v) -> str:
    if isinstance(v, torch.Tensor):
        return f"{str(v.dtype).replace('torch.', '')}{list(v.shape)}: {v.tolist()}"
    return repr(v)


def check_ruleset(ruleset, examples: int = 100) -> list[RuleCheckReport]:
    """`check_rule` on every rule of ``ruleset``; unsound rules are reported, not raised."""
    reports = []
    for r in ruleset.rules:
        try:
            reports.append(check_rule(r, examples=examples))
        except AssertionError as e:
            reports.append(RuleCheckReport(r.name, error=str(e)))
    return reports


@dataclasses.dataclass
class ModuleCheckReport:
    """`check_ruleset_module`'s result: one `RuleCheckReport` per rule, grouped by ruleset."""

    module: str
    rulesets: dict = dataclasses.field(default_factory=dict)  # ruleset name -> [RuleCheckReport]

    @property
    def reports(self) -> list[RuleCheckReport]:
        return [r for rs in self.rulesets.values() for r in rs]

    @property
    def failures(self) -> list[RuleCheckReport]:
        return [r for r in self.reports if not r.ok]

    @property
    def ok(self) -> bool:
        return not self.failures

    def __str__(self):
        n = len(self.reports)
        lines = [f"{self.module}: {len(self.rulesets)} ruleset(s), {n} rule(s), "
                 f"{n - len(self.failures)} sound, {len(self.failures)} unsound"]
        for name, reports in self.rulesets.items():
            lines.append(f"  ruleset {name}:")
            lines.extend(f"    {r}" for r in reports)
        for r in self.failures:
            lines.append("")
            lines.append(r.error)
        return "\n".join(lines)


def check_ruleset_module(module_name: str, examples: int = 100) -> ModuleCheckReport:
    """Import ``module_name``, find its `RuleSet` objects (module attributes, or lists of them) and check every rule.

    Used by ``python -m rewrite check-rules MODULE``; ``report.ok`` says whether all rules are sound.
    """
    from ..dsl import RuleSet

    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"check-rules: cannot import module {module_name!r}: {e}. Give an importable "
                         "module path such as 'mypkg.my_rules' (the module must be on sys.path)") from e
    found: dict[str, RuleSet] = {}
    for attr, value in vars(module).items():
        candidates = value if isinstance(value, (list, tuple)) else [value]
        for v in candidates:
            if isinstance(v, RuleSet):
                found.setdefault(v.name, v)
    if not found:
        raise ValueError(f"check-rules: module {module_name!r} defines no rewrite.dsl.RuleSet objects; "
                         "define one at module level, e.g. RULES = RuleSet('mine', [rule(...), ...])")
    report = ModuleCheckReport(module_name)
    for name, rs in found.items():
        log.info("checking ruleset %s (%d rules)", name, len(rs.rules))
        report.rulesets[name] = check_ruleset(rs, examples=examples)
    return report
