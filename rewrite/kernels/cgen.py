"""C source of static CPU kernels: one function per op signature, sizes and strides baked in.

A kernel is ``int k_<key>(void **p)``: ``p`` holds the addresses of its tensor inputs (in the
signature's order), then its outputs, then any extra buffer the kernel reads; it returns 0, or an
error code (`ERRORS`). Everything else (sizes, strides, scalar arguments) is a constant in the
code, so the compiler unrolls, vectorizes and folds index arithmetic. The code is built only from
a checked signature (`signature.check`): op names select a generator from the tables below, and
every number that reaches the source is an int or a float printed by Python.

What gets a kernel (everything else runs its ATen kernel):

* pointwise ops on float32/float64 (bool for masks and comparisons), with broadcasting and any
  strides; transcendental functions through glibc's vector math library (libmvec), so loops
  vectorize like ATen's; large ones split over OpenMP threads;
* ``native_layer_norm`` and ``_softmax``/``_log_softmax`` over contiguous last dimensions;
* ``mm``/``addmm``/``bmm`` through MKL's ``sgemm_``/``dgemm_`` (the BLAS ATen itself calls), and
  for weights that are constants, MKL's packed GEMM (``cblas_sgemm_compute`` on a weight packed once
  by ``mkl::_mkl_reorder_linear_weight``, what Inductor's freezing uses); the addresses reach the
  library at load time (`compiler.Library`);
* ``embedding`` and ``index.Tensor`` with one index tensor (an index out of range is error 1, raised as
  IndexError) and copies (``clone``,
  ``_to_copy`` between float dtypes, ``cat``, ``constant_pad_nd``);
* inference batch norm (``_native_batch_norm_legit_no_training``) and 2-D max pooling with indices
  (``max_pool2d_with_indices``) at any strides, channels-last too;
* ``sum``/``mean`` over listed dims (summed in double, in memory order);
* a group of neighbouring pointwise steps and inference batch norms of one shape as one loop
  (`_fused`; the planner picks the groups, `rewrite.kernels.fusion`).

Numerics: the same formulas as ATen's CPU kernels (layer norm statistics in double), so results
agree to float rounding; tests compare with eager at every gear.
"""
from __future__ import annotations

import math

from .signature import FUSED, value_of

__all__ = ["generate", "RUNTIME", "ERRORS", "VERSION"]

# Bump whenever generated code changes: it is part of every kernel's key, so old artifacts go stale.
VERSION = 11  # 7: batch norm, constant padding, loops in memory order; 8: sum, mean; 9: max pooling; 10: index;
# 11: fused pointwise steps
ERRORS = {1: (IndexError, "index out of range in self")}
# Pointwise loops over at least this many elements are split over threads.
PARALLEL_MIN = 32768

_CTYPE = {"float32": "float", "float64": "double", "bool": "uint8_t", "int64": "int64_t", "int32": "int32_t",
          "uint8": "uint8_t", "int8": "int8_t", "int16": "int16_t"}
_FLOATS = ("float32", "float64")
# Math functions with vector variants in libmvec (declared `omp declare simd` below).
_MATH = ("exp", "log", "tanh", "sin", "cos", "erf", "expm1", "log1p", "pow")

RUNTIME = r"""
#include <stdint.h>
#include <string.h>
#include <math.h>
typedef int (*rw_kernel)(void **);
typedef void (*rw_sgemm_t)(const char *, const char *, const int *, const int *, const int *, const float *,
                           const float *, const int *, const float *, const int *, const float *, float *, const int *);
typedef void (*rw_dgemm_t)(const char *, const char *, const int *, const int *, const int *, const double *,
                           const double *, const int *, const double *, const int *, const double *, double *,
                           const int *);
typedef void (*rw_sgemm_compute_t)(int, int, int, int, int, int, const float *, int, const float *, int, float,
                                   float *, int);
static rw_sgemm_t rw_sgemm;
static rw_dgemm_t rw_dgemm;
static rw_sgemm_compute_t rw_sgemm_compute;
/* The BLAS entry points ATen uses, handed over by the loader: no link-time dependency on torch. */
int rw_init(void **symbols) {
  rw_sgemm = (rw_sgemm_t)symbols[0]; rw_dgemm = (rw_dgemm_t)symbols[1];
  rw_sgemm_compute = (rw_sgemm_compute_t)symbols[2];
  return %d;
}
/* Runs a table of steps: [kernel, n, p0 .. pn-1, kernel, n, ...]; returns 0 or (step + 1) | code << 32. */
long long rw_run(void **t, long long steps) {
  long long at = 0;
  for (long long i = 0; i < steps; i++) {
    rw_kernel k = (rw_kernel)t[at];
    long long n = (long long)(intptr_t)t[at + 1];
    int rc = k(t + at + 2);
    if (rc) return (i + 1) | ((long long)rc << 32);
    at += 2 + n;
  }
  return 0;
}
""" % VERSION

MATH_DECLARATIONS = "".join(
    f"#pragma omp declare simd notinbranch\nfloat {f}f(float{', float' if f == 'pow' else ''});\n"
    f"#pragma omp declare simd notinbranch\ndouble {f}(double{', double' if f == 'pow' else ''});\n" for f in _MATH)


class Unsupported(Exception):
    """The signature gets no static kernel (its op runs as ATen)."""


def generate(sig: dict, symbol: str) -> str | None:
    """C source of ``symbol`` implementing checked signature ``sig``, or None when unsupported."""
    family = _FAMILIES.get(sig["op"])
    if family is None:
        return None
    if any(o["size"] and 0 in o["size"] for o in sig["outputs"]) and family is not _batch_norm:
        return None  # an empty result: nothing to compute (batch norm's empty statistics are never written)
    try:
        return family(sig, symbol)
    except Unsupported:
        return None


# -- helpers ----------------------------------------------------------------------------------------------

def _args(sig) -> dict:
    return {name: value for name, value in sig["args"]}


def _numel(size) -> int:
    return math.prod(size)


def _literal(v, ctype: str) -> str:
    v = value_of(v)
    if isinstance(v, bool):
        v = int(v)
    if not isinstance(v, (int, float)):
        raise Unsupported
    f = float(v)
    if math.isnan(f):
        text = "NAN"
    elif math.isinf(f):
        text = "INFINITY" if f > 0 else "(-INFINITY)"
    else:
        text = repr(f)
    return f"(({ctype})({text}))"


def _pointers(sig, extra_inputs: int = 0) -> list[str]:
    lines = []
    for k, d in enumerate(sig["inputs"]):
        lines.append(f"  const {_CTYPE[d['dtype']]} *restrict x{k} = (const {_CTYPE[d['dtype']]} *)p[{k}];")
    base = len(sig["inputs"])
    for k, d in enumerate(sig["outputs"]):
        lines.append(f"  {_CTYPE[d['dtype']]} *restrict y{k} = ({_CTYPE[d['dtype']]} *)p[{base + k}];")
    for k in range(extra_inputs):
        lines.append(f"  const void *restrict e{k} = p[{base + len(sig['outputs']) + k}];")
    return lines


