"""CUDA multi-stream executor: one host thread issues every op on its tag's ``torch.cuda.Stream``.

Kernels are asynchronous, so one straight-line function (generated like `codegen`'s) is enough:
it switches the current stream before each run of ops of one stream and uses CUDA events for the
synchronisation the `StreamPlan` asks for:

* on entry the caller's current stream records an event that every side stream waits for (the
  inputs were produced on it); the default stream of the graph is the caller's current stream;
* every cross-stream edge is ``EV.record(producer_stream)`` / ``consumer_stream.wait_event(EV)``;
* memory stays alive until every stream that reads it is done: a tensor read on another stream
  than the one that allocated it is marked with ``record_stream`` for the reader, so the caching
  allocator does not hand its block out again before the reader's work has run;
* before returning, the caller's stream waits for every side stream's last op.

Events and streams are created once per executable and reused; a lock keeps two host threads
from interleaving the event records of one executable.
"""
from __future__ import annotations

import linecache
import threading

import torch

from ..ir import Node
from .codegen import Emitter, compile_graph_to_python, safe_name
from .streams import StreamPlan

__all__ = ["compile_cuda_streams", "record_stream"]


def record_stream(value, stream) -> None:
    """Tell the caching allocator that the tensors in ``value`` (made on another stream) are used on ``stream``."""
    if isinstance(value, torch.Tensor):
        value.record_stream(stream)
    elif isinstance(value, (list, tuple)):
        for v in value:
            record_stream(v, stream)


# What generated schedules call: looked up here when one is compiled, so a test can watch the calls.
_record_stream = record_stream


_counter = [0]


def compile_cuda_streams(plan: StreamPlan, device: torch.device):
    """A callable that runs ``plan`` on one CUDA stream per tag (the default tag: the caller's stream)."""
    g = plan.graph
    em = Emitter(g, compile_graph_to_python)
    params = [f"a{i}" for i in range(len(g.placeholders))]
    names = {p.id: f"a{i}" for i, p in enumerate(g.placeholders)}
    for n in g.nodes:
        if n.kind == "constant":
            names[n.id] = em.render(n.value)
    for n in plan.order:
        names[n.id] = f"v{n.id}"
    em.names = names

    side = {i: torch.cuda.Stream(device=device, priority=plan.priorities.get(t, 0))
            for i, t in enumerate(plan.streams) if i > 0}
    stream_var = {0: "CUR", **{i: em.bind(s, "S") for i, s in side.items()}}
    events = {nid: torch.cuda.Event() for nid in sorted(plan.signalled)}
    event_var = {nid: em.bind(ev, "EV") for nid, ev in events.items()}
    entry = em.bind(torch.cuda.Event(), "ENTRY")
    em.globals.update(_set_stream=torch.cuda.set_stream, _current_stream=torch.cuda.current_stream,
                      _record_stream=_record_stream, _lock=threading.Lock(), _device=device)

    last_use: dict[int, int] = {}
    for idx, n in enumerate(plan.order):
        for i in n.inputs:
            last_use[i.id] = idx
    for i in g.output.inputs:
        last_use[i.id] = len(plan.order)

    body = [f"{entry}.record(CUR)"] + [f"{stream_var[i]}.wait_event({entry})" for i in side]
    current = 0
    recorded: set = set()  # (node id, stream) pairs already marked with record_stream

    def switch(to: int):
        nonlocal current
        if to != current:
            body.append(f"_set_stream({stream_var[to]})")
            current = to

    def reads_on(p: Node, s: int):
        if plan.stream_of.get(p.id, s) != s and (p.id, s) not in recorded:
            recorded.add((p.id, s))
            body.append(f"_record_stream({names[p.id]}, {stream_var[s]})")

    for idx, n in enumerate(plan.order):
        s = plan.stream_of[n.id]
        switch(s)
        for p in plan.waits_before.get(n.id, ()):
            body.append(f"{stream_var[s]}.wait_event({event_var[p.id]})")
        for p in n.inputs:
            reads_on(p, s)
        body.append(f"{names[n.id]} = {em.call_expr(n)}")
        if n.id in events:
            body.append(f"{event_var[n.id]}.record({stream_var[s]})")
        dead = [i for i in n.inputs if last_use.get(i.id) == idx and i.kind == "call"]
        if dead:
            body.append("del " + ", ".join(names[i.id] for i in dead))
    switch(0)
    for p in plan.output_waits:
        body.append(f"CUR.wait_event({event_var[p.id]})")
    for p in g.output.inputs:
        reads_on(p, 0)
    body.append(f"R = {em.render(g.outputs)}")

    fname = safe_name(g.name)
    lines = ["with _lock:",
             "    CUR = _current_stream(_device)",
             "    try:",
             *[f"        {ln}" for ln in body],
             "    finally:",
             "        _set_stream(CUR)",
             "return R"]
    src = f"def {fname}({', '.join(params)}):\n" + "".join(f"    {ln}\n" for ln in lines)
    _counter[0] += 1
    filename = f"<rewrite-cuda-streams-{_counter[0]}-{fname}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    exec(compile(src, filename, "exec"), em.globals)
    fn = em.globals[fname]
    fn.__rewrite_source__ = src
    fn.__rewrite_plan__ = plan
    return fn
