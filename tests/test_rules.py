"""The algebra and shape-op rule library: every rule checked on random instances, unsound rules
rejected with a counterexample, and the rules at work inside the optimizer and torch.compile."""
from __future__ import annotations

import pytest
import sympy
import torch

import rewrite
from rewrite.config import CompilerConfig
from rewrite.dsl import aten as P
from rewrite.dsl import is_float, rule, same_dtype, variables
from rewrite.ir import Graph, TensorMeta
from rewrite.optimizer import optimize
from rewrite.report import GraphReport
from rewrite.rules import algebra, default_rulesets, shape_ops
from rewrite.testing import assert_equivalent, check_rule
from rewrite.unit import CompileUnit

aten = torch.ops.aten
ALL_RULES = [r for rs in default_rulesets() for r in rs.rules]
x, y, c = variables("x y c")


def test_library_has_the_rule_families_with_unique_names():
    own = [r for rs in algebra.RULESETS + shape_ops.RULESETS for r in rs.rules]
    assert len(own) >= 40
    names = [r.name for r in ALL_RULES]
    assert len(names) == len(set(names)), "rule names must be unique across the library"
    scheduled = {rs.name for rs in default_rulesets()}
    assert {rs.name for rs in algebra.RULESETS + shape_ops.RULESETS} <= scheduled


@pytest.mark.parametrize("lib_rule", ALL_RULES, ids=[r.name for r in ALL_RULES])
def test_every_library_rule_is_sound(lib_rule):
    report = check_rule(lib_rule, examples=40)
    assert report.ok and report.valid >= 4


# Rules that look right and are not. Each must be rejected with a printed counterexample.
UNSOUND = [
    rule(P.mul.Tensor(x, 0.0), P.zeros_like.default(x), when=[is_float(x)], name="mul_zero_float"),
    rule(P.add.Tensor(x, 0), x, when=[is_float(x)], name="add_zero_float"),
    rule(P.pow.Tensor_Scalar(x, 0.5), P.sqrt.default(x), when=[is_float(x)], name="pow_half_is_sqrt"),
    rule(P.abs.default(P.relu.default(x)), P.relu.default(x), when=[is_float(x)], name="abs_relu"),
    rule(P.neg.default(P.sub.Tensor(x, y)), P.sub.Tensor(y, x), when=[is_float(x), same_dtype(x, y)], name="neg_sub_float"),
    rule(P.sqrt.default(P.mul.Tensor(x, x)), P.abs.default(x), when=[is_float(x)], name="sqrt_square"),
    rule(P.exp.default(P.log.default(x)), x, when=[is_float(x)], name="exp_log"),
    rule(P.reciprocal.default(P.reciprocal.default(x)), x, when=[is_float(x)], name="reciprocal_twice"),
    rule(P.sub.Tensor(x, x), P.zeros_like.default(x), when=[is_float(x)], name="sub_self_float"),
    rule(P.rsqrt.default(x), P.reciprocal.default(P.sqrt.default(x)), when=[is_float(x)], name="rsqrt_split"),
    rule(P.reciprocal.default(P.rsqrt.default(x)), P.sqrt.default(x), when=[is_float(x)], name="reciprocal_rsqrt"),
]


@pytest.mark.parametrize("bad_rule", UNSOUND, ids=[r.name for r in UNSOUND])
def test_unsound_rule_is_rejected_with_a_counterexample(bad_rule, capsys):
    with pytest.raises(AssertionError) as err:
        check_rule(bad_rule, examples=200)
    message = str(err.value)
    assert "is unsound" in message and "counterexample" in message and "x = " in message
    assert "counterexample" in capsys.readouterr().out  # printed, not only raised


def test_mul_zero_float_counterexample_is_a_special_value():
    with pytest.raises(AssertionError) as err:
        check_rule(UNSOUND[0], examples=200)
    # The shrunk counterexample is one of the values that make x*0 differ from 0: NaN, inf or -0.0.
    assert any(s in str(err.value) for s in ("nan", "inf", "-0.0"))


# -- the rules at work in the optimizer --------------------------------------------------------------

def _graph(shape=(2, 3, 4), dtype=torch.float32, n_inputs=1):
    g = Graph("t")
    meta = TensorMeta(dtype, tuple(sympy.Integer(s) for s in shape))
    return g, [g.placeholder(f"x{i}", meta) for i in range(n_inputs)]


def _call(g, target, *args, **kwargs):
    from rewrite.testing import infer_meta

    return g.call(target, args, kwargs, meta=infer_meta(target, args, kwargs))


def _optimized(g):
    report = GraphReport("t")
    return optimize(g, CompileUnit.detached(g.name, CompilerConfig(), report)), report


def test_identities_disappear_and_values_match():
    g, (a,) = _graph()
    t = _call(g, aten.mul.Tensor, a, 1)
    t = _call(g, aten.add.Tensor, t, -0.0)
    t = _call(g, aten.neg.default, _call(g, aten.neg.default, t))
    t = _call(g, aten.div.Tensor, t, 1.0)
    out = _call(g, aten.relu.default, t)
    g.set_output((out,))
    after, report = _optimized(g)
    assert after.op_counts() == {"aten.relu.default": 1}
    assert report.applied.get("mul_one") and report.applied.get("neg_neg")
    assert_equivalent(g, after, exact=True)