def _function(symbol: str, body: list[str], sig, extra_inputs: int = 0) -> str:
    for d in sig["inputs"] + sig["outputs"]:
        if d["dtype"] not in _CTYPE:
            raise Unsupported
    return f"int {symbol}(void **p) {{\n" + "\n".join(_pointers(sig, extra_inputs) + body) + "\n  return 0;\n}\n"


def _broadcast(d: dict, size: list) -> list:
    """Strides of layout ``d`` read as if broadcast to ``size``."""
    rank, own = len(size), len(d["size"])
    if own > rank:
        raise Unsupported
    out = []
    for k in range(rank):
        j = k - (rank - own)
        if j < 0 or (d["size"][j] == 1 and size[k] != 1):
            out.append(0)
        elif d["size"][j] != size[k]:
            raise Unsupported
        else:
            out.append(d["stride"][j])
    return out


def _collapse(size: list, strides: list[list]) -> tuple[list, list[list]]:
    """Drop size-1 dims and merge dims that are contiguous in every array (fewer, longer loops)."""
    keep = [k for k, s in enumerate(size) if s != 1]
    size = [size[k] for k in keep]
    strides = [[st[k] for k in keep] for st in strides]
    k = len(size) - 2
    while k >= 0:
        if all(st[k] == st[k + 1] * size[k + 1] for st in strides):
            size[k] *= size[k + 1]
            for st in strides:
                st[k] = st[k + 1]
                del st[k + 1]
            del size[k + 1]
        k -= 1
    return size, strides


def _loops(size: list, strides: list[list], emit, parallel: bool, simd: bool = True,
           in_memory_order: bool = True) -> list[str]:
    """Nested loops over ``size``; ``emit(indices)`` gives the body's lines for index expressions.

    ``simd``: the innermost loop is marked for vectorization (its body must not branch out of it).
    ``in_memory_order``: the loops nest in the order of the first array's strides, largest outside, so
    the innermost loop walks it with the smallest step (a channels-last image: the channels, not its
    width at a stride of C); only for bodies whose iterations are independent."""
    if in_memory_order:
        size, strides = _memory_order(size, strides)
    size, strides = _collapse(size, strides)
    if not size:
        return ["  {"] + ["    " + ln for ln in emit(["0"] * len(strides))] + ["  }"]
    lines = []
    rank = len(size)
    for d in range(rank):
        pad = "  " * (d + 1)
        if d == 0 and parallel:
            lines.append(f"{pad}#pragma omp parallel for{' simd' if rank == 1 and simd else ''}")
        elif d == rank - 1 and simd:
            lines.append(f"{pad}#pragma omp simd")
        lines.append(f"{pad}for (int64_t i{d} = 0; i{d} < {size[d]}LL; i{d}++) {{")
    index = []
    for st in strides:
        terms = [f"i{d}*{st[d]}LL" if st[d] != 1 else f"i{d}" for d in range(rank) if st[d] != 0]
        index.append(" + ".join(terms) or "0")
    lines += ["  " * (rank + 1) + ln for ln in emit(index)]
    lines += ["  " * (d + 1) + "}" for d in reversed(range(rank))]
    return lines


# -- pointwise --------------------------------------------------------------------------------------------

def _fn(name: str, T: str) -> str:
    return f"{name}f" if T == "float" else name


def _gelu(e, raw, T):
    x = e["self"]
    if raw["approximate"] == "tanh":
        return (f"(({T})0.5) * {x} * ((({T})1) + {_fn('tanh', T)}((({T})0.7978845608028654) * ({x} + (({T})0.044715) "
                f"* {x} * {x} * {x})))")
    if raw["approximate"] == "none":
        return f"{x} * (({T})0.5) * ((({T})1) + {_fn('erf', T)}({x} * (({T})0.7071067811865476)))"
    raise Unsupported


def _pow_scalar(e, raw, T):
    x, ex = e["self"], value_of(raw["exponent"])
    special = {2: f"{x} * {x}", 3: f"{x} * {x} * {x}", 1: x, 0.5: f"sqrt{'f' if T == 'float' else ''}({x})",
               -1: f"(({T})1) / {x}", -2: f"(({T})1) / ({x} * {x})",
               -0.5: f"(({T})1) / sqrt{'f' if T == 'float' else ''}({x})"}
    if isinstance(ex, (int, float)) and not isinstance(ex, bool) and ex in special:
        return special[ex]
    return f"{_fn('pow', T)}({x}, {e['exponent']})"


def _clamp(x, lo, hi):
    """ATen's clamp: max(lo, x) then min(hi, .), ties and a NaN x give x (so clamp(-0.0, min=0) is -0.0)."""
    out = x
    if lo is not None:
        out = f"({out} < {lo} ? {lo} : {out})"
    if hi is not None:
        out = f"({out} > {hi} ? {hi} : {out})"
    return f"({x} != {x} ? {x} : {out})"


def _clamp_op(lo: str | None, hi: str | None) -> tuple:
    """A clamp-like op's entry (operand names, build), its bounds named ``lo`` and ``hi`` (None: absent).
    A NaN bound makes ATen fill the whole result with NaN (clamp_out and friends; hardtanh is a clamp);
    comparing with it would leave every element as it is."""
    bounds = tuple(n for n in (lo, hi) if n)

    def build(e, raw, T):
        if any(isinstance(v := value_of(raw.get(n)), float) and math.isnan(v) for n in bounds):
            return f"(({T})NAN)"
        return _clamp(e["self"], *(e[n] if n and raw[n] is not None else None for n in (lo, hi)))

    return (("self", *bounds), build)


def _maxmin(e, op):
    a, b = e["self"], e["other"]
    return f"(({a} != {a} || {b} != {b}) ? {a} + {b} : ({a} {op} {b} ? {a} : {b}))"


_UNARY_FN = {"exp": "exp", "log": "log", "tanh": "tanh", "sin": "sin", "cos": "cos", "erf": "erf",
             "expm1": "expm1", "log1p": "log1p", "sqrt": "sqrt", "abs": "fabs"}
