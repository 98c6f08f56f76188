"""Matrix products: ``mm``, ``addmm`` and ``bmm`` through the BLAS ATen calls (MKL's ``sgemm_``/``dgemm_``),
and MKL's packed GEMM for constant weights (`PACKED`)."""
from __future__ import annotations

from ..signature import value_of
from .core import C_TYPE, FLOAT_DTYPES, Unsupported, arg_values, broadcast_strides, kernel_function, c_literal, emit_loops


def gemm_matrix(d: dict, first: int):
    """BLAS view of the 2-D slice (dims first, first+1) of layout ``d``: (transposed?, ld, rows, cols)."""
    r, c = d["size"][first], d["size"][first + 1]
    s0, s1 = d["stride"][first], d["stride"][first + 1]
    if (s1 == 1 or c == 1) and (r == 1 or s0 >= max(c, 1)):
        return False, max(s0 if r > 1 else c, c, 1), r, c  # row-major
    if (s0 == 1 or r == 1) and (c == 1 or s1 >= max(r, 1)):
        return True, max(s1 if c > 1 else r, r, 1), r, c  # column-major
    raise Unsupported


def gemm_call(T, a: str, b: str, c: str, A, B, C, m, n, k, alpha: str, beta: str) -> list[str]:
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


def gen_mm(sig, symbol, with_bias: bool):
    args = arg_values(sig)
    packed = bool(args.get(PACKED))
    a_ref = args["mat1" if with_bias else "self"]["tensor"]  # addmm(self=bias, mat1, mat2); mm(self, mat2)
    A, B, C = sig["inputs"][a_ref], sig["inputs"][args["mat2"]["tensor"]], sig["outputs"][0]
    if {A["dtype"], B["dtype"], C["dtype"]} - {"float32", "float64"} or len({A["dtype"], B["dtype"], C["dtype"]}) != 1:
        raise Unsupported
    T = C_TYPE[C["dtype"]]
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
            strides = [C["stride"], broadcast_strides(bias, C["size"])]
            body += emit_loops(list(C["size"]), strides, lambda ix: [f"y0[{ix[0]}] = x{args['self']['tensor']}[{ix[1]}];"],
                           False)
            beta = c_literal(args["beta"], T)
        alpha = c_literal(args["alpha"], T)
    else:
        alpha = "1"
    if packed:
        if T != "float" or (with_bias and (value_of(args["alpha"]) != 1 or value_of(args["beta"]) not in (0, 1))):
            raise Unsupported
        body += _packed_call(f"x{a_ref}", gemm_matrix(A, 0), m, n, k, gemm_matrix(C, 0), "1.0f" if beta != "0" else "0.0f")
        return kernel_function(symbol, body, sig, extra_inputs=1)
    body += gemm_call(T, f"x{a_ref}", f"x{args['mat2']['tensor']}", "y0", gemm_matrix(A, 0),
                       gemm_matrix(B, 0), gemm_matrix(C, 0), m, n, k, alpha, beta)
    return kernel_function(symbol, body, sig)


def gen_bmm(sig, symbol):
    args = arg_values(sig)
    A, B, C = sig["inputs"][args["self"]["tensor"]], sig["inputs"][args["mat2"]["tensor"]], sig["outputs"][0]
    if len({A["dtype"], B["dtype"], C["dtype"]}) != 1 or C["dtype"] not in FLOAT_DTYPES:
        raise Unsupported
    T = C_TYPE[C["dtype"]]
    batch, m, k = A["size"]
    n = B["size"][2]
    if min(batch, m, n, k) == 0:
        raise Unsupported
    call = gemm_call(T, f"x{args['self']['tensor']} + i * {A['stride'][0]}LL",
                      f"x{args['mat2']['tensor']} + i * {B['stride'][0]}LL", f"y0 + i * {C['stride'][0]}LL",
                      gemm_matrix(A, 1), gemm_matrix(B, 1), gemm_matrix(C, 1), m, n, k, "1", "0")
    return kernel_function(symbol, [f"  for (int64_t i = 0; i < {batch}LL; i++)"] + call, sig)
