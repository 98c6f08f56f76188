"""``_softmax`` and ``_log_softmax`` over a contiguous last dim, one row at a time."""
from __future__ import annotations

from .core import C_TYPE, FLOAT_DTYPES, Unsupported, arg_values, math_fn, kernel_function, row_loop, row_pairs


def gen_softmax(sig, symbol, log: bool):
    args = arg_values(sig)
    x = sig["inputs"][args["self"]["tensor"]]
    out = sig["outputs"][0]
    rank = len(x["size"])
    if rank == 0 or args["half_to_float"] or x["dtype"] not in FLOAT_DTYPES or out["dtype"] != x["dtype"]:
        raise Unsupported
    if args["dim"] % rank != rank - 1:
        raise Unsupported
    T = C_TYPE[x["dtype"]]
    rows, n, rs, ors = row_pairs(x, out, 1)
    e = math_fn("exp", T)
    finish = ([f"    {T} l = ({T}){math_fn('log', T)}(sum);", "    #pragma omp simd",
               f"    for (int64_t j = 0; j < {n}LL; j++) o[j] = row[j] - mx - l;"] if log else
              [f"    {T} inv = (({T})1) / sum;", "    #pragma omp simd", f"    for (int64_t j = 0; j < {n}LL; j++) o[j] *= inv;"])
    body = [
        *row_loop(T, rows, n, args["self"]["tensor"], rs, ors, "o"),
        f"    {T} mx = row[0];",
        f"    for (int64_t j = 1; j < {n}LL; j++) mx = (row[j] > mx || row[j] != row[j]) ? row[j] : mx;",
        f"    {T} sum = 0;",
        "    #pragma omp simd reduction(+:sum)",
        f"    for (int64_t j = 0; j < {n}LL; j++) {{ {T} v = {e}(row[j] - mx); {'' if log else 'o[j] = v; '}sum += v; }}",
        *finish,
        "  }",
    ]
    return kernel_function(symbol, body, sig)