# op -> (names of the operands, expression builder(e: name -> C expression, raw: name -> value, T))
_POINTWISE: dict = {
    **{f"aten.{name}.default": (("self",), lambda e, raw, T, f=f: f"{_fn(f, T)}({e['self']})")
       for name, f in _UNARY_FN.items()},
    "aten.neg.default": (("self",), lambda e, raw, T: f"-{e['self']}"),
    "aten.reciprocal.default": (("self",), lambda e, raw, T: f"(({T})1) / {e['self']}"),
    "aten.rsqrt.default": (("self",), lambda e, raw, T: f"(({T})1) / {_fn('sqrt', T)}({e['self']})"),
    "aten.sigmoid.default": (("self",), lambda e, raw, T: f"(({T})1) / ((({T})1) + {_fn('exp', T)}(-{e['self']}))"),
    "aten.silu.default": (("self",), lambda e, raw, T: f"{e['self']} / ((({T})1) + {_fn('exp', T)}(-{e['self']}))"),
    # relu is ATen's clamp_min(x, 0): -0.0 and NaN stay themselves (`x > 0 ? x : 0` made -0.0 into 0.0)
    "aten.relu.default": (("self",), lambda e, raw, T: f"({e['self']} < 0 ? (({T})0) : {e['self']})"),
    "aten.gelu.default": (("self", "approximate"), _gelu),
    "aten.pow.Tensor_Scalar": (("self", "exponent"), _pow_scalar),
    "aten.pow.Tensor_Tensor": (("self", "exponent"), lambda e, raw, T: f"{_fn('pow', T)}({e['self']}, {e['exponent']})"),
    "aten.clamp.default": _clamp_op("min", "max"),
    "aten.clamp_min.default": _clamp_op("min", None),
    "aten.clamp_max.default": _clamp_op(None, "max"),
    "aten.hardtanh.default": _clamp_op("min_val", "max_val"),
    "aten.leaky_relu.default": (("self", "negative_slope"), lambda e, raw, T: (
        f"({e['self']} > 0 ? {e['self']} : {e['self']} * {e['negative_slope']})")),
    "aten.maximum.default": (("self", "other"), lambda e, raw, T: _maxmin(e, ">")),
    "aten.minimum.default": (("self", "other"), lambda e, raw, T: _maxmin(e, "<")),
    "aten.where.self": (("condition", "self", "other"), lambda e, raw, T: f"({e['condition']} ? {e['self']} : "
                                                                           f"{e['other']})"),
    "aten.masked_fill.Scalar": (("self", "mask", "value"), lambda e, raw, T: f"({e['mask']} ? {e['value']} : "
                                                                              f"{e['self']})"),
    "aten.clone.default": (("self",), lambda e, raw, T: e["self"]),
    # a copy only: a plan gives an op a kernel only when it makes its own result (`plan._owns_all`), and
    # contiguous returns its input itself when that is already contiguous
    "aten.contiguous.default": (("self",), lambda e, raw, T: e["self"]),
    "aten._to_copy.default": (("self",), lambda e, raw, T: e["self"]),
}
def _add(a: str, b: str, alpha, T: str) -> str:
    """ATen's add: a + alpha * b as one fused multiply-add (vec::fmadd(b, alpha, a)) where alpha is not 1;
    two roundings differed from it where a and alpha * b nearly cancel (tests/test_kernel_diff.py)."""
    v = value_of(alpha)
    return f"{a} + {b}" if v == 1 else f"{_fn('fma', T)}({_literal(v, T)}, {b}, {a})"


def _subtract(a: str, b: str, alpha, T: str) -> str:
    """ATen's sub: add(a, b, -alpha), so fma(-alpha, b, a); with an int alpha 0 that is a + 0 * b, where
    a - 0 * b would turn -0.0 - 0.0 * -0.0 into +0.0. For alpha 1 both are a - b, bit for bit."""
    v = value_of(alpha)
    return f"{a} - {b}" if v == 1 else _add(a, b, -v, T)


for _ov in ("Tensor", "Scalar"):
    _POINTWISE[f"aten.add.{_ov}"] = (("self", "other", "alpha"), lambda e, raw, T: _add(
        e["self"], e["other"], raw["alpha"], T))
    _POINTWISE[f"aten.sub.{_ov}"] = (("self", "other", "alpha"), lambda e, raw, T: _subtract(
        e["self"], e["other"], raw["alpha"], T))
    _POINTWISE[f"aten.rsub.{_ov}"] = (("self", "other", "alpha"), lambda e, raw, T: _subtract(
        e["other"], e["self"], raw["alpha"], T))
for _name, _op in (("mul", "*"), ("div", "/")):
    for _ov in ("Tensor", "Scalar"):
        _POINTWISE[f"aten.{_name}.{_ov}"] = (("self", "other"), lambda e, raw, T, op=_op: f"{e['self']} {op} {e['other']}")
_COMPARISONS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
for _name, _op in _COMPARISONS.items():
    for _ov in ("Tensor", "Scalar"):
        _POINTWISE[f"aten.{_name}.{_ov}"] = (("self", "other"), lambda e, raw, T, op=_op: f"({e['self']} {op} {e['other']})")
POINTWISE_OPS = frozenset(_POINTWISE)  # the ops `_pointwise_value` computes (a fused kernel's steps)
_BOOL_OPERANDS = {"condition", "mask"}
_ALLOWED_EXTRA = {"aten._to_copy.default": {"dtype", "non_blocking", "memory_format", "layout", "device",
                                            "pin_memory"},
                  "aten.clone.default": {"memory_format"}, "aten.contiguous.default": {"memory_format"}}


def _compare_type(sig, args, operand_names) -> str:
    """The C type a comparison computes in: ATen's common dtype of its float operands. Tensors with
    dimensions decide; a 0-dim tensor widens the type only when every operand is 0-dim (as a Python
    scalar never does), so float32 x == float64 tensor(0.1) compares in float32: 0.1 rounded to
    float, equal to x's 0.1f. Comparing in double made it False (tests/test_kernel_diff.py)."""
    dims, zero_dim = [], []
    for n in operand_names:
        v = args.get(n)
        if n in _BOOL_OPERANDS or not (isinstance(v, dict) and "tensor" in v):
            continue
        d = sig["inputs"][v["tensor"]]
        (dims if d["size"] else zero_dim).append(d["dtype"])
    return "double" if "float64" in (dims or zero_dim) else "float"


def _pointwise_value(sig, read) -> str:
    """The C expression of pointwise op ``sig``'s result, converted to its output's C type.

    ``read(k, ctype)`` gives the expression of the op's input ``k`` converted to ``ctype`` (a loaded
    variable in a kernel of its own, a register of an earlier step in a fused one, `_fused`)."""
    operand_names, build = _POINTWISE[sig["op"]]
    args = _args(sig)
    out = sig["outputs"][0]
    if len(sig["outputs"]) != 1:
        raise Unsupported
    for name, v in args.items():
        if name in operand_names:
            continue
        allowed = _ALLOWED_EXTRA.get(sig["op"], set())
        if name not in allowed or (name in ("layout", "device", "pin_memory") and v not in (None, False)):
            raise Unsupported
    float_inputs = [sig["inputs"][args[n]["tensor"]]["dtype"] for n in operand_names
                    if isinstance(args.get(n), dict) and "tensor" in args[n] and n not in _BOOL_OPERANDS]
    if any(d not in _FLOATS for d in float_inputs):
        raise Unsupported
    if out["dtype"] == "bool":
        if not float_inputs:
            raise Unsupported
        T = _compare_type(sig, args, operand_names)
    elif out["dtype"] in _FLOATS:
        T = _CTYPE[out["dtype"]]
    else:
        raise Unsupported
    exprs, raw = {}, {}
    for name in operand_names:
        v = args.get(name)
        raw[name] = v
        if isinstance(v, dict) and "tensor" in v:
            k = v["tensor"]
            if (name in _BOOL_OPERANDS) != (sig["inputs"][k]["dtype"] == "bool"):
                raise Unsupported
            exprs[name] = read(k, "uint8_t" if name in _BOOL_OPERANDS else T)
        elif isinstance(v, dict) and "tensors" in v:
            raise Unsupported
        elif v is not None and not isinstance(v, str):
            exprs[name] = _literal(v, T)
    expr = build(exprs, raw, T)
    if out["dtype"] == "bool":
        # A bool result is "nonzero", never a C cast: C converts a float to an integer type by truncating
        # toward zero (0.5 -> 0) and leaves values outside its range undefined (-3.4e38 -> 0 on x86),
        # so `(uint8_t)x` turned a float attention mask's large negative values into False (issue 24).
        # torch's bool(x) is x != 0 (NaN is True); comparisons already give 0 or 1, which this keeps.
        return f"(uint8_t)(({expr}) != 0)"
    return f"({_CTYPE[out['dtype']]})({expr})"


