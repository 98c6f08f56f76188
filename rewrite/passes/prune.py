"""Pruning: only what reaches an output or has a side effect survives.

The work is the IR's own (`Graph.prune`, which the other passes call after they replaced nodes too);
this is its place in the schedule's sweep, counted as ``prune``.
"""
from __future__ import annotations

from .pass_type import Pass, Step

__all__ = ["PRUNE"]


def _run(step: Step) -> dict:
    return {"prune": step.graph.prune()}


PRUNE = Pass("prune", "prune", _run, "only what reaches an output or has a side effect survives")
