"""Random programs with symbolic sizes, traced to FX the way torch.compile sees dynamic shapes.

Static graphs cannot show the bugs that live in size arithmetic: a pass that bakes in the size it
saw, a view whose size is computed from another input, a slice that ends one before the size. So
`programs()` draws a small Python program over a vocabulary of torch calls (`DYNAMIC_OPS`) whose
size arguments are written in terms of the inputs' sizes (``v.reshape(v.shape[0] // 2, 2, -1)``,
``torch.cat([x, y], 1)``, ``x * x.shape[1]``), over inputs whose dimensions are named size symbols
shared across inputs (``x0: [a, 3]``, ``x1: [a, b]``) or static sizes. `trace_program` traces it with
``make_fx(tracing_mode="symbolic")``: the graph holds ``sym_size`` nodes, SymInt arithmetic and
symbolic FakeTensors in ``node.meta["val"]``, and the ShapeEnv holds the guards tracing recorded
(divisibility, inequalities). `SizeConstraints` answers which other sizes the graph is valid for,
so a pass can be checked at sizes it never saw.

A program is drawn against fake tensors of a private ShapeEnv, so every line is known to trace at
the drawn sizes; each symbol gets a distinct size when drawn and traced, so duck sizing gives
exactly the symbols the program names (two dims share a symbol when the program says so).
"""
from __future__ import annotations

import dataclasses
import functools
import linecache
import math
import re
from typing import Callable, Sequence

import torch
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import (
    DimDynamic, ShapeEnv, StatelessSymbolicContext, statically_known_true,
)

from ..ops import FLOATS, INTS
from .strategies import GRAPH_DTYPES, MAX_RANK, permutations_of

__all__ = ["DynOp", "DYNAMIC_OPS", "InputSpec", "Program", "programs", "trace_program", "SizeConstraints",
           "SYMBOLS", "TRACE_SIZES", "MAX_SIZE"]