def test_float_add_zero_is_kept_but_integer_add_zero_goes():
    g, (a,) = _graph()
    g.set_output((_call(g, aten.relu.default, _call(g, aten.add.Tensor, a, 0)),))
    after, _ = _optimized(g)
    assert "aten.add.Tensor" in after.op_counts()  # -0.0 + 0 is +0.0: not an identity for floats
    assert_equivalent(g, after, exact=True)

    g, (a,) = _graph(dtype=torch.int32)
    g.set_output((_call(g, aten.relu.default, _call(g, aten.add.Tensor, a, 0)),))
    after, _ = _optimized(g)
    assert after.op_counts() == {"aten.relu.default": 1}
    assert_equivalent(g, after, exact=True)


def test_attention_permutes_and_view_chains_collapse():
    g, (a,) = _graph(shape=(2, 4, 3, 5))
    p = _call(g, aten.permute.default, _call(g, aten.permute.default, a, [0, 2, 1, 3]), [0, 2, 1, 3])
    v = _call(g, aten.view.default, _call(g, aten.view.default, p, [8, 15]), [2, 4, 3, 5])
    e = _call(g, aten.expand.default, v, [2, 4, 3, 5])
    s = _call(g, aten.squeeze.dim, _call(g, aten.unsqueeze.default, e, 1), 1)
    out = _call(g, aten.tanh.default, _call(g, aten.cat.default, [s], 0))
    g.set_output((out,))
    after, _ = _optimized(g)
    assert after.op_counts() == {"aten.tanh.default": 1}
    assert_equivalent(g, after, exact=True)


def test_cast_round_trip_through_a_wider_dtype_becomes_one_copy():
    g, (a,) = _graph(dtype=torch.float16)
    up = _call(g, aten._to_copy.default, a, dtype=torch.float32)
    down = _call(g, aten._to_copy.default, up, dtype=torch.float16)
    g.set_output((_call(g, aten.sin.default, down),))
    after, _ = _optimized(g)
    assert "aten._to_copy.default" not in after.op_counts()
    assert_equivalent(g, after, exact=True)


def test_an_output_that_became_the_input_is_returned_as_a_fresh_tensor():
    g, (a,) = _graph()
    g.set_output((_call(g, aten.mul.Tensor, a, 1), _call(g, aten.alias.default, a)))
    after, report = _optimized(g)
    assert report.applied.get("fresh_outputs") == 1
    out_fresh, out_alias = after.outputs
    assert out_fresh.op == "aten.clone.default"  # x*1 -> x, but the caller still gets its own tensor
    assert out_alias.kind == "placeholder"  # an alias before stays an alias
    assert_equivalent(g, after, exact=True, check_aliasing=True)


def test_sizes_returned_twice_after_cse_stay_numbers():
    """A training forward returns sizes for its backward (aten.sym_size.int of two tensors whose dims are one
    symbol). Once CSE made them one node, the two positions share a number, never a clone (issue 51: aten.clone
    of an int failed at run time)."""
    from rewrite.ir import SymbolInfo, SymMeta
    from rewrite.passes.boundary import keep_outputs_fresh

    s0 = sympy.Symbol("s0", positive=True, integer=True)
    before = Graph("t")
    a = before.placeholder("a", TensorMeta(torch.float32, (s0, sympy.Integer(4))))
    before.symbols[s0] = SymbolInfo(0, 0)
    r = before.call(aten.relu.default, (a,), meta=a.meta)
    sizes = [before.call(aten.sym_size.int, (t, 0), meta=SymMeta(s0, int)) for t in (a, r)]
    before.set_output((r, *sizes))
    after = before.copy()
    after.set_output((after.outputs[0], after.outputs[1], after.outputs[1]))  # what CSE does to the two sizes
    assert keep_outputs_fresh(before, after) == 0
    assert [n.op for n in after.outputs[1:]] == ["aten.sym_size.int"] * 2


def test_compiled_identity_does_not_alias_or_see_a_later_input_mutation():
    def f(t):
        y = t * 1
        t.add_(1)  # mutates the input after y was computed
        return y, torch.maximum(t.unsqueeze(0), t.unsqueeze(0))

    compiled = torch.compile(f, backend=rewrite.get_backend())
    a, b = torch.zeros(3), torch.zeros(3)
    with torch.no_grad():
        got, want = compiled(a), f(b)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(a, b)
    got[0].add_(7)
    got[1].add_(7)
    torch.testing.assert_close(a, b)  # writing to the results leaves the input alone


def test_rules_fire_inside_torch_compile_and_match_eager():
    def f(q, k):
        q = q.permute(0, 2, 1, 3).permute(0, 2, 1, 3)
        s = (q * 1.0) @ k.transpose(-1, -2).transpose(-1, -2).transpose(-1, -2)
        return (-(-s)).reshape(2, 4, 3, 3).reshape(2, 12, 3).float()

    backend = rewrite.get_backend()
    q, k = torch.randn(2, 4, 3, 5), torch.randn(2, 4, 3, 5)
    with torch.no_grad():
        got = torch.compile(f, backend=backend)(q, k)
    torch.testing.assert_close(got, f(q, k))
    applied = backend.report.applied()
    fired = {name for name in applied if any(name == r.name for r in ALL_RULES)}
    assert fired, f"no library rule fired; applied: {applied}"
    assert backend.report.ops_after < backend.report.ops_before

