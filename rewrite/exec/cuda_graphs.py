"""Static CUDA graphs: one CUDA graph per gear, all gears of a function in one memory pool.

Per compiled function (`CudaGraphs`): one memory pool (``torch.cuda.graph_pool_handle``) that every
gear's graph allocates from, since only one gear runs per call (vLLM's shared cudagraph pool,
TorchAir's ``reuse_graph_pool_in_same_fx``); one capture stream (a shared pool needs the same
stream for every capture); one buffer per copied input, as large as the largest gear needs, that
every gear's graph reads a view of; and the count of captured shapes against
``config.debug.aclgraph.static_capture_size_limit`` (npugraph_ex's ``capture_limit``, default 64).
When the limit is reached, gears not captured yet run uncaptured, with one log line per gear;
gears captured before keep replaying (TorchAir instead runs every later call uncaptured).

When captures happen. The first call that reaches a gear that has no graph yet runs that gear as it
is (its result is the call's result, and the run is the gear's warm-up: lazy initialisation, the
first launch of Triton kernels, library handles happen outside capture), then captures it and every
other gear of the function that is ready, largest first, in the same call:

* largest first, so the smaller gears' graphs take their memory from what the largest one's graph
  freed inside the pool: all gears together hold about what the largest holds alone (`PoolMemory`,
  predicted from the graphs' metas before any capture and reported by ``rewrite.explain``);
* in one call, so a model that is called once before it serves concurrent callers captures every
  gear before they come. A capture needs the device quiet in one respect: ``cudaDeviceSynchronize``
  from any other thread invalidates it whatever the capture mode (so does a second capture), so
  captures of the whole process take turns (`_CAPTURE_LOCK`) and use ``thread_local`` mode (other
  threads may allocate). A capture that fails anyway runs the gear uncaptured and tries again on a
  later call (`MAX_FAILED_CAPTURES` in all).

The other gears are warmed up on inputs made from their metas (zeros) with this call's in-place
inputs; a gear whose extra run would show outside it (it writes to an input read in place, draws
random numbers) is captured at its own first call instead.

Per gear (`CapturedGear`):

* inputs are copied into the function's input buffers, except inputs read in place: the model's
  parameters and buffers and tensors marked with ``torch._dynamo.mark_static_address`` (a static KV
  cache); a new address of such an input makes that gear capture again (logged);
* inputs the graph mutates in place (``copy_`` into an input) are copied back after the replay;
* outputs live in the pool and the next replay overwrites them, so each call returns copies (the
  caller owns what it gets; TorchAir's ``clone_output=False`` default returns the pool's tensors);
* stream scopes are captured with the graph: the multi-stream executor forks its side streams
  from the current (capture) stream with events and joins them before returning, which is the
  fork/join pattern stream capture records.

Gears share the pool and the input buffers, so calls of one compiled function take turns (a lock,
and every replay, with its input and output copies, is issued on the function's stream; the caller's
stream waits for it). CI has no GPU; tests/test_cuda.py runs these paths where there is one.
"""
from __future__ import annotations

import logging
import threading

import torch

from .. import ops
from ..ir import Graph, TensorMeta
from .memory import PoolMemory, predict_peak_bytes
from .plan import mutated_inputs
from .stream_cuda import record_stream

log = logging.getLogger("rewrite")

__all__ = ["CudaGraphs", "CapturedGear", "PoolMemory", "MAX_FAILED_CAPTURES"]

MAX_FAILED_CAPTURES = 3  # failed captures of one gear before it runs uncaptured for good

# Captures of the whole process take turns: two at once, or one begun while another is under way,
# invalidate each other (`torch.cuda.graph` synchronizes the device when it begins a capture).
_CAPTURE_LOCK = threading.RLock()


def _pool_bytes(device: torch.device, pool) -> int:
    """Bytes of the allocator's segments that belong to ``pool`` (a graph pool handle)."""
    total = 0
    for seg in torch.cuda.memory_snapshot():
        if seg.get("device") == (device.index or 0) and tuple(seg.get("segment_pool_id", ())) == tuple(pool):
            total += int(seg.get("total_size", 0))
    return total


