"""The e-graph bridge: loading the IR into egglog, rules, limits, DAG-aware extraction, rebuilding."""
import operator

import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from rewrite.dsl import RuleSet, aten as A, rule, value_is, variables
from rewrite.egraph import Limits, compile_rulesets, run_egraph
from rewrite.exec.codegen import compile_graph_to_python
from rewrite.fx_bridge import from_fx
from rewrite.ir import Graph, SymMeta, TensorMeta
from rewrite.report import GraphReport
from rewrite.optimizer import library_runs
from rewrite.rules import default_rulesets

aten = torch.ops.aten
F32 = TensorMeta(torch.float32, (sympy.Integer(4), sympy.Integer(8)))
x_, y_, c_ = variables("x y c")


def aten_graph(fn, *inputs) -> Graph:
    """``fn`` traced to an ATen-level rewrite Graph (FakeTensor metas, like AOTAutograd gives)."""
    return from_fx(make_fx(fn, tracing_mode="fake")(*inputs), name="traced")


def run(graph: Graph, *inputs):
    return compile_graph_to_python(graph)(*inputs)


def egraph(graph: Graph, rulesets=None, limits=None):
    report = GraphReport(graph.name)
    out, _ = run_egraph(graph, library_runs() if rulesets is None else rulesets, limits or Limits(), report)
    return out, report


def chain_graph(layers: int) -> Graph:
    """A residual chain: h = relu(h) + h, ``layers`` times (every value read twice)."""
    g = Graph("residual")
    h = x = g.placeholder("x", F32)
    for _ in range(layers):
        r = g.call(aten.relu.default, (h,), meta=F32)
        h = g.call(aten.add.Tensor, (r, h), meta=F32)
    g.set_output((h, x))
    return g


def test_round_trip_keeps_args_kwargs_multi_output_and_placeholders():
    def fn(x, w):
        a = torch.nn.functional.layer_norm(x, (8,), w, None, 1e-5)   # multi-output op + getitem
        b = a.to(torch.float64).sum(dim=[1], keepdim=True)             # dtype kwarg, list arg
        c = torch.where(x > -0.0, x * 0.5, torch.full_like(x, float("-inf")))
        return b, c.transpose(0, 1).contiguous(), x.new_zeros(3, dtype=torch.int32)

    x, w = torch.randn(4, 8), torch.randn(8)
    g = aten_graph(fn, x, w)
    out, _ = egraph(g, rulesets=[])
    assert [p.name for p in out.placeholders] == [p.name for p in g.placeholders]
    assert out.op_counts() == g.op_counts()
    for got, want in zip(run(out, x, w), fn(x, w)):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)


def test_symbolic_sizes_round_trip():
    """SymInt inputs, sym_size and operator.mul on sizes survive load -> extract -> rebuild."""
    s0 = sympy.Symbol("s0", positive=True, integer=True)
    m = TensorMeta(torch.float32, (s0, sympy.Integer(8)))
    g = Graph("sym")
    x = g.placeholder("x", m)
    n = g.call(aten.sym_size.int, (x, 0), meta=SymMeta(s0, int))
    n2 = g.call(operator.mul, (n, 8), meta=SymMeta(s0 * 8, int))
    v = g.call(aten.view.default, (x, [n2]), meta=TensorMeta(torch.float32, (s0 * 8,)))
    g.set_output((v,))
    out, _ = egraph(g)
    assert out.op_counts() == g.op_counts()
    t = torch.randn(5, 8)
    torch.testing.assert_close(run(out, t)[0], t.reshape(40))


def test_cse_merges_equal_terms_and_keeps_shared_subgraph_once():
    g = Graph("cse")
    x = g.placeholder("x", F32)
    a = g.call(aten.relu.default, (x,), meta=F32)
    b = g.call(aten.relu.default, (x,), meta=F32)     # same term as a
    s = g.call(aten.add.Tensor, (a, b), meta=F32)     # reads the shared class twice
    m = g.call(aten.mul.Tensor, (s, a), meta=F32)
    g.set_output((m,))
    out, report = egraph(g, rulesets=[])
    assert out.op_counts() == {"aten.add.Tensor": 1, "aten.mul.Tensor": 1, "aten.relu.default": 1}
    assert report.applied["cse"] == 1
    t = torch.randn(4, 8)
    torch.testing.assert_close(run(out, t)[0], (t.relu() + t.relu()) * t.relu())


