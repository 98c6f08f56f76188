"""Do two graphs compute the same thing? Run both on the same inputs and say where they differ.

A pass test states only the graphs; the inputs come from `graph_inputs` (so NaN, inf, -0.0 and the
extreme integers are tried) and the graphs run on the executor every compiled graph uses
(`rewrite.exec.codegen.compile_graph_to_python`), so what is compared is what users would get.
Besides outputs, inputs the graph mutates are compared, and an output that became a view of an
input is reported: a caller writing to that result would change its input.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from hypothesis import HealthCheck, Phase, given, settings

from ..exec.codegen import compile_graph_to_python
from ..ir import Graph, format_graph
from ..ops import dtype_str
from .strategies import graph_inputs


def run_graph(graph: Graph, inputs: Sequence[torch.Tensor]):
    """Run ``graph`` with the default executor on clones of ``inputs`` (so mutations do not leak)."""
    fn = compile_graph_to_python(graph)
    args = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
    return _as_tuple(fn(*args)), args


def _as_tuple(out) -> tuple:
    if isinstance(out, (tuple, list)):
        return tuple(out)
    return (out,)


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for comparing results that may be rounded differently."""
    return {
        torch.float16: (1e-2, 1e-3),
        torch.bfloat16: (5e-2, 1e-2),
        torch.float32: (1e-4, 1e-5),
        torch.float64: (1e-9, 1e-12),
    }.get(dtype, (0.0, 0.0))


def compare_tensors(expected: torch.Tensor, actual: torch.Tensor, exact: bool,
                    tol: tuple[float, float] | None = None, listed: int = 1) -> str | None:
    """None when they agree, else a description of the disagreement naming up to ``listed`` elements.

    NaN matches NaN. With ``exact`` every other element must be equal and zeros must keep their
    sign; otherwise floats may differ by ``tol`` (rtol, atol), by default the dtype's `tolerance`
    (infinities must still match).
    """
    if not isinstance(actual, torch.Tensor):
        return f"expected a tensor, got {type(actual).__name__}: {actual!r}"
    if expected.dtype != actual.dtype:
        return f"dtype {actual.dtype} differs from expected {expected.dtype}"
    if expected.shape != actual.shape:
        return f"shape {tuple(actual.shape)} differs from expected {tuple(expected.shape)}"
    if expected.device != actual.device:
        return f"device {actual.device} differs from expected {expected.device}"
    e, a = expected.detach().cpu(), actual.detach().cpu()
    if e.dtype.is_floating_point:
        e64, a64 = e.double(), a.double()
        both_nan = e64.isnan() & a64.isnan()
        if exact:
            bad = ~both_nan & ((e64 != a64) | (torch.signbit(e64) != torch.signbit(a64)))
        else:
            rtol, atol = tol or tolerance(e.dtype)
            close = torch.isclose(a64, e64, rtol=rtol, atol=atol, equal_nan=True)
            bad = ~close
    else:
        bad = e != a
    if not bad.any():
        return None
    where = [tuple(int(i) for i in row) for row in bad.nonzero()[:listed]]
    head = f"{int(bad.sum())} of {e.numel()} elements differ"
    if listed == 1:
        idx = where[0]
        return f"{head}; first at index {list(idx)}: expected {e[idx].item()!r}, got {a[idx].item()!r}"
    items = "; ".join(f"at {list(idx)}: expected {e[idx].item()!r}, got {a[idx].item()!r}" for idx in where)
    return f"{head}: {items}"


def compare_outputs(expected: Sequence, actual: Sequence, exact: bool = False) -> str | None:
    """None when two output tuples agree (tensors as in `compare_tensors`), else the first difference."""
    if len(expected) != len(actual):
        return f"{len(actual)} outputs, expected {len(expected)}"
    for i, (e, a) in enumerate(zip(expected, actual)):
        if isinstance(e, torch.Tensor):
            why = compare_tensors(e, a, exact)
        else:
            why = None if (e == a or (isinstance(e, float) and math.isnan(e) and math.isnan(a))) else f"expected {e!r}, got {a!r}"
        if why:
            return f"output {i}: {why}"
    return None


