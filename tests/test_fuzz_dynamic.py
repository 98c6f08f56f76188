"""Random dynamic-shape programs through the whole backend, and random gears, compared with eager.

The static fuzzers (test_fuzz.py) never exercise symbolic sizes or gears, where the subtle bugs
live: size arithmetic folded wrongly, a gear graph specialized from the wrong trace, padding that
leaks into a reduction, a fallback that runs the wrong graph. Here random programs from
`rewrite.testing.dynamic` (reshapes written in terms of input sizes, shared size symbols, slices,
cats and size arithmetic) are compiled with ``torch.compile(..., backend=rewrite, dynamic=True)``
and run at several sizes their guards allow, and compiled with random ``set_dim_gears``
declarations (both merge policies, every gear_fallback mode), every gear and some sizes between
gears compared with eager.

CI runs a few derandomized examples of each; ``make fuzz`` (REWRITE_FUZZ_EXAMPLES=5000) runs
thousands: half the count through dynamic compilation, a fifth through gears (a gear example
compiles every gear: seconds each).
"""
from __future__ import annotations

import os

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import rewrite
from rewrite.gears import GearError, set_dim_gears
from rewrite.gears.spec import restore_size_oblivious
from rewrite.testing import compare_outputs, fuzz_examples
from rewrite.testing.dynamic import MAX_SIZE, SizeConstraints
from rewrite.testing.fx_graphs import FxCase, case_inputs, case_sizes, fx_cases

FUZZING = "REWRITE_FUZZ_EXAMPLES" in os.environ
DYNAMIC_EXAMPLES = fuzz_examples(10000) // 2 if FUZZING else 20
GEAR_EXAMPLES = fuzz_examples(10000) // 5 if FUZZING else 15
# Dtypes the backend fuzzers draw: what models use, plus bool masks.
DTYPES = (torch.float32, torch.int64, torch.bool)


def _settings(n):
    return settings(max_examples=n, deadline=None, database=None, derandomize=not FUZZING,
                    suppress_health_check=list(HealthCheck), phases=[Phase.generate, Phase.shrink])


def _program_cases():
    # No decompositions: the program itself is what torch.compile sees; the trace only gives guards.
    return fx_cases(dynamic=True, dtypes=DTYPES, max_inputs=2, max_ops=6, decompositions=None)


def _run(fn, inputs):
    args = [t.clone() for t in inputs]
    with torch.no_grad():
        out = fn(*args)
    return (tuple(out) if isinstance(out, (tuple, list)) else (out,)), args


def _mismatch(case: FxCase, sizes, inputs, eager, compiled) -> str | None:
    """What differs between eager and compiled runs (outputs, then inputs the program updates)."""
    (expected, eager_inputs), (got, compiled_inputs) = eager, compiled
    why = compare_outputs(expected, got)
    if why is None:
        why = compare_outputs(eager_inputs, compiled_inputs)
        why = why and f"inputs after the call differ ({why.replace('output', 'input')})"
    if why is None:
        return None
    values = "\n".join(f"  {s.name}: {t.tolist()}" for s, t in zip(case.inputs, inputs))
    return f"{why}\nat sizes {sizes}\n{case.origin}\ninputs:\n{values}"


@_settings(DYNAMIC_EXAMPLES)
@given(st.data())
def test_random_dynamic_programs_through_torch_compile_match_eager(data):
    case = data.draw(_program_cases(), label="program")
    all_sizes = data.draw(case_sizes(case, SizeConstraints(case.gm), count=3), label="sizes")
    torch._dynamo.reset()
    backend = rewrite.get_backend()
    compiled = torch.compile(case.origin.function, backend=backend, dynamic=True, fullgraph=True)
    for sizes in all_sizes:
        inputs = data.draw(case_inputs(case, sizes), label="inputs")
        why = _mismatch(case, sizes, inputs, _run(case.origin.function, inputs), _run(compiled, inputs))
        assert why is None, why
    assert backend.report.graphs, "the rewrite backend compiled nothing"


