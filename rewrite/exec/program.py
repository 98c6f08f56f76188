"""Execution plans: what the gears of one compiled function share, and how each gets its plan.

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

The default mode tiers up instead (`rewrite.policy`, ``config.exec.tier_up_calls``): a static CPU graph
runs its ATen code for its first calls, so a graph called once or twice never pays for a C
compile, and the call after them plans it on that call's inputs and builds its static kernels
(into the per-user cache's ``kernels/`` unless the build dir is configured, `rewrite.kernels.build_dir`), as reduce-overhead
does at compile time. That call never waits long for another process's build: when the build lock is
busy it runs the ATen code and tries again later (`PlannedProgram.tier_up`); other threads calling
meanwhile run the ATen code instead of waiting for the tier-up. Whatever stands in the way (no C
compiler, an unwritable cache folder, one another user could write into (also a warning), several
processes without LOCAL_WORLD_SIZE) leaves the plan without kernels or the graph on its
ATen code, with a note, never an error. Graphs whose extra observed run would show outside them
(random draws, side effects) stay on their ATen code; collectives do not communicate in that run
(`observe._local_stand_in`), so graphs of tensor-parallel models tier up too.
"""
from __future__ import annotations

import logging
import threading

import torch

from .. import ops
from ..ir import Graph, Node, TensorMeta, is_side_effect, iter_metas
from ..unit import CompileUnit
from .memory import ArenaPool, PoolMemory
from .observe import observe, synthesize_inputs
from .plan import describe, make_plan, mutated_inputs, out_variant, unplannable, written_args
from .planned import PlannedExecutable

log = logging.getLogger("rewrite")

__all__ = ["PlannedProgram", "device_of", "program_for"]


def device_of(graph: Graph) -> torch.device:
    """The graph's device: CUDA if any value lives there, else CPU."""
    for n in graph.nodes:
        for m in iter_metas(n.meta):
            if isinstance(m, TensorMeta) and m.device.type == "cuda":
                return m.device
    return torch.device("cpu")


def program_for(unit: CompileUnit) -> "PlannedProgram | None":
    """The `PlannedProgram` of one compiled function when its policy plans graphs (reduce-overhead, or
    the default mode's tier-up); None: its graphs run as built."""
    return PlannedProgram(unit) if unit.policy.planned else None


def _seen_outside(graph: Graph) -> str | None:
    """What makes one more run of ``graph`` visible outside it (None: nothing). Tiering up observes a
    run on the caller's inputs, so such graphs keep their ATen code: random draws would advance the
    generator, side effects would happen twice. Collectives are made locally in that run.
    Writes to the graph's inputs are fine: the observed run writes to copies of them."""
    inputs = {p.id for p in graph.placeholders}
    for n in graph.nodes:
        if n.kind != "call":
            continue
        if ops.draws_random_numbers(n.target, n.args, n.kwargs):
            return f"%{n.name} ({n.op}) draws random numbers"
        if ops.is_collective(n.target):
            continue  # the observed run makes its result locally (observe._local_stand_in); the plan calls it every call
        written = written_args(n)
        writes_inputs_only = bool(written) and all(isinstance(v, Node) and v.id in inputs for v in written)
        if is_side_effect(n) and not writes_inputs_only:
            return f"%{n.name} ({n.op}) has effects outside the graph"
    return None


class _Gear:
    """One static graph's callable on CPU; its executable is made once kernels are bound (or on first call).

    ``cold_calls``: calls that run the plain code before the gear is planned (the default mode's tier-up).
    """

    def __init__(self, program: "PlannedProgram", graph: Graph, fallback, cold_calls: int = 0):
        self.program = program
        self.graph = graph
        self.fallback = fallback
        self.plan = None
        self.run = None  # the executable, once made
        self.cold_calls = cold_calls
        self.put_off = 0  # tier-ups put off because another process held the build lock

    def __call__(self, *args):
        run = self.run
        if run is not None:
            return run(*args)
        if self.cold_calls > 0:
            self.cold_calls -= 1  # not atomic: concurrent callers may run a few more cold calls, never fewer
            if self.put_off:
                self.program.unit.ledger.slow(
                    "tier_up_pending", f"graph {self.graph.name}: its static-kernel build waits for another "
                    "process's lock; the call ran its ATen code", "give each process its own build folder, or set "
                    "LOCAL_WORLD_SIZE so one builds for all")
            return self.fallback(*args)
        return self._first_call(args)

    def _first_call(self, args):
        if self.program.policy.tiers_up:
            # The tier-up runs on the model caller's call: a caller that finds another thread tiering
            # up (planning, building) runs the ATen code now rather than wait for it.
            if not self.program.lock.acquire(blocking=False):
                return self.fallback(*args)
            try:
                if self.run is None:
                    self.program.tier_up(self, args)
            finally:
                self.program.lock.release()
            return (self.run or self.fallback)(*args)  # None: the tier-up is put off (`PlannedProgram.tier_up`)
        with self.program.lock:  # gears of one function share their kernels' build
            if self.run is None:
                self._plan_on(args)
                self.program.materialize([self])
        return self.run(*args)

    def _plan_on(self, args) -> None:
        if self.plan is None:  # not observed at compile time: observe this call's inputs,
            mutated = set(mutated_inputs(self.graph))  # copies of those the graph writes to
            self.program.observe(self, [a.clone() if k in mutated else a for k, a in enumerate(args)])


