"""Gathers of rows by an int64 index tensor: ``embedding`` and ``index.Tensor`` (an index out of range is
error 1, raised as IndexError)."""
from __future__ import annotations

from .core import C_TYPE, FLOAT_DTYPES, Unsupported, arg_values, kernel_function, emit_loops, element_count, row_shape


def _gather_rows(sig, symbol, source: int, index: int, count: int, row: int, row_stride: int, out_row_stride: int,
                 from_end: bool) -> str:
    """A kernel copying, for each int64 index of input ``index`` (in its logical order), row ``id`` of input
    ``source`` (``row`` elements ``row_stride`` apart from row to row, contiguous within) into the next output
    row; ``from_end``: negative indices count from the end, as ``x[i]`` does. Out of range is error 1."""
    T = C_TYPE[sig["inputs"][source]["dtype"]]
    I = sig["inputs"][index]

    def body(ix):
        wrap = [f"if (id < 0) id += {count}LL;"] if from_end else []
        return [f"int64_t id = x{index}[{ix[0]}];", *wrap,
                f"if (id < 0 || id >= {count}LL) return 1;",
                f"memcpy(y0 + (at++) * {out_row_stride}LL, x{source} + id * {row_stride}LL, {row}LL * sizeof({T}));"]

    return kernel_function(symbol, ["  int64_t at = 0;"] + emit_loops(list(I["size"]), [I["stride"]], body, False, simd=False,
                                                            in_memory_order=False),  # rows in index order
                     sig)


def gen_embedding(sig, symbol):
    args = arg_values(sig)
    W, I, O = sig["inputs"][args["weight"]["tensor"]], sig["inputs"][args["indices"]["tensor"]], sig["outputs"][0]
    if len(W["size"]) != 2 or W["dtype"] not in FLOAT_DTYPES or O["dtype"] != W["dtype"] or I["dtype"] != "int64":
        raise Unsupported
    vocab, dim = W["size"]
    if W["stride"][1] != 1 or dim == 0:
        raise Unsupported
    rows, n, ors = row_shape(O, 1)
    if n != dim or rows != element_count(I["size"]):
        raise Unsupported
    return _gather_rows(sig, symbol, args["weight"]["tensor"], args["indices"]["tensor"], vocab, dim, W["stride"][0],
                        ors, from_end=False)


def gen_index(sig, symbol):
    """``index.Tensor(x, [i])``: rows of ``x`` (along dim 0) picked by one int64 index tensor, negative indices
    counted from the end as ATen counts them; an index out of range is error 1 (IndexError)."""
    args = arg_values(sig)
    refs = args["indices"].get("tensors") if isinstance(args["indices"], dict) else None
    if not refs or len(refs) != 1:
        raise Unsupported
    X, I, O = sig["inputs"][args["self"]["tensor"]], sig["inputs"][refs[0]], sig["outputs"][0]
    if not X["size"] or X["dtype"] not in C_TYPE or O["dtype"] != X["dtype"] or I["dtype"] != "int64":
        raise Unsupported
    count, rank = X["size"][0], len(X["size"])
    if rank == 1:  # each row one element; the output is shaped like the index
        row, row_stride = 1, X["stride"][0]
        O = {"size": O["size"] + [1], "stride": O["stride"] + [1]}
    else:
        _, row, row_stride = row_shape(X, rank - 1)
    rows, n, ors = row_shape(O, max(rank - 1, 1))
    if n != row or rows != element_count(I["size"]) or count == 0:
        raise Unsupported
    return _gather_rows(sig, symbol, args["self"]["tensor"], refs[0], count, row, row_stride, ors, from_end=True)
