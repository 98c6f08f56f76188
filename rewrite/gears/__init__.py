"""Dynamic-shape gears: a symbolic graph becomes one static graph per allowed shape.

``set_dim_gears`` (spec) declares gears on inputs; ``collect_gear_specs`` merges them when a graph
is compiled; ``compile_dynamic`` (compile) substitutes each gear into the optimized symbolic graph
(``trace_conflicts`` says which gears the trace can serve) and builds a dispatcher (dispatch) that
picks the static graph by input shape, with optional padding (padding) for shapes between gears, or padding
and splitting by the gears' measured latency (fit), and, with ``padded_tokens="skip"``, each call's rows run in
groups cut to their own length (regroup; ``group_shapes`` gives the group shapes to plan gears on).
``size_oblivious`` owns the torch flag ``set_dim_gears`` turns on until the geared graph first runs.
Which gears to declare: ``recording`` (traffic) counts the sizes compiled functions are called with, and
``plan_gears`` (planner) picks the gears that serve that traffic with the least padded work;
``plan_gear_axes`` (plan_axes) picks batch and sequence gears together under one budget of gear pairs (a grid),
``plan_gear_pairs`` any (batch, sequence) pairs.
"""
from __future__ import annotations

from .compile import bind_gears, compile_dynamic, concretize, trace_conflicts
from .dispatch import GearDispatcher
from .plan_axes import AxesPlan, PairsPlan, plan_gear_axes, plan_gear_pairs
from .regroup import group_shapes
from .planner import GearPlan, evaluate_gears, measure_latency, plan_gears, power_of_two_ladder
from .traffic import Recording, Stream, recording
from .spec import (MAX_GEARS, GearError, GearSpec, OutsideDeclaredRange, collect_gear_specs, get_dim_gears,
                   merge_gears, restore_size_oblivious, set_dim_gears, size_oblivious)

__all__ = ["set_dim_gears", "get_dim_gears", "collect_gear_specs", "compile_dynamic", "merge_gears", "bind_gears",
           "concretize", "trace_conflicts", "GearDispatcher", "GearError", "OutsideDeclaredRange", "GearSpec", "MAX_GEARS",
           "size_oblivious", "restore_size_oblivious", "plan_gears", "evaluate_gears", "measure_latency",
           "power_of_two_ladder", "GearPlan", "plan_gear_axes", "AxesPlan", "plan_gear_pairs", "PairsPlan", "group_shapes", "recording",
           "Recording", "Stream"]
