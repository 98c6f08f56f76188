"""Floats Dynamo lifts from globals and attributes under dynamic=True (rewrite/lifted_floats.py) are traced again as
numbers Dynamo guards on: folding and the rules see them, a reassigned one is a counted recompile, and a float the
caller passes stays an argument."""
from __future__ import annotations

import math

import pytest
import torch

import rewrite
from rewrite.fx_bridge import dynamo_input_names
from rewrite.lifted_floats import constant_float_symbols

SCALE = 0.5  # a module global the model reads


class _ReadsFloats(torch.nn.Module):
    """GPT-2's tanh GELU, its constant computed from ``math.pi`` as transformers' ``NewGELUActivation`` does; a
    global and an attribute float; ``k``, an argument."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 8)
        self.shift = 0.25

    def forward(self, x, k: float):
        h = self.lin(x)
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        return math.sqrt(2.0 / self.shift) * (h * SCALE + k)


def _dynamic(model, **fields):
    torch._dynamo.reset()  # one compile per test: Dynamo keeps what it learnt per code object
    backend = rewrite.get_backend(rewrite.CompilerConfig(**fields))
    return torch.compile(model, backend=backend, dynamic=True, fullgraph=True), backend


def test_dynamo_lifts_the_floats_and_they_are_found_by_their_sources():
    seen = []

    def record(gm, example_inputs):
        names = dynamo_input_names(gm, len(example_inputs))
        seen.append((names, constant_float_symbols(gm, names)))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(_ReadsFloats(), backend=record, dynamic=True)(torch.randn(3, 8), 2.0)
    names, symbols = seen[0]
    assert {"G['math'].pi", "L['self'].shift", "G['SCALE']", "L['k']"} <= set(names), names  # lifted as inputs
    assert len(symbols) == 3, (names, symbols)  # pi, shift and SCALE; k is the caller's


def test_floats_from_globals_and_attributes_are_numbers_the_rules_see():
    model = _ReadsFloats().eval()
    served, backend = _dynamic(model)
    with torch.no_grad():
        for rows, k in ((3, 2.0), (5, 3.0), (4, 2.0)):
            x = torch.randn(rows, 8)
            torch.testing.assert_close(served(x, k), model(x, k))
    ops = backend.report.graphs[-1].ops_after
    # sqrt(2 / pi) is a number: the GELU's eight ops are one (a fused linear's post-op, or gelu)
    assert ops.get("aten.gelu.default", 0) + ops.get("mkldnn._linear_pointwise.default", 0) >= 1, ops
    assert "aten.tanh.default" not in ops and "aten.sqrt.default" not in ops, ops
    assert rewrite.stats(served).recompiles == 0


def test_a_reassigned_attribute_float_is_a_counted_recompile_never_a_stale_result():
    model = _ReadsFloats().eval()
    served, _ = _dynamic(model)
    with torch.no_grad():
        served(torch.randn(3, 8), 1.0)
        model.shift = 4.0
        for rows in (3, 6):
            x = torch.randn(rows, 8)
            torch.testing.assert_close(served(x, 1.0), model(x, 1.0))
    stats = rewrite.stats(served)
    assert stats.recompiles == 1 and "shift" in str(stats), stats


def test_strict_refuses_the_recompile_a_reassigned_float_needs():
    model = _ReadsFloats().eval()
    served, _ = _dynamic(model, strict=True)
    with torch.no_grad():
        served(torch.randn(3, 8), 1.0)
        model.shift = 3.0
        with pytest.raises(rewrite.SlowPathError, match="shift"):
            served(torch.randn(3, 8), 1.0)