class PlannedProgram:
    """The shared state of one compiled function's gears under a policy that plans them (``unit.policy``:
    reduce-overhead plans them when they are built, the default mode when they tier up)."""

    def __init__(self, unit: CompileUnit):
        self.unit = unit
        self.config = unit.config
        self.policy = unit.policy
        self.pool = ArenaPool("cpu")
        self.gears: list[_Gear] = []
        self.kernels = None  # rewrite.kernels.StaticKernels, made on the first CPU gear
        self.cuda = None  # cuda_graphs.CudaGraphs, made on the first CUDA gear
        self.memory: PoolMemory | None = None  # the CPU arena's prediction and size (CUDA: self.cuda.memory)
        self.static_kernels = self.policy.static_kernels  # turned off when a tier-up cannot have them
        self.lock = threading.Lock()

    def executable(self, graph: Graph, fn, plannable: bool):
        """The callable of static graph ``graph`` (one gear), given the callable ``fn`` built for it."""
        if self.policy.tiers_up:
            return self._tiered(graph, fn, plannable)
        device = device_of(graph)
        if device.type == "cuda" and graph.is_static():
            return self._cuda_graphs(device).wrap(graph, fn)
        if not plannable or not graph.is_static():
            self.note(f"reduce-overhead: graph {graph.name} keeps its executor's own memory management "
                      "(multi-stream, Inductor or dynamic shapes)")
            return fn
        why = unplannable(graph)
        if why is not None:
            self.note(f"reduce-overhead: graph {graph.name} runs unplanned: {why}")
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

    def _tiered(self, graph: Graph, fn, plannable: bool):
        device = device_of(graph)
        if not plannable or not graph.is_static():
            return fn
        if device.type == "cuda":
            return self._tiered_cuda(graph, fn, device)
        if device.type != "cpu":
            return fn
        why = unplannable(graph) or _seen_outside(graph)
        if why is not None:
            log.debug("graph %s does not tier up: %s", graph.name, why)
            return self.unit.ledger.on_first_call(
                fn, "tier_up_refused", f"graph {graph.name} keeps its ATen code: {why}",
                "keep random draws and side effects out of the compiled region (or accept ATen speed for it)")
        gear = _Gear(self, graph, fn, cold_calls=self.policy.tier_up_calls)
        self.gears.append(gear)
        return gear

    def _tiered_cuda(self, graph: Graph, fn, device: torch.device):
        """The default mode's tier-up on CUDA: the ATen code serves the first calls; the next builds
        Inductor's kernels for the gear on the caller's thread, and from then on the gear runs as a
        CUDA graph in the function's shared pool (`hot_swap`, `cuda_graphs`)."""
        from .hot_swap import HotSwapGear

        graphs = self._cuda_graphs(device)
        graphs.reserve(graph)
        if self.policy.hot_kernels_on("cuda") == "inductor":
            def build():
                from .inductor import compile_with_inductor

                return graphs.wrap(graph, compile_with_inductor(graph))
        else:
            def build():
                return graphs.wrap(graph, fn)
        return HotSwapGear(graph.name, fn, build, self.policy.tier_up_calls, self.note, self.unit.ledger)

    def tier_up(self, gear: _Gear, args) -> None:
        """Plan ``gear`` on this call's inputs and build its static kernels; on failure it keeps its ATen code.

        Another process building into the same folder does not hold this call up for more than
        `rewrite.kernels.build_folder.TIER_UP_LOCK_WAIT_S`: the gear keeps its ATen code (``gear.run`` stays
        None) and tries again after another ``tier_up_calls`` calls; once the lock has been busy for
        `rewrite.kernels.build_folder.LOCK_WAIT_S` the build goes ahead without it."""
        from ..kernels import LockBusy

        try:
            gear._plan_on(args)
            self.materialize([gear])
            self.note(f"graph {gear.graph.name} tiered up after {self.policy.tier_up_calls} calls: planned memory, "
                      f"{sum(p.kind == 'native' for p in gear.plan.nodes.values())} ops on static kernels")
        except LockBusy as e:
            gear.cold_calls = max(self.policy.tier_up_calls, 1)
            if not gear.put_off:  # one note per gear, not one per try
                self.note(f"graph {gear.graph.name} keeps its ATen code for now: {e}; it tries again after "
                          f"{gear.cold_calls} calls")
            gear.put_off += 1
        except Exception as e:  # noqa: BLE001 - the plain code is always correct; say why it stays
            why = f"graph {gear.graph.name} keeps its ATen code: tiering up failed ({type(e).__name__}: {e})"
            self.note(why)
            gear.run = gear.fallback
            self.unit.ledger.slow("tier_up_refused", why, "see the note's error; the graph's plain code runs meanwhile")

    def _cuda_graphs(self, device: torch.device):
        if self.cuda is None:
            from .cuda_graphs import CudaGraphs

            self.cuda = CudaGraphs(device, self.config.debug.aclgraph.static_capture_size_limit, self.unit.weights,
                                   self.unit.report, self.unit.ledger)
        return self.cuda

    def _static_kernels(self):
        if self.kernels is None and self.static_kernels:
            from ..kernels import StaticKernelError, StaticKernels, UntrustedBuildDir

            try:
                self.kernels = StaticKernels(self.config, self.unit)
            except (StaticKernelError, OSError) as e:
                if not self.policy.kernels_optional:
                    raise
                self.static_kernels = False  # plan memory only
                self.note(f"tier-up without static kernels: {e}")
                self.unit.ledger.slow("aten_fallbacks", f"tier-up without static kernels: {e}",
                                      "install a C compiler and give the per-user cache folder to this user alone")
                if isinstance(e, UntrustedBuildDir):  # never used silently: someone else may write there
                    log.warning("rewrite: tier-up without static kernels (memory plan only): %s", e)
        return self.kernels

    def observe(self, gear: _Gear, inputs: list) -> None:
        """Run ``gear``'s graph on ``inputs`` once and plan it from what was observed."""
        graph = gear.graph
        obs = observe(graph, inputs)
        kernels = self._static_kernels()
        gear.plan = make_plan(graph, obs, "cpu", native=kernels.decide if kernels is not None else None,
                              fuse=kernels.fuse if kernels is not None else None)
        if kernels is not None and self.policy.records_signatures:
            kernels.record(graph, obs, gear.plan)
        self.note(describe(gear.plan))

    def finalize(self) -> None:
        """Build the static kernels of every planned gear at once and make their executables."""
        self.materialize([g for g in self.gears if g.plan is not None and g.run is None])

    def materialize(self, gears: list) -> None:
        if not gears:
            return
        if self.kernels is not None:
            self.kernels.build({p.kernel for g in gears for p in g.plan.nodes.values() if p.kind == "native"})
        for gear in gears:
            gear.run = PlannedExecutable(gear.graph, gear.plan, self.pool, self.kernels, gear.fallback,
                                         self.unit.ledger)
        if self.memory is not None:
            self.memory.allocated = self.pool.nbytes  # the arena every gear planned so far draws from

    def predict_memory(self, graphs: list[Graph]) -> None:
        """The gears' shared memory, predicted from their metas now that all are made and none is built."""
        static = [g for g in graphs if g.is_static()]
        if not static:
            return
        device = device_of(static[0])
        if device.type == "cuda":
            self._cuda_graphs(device).predict(static)
        elif device.type == "cpu":
            self.memory = PoolMemory.predicted_for(static, "CPU arena", self._in_arena)
            self.unit.report.memory = self.memory

    def _in_arena(self, graph: Graph, node: Node) -> bool:
        """Whether a plan can put ``node``'s value in the CPU arena (`rewrite.exec.plan`): what the caller gets is
        made per call, and so is the value of an op with neither an ``out=`` variant nor possibly a static kernel
        (a prepacked oneDNN linear on frozen weights, say)."""
        if any(v is node for v in graph.output.inputs):
            return False
        return self.static_kernels or out_variant(node.target, "cpu") is not None

    def is_tiering_gear(self, fn) -> bool:
        """Whether ``fn`` (from `executable`) is a gear that tiers up after its cold calls."""
        return isinstance(fn, _Gear) and self.policy.tiers_up

    def note(self, msg: str) -> None:
        """Log ``msg`` and add it to the compiled function's report."""
        self.unit.report.note(msg)
