"""The optimizer pipeline: folding, dedup, dead edges, user rulesets, and real models vs eager."""
import dataclasses

import pytest
import sympy
import torch

import rewrite
from rewrite import models
from rewrite.config import CompilerConfig, ConfigError
from rewrite.dsl import RuleSet, aten as A, is_float, rule, variables
from rewrite.exec.codegen import compile_graph_to_python
from rewrite.ir import Graph, TensorMeta
from rewrite.optimizer import optimize
from rewrite.report import GraphReport
from rewrite.optimizer import describe_schedule as describe_rulesets
from rewrite.passes import dedup_constants, eliminate_dead_edges
from rewrite.rules import default_rulesets
from rewrite.unit import CompileUnit

aten = torch.ops.aten
S = sympy.Integer


def meta(*shape, dtype=torch.float32):
    return TensorMeta(dtype, tuple(S(s) for s in shape))


def opt(graph, config=None):
    report = GraphReport(graph.name)
    return optimize(graph, CompileUnit.detached(graph.name, config or CompilerConfig(), report)), report


def run(graph, *inputs):
    return compile_graph_to_python(graph)(*inputs)


def test_folding_evaluates_constant_subgraphs_but_not_random_ops():
    g = Graph("fold")
    x = g.placeholder("x", meta(4))
    c = g.constant(torch.arange(4.0))
    e = g.call(aten.exp.default, (c,), meta=meta(4))
    s = g.call(aten.mul.Tensor, (e, 2.0), meta=meta(4))
    r = g.call(aten.rand.default, ([4],), {"dtype": torch.float32, "device": torch.device("cpu"),
                                           "pin_memory": False}, meta=meta(4))
    y = g.call(aten.add.Tensor, (x, s), meta=meta(4))
    z = g.call(aten.add.Tensor, (y, r), meta=meta(4))
    g.set_output((y, z))
    out, report = opt(g)
    assert report.applied["fold"] == 2
    assert "aten.exp.default" not in out.op_counts() and out.op_counts()["aten.rand.default"] == 1
    t = torch.randn(4)
    torch.testing.assert_close(run(out, t)[0], t + torch.arange(4.0).exp() * 2.0, rtol=0, atol=0)


def test_fold_size_limit_is_respected():
    g = Graph("big")
    c = g.constant(torch.ones(100, 100))
    e = g.call(aten.exp.default, (c,), meta=meta(100, 100))
    g.set_output((e,))
    config = CompilerConfig()
    config.rules.fold_size_limit = 1000
    out, report = opt(g, config)
    assert "fold" not in report.applied and out.op_counts() == {"aten.exp.default": 1}
    config.rules.fold_size_limit = 10_000
    out, report = opt(g, config)
    assert report.applied["fold"] == 1 and "aten.exp.default" not in out.op_counts()


def test_dedup_merges_constants_by_content_and_keeps_signed_zeros_apart():
    g = Graph("dedup")
    x = g.placeholder("x", meta(3))
    a = g.constant(torch.tensor([1.0, 2.0, 3.0]))
    b = g.constant(torch.tensor([1.0, 2.0, 3.0]))
    pz = g.constant(torch.tensor([0.0, 0.0, 0.0]))
    nz = g.constant(torch.tensor([-0.0, 0.0, 0.0]))
    outs = [g.call(aten.add.Tensor, (x, k), meta=meta(3)) for k in (a, b, pz, nz)]
    g.set_output(tuple(outs))
    assert dedup_constants(g) == 1
    assert sum(1 for n in g.nodes if n.kind == "constant") == 3


def test_dedup_compares_large_constants_by_all_their_bytes():
    """Large constants are grouped by their ends first: equal ends must not merge different middles,
    and a non-contiguous copy of a weight is still the same constant."""
    w = torch.randn(64, 64)
    middle = w.clone()
    middle[31, 7] += 1.0
    signed = w.clone()
    signed[20, 20] = -0.0
    w[20, 20] = 0.0
    g = Graph("dedup_large")
    x = g.placeholder("x", meta(64))
    consts = [g.constant(v) for v in (w, w.clone(), w.t().contiguous().t(), middle, signed)]
    outs = [g.call(aten.mv.default, (k, x), meta=meta(64)) for k in consts]
    g.set_output(tuple(outs))
    assert dedup_constants(g) == 2  # the clone and the transposed copy; the other two differ in one element
    kept = [n for n in g.nodes if n.kind == "constant"]
    assert len(kept) == 3 and kept[0] is consts[0]
    assert [o.args[0] for o in outs] == [consts[0], consts[0], consts[0], consts[3], consts[4]]


def _branch(op, name):
    b = Graph(name)
    p = b.placeholder("arg", meta(4))
    b.set_output((b.call(op, (p,), meta=meta(4)),))
    return b


