"""CPU multi-stream executor: one generated Python function per stream, side streams on worker threads.

The default stream is the caller's thread; each other stream runs on a worker leased from
`workers.pool` for the call. Each worker runs on its share of torch's intra-op threads
(``torch.get_num_threads() // streams`` unless ``config.exec.stream_intra_op_threads`` says
otherwise), set once when the worker starts. The caller's thread keeps its own count:
``torch.set_num_threads`` also sets the count every thread started later begins with, so setting
it per call in the caller made threads started during a call keep the share for good, and
Dynamo, which guards on the count, recompiled every function those threads called. Code is
generated per stream (like `codegen`, straight-line calls of
ATen kernels), with synchronisation only where the `StreamPlan` asks for it:

* a value read by another stream is stored in a per-call slot list ``X`` and announced by setting
  a ``threading.Event`` in ``E``; the reader blocks on the event (no busy waiting);
* wait edges are events without a value.

Memory: a value that crosses streams stays in its slot until the call returns (a value read only
on its own stream is dropped after its last reader, as in `codegen`); on CPU nothing else can
reuse its memory early, so there is no cross-thread use-after-free to guard against.

A failure on any stream is recorded in the call's `_Frame`, wakes every waiting stream (they stop
with `_Aborted`), and is re-raised in the caller once every worker has finished. A wait that takes
longer than ``config.exec.stream_timeout_s`` fails the call the same way instead of hanging, at once:
the caller does not wait a second timeout for the stuck worker, which is abandoned (it leaves the
pool when its op returns, see `workers`). In the default mode a graph whose scopes could run on one
stream keeps these threads when a timeout is set (`rewrite.exec.build_executable`): only they watch.
"""
from __future__ import annotations

import linecache
import logging
import threading
from typing import Callable

import torch

from ..ir import Graph, Node
from .codegen import Emitter, compile_graph_to_python, safe_name
from .streams import StreamPlan
from .workers import pool

log = logging.getLogger("rewrite")

__all__ = ["compile_cpu_streams", "StreamTimeoutError"]


class StreamTimeoutError(RuntimeError):
    """A stream waited longer than ``config.exec.stream_timeout_s`` for another stream."""


class _Aborted(Exception):
    """Raised in a stream when another stream of the same call failed."""


class _Frame:
    """The shared state of one call: its events, its first error, and the workers still running."""

    __slots__ = ("events", "error", "lock", "pending", "all_done", "timeout", "graph_name", "abandoned")

    def __init__(self, num_events: int, workers: int, timeout: float, graph_name: str):
        self.events = [threading.Event() for _ in range(num_events)]
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self.pending = workers
        self.all_done = threading.Event()
        self.timeout = timeout
        self.graph_name = graph_name
        self.abandoned = False  # the caller stopped waiting for the workers still running (a timeout)

    def wait(self, index: int, what: str) -> None:
        if not self.events[index].wait(self.timeout):
            self.fail(StreamTimeoutError(
                f"graph {self.graph_name}: waited more than {self.timeout} s for {what} "
                "(config.exec.stream_timeout_s); a stream is stuck"))
        if self.error is not None:
            raise _Aborted

    def fail(self, exc: BaseException) -> None:
        with self.lock:
            if self.error is None and not isinstance(exc, _Aborted):
                self.error = exc
        for e in self.events:
            e.set()

    def worker_done(self) -> None:
        with self.lock:
            self.pending -= 1
            last = self.pending == 0
        if last:
            self.all_done.set()

    def join(self) -> None:
        # A stream timed out already: a stuck worker is why, so waiting for it again would double the
        # time the caller waits beyond the timeout it asked for.
        timed_out = isinstance(self.error, StreamTimeoutError)
        if self.pending and (timed_out or not self.all_done.wait(self.timeout)):
            with self.lock:
                self.abandoned = bool(self.pending)
            if not timed_out:
                raise StreamTimeoutError(f"graph {self.graph_name}: stream workers did not finish within "
                                         f"{self.timeout} s (config.exec.stream_timeout_s)")
        if self.error is not None:
            raise self.error

    def is_abandoned(self) -> bool:
        with self.lock:
            return self.abandoned


def _run_side_stream(fn, frame: _Frame, slots: list, inputs: tuple) -> None:
    try:
        fn(frame, slots, *inputs)
    except _Aborted:
        pass
    except BaseException as e:  # handed to the caller by frame.join()
        frame.fail(e)