@st.composite
def _gear_plan(draw, case: FxCase):
    """Which size symbols get gears, the gear combinations (valid for the graph), policy and fallback."""
    symbols = list(case.trace_sizes)
    geared = draw(st.lists(st.sampled_from(symbols), min_size=1, max_size=len(symbols), unique=True))
    policy = draw(st.sampled_from(["zip", "product"]))
    fallback = draw(st.sampled_from(["error", "pad", "fit", "dynamic"]))
    constraints = SizeConstraints(case.gm)
    dtypes = [s.dtype for s in case.inputs]
    combos = [dict(case.trace_sizes)]
    wanted = draw(st.integers(1, 3))
    for _ in range(12):
        if len(combos) >= wanted:
            break
        sizes = {s: draw(st.integers(2, MAX_SIZE)) if s in geared else v for s, v in case.trace_sizes.items()}
        if sizes not in combos and constraints.allows(case.shapes(sizes), dtypes):
            combos.append(sizes)
    if policy == "zip":
        gears = {s: [c[s] for c in combos] for s in geared}
    else:  # product: every combination of per-symbol values is declared; invalid ones must be dropped
        gears = {s: sorted({c[s] for c in combos}) for s in geared}
    # Sizes between or beyond the gears, valid for the graph: what the fallback has to serve.
    others = []
    for _ in range(8):
        sizes = {s: draw(st.integers(2, MAX_SIZE)) if s in geared else v for s, v in case.trace_sizes.items()}
        if sizes not in combos and sizes not in others and constraints.allows(case.shapes(sizes), dtypes):
            others.append(sizes)
        if len(others) >= 2:
            break
    return geared, gears, policy, fallback, combos, others


@_settings(GEAR_EXAMPLES)
@given(st.data())
def test_random_gears_match_eager_at_every_gear_and_fallback(data):
    case = data.draw(_program_cases(), label="program")
    geared, gears, policy, fallback, combos, others = data.draw(_gear_plan(case), label="gears")
    config = rewrite.CompilerConfig()
    config.inference_config.dynamic_gears_merge_policy = policy
    config.inference_config.gear_fallback = fallback
    torch._dynamo.reset()
    compiled = torch.compile(case.origin.function, backend=rewrite.get_backend(config), fullgraph=True)
    declared = f"gears {gears} ({policy}, fallback {fallback})"
    try:
        _check_gears(data, case, compiled, gears, fallback, combos, others, declared)
    except Exception as e:  # name the program and the gears, whatever broke
        if str(case.origin) in str(e):
            raise
        raise AssertionError(f"{declared}: {type(e).__name__}: {e}\n{case.origin}") from e
    finally:
        restore_size_oblivious()


def _check_gears(data, case: FxCase, compiled, gears, fallback, combos, others, declared):
    """Every gear combination, then sizes between gears, compared with eager."""
    for i, sizes in enumerate(combos):
        inputs = data.draw(case_inputs(case, sizes), label="inputs")
        eager = _run(case.origin.function, inputs)
        if i == 0:  # gears are declared on the first call's tensors, as users do
            first = [t.clone() for t in inputs]
            for spec, t in zip(case.inputs, first):
                dims = {d: gears[s] for d, s in enumerate(spec.dims) if s in gears}
                if dims:
                    set_dim_gears(t, dims)
            with torch.no_grad():
                out = compiled(*first)
            got = (tuple(out), first)
        else:
            got = _run(compiled, inputs)
        why = _mismatch(case, sizes, inputs, eager, got)
        assert why is None, f"gear {sizes} of {declared}: {why}"
    for sizes in others:
        inputs = data.draw(case_inputs(case, sizes), label="inputs")
        eager = _run(case.origin.function, inputs)
        try:
            got = _run(compiled, inputs)
        except GearError as e:
            # A size that is no gear may be refused (error fallback, or padding not possible),
            # never by the dynamic fallback; the message names the size.
            assert fallback != "dynamic", f"{declared}: the dynamic fallback refused {sizes}: {e}"
            assert "not one of the compiled gears" in str(e)
            continue
        why = _mismatch(case, sizes, inputs, eager, got)
        assert why is None, f"non-gear sizes {sizes} of {declared}: {why}"