class _Loads:
    """The loads of one loop body: each (input, C type) read once, into a variable of its own."""

    def __init__(self, index: list):
        self.index = index  # index[1 + k] addresses input k (index[0] the output)
        self.lines: list[str] = []
        self.names: dict = {}

    def read(self, k: int, ctype: str) -> str:
        name = self.names.get((k, ctype))
        if name is None:
            name = self.names[(k, ctype)] = f"v{len(self.names)}"
            self.lines.append(f"{ctype} {name} = ({ctype})x{k}[{self.index[1 + k]}];")
        return name


def _pointwise(sig, symbol):
    size = sig["outputs"][0]["size"]
    strides = [sig["outputs"][0]["stride"]] + [_broadcast(d, size) for d in sig["inputs"]]
    _pointwise_value(sig, lambda k, ctype: "v")  # unsupported signatures fail here, before any loop is made

    def body(index):
        loads = _Loads(index)
        value = _pointwise_value(sig, loads.read)
        return loads.lines + [f"y0[{index[0]}] = {value};"]

    return _function(symbol, _loops(list(size), strides, body, _numel(size) >= PARALLEL_MIN), sig)


# -- rows: layer norm, softmax ------------------------------------------------------------------------

def _rows(d: dict, inner_dims: int) -> tuple[int, int, int]:
    """(rows, row length, row stride) of layout ``d`` whose last ``inner_dims`` dims are contiguous."""
    size, stride = d["size"], d["stride"]
    if inner_dims > len(size) or inner_dims < 1:
        raise Unsupported
    inner = size[len(size) - inner_dims:]
    expect = 1
    for s, st in zip(reversed(inner), reversed(stride[len(size) - inner_dims:])):
        if s != 1 and st != expect:
            raise Unsupported
        expect *= s
    outer_size, outer_stride = _collapse(list(size[:len(size) - inner_dims]), [list(stride[:len(size) - inner_dims])])
    if len(outer_size) > 1:
        raise Unsupported
    rows = outer_size[0] if outer_size else 1
    return rows, _numel(inner), (outer_stride[0][0] if outer_size else 0)


def _contiguous(d: dict) -> bool:
    expect = 1
    for s, st in zip(reversed(d["size"]), reversed(d["stride"])):
        if s != 1 and st != expect:
            return False
        expect *= s
    return True


def _layer_norm(sig, symbol):
    args = _args(sig)
    x = sig["inputs"][args["input"]["tensor"]]
    if x["dtype"] not in _FLOATS or any(o["dtype"] != x["dtype"] for o in sig["outputs"]):
        raise Unsupported
    T = _CTYPE[x["dtype"]]
    inner = len(args["normalized_shape"])
    rows, n, rs = _rows(x, inner)
    orows, on, ors = _rows(sig["outputs"][0], inner)
    if (orows, on) != (rows, n) or n == 0:
        raise Unsupported
    for stats in sig["outputs"][1:]:  # mean and rstd: one value per row, contiguous
        if _numel(stats["size"]) != rows or not _contiguous(stats):
            raise Unsupported
    w, b = args["weight"], args["bias"]
    for t in (w, b):
        if t is not None and _rows(sig["inputs"][t["tensor"]], len(sig["inputs"][t["tensor"]]["size"]))[1] != n:
            raise Unsupported
    eps = _literal(args["eps"], "double")
    scale = f" * x{w['tensor']}[j]" if w is not None else ""
    shift = f" + x{b['tensor']}[j]" if b is not None else ""
    body = [
        f"  {'#pragma omp parallel for' if rows * n >= PARALLEL_MIN else ''}",
        f"  for (int64_t r = 0; r < {rows}LL; r++) {{",
        f"    const {T} *row = x{args['input']['tensor']} + r * {rs}LL;",
        f"    {T} *out = y0 + r * {ors}LL;",
        "    double sum = 0, sq = 0;",
        "    #pragma omp simd reduction(+:sum)",
        f"    for (int64_t j = 0; j < {n}LL; j++) sum += row[j];",
        f"    double mean = sum / {n}.0;",
        "    #pragma omp simd reduction(+:sq)",
        f"    for (int64_t j = 0; j < {n}LL; j++) {{ double d = row[j] - mean; sq += d * d; }}",
        f"    double var = sq / {n}.0;",
        # ATen clamps with std::max(var, 0), which keeps a NaN variance (a row holding inf or NaN): the row
        # is NaN. `var > 0 ? var : 0` made it 0, so such a row came out as +-inf and finite values.
        f"    double rstd = 1.0 / sqrt((var < 0 ? 0 : var) + {eps});",
        f"    {T} m = ({T})mean, s = ({T})rstd;",
        "    #pragma omp simd",
        f"    for (int64_t j = 0; j < {n}LL; j++) out[j] = (row[j] - m) * s{scale}{shift};",
        "    y1[r] = m;",
        "    y2[r] = s;",
        "  }",
    ]
    return _function(symbol, body, sig)


def _softmax(sig, symbol, log: bool):
    args = _args(sig)
    x = sig["inputs"][args["self"]["tensor"]]
    out = sig["outputs"][0]
    rank = len(x["size"])
    if rank == 0 or args["half_to_float"] or x["dtype"] not in _FLOATS or out["dtype"] != x["dtype"]:
        raise Unsupported
    if args["dim"] % rank != rank - 1:
        raise Unsupported
    T = _CTYPE[x["dtype"]]
    rows, n, rs = _rows(x, 1)
    orows, on, ors = _rows(out, 1)
    if (orows, on) != (rows, n) or n == 0:
        raise Unsupported
    e = _fn("exp", T)
    finish = ([f"    {T} l = ({T}){_fn('log', T)}(sum);", "    #pragma omp simd",
               f"    for (int64_t j = 0; j < {n}LL; j++) o[j] = row[j] - mx - l;"] if log else
              [f"    {T} inv = (({T})1) / sum;", "    #pragma omp simd", f"    for (int64_t j = 0; j < {n}LL; j++) o[j] *= inv;"])
    body = [
        f"  {'#pragma omp parallel for' if rows * n >= PARALLEL_MIN else ''}",
        f"  for (int64_t r = 0; r < {rows}LL; r++) {{",
        f"    const {T} *row = x{args['self']['tensor']} + r * {rs}LL;",
        f"    {T} *o = y0 + r * {ors}LL;",
        f"    {T} mx = row[0];",
        f"    for (int64_t j = 1; j < {n}LL; j++) mx = (row[j] > mx || row[j] != row[j]) ? row[j] : mx;",
        f"    {T} sum = 0;",
        "    #pragma omp simd reduction(+:sum)",
        f"    for (int64_t j = 0; j < {n}LL; j++) {{ {T} v = {e}(row[j] - mx); {'' if log else 'o[j] = v; '}sum += v; }}",
        *finish,
        "  }",
    ]
    return _function(symbol, body, sig)


