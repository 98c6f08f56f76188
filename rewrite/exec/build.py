"""`build_executable`: one graph to its callable, by the executor the graph and the policy call for.

The seam between the optimizer and the kernel backends (the package's guide, `rewrite.exec`, says which
executor runs when): straight-line ATen code (`codegen`), Inductor (`inductor`), or the stream scheduler
(`stream_plan_for`: `streams.plan_streams` decides where streams synchronise, `stream_cpu` /
`stream_cuda` run it); with the compiled function's `PlannedProgram`, the callable becomes a plan's
executable (`program`).

When a graph runs on one stream (the seed's rules):
* ``config.ge_config.enable_single_stream = True`` (with stream scopes it is an error: they conflict);
* a graph with dynamic shapes, unless the environment sets ``REWRITE_DYNAMIC_SHAPE_MULTI_STREAM=1``;
* ``config.exec.kernels = "inductor"``: Inductor schedules the whole graph itself.
Waits still order the single stream, so a wait that closes a cycle is an error in every case.
"""
from __future__ import annotations

import logging
import os

import torch

from ..ir import Graph
from ..unit import CompileUnit
from ..waits import order_with_waits, resolve_waits
from .codegen import compile_graph_to_python
from .layouts import align_attention_biases
from .program import device_of
from .streams import StreamPlan, plan_streams

log = logging.getLogger("rewrite")

__all__ = ["build_executable", "stream_plan_for", "stream_timeout_asked", "DYNAMIC_MULTI_STREAM_ENV"]

DYNAMIC_MULTI_STREAM_ENV = "REWRITE_DYNAMIC_SHAPE_MULTI_STREAM"


def stream_plan_for(graph: Graph, unit: CompileUnit) -> StreamPlan | None:
    """The multi-stream plan of ``graph`` (a graph of ``unit``), or None when it runs on one stream (the rules above)."""
    config, report = unit.config, unit.report
    annotated = any(n.stream is not None for n in graph.nodes)
    if not annotated and not config.exec.auto_streams:
        return None
    if config.ge_config.enable_single_stream:
        return None
    if not graph.is_static() and os.environ.get(DYNAMIC_MULTI_STREAM_ENV) != "1":
        report.note(f"graph {graph.name} has dynamic shapes: runs on one stream "
                    f"(set {DYNAMIC_MULTI_STREAM_ENV}=1 for multi-stream)")
        return None
    if unit.policy.kernels == "inductor":
        report.note(f"graph {graph.name}: exec.kernels = 'inductor' runs the graph on one stream; "
                    "stream scopes only order it")
        return None
    assign = None
    if not annotated:
        from .auto_streams import assign_streams

        assign = assign_streams(graph)
        if not assign:
            return None
    plan = plan_streams(graph, assign)
    if len(plan.streams) < 2 or all(len(plan.nodes_of(i)) == 0 for i in range(1, len(plan.streams))):
        return None
    return plan


def _record_syncs(plan: StreamPlan) -> None:
    """Write the plan into node attributes, so graph dumps show every stream and synchronisation (the
    driver dumps the graph once it is built)."""
    for n in plan.order:
        tag = plan.streams[plan.stream_of[n.id]]
        if tag is not None:
            n.stream = tag
        syncs = [f"wait %{p.name} on stream {plan.tag(p)}" for p in plan.waits_before.get(n.id, ())]
        if n.id in plan.signalled:
            syncs.append(f"record event for stream(s) waiting on %{n.name}")
        if syncs:
            n.attrs["syncs"] = syncs
    out = plan.graph.output
    out_syncs = [f"wait %{p.name} on stream {plan.tag(p)}" for p in plan.output_waits]
    if out_syncs:
        out.attrs["syncs"] = out_syncs


def stream_timeout_asked(config) -> bool:
    """Whether ``exec.stream_timeout_s`` was set to a value of the user's (not left at its default)."""
    from ..config import ExecConfig

    return config.exec.stream_timeout_s != ExecConfig.stream_timeout_s.default


def build_executable(graph: Graph, unit: CompileUnit, program=None, show_code=None):
    """Compile ``graph`` for execution with the kernel backend ``config.exec.kernels`` selects.

    ``unit`` is the `CompileUnit` the graph belongs to (a graph built on its own: `CompileUnit.detached`,
    whose report collects its notes). ``program``: the compiled function's `PlannedProgram`
    (`program_for`): in reduce-overhead mode static graphs get a plan, in the default mode static graphs
    tier up after their first calls. ``show_code(source)``: the driver's hook for the code a
    multi-stream graph runs per stream (its graph dump shows it).
    """
    config, report, policy = unit.config, unit.report, unit.policy
    align_attention_biases(graph)  # the kernels' layouts, whichever executor runs the graph
    waits = resolve_waits(graph)
    if waits:  # a cycle is an error whichever way the graph runs
        order_with_waits(graph, waits)
    plan = stream_plan_for(graph, unit)
    if plan is not None:
        report.count("streams", len(plan.streams))
        report.count("stream_syncs", plan.num_syncs)
        device = device_of(graph)
        if device.type == "cuda":
            from .stream_cuda import compile_cuda_streams

            fn = compile_cuda_streams(plan, device)
        else:
            from .stream_cpu import compile_cpu_streams

            threads = config.exec.stream_intra_op_threads or max(1, torch.get_num_threads() // len(plan.streams))
            fn = compile_cpu_streams(plan, config.exec.stream_timeout_s, threads)
        _record_syncs(plan)
        if show_code is not None:
            show_code(fn.__rewrite_source__)
        log.info("graph %s: %d streams, %d synchronisations\n%s", graph.name, len(plan.streams),
                 plan.num_syncs, plan.describe())
        if program is None:
            return fn
        if device.type == "cpu" and policy.tiers_up and stream_timeout_asked(config):
            # A timeout asked for is a promise about the model whatever form it runs in, and only the
            # worker threads watch a stream: on one stream a stuck op would just run on (issue 45).
            report.note(f"graph {graph.name}: stream scopes keep their worker threads (exec.stream_timeout_s = "
                        f"{config.exec.stream_timeout_s} asks for a watchdog, which one stream has not)")
        elif device.type == "cpu" and policy.tiers_up:
            # Worker threads against the same graph on one stream, tiered up: the faster is kept (measured).
            # On one stream a wait only orders, and the graph's own order already honours every wait
            # (Graph.validate), which is the order the plan follows.
            plain = compile_graph_to_python(graph, order=order_with_waits(graph, waits)) if waits \
                else compile_graph_to_python(graph)
            one_stream = program.executable(graph, plain, plannable=True)
            if program.is_tiering_gear(one_stream):
                from .stream_choice import StreamChoice

                return StreamChoice(graph.name, fn, one_stream, program.note)
        return program.executable(graph, fn, plannable=False)
    if policy.inductor_kernels_on(device_of(graph).type):
        from .inductor import compile_with_inductor

        fn = compile_with_inductor(graph)
        return fn if program is None else program.executable(graph, fn, plannable=False)
    fn = compile_graph_to_python(graph, order=order_with_waits(graph, waits)) if waits else compile_graph_to_python(graph)
    return fn if program is None else program.executable(graph, fn, plannable=not waits)