def _cond_graph(pred_value):
    g = Graph("cond")
    x = g.placeholder("x", meta(4))
    pred = g.constant(torch.tensor(pred_value))
    c = g.call(torch.ops.higher_order.cond, (pred, _branch(aten.sin.default, "t"), _branch(aten.cos.default, "f"), (x,)),
               meta=(meta(4),))
    y = g.call(__import__("operator").getitem, (c, 0), meta=meta(4))
    g.set_output((y,))
    return g


@pytest.mark.parametrize("pred", [True, False])
def test_dead_edge_inlines_the_selected_branch(pred):
    g = _cond_graph(pred)
    t = torch.randn(4)
    out, report = opt(g)
    assert report.applied["dead_edge"] == 1
    assert out.op_counts() == {("aten.sin.default" if pred else "aten.cos.default"): 1}
    torch.testing.assert_close(run(out, t)[0], t.sin() if pred else t.cos())


def test_dead_edge_leaves_runtime_predicates_alone():
    g = Graph("cond")
    x = g.placeholder("x", meta(4))
    p = g.placeholder("p", meta(dtype=torch.bool))
    c = g.call(torch.ops.higher_order.cond, (p, _branch(aten.sin.default, "t"), _branch(aten.cos.default, "f"), (x,)),
               meta=(meta(4),))
    g.set_output((g.call(__import__("operator").getitem, (c, 0), meta=meta(4)),))
    assert eliminate_dead_edges(g) == 0


def test_user_rulesets_from_config_run_in_the_egraph():
    x, = variables("x")
    mine = RuleSet("user.exp_log", [rule(A.exp.default(A.log.default(x)), x, when=[is_float(x)], name="exp_log_demo")])
    g = Graph("user")
    p = g.placeholder("p", meta(4))
    g.set_output((g.call(aten.exp.default, (g.call(aten.log.default, (p,), meta=meta(4)),), meta=meta(4)),))
    config = CompilerConfig()
    config.rules.extra = [mine]
    out, report = opt(g, config)
    assert report.applied["exp_log_demo"] >= 1
    assert out.op_counts() == {"aten.clone.default": 1}  # the output would alias the input: kept fresh
    with pytest.raises(ConfigError, match=r"rules.extra\[0\].*expected a rewrite.dsl.RuleSet"):
        config.rules.extra = ["not a ruleset"]  # refused when set, before any compile


def test_computed_rules_run_on_the_ir():
    x, c = variables("x c")

    def scale_by_constant(x, c):  # receives values: c a constant tensor, x a TensorMeta
        # mul by a constant tensor of twos -> add x to itself, built from the rule's variables
        if isinstance(c, torch.Tensor) and bool((c == 2).all()):
            return A.add.Tensor(X, X)
        return None

    X = x
    mine = RuleSet("user.computed", [rule(A.mul.Tensor(x, c), scale_by_constant, name="mul_two_is_add")])
    g = Graph("computed")
    p = g.placeholder("p", meta(4))
    two = g.constant(torch.full((4,), 2.0))
    g.set_output((g.call(aten.mul.Tensor, (p, two), meta=meta(4)),))
    config = CompilerConfig()
    config.rules.extra = [mine]
    out, report = opt(g, config)
    assert report.applied["mul_two_is_add"] == 1 and out.op_counts() == {"aten.add.Tensor": 1}
    t = torch.randn(4)
    torch.testing.assert_close(run(out, t)[0], t * 2)


def test_optimizing_an_optimized_graph_changes_nothing():
    def fn(x):
        return (x.relu() + x.relu()) * x.t().t()

    from torch.fx.experimental.proxy_tensor import make_fx
    from rewrite.fx_bridge import from_fx

    g = from_fx(make_fx(fn, tracing_mode="fake")(torch.randn(4, 4)))
    once, _ = opt(g)
    twice, report = opt(once)
    assert twice.op_counts() == once.op_counts()
    assert once.num_ops() < g.num_ops()


def test_describe_rulesets_lists_passes_and_rules():
    text = describe_rulesets()
    assert "fold" in text and "dead_edge" in text
    total = sum(len(rs) for rs in default_rulesets())
    assert f"{total} rules" in text and total >= 40


