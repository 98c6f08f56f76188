"""Pointwise ops: one expression per element, with broadcasting and any strides (`POINTWISE_OPS`).

`_pointwise_value` is the expression of one op's result; a pointwise kernel computes it in a loop of its
own (`_pointwise`), a fused kernel as one step of several (`fused`)."""
from __future__ import annotations

import math

from ..signature import value_of
from .core import (C_TYPE, FLOAT_DTYPES, PARALLEL_MIN, Unsupported, arg_values, broadcast_strides, math_fn, kernel_function, c_literal, emit_loops,
                   element_count)


def _gelu(e, raw, T):
    x = e["self"]
    if raw["approximate"] == "tanh":
        return (f"(({T})0.5) * {x} * ((({T})1) + {math_fn('tanh', T)}((({T})0.7978845608028654) * ({x} + (({T})0.044715) "
                f"* {x} * {x} * {x})))")
    if raw["approximate"] == "none":
        return f"{x} * (({T})0.5) * ((({T})1) + {math_fn('erf', T)}({x} * (({T})0.7071067811865476)))"
    raise Unsupported


def _pow_scalar(e, raw, T):
    x, ex = e["self"], value_of(raw["exponent"])
    special = {2: f"{x} * {x}", 3: f"{x} * {x} * {x}", 1: x, 0.5: f"sqrt{'f' if T == 'float' else ''}({x})",
               -1: f"(({T})1) / {x}", -2: f"(({T})1) / ({x} * {x})",
               -0.5: f"(({T})1) / sqrt{'f' if T == 'float' else ''}({x})"}
    if isinstance(ex, (int, float)) and not isinstance(ex, bool) and ex in special:
        return special[ex]
    return f"{math_fn('pow', T)}({x}, {e['exponent']})"


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
POINTWISE_FORMULAS: dict = {
    **{f"aten.{name}.default": (("self",), lambda e, raw, T, f=f: f"{math_fn(f, T)}({e['self']})")
       for name, f in _UNARY_FN.items()},
    "aten.neg.default": (("self",), lambda e, raw, T: f"-{e['self']}"),
    "aten.reciprocal.default": (("self",), lambda e, raw, T: f"(({T})1) / {e['self']}"),
    "aten.rsqrt.default": (("self",), lambda e, raw, T: f"(({T})1) / {math_fn('sqrt', T)}({e['self']})"),
    "aten.sigmoid.default": (("self",), lambda e, raw, T: f"(({T})1) / ((({T})1) + {math_fn('exp', T)}(-{e['self']}))"),
    "aten.silu.default": (("self",), lambda e, raw, T: f"{e['self']} / ((({T})1) + {math_fn('exp', T)}(-{e['self']}))"),
    # relu is ATen's clamp_min(x, 0): -0.0 and NaN stay themselves (`x > 0 ? x : 0` made -0.0 into 0.0)
    "aten.relu.default": (("self",), lambda e, raw, T: f"({e['self']} < 0 ? (({T})0) : {e['self']})"),
    "aten.gelu.default": (("self", "approximate"), _gelu),
    "aten.pow.Tensor_Scalar": (("self", "exponent"), _pow_scalar),
    "aten.pow.Tensor_Tensor": (("self", "exponent"), lambda e, raw, T: f"{math_fn('pow', T)}({e['self']}, {e['exponent']})"),
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
    return f"{a} + {b}" if v == 1 else f"{math_fn('fma', T)}({c_literal(v, T)}, {b}, {a})"


def _subtract(a: str, b: str, alpha, T: str) -> str:
    """ATen's sub: add(a, b, -alpha), so fma(-alpha, b, a); with an int alpha 0 that is a + 0 * b, where
    a - 0 * b would turn -0.0 - 0.0 * -0.0 into +0.0. For alpha 1 both are a - b, bit for bit."""
    v = value_of(alpha)
    return f"{a} - {b}" if v == 1 else _add(a, b, -v, T)


for _ov in ("Tensor", "Scalar"):
    POINTWISE_FORMULAS[f"aten.add.{_ov}"] = (("self", "other", "alpha"), lambda e, raw, T: _add(
        e["self"], e["other"], raw["alpha"], T))
    POINTWISE_FORMULAS[f"aten.sub.{_ov}"] = (("self", "other", "alpha"), lambda e, raw, T: _subtract(
        e["self"], e["other"], raw["alpha"], T))
    POINTWISE_FORMULAS[f"aten.rsub.{_ov}"] = (("self", "other", "alpha"), lambda e, raw, T: _subtract(
        e["other"], e["self"], raw["alpha"], T))
for _name, _op in (("mul", "*"), ("div", "/")):
    for _ov in ("Tensor", "Scalar"):
        POINTWISE_FORMULAS[f"aten.{_name}.{_ov}"] = (("self", "other"), lambda e, raw, T, op=_op: f"{e['self']} {op} {e['other']}")
_COMPARISONS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
for _name, _op in _COMPARISONS.items():
    for _ov in ("Tensor", "Scalar"):
        POINTWISE_FORMULAS[f"aten.{_name}.{_ov}"] = (("self", "other"), lambda e, raw, T, op=_op: f"({e['self']} {op} {e['other']})")
POINTWISE_OPS = frozenset(POINTWISE_FORMULAS)  # the ops `_pointwise_value` computes (a fused kernel's steps)
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


def pointwise_value(sig, read) -> str:
    """The C expression of pointwise op ``sig``'s result, converted to its output's C type.

    ``read(k, ctype)`` gives the expression of the op's input ``k`` converted to ``ctype`` (a loaded
    variable in a kernel of its own, a register of an earlier step in a fused one, `_fused`)."""
    operand_names, build = POINTWISE_FORMULAS[sig["op"]]
    args = arg_values(sig)
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
    if any(d not in FLOAT_DTYPES for d in float_inputs):
        raise Unsupported
    if out["dtype"] == "bool":
        if not float_inputs:
            raise Unsupported
        T = _compare_type(sig, args, operand_names)
    elif out["dtype"] in FLOAT_DTYPES:
        T = C_TYPE[out["dtype"]]
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
            exprs[name] = c_literal(v, T)
    expr = build(exprs, raw, T)
    if out["dtype"] == "bool":
        # A bool result is "nonzero", never a C cast: C converts a float to an integer type by truncating
        # toward zero (0.5 -> 0) and leaves values outside its range undefined (-3.4e38 -> 0 on x86),
        # so `(uint8_t)x` turned a float attention mask's large negative values into False (issue 24).
        # torch's bool(x) is x != 0 (NaN is True); comparisons already give 0 or 1, which this keeps.
        return f"(uint8_t)(({expr}) != 0)"
    return f"({C_TYPE[out['dtype']]})({expr})"


class Loads:
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


def gen_pointwise(sig, symbol):
    size = sig["outputs"][0]["size"]
    strides = [sig["outputs"][0]["stride"]] + [broadcast_strides(d, size) for d in sig["inputs"]]
    pointwise_value(sig, lambda k, ctype: "v")  # unsupported signatures fail here, before any loop is made

    def body(index):
        loads = Loads(index)
        value = pointwise_value(sig, loads.read)
        return loads.lines + [f"y0[{index[0]}] = {value};"]

    return kernel_function(symbol, emit_loops(list(size), strides, body, element_count(size) >= PARALLEL_MIN), sig)
