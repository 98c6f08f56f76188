"""``config.exec.auto_streams``: put independent branches of an unannotated graph on streams.

A cost model estimates each op's time from its `TensorMeta` shapes (flops for matmul-like ops,
bytes moved for the rest) and how that time shrinks with intra-op threads: an op only uses as
many threads as it has work for, so small ops leave cores idle that another branch could use.

A list scheduler then places ops, in order of their critical path to the output, on the stream
where they would finish first, paying a synchronisation cost whenever an input lives on another
stream. The assignment is kept only when its estimated time beats one stream by a margin; the
default stream (the caller's thread) is stream 0, the others are tagged ``"auto1"``, ``"auto2"``...
"""
from __future__ import annotations

import logging
import math
import operator

import torch

from ..ir import Graph, Node, TensorMeta, _metas

log = logging.getLogger("rewrite")

__all__ = ["assign_streams", "op_cost"]

aten = torch.ops.aten

# Rough figures for one CPU core; only ratios matter to the decisions below.
FLOPS_PER_S = 100e9
BYTES_PER_S = 8e9
OP_OVERHEAD_S = 4e-6
SYNC_S = 40e-6  # an event wait/set between two threads (measured: ~75 us for a queue round trip)
# Fixed costs of running a call on several threads, from benchmarks/streams.py on 2 cores: a graph
# of 16x16 ops took 0.23 ms on three streams against 0.04 ms on one. Per side stream and call: lease
# a worker, hand it the call, join it. Per op off the caller's thread: GIL hand-offs.
LAUNCH_S = 90e-6
SWITCH_S = 30e-6
WORK_PER_THREAD = 5e-5  # an op needs about this much single-thread time per thread it uses well
MIN_GAIN = 0.8  # keep the assignment only if it is estimated at most 80% of one stream's time

_MATMULS = {aten.mm.default: "mm", aten.bmm.default: "bmm", aten.addmm.default: "addmm",
            aten.convolution.default: "conv"}
_FREE = {operator.getitem, aten.view.default, aten._unsafe_view.default, aten.t.default,
         aten.permute.default, aten.expand.default, aten.unsqueeze.default, aten.squeeze.dim,
         aten.slice.Tensor, aten.select.int, aten.transpose.int, aten.alias.default}


def _numel(meta) -> float:
    if not isinstance(meta, TensorMeta) or not meta.is_static():
        return 0.0
    return float(math.prod(int(s) for s in meta.shape))


def _bytes(meta) -> float:
    return _numel(meta) * (meta.dtype.itemsize if isinstance(meta, TensorMeta) else 0)


def _flops(n: Node) -> float:
    kind = _MATMULS.get(n.target)
    out = n.meta if isinstance(n.meta, TensorMeta) else None
    if kind is None or out is None:
        return 0.0
    if kind in ("mm", "bmm", "addmm"):
        a = n.args[1] if kind == "addmm" else n.args[0]
        k = int(a.meta.shape[-1]) if isinstance(a, Node) and isinstance(a.meta, TensorMeta) else 1
        return 2.0 * _numel(out) * k
    w = n.args[1]
    if isinstance(w, Node) and isinstance(w.meta, TensorMeta):
        return 2.0 * _numel(out) * _numel(w.meta) / max(1, int(w.meta.shape[0]))
    return 0.0


def op_cost(n: Node) -> float:
    """Estimated single-thread seconds of ``n`` (0 for ops that only make views)."""
    if n.kind != "call" or n.target in _FREE:
        return 0.0
    moved = sum(_bytes(m) for m in _metas(n.meta)) + sum(_bytes(i.meta) for i in n.inputs
                                                        if isinstance(i.meta, TensorMeta))
    return OP_OVERHEAD_S + max(_flops(n) / FLOPS_PER_S, moved / BYTES_PER_S)


def _time(cost: float, threads: int) -> float:
    """An op spreads its work over at most ``threads`` threads, and only if it has enough of it."""
    if cost <= OP_OVERHEAD_S:
        return cost
    useful = max(1, min(threads, int((cost - OP_OVERHEAD_S) / WORK_PER_THREAD)))
    return OP_OVERHEAD_S + (cost - OP_OVERHEAD_S) / useful


def assign_streams(graph: Graph, num_streams: int | None = None, threads: int | None = None) -> dict:
    """node id -> stream tag (None: default stream), or {} when one stream is estimated as fast."""
    threads = threads or torch.get_num_threads()
    num_streams = num_streams or max(2, min(4, threads))
    if not graph.is_static():
        return {}
    calls = [n for n in graph.nodes if n.kind == "call"]
    if len(calls) < 2:
        return {}
    cost = {n.id: op_cost(n) for n in calls}
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