SYMBOLS = "abc"  # the size symbols a program may use
TRACE_SIZES = (2, 3, 4, 5, 6, 8)  # sizes a symbol is drawn and traced at (distinct per symbol)
MAX_SIZE = 10  # the largest size a symbol takes when a graph is run at other sizes
MAX_NUMEL = 4096  # at the drawn sizes; keeps runs fast


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One tensor input: its dtype and, per dimension, a symbol name (dynamic) or an int (static)."""

    name: str
    dtype: torch.dtype
    dims: tuple

    def shape(self, sizes: dict[str, int]) -> tuple[int, ...]:
        return tuple(sizes[d] if isinstance(d, str) else d for d in self.dims)

    def __str__(self):
        return f"{self.name}: {str(self.dtype).replace('torch.', '')}[{', '.join(str(d) for d in self.dims)}]"


@dataclasses.dataclass(frozen=True)
class Program:
    """A drawn program: inputs, one statement per line, the values it returns, its trace sizes."""

    inputs: tuple[InputSpec, ...]
    lines: tuple[str, ...]
    outputs: tuple[str, ...]
    trace_sizes: tuple[tuple[str, int], ...]  # (symbol, size) pairs: hashable, ordered

    @property
    def symbols(self) -> list[str]:
        return [s for s, _ in self.trace_sizes]

    @property
    def source(self) -> str:
        args = ", ".join(i.name for i in self.inputs)
        body = [f"    {line}" for line in self.lines]
        outs = ", ".join(self.outputs)
        return "\n".join([f"def program({args}):", *body, f"    return ({outs},)"])

    @functools.cached_property
    def function(self) -> Callable:
        """The program as a Python function (registered with linecache, so tracebacks show its lines)."""
        filename = f"<rewrite.testing program {abs(hash(self.source)):x}>"
        source = self.source + "\n"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        namespace = {"torch": torch}
        exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - our own vocabulary, not user text
        return namespace["program"]

    def shapes(self, sizes: dict[str, int] | None = None) -> list[tuple[int, ...]]:
        sizes = dict(self.trace_sizes) if sizes is None else sizes
        return [spec.shape(sizes) for spec in self.inputs]

    def __str__(self):
        sizes = ", ".join(f"{s}={v}" for s, v in self.trace_sizes)
        return "\n".join([f"# inputs: {'; '.join(str(i) for i in self.inputs)} (drawn at {sizes})", self.source])


# ================================================================================================
# Drawing: every line is run on fake tensors with symbolic sizes before it is kept
# ================================================================================================

@dataclasses.dataclass
class _Value:
    name: str
    fake: torch.Tensor
    is_input: bool = False

    @property
    def rank(self) -> int:
        return self.fake.dim()

    @property
    def dtype(self) -> torch.dtype:
        return self.fake.dtype

    def __str__(self):
        return self.name


def _hint(size) -> int:
    """The concrete value of a (possibly symbolic) size at the drawn sizes, without adding a guard."""
    return size.node.hint if isinstance(size, torch.SymInt) else int(size)


def _same_size(a, b) -> bool:
    """Sizes equal for every valid size assignment (same symbol or same constant), without a guard."""
    return statically_known_true(a == b)


def _fake_inputs(mode: FakeTensorMode, specs: Sequence[InputSpec], sizes: dict[str, int]) -> list[torch.Tensor]:
    """Fake inputs whose named dims are symbolic (duck-sized: distinct sizes give distinct symbols)."""
    fakes = []
    for spec in specs:
        dynamic = [DimDynamic.DUCK if isinstance(d, str) else DimDynamic.STATIC for d in spec.dims]
        context = StatelessSymbolicContext(dynamic_sizes=dynamic)
        fakes.append(mode.from_tensor(torch.empty(spec.shape(sizes), dtype=spec.dtype), symbolic_context=context))
    return fakes


class _Drawing:
    """The values drawn so far and the helpers op generators use to find partners and sizes."""

    def __init__(self, draw, mode: FakeTensorMode, values: list[_Value]):
        self.draw = draw
        self.mode = mode
        self.values = values

    def dim(self, x: _Value, rank: int | None = None) -> int:
        r = x.rank if rank is None else rank
        return self.draw(st.integers(0, r - 1)) if r else 0

    def broadcast_partner(self, x: _Value, numeric: bool = False) -> _Value:
        """A value that broadcasts with ``x`` without a new guard: each trailing dim equal or 1."""
        def fits(v: _Value) -> bool:
            if v.rank > x.rank or (numeric and v.dtype == torch.bool):
                return False
            return all(_same_size(a, b) or _hint(b) == 1
                       for a, b in zip(reversed(x.fake.shape), reversed(v.fake.shape)))
        candidates = [v for v in self.values if fits(v)]
        return self.draw(st.sampled_from(candidates)) if candidates else x

    def mates(self, x: _Value, skip_dim: int | None = None) -> list[_Value]:
        """Values of x's rank and dtype whose sizes equal x's in every dim but ``skip_dim``."""
        return [v for v in self.values if v.rank == x.rank and v.dtype == x.dtype
                and all(_same_size(a, b) for i, (a, b) in enumerate(zip(x.fake.shape, v.fake.shape)) if i != skip_dim)]

    def size_source(self) -> str:
        """A size read off some value (``v.shape[i]``): sizes flow between unrelated tensors."""
        v = self.draw(st.sampled_from([v for v in self.values if v.rank]))
        return f"{v}.shape[{self.dim(v)}]"


def _sizes(x: _Value) -> list[str]:
    return [f"{x}.shape[{i}]" for i in range(x.rank)]


def _call(text: str, *args) -> str:
    return f"{text}({', '.join(str(a) for a in args)})"


# -- op generators: (drawing, x) -> the expression of one new value, or None when it does not fit x --

def _unary(fn: str):
    return lambda d, x: _call(f"torch.{fn}", x)


def _binary(fn: str, numeric: bool = False):
    return lambda d, x: _call(f"torch.{fn}", x, d.broadcast_partner(x, numeric))


def _where(d, x):
    return f"torch.where({x} > 0, {x}, {d.broadcast_partner(x)})" if x.dtype != torch.bool else \
        f"torch.where({x}, {d.broadcast_partner(x)}, {x})"


def _with_scalar(op: str):
    def gen(d, x):
        if x.dtype.is_floating_point:
            value = d.draw(st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.0, 0.5, 0, 1, 3]))
        else:
            value = d.draw(st.sampled_from([0, 1, -1, 2, 3]))
        return f"{x} {op} {value!r}"
    return gen


def _with_size(d, x):
    """Size arithmetic as data: a tensor combined with a size (a SymInt argument in the graph)."""
    op = d.draw(st.sampled_from(["*", "+", "-"] + (["/"] if x.dtype.is_floating_point else [])))
    return f"{x} {op} ({d.size_source()} {d.draw(st.sampled_from(['- 1', '+ 1', '* 2', '// 2']))})"


def _pow(d, x):
    exps = [2, 3, 0.5, -1.0] if x.dtype.is_floating_point else [2, 3]
    return f"{x} ** {d.draw(st.sampled_from(exps))!r}"


def _flatten(d, x):
    """Merge two adjacent dims: the new size is a product of sizes."""
    if x.rank < 2:
        return None
    i = d.draw(st.integers(0, x.rank - 2))
    s = _sizes(x)
    method = d.draw(st.sampled_from(["reshape", "view"]))
    return _call(f"{x}.{method}", *s[:i], f"{s[i]} * {s[i + 1]}", *s[i + 2:])


def _split(d, x):
    """Split a dim by 2 or 3 (only when its drawn size divides): a divisibility guard."""
    if not x.rank:
        return None
    i = d.dim(x)
    k = d.draw(st.sampled_from([2, 3]))
    size = _hint(x.fake.shape[i])
    if size % k or size == k:
        return None
    s = _sizes(x)
    return _call(f"{x}.reshape", *s[:i], f"{s[i]} // {k}", k, *s[i + 1:])


def _reshape_inferred(d, x):
    if x.rank and d.draw(st.booleans()):
        return f"{x}.reshape(-1, {x}.shape[-1])"
    return f"{x}.reshape(-1)"


def _permute(d, x):
    return _call(f"{x}.permute", *d.draw(permutations_of(x.rank))) if x.rank else None


def _transpose(d, x):
    return f"{x}.transpose({d.dim(x)}, {d.dim(x)})"


def _unsqueeze(d, x):
    return f"{x}.unsqueeze({d.draw(st.integers(0, x.rank))})"


def _squeeze(d, x):
    ones = [i for i, s in enumerate(x.fake.shape) if not isinstance(s, torch.SymInt) and s == 1]
    return f"{x}.squeeze({d.draw(st.sampled_from(ones))})" if ones else None


def _expand(d, x):
    """Broadcast dims of size 1 to sizes read off other values (a size shared across tensors)."""
    sizes = [d.size_source() if _hint(s) == 1 and d.draw(st.booleans()) else "-1" for s in x.fake.shape]
    if all(s == "-1" for s in sizes) and x.rank < MAX_RANK:
        sizes.insert(0, d.size_source())
    return _call(f"{x}.expand", *sizes)


def _slice(d, x):
    if not x.rank:
        return None
    i = d.dim(x)
    n = f"{x}.shape[{i}]"
    part = d.draw(st.sampled_from(["1:", ":-1", "::2", f": {n} // 2", f"{n} // 2 :", f"1 : {n} - 1"]))
    return f"{x}[{':, ' * i}{part}]"


def _narrow(d, x):
    if not x.rank:
        return None
    i = d.dim(x)
    return f"{x}.narrow({i}, 1, {x}.shape[{i}] - 1)"


def _cat(d, x):
    """Concatenate along a dim: the result's size is a sum of sizes."""
    if not x.rank:
        return None
    i = d.dim(x)
    parts = [x] + d.draw(st.lists(st.sampled_from(d.mates(x, skip_dim=i)), max_size=2))
    return f"torch.cat([{', '.join(str(p) for p in parts)}], {i})"


