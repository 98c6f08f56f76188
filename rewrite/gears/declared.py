"""Gears from the shapes a user declared the way PyTorch declares them, instead of one dynamic graph.

A user who wrote ``torch._dynamo.mark_dynamic(x, 0, min=1, max=64)`` or
``torch.compile(model, shapes_spec=ParamsSpec({"x": TensorSpec([ShapeVar("B", min=1, max=64), None])}))``
has said which sizes a dim takes; that range is what gears are for. Such a dim gets gears from:

1. ``config.inference_config.declared_gears`` when it is set (the sizes `rewrite.gears.plan_gears` picked
   from recorded traffic, say), those inside the declared range;
2. else the default ladder (`ladder`): the range's ends, the ShapeVar's ``optimization_hint``, and the powers
   of two between them, at most `LADDER_GEARS` per dim (fewer when several independent dims are declared:
   their product is compiled), TorchAir's advice that more than about ten gears cost more than they win.
   Dims Dynamo traced with one size symbol (a model's input_ids and attention_mask batch, each declared) are
   one size: they share one ladder, over the sizes all their ranges allow.

`set_dim_gears` on the same tensor wins: this module is asked only when no gears are set. A size inside the
range that is no gear runs padded up to the next gear where padding is provably safe, else the dynamic graph
(both counted as slow paths, `rewrite.ledger`). A size outside the range never reaches the gears: Dynamo guards
the declared range itself (for a ShapeVar its guard error names the range; for ``mark_dynamic`` it traces another
graph, which the ledger counts as a recompile). A range without an upper bound has no ladder: the dim stays one
dynamic graph, with a note. Size 1 under ``mark_dynamic`` is specialized by Dynamo (a backed size), so a gear 1
there is a graph of its own; a ShapeVar (unbacked) or `set_dim_gears` keeps it in the one trace. ``shapes_spec``
is read from Dynamo's config (torch 2.13 and 2.14: `rewrite.torch_compat`); on a torch without it only ``mark_dynamic`` ranges are seen.
"""
from __future__ import annotations

import dataclasses
import logging
import math

import torch

from ..torch_compat import dynamo_shapes_spec

log = logging.getLogger("rewrite")

__all__ = ["Declared", "declared_dims", "declared_gears_for", "ladder", "LADDER_GEARS"]

LADDER_GEARS = 10  # gears per declared dim at most, one dim declared (TorchAir: more than ~10 gears degrade)


@dataclasses.dataclass(frozen=True)
class Declared:
    """A range declared for one dim: who declared it, its bounds (upper None: unbounded), the size most calls have."""

    name: str  # "ShapeVar 'B'", "mark_dynamic(x, 0, min=, max=)"
    lower: int
    upper: int | None
    hint: int | None = None
    var: str | None = None  # the ShapeVar's name, when a ShapeVar declared it

    def contains(self, size: int) -> bool:
        return size >= self.lower and (self.upper is None or size <= self.upper)

    def describe(self) -> str:
        return f"{self.name} declares [{self.lower}, {'oo' if self.upper is None else self.upper}]"


def ladder(declared: Declared, most: int = LADDER_GEARS) -> list[int]:
    """The default gears of a declared range: its ends, its hint, and powers of two between, at most ``most``
    (thinned evenly in log scale, ends and hint kept). [] for a range without an upper bound."""
    if declared.upper is None:
        return []
    low, high = max(declared.lower, 1), declared.upper
    if high < low:
        return []
    keep = {low, high} | ({declared.hint} if declared.hint is not None and low <= declared.hint <= high else set())
    powers = [2 ** k for k in range(max(1, math.ceil(math.log2(low))), math.floor(math.log2(high)) + 1)
              if low < 2 ** k < high and 2 ** k not in keep]
    room = max(most - len(keep), 0)
    if len(powers) > room:  # evenly spaced picks among the powers (in log scale: they are powers of two)
        powers = [powers[round((i + 0.5) * len(powers) / room - 0.5)] for i in range(room)]
    return sorted(keep | set(powers))


def declared_gears_for(chosen, ranges: list, labels: list):
    """(sizes, key) the config's ``declared_gears`` gives one gear axis: the axis declared by ``ranges``, whose dims
    are ``labels`` ('input_ids:1'). A list serves every axis (key None); a dict is read by the axis's ShapeVar name,
    else by any of its dims' labels. (None, None): nothing given for it, so the default ladder."""
    if not chosen:
        return None, None
    if not isinstance(chosen, dict):
        return list(chosen), None
    for key in [r.var for r in ranges if r.var is not None] + list(labels):
        if key in chosen:
            return list(chosen[key]), key
    return None, None


def declared_dims(gm, example_inputs) -> dict:
    """{(input index, dim): Declared} for the Dynamo graph ``gm``'s inputs: ``mark_dynamic`` ranges read off the
    example tensors, ``shapes_spec`` ShapeVars looked up by each input's Dynamo source."""
    out: dict = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"] if gm is not None else []
    spec = dynamo_shapes_spec()
    for i, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor):
            continue
        for r in getattr(x, "_dynamo_dynamic_range", None) or ():
            if r.min is not None or r.max is not None:
                out[(i, r.dim)] = Declared(f"mark_dynamic(dim {r.dim}, min={r.min}, max={r.max})",
                                           r.min if r.min is not None else 1, r.max)
        if spec is not None and i < len(placeholders):
            for d, var in enumerate(_tensor_spec(placeholders[i], spec)):
                if _is_shape_var(var):
                    out[(i, d)] = Declared(f"ShapeVar {var.name!r}", var.min if var.min is not None else 1, var.max,
                                           var.optimization_hint, var.name)
    return out


def _tensor_spec(placeholder, spec) -> list:
    """The per-dim specs ``shapes_spec`` gives this input (Dynamo's own lookup, torch 2.13), or []."""
    source = getattr(placeholder.meta.get("grapharg"), "source", None)
    if source is None:
        return []
    try:
        from torch._dynamo.variables.builder import lookup_spec_from_dynamo_source
        from torch.fx.experimental.dynamic_spec import TensorSpec

        leaf = lookup_spec_from_dynamo_source(source, spec)
    except Exception:  # noqa: BLE001 - a torch without it, or a source it does not cover: nothing declared
        log.debug("gears: could not read shapes_spec for %s", source, exc_info=True)
        return []
    return list(leaf) if isinstance(leaf, TensorSpec) else []


def _is_shape_var(var) -> bool:
    try:
        from torch.fx.experimental.dynamic_spec import ShapeVar
    except ImportError:
        return False
    return isinstance(var, ShapeVar)
