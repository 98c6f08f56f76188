"""Algebraic identities over elementwise ATen ops, each sound for the dtypes its conditions admit.

Read a rule as ``left -> right when conditions``. Every rule here is checked by
``rewrite.testing.check_rule`` on random instances seasoned with NaN, +-inf, -0.0 and extreme
integers (tests/test_rules.py). What makes the difference between a sound and an almost-sound rule:

* signed zeros: ``x + 0.0`` turns -0.0 into +0.0, so ``x + 0 -> x`` holds only for integers;
  for floats the additive identity is -0.0 (``x + -0.0 -> x``), and ``x - 0 -> x`` holds for both.
* NaN and inf: ``x * 0 -> 0`` is wrong for floats (NaN*0, inf*0 are NaN; -1*0 is -0.0), so
  it is admitted for integers only. ``x - x -> 0`` is never admitted for floats (inf - inf).
* integer overflow: identities that only move a wrap-around (``-(-x)``, ``(-x)*(-y)``) are
  fine; ``relu(abs(x)) -> abs(x)`` is not for integers (abs(INT_MIN) is negative), so floats only.
* type promotion and broadcasting: ``bool * 1`` is int64 and ``int + 0.0`` is float; besides the
  dtype conditions written here, the engine refuses any replacement whose dtype or shape differs
  from the matched expression's.

Rules deliberately left out (each fails check_rule): ``sqrt(x)*sqrt(x) -> x`` and
``reciprocal(reciprocal(x)) -> x`` (rounding), ``pow(x, 0.5) -> sqrt(x)`` (pow(-0.0, 0.5) is
+0.0, sqrt(-0.0) is -0.0; pow(-inf, 0.5) is inf), ``exp(log(x)) -> x`` (domain),
``abs(relu(x)) -> relu(x)`` (relu(-0.0) is -0.0), ``-(x - y) -> y - x`` for floats (x == y gives
-0.0 against +0.0), reassociation of float sums, ``(x + 0.0) + c -> x + c`` for every c (c = -0.0
keeps x = -0.0 negative on the right only), ``(x + 0.0) + 0.0 -> x`` (the -0.0 case again).
"""
from __future__ import annotations

import torch

from ..dsl import (RuleSet, aten, dtype_is, is_bool, is_float, is_integer, is_uniform, rule, same_dtype, value_is,
                   variables)
from ..ops import ALL_DTYPES, FLOATS, INTS, SIGNED_INTS

__all__ = ["IDENTITIES", "IDENTITY_CHAINS", "NEGATION", "IDEMPOTENCE", "COMMUTATIVITY", "RULESETS"]

x, y, c, m, z = variables("x y c m z")

NUMBERS = FLOATS + INTS


def numeric(v):
    return dtype_is(v, *NUMBERS)


def signed(v):
    """Floats and signed integers: neg of a uint8 wraps (-64 is 192), so abs(-x) != abs(x) there."""
    return dtype_is(v, *FLOATS, *SIGNED_INTS)


def tensor(v):
    """``v`` is a tensor (of any dtype), not a Python scalar in a Tensor position."""
    return dtype_is(v, *ALL_DTYPES)


# Identity and absorbing elements: ``c`` is a literal scalar or a constant tensor (value_is). Each
# rule also matches its mirror (``c * x``, ``c + x``): add and mul commute (`rewrite.dsl.Rule.orders`).
IDENTITIES = RuleSet("algebra.identities", [
    rule(aten.mul.Tensor(x, c),         x,                       when=[numeric(x), value_is(c, 1)],     name="mul_one"),
    rule(aten.div.Tensor(x, c),         x,                       when=[is_float(x), value_is(c, 1)],    name="div_one"),
    rule(aten.add.Tensor(x, c),         x,                       when=[is_integer(x), value_is(c, 0)],  name="add_zero_int"),
    rule(aten.add.Tensor(x, c),         x,                       when=[is_float(x), value_is(c, -0.0)], name="add_neg_zero_float"),
    rule(aten.sub.Tensor(x, c),         x,                       when=[numeric(x), value_is(c, 0)],     name="sub_zero"),
    rule(aten.mul.Tensor(x, c),         aten.neg.default(x),     when=[signed(x), value_is(c, -1)], name="mul_minus_one"),
    rule(aten.div.Tensor(x, c),         aten.neg.default(x),     when=[is_float(x), value_is(c, -1)],   name="div_minus_one"),
    rule(aten.mul.Tensor(x, c),         aten.zeros_like.default(x), when=[is_integer(x), value_is(c, 0)], name="mul_zero_int"),
    rule(aten.pow.Tensor_Scalar(x, c),  x,                       when=[numeric(x), value_is(c, 1)],     name="pow_one"),
    rule(aten.pow.Tensor_Scalar(x, c),  aten.mul.Tensor(x, x),   when=[numeric(x), value_is(c, 2)],     name="pow_two"),
    rule(aten.pow.Tensor_Scalar(x, c),  aten.ones_like.default(x), when=[numeric(x), value_is(c, 0)],   name="pow_zero"),
    rule(aten.pow.Tensor_Scalar(x, c),  aten.reciprocal.default(x), when=[is_float(x), value_is(c, -1)], name="pow_minus_one"),
], description="x*1, x+0 (integers) / x+(-0.0) (floats), x-0, x/1, x*-1, x**k for k in {0,1,2,-1}")