def _reduce(method: str):
    def gen(d, x):
        if not x.rank:
            return None
        return f"{x}.{method}({d.dim(x)}, keepdim={d.draw(st.booleans())})"
    return gen


def _softmax(d, x):
    return f"torch.softmax({x}, {d.dim(x)})" if x.rank else None


def _cumsum(d, x):
    return f"{x}.cumsum({d.dim(x)})" if x.rank else None


def _matmul(d, x):
    if x.rank not in (2, 3):
        return None
    mates = [v for v in d.values if v.rank == x.rank and v.dtype == x.dtype
             and _same_size(v.fake.shape[-2], x.fake.shape[-1])
             and (x.rank == 2 or _same_size(v.fake.shape[0], x.fake.shape[0]))]
    other = d.draw(st.sampled_from(mates)) if mates else f"{x}.transpose(-1, -2)"
    return f"{x} @ {other}"


def _fill(d, x):
    """Tensors of one value shaped by sizes: what constant-folding passes look for."""
    kind = d.draw(st.sampled_from(["zeros_like", "ones_like", "full_like", "zeros", "new_ones"]))
    if kind == "full_like":
        value = d.draw(st.sampled_from(["2", "-0.0" if x.dtype.is_floating_point else "0", d.size_source()]))
        return f"torch.full_like({x}, {value})"
    if kind == "zeros":
        return _call("torch.zeros", *_sizes(x), f"dtype={x}.dtype")
    if kind == "new_ones":
        return _call(f"{x}.new_ones", *_sizes(x))
    return _call(f"torch.{kind}", x)