# -- reductions over some dims: sum, mean ---------------------------------------------------------------

def _reduction(sig, symbol, mean: bool):
    """``sum.dim_IntList`` / ``mean.dim`` of a float tensor over the dims listed (any strides, keepdim or
    not), its own dtype: each result summed in double, in the input's memory order (global pooling of a
    channels-last image reads its rows of channels), then divided by the count for a mean."""
    args = _args(sig)
    x, out = sig["inputs"][args["self"]["tensor"]], sig["outputs"][0]
    dims = value_of(args["dim"])
    rank = len(x["size"])
    if x["dtype"] not in _FLOATS or out["dtype"] != x["dtype"] or args.get("dtype") is not None or rank == 0 \
            or not isinstance(dims, list) or not dims or any(not isinstance(d, int) or isinstance(d, bool) for d in dims):
        raise Unsupported
    reduced = sorted({d % rank for d in dims})
    kept = [d for d in range(rank) if d not in reduced]
    keepdim = bool(value_of(args.get("keepdim", False)))
    out_size = [1 if d in reduced else s for d, s in enumerate(x["size"])] if keepdim else [x["size"][d] for d in kept]
    if out_size != out["size"] or _numel(x["size"]) == 0:
        raise Unsupported
    out_strides = [out["stride"][d] for d in kept] if keepdim else list(out["stride"])
    T, count = _CTYPE[x["dtype"]], _numel([x["size"][d] for d in reduced])
    xi = args["self"]["tensor"]
    inner_size, (inner_stride,) = _collapse(*_memory_order([x["size"][d] for d in reduced],
                                                          [[x["stride"][d] for d in reduced]]))

    def body(ix):
        lines = ["double acc = 0;"]
        for k, n in enumerate(inner_size):
            if k == len(inner_size) - 1:
                lines.append("#pragma omp simd reduction(+:acc)")
            lines.append(f"for (int64_t r{k} = 0; r{k} < {n}LL; r{k}++)")
        at = " + ".join([ix[1]] + [f"r{k}*{st}LL" for k, st in enumerate(inner_stride)])
        lines.append(f"  acc += x{xi}[{at}];")
        return lines + [f"y0[{ix[0]}] = ({T})({'acc / ' + str(count) + '.0' if mean else 'acc'});"]

    parallel = _numel(x["size"]) >= PARALLEL_MIN and len(kept) > 0
    return _function(symbol, _loops([x["size"][d] for d in kept], [out_strides, [x["stride"][d] for d in kept]], body,
                                    parallel, simd=False), sig)


def _memory_order(size: list, strides: list[list]) -> tuple[list, list[list]]:
    """``size`` and ``strides`` with the dims in the first array's memory order (largest stride first)."""
    order = sorted(range(len(size)), key=lambda d: -abs(strides[0][d]))  # stable: ties keep their order
    return [size[d] for d in order], [[st[d] for d in order] for st in strides]


# -- images: inference batch norm, constant padding ----------------------------------------------------------

MAX_CHANNELS = 16384  # batch norm's per-channel terms live on the kernel's stack
BATCH_NORM = "aten._native_batch_norm_legit_no_training.default"  # inference batch norm (a fused kernel's step too)


def _batch_norm_terms(sig) -> tuple[str, int, dict, int]:
    """(C type, input index of x, per-channel inputs, channels) of an inference batch norm's signature;
    per-channel inputs: name -> (input index, stride) for weight, bias, running_mean, running_var."""
    args = _args(sig)
    x, out = sig["inputs"][args["input"]["tensor"]], sig["outputs"][0]
    if x["dtype"] not in _FLOATS or out["dtype"] != x["dtype"] or len(x["size"]) < 2 or out["size"] != x["size"] \
            or any(_numel(o["size"]) != 0 for o in sig["outputs"][1:]):
        raise Unsupported
    T, channels = _CTYPE[x["dtype"]], x["size"][1]
    if not 0 < channels <= MAX_CHANNELS or _numel(x["size"]) == 0:
        raise Unsupported
    per_channel = {}
    for name in ("weight", "bias", "running_mean", "running_var"):
        ref = args.get(name)
        if ref is None and name in ("weight", "bias"):
            continue
        if not (isinstance(ref, dict) and "tensor" in ref):
            raise Unsupported
        d = sig["inputs"][ref["tensor"]]
        if d["dtype"] != x["dtype"] or d["size"] != [channels]:
            raise Unsupported
        per_channel[name] = (ref["tensor"], d["stride"][0])
    return T, args["input"]["tensor"], per_channel, channels


def _batch_norm_prologue(T: str, per_channel: dict, channels: int, eps, suffix: str, source) -> list[str]:
    """Lines filling ``alpha{suffix}``/``beta{suffix}``; ``source(k)`` names the array of input ``k``."""
    def at(name, default):
        if name not in per_channel:
            return default
        k, stride = per_channel[name]
        return f"{source(k)}[c * {stride}LL]"

    return [f"  {T} alpha{suffix}[{channels}], beta{suffix}[{channels}];",
            f"  for (int64_t c = 0; c < {channels}LL; c++) {{",
            f"    {T} invstd = (({T})1) / {_fn('sqrt', T)}({at('running_var', None)} + {_literal(eps, T)});",
            f"    alpha{suffix}[c] = invstd * {at('weight', f'(({T})1)')};",
            f"    beta{suffix}[c] = {at('bias', f'(({T})0)')} - {at('running_mean', None)} * alpha{suffix}[c];",
            "  }"]


def _channel_strides(rank: int) -> list:
    """Strides that read a per-channel array as a [1, C, 1, ...] tensor broadcast over an image."""
    return [0, 1] + [0] * (rank - 2)


def _batch_norm(sig, symbol):
    """Batch norm with running statistics (``_native_batch_norm_legit_no_training``), ATen's CPU formula:
    per channel alpha = invstd * weight and beta = bias - mean * alpha with invstd = 1 / sqrt(var + eps),
    all in the input's type (its opmath for float32 and float64), then out = x * alpha + beta (a multiply
    and an add, no FMA, as ATen's vectorized loop) at any strides; the saved statistics it returns are empty."""
    T, x_at, per_channel, channels = _batch_norm_terms(sig)
    x, out = sig["inputs"][x_at], sig["outputs"][0]
    body = _batch_norm_prologue(T, per_channel, channels, _args(sig)["eps"], "", lambda k: f"x{k}")
    strides = [out["stride"], x["stride"], _channel_strides(len(x["size"]))]
    body += _loops(list(x["size"]), strides, lambda ix: [f"y0[{ix[0]}] = x{x_at}[{ix[1]}] * alpha[{ix[2]}] + beta[{ix[2]}];"],
                   _numel(x["size"]) >= PARALLEL_MIN)
    return _function(symbol, body, sig)


# -- fused: neighbouring pointwise steps in one loop ------------------------------------------------------