def test_residual_chain_of_100_layers_extracts_without_recursion_or_overflow():
    g = chain_graph(100)
    neg = RuleSet("test.negneg", [rule(A.neg.default(A.neg.default(x_)), x_, name="neg_neg")])
    out, _ = egraph(g, rulesets=[neg])
    assert out.num_ops() == 200
    t = torch.randn(4, 8)
    want = t
    for _ in range(100):
        want = want.relu() + want
    torch.testing.assert_close(run(out, t)[0], want)


def test_long_chain_rebuilds_without_recursion():
    g = Graph("long")
    h = g.placeholder("x", F32)
    for _ in range(3000):
        h = g.call(aten.neg.default, (h,), meta=F32)
    g.set_output((h,))
    out, report = egraph(g)
    # 3000 negations cancel pairwise down to the input itself
    assert out.num_ops() == 0
    assert report.applied.get("neg_neg", 0) >= 1
    t = torch.randn(4, 8)
    torch.testing.assert_close(run(out, t)[0], t)


def test_rules_fire_and_meta_guard_rejects_shape_changing_replacement():
    g = Graph("guard")
    x = g.placeholder("x", F32)
    row = g.placeholder("row", TensorMeta(torch.float32, (sympy.Integer(1), sympy.Integer(8))))
    ones = g.constant(torch.ones(4, 8))
    bcast = g.call(aten.mul.Tensor, (row, ones), meta=F32)   # shape [1,8] -> [4,8]: not "row"
    same = g.call(aten.mul.Tensor, (x, ones), meta=F32)      # really x
    g.set_output((bcast, same))
    mul_one = RuleSet("test.mul_one", [rule(A.mul.Tensor(x_, c_), x_, when=[value_is(c_, 1)], name="mul_one")])
    out, report = egraph(g, rulesets=[mul_one])
    assert out.op_counts() == {"aten.mul.Tensor": 1}
    assert report.applied["mul_one"] >= 1  # matches (a merge can re-match the same root)
    tx, tr = torch.randn(4, 8), torch.randn(1, 8)
    got = run(out, tx, tr)
    torch.testing.assert_close(got[0], tr * torch.ones(4, 8))
    torch.testing.assert_close(got[1], tx)


def test_new_terms_get_metas_and_are_accepted():
    """An op replacement (not a variable) needs the shape engine to infer its meta first."""
    g = aten_graph(lambda x, y: x + (-y), torch.randn(4, 8), torch.randn(4, 8))
    sub = RuleSet("test.add_neg", [rule(A.add.Tensor(x_, A.neg.default(y_)), A.sub.Tensor(x_, y_), name="add_neg")])
    out, report = egraph(g, rulesets=[sub])
    assert out.op_counts() == {"aten.sub.Tensor": 1}
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    torch.testing.assert_close(run(out, a, b), a - b)  # make_fx returns the tensor itself


def test_streams_are_part_of_identity():
    g = Graph("streams")
    x = g.placeholder("x", F32)
    a = g.call(aten.relu.default, (x,), meta=F32, attrs={"stream": "1"})
    b = g.call(aten.relu.default, (x,), meta=F32)                  # same op, default stream
    c = g.call(aten.relu.default, (x,), meta=F32, attrs={"stream": "1"})  # CSE'd with a
    n1 = g.call(aten.neg.default, (a,), meta=F32)                  # neg(neg(.)) across streams:
    n2 = g.call(aten.neg.default, (n1,), meta=F32, attrs={"stream": "1"})  # not one rule match
    g.set_output((a, b, c, n2))
    neg = RuleSet("test.negneg", [rule(A.neg.default(A.neg.default(x_)), x_, name="neg_neg")])
    out, _ = egraph(g, rulesets=[neg])
    relus = [n for n in out.nodes if n.op == "aten.relu.default"]
    assert sorted(str(n.attrs.get("stream")) for n in relus) == ["1", "None"]
    assert out.op_counts()["aten.neg.default"] == 2
    outs = out.outputs
    assert outs[0] is outs[2] and outs[0] is not outs[1]