def _arange(d, x):
    return f"torch.arange({d.size_source()})"


def _convert(d, x):
    return f"{x}.to({d.draw(st.sampled_from([str(t) for t in GRAPH_DTYPES]))})"


def _method(name: str):
    return lambda d, x: f"{x}.{name}()"


def _flip(d, x):
    return f"{x}.flip({d.dim(x)})" if x.rank else None


@dataclasses.dataclass(frozen=True)
class DynOp:
    """One vocabulary entry: ``make(drawing, x)`` returns the expression of a new value (or None)."""

    name: str
    make: Callable
    dtypes: tuple = GRAPH_DTYPES + (torch.float16, torch.bfloat16, torch.int16, torch.uint8)


_NUMBERS = FLOATS + INTS

DYNAMIC_OPS: tuple[DynOp, ...] = (
    *(DynOp(n, _unary(n), _NUMBERS) for n in ("neg", "abs", "relu")),
    *(DynOp(n, _unary(n), FLOATS) for n in ("exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "sin", "floor")),
    DynOp("bitwise_not", _unary("bitwise_not"), INTS + (torch.bool,)),
    DynOp("logical_not", _unary("logical_not")),
    DynOp("add", _binary("add", numeric=True), _NUMBERS),
    DynOp("sub", _binary("sub", numeric=True), _NUMBERS),
    DynOp("mul", _binary("mul")),
    DynOp("div", _binary("div", numeric=True), _NUMBERS),
    DynOp("maximum", _binary("maximum")),
    DynOp("minimum", _binary("minimum")),
    DynOp("lt", _binary("lt", numeric=True), _NUMBERS),
    DynOp("eq", _binary("eq")),
    DynOp("where", _where),
    DynOp("add_scalar", _with_scalar("+"), _NUMBERS),
    DynOp("mul_scalar", _with_scalar("*"), _NUMBERS),
    DynOp("div_scalar", _with_scalar("/"), FLOATS),
    DynOp("size_arith", _with_size, _NUMBERS),
    DynOp("pow", _pow, _NUMBERS),
    # Views and layout changes (any dtype); their sizes are expressions of the input sizes.
    *(DynOp(name, make) for name, make in (
        ("flatten", _flatten), ("split", _split), ("reshape", _reshape_inferred), ("permute", _permute),
        ("transpose", _transpose), ("unsqueeze", _unsqueeze), ("squeeze", _squeeze), ("expand", _expand),
        ("slice", _slice), ("narrow", _narrow), ("cat", _cat), ("flip", _flip))),
    DynOp("sum", _reduce("sum"), _NUMBERS),
    DynOp("amax", _reduce("amax"), _NUMBERS),
    DynOp("mean", _reduce("mean"), FLOATS),
    DynOp("softmax", _softmax, FLOATS),
    DynOp("cumsum", _cumsum, _NUMBERS),
    DynOp("matmul", _matmul, FLOATS),
    DynOp("fill", _fill),
    DynOp("arange", _arange),
    DynOp("convert", _convert),
    DynOp("clone", _method("clone")),
    DynOp("contiguous", _method("contiguous")),
)


@st.composite
def _input_specs(draw, max_inputs: int, dtypes: Sequence[torch.dtype]):
    """Inputs over 1-3 shared symbols: the first input has a symbol; others often reuse its dims."""
    n_symbols = draw(st.integers(1, len(SYMBOLS)))
    symbols = SYMBOLS[:n_symbols]
    sizes = dict(zip(symbols, draw(st.lists(st.sampled_from(TRACE_SIZES), min_size=n_symbols,
                                             max_size=n_symbols, unique=True))))
    dim = st.one_of(st.sampled_from(symbols), st.sampled_from([1, 2, 3, 4]))
    base = draw(st.lists(dim, min_size=1, max_size=3))
    if not any(isinstance(d, str) for d in base):
        base[draw(st.integers(0, len(base) - 1))] = draw(st.sampled_from(symbols))
    main_dtype = draw(st.sampled_from(list(dtypes)))
    specs = []
    for i in range(draw(st.integers(1, max_inputs))):
        how = "same" if i == 0 else draw(st.sampled_from(["same", "same", "suffix", "ones", "fresh"]))
        dims = list(base)
        if how == "suffix":
            dims = dims[draw(st.integers(0, len(dims))):]
        elif how == "ones":
            dims = [1 if draw(st.booleans()) else s for s in dims]
        elif how == "fresh":
            dims = draw(st.lists(dim, min_size=0, max_size=3))
        dtype = main_dtype if draw(st.integers(0, 3)) else draw(st.sampled_from(list(dtypes)))
        specs.append(InputSpec(f"x{i}", dtype, tuple(dims)))
    used = {d for spec in specs for d in spec.dims}
    return specs, {s: v for s, v in sizes.items() if s in used}


@st.composite
def programs(draw, max_inputs: int = 3, max_ops: int = 8, dtypes: Sequence[torch.dtype] = GRAPH_DTYPES,
             ops: Sequence[DynOp] = DYNAMIC_OPS, mutations: bool = True) -> Program:
    """A random program over ``ops`` with symbolic input sizes (see the module docstring).

    Each line is run on fake tensors at the drawn sizes before it is kept, so the program traces.
    With ``mutations`` some programs end by copying a fresh value into an input (``x0.copy_(v)``),
    after every read: the form AOTAutograd gives input mutations, which a pass must keep.
    """
    if not ops:
        raise ValueError("programs(): ops must name at least one DynOp from rewrite.testing.dynamic.DYNAMIC_OPS")
    specs, sizes = draw(_input_specs(max_inputs, dtypes))
    mode = FakeTensorMode(shape_env=ShapeEnv())
    values = [_Value(s.name, f, is_input=True) for s, f in zip(specs, _fake_inputs(mode, specs, sizes))]
    drawing = _Drawing(draw, mode, values)
    namespace = {"torch": torch}
    lines: list[str] = []
    made: list[_Value] = []
    n_ops = draw(st.integers(1, max_ops))
    attempts = 0
    while len(made) < n_ops and attempts < n_ops * 6:
        attempts += 1
        # Prefer the newest values so programs grow chains (where passes interact).
        x = draw(st.sampled_from(values[-3:] if draw(st.booleans()) else values))
        candidates = [o for o in ops if x.dtype in o.dtypes]
        if not candidates:
            continue
        expr = draw(st.sampled_from(candidates)).make(drawing, x)
        if expr is None:
            continue
        namespace.update({v.name: v.fake for v in values})
        try:
            with mode:
                out = eval(expr, namespace)  # noqa: S307 - an expression this module just wrote
        except Exception:  # the op does not fit here (dtype, shape, layout): draw another
            continue
        if not isinstance(out, torch.Tensor) or math.prod(_hint(s) for s in out.shape) > MAX_NUMEL:
            continue
        value = _Value(f"v{len(values)}", out)
        lines.append(f"{value} = {expr}")
        values.append(value)
        made.append(value)
    if not made:
        value = _Value(f"v{len(values)}", values[0].fake.clone())
        lines.append(f"{value} = {values[0]}.clone()")
        values.append(value)
        made.append(value)
    # Every value no later line reads is returned: no op is dead code a pass could drop unseen.
    outputs = [v for v in made if not any(re.search(rf"\b{v.name}\b", line.split(" = ", 1)[1]) for line in lines)]
    if mutations and draw(st.integers(0, 3)) == 0:
        lines += _mutations(draw, values, made, outputs)
    return Program(tuple(specs), tuple(lines), tuple(v.name for v in outputs), tuple(sizes.items()))


def _mutations(draw, values: list[_Value], made: list[_Value], outputs: list[_Value]) -> list[str]:
    """``xi.copy_(v)`` lines: v fresh (no view of an input), same sizes and dtype; no output views xi."""
    lines = []
    inputs = [v for v in values if v.is_input and v.dtype != torch.bool
              and not any(torch._C._is_alias_of(o.fake, v.fake) for o in outputs)]
    targets = draw(st.lists(st.sampled_from(inputs), max_size=2, unique_by=lambda v: v.name)) if inputs else []
    for target in targets:
        sources = [v for v in made if v.dtype == target.dtype and v.rank == target.rank
                   and all(_same_size(a, b) for a, b in zip(v.fake.shape, target.fake.shape))
                   and not any(torch._C._is_alias_of(v.fake, i.fake) for i in values if i.is_input)]
        if sources:
            lines.append(f"{target}.copy_({draw(st.sampled_from(sources))})")
    return lines


# ================================================================================================
# Tracing and the sizes a traced graph is valid for
# ================================================================================================

def trace_program(program: Program, decompositions: dict | None = None) -> torch.fx.GraphModule:
    """``make_fx(program, decompositions, tracing_mode="symbolic")`` at the program's drawn sizes.

    Every node gets ``meta["val"]`` (symbolic FakeTensors and SymInts) and tensor nodes get
    ``meta["tensor_meta"]``; the ShapeEnv (``SizeConstraints(gm)``) keeps the guards tracing made.
    """
    from torch.fx.experimental.proxy_tensor import make_fx

    mode = FakeTensorMode(shape_env=ShapeEnv())
    fakes = _fake_inputs(mode, program.inputs, dict(program.trace_sizes))
    with mode:
        return make_fx(program.function, decompositions, tracing_mode="symbolic")(*fakes)


class SizeConstraints:
    """Which concrete input shapes a symbolic graph may run at: the guards its ShapeEnv holds.

    Guards are read when `allows` is first called, so guards a pass added (by specializing a size
    with ``int(sym)`` or ``guard_int``, as Inductor would recompile for) count too.
    """

    def __init__(self, gm: torch.fx.GraphModule):
        self.placeholders = [n.meta["val"] for n in gm.graph.find_nodes(op="placeholder")]
        env = next((v.fake_mode.shape_env for v in self.placeholders if hasattr(v, "fake_mode")), None)
        self.shape_env: ShapeEnv | None = env
        self._code: str | None = None

    def allows(self, shapes: Sequence[Sequence[int]], dtypes: Sequence[torch.dtype]) -> bool:
        if self.shape_env is None:
            return all(tuple(p.shape) == tuple(s) for p, s in zip(self.placeholders, shapes))
        if self._code is None:  # None from torch: no guards at all
            # ignore_static=False: a size a pass specialized (guard_int) is static now, and guarded.
            self._code = self.shape_env.produce_guards_expression(self.placeholders, ignore_static=False) or "True"
        args = [torch.empty(tuple(s), dtype=dt, device="meta") for s, dt in zip(shapes, dtypes)]
        return bool(self.shape_env.evaluate_guards_expression(self._code, args))