def _fused(sig, symbol):
    """Steps of one shape in one loop (`rewrite.kernels.fusion`): pointwise ops and inference batch norms,
    each step's result a register the later steps read, so the values between them never reach memory.

    ``sig``'s ``steps`` argument lists the steps in order, each its own signature and, per input of it,
    its source: ``["input", k]`` (input k of the fused signature) or ``["step", j]`` (an earlier step).
    Every step computes what its own kernel would, converted to its result's type as a store would, so
    the result is bit for bit that of the steps run one by one; only transcendental functions may differ
    in the last bits, as between any two loops: their vector (libmvec) and scalar versions differ, and the
    loop's shape decides which one an element gets."""
    steps = _args(sig).get("steps")
    if not steps or len(sig["outputs"]) != 1:
        raise Unsupported
    out = sig["outputs"][0]
    size = out["size"]
    last = steps[-1]["signature"]["outputs"][0]
    if last["dtype"] != out["dtype"] or last["size"] != size:
        raise Unsupported
    prologue, in_loop, channel = [], set(), None  # in_loop: the inputs the loop reads (not only per channel)
    normed = {}  # step index of a batch norm -> (its C type, the index of its input x)
    for j, step in enumerate(steps):
        step_sig = step["signature"]
        if step_sig["outputs"][0]["size"] != size:
            raise Unsupported
        for k, (kind, at) in enumerate(step["sources"]):  # what a step reads is what its source holds
            source = sig["inputs"][at] if kind == "input" else steps[at]["signature"]["outputs"][0]
            if (source["dtype"], source["size"]) != (step_sig["inputs"][k]["dtype"], step_sig["inputs"][k]["size"]) \
                    or (kind == "input" and source["stride"] != step_sig["inputs"][k]["stride"]):
                raise Unsupported
        if step_sig["op"] == BATCH_NORM:
            T, x_at, per_channel, channels = _batch_norm_terms(step_sig)
            normed[j] = (T, x_at)
            in_loop.update(at for kind, at in step["sources"][x_at:x_at + 1] if kind == "input")

            def array(k, sources=step["sources"]):
                kind, at = sources[k]
                if kind != "input":  # per-channel terms are read before the loop: never a step's result
                    raise Unsupported
                return f"x{at}"

            prologue += _batch_norm_prologue(T, per_channel, channels, _args(step_sig)["eps"], str(j), array)
            channel = len(sig["inputs"]) + 1  # index of the per-channel arrays' strides, after the inputs'
        elif step_sig["op"] in _POINTWISE:
            _pointwise_value(step_sig, lambda k, ctype: "v")  # unsupported steps fail here, before any loop
            in_loop.update(at for kind, at in step["sources"] if kind == "input")
        else:
            raise Unsupported
    strides = [out["stride"]] + [_broadcast(d, size) if k in in_loop else [0] * len(size)
                                 for k, d in enumerate(sig["inputs"])]
    if channel is not None:
        strides.append(_channel_strides(len(size)))

    def body(index):
        loads, lines = _Loads(index), []
        for j, step in enumerate(steps):
            step_sig, sources = step["signature"], step["sources"]

            def read(k, ctype, sources=sources):
                kind, at = sources[k]
                return loads.read(at, ctype) if kind == "input" else f"(({ctype})t{at})"

            if j in normed:
                T, x_at = normed[j]
                c = index[channel]
                value = f"{read(x_at, T)} * alpha{j}[{c}] + beta{j}[{c}]"
            else:
                T = _CTYPE[step_sig["outputs"][0]["dtype"]]
                value = _pointwise_value(step_sig, read)
            lines.append(f"{T} t{j} = {value};")
        return loads.lines + lines + [f"y0[{index[0]}] = t{len(steps) - 1};"]

    body_lines = _loops(list(size), strides, body, _numel(size) >= PARALLEL_MIN)
    return _function(symbol, prologue + body_lines, sig)


