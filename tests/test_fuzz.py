"""Random graphs through the optimizer and through the whole backend, compared with unoptimized runs.

CI runs 300 graphs through optimize + codegen (compared bit for bit) and 300 through
torch.compile with the rewrite backend (compared with eager within tolerance); ``make fuzz`` sets
REWRITE_FUZZ_EXAMPLES=5000 (and a tenth of that, 500, through torch.compile).
CI draws the same graphs every run (derandomized); ``make fuzz`` draws new ones each time.
"""
from __future__ import annotations

import os

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import rewrite
from rewrite.config import CompilerConfig
from rewrite.fx_bridge import to_fx
from rewrite.optimizer import optimize
from rewrite.report import GraphReport
from rewrite.testing import assert_equivalent, compare_outputs, fuzz_examples, graph_inputs, graphs, run_graph

EXAMPLES = fuzz_examples(300)
COMPILE_EXAMPLES = max(EXAMPLES // 10, 300)  # Dynamo + AOTAutograd cost ~0.3 s a graph
DERANDOMIZE = "REWRITE_FUZZ_EXAMPLES" not in os.environ


def _settings(n):
    return settings(max_examples=n, deadline=None, database=None, derandomize=DERANDOMIZE,
                    suppress_health_check=list(HealthCheck), phases=[Phase.generate, Phase.shrink])


@_settings(EXAMPLES)
@given(st.data())
def test_random_graphs_optimized_compute_the_same_values(data):
    graph = data.draw(graphs(max_inputs=3, max_ops=10))
    inputs = data.draw(graph_inputs(graph))
    optimized = optimize(graph, CompilerConfig(), GraphReport("fuzz"))
    optimized.validate()
    # Bit for bit (NaN where NaN, the sign of every zero), no output newly aliasing an input.
    assert_equivalent(graph, optimized, inputs=inputs, exact=True, check_aliasing=True)


@_settings(COMPILE_EXAMPLES)
@given(st.data())
def test_random_graphs_through_torch_compile_match_eager(data):
    graph = data.draw(graphs(max_inputs=2, max_ops=8, dtypes=(torch.float32, torch.int64, torch.bool)))
    inputs = data.draw(graph_inputs(graph))
    module = to_fx(graph)  # eager: the graph's ATen ops, one by one
    expected, updated_inputs = run_graph(graph, inputs)
    torch._dynamo.reset()
    backend = rewrite.get_backend()
    compiled = torch.compile(module, backend=backend, fullgraph=True)
    args = [t.clone() for t in inputs]
    with torch.no_grad():
        got = compiled(*args)
    assert backend.report.graphs, "the rewrite backend compiled nothing"
    why = compare_outputs(expected, tuple(got) if isinstance(got, (tuple, list)) else (got,))
    # Graphs ending in copy_ update their inputs: the compiled function must update them the same way.
    if why is None:
        mutation = compare_outputs(updated_inputs, args)
        why = mutation and f"inputs after the call differ ({mutation.replace('output', 'input')})"
    assert why is None, f"{why}\n{graph}\ninputs: {[t.tolist() for t in inputs]}"
