"""Executors: turn a static (or symbolic) graph into a callable.

``build_executable`` is the seam between the optimizer and the kernel backends:
``config.exec.kernels = "aten"`` generates straight-line Python calling ATen kernels,
``"inductor"`` hands the graph to Inductor; graphs with stream scopes go to the stream scheduler.
"""
from __future__ import annotations

from ..ir import Graph
from .codegen import compile_graph_to_python

__all__ = ["build_executable", "check_config", "compile_graph_to_python"]


def check_config(config) -> None:
    """Reject option combinations that conflict, before any work is done."""


def build_executable(graph: Graph, config, report=None):
    """Compile ``graph`` for execution with the kernel backend ``config.exec.kernels`` selects."""
    if config.exec.kernels == "inductor":
        from .inductor import compile_with_inductor

        return compile_with_inductor(graph)
    return compile_graph_to_python(graph)