class CudaGraphs:
    """What the captured gears of one compiled function share: pool, stream, input buffers, capture count."""

    def __init__(self, device: torch.device, limit: int, in_place: tuple = (), report=None, ledger=None):
        self.device = device
        self.limit = limit
        self.in_place = frozenset(in_place)  # input indices read in place (weights, static addresses)
        self.report = report
        self.ledger = ledger  # rewrite.ledger.Ledger: calls that run uncaptured are slow paths
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device=device)
        self.captured = 0
        self.lock = threading.Lock()  # one call at a time: gears share the pool and the input buffers
        self.gears: list[CapturedGear] = []
        self.memory = PoolMemory("CUDA graph pool")
        if report is not None:
            report.memory = self.memory  # `rewrite.explain` shows it; filled in when the gears are captured
        self._buffers: dict[tuple[int, torch.dtype], torch.Tensor] = {}  # (input index, dtype) -> flat buffer

    def wrap(self, graph: Graph, fn) -> "CapturedGear":
        gear = CapturedGear(self, graph, fn)
        with self.lock:
            self.gears.append(gear)
        return gear

    def reserve(self, graph: Graph) -> None:
        """Count ``graph`` (a gear whose callable comes later: a tier-up) in the input buffers' sizes."""
        self._size_buffers([graph])

    # -- memory ---------------------------------------------------------------------------------------------
    def _size_buffers(self, graphs: list[Graph]) -> None:
        for graph in graphs:
            for k, p in enumerate(graph.placeholders):
                m = p.meta
                if k in self.in_place or not isinstance(m, TensorMeta) or not m.is_static() or m.device.type != "cuda":
                    continue
                key, numel = (k, m.dtype), int(m.numel())
                have = self._buffers.get(key)
                if have is None or have.numel() < numel:  # graphs captured before keep the old one alive
                    self._buffers[key] = torch.empty(max(numel, 1), dtype=m.dtype, device=self.device)
        self.memory.input_buffers = sum(b.numel() * b.element_size() for b in self._buffers.values())

    def static_input(self, k: int, like: torch.Tensor) -> torch.Tensor:
        """The view of the function's buffer for input ``k`` that a gear's graph reads (contiguous, ``like``'s shape)."""
        key = (k, like.dtype)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < like.numel():
            buf = self._buffers[key] = torch.empty(max(like.numel(), 1), dtype=like.dtype, device=self.device)
            self.memory.input_buffers = sum(b.numel() * b.element_size() for b in self._buffers.values())
        return buf[:like.numel()].view(like.shape)

    def predict(self, graphs: list[Graph]) -> None:
        """Predict the pool of these gears (all of the function's, made and not yet built) from their metas."""
        p = PoolMemory.predicted_for(graphs, self.memory.where)
        self.memory.gears, self.memory.largest, self.memory.predicted = p.gears, p.largest, p.predicted
        log.info("cuda graphs: %s", self.memory)

    # -- capture --------------------------------------------------------------------------------------------
    def capture_from(self, trigger: "CapturedGear", args) -> object:
        """Run ``trigger`` on this call's ``args`` (the call's result and its warm-up), then capture it and
        every other gear that is ready, largest first (see the module doc). Called under ``self.lock``."""
        out = trigger.fn(*args)
        if trigger.refused:
            return out
        with _CAPTURE_LOCK:
            todo = [trigger]
            examples = {id(trigger): list(args)}
            for g in self.gears:
                if g is trigger or g.cuda_graph is not None or g.refused or g.calls or not g.warm_on_examples:
                    continue
                inputs = g.example_inputs(args)
                if inputs is None:
                    continue
                try:
                    g.fn(*inputs)  # its warm-up, outside capture
                except Exception as e:  # noqa: BLE001 - that gear captures at its own first call instead
                    log.info("cuda graphs: gear %s is captured at its own first call: its run on example inputs "
                             "failed (%s: %s)", g.graph.name, type(e).__name__, e)
                    continue
                todo.append(g)
                examples[id(g)] = inputs
            if self.memory.allocated is None:
                self._size_buffers([g.graph for g in self.gears])
                if not self.memory.gears:  # gears built one by one (the default mode's tier-up): predicted now
                    self.predict([g.graph for g in self.gears if not g.refused])
            for g in sorted(todo, key=lambda g: -g.peak):
                g.capture(examples[id(g)])
            self.memory.allocated = _pool_bytes(self.device, self.pool)
        return out

    def recover_from_failed_capture(self) -> None:
        """Leave the device as it was before a capture that failed.

        ``torch.cuda.CUDAGraph.capture_end`` raises on an invalidated capture before it tells the
        allocator and the default random generator that capture is over (torch 2.11 on an H100): the
        pool keeps taking the capture stream's allocations, and every later random op on the device
        fails with "Offset increment outside graph capture encountered unexpectedly". So the failed
        pool and stream are left behind (later captures get new ones; graphs captured before keep
        replaying from theirs), and one tiny capture that succeeds ends the generator's capture state."""
        end_pool = getattr(torch._C, "_cuda_endAllocateToPool", None)
        if end_pool is not None:
            try:
                end_pool(self.device.index or 0, self.pool)
            except Exception:  # noqa: BLE001 - capture_end got that far itself
                pass
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device=self.device)
        try:
            repair, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream(device=self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.graph(repair, stream=stream):
                torch.zeros(1, device=self.device).add_(1)
            torch.cuda.current_stream(self.device).wait_stream(stream)
        except Exception as e:  # noqa: BLE001 - said, never raised: the failed graph itself still runs uncaptured
            log.warning("reduce-overhead: after a failed capture the device's random generator may still be in "
                        "capture mode (%s: %s): random ops on %s may fail", type(e).__name__, e, self.device)


def _shows_outside(graph: Graph, in_place: frozenset) -> bool:
    """Whether one more run of ``graph`` on example inputs would show outside it: it writes to an input
    that is read in place (a weight, a static KV cache) or draws random numbers."""
    if any(k in in_place for k in mutated_inputs(graph)):
        return True
    return any(n.kind == "call" and ops.draws_random_numbers(n.target, n.args, n.kwargs) for n in graph.nodes)


class CapturedGear:
    """One gear: its first call runs it and captures it; later calls replay."""

    def __init__(self, graphs: CudaGraphs, graph: Graph, fn):
        self.graphs = graphs
        self.graph = graph
        self.fn = fn
        self.mutated = mutated_inputs(graph)
        self.peak = predict_peak_bytes(graph)  # bytes its values take at most (the pool's prediction)
        self.warm_on_examples = not _shows_outside(graph, graphs.in_place)
        self.calls = 0
        self.cuda_graph = None
        self.static_inputs: list = []
        self.static_outputs = None
        self.in_place_ptrs: dict[int, int] = {}
        self._in_place_items: tuple = ()
        self._copied_in: tuple = ()
        self._copied_back: tuple = ()
        self.refused = False
        self.failed_captures = 0

    def __call__(self, *args):
        with self.graphs.lock:
            self.calls += 1
            if self.cuda_graph is not None and not self._in_place_moved(args):
                return self._replay(args)
            if self.refused:
                self._uncaptured("it cannot be captured (see the warning logged when it was refused)")
                return self.fn(*args)
            out = self.graphs.capture_from(self, args)
            if self.cuda_graph is None and self.calls > 1:
                self._uncaptured("its capture failed on this call; it tries again on the next")
            return out

    def _uncaptured(self, why: str) -> None:
        if self.graphs.ledger is not None:
            self.graphs.ledger.slow("uncaptured", f"graph {self.graph.name} ran without its CUDA graph: {why}",
                                    "raise config.debug.aclgraph.static_capture_size_limit if the limit was reached; "
                                    "keep other threads from synchronizing the device while a model captures")

    def example_inputs(self, args) -> list | None:
        """Inputs for a run of this gear made from its metas, with ``args``' in-place inputs (None: it has
        an input that cannot be made)."""
        out = []
        for k, p in enumerate(self.graph.placeholders):
            if k in self.graphs.in_place and k < len(args):
                out.append(args[k])
                continue
            m = p.meta
            if isinstance(m, TensorMeta) and m.is_static():
                out.append(torch.zeros([int(s) for s in m.shape], dtype=m.dtype, device=m.device))
            elif k < len(args) and not isinstance(args[k], torch.Tensor):
                out.append(args[k])
            else:
                return None
        return out

    def _in_place_moved(self, args) -> bool:
        for k, ptr in self._in_place_items:
            if args[k].data_ptr() != ptr:
                log.info("cuda graphs: graph %s: input %d read in place moved; capturing again", self.graph.name, k)
                self.cuda_graph = None
                return True
        return False

    def capture(self, args) -> bool:
        """Capture this gear on ``args`` (its warm-up ran already); False: it runs uncaptured for now."""
        g = self.graphs
        if not self.in_place_ptrs and g.captured >= g.limit:
            self.refused = True
            log.warning("reduce-overhead: static_capture_size_limit (capture_limit) %d reached: graph %s runs "
                        "uncaptured (config.debug.aclgraph.static_capture_size_limit)", g.limit, self.graph.name)
            return False
        statics, in_place = [], {}
        for k, a in enumerate(args):
            if isinstance(a, torch.Tensor) and a.is_cuda and k in g.in_place:
                statics.append(a)  # read in place; a new address means a new capture
                in_place[k] = a.data_ptr()
            elif isinstance(a, torch.Tensor) and a.is_cuda:
                s = g.static_input(k, a)
                s.copy_(a)
                statics.append(s)
            else:
                statics.append(a)
        cg = torch.cuda.CUDAGraph()
        g.stream.wait_stream(torch.cuda.current_stream(g.device))
        try:
            with torch.cuda.graph(cg, pool=g.pool, stream=g.stream, capture_error_mode="thread_local"):
                outputs = self.fn(*statics)
        except Exception as e:  # noqa: BLE001 - what cannot be captured still runs, uncaptured
            self.failed_captures += 1
            self.refused = self.failed_captures >= MAX_FAILED_CAPTURES
            log.warning("reduce-overhead: graph %s cannot be captured as a CUDA graph (%s: %s); it runs uncaptured%s",
                        self.graph.name, type(e).__name__, str(e).strip(),
                        "" if self.refused else " and tries again on its next call")
            g.recover_from_failed_capture()
            return False
        torch.cuda.current_stream(g.device).wait_stream(g.stream)
        if not self.in_place_ptrs:
            g.captured += 1
        self.cuda_graph, self.static_inputs, self.static_outputs, self.in_place_ptrs = cg, statics, outputs, in_place
        # What each replay does, worked out once: a decode step has a hundred weights and a few real inputs.
        self._in_place_items = tuple(in_place.items())
        self._copied_in = tuple((k, s) for k, s in enumerate(statics) if isinstance(s, torch.Tensor) and k not in in_place)
        self._copied_back = tuple((k, statics[k]) for k in self.mutated if k not in in_place)
        log.info("reduce-overhead: graph %s captured (%d of at most %d captured shapes)", self.graph.name,
                 g.captured, g.limit)
        return True

    def _replay(self, args):
        g = self.graphs
        caller = torch.cuda.current_stream(g.device)
        g.stream.wait_stream(caller)  # the inputs were made on the caller's stream
        with torch.cuda.stream(g.stream):
            for k, s in self._copied_in:
                s.copy_(args[k], non_blocking=True)
            self.cuda_graph.replay()
            for k, s in self._copied_back:
                args[k].copy_(s, non_blocking=True)
            # Copied on the graph's stream, before any later replay can overwrite the pool's outputs.
            out = _copy(self.static_outputs)
        caller.wait_stream(g.stream)
        record_stream(out, caller)  # made on the graph's stream, used on the caller's
        return out


def _copy(out):
    """Outputs the caller owns: the pool's tensors are overwritten by the next replay."""
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, (list, tuple)):
        return type(out)(_copy(o) for o in out)
    return out
