"""Random graphs through the optimizer and through the whole backend, compared with unoptimized runs.

CI runs 300 graphs through optimize + codegen (compared bit for bit), 300 through
torch.compile with the rewrite backend (compared with eager within tolerance) and 300 through the
default mode's tier-up (before and after it, and eager); ``make fuzz`` sets
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
from rewrite.exec.codegen import compile_graph_to_python
from rewrite.exec.program import PlannedProgram
from rewrite.fx_bridge import to_fx
from rewrite.optimizer import optimize
from rewrite.report import GraphReport
from rewrite.testing import assert_equivalent, compare_outputs, fuzz_examples, graph_inputs, graphs, run_graph
from rewrite.testing.equivalence import compare_tensors, tolerance
from rewrite.unit import CompileUnit

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
    optimized = optimize(graph, CompileUnit.detached(graph.name, CompilerConfig(), GraphReport("fuzz")))
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


# -- tier-up: the same compiled graph before and after it tiers up --------------------------------------------

# ~0.1 s a graph here (a C compile where its kernels are new): 300 in CI, 5000 in make fuzz
TIER_UP_EXAMPLES = EXAMPLES
# Static kernels compute the same formulas as ATen's kernels but may round differently (libmvec,
# reassociated sums, layer-norm statistics in double): a few ulps, far tighter than the dtype tolerance
# compare_outputs allows between optimized and eager graphs.
_KERNEL_TOL = {torch.float32: (1e-5, 1e-6), torch.float64: (1e-12, 1e-14)}


def _call(fn, inputs):
    """``fn`` on clones of ``inputs``: (outputs as a tuple, the inputs after the call)."""
    args = [t.clone() for t in inputs]
    with torch.no_grad():
        got = fn(*args)
    return (tuple(got) if isinstance(got, (tuple, list)) else (got,)), args


def _computed_in(graph, dtype: torch.dtype) -> torch.dtype:
    """The dtype whose rounding an output of ``dtype`` carries: float32 when the graph computes any float32
    value (a float64 output may be a float32 tanh cast up, and libmvec's tanhf differs from ATen's by an ulp)."""
    if dtype == torch.float64 and any(getattr(n.meta, "dtype", None) == torch.float32 for n in graph.nodes):
        return torch.float32
    return dtype


def _against_eager(expected: tuple, actual: tuple, graph) -> str | None:
    for i, (e, a) in enumerate(zip(expected, actual)):
        if isinstance(e, torch.Tensor) and e.dtype.is_floating_point:
            why = compare_tensors(e, a, exact=False, tol=tolerance(_computed_in(graph, e.dtype)))
        else:
            why = compare_outputs((e,), (a,))
        if why:
            return f"output {i}: {why}"
    return compare_outputs(expected, actual) if len(expected) != len(actual) else None


def _same(expected: tuple, actual: tuple, exact: bool, graph) -> str | None:
    if exact:
        return compare_outputs(expected, actual, exact=True)
    for i, (e, a) in enumerate(zip(expected, actual)):
        tol = _KERNEL_TOL.get(_computed_in(graph, e.dtype)) if isinstance(e, torch.Tensor) else None
        why = compare_tensors(e, a, exact=tol is None, tol=tol) if isinstance(e, torch.Tensor) else \
            compare_outputs((e,), (a,))
        if why:
            return f"output {i}: {why}"
    return compare_outputs(expected, actual) if len(expected) != len(actual) else None


@_settings(TIER_UP_EXAMPLES)
@given(st.data())
def test_random_graphs_compute_the_same_before_and_after_their_tier_up(data):
    """Tier-up must never change a result. A random graph is optimized as the backend does and handed
    to the default mode's tier-up (one cold call); its first call runs the generated ATen code, the
    second plans it on that call's inputs and builds its static kernels, the third runs the plan.
    Without static kernels in the plan the results are bit for bit the ATen code's; with them, within a
    few ulps; every call's results (and input updates) match eager."""
    # float32 twice: most static kernels are float ones
    dtypes = (torch.float32, torch.float32, torch.float64, torch.int64, torch.bool)
    graph = data.draw(graphs(max_inputs=3, max_ops=10, dtypes=dtypes))
    inputs = data.draw(graph_inputs(graph))
    expected, expected_inputs = run_graph(graph, inputs)  # eager: the graph's ATen ops, one by one
    config = CompilerConfig()
    config.exec.tier_up_calls = 1
    report = GraphReport("fuzz")
    optimized = optimize(graph, CompileUnit.detached(graph.name, config, report))
    program = PlannedProgram(CompileUnit.detached("fuzz", config, report))
    plain = compile_graph_to_python(optimized)
    gear = program.executable(optimized, plain, plannable=True)

    before, before_inputs = _call(gear, inputs)
    after, after_inputs = _call(gear, inputs)  # this call tiers up
    steady, steady_inputs = _call(gear, inputs)
    context = f"\n{graph}\ninputs: {[t.tolist() for t in inputs]}\nnotes: {report.notes}"
    assert not any("tiering up failed" in n for n in report.notes), context
    plan = getattr(gear, "plan", None)
    natives = sum(p.kind == "native" for p in plan.nodes.values()) if plan is not None else 0
    for label, got, got_inputs in (("before the tier-up", before, before_inputs),
                                   ("after the tier-up", after, after_inputs),
                                   ("on the plan", steady, steady_inputs)):
        why = _against_eager(expected, got, optimized) or _against_eager(expected_inputs, got_inputs, optimized)
        assert why is None, f"{label}, against eager: {why}{context}"
    for label, got, got_inputs in (("after the tier-up", after, after_inputs), ("on the plan", steady, steady_inputs)):
        why = _same(before, got, natives == 0, optimized) or _same(before_inputs, got_inputs, natives == 0, optimized)
        assert why is None, f"{label} ({natives} static kernels), against the ATen code before it: {why}{context}"
    why = compare_outputs(after, steady, exact=True)
    assert why is None, f"the plan's second call differs from its first: {why}{context}"
