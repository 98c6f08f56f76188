"""The rule DSL: a rewrite rule is one declaration, pattern on the left, replacement on the right.

Example (a rule file reads like a table)::

    from rewrite.dsl import aten, rule, RuleSet, variables, is_integer, shape_is, value_is

    x, c, s = variables("x c s")
    RULES = RuleSet("algebra.identity", [
        rule(aten.neg.default(aten.neg.default(x)), x, name="neg_neg"),
        rule(aten.mul.Tensor(x, c), x, when=[value_is(c, 1)], name="mul_one"),
        rule(aten.add.Tensor(x, 0), x, when=[is_integer(x)], name="add_zero_int"),
        rule(aten.reshape.default(x, s), x, when=[shape_is(x, s)], name="reshape_noop"),
        rule(aten.t.default(aten.t.default(x)), x, name="t_t"),
    ])

(``x + 0 -> x`` is declared for integers only: for a float ``x = -0.0``, ``-0.0 + 0`` is ``0.0``.
Every replacement must also keep the matched expression's dtype and shape, see Rules below.)

Public API (stable; the rule library and ``rewrite.testing`` are written against it)
----------------------------------------------------------------------------------
Patterns
    ``Var(name)`` / ``variables("x y z")``
        A pattern variable. It matches any argument: a tensor-valued node, a size (SymInt), a
        scalar, a list. The same name used twice must bind the same value (the same e-class).
    ``var(name, dtype=..., rank=...)`` / ``variables("x w", dtype=FLOATS, rank=2)``
        A typed variable: every rule using it gets ``dtype_is`` / ``rank_is`` conditions for it
        (first among its conditions), so a family of rules states its operand types once.
    Commutative ops (``rewrite.ops.COMMUTATIVE``: add, mul, maximum, ...) match both operand
        orders: ``rule(aten.mul.Tensor(x, c), x, ...)`` also rewrites ``c * x`` (``Rule.orders``;
        ``rule(..., commute=False)`` keeps the written order).
    ``aten.<op>.<overload>(*args, **kwargs)``, ``op(target)(*args, **kwargs)``
        An ``OpPattern`` for a call of that target. ATen calls are stored in canonical form: every
        schema argument is present, missing ones filled with their schema default. So a pattern
        means exactly the call as written (``aten.sum.dim_IntList(x, [1])`` means keepdim=False),
        and ``pattern.args``/``pattern.kwargs`` are what you would pass to the op.
        ``op(operator.mul)(a, b)`` matches size arithmetic; ``op(operator.getitem)(t, 0)`` the first
        output of a multi-output op.
    Python values (``1``, ``0.0``, ``True``, ``None``, ``torch.float32``, ``[0, 1]``) are literals
        (``Lit``). Literals are typed: ``1`` does not match ``1.0`` and ``0.0`` does not match
        ``-0.0``, because type promotion and signed zeros make them different values.

Conditions (the ``when=[...]`` list; all must hold)
    ``is_float(x)``, ``is_integer(x)`` (integer dtypes, not bool), ``is_bool(x)``,
    ``dtype_is(x, *dtypes)`` (listed as ``tensor(x)`` when it names every dtype: ``x`` is a
    tensor, not a Python scalar in a Tensor position), ``same_dtype(x, y)``, ``same_shape(x, y)``,
    ``shape_is(x, s)`` (the shape of tensor ``x`` equals the size list ``s``: a variable bound to
    a list argument, or a literal list), ``dims_agree(x, i, y, j)`` (dim i of x has the size of
    dim j of y; what GEMM rules state, and what lets `check_rule` draw operands that fit),
    ``rank_is(x, n)``, ``value_is(c, v)`` (``c`` is a
    compile-time constant tensor or scalar whose elements all equal ``v``; typed like literals
    only in that NaN never equals anything and -0.0 is distinct from 0.0).
    Every condition can be checked in two places: inside the e-graph (each e-class has a meta;
    its dtype, rank and canonical sympy shape string are analyses the rule's query reads) and in
    Python on concrete values with
    ``cond.holds(binding)``; ``binding`` maps variable names to tensors, Python values, or
    ``TensorMeta``/``SymMeta`` (for metas, ``value_is`` cannot hold).

Rules
    ``rule(lhs, rhs, when=(), name=None)`` returns a ``Rule``. ``rhs`` is a pattern built from
    ``lhs``'s variables and literals, or a Python callable ``rhs(**binding) -> value`` (a
    *computed* replacement, e.g. folding). Pattern rules run inside the e-graph; computed rules
    are applied by the Python matcher on the IR between saturation rounds: ``rhs`` receives each
    variable's value (a constant's tensor, a literal, or the ``TensorMeta``/``SymMeta`` of any
    other node) and returns None (no rewrite), a tensor or number (becomes a constant), or a
    pattern built from the rule's ``Var`` objects (not from the values it received).
    Soundness guard applied by the engine to every rule: a replacement is only accepted where its
    dtype and shape equal those of the matched expression, so broadcasting or type promotion can
    never silently change a result (``Rule``'s repr and ``python -m rewrite rules`` print it as
    ``keeps dtype+shape``, after the rule's own conditions: ``squeeze.dim(x, d) -> x`` is sound
    only through it). Replacements inherit the stream of the matched node, and all op nodes of a
    pattern must be on the same stream.
    ``rule(..., exact=False)`` declares a replacement that computes the same real-number function
    but may round differently (a fused kernel, a scale folded into a weight, a wider GEMM):
    `rewrite.testing.check_rule` then compares both sides within the dtype's tolerance instead of
    bit for bit, on instances in the rule's domain (`in_domain`: finite values, none so large that
    a sum may overflow on one side only). Every rule is exact unless it says so.
    ``Rule`` exposes: ``name``, ``lhs``, ``rhs``, ``when``, ``exact``, ``variables`` (names in ``lhs``),
    ``var_types()`` (name -> torch's schema type string of the first position the variable
    takes in ``lhs``: ``"Tensor"``, ``"List[int]"``, ``"List[SymInt]"``, ``"Scalar"``,
    ``"Optional[List[int]]"``...), ``is_computed``,
    ``conditions_hold(binding)``, ``match(tree)`` (``tree`` built from ``Call(target, args)``
    records and values; returns the binding or None), and ``apply(binding)`` which evaluates the
    replacement on concrete values (``evaluate(pattern, binding)`` does that for any pattern).

Multi-pattern rules
    ``siblings(p1, p2, ...)`` on the left side matches values that all exist in the graph at once
    (sharing the variables they share): ``siblings(aten.mm.default(x, w0), aten.mm.default(x, w1))``
    is two GEMMs reading the same ``x``. The right side is a ``siblings(r1, r2, ...)`` of the same
    arity: member i is replaced by ri. The engine guards such rules so they cannot explode: every
    member must be an original node of the graph (terms rules created are never members, so a
    merged GEMM is not merged again) and members are taken in graph order (each set matches once).
    As a value (`evaluate`, `check_rule`), ``siblings(...)`` is its members flattened and
    concatenated into one tensor, so a multi-pattern rule is checked like any other.

Rulesets
    ``RuleSet(name, rules, iterations=8, description="")``: a named group run together, at most
    ``iterations`` times per saturation round. Rulesets are scheduled in list order
    (``rewrite.rules.default_rulesets()``), and users add their own through
    ``CompilerConfig().rules.extra = [RuleSet(...)]``.

Where things are
    `rewrite.dsl.patterns` (variables, literals, op calls, ``siblings``, `same_value`),
    `rewrite.dsl.conditions` (one class per condition, and their constructors),
    `rewrite.dsl.rulesets` (`Rule`, `rule`, `RuleSet`, operand orders), `rewrite.dsl.evaluation`
    (`evaluate` and `match` on concrete values). The DSL writes no egglog: a rule reaches the e-graph
    engine as plain data (`Rule.data`, each condition's ``data()``), and `rewrite.egraph.encode`
    writes the egglog text.
"""
from __future__ import annotations

