"""reduce-overhead on CUDA: one CUDA graph per gear, captured after a warm-up call.

Per compiled function (`CudaGraphs`): one memory pool (``torch.cuda.graph_pool_handle``) that every
gear's graph allocates from, since only one gear runs per call (vLLM's shared cudagraph pool,
TorchAir's ``reuse_graph_pool_in_same_fx``); one capture stream (a shared pool needs the same
stream for every capture); and the count of captured shapes against
``config.debug.aclgraph.static_capture_size_limit`` (npugraph_ex's ``capture_limit``, default 64).
When the limit is reached, gears not captured yet run uncaptured, with one log line per gear;
gears captured before keep replaying (TorchAir instead runs every later call uncaptured).

Per gear (`CapturedGear`):

* the first call runs the executable as it is (warm-up: lazy initialisation, autotuning, library
  handles happen outside capture); the second call captures it on the capture stream;
* inputs are copied into static buffers the graph reads, except weights (parameters and buffers
  the backend identified), which the graph reads in place: a weight whose address changes makes the
  gear capture again (logged), rather than copying into memory the caller owns;
* inputs the graph mutates in place (``copy_`` into an input) are copied back after the replay;
* outputs live in the pool and the next replay overwrites them, so each call returns copies
  (the caller owns what it gets; TorchAir's ``clone_output=False`` default returns the pool's
  tensors instead);
* stream scopes are captured with the graph: the multi-stream executor forks its side streams
  from the current (capture) stream with events and joins them before returning, which is the
  fork/join pattern stream capture records.

Gears share the pool, so replays of one compiled function are serialised (a lock, and every
replay, with its input copies and output copies, is issued on the function's capture stream; the
caller's stream waits for it). A graph whose capture fails runs uncaptured, with a warning, and tries
again on its next calls (`MAX_FAILED_CAPTURES` in all). CI has no GPU; tests/test_cuda.py runs these
paths where there is one.
"""
from __future__ import annotations

import logging
import threading

import torch

from ..ir import Graph
from .plan import mutated_inputs
from .stream_cuda import record_stream

log = logging.getLogger("rewrite")

__all__ = ["CudaGraphs", "CapturedGear", "MAX_FAILED_CAPTURES"]

MAX_FAILED_CAPTURES = 3  # failed captures of one gear before it runs uncaptured for good


class CudaGraphs:
    """What the captured gears of one compiled function share: pool, capture stream, capture count."""

    def __init__(self, device: torch.device, limit: int, weights: tuple = ()):
        self.device = device
        self.limit = limit
        self.weights = frozenset(weights)
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device=device)
        self.captured = 0
        self.lock = threading.Lock()  # one capture or replay at a time: gears share the pool

    def wrap(self, graph: Graph, fn):
        return CapturedGear(self, graph, fn)

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


class CapturedGear:
    """One gear: warm-up, capture, then replays."""

    def __init__(self, graphs: CudaGraphs, graph: Graph, fn):
        self.graphs = graphs
        self.graph = graph
        self.fn = fn
        self.mutated = mutated_inputs(graph)
        self.calls = 0
        self.cuda_graph = None
        self.static_inputs: list = []
        self.static_outputs = None
        self.weight_ptrs: dict[int, int] = {}
        self.refused = False
        self.failed_captures = 0

    def __call__(self, *args):
        # Gears share the pool: one replay at a time per compiled function, all issued on its stream.
        with self.graphs.lock:
            self.calls += 1
            if self.cuda_graph is not None and not self._weights_moved(args):
                return self._replay(args)
            if self.calls == 1 or self.refused or not self._capture(args):
                return self.fn(*args)
            return self._replay(args)

    def _weights_moved(self, args) -> bool:
        for k, ptr in self.weight_ptrs.items():
            if args[k].data_ptr() != ptr:
                log.info("reduce-overhead: graph %s: weight input %d moved; capturing again", self.graph.name, k)
                self.cuda_graph = None
                return True
        return False

    def _capture(self, args) -> bool:
        g = self.graphs
        if self.cuda_graph is None and not self.weight_ptrs and g.captured >= g.limit:
            self.refused = True
            log.warning("reduce-overhead: static_capture_size_limit (capture_limit) %d reached: graph %s runs "
                        "uncaptured (config.debug.aclgraph.static_capture_size_limit)", g.limit, self.graph.name)
            return False
        statics, weights = [], {}
        for k, a in enumerate(args):
            if isinstance(a, torch.Tensor) and a.is_cuda and k in g.weights:
                statics.append(a)  # read in place; a new address means a new capture
                weights[k] = a.data_ptr()
            elif isinstance(a, torch.Tensor) and a.is_cuda:
                statics.append(a.clone())
            else:
                statics.append(a)
        cg = torch.cuda.CUDAGraph()
        g.stream.wait_stream(torch.cuda.current_stream(g.device))
        try:
            with torch.cuda.graph(cg, pool=g.pool, stream=g.stream, capture_error_mode="thread_local"):
                outputs = self.fn(*statics)
        except Exception as e:  # noqa: BLE001 - what cannot be captured still runs, uncaptured
            # Another thread's CUDA work can invalidate a capture (seen with concurrent callers on an H100), so a
            # graph tries again on later calls before it gives up.
            self.failed_captures += 1
            self.refused = self.failed_captures >= MAX_FAILED_CAPTURES
            log.warning("reduce-overhead: graph %s cannot be captured as a CUDA graph (%s: %s); it runs uncaptured%s",
                        self.graph.name, type(e).__name__, str(e).strip(),
                        "" if self.refused else " and tries again on its next call")
            g.recover_from_failed_capture()
            return False
        torch.cuda.current_stream(g.device).wait_stream(g.stream)
        if not self.weight_ptrs:
            g.captured += 1
        self.cuda_graph, self.static_inputs, self.static_outputs, self.weight_ptrs = cg, statics, outputs, weights
        log.info("reduce-overhead: graph %s captured (%d of at most %d captured shapes)", self.graph.name,
                 g.captured, g.limit)
        return True

    def _replay(self, args):
        g = self.graphs
        caller = torch.cuda.current_stream(g.device)
        g.stream.wait_stream(caller)  # the inputs were made on the caller's stream
        with torch.cuda.stream(g.stream):
            for k, (s, a) in enumerate(zip(self.static_inputs, args)):
                if isinstance(s, torch.Tensor) and k not in self.weight_ptrs:
                    s.copy_(a, non_blocking=True)
            self.cuda_graph.replay()
            for k in self.mutated:
                if k not in self.weight_ptrs:
                    args[k].copy_(self.static_inputs[k], non_blocking=True)
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
