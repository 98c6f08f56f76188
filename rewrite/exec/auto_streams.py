"""``config.exec.auto_streams``: put independent branches of an unannotated graph on streams.

The package's cost model (`rewrite.cost`, calibrated on this machine) estimates each op's
single-thread time from its `TensorMeta` shapes; here that time shrinks with intra-op threads: an
op only uses as many threads as it has work for, so small ops leave cores idle that another branch
could use.

A list scheduler then places ops, in order of their critical path to the output, on the stream
where they would finish first, paying a synchronisation cost whenever an input lives on another
stream. The assignment is kept only when its estimated time beats one stream by a margin; the
default stream (the caller's thread) is stream 0, the others are tagged ``"auto1"``, ``"auto2"``...
"""
from __future__ import annotations

import logging

import torch

from ..cost import dispatch_overhead, moves_no_data, single_thread_cost
from ..ir import Graph

log = logging.getLogger("rewrite")

__all__ = ["assign_streams"]

SYNC_S = 40e-6  # an event wait/set between two threads (measured: ~75 us for a queue round trip)
# Fixed costs of running a call on several threads, from benchmarks/streams.py on 2 cores: a graph
# of 16x16 ops took 0.23 ms on three streams against 0.04 ms on one. Per side stream and call: lease
# a worker, hand it the call, join it. Per op off the caller's thread: GIL hand-offs.
LAUNCH_S = 90e-6
SWITCH_S = 30e-6
WORK_PER_THREAD = 5e-5  # an op needs about this much single-thread time per thread it uses well
MIN_GAIN = 0.8  # keep the assignment only if it is estimated at most 80% of one stream's time


def _time(cost: float, threads: int) -> float:
    """An op spreads its work over at most ``threads`` threads, and only if it has enough of it."""
    overhead = dispatch_overhead()
    if cost <= overhead:
        return cost
    useful = max(1, min(threads, int((cost - overhead) / WORK_PER_THREAD)))
    return overhead + (cost - overhead) / useful


def assign_streams(graph: Graph, num_streams: int | None = None, threads: int | None = None) -> dict:
    """node id -> stream tag (None: default stream), or {} when one stream is estimated as fast."""
    threads = threads or torch.get_num_threads()
    num_streams = num_streams or max(2, min(4, threads))
    if not graph.is_static():
        return {}
    calls = [n for n in graph.nodes if n.kind == "call"]
    if len(calls) < 2:
        return {}
    # Views and getitem take no time on a stream: they stay with their input.
    cost = {n.id: 0.0 if moves_no_data(n.target) else single_thread_cost(n) for n in calls}
    single = sum(_time(c, threads) for c in cost.values())

    # Critical path from each node to the end, on a share of the threads.
    share = max(1, threads // num_streams)
    users = graph.users()
    rank: dict[int, float] = {}
    for n in reversed(calls):
        rank[n.id] = _time(cost[n.id], share) + max((rank.get(u.id, 0.0) for u in users.get(n.id, ())), default=0.0)
    index = {n.id: i for i, n in enumerate(graph.nodes)}

    stream_of: dict[int, int] = {}
    finish: dict[int, float] = {}
    free_at = [0.0] * num_streams
    waiting = {n.id: sum(1 for i in n.inputs if i.kind == "call") for n in calls}
    ready = [n for n in calls if waiting[n.id] == 0]
    while ready:
        ready.sort(key=lambda m: (-rank[m.id], index[m.id]))
        n = ready.pop(0)
        producers = [i for i in n.inputs if i.id in stream_of]
        if cost[n.id] == 0.0 and producers:  # views and getitem stay with their input
            s = stream_of[producers[0].id]
            stream_of[n.id], finish[n.id] = s, max(finish[p.id] for p in producers)
        else:
            best = None
            for s in range(num_streams):
                start = max([free_at[s]] + [finish[p.id] + (SYNC_S if stream_of[p.id] != s else 0.0)
                                            for p in producers])
                end = start + _time(cost[n.id], share)
                if best is None or end < best[0] - 1e-12:
                    best = (end, s)
            finish[n.id], s = best
            stream_of[n.id] = s
            free_at[s] = finish[n.id]
        for u in users.get(n.id, ()):
            if u.id in waiting:
                waiting[u.id] -= 1
                if waiting[u.id] == 0:
                    ready.append(u)
    used = sorted(set(stream_of.values()))
    main = stream_of[calls[0].id]
    off_main = sum(1 for n in calls if stream_of[n.id] != main and cost[n.id] > 0.0)
    multi = max(finish.values()) + LAUNCH_S * (len(used) - 1) + SWITCH_S * off_main
    log.debug("auto_streams %s: one stream %.1f us, %d streams %.1f us", graph.name, single * 1e6,
              len(used), multi * 1e6)
    if len(used) < 2 or multi > MIN_GAIN * single:
        return {}
    # The stream that runs the first op becomes the default (caller's) stream.
    first = main
    rename = {first: None}
    for s in used:
        if s not in rename:
            rename[s] = f"auto{len(rename)}"
    return {nid: rename[s] for nid, s in stream_of.items()}