from ..ops import (ALL_DTYPES, COMMUTATIVE, FLOATS, INTS, NO_DEFAULT, OpError, canonical_call, dtype_str, is_pointwise,
                   register_target, schema_default, schema_types, shape_key, splat_key, target_from_name, target_name)
from .conditions import (Condition, DimIs, DimsAgree, DtypeIn, IsConst, IsScalar, MadeBy, OnDevice, RankIs, SameDtype,
                         SameShape, ShapeIs, Uniform, ValueIs, dim_is, dims_agree, dtype_is, is_bool, is_const,
                         is_float, is_integer, is_scalar, is_uniform, made_by, on_device, rank_is, same_dtype,
                         same_shape, shape_is, value_is)
from .evaluation import Call, evaluate, match
from .patterns import (SIBLINGS, Lit, OpPattern, Pattern, RuleError, Var, aten, members, op, prims, same_value,
                       siblings, var, variables)
from .rulesets import Rule, RuleSet, in_domain, operand_orders, rule

__all__ = [
    "Pattern", "Var", "Lit", "OpPattern", "var", "variables", "op", "aten", "prims",
    "Condition", "is_float", "is_integer", "is_bool", "dtype_is", "same_dtype", "same_shape",
    "shape_is", "rank_is", "value_is", "is_uniform", "is_const", "is_scalar", "made_by", "on_device", "dims_agree", "dim_is", "siblings", "SIBLINGS",
    "Rule", "RuleSet", "rule", "in_domain", "evaluate", "canonical_call", "target_name", "target_from_name",
    "RuleError", "match", "Call", "shape_key", "splat_key", "dtype_str", "same_value",
]