# A float ``x + 0.0`` cannot be dropped (it turns -0.0 into +0.0), but it is exact otherwise, so
# the next add absorbs it: (x + 0.0) + c equals x + c unless c is -0.0 (then x + c keeps x = -0.0
# as -0.0). A chain of +0.0 thus ends as one x + 0.0 (the c = 0.0 case).
IDENTITY_CHAINS = RuleSet("algebra.identity_chains", [
    rule(aten.add.Tensor(aten.add.Tensor(x, z), c), aten.add.Tensor(x, c),
         when=[is_float(x), value_is(z, 0.0), is_uniform(c, not_in=[-0.0])], name="add_zero_then_add"),
], description="(x + 0.0) + c -> x + c (c a number, not -0.0): a chain of +0.0 ends as one x + 0.0")

# Negations cancel or move into a cheaper op. All exact in IEEE arithmetic and in wrap-around
# integer arithmetic, but only when both operands have one dtype: with int8 y and float x,
# -y wraps (-(-128) is -128) before x - y would promote it.
NEGATION = RuleSet("algebra.negation", [
    rule(aten.neg.default(aten.neg.default(x)),                 x,                           when=[numeric(x)], name="neg_neg"),
    rule(aten.sub.Tensor(x, aten.neg.default(y)),               aten.add.Tensor(x, y),       when=[signed(x), same_dtype(x, y)], name="sub_neg"),
    rule(aten.add.Tensor(x, aten.neg.default(y)),               aten.sub.Tensor(x, y),       when=[signed(x), same_dtype(x, y)], name="add_neg"),
    rule(aten.mul.Tensor(aten.neg.default(x), aten.neg.default(y)), aten.mul.Tensor(x, y),   when=[signed(x), same_dtype(x, y)], name="neg_mul_neg"),
    rule(aten.div.Tensor(aten.neg.default(x), aten.neg.default(y)), aten.div.Tensor(x, y),   when=[is_float(x), same_dtype(x, y)], name="neg_div_neg"),
    rule(aten.abs.default(aten.neg.default(x)),                 aten.abs.default(x),         when=[signed(x)], name="abs_neg"),
    rule(aten.neg.default(aten.sub.Tensor(x, y)),               aten.sub.Tensor(y, x),       when=[is_integer(x), same_dtype(x, y)], name="neg_sub_int"),
    rule(aten.bitwise_not.default(aten.bitwise_not.default(x)), x,                           when=[dtype_is(x, *INTS, torch.bool)], name="not_not"),
    rule(aten.logical_not.default(aten.logical_not.default(x)), x,                           when=[is_bool(x)], name="logical_not_not"),
], description="double negation, negations absorbed by add/sub/mul/div/abs")

# Applying an idempotent op twice, or a binary op to the same value twice.
IDEMPOTENCE = RuleSet("algebra.idempotence", [
    rule(aten.abs.default(aten.abs.default(x)),         aten.abs.default(x),      when=[numeric(x)], name="abs_abs"),
    rule(aten.relu.default(aten.relu.default(x)),       aten.relu.default(x),     when=[numeric(x)], name="relu_relu"),
    rule(aten.relu.default(aten.abs.default(x)),        aten.abs.default(x),      when=[is_float(x)], name="relu_abs_float"),
    rule(aten.floor.default(aten.floor.default(x)),     aten.floor.default(x),    when=[is_float(x)], name="floor_floor"),
    rule(aten.ceil.default(aten.ceil.default(x)),       aten.ceil.default(x),     when=[is_float(x)], name="ceil_ceil"),
    rule(aten.trunc.default(aten.trunc.default(x)),     aten.trunc.default(x),    when=[is_float(x)], name="trunc_trunc"),
    rule(aten.floor.default(x),                         x,                        when=[is_integer(x)], name="floor_int"),
    rule(aten.maximum.default(x, x),                    x,                        when=[tensor(x)], name="max_self"),
    rule(aten.minimum.default(x, x),                    x,                        when=[tensor(x)], name="min_self"),
    rule(aten.where.self(c, x, x),                      x,                        when=[tensor(x), is_bool(c)], name="where_same"),
    rule(aten.logical_and.default(x, x),                x,                        when=[is_bool(x)], name="and_self"),
    rule(aten.logical_or.default(x, x),                 x,                        when=[is_bool(x)], name="or_self"),
    rule(aten.bitwise_and.Tensor(x, x),                 x,                        when=[dtype_is(x, *INTS, torch.bool)], name="bitand_self"),
    rule(aten.bitwise_or.Tensor(x, x),                  x,                        when=[dtype_is(x, *INTS, torch.bool)], name="bitor_self"),
    rule(aten.clone.default(aten.clone.default(x, memory_format=m)), aten.clone.default(x, memory_format=m), when=[tensor(x)], name="clone_clone"),
], description="f(f(x)) -> f(x) for idempotent f; max/min/where/and/or of a value with itself")

# Commutativity lets the e-graph see that x+y and y+x are one value (so CSE merges them). Run
# once per round: it doubles add/mul e-nodes, nothing more. Only for operands of one dtype:
# bfloat16[3] * float16[] rounds differently from float16[] * bfloat16[3] (check_rule found it).
COMMUTATIVITY = RuleSet("algebra.commutativity", [
    rule(aten.add.Tensor(x, y), aten.add.Tensor(y, x), when=[tensor(x), same_dtype(x, y)], name="add_commute"),
    rule(aten.mul.Tensor(x, y), aten.mul.Tensor(y, x), when=[tensor(x), same_dtype(x, y)], name="mul_commute"),
], description="x+y = y+x and x*y = y*x (exact in IEEE arithmetic)")

RULESETS = [IDENTITIES, IDENTITY_CHAINS, NEGATION, IDEMPOTENCE, COMMUTATIVITY]
