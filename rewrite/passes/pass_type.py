"""`Pass` and `Step`: the one contract every pass of the schedule keeps.

A pass is a named value: ``run(step) -> {what: how many changes}``, in place on ``step.graph``. The
schedule (`rewrite.optimizer.SCHEDULE`) lists these values as they are, so what runs, what its report
counts, the timing bucket it is measured in and what `python -m rewrite rules` prints about it are one
value (tinygrad gives every stage one type and one applier: a stage is named, timed and listed for free).
Each pass module holds its pass's work as a function on the graph (what tests and other callers use) and
exports its `Pass` value, whose ``run`` reads from the step what that function needs.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable

from ..ir import Graph

if TYPE_CHECKING:
    from ..unit import CompileUnit

__all__ = ["Pass", "Step"]


@dataclasses.dataclass
class Step:
    """What a pass of the schedule sees: the graph it changes in place, the unit it belongs to, and the
    e-graph runs this unit is offered."""

    graph: Graph
    unit: CompileUnit
    runs: list  # (RuleSet, iterations) pairs: the saturation's, the user's and the policy's choice applied
    original: Graph  # the graph as `optimize` received it (the finishing passes compare the edges with it)
    rewritten: bool = False  # whether an e-graph run replaced the graph


@dataclasses.dataclass(frozen=True)
class Pass:
    """A hand-written pass: ``run(step) -> {what: how many changes}`` (counted in the unit's report)."""

    name: str
    stage: str  # the report's timing bucket
    run: Callable[[Step], dict]
    doc: str  # one line: what `python -m rewrite rules` says the pass does