def describe_inputs(inputs, names: Sequence[str] | None = None) -> str:
    """One line per input: its name (``input i`` by default), dtype, shape and every value."""
    lines = []
    for i, t in enumerate(inputs):
        name = names[i] if names else f"input {i}"
        if isinstance(t, torch.Tensor):
            lines.append(f"  {name}: {dtype_str(t.dtype)}{list(t.shape)} = {t.tolist()}")
        else:
            lines.append(f"  {name}: {t!r}")
    return "\n".join(lines)


def storage_address(value) -> int | None:
    """The address of a tensor's memory; None for an empty tensor or a non-tensor (they share nothing)."""
    if isinstance(value, torch.Tensor) and value.numel():
        return value.untyped_storage().data_ptr()
    return None


def input_aliases(outputs, inputs) -> list[int | None]:
    """For each output, the index of the input whose storage it shares, or None."""
    ptrs = {storage_address(t): i for i, t in enumerate(inputs)}
    ptrs.pop(None, None)
    return [ptrs.get(storage_address(o)) for o in outputs]


def _check_pair(before: Graph, after: Graph, inputs, exact: bool, check_aliasing: bool) -> str | None:
    expected, in_before = run_graph(before, inputs)
    try:
        actual, in_after = run_graph(after, inputs)
    except Exception as e:  # noqa: BLE001 - a pass that breaks execution is the failure we report
        return f"the graph after the pass raised {type(e).__name__}: {e}"
    why = compare_outputs(expected, actual, exact)
    if why:
        return why
    # Inputs the graph mutates (copy_ / in-place ops) must end up the same too.
    for i, (b, a) in enumerate(zip(in_before, in_after)):
        if isinstance(b, torch.Tensor):
            why = compare_tensors(b, a, exact)
            if why:
                return f"input {i} after the call (mutated by the graph): {why}"
    if check_aliasing:
        for i, (ab, aa) in enumerate(zip(input_aliases(expected, in_before), input_aliases(actual, in_after))):
            if aa is not None and ab != aa:
                was = f"a view of input {ab}" if ab is not None else "a fresh tensor"
                return (f"output {i} shares memory with input {aa} after the pass but was {was} before: "
                        "the caller could change an input by writing to a result")
    return None


def assert_equivalent(graph_before: Graph, graph_after: Graph, inputs=None, *, exact: bool = False,
                      check_aliasing: bool = True, examples: int = 20, specials: bool = True) -> None:
    """Assert that two graphs compute the same outputs (and input mutations).

    With ``inputs`` the graphs are compared on those inputs only; otherwise on ``examples`` random
    inputs drawn by `graph_inputs` (including NaN, inf, -0.0 and extreme integers with
    ``specials``). Floats agree within the dtype's tolerance unless ``exact``. With
    ``check_aliasing`` an output that shares memory with an input after the pass must have shared
    it with the same input before (a fresh result that became a view is the dangerous direction;
    a view that became a fresh copy is allowed). Raises AssertionError with both graphs and the
    inputs.
    """
    def fail(why, ins):
        raise AssertionError(
            f"graphs are not equivalent: {why}\n{describe_inputs(ins)}\n"
            f"--- before ---\n{format_graph(graph_before)}\n--- after ---\n{format_graph(graph_after)}")

    if len(graph_before.placeholders) != len(graph_after.placeholders):
        raise AssertionError(f"the pass changed the number of inputs: {len(graph_before.placeholders)} -> "
                             f"{len(graph_after.placeholders)}")
    if inputs is not None:
        why = _check_pair(graph_before, graph_after, inputs, exact, check_aliasing)
        if why:
            fail(why, inputs)
        return

    # Hypothesis seeds its derandomized draws from run's source, decorators included: an edit to
    # these lines changes which inputs every pass test runs on.
    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate, Phase.shrink])
    @given(graph_inputs(graph_before, specials))
    def run(ins):
        why = _check_pair(graph_before, graph_after, ins, exact, check_aliasing)
        if why:
            fail(why, ins)

    run()


def tolerance_option(value) -> tuple:
    """(exact, (rtol, atol) or None) from a checker's ``tolerance`` argument: None (bit for bit), "dtype" (the
    per-dtype defaults of `tolerance`) or a pair (rtol, atol)."""
    if value is None:
        return True, None
    if value == "dtype":
        return False, None
    try:
        rtol, atol = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"tolerance={value!r}: use None (bit for bit), 'dtype' (per-dtype defaults, "
                         f"{tolerance(torch.float32)} for float32) or a pair (rtol, atol)") from None
    return False, (rtol, atol)