def test_schedule_lists_the_values_that_run():
    """The schedule holds the passes and ruleset objects themselves (issue 52): every library ruleset once, in
    LIBRARY's order, each with its count; every pass a `Pass` of rewrite.passes, printed from that value."""
    from rewrite.optimizer import SCHEDULE, Pass, Run
    from rewrite.rules import LIBRARY

    runs = SCHEDULE.saturation.runs
    assert all(isinstance(r, Run) for r in runs)
    assert [r.ruleset for r in runs] == list(LIBRARY)  # a ruleset added to rules/ must be scheduled too
    counts = {r.ruleset.name: r.iterations for r in runs if r.iterations != 8}
    assert counts == {"algebra.commutativity": 1, "gemm.merge_parallel": 1, "gemm.fold_scales": 4}
    passes = SCHEDULE.first + SCHEDULE.sweep.passes + SCHEDULE.finishing
    assert all(isinstance(p, Pass) for p in passes)
    assert all(p.run.__module__.startswith("rewrite.passes.") for p in SCHEDULE.sweep.passes + SCHEDULE.finishing)
    text = describe_rulesets()
    assert all(p.name in text and p.doc in text for p in passes)
    assert all(f"{r.ruleset.name}  ({len(r.ruleset)} rules, {r.iterations} iterations)" in text for r in runs)


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_real_models_match_eager_and_show_folding_cse_pruning(name):
    model = getattr(models, name)()
    ids = models.token_batch(2, 16)
    config = CompilerConfig()
    config.experimental_config.frozen_parameter = True  # weights become constants: folding applies
    with torch.no_grad():
        want = model(ids).last_hidden_state
        report = rewrite.explain(model, ids, config=config)
    torch.testing.assert_close(report.result.last_hidden_state, want, atol=2e-5, rtol=1e-4)
    applied = report.applied()
    assert report.ops_after < report.ops_before
    assert applied.get("fold", 0) + applied.get("fold_sizes", 0) > 0
    assert applied.get("prune", 0) + applied.get("dedup", 0) + applied.get("cse", 0) > 0
    assert any(k.startswith("egraph.") for k in report.graphs[0].stage_seconds)


def _linear_tanh_graph(rows: int = 2, width: int = 64) -> Graph:
    """x @ w + b, then tanh, with w and b constants (frozen weights): what oneDNN's fused linear replaces
    (BERT's pooler)."""
    g = Graph("linear_tanh")
    x = g.placeholder("x", meta(rows, width))
    w = g.constant(torch.randn(width, width, generator=torch.Generator().manual_seed(0)))
    b = g.constant(torch.randn(width, generator=torch.Generator().manual_seed(1)))
    y = g.call(aten.addmm.default, (b, x, w), meta=meta(rows, width))
    g.set_output((g.call(aten.tanh.default, (y,), meta=meta(rows, width)),))
    return g


@pytest.mark.skipif(not rewrite.rules.fused.LINEAR.rules, reason="this build has no oneDNN fused linear")
@pytest.mark.parametrize("faster_us, taken_by", [(-1.0, {"forward"}), (50.0, {"forward", "inference"})])
def test_a_graph_headed_for_static_kernels_prices_the_fused_linear_with_the_run_it_splits(faster_us, taken_by):
    """Both units of one config are offered oneDNN's fused linear; the cost model prices it by the unit's
    policy. In the default mode a training forward graph runs its ATen code (it never tiers up): the fused
    linear wins there when it saves more than it costs (here: 1 us slower than the GEMM, it saves tanh's own
    call). An inference graph of the same config tiers up to static kernels, where the fused linear (no static
    kernel) also pays for the run of C kernels it splits: it wins only when it saves more than that too. (The optimizer once resolved the policy again as if every graph were inference.)"""
    from rewrite.cost import KernelTimes, calibration
    from rewrite.cost.model import RUN_SPLIT_DISPATCHES
    from rewrite.ops import FUSED_LINEARS

    gemm_s = 100e-6
    tanh_call_s = calibration.DEFAULT.families["pointwise"].overhead_s
    split_s = RUN_SPLIT_DISPATCHES * calibration.DEFAULT.dispatch_s
    assert 0 < tanh_call_s - 1e-6 < split_s and split_s + tanh_call_s < 50e-6  # what the two cases mean

    class Measured(KernelTimes):  # what this machine "measured": the GEMM, and the fused linear faster_us faster
        def seconds(self, target, out_meta, in_metas):
            if target in FUSED_LINEARS:
                return gemm_s - faster_us * 1e-6
            return gemm_s if target is aten.addmm.default else None  # the rest: priced by the model

    config = CompilerConfig()
    for kind in ("forward", "inference"):
        unit = CompileUnit(f"g0_{kind}", 0, kind, config)
        assert unit.policy.tiers_up is (kind == "inference")
        with calibration.use(dataclasses.replace(calibration.DEFAULT, kernel_times=Measured(None))):
            out = optimize(_linear_tanh_graph(), unit)
        assert unit.report.applied.get("linear_tanh"), (kind, unit.report.applied)  # offered to both
        fused = [n for n in out.nodes if n.kind == "call" and n.target in FUSED_LINEARS]
        assert bool(fused) is (kind in taken_by), (kind, faster_us, [n.op for n in out.nodes if n.kind == "call"])
        x = torch.randn(2, 64)
        torch.testing.assert_close(run(out, x)[0], run(_linear_tanh_graph(), x)[0], rtol=1e-5, atol=1e-5)