def test_wait_for_nodes_are_kept_opaque_with_their_targets():
    g = Graph("wait")
    x = g.placeholder("x", F32)
    a = g.call(aten.relu.default, (x,), meta=F32)
    dup = g.call(aten.relu.default, (x,), meta=F32)
    w = g.call(aten.neg.default, (x,), meta=F32, attrs={"stream": "1"}, waits=[dup])
    w2 = g.call(aten.neg.default, (w,), meta=F32, attrs={"stream": "1"})
    g.set_output((a, w2))
    neg = RuleSet("test.negneg", [rule(A.neg.default(A.neg.default(x_)), x_, name="neg_neg")])
    out, _ = egraph(g, rulesets=[neg])
    waiting = [n for n in out.nodes if n.waits]
    assert len(waiting) == 1
    target = waiting[0].waits[0]
    assert target in out.nodes and target.op == "aten.relu.default"
    assert out.op_counts()["aten.neg.default"] == 2   # the waiting node is not rewritten away


def test_limits_degrade_to_best_so_far(caplog):
    g = chain_graph(30)
    commute = RuleSet("test.commute", [rule(A.add.Tensor(x_, y_), A.add.Tensor(y_, x_), name="add_commute")], iterations=50)
    for limits in (Limits(node_limit=50), Limits(time_limit_s=0.0), Limits(iteration_limit=1)):
        with caplog.at_level("WARNING", logger="rewrite"):
            out, report = egraph(g, rulesets=[commute], limits=limits)
        assert any("stopped by" in n for n in report.notes)
        t = torch.randn(4, 8)
        want = t
        for _ in range(30):
            want = want.relu() + want
        torch.testing.assert_close(run(out, t)[0], want)
    assert "stopped by" in caplog.text


def test_nondeterministic_and_mutating_ops_are_never_merged():
    g = Graph("rand")
    x = g.placeholder("x", F32)
    r1 = g.call(aten.rand.default, ([4, 8],), {"dtype": torch.float32, "device": torch.device("cpu"),
                                                 "pin_memory": False}, meta=F32)
    r2 = g.call(aten.rand.default, ([4, 8],), {"dtype": torch.float32, "device": torch.device("cpu"),
                                                 "pin_memory": False}, meta=F32)
    s = g.call(aten.add.Tensor, (r1, r2), meta=F32)
    cp = g.call(aten.copy_.default, (x, s), meta=F32)
    g.set_output((s,))
    out, _ = egraph(g)
    assert out.op_counts()["aten.rand.default"] == 2
    assert out.op_counts()["aten.copy_.default"] == 1   # a side effect with no reader survives
    assert out.nodes[-2].op == "aten.copy_.default"     # and stays after every read of x
    del cp


def test_rulesets_compile_to_two_stage_egglog_rules():
    text = "\n".join(compile_rulesets(default_rulesets()))
    assert text.count(":ruleset") >= 2 * 40
    assert "(union __root" in text and "(Pending __root" in text


def test_size_output_that_becomes_a_literal_stays_an_output_node():
    """A size computation equal to a literal (here s*1 -> s, s a constant 4) still returns a node."""
    import operator as op
    from rewrite.dsl import op as op_pattern

    g = Graph("sizes")
    x = g.placeholder("x", F32)
    four = g.constant(4)
    n = g.call(op.mul, (four, 1), meta=SymMeta(sympy.Integer(4), int))
    g.set_output((x, n))
    mul_one = RuleSet("test.size_mul_one", [rule(op_pattern(op.mul)(x_, 1), x_, name="size_mul_one")])
    out, report = egraph(g, rulesets=[mul_one])
    assert report.applied.get("size_mul_one", 0) >= 1
    assert out.num_ops() == 0
    assert out.outputs[1].kind == "constant" and out.outputs[1].value == 4