class _StreamEmitter:
    """Generates the per-stream functions of a `StreamPlan`."""

    def __init__(self, plan: StreamPlan, subgraph_compiler: Callable[[Graph], Callable]):
        self.plan = plan
        self.em = Emitter(plan.graph, subgraph_compiler)
        g = plan.graph
        self.params = [f"a{i}" for i in range(len(g.placeholders))]
        self.base_names = {p.id: f"a{i}" for i, p in enumerate(g.placeholders)}
        for n in g.nodes:
            if n.kind == "constant":
                self.base_names[n.id] = self.em.render(n.value)
        self.slot = {nid: i for i, nid in enumerate(sorted(plan.crossing))}
        self.event = {nid: i for i, nid in enumerate(sorted(plan.signalled))}
        self.num_events = len(self.event)

    def _names_for(self, stream: int) -> dict:
        names = dict(self.base_names)
        for n in self.plan.order:
            if self.plan.stream_of[n.id] == stream:
                names[n.id] = f"v{n.id}"
            elif n.id in self.slot:
                names[n.id] = f"X[{self.slot[n.id]}]"
        return names

    def _wait_line(self, p: Node, consumer: str) -> str:
        what = f"%{p.name} (stream {self.plan.tag(p)}) before {consumer}"
        return f"W({self.event[p.id]}, {what!r})"

    def body(self, stream: int) -> list:
        """Lines computing this stream's nodes, with their waits and announcements."""
        plan, em = self.plan, self.em
        em.names = self._names_for(stream)
        nodes = plan.nodes_of(stream)
        last_use: dict[int, int] = {}
        for idx, n in enumerate(nodes):
            for i in n.inputs:
                last_use[i.id] = idx
        if stream == 0:  # the outputs are read after the last node
            for i in plan.graph.output.inputs:
                last_use[i.id] = len(nodes)
        lines = []
        for idx, n in enumerate(nodes):
            for p in plan.waits_before.get(n.id, ()):
                lines.append(self._wait_line(p, f"%{n.name}"))
            var = em.names[n.id]
            lines.append(f"{var} = {em.call_expr(n)}")
            if n.id in self.slot:
                lines.append(f"X[{self.slot[n.id]}] = {var}")
            if n.id in self.event:
                lines.append(f"E[{self.event[n.id]}].set()")
            dead = [i for i in n.inputs if last_use.get(i.id) == idx and plan.stream_of.get(i.id) == stream]
            if dead:
                lines.append("del " + ", ".join(em.names[i.id] for i in dead))
        return lines

    def side_function(self, stream: int, fname: str) -> str:
        lines = ["E = F.events", "W = F.wait"] + self.body(stream) + ["return None"]
        return f"def {fname}(F, X, {', '.join(self.params)}):\n" + "".join(f"    {ln}\n" for ln in lines)

    def main_function(self, fname: str, side_names: list) -> str:
        plan, em = self.plan, self.em
        body = ["E = F.events", "W = F.wait"] + self.body(0)
        for p in plan.output_waits:
            body.append(self._wait_line(p, "returning"))
        em.names = self._names_for(0)
        body.append(f"R = {em.render(plan.graph.outputs)}")
        inputs = "(" + "".join(f"{a}, " for a in self.params) + ")"
        lines = [
            f"F = _Frame({self.num_events}, {len(side_names)}, _timeout, {plan.graph.name!r})",
            f"X = [None] * {len(self.slot)}",
            f"_launch(F, X, {inputs})",
            "try:",
            *[f"    {ln}" for ln in body],
            "except BaseException as exc:",
            "    F.fail(exc)",
            "F.join()",
            "return R",
        ]
        return f"def {fname}({', '.join(self.params)}):\n" + "".join(f"    {ln}\n" for ln in lines)


_counter = [0]


def compile_cpu_streams(plan: StreamPlan, timeout: float, intra_op_threads: int,
                        subgraph_compiler: Callable[[Graph], Callable] | None = None) -> Callable:
    """A callable running ``plan`` with one thread per stream."""
    se = _StreamEmitter(plan, subgraph_compiler or compile_graph_to_python)
    base = safe_name(plan.graph.name)
    side = [(i, f"{base}_stream{i}") for i in range(1, len(plan.streams))]
    src = "".join(se.side_function(i, name) + "\n" for i, name in side)
    src += se.main_function(base, [name for _, name in side])
    glb = se.em.globals
    glb.update(_Frame=_Frame, _timeout=float(timeout))

    _counter[0] += 1
    filename = f"<rewrite-streams-{_counter[0]}-{base}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    exec(compile(src, filename, "exec"), glb)
    side_fns = [glb[name] for _, name in side]

    def launch(frame: _Frame, slots: list, inputs: tuple) -> None:
        workers = pool.lease(len(side_fns))
        for w, fn in zip(workers, side_fns):
            w.submit(_run_side_stream, (fn, frame, slots, inputs), frame.worker_done, intra_op_threads,
                     frame.is_abandoned)

    glb["_launch"] = launch
    fn = glb[base]
    fn.__rewrite_source__ = src
    fn.__rewrite_plan__ = plan
    return fn
