"""Private torch APIs that differ between the torch versions rewrite supports (pyproject.toml: torch>=2.11,<2.15),
in one place: each function names the torch versions each of its branches serves. CI runs the whole suite on
torch 2.13.0 and a fast subset on 2.14.1 (`make test-torch2.14`); the GPU machines run 2.11.

Declared shapes (`torch.fx.experimental.dynamic_spec`: `ParamsSpec`, `TensorSpec`, `ShapeVar`):
  - torch 2.13: `torch.compile(model, shapes_spec=...)`, kept for the frame being compiled in
    `torch._dynamo.config._shapes_spec`;
  - torch 2.14: the keyword is `dynamic_shapes=` and the config field `_dynamic_shapes_spec`;
  - torch 2.11 (no `dynamic_spec` module): neither.
"""
from __future__ import annotations

import inspect

import torch

# torch.compile's keyword for a ShapesSpec/ParamsSpec, newest spelling first.
_SPEC_KEYWORDS = ("dynamic_shapes",  # torch 2.14
                  "shapes_spec")  # torch 2.13
# Where Dynamo keeps that spec while it compiles a frame, newest spelling first.
_SPEC_CONFIG_FIELDS = ("_dynamic_shapes_spec",  # torch 2.14
                       "_shapes_spec")  # torch 2.13


def shapes_spec_keyword() -> str | None:
    """The name of `torch.compile`'s keyword that takes a `ParamsSpec` (declared ranges of input sizes):
    "dynamic_shapes" on torch 2.14, "shapes_spec" on torch 2.13, None on torch 2.11 (it has none)."""
    parameters = inspect.signature(torch.compile).parameters
    return next((name for name in _SPEC_KEYWORDS if name in parameters), None)


def dynamo_shapes_spec():
    """The ShapesSpec that `torch.compile(..., dynamic_shapes=/shapes_spec=...)` set for the frame Dynamo is
    compiling, or None (none given, or torch 2.11): `torch._dynamo.config._dynamic_shapes_spec` on torch 2.14,
    `torch._dynamo.config._shapes_spec` on torch 2.13."""
    config = torch._dynamo.config
    for field in _SPEC_CONFIG_FIELDS:
        if hasattr(config, field):
            return getattr(config, field)
    return None


def specialize_floats(symbols: list[str]) -> bool:
    """Make Dynamo trace the frame again with the floats behind ``symbols`` (the ShapeEnv float symbols of inputs it
    lifted and reads with ``.item()``) as numbers it guards on, as its own tensorify pass does for a float it cannot
    turn into tensor ops: raises Dynamo's restart exception, which Dynamo catches (call it only while Dynamo
    compiles a frame). Returns False (nothing to do) when each is already marked, or on a torch without the
    mechanism. torch 2.13 and 2.14 (tested): `torch._dynamo.symbolic_convert.TensorifyState` and
    `torch._dynamo.exc.TensorifyScalarRestartAnalysis`; 2.11 is untested (no GPU machine was lent since), and
    without them the floats stay inputs, as before."""
    try:
        from torch._dynamo.exc import TensorifyScalarRestartAnalysis
        from torch._dynamo.symbolic_convert import TensorifyState
    except ImportError:
        return False
    new = [s for s in symbols if not TensorifyState.should_specialize(s)]
    if not new:
        return False
    for s in new:
        TensorifyState.specialize(s)
    raise TensorifyScalarRestartAnalysis
