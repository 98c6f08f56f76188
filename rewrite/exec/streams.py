"""The stream plan: which stream runs each node, and where streams synchronise.

`plan_streams(graph)` is device independent; the CPU executor (`stream_cpu`) and the CUDA executor
(`stream_cuda`) both generate code from the same `StreamPlan`:

* the order: a topological order of the graph in which every wait edge counts as an
  edge too (`rewrite.waits`: a wait that closes a cycle is an error naming the nodes of the cycle);
* per node, its stream: ``node.stream`` (a tag) or the default stream (the caller's);
* per node, the events its stream waits on before running it: one for every input produced on
  another stream, every waited-for node on another stream and, around ops with side effects
  (in-place writes), the other streams' work before and after them, for a collective the previous
  collective issued on another stream (the ranks issue them in one order), minus the waits already
  implied by an earlier wait (tracked with vector clocks, so a stream never waits twice for what it knows).

Placeholders and constants belong to no stream: they exist before any stream starts.
"""
from __future__ import annotations

import dataclasses
import operator

from ..ir import Graph, Node, is_side_effect
from ..ops import is_collective, issues_collective
from ..waits import order_with_waits, resolve_waits

__all__ = ["StreamPlan", "plan_streams", "DEFAULT_STREAM"]

DEFAULT_STREAM = None  # the tag of the caller's stream


@dataclasses.dataclass
class StreamPlan:
    graph: Graph
    order: list  # the call nodes, in an order that respects data and wait edges
    streams: list  # stream tags; index 0 is the default stream (tag None)
    priorities: dict  # tag -> priority
    stream_of: dict  # node id -> stream index
    waits_before: dict  # node id -> [producer Node on another stream, ...] to wait for first
    signalled: set  # ids of nodes whose completion other streams wait for
    crossing: set  # ids of nodes whose value another stream reads
    output_waits: list  # producers on side streams the default stream waits for before returning

    @property
    def num_syncs(self) -> int:
        return sum(len(v) for v in self.waits_before.values()) + len(self.output_waits)

    def nodes_of(self, stream_index: int) -> list:
        return [n for n in self.order if self.stream_of[n.id] == stream_index]

    def describe(self) -> str:
        lines = [f"streams: {', '.join('default' if t is None else repr(t) for t in self.streams)}"]
        for n in self.order:
            for p in self.waits_before.get(n.id, ()):
                lines.append(f"  stream {self.tag(n)} waits for %{p.name} (stream {self.tag(p)}) before %{n.name}")
        for p in self.output_waits:
            lines.append(f"  default stream waits for %{p.name} (stream {self.tag(p)}) before returning")
        return "\n".join(lines)

    def tag(self, n: Node) -> str:
        t = self.streams[self.stream_of[n.id]]
        return "default" if t is None else repr(t)


def _follows_producer(n: Node) -> bool:
    """Ops that only pick a part of their input's result stay on the producer's stream."""
    return n.target is operator.getitem and isinstance(n.args[0], Node) and n.args[0].kind == "call"


def _barrier_waits(order: list, stream_of: dict) -> dict:
    """Ops with side effects (in-place writes such as the ``copy_`` of an input mutation) are
    barriers across streams: another stream may read the memory they write through a view the
    data edges do not show. A barrier waits for everything issued before it on every stream, and
    everything issued after it on other streams waits for it (the vector clocks drop the repeats).

    Functional collectives are effects of another kind: they write only the tensors they return, so
    they are no barriers (a collective on a side stream overlaps with the default stream's work,
    its ``wait_tensor`` blocking only its own stream). What they need is order: every rank must
    issue its collectives in the same order (a process group pairs the calls of the ranks by their
    sequence), so a collective waits for the previous one issued on another stream, and the ranks'
    threads cannot race them into another order.
    """
    out: dict[int, list] = {}
    last: dict[int, Node] = {}  # stream -> its latest node so far
    barrier: Node | None = None
    collective: Node | None = None  # the last collective issued (wait_tensor only waits: it is not one)
    for n in order:
        s = stream_of[n.id]
        deps = []
        if barrier is not None and stream_of[barrier.id] != s:
            deps.append(barrier)
        if issues_collective(n.target):
            if collective is not None and stream_of[collective.id] != s:
                deps.append(collective)
            collective = n
        elif is_side_effect(n) and not is_collective(n.target):  # wait_tensor only waits, on its own stream
            deps += [m for t, m in last.items() if t != s]
            barrier = n
        if deps:
            out[n.id] = deps
        last[s] = n
    return out


def plan_streams(graph: Graph, assign: dict | None = None) -> StreamPlan:
    """Build the stream plan of ``graph``. ``assign`` (node id -> tag) overrides ``node.stream``."""
    waits = resolve_waits(graph)
    order = [n for n in order_with_waits(graph, waits) if n.kind == "call"]
    streams: list = [DEFAULT_STREAM]
    priorities: dict = {}
    stream_of: dict[int, int] = {}
    for n in order:
        if _follows_producer(n) and n.args[0].id in stream_of:
            stream_of[n.id] = stream_of[n.args[0].id]
            continue
        tag = (assign or {}).get(n.id, n.stream)
        if tag is not None:
            tag = str(tag)
            priorities.setdefault(tag, int(n.attrs.get("stream_priority", 0)))
        if tag not in streams:
            streams.append(tag)
        stream_of[n.id] = streams.index(tag)

    barriers = _barrier_waits(order, stream_of)

    # Vector clocks: clock[s][t] = position on stream t up to which stream s knows work is done.
    position: dict[int, int] = {}
    counts = [0] * len(streams)
    for n in order:
        s = stream_of[n.id]
        position[n.id] = counts[s]
        counts[s] += 1
    clock = [[-1] * len(streams) for _ in streams]
    done_clock: dict[int, list] = {}
    waits_before: dict[int, list] = {}
    signalled: set = set()
    crossing: set = set()

    def need(s: int, p: Node, reads_value: bool) -> Node | None:
        t = stream_of.get(p.id)
        if t is None or t == s:
            return None
        if reads_value:
            crossing.add(p.id)
        if clock[s][t] >= position[p.id]:
            return None  # an earlier wait already covers p
        signalled.add(p.id)
        clock[s] = [max(a, b) for a, b in zip(clock[s], done_clock[p.id])]
        return p

    for n in order:
        s = stream_of[n.id]
        before = []
        for p in n.inputs:
            if (w := need(s, p, True)) is not None:
                before.append(w)
        for p in list(waits.get(n.id, ())) + barriers.get(n.id, []):
            if (w := need(s, p, False)) is not None:
                before.append(w)
        if before:
            waits_before[n.id] = before
        clock[s][s] = position[n.id]
        done_clock[n.id] = list(clock[s])

    # The default stream returns the outputs: it waits for those computed elsewhere, and for the
    # last node of every side stream, so nothing is still running when the call returns.
    output_waits = []
    out_node = graph.output
    finals = [nodes[-1] for nodes in (([m for m in order if stream_of[m.id] == i]) for i in range(1, len(streams))) if nodes]
    for p in list(out_node.inputs) + finals:
        reads_value = any(p is q for q in out_node.inputs)
        if (w := need(0, p, reads_value)) is not None:
            output_waits.append(w)
    return StreamPlan(graph, order, streams, priorities, stream_of, waits_before, signalled, crossing, output_waits)
