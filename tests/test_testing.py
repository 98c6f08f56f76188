"""rewrite.testing itself: the graph strategies, assert_equivalent and the rule checker must catch
what they claim to catch (and accept what is right)."""
from __future__ import annotations

import math
import sys
import textwrap

import pytest
import sympy
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewrite.dsl import aten as P
from rewrite.dsl import rule, shape_is, variables
from rewrite.ir import Graph, TensorMeta
from rewrite.testing import (
    assert_equivalent, check_rule, check_ruleset_module, fuzz_examples, graph_inputs, graphs, infer_meta,
    make_tensor, run_graph, special_values,
)

aten = torch.ops.aten
FAST = settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))


@FAST
@given(st.data())
def test_random_graphs_are_valid_and_their_metas_are_what_runs(data):
    g = data.draw(graphs())
    g.validate()
    assert g.num_ops() >= 1
    inputs = data.draw(graph_inputs(g))
    outputs, _ = run_graph(g, inputs)
    for node, value in zip(g.outputs, outputs):
        assert value.dtype == node.meta.dtype
        assert tuple(value.shape) == tuple(int(s) for s in node.meta.shape)


def test_graph_inputs_contain_the_special_values():
    seen = {"nan": False, "inf": False, "neg_zero": False, "int_min": False}

    @settings(max_examples=80, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def run(data):
        for t in data.draw(graph_inputs(_two_input_graph())):
            if t.dtype == torch.float32:
                seen["nan"] |= bool(t.isnan().any())
                seen["inf"] |= bool(t.isinf().any())
                seen["neg_zero"] |= bool(((t == 0) & torch.signbit(t)).any())
            else:
                seen["int_min"] |= bool((t == torch.iinfo(t.dtype).min).any())

    run()
    assert all(seen.values()), seen


def test_make_tensor_is_reproducible_and_special_values_cover_signed_zero():
    a = make_tensor((3, 4), torch.float32, seed=7, special_fraction=0.5)
    b = make_tensor((3, 4), torch.float32, seed=7, special_fraction=0.5)
    assert torch.equal(a.nan_to_num(), b.nan_to_num()) and torch.equal(a.isnan(), b.isnan())
    floats = special_values(torch.float16)
    assert any(v == 0 and math.copysign(1, v) < 0 for v in floats) and any(math.isnan(v) for v in floats)
    assert torch.iinfo(torch.int8).min in special_values(torch.int8)


def _two_input_graph():
    g = Graph("two")
    a = g.placeholder("a", TensorMeta(torch.float32, (sympy.Integer(3), sympy.Integer(4))))
    b = g.placeholder("b", TensorMeta(torch.int64, (sympy.Integer(3), sympy.Integer(4))))
    s = g.call(aten.add.Tensor, (a, b), meta=infer_meta(aten.add.Tensor, (a, b)))
    g.set_output((s,))
    return g


def _unary_graph(target, *extra):
    g = Graph("u")
    a = g.placeholder("a", TensorMeta(torch.float32, (sympy.Integer(5),)))
    out = g.call(target, (a, *extra), meta=infer_meta(target, (a, *extra)))
    g.set_output((out,))
    return g


def test_assert_equivalent_accepts_a_copy():
    g = _two_input_graph()
    assert_equivalent(g, g.copy(), exact=True)


def test_assert_equivalent_reports_the_difference_and_the_inputs():
    before, after = _unary_graph(aten.mul.Tensor, 2.0), _unary_graph(aten.add.Tensor, 2.0)
    with pytest.raises(AssertionError) as err:
        assert_equivalent(before, after, inputs=[torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])])
    msg = str(err.value)
    assert "output 0" in msg and "input 0" in msg and "--- before ---" in msg and "aten.add.Tensor" in msg


def test_assert_equivalent_finds_a_signed_zero_difference_only_when_exact():
    before, after = _unary_graph(aten.add.Tensor, 0.0), _unary_graph(aten.add.Tensor, -0.0)
    zeros = [torch.tensor([-0.0, 0.0, 1.0, 2.0, 3.0])]
    assert_equivalent(before, after, inputs=zeros)  # within tolerance: -0.0 == +0.0
    with pytest.raises(AssertionError, match="differ"):
        assert_equivalent(before, after, inputs=zeros, exact=True)


def test_assert_equivalent_draws_inputs_with_nan_when_none_are_given():
    # x*0 and zeros differ only on NaN/inf/-0.0 inputs: the random inputs must find one.
    before = _unary_graph(aten.mul.Tensor, 0.0)
    after = _unary_graph(aten.mul.Tensor, 0.0)
    assert_equivalent(before, after, exact=True)
    zeros = Graph("z")
    a = zeros.placeholder("a", TensorMeta(torch.float32, (sympy.Integer(5),)))
    out = zeros.call(aten.zeros_like.default, (a,), meta=a.meta)
    zeros.set_output((out,))
    with pytest.raises(AssertionError, match="not equivalent"):
        assert_equivalent(before, zeros, exact=True)


