"""The shared core of the C generator: the generator's version, the C types, and the helpers every
family emits with (a kernel function around a body, literals, loops over strided layouts, rows).

A family module (`pointwise`, `norms`, `gemm`, ...) turns the signatures of its ops into kernel bodies
with these helpers and raises `Unsupported` for a signature it gives no kernel; `generate` (the
package) picks the family from its table by op name.
"""
from __future__ import annotations

import math

from ..signature import value_of


# Bump whenever generated code changes: it is part of every kernel's key, so old artifacts go stale.
VERSION = 12  # 7: batch norm, constant padding, loops in memory order; 8: sum, mean; 9: max pooling; 10: index;
# 11: fused pointwise steps; 12: attention, convolution
ERRORS = {1: (IndexError, "index out of range in self"),
          2: (MemoryError, "a static kernel could not allocate its scratch memory")}
# Pointwise loops over at least this many elements are split over threads.
PARALLEL_MIN = 32768

C_TYPE = {"float32": "float", "float64": "double", "bool": "uint8_t", "int64": "int64_t", "int32": "int32_t",
          "uint8": "uint8_t", "int8": "int8_t", "int16": "int16_t"}
FLOAT_DTYPES = ("float32", "float64")


class Unsupported(Exception):
    """The signature gets no static kernel (its op runs as ATen)."""


# -- emitting --------------------------------------------------------------------------------------------

def arg_values(sig) -> dict:
    return {name: value for name, value in sig["args"]}


def element_count(size) -> int:
    return math.prod(size)


def is_int(v) -> bool:
    """A plain int argument (sizes, dims, pads): Python counts a bool as an int, a signature does not."""
    return isinstance(v, int) and not isinstance(v, bool)


def c_literal(v, ctype: str) -> str:
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


def math_fn(name: str, T: str) -> str:
    return f"{name}f" if T == "float" else name


def _pointers(sig, extra_inputs: int = 0) -> list[str]:
    lines = []
    for k, d in enumerate(sig["inputs"]):
        lines.append(f"  const {C_TYPE[d['dtype']]} *restrict x{k} = (const {C_TYPE[d['dtype']]} *)p[{k}];")
    base = len(sig["inputs"])
    for k, d in enumerate(sig["outputs"]):
        lines.append(f"  {C_TYPE[d['dtype']]} *restrict y{k} = ({C_TYPE[d['dtype']]} *)p[{base + k}];")
    for k in range(extra_inputs):
        lines.append(f"  const void *restrict e{k} = p[{base + len(sig['outputs']) + k}];")
    return lines


def kernel_function(symbol: str, body: list[str], sig, extra_inputs: int = 0) -> str:
    for d in sig["inputs"] + sig["outputs"]:
        if d["dtype"] not in C_TYPE:
            raise Unsupported
    return f"int {symbol}(void **p) {{\n" + "\n".join(_pointers(sig, extra_inputs) + body) + "\n  return 0;\n}\n"


# -- loops over strided layouts --------------------------------------------------------------------------

def broadcast_strides(d: dict, size: list) -> list:
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


def collapse_dims(size: list, strides: list[list]) -> tuple[list, list[list]]:
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


def memory_order(size: list, strides: list[list]) -> tuple[list, list[list]]:
    """``size`` and ``strides`` with the dims in the first array's memory order (largest stride first)."""
    order = sorted(range(len(size)), key=lambda d: -abs(strides[0][d]))  # stable: ties keep their order
    return [size[d] for d in order], [[st[d] for d in order] for st in strides]


def emit_loops(size: list, strides: list[list], emit, parallel: bool, simd: bool = True,
           in_memory_order: bool = True) -> list[str]:
    """Nested loops over ``size``; ``emit(indices)`` gives the body's lines for index expressions.

    ``simd``: the innermost loop is marked for vectorization (its body must not branch out of it).
    ``in_memory_order``: the loops nest in the order of the first array's strides, largest outside, so
    the innermost loop walks it with the smallest step (a channels-last image: the channels, not its
    width at a stride of C); only for bodies whose iterations are independent."""
    if in_memory_order:
        size, strides = memory_order(size, strides)
    size, strides = collapse_dims(size, strides)
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


# -- rows: the contiguous inner dims of a layout (norms, softmax, gathers) --------------------------------

def is_dense(size: list, stride: list) -> bool:
    """Whether ``size`` laid out at ``stride`` is dense in row-major order (size-1 dims at any stride)."""
    expect = 1
    for s, st in zip(reversed(size), reversed(stride)):
        if s != 1 and st != expect:
            return False
        expect *= s
    return True


def row_shape(d: dict, inner_dims: int) -> tuple[int, int, int]:
    """(rows, row length, row stride) of layout ``d`` whose last ``inner_dims`` dims are contiguous."""
    size, stride = d["size"], d["stride"]
    if inner_dims > len(size) or inner_dims < 1:
        raise Unsupported
    inner = size[len(size) - inner_dims:]
    if not is_dense(inner, stride[len(size) - inner_dims:]):
        raise Unsupported
    outer_size, outer_stride = collapse_dims(list(size[:len(size) - inner_dims]), [list(stride[:len(size) - inner_dims])])
    if len(outer_size) > 1:
        raise Unsupported
    rows = outer_size[0] if outer_size else 1
    return rows, element_count(inner), (outer_stride[0][0] if outer_size else 0)


def row_pairs(x: dict, out: dict, inner_dims: int) -> tuple[int, int, int, int]:
    """(rows, row length, x's row stride, out's row stride) of an op that maps each row of ``x`` (its last
    ``inner_dims`` dims) to the same row of ``out``; rows of no elements get no kernel."""
    rows, n, rs = row_shape(x, inner_dims)
    orows, on, ors = row_shape(out, inner_dims)
    if (orows, on) != (rows, n) or n == 0:
        raise Unsupported
    return rows, n, rs, ors


def row_loop(T: str, rows: int, n: int, x: int, rs: int, ors: int, out: str) -> list[str]:
    """The opening of a loop over ``rows`` rows of ``n`` elements (split over threads when large), with
    ``row`` pointing into input ``x`` and ``out`` into output 0; the caller closes the loop's brace."""
    return [f"  {'#pragma omp parallel for' if rows * n >= PARALLEL_MIN else ''}",
            f"  for (int64_t r = 0; r < {rows}LL; r++) {{",
            f"    const {T} *row = x{x} + r * {rs}LL;",
            f"    {T} *{out} = y0 + r * {ors}LL;"]
