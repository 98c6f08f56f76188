"""Executors: turn a static (or symbolic) graph into a callable.

``build_executable`` is the seam between the optimizer and the kernel backends:
``config.exec.kernels = "aten"`` generates straight-line Python calling ATen kernels,
``"inductor"`` hands the graph to Inductor; graphs with stream scopes (or, with
``config.exec.auto_streams``, graphs with independent branches) go to the stream scheduler:
`streams.plan_streams` decides where streams synchronise, `stream_cpu` / `stream_cuda` run it.

The rules for when a graph runs on one stream: `build`.

Where things are: `build.py` (`build_executable`, the choice above, and `stream_plan_for`); the executors
`codegen.py` (straight-line ATen code), `inductor.py` (Inductor per graph) and the stream scheduler
(`streams.py`, `stream_cpu.py`, `stream_cuda.py`, `workers.py`, `auto_streams.py`, `stream_choice.py`);
execution plans (`program.py`: `PlannedProgram`, one per compiled function; `plan.py`, `observe.py`,
`memory.py`, `planned.py`); CUDA (`cuda_graphs.py`, `hot_swap.py`); `layouts.py` and
`direct.py` (`direct_call`: inference graphs without AOTAutograd's per-call wrapper).
"""
from __future__ import annotations

from .build import DYNAMIC_MULTI_STREAM_ENV, build_executable, stream_plan_for, stream_timeout_asked
from .codegen import compile_graph_to_python
from .direct import direct_call
from .program import PlannedProgram, program_for

__all__ = ["build_executable", "compile_graph_to_python", "stream_plan_for", "PlannedProgram",
           "direct_call", "program_for"]