def test_assert_equivalent_catches_an_output_that_became_the_input():
    before = _unary_graph(aten.clone.default)
    after = Graph("u")
    a = after.placeholder("a", TensorMeta(torch.float32, (sympy.Integer(5),)))
    after.set_output((a,))
    with pytest.raises(AssertionError, match="shares memory with input 0"):
        assert_equivalent(before, after, check_aliasing=True)
    assert_equivalent(before, after, check_aliasing=False)


def test_assert_equivalent_compares_input_mutations():
    def mutating(value):
        g = Graph("m")
        a = g.placeholder("a", TensorMeta(torch.float32, (sympy.Integer(5),)))
        zeros = g.call(aten.zeros_like.default, (a,), meta=a.meta)
        filled = g.call(aten.full_like.default, (a, value), meta=a.meta)
        g.call(aten.copy_.default, (a, filled), meta=a.meta)
        g.set_output((zeros,))  # equal outputs: only the update of the input differs
        return g

    with pytest.raises(AssertionError, match="mutated by the graph"):
        assert_equivalent(mutating(1.0), mutating(2.0), inputs=[torch.zeros(5)])


def test_check_rule_accepts_a_sound_rule_and_counts_what_it_compared():
    x, s = variables("x s")
    report = check_rule(rule(P.view.default(x, s), x, when=[shape_is(x, s)], name="view_same"), examples=60)
    assert report.ok and report.valid >= 6 and "view_same: ok" in str(report)


def test_check_rule_refuses_a_rule_it_cannot_instantiate():
    x, s = variables("x s")
    # shape [7, 11, 13] is out of reach of the small random shapes: the check must say so, not pass.
    never = rule(P.view.default(x, [7, 11, 13]), x, when=[shape_is(x, [7, 11, 13])], name="never_matches")
    with pytest.raises(AssertionError, match="cannot instantiate"):
        check_rule(never, examples=30)


def test_check_rule_rejects_bad_arguments():
    with pytest.raises(TypeError, match="rewrite.dsl.Rule"):
        check_rule("x*1 -> x")


def test_check_ruleset_module_reports_sound_and_unsound_rules(tmp_path, monkeypatch):
    (tmp_path / "user_rules_for_test.py").write_text(textwrap.dedent("""
        from rewrite.dsl import RuleSet, aten, is_float, rule, variables
        x, = variables("x")
        MINE = RuleSet("mine", [
            rule(aten.neg.default(aten.neg.default(x)), x, when=[is_float(x)], name="neg_neg"),
            rule(aten.mul.Tensor(x, 0.0), aten.zeros_like.default(x), when=[is_float(x)], name="mul_zero"),
        ])
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    report = check_ruleset_module("user_rules_for_test", examples=50)
    assert not report.ok
    assert [r.rule for r in report.failures] == ["mul_zero"]
    text = str(report)
    assert "1 sound, 1 unsound" in text and "counterexample" in text
    sys.modules.pop("user_rules_for_test", None)


def test_check_ruleset_module_errors_name_the_problem(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="cannot import module 'no_such_rules_module'"):
        check_ruleset_module("no_such_rules_module")
    (tmp_path / "empty_rules_for_test.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="defines no rewrite.dsl.RuleSet"):
        check_ruleset_module("empty_rules_for_test")
    sys.modules.pop("empty_rules_for_test", None)


def test_fuzz_examples_reads_the_environment(monkeypatch):
    monkeypatch.delenv("REWRITE_FUZZ_EXAMPLES", raising=False)
    assert fuzz_examples(300) == 300
    monkeypatch.setenv("REWRITE_FUZZ_EXAMPLES", "5000")
    assert fuzz_examples(300) == 5000
    monkeypatch.setenv("REWRITE_FUZZ_EXAMPLES", "lots")
    with pytest.raises(ValueError, match="not an integer"):
        fuzz_examples(300)
    monkeypatch.setenv("REWRITE_FUZZ_EXAMPLES", "0")
    with pytest.raises(ValueError, match="positive"):
        fuzz_examples(300)


def test_graph_inputs_rejects_symbolic_shapes():
    g = Graph("sym")
    g.placeholder("a", TensorMeta(torch.float32, (sympy.Symbol("s0"),)))
    g.set_output(())
    with pytest.raises(ValueError, match="symbolic shape"):
        graph_inputs(g)


def test_check_rule_evaluates_computed_replacements():
    x, y = variables("x y")

    def fold_add(x, y):
        return torch.add(x, y)

    def wrong_fold(x, y):
        return torch.sub(x, y)

    assert check_rule(rule(P.add.Tensor(x, y), fold_add, name="fold_add"), examples=40).ok
    with pytest.raises(AssertionError, match="wrong_fold"):
        check_rule(rule(P.add.Tensor(x, y), wrong_fold, name="wrong_fold"), examples=40)