def _constant_pad(sig, symbol):
    """``constant_pad_nd`` with pads of at least 0: the value everywhere, then the input copied inside."""
    args = _args(sig)
    x, out = sig["inputs"][args["self"]["tensor"]], sig["outputs"][0]
    pad = value_of(args["pad"])
    rank = len(x["size"])
    if x["dtype"] not in _FLOATS or out["dtype"] != x["dtype"] or not isinstance(pad, list) or len(pad) % 2 \
            or len(pad) > 2 * rank or any(not isinstance(p, int) or isinstance(p, bool) or p < 0 for p in pad):
        raise Unsupported
    T = _CTYPE[x["dtype"]]
    value = args.get("value")
    fill = _literal(value if value is not None else 0, T)
    before = [0] * rank
    for k in range(len(pad) // 2):  # pad holds (before, after) pairs from the last dim backwards
        before[rank - 1 - k] = pad[2 * k]
        if x["size"][rank - 1 - k] + pad[2 * k] + pad[2 * k + 1] != out["size"][rank - 1 - k]:
            raise Unsupported
    base = sum(b * st for b, st in zip(before, out["stride"]))
    parallel = _numel(out["size"]) >= PARALLEL_MIN
    body = _loops(list(out["size"]), [out["stride"]], lambda ix: [f"y0[{ix[0]}] = {fill};"], parallel)
    if _numel(x["size"]):
        body += _loops(list(x["size"]), [out["stride"], x["stride"]],
                       lambda ix: [f"y0[{base}LL + {ix[0]}] = x{args['self']['tensor']}[{ix[1]}];"], parallel)
    return _function(symbol, body, sig)


def _max_pool2d(sig, symbol):
    """``max_pool2d_with_indices`` (values and flat indices into each input plane), ATen's CPU scan: the
    window's in-bounds positions in row-major order, a position taken when its value is greater than the
    maximum so far or is NaN (so the first of equal maxima, the last NaN), starting from -inf at the
    window's first in-bounds position. Any strides (channels-last too); output sizes are the recorded ones."""
    args = _args(sig)
    x = sig["inputs"][args["self"]["tensor"]]
    values, indices = sig["outputs"]
    kernel, stride, padding, dilation = (value_of(args.get(k)) for k in ("kernel_size", "stride", "padding",
                                                                        "dilation"))
    if x["dtype"] not in _FLOATS or values["dtype"] != x["dtype"] or indices["dtype"] != "int64" \
            or len(x["size"]) != 4 or values["size"] != indices["size"] or values["size"][:2] != x["size"][:2]:
        raise Unsupported
    pairs = []
    for v, default in ((kernel, None), (stride, kernel), (padding, 0), (dilation, 1)):
        v = default if v in (None, []) else v
        v = [v, v] if isinstance(v, int) and not isinstance(v, bool) else v
        if isinstance(v, list) and len(v) == 1:
            v = v * 2
        if not isinstance(v, list) or len(v) != 2 or any(not isinstance(e, int) or isinstance(e, bool) for e in v):
            raise Unsupported
        pairs.append(v)
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = pairs
    if min(kh, kw, sh, sw, dh, dw) < 1 or min(ph, pw) < 0:
        raise Unsupported
    T, xi = _CTYPE[x["dtype"]], args["self"]["tensor"]
    height, width = x["size"][2], x["size"][3]
    xs, vs, js = x["stride"], values["stride"], indices["stride"]
    n, channels, out_h, out_w = values["size"]
    parallel = _numel(values["size"]) * kh * kw >= PARALLEL_MIN
    window = [f"int64_t h0 = oh * {sh}LL - {ph}LL, w0 = ow * {sw}LL - {pw}LL;",
              f"int64_t h1 = h0 + {(kh - 1) * dh + 1}LL, w1 = w0 + {(kw - 1) * dw + 1}LL;",
              f"if (h1 > {height}LL) h1 = {height}LL;",
              f"if (w1 > {width}LL) w1 = {width}LL;",
              f"while (h0 < 0) h0 += {dh}LL;",
              f"while (w0 < 0) w0 += {dw}LL;"]
    value_at = f"y0[b * {vs[0]}LL + c * {vs[1]}LL + oh * {vs[2]}LL + ow * {vs[3]}LL]"
    index_at = f"y1[b * {js[0]}LL + c * {js[1]}LL + oh * {js[2]}LL + ow * {js[3]}LL]"
    read = f"x{xi}[b * {xs[0]}LL + c * {xs[1]}LL + h * {xs[2]}LL + w * {xs[3]}LL]"
    take = f"if (v > {value_at} || isnan(v)) {{ {value_at} = v; {index_at} = h * {width}LL + w; }}"
    lines = ["  #pragma omp parallel for collapse(2)"] if parallel else []
    if xs[1] <= min(xs[2], xs[3]):
        # Channels-last: per output position, the window's positions outside and the channels inside, so the
        # innermost loop walks the channels (dense) and vectorizes; the outputs hold the running maxima.
        lines += [f"  for (int64_t b = 0; b < {n}LL; b++) {{",
                  f"    for (int64_t oh = 0; oh < {out_h}LL; oh++) {{",
                  f"      for (int64_t ow = 0; ow < {out_w}LL; ow++) {{"]
        lines += ["        " + ln for ln in window + [
            "#pragma omp simd",
            f"for (int64_t c = 0; c < {channels}LL; c++) {{ {value_at} = -INFINITY; "
            f"{index_at} = h0 * {width}LL + w0; }}",
            f"for (int64_t h = h0; h < h1; h += {dh}LL) {{",
            f"  for (int64_t w = w0; w < w1; w += {dw}LL) {{",
            "    #pragma omp simd",
            f"    for (int64_t c = 0; c < {channels}LL; c++) {{ {T} v = {read}; {take} }}",
            "  }",
            "}"]]
        lines += ["      }", "    }", "  }"]
    else:
        # One output at a time, its window scanned in a local maximum (a plane's rows are dense).
        lines += [f"  for (int64_t b = 0; b < {n}LL; b++) {{",
                  f"    for (int64_t c = 0; c < {channels}LL; c++) {{",
                  f"      for (int64_t oh = 0; oh < {out_h}LL; oh++) {{",
                  f"        for (int64_t ow = 0; ow < {out_w}LL; ow++) {{"]
        lines += ["          " + ln for ln in window + [
            f"{T} best = -INFINITY;",
            f"int64_t at = h0 * {width}LL + w0;",
            f"for (int64_t h = h0; h < h1; h += {dh}LL) {{",
            f"  for (int64_t w = w0; w < w1; w += {dw}LL) {{",
            f"    {T} v = {read};",
            f"    if (v > best || isnan(v)) {{ best = v; at = h * {width}LL + w; }}",
            "  }",
            "}",
            f"{value_at} = best;",
            f"{index_at} = at;"]]
        lines += ["        }", "      }", "    }", "  }"]
    return _function(symbol, lines, sig)


# -- matrix products -------------------------------------------------------------------------------------

def _matrix(d: dict, first: int):
    """BLAS view of the 2-D slice (dims first, first+1) of layout ``d``: (transposed?, ld, rows, cols)."""
    r, c = d["size"][first], d["size"][first + 1]
    s0, s1 = d["stride"][first], d["stride"][first + 1]
    if (s1 == 1 or c == 1) and (r == 1 or s0 >= max(c, 1)):
        return False, max(s0 if r > 1 else c, c, 1), r, c  # row-major
    if (s0 == 1 or r == 1) and (c == 1 or s1 >= max(r, 1)):
        return True, max(s1 if c > 1 else r, r, 1), r, c  # column-major
    raise Unsupported


def _gemm_call(T, a: str, b: str, c: str, A, B, C, m, n, k, alpha: str, beta: str) -> list[str]:
    """Row-major C[m,n] = alpha A[m,k] B[k,n] + beta C, as the column-major C^T = B^T A^T BLAS computes."""
    ta, lda = A[0], A[1]
    tb, ldb = B[0], B[1]
    if C[0] or max(m, n, k, lda, ldb, C[1]) >= 2**31:
        raise Unsupported
    gemm = "rw_sgemm" if T == "float" else "rw_dgemm"
    return [f"  {{ const int m = {n}, n = {m}, k = {k}, lda = {ldb}, ldb = {lda}, ldc = {C[1]};",
            f"    const {T} alpha = {alpha}, beta = {beta};",
            f"    {gemm}(\"{'T' if tb else 'N'}\", \"{'T' if ta else 'N'}\", &m, &n, &k, &alpha, {b}, &lda, {a}, &ldb, "
            f"&beta, {c}, &ldc); }}"]


PACKED = "rewrite_packed_weight"  # signature argument: mat2 comes as MKL-packed memory (extra operand 0)


def _packed_call(a: str, A, m: int, n: int, k: int, C, beta: str) -> list[str]:
    """C = A B + beta C with B packed by cblas_sgemm_pack (row-major, B transposed, alpha 1)."""
    if C[0] or max(m, n, k, A[1], C[1]) >= 2**31:
        raise Unsupported
    return [f"  rw_sgemm_compute(101, {112 if A[0] else 111}, 151, {m}, {n}, {k}, {a}, {A[1]}, (const float *)e0, "
            f"{k}, {beta}, y0, {C[1]});"]


def _mm(sig, symbol, with_bias: bool):
    args = _args(sig)
    packed = bool(args.get(PACKED))
    a_ref = args["mat1" if with_bias else "self"]["tensor"]  # addmm(self=bias, mat1, mat2); mm(self, mat2)
    A, B, C = sig["inputs"][a_ref], sig["inputs"][args["mat2"]["tensor"]], sig["outputs"][0]
    if {A["dtype"], B["dtype"], C["dtype"]} - {"float32", "float64"} or len({A["dtype"], B["dtype"], C["dtype"]}) != 1:
        raise Unsupported
    T = _CTYPE[C["dtype"]]
    m, k = A["size"]
    n = B["size"][1]
    if min(m, n, k) == 0:
        raise Unsupported
    body = []
    beta = "0"
    if with_bias:
        beta_v = value_of(args["beta"])
        if beta_v != 0:
            bias = sig["inputs"][args["self"]["tensor"]]
            if bias["dtype"] != C["dtype"]:
                raise Unsupported
            strides = [C["stride"], _broadcast(bias, C["size"])]
            body += _loops(list(C["size"]), strides, lambda ix: [f"y0[{ix[0]}] = x{args['self']['tensor']}[{ix[1]}];"],
                           False)
            beta = _literal(args["beta"], T)
        alpha = _literal(args["alpha"], T)
    else:
        alpha = "1"
    if packed:
        if T != "float" or (with_bias and (value_of(args["alpha"]) != 1 or value_of(args["beta"]) not in (0, 1))):
            raise Unsupported
        body += _packed_call(f"x{a_ref}", _matrix(A, 0), m, n, k, _matrix(C, 0), "1.0f" if beta != "0" else "0.0f")
        return _function(symbol, body, sig, extra_inputs=1)
    body += _gemm_call(T, f"x{a_ref}", f"x{args['mat2']['tensor']}", "y0", _matrix(A, 0),
                       _matrix(B, 0), _matrix(C, 0), m, n, k, alpha, beta)
    return _function(symbol, body, sig)


def _bmm(sig, symbol):
    args = _args(sig)
    A, B, C = sig["inputs"][args["self"]["tensor"]], sig["inputs"][args["mat2"]["tensor"]], sig["outputs"][0]
    if len({A["dtype"], B["dtype"], C["dtype"]}) != 1 or C["dtype"] not in _FLOATS:
        raise Unsupported
    T = _CTYPE[C["dtype"]]
    batch, m, k = A["size"]
    n = B["size"][2]
    if min(batch, m, n, k) == 0:
        raise Unsupported
    call = _gemm_call(T, f"x{args['self']['tensor']} + i * {A['stride'][0]}LL",
                      f"x{args['mat2']['tensor']} + i * {B['stride'][0]}LL", f"y0 + i * {C['stride'][0]}LL",
                      _matrix(A, 1), _matrix(B, 1), _matrix(C, 1), m, n, k, "1", "0")
    return _function(symbol, [f"  for (int64_t i = 0; i < {batch}LL; i++)"] + call, sig)


# -- gathers and copies -----------------------------------------------------------------------------------

def _gather_rows(sig, symbol, source: int, index: int, count: int, row: int, row_stride: int, out_row_stride: int,
                 from_end: bool) -> str:
    """A kernel copying, for each int64 index of input ``index`` (in its logical order), row ``id`` of input
    ``source`` (``row`` elements ``row_stride`` apart from row to row, contiguous within) into the next output
    row; ``from_end``: negative indices count from the end, as ``x[i]`` does. Out of range is error 1."""
    T = _CTYPE[sig["inputs"][source]["dtype"]]
    I = sig["inputs"][index]

    def body(ix):
        wrap = [f"if (id < 0) id += {count}LL;"] if from_end else []
        return [f"int64_t id = x{index}[{ix[0]}];", *wrap,
                f"if (id < 0 || id >= {count}LL) return 1;",
                f"memcpy(y0 + (at++) * {out_row_stride}LL, x{source} + id * {row_stride}LL, {row}LL * sizeof({T}));"]

    return _function(symbol, ["  int64_t at = 0;"] + _loops(list(I["size"]), [I["stride"]], body, False, simd=False,
                                                            in_memory_order=False),  # rows in index order
                     sig)


def _embedding(sig, symbol):
    args = _args(sig)
    W, I, O = sig["inputs"][args["weight"]["tensor"]], sig["inputs"][args["indices"]["tensor"]], sig["outputs"][0]
    if len(W["size"]) != 2 or W["dtype"] not in _FLOATS or O["dtype"] != W["dtype"] or I["dtype"] != "int64":
        raise Unsupported
    vocab, dim = W["size"]
    if W["stride"][1] != 1 or dim == 0:
        raise Unsupported
    rows, n, ors = _rows(O, 1)
    if n != dim or rows != _numel(I["size"]):
        raise Unsupported
    return _gather_rows(sig, symbol, args["weight"]["tensor"], args["indices"]["tensor"], vocab, dim, W["stride"][0],
                        ors, from_end=False)


def _index(sig, symbol):
    """``index.Tensor(x, [i])``: rows of ``x`` (along dim 0) picked by one int64 index tensor, negative indices
    counted from the end as ATen counts them; an index out of range is error 1 (IndexError)."""
    args = _args(sig)
    refs = args["indices"].get("tensors") if isinstance(args["indices"], dict) else None
    if not refs or len(refs) != 1:
        raise Unsupported
    X, I, O = sig["inputs"][args["self"]["tensor"]], sig["inputs"][refs[0]], sig["outputs"][0]
    if not X["size"] or X["dtype"] not in _CTYPE or O["dtype"] != X["dtype"] or I["dtype"] != "int64":
        raise Unsupported
    count, rank = X["size"][0], len(X["size"])
    if rank == 1:  # each row one element; the output is shaped like the index
        row, row_stride = 1, X["stride"][0]
        O = {"size": O["size"] + [1], "stride": O["stride"] + [1]}
    else:
        _, row, row_stride = _rows(X, rank - 1)
    rows, n, ors = _rows(O, max(rank - 1, 1))
    if n != row or rows != _numel(I["size"]) or count == 0:
        raise Unsupported
    return _gather_rows(sig, symbol, args["self"]["tensor"], refs[0], count, row, row_stride, ors, from_end=True)


def _cat(sig, symbol):
    args = _args(sig)
    out = sig["outputs"][0]
    refs = args["tensors"]["tensors"]
    rank = len(out["size"])
    dim = value_of(args["dim"]) % max(rank, 1)
    if out["dtype"] not in _CTYPE or any(sig["inputs"][r]["dtype"] != out["dtype"] for r in refs):
        raise Unsupported
    body, at = [], 0
    for r in refs:
        d = sig["inputs"][r]
        if _numel(d["size"]) == 0:
            continue  # ATen skips empty inputs too
        if len(d["size"]) != rank:
            raise Unsupported
        size = list(d["size"])
        strides = [out["stride"], d["stride"]]
        base = at * out["stride"][dim]
        body += _loops(size, strides, lambda ix, r=r, base=base: [f"y0[{base}LL + {ix[0]}] = x{r}[{ix[1]}];"],
                       _numel(size) >= PARALLEL_MIN)
        at += d["size"][dim]
    if at != out["size"][dim]:
        raise Unsupported
    return _function(symbol, body, sig)


_FAMILIES = {name: _pointwise for name in _POINTWISE}
_FAMILIES.update({
    "aten.native_layer_norm.default": _layer_norm,
    "aten._softmax.default": lambda sig, symbol: _softmax(sig, symbol, False),
    "aten._log_softmax.default": lambda sig, symbol: _softmax(sig, symbol, True),
    "aten.mm.default": lambda sig, symbol: _mm(sig, symbol, False),
    "aten.addmm.default": lambda sig, symbol: _mm(sig, symbol, True),
    "aten.bmm.default": _bmm,
    "aten.embedding.default": _embedding,
    "aten.index.Tensor": _index,
    "aten.cat.default": _cat,
    BATCH_NORM: _batch_norm,
    "aten.constant_pad_nd.default": _constant_pad,
    "aten.max_pool2d_with_indices.default": _max_pool2d,
    FUSED: _fused,
    "aten.sum.dim_IntList": lambda sig, symbol: _reduction(sig, symbol, False),
    "aten.mean.dim": lambda sig, symbol: _reduction(sig, symbol, True),
})
