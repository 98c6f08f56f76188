"""reduce-overhead mode: what the gears of one compiled function share, and how each gets its plan.

One `PlannedProgram` per compiled graph (Dynamo graph x AOT kind) holds what all its gears share:
on CPU the `ArenaPool` every gear's plan draws from and the static kernels when they are switched
on; on CUDA the graph pool, capture stream and capture count (`cuda_graphs`). ``build_executable``
hands it each static graph (each gear) with the callable it built (`executable`):

* CPU, straight-line ATen code: the graph is planned (`plan`): one run on inputs made from the
  graph's metas is observed, memory and kernels are planned, and the callable follows the plan;
  `finalize()` (after the last gear) builds or finds the static kernels of every gear at once and
  generates each gear's code;
* CUDA: the callable (ATen code, the stream executor, or Inductor's Triton kernels when static
  kernels are on) is captured in a CUDA graph after a warm-up call;
* CPU multi-stream or Inductor callables keep their own memory management (the report says so).

A graph whose run cannot be observed at compile time (an op that refuses zeros, say) is planned at
its first call, on the caller's inputs. A graph that cannot be planned (it writes to an
intermediate) runs its plain code; the report says so.
"""
from __future__ import annotations

import logging
import threading

import torch

from ..ir import Graph, TensorMeta, iter_metas
from ..unit import CompileUnit
from .memory import ArenaPool
from .observe import observe, synthesize_inputs
from .plan import describe, make_plan, mutated_inputs, unplannable
from .planned import PlannedExecutable

log = logging.getLogger("rewrite")

__all__ = ["PlannedProgram", "REDUCE_OVERHEAD_MODES", "device_of"]

REDUCE_OVERHEAD_MODES = ("reduce-overhead", "npugraph_ex")


def device_of(graph: Graph) -> torch.device:
    """The graph's device: CUDA if any value lives there, else CPU."""
    for n in graph.nodes:
        for m in iter_metas(n.meta):
            if isinstance(m, TensorMeta) and m.device.type == "cuda":
                return m.device
    return torch.device("cpu")


class _Gear:
    """One static graph's callable on CPU; its executable is made once kernels are bound (or on first call)."""

    def __init__(self, program: "PlannedProgram", graph: Graph, fallback):
        self.program = program
        self.graph = graph
        self.fallback = fallback
        self.plan = None
        self.run = None  # the executable, once made
        self._lock = threading.Lock()

    def __call__(self, *args):
        run = self.run
        if run is None:
            return self._first_call(args)
        return run(*args)

    def _first_call(self, args):
        with self._lock:
            if self.run is None:
                if self.plan is None:  # could not observe at compile time: observe this call's inputs,
                    mutated = set(mutated_inputs(self.graph))  # copies of those the graph writes to
                    self.program.observe(self, [a.clone() if k in mutated else a for k, a in enumerate(args)])
                self.program.materialize([self])
        return self.run(*args)


class PlannedProgram:
    """The shared state of one compiled function's gears in reduce-overhead mode."""

    def __init__(self, unit: CompileUnit):
        self.unit = unit
        self.config = unit.config
        self.pool = ArenaPool("cpu")
        self.gears: list[_Gear] = []
        self.kernels = None  # rewrite.kernels.StaticKernels, made on the first CPU gear
        self.cuda = None  # cuda_graphs.CudaGraphs, made on the first CUDA gear
        self.static_kernels = bool(self.config.experimental_config.aclgraph._aclnn_static_shape_kernel)

    def wants_inductor(self, graph: Graph) -> bool:
        """CUDA static kernels are Inductor's Triton kernels, compiled per gear with its sizes."""
        return self.static_kernels and device_of(graph).type == "cuda"

    def executable(self, graph: Graph, fn, plannable: bool):
        """The callable of static graph ``graph`` (one gear), given the callable ``fn`` built for it."""
        device = device_of(graph)
        if device.type == "cuda":
            return self._cuda_graphs(device).wrap(graph, fn)
        if not plannable or not graph.is_static():
            self._note(f"reduce-overhead: graph {graph.name} keeps its executor's own memory management "
                       "(multi-stream, Inductor or dynamic shapes)")
            return fn
        why = unplannable(graph)
        if why is not None:
            self._note(f"reduce-overhead: graph {graph.name} runs unplanned: {why}")
            return fn
        gear = _Gear(self, graph, fn)
        try:
            inputs = synthesize_inputs(graph)
            self.observe(gear, inputs)
        except Exception as e:  # noqa: BLE001 - any failure only moves planning to the first call
            log.info("reduce-overhead: graph %s is planned at its first call: its run on example inputs failed "
                     "(%s: %s)", graph.name, type(e).__name__, e)
        self.gears.append(gear)
        return gear

    def _cuda_graphs(self, device: torch.device):
        if self.cuda is None:
            from .cuda_graphs import CudaGraphs

            self.cuda = CudaGraphs(device, self.config.debug.aclgraph.static_capture_size_limit, self.unit.weights)
        return self.cuda

    def _static_kernels(self):
        if self.kernels is None and self.static_kernels:
            from ..kernels import StaticKernels

            self.kernels = StaticKernels(self.config, self.unit)
        return self.kernels

    def observe(self, gear: _Gear, inputs: list) -> None:
        """Run ``gear``'s graph on ``inputs`` once and plan it from what was observed."""
        graph = gear.graph
        obs = observe(graph, inputs)
        kernels = self._static_kernels()
        gear.plan = make_plan(graph, obs, "cpu", native=kernels.decide if kernels is not None else None)
        if kernels is not None:
            kernels.record(graph, obs, gear.plan)
        self._note(describe(gear.plan))

    def finalize(self) -> None:
        """Build the static kernels of every planned gear at once and make their executables."""
        self.materialize([g for g in self.gears if g.plan is not None and g.run is None])

    def materialize(self, gears: list) -> None:
        if not gears:
            return
        if self.kernels is not None:
            self.kernels.build()
        for gear in gears:
            gear.run = PlannedExecutable(gear.graph, gear.plan, self.pool, self.kernels, gear.fallback)

    def _note(self, msg: str) -> None:
        log.info("%s", msg)
        if self.unit.report is not None:
            self.unit.report.notes.append(msg)