def test_cond_with_runtime_predicate_round_trips_with_its_branch_graphs():
    def branch(op, name):
        b = Graph(name)
        p = b.placeholder("arg", F32)
        b.set_output((b.call(op, (p,), meta=F32),))
        return b

    g = Graph("cond")
    x = g.placeholder("x", F32)
    pred = g.placeholder("p", TensorMeta(torch.bool, ()))
    c = g.call(torch.ops.higher_order.cond, (pred, branch(aten.sin.default, "t"), branch(aten.cos.default, "f"), (x,)),
               meta=(F32,))
    y = g.call(operator.getitem, (c, 0), meta=F32)
    z = g.call(operator.getitem, (c, 0), meta=F32)    # CSE'd with y
    g.set_output((g.call(aten.add.Tensor, (y, z), meta=F32),))
    out, report = egraph(g)
    assert report.applied["cse"] == 1
    assert out.op_counts()["higher_order.cond"] == 1 and out.op_counts()["getitem"] == 1
    t = torch.randn(4, 8)
    torch.testing.assert_close(run(out, t, torch.tensor(True))[0], t.sin() * 2)
    torch.testing.assert_close(run(out, t, torch.tensor(False))[0], t.cos() * 2)


def test_side_effect_inputs_are_computed_before_any_side_effect_writes():
    """Two mutated inputs: the second copy_'s input reads x, which the first copy_ overwrites."""
    g = Graph("two_mutations")
    x = g.placeholder("x", F32)
    z = g.placeholder("z", F32)
    t = g.call(aten.mul.Tensor, (x, 2), meta=F32)
    t2 = g.call(aten.mul.Tensor, (x, 2), meta=F32)        # CSE'd with t: the e-graph rebuilds
    x1 = g.call(aten.add.Tensor, (x, 1), meta=F32)
    z1 = g.call(aten.add.Tensor, (z, t), meta=F32)
    z2 = g.call(aten.add.Tensor, (z1, t2), meta=F32)
    g.call(aten.copy_.default, (x, x1), meta=F32)
    g.call(aten.copy_.default, (z, z2), meta=F32)
    g.set_output(())
    out, report = egraph(g, rulesets=[])
    assert report.applied["cse"] == 1
    copies = [i for i, n in enumerate(out.nodes) if n.op == "aten.copy_.default"]
    assert [out.nodes[i].args[0].name for i in copies] == ["x", "z"]
    assert all(n.kind != "call" or n.op == "aten.copy_.default" for n in out.nodes[copies[0]:])
    tx, tz = torch.arange(3.0), torch.zeros(3)
    run(out, tx, tz)
    torch.testing.assert_close(tx, torch.arange(3.0) + 1)
    torch.testing.assert_close(tz, torch.arange(3.0) * 4)


def test_compiled_function_mutating_two_inputs_matches_eager():
    import rewrite

    def fn(x, z):
        t = x * 2
        x.add_(1)
        z.add_(t)

    x, z = torch.arange(3.0), torch.zeros(3)
    torch.compile(fn, backend=rewrite.get_backend())(x, z)
    torch.testing.assert_close(x, torch.arange(3.0) + 1)
    torch.testing.assert_close(z, torch.arange(3.0) * 2)


def test_python_matcher_keeps_signed_zeros_and_types_apart():
    from rewrite.dsl import Lit
    from rewrite.passes.computed_rules import match_node

    assert not match_node(Lit(0.0), -0.0, {}, None)
    assert not match_node(Lit(1), 1.0, {}, None)
    assert match_node(Lit(-0.0), -0.0, {}, None)
    assert not match_node([x_, x_], [0.0, -0.0], {}, None)   # a repeated variable binds one value
    assert match_node([x_, x_], [0.5, 0.5], {}, None)


