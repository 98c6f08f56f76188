"""Equivalent-graph testing of compilers (rewrite.testing.check_backend): variants, the planted bug, repro scripts."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from rewrite.testing import BackendMismatch, capture_graphs, check_backend, equivalent_variants
from rewrite.testing.backends import _compare, union_case, case_from_graph
from rewrite.testing.repro import tensor_source

aten = torch.ops.aten
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def negated_sum(x, y):
    """x + (-y): the e-graph also holds sub(x, y) and add(-y, x)."""
    return (x + (-y)).relu() * 2


def buggy_backend(gm, example_inputs):
    """A planted miscompilation: folds ``add(neg(y), x)`` into ``sub(y, x)`` (the operands of the
    commuted form swapped); ``add(x, neg(y))`` is left alone, so the function as written compiles right."""
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is aten.add.Tensor:
            a, b = node.args[:2]
            if isinstance(a, torch.fx.Node) and a.op == "call_function" and a.target is aten.neg.default:
                with gm.graph.inserting_before(node):
                    wrong = gm.graph.call_function(aten.sub.Tensor, (a.args[0], b))
                node.replace_all_uses_with(wrong)
                gm.graph.erase_node(node)
    gm.recompile()
    return gm.forward


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)


def test_variants_are_different_graphs_equal_bit_for_bit():
    (case,), _ = capture_graphs(negated_sum, _inputs())
    variants, note = equivalent_variants(case.graph, variants=6)
    codes = {v.label: str(v.graph) for v in variants}
    assert len(set(codes.values())) == len(variants) >= 3, note  # original, sub(x, y), add(-y, x) at least
    from rewrite.fx_bridge import to_fx

    x, y = case.examples
    x[0, 0], y[0, 1] = float("nan"), float("-inf")
    want = to_fx(case.graph)(x, y)
    for v in variants:
        got = to_fx(v.graph)(x, y)
        assert torch.equal(got[0].nan_to_num(), want[0].nan_to_num()), v.label


def test_costliest_variant_puts_identities_back():
    """One e-node per e-class can never give back t(t(x)) (the identity rule puts both in x's class);
    the costliest variant wraps a class in such a form."""
    def f(x):
        return (x.t().t() * 2).relu()

    (case,), _ = capture_graphs(f, [torch.randn(3, 4)])
    variants, _ = equivalent_variants(case.graph, variants=2, include_original=False)
    by_label = {v.label: v.graph for v in variants}
    cheapest, costliest = by_label["cheapest"], by_label["costliest"]
    assert "aten.t" not in str(cheapest)
    assert costliest.num_ops() > cheapest.num_ops()


def test_check_backend_passes_on_eager():
    report = check_backend(negated_sum, *_inputs(), backend="eager", examples=3, variants=3)
    assert report.ok and report.variants >= 3 and report.runs >= 3 * 4, report


def test_check_backend_finds_a_planted_miscompilation_only_a_variant_shows(tmp_path):
    x, y = _inputs()
    # The function as written compiles right with the buggy backend: testing only it finds nothing.
    torch.testing.assert_close(torch.compile(negated_sum, backend=buggy_backend)(x, y), negated_sum(x, y))
    with pytest.raises(BackendMismatch) as info:
        check_backend(negated_sum, x, y, backend=buggy_backend, examples=3, variants=3, repro_dir=str(tmp_path),
                      shrink_seconds=20)
    report = info.value.report
    (finding,) = {(f.variant, f.kind): f for f in report.findings if f.kind == "mismatch"}.values() \
        if len(report.findings) == 1 else report.findings[:1]
    assert finding.variant != "original" and finding.target == "buggy_backend"
    assert "aten.add.Tensor(neg" in finding.graph.replace("neg_default", "neg")
    assert finding.ops[1] <= 2, finding  # shrunk to neg + add
    # The script stands alone (torch and the backend imported by name) and fails as the finding says.
    done = subprocess.run([sys.executable, finding.script_path], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.path.join(REPO, "tests")])})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "REPRODUCED" in done.stdout


def test_rewrite_past_tier_up_and_geared_dynamic_sizes():
    def f(x, w):
        return torch.tanh(x @ w) + x.sum(1, keepdim=True)

    from rewrite.testing import target_for

    x, w = torch.randn(4, 6), torch.randn(6, 6)
    target = target_for("rewrite")
    report = check_backend(f, x, w, backend=target, examples=2, variants=2)
    assert report.ok and report.per_target["rewrite"]["runs"] >= 3 * 3, report
    notes = [n for b in target.backends for g in b.report.graphs for n in g.notes]
    assert any("tiered up" in n for n in notes), notes  # the calls compared ran the tiered-up program
    report = check_backend(lambda x: (x * 2).relu().sum(-1), torch.randn(4, 3), backend="rewrite-gears",
                           dynamic=True, examples=3, variants=2)
    assert report.ok and report.runs >= 3, report


def test_cli_check_backend(capsys):
    from rewrite.cli import main

    assert main(["check-backend", "test_check_backend:negated_sum", "--shapes", "3,4", "3,4", "--backend", "eager",
                 "--examples", "2", "--variants", "2"]) == 0
    assert "check_backend: ok" in capsys.readouterr().out
    assert main(["check-backend", "test_check_backend:negated_sum", "--shapes", "3,4:int9"]) == 2


def test_union_of_random_graphs_keeps_each_graph():
    from hypothesis import HealthCheck, given, settings

    from rewrite.testing import graphs

    drawn = []

    @settings(max_examples=3, derandomize=True, database=None, suppress_health_check=list(HealthCheck), deadline=None)
    @given(graphs(max_ops=4))
    def draw(g):
        drawn.append(g)

    draw()
    cases = [case_from_graph(g, f"g{k}", seed=k) for k, g in enumerate(drawn[:3])]
    union = union_case(cases)
    assert union.parts == 3 and len(union.graph.placeholders) == sum(len(c.graph.placeholders) for c in cases)
    from rewrite.fx_bridge import to_fx

    got = to_fx(union.graph)(*[t.clone() for t in union.examples])
    want = [o for c in cases for o in to_fx(c.graph)(*[t.clone() for t in c.examples])]
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert torch.equal(a, b) or (a.dtype.is_floating_point and torch.allclose(a, b, equal_nan=True))


@pytest.mark.parametrize("t", [
    torch.tensor([float("nan"), float("inf"), -0.0, 1.5]),
    torch.tensor([[1, -2], [3, 4]], dtype=torch.int8),
    torch.tensor(3.25, dtype=torch.bfloat16),
    torch.empty(0, 3),
    torch.randn(10, 10).to(torch.float16),  # bytes, not a literal
    torch.tensor([True, False]),
])
def test_repro_tensors_are_written_exactly(t):
    namespace = {"torch": torch, "inf": float("inf"), "nan": float("nan")}
    exec("import base64\ndef _raw(data, dtype, shape):\n    return torch.frombuffer(bytearray(base64.b64decode(data)),"
         " dtype=dtype).reshape(shape).clone()", namespace)
    back = eval(tensor_source(t), namespace)
    assert back.dtype == t.dtype and back.shape == t.shape
    assert torch.equal(back.view(torch.uint8) if t.dtype == torch.bool else back.nan_to_num(),
                       t.view(torch.uint8) if t.dtype == torch.bool else t.nan_to_num())
    assert torch.equal(torch.signbit(back.float()), torch.signbit(t.float()))


def test_rounding_differences_are_judged_against_float64():
    """A float32 sum of +-2**31 cancels: a compiler summing in another order differs from eager by far
    more than rtol, yet is as close to the exact value; a wrong value is still a difference."""
    e, r = torch.tensor([-5.3333]), torch.tensor([-6.0], dtype=torch.float64)
    assert _compare(e, torch.tensor([-5.8889]), False, None, r) is None  # nearer the exact value than eager
    assert _compare(e, torch.tensor([-9.0]), False, None, r) is not None  # 3.0 away, eager 0.67
    assert _compare(e, torch.tensor([float("nan")]), False, None, r) is not None
    assert _compare(e, torch.tensor([-5.8889]), True, None, r) is not None  # bit for bit asked


def test_variants_of_random_graphs_equal_the_original_bit_for_bit():
    """Every variant of a random graph (exact rules) rebuilds into a valid graph that computes, bit for bit,
    what the original computes, outputs and input updates alike, on inputs seasoned with special values."""
    from hypothesis import HealthCheck, given, settings, strategies as st

    from rewrite.testing import graph_inputs, graphs
    from rewrite.testing.equivalence import compare_outputs, run_graph

    @settings(max_examples=15, derandomize=True, database=None, suppress_health_check=list(HealthCheck),
              deadline=None)
    @given(graphs(max_ops=6), st.data())
    def check(graph, data):
        variants, note = equivalent_variants(graph, variants=3, seed=1)
        inputs = data.draw(graph_inputs(graph))
        want, want_inputs = run_graph(graph, inputs)
        for v in variants[1:]:
            got, got_inputs = run_graph(v.graph, inputs)
            assert compare_outputs(want, got, exact=True) is None, (v.label, str(graph), str(v.graph))
            assert compare_outputs(want_inputs, got_inputs, exact=True) is None, (v.label, str(v.graph))

    check()


def test_finds_the_dropped_update_of_a_zero_dim_float64_input():
    """A real torch.compile bug the campaign found (docs/inductor_findings.md): on torch 2.13 an in-place
    update of a 0-dim float64 input (``a.copy_(b)``, ``a.add_(b)``) can be dropped by AOTAutograd backends
    (aot_eager, Inductor, rewrite), and values read after it computed from the old value. check_backend on
    the graph the campaign shrank it to (``copy_(a, b)``) finds it and keeps it at that one op."""
    from rewrite.ir import Graph, TensorMeta
    from rewrite.testing import check_graphs

    class CopyInto(torch.nn.Module):
        def forward(self, a, b):
            torch.ops.aten.copy_.default(a, b)
            return (b * 2,)

    a, b = torch.zeros((), dtype=torch.float64), torch.ones((), dtype=torch.float64)
    torch.compile(CopyInto(), backend="aot_eager")(a, b)
    if a.item() == 1.0:
        pytest.skip(f"torch {torch.__version__} applies the update: fixed upstream")
    torch._dynamo.reset()
    g = Graph("copy_into")
    meta = TensorMeta(torch.float64, ())
    pa, pb = g.placeholder("a", meta), g.placeholder("b", meta)
    out = g.call(aten.mul.Tensor, (pb, 2), meta=meta)
    g.call(aten.copy_.default, (pa, pb), meta=meta)
    g.set_output((out,))
    report = check_graphs([case_from_graph(g)], "aot_eager", variants=1, examples=1, shrink_seconds=20)
    assert report.findings, report
    finding = report.findings[0]
    assert finding.kind == "mismatch" and "after the call" in finding.why, finding
    assert finding.ops[1] == 1 and "copy_" in finding.graph, finding


REPROS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "repro")


@pytest.mark.parametrize("script", sorted(f for f in os.listdir(REPROS) if f.endswith(".py")))
def test_each_documented_inductor_finding_reproduces_in_a_fresh_process(script):
    """docs/inductor_findings.md's scripts run on their own (they change process-wide config and exit 1 when the
    bug reproduces), so each runs in a fresh process here; a torch that fixed one makes it exit 0: skipped."""
    done = subprocess.run([sys.executable, os.path.join(REPROS, script)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": ""})
    if done.returncode == 0 and "not reproduced" in done.stdout:
        pytest.skip(f"{script}: not reproduced on torch {torch.__version__} (fixed upstream, or not hit here)")
    assert done.returncode == 1 and "REPRODUCED" in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]