def test_engine_cache_never_runs_a_stale_engine():
    """The engine cache holds its rulesets, so an id is never reused while cached, and it notices
    a ruleset whose rules were replaced in place (same object, name and length)."""
    import gc

    from rewrite.egraph import engine_for

    def relu_graph():
        g = Graph("rr")
        x = g.placeholder("x", F32)
        r = g.call(aten.relu.default, (g.call(aten.relu.default, (x,), meta=F32),), meta=F32)
        g.set_output((r,))
        return g

    relu_relu = rule(A.relu.default(A.relu.default(x_)), A.relu.default(x_), name="relu_relu")
    rs = RuleSet("test.reuse", [rule(A.neg.default(A.neg.default(x_)), x_, name="neg_neg")])
    engine_for([rs])
    rs.rules[0] = relu_relu
    out, report = egraph(relu_graph(), rulesets=[rs])
    assert report.applied.get("relu_relu", 0) >= 1 and out.op_counts() == {"aten.relu.default": 1}

    first = RuleSet("test.reuse2", [rule(A.neg.default(A.neg.default(x_)), x_, name="neg_neg")])
    engine_for([first])
    old = id(first)
    del first
    gc.collect()
    candidates = [RuleSet("test.reuse2", [relu_relu]) for _ in range(50)]
    reused = [c for c in candidates if id(c) == old] or candidates[:1]
    out, report = egraph(relu_graph(), rulesets=reused[:1])
    assert report.applied.get("relu_relu", 0) >= 1


def test_rejected_replacements_are_not_counted_as_applied():
    i32 = TensorMeta(torch.int32, (sympy.Integer(4), sympy.Integer(8)))
    g = Graph("reject")
    x = g.placeholder("x", i32)
    zeros = g.constant(torch.zeros(2, 4, 8, dtype=torch.int32))
    m = g.call(aten.mul.Tensor, (x, zeros), meta=TensorMeta(torch.int32, (sympy.Integer(2),) + i32.shape))
    g.set_output((m,))
    from rewrite.dsl import is_integer
    rs = RuleSet("test.mul_zero", [rule(A.mul.Tensor(x_, c_), A.zeros_like.default(x_),
                                        when=[is_integer(x_), value_is(c_, 0)], name="mul_zero_int")])
    out, report = egraph(g, rulesets=[rs])
    assert "mul_zero_int" not in report.applied       # zeros_like(x) is [4, 8], not [2, 4, 8]
    assert out is g
    # an accepted replacement is counted
    g2 = Graph("accept")
    x = g2.placeholder("x", i32)
    g2.set_output((g2.call(aten.mul.Tensor, (x, g2.constant(torch.zeros(4, 8, dtype=torch.int32))), meta=i32),))
    out, report = egraph(g2, rulesets=[rs])
    assert report.applied.get("mul_zero_int", 0) >= 1
    assert out.op_counts() == {"aten.zeros_like.default": 1}


def test_unnamed_rule_names_are_stable_across_processes():
    import subprocess
    import sys

    code = ("from rewrite.dsl import aten, rule, variables; x, = variables('x'); "
            "print(rule(aten.neg.default(aten.neg.default(x)), x).name)")
    env = dict(__import__("os").environ, PYTHONHASHSEED="12345")
    other = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    here = rule(A.neg.default(A.neg.default(x_)), x_).name
    assert other.stdout.strip() == here and here.startswith("aten.neg.default#")


def test_rule_listing_shows_the_engine_guard():
    """Rules like squeeze.dim(x, d) -> x are sound only through the engine's meta guard: the
    listing (``python -m rewrite rules``) shows it with the rule's own conditions."""
    from rewrite.dsl import dtype_is
    from rewrite.rules.shape_ops import ALL

    r = rule(A.squeeze.dim(x_, y_), x_, when=[dtype_is(x_, *ALL)], name="squeeze_dim_not_one")
    assert repr(r) == "squeeze_dim_not_one: aten.squeeze.dim(x, y) -> x when tensor(x), keeps dtype+shape"
    r = rule(A.neg.default(A.neg.default(x_)), x_, name="neg_neg")
    assert repr(r) == "neg_neg: aten.neg.default(aten.neg.default(x)) -> x when keeps dtype+shape"
