"""`config.debug.graph_dump`: write graphs as readable files (txt, pbtxt, py).

The driver (`rewrite.backend`, `rewrite.pipeline`, `rewrite.gears`) calls `dump_graph` at its stage
boundaries; the executors never do, they leave what a dump shows in node attributes.

File names carry the compile unit's number, the graph's name, the rank and the pid, so dumps from
several processes and several graphs of one model never overwrite each other. Files are written atomically.
"""
from __future__ import annotations

import functools
import logging
import os

import torch

from .exec.codegen import generate_source
from .ir import Graph, Node, format_arg, format_meta, format_value
from .unit import CompileUnit
from .persist.atomic import atomic_write_text

log = logging.getLogger("rewrite")

__all__ = ["dump_graph", "graph_to_pbtxt", "graph_to_py"]


def _rank() -> int:
    try:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank()
    except Exception:  # pragma: no cover - partially initialised process groups
        pass
    return int(os.environ.get("RANK", 0))


def graph_to_pbtxt(g: Graph) -> str:
    """A GE-style protobuf-text dump: one ``op { ... }`` block per node, with stream and inputs."""
    lines = [f'graph {{\n  name: "{g.name}"']
    for n in g.nodes:
        lines.append("  op {")
        lines.append(f'    name: "{n.name}"')
        lines.append(f'    type: "{n.op}"')
        for i in n.inputs:
            lines.append(f'    input: "{i.name}"')
        for w in n.waits:
            lines.append(f'    input: "^{w.name}"  # control edge: waits for {w.name}')
        lines.append(f'    output_desc {{ meta: "{format_meta(n.meta)}" }}')
        if n.stream is not None:
            lines.append(f'    attr {{ key: "_stream" value {{ s: "{n.stream}" }} }}')
        if n.kind == "constant":
            lines.append(f'    attr {{ key: "value" value {{ s: "{format_value(n.value)}" }} }}')
        if n.kind == "call":
            args = [format_arg(a) for a in n.args if not isinstance(a, Node)]
            if args:
                lines.append(f'    attr {{ key: "args" value {{ s: "{", ".join(args)}" }} }}')
        for sync in n.attrs.get("syncs", ()):
            lines.append(f'    attr {{ key: "_sync" value {{ s: "{sync}" }} }}')
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def graph_to_py(g: Graph, source: str | None = None) -> str:
    """The graph as Python source that calls ATen ops, with a header naming the inputs.

    ``source``: the code an executable of ``g`` runs (a multi-stream graph's per-stream code, waits
    included), shown instead of the single-stream code generated here.
    """
    src = source or generate_source(g)[0]
    header = [f"# input %{p.name}: {format_meta(p.meta)}" for p in g.placeholders]
    # Every node with its dtype and (symbolic) shape, and those of what it reads (TorchAir's
    # "## FX Code" lines): the generated code names values but not what they are.
    nodes = [f"## %{n.name}: {format_meta(n.meta)} = {n.op}("
             + ", ".join([_described(a) for a in n.args] + [f"{k}={_described(v)}" for k, v in n.kwargs.items()])
             + ")" for n in g.nodes if n.kind == "call"]
    return "\n".join([f"# rewrite graph {g.name}", *header, *nodes, src])


def _described(arg) -> str:
    if isinstance(arg, Node):
        return f"%{arg.name}: {format_meta(arg.meta)}"
    if isinstance(arg, (list, tuple)) and any(isinstance(a, Node) for a in arg):
        return "[" + ", ".join(_described(a) for a in arg) + "]"
    return format_arg(arg)


def graph_to_txt(g: Graph) -> str:
    """The printed graph, then each node's stream and synchronisations when streams were planned."""
    lines = [str(g)]
    syncs = [n for n in g.nodes if n.attrs.get("syncs")]
    if syncs or any(n.stream is not None for n in g.nodes):
        lines.append("# streams and synchronisation")
        for n in g.nodes:
            if n.kind in ("call", "output"):
                stream = n.stream
                lines.append(f"#   %{n.name}: stream {'default' if stream is None else repr(stream)}"
                             + "".join(f"; {s}" for s in n.attrs.get("syncs", ())))
    return "\n".join(lines) + "\n"


def dump_graph(g: Graph, unit: CompileUnit, stage: str, source: str | None = None) -> str | None:
    """Write ``g``, a graph of ``unit``, if ``unit.config.debug.graph_dump.type`` is set; returns the file path.

    ``source``: the code ``g``'s executable runs, for the ``py`` dump (see `graph_to_py`).
    """
    kind = unit.config.debug.graph_dump.type
    if kind is None:
        return None
    folder = unit.config.debug.graph_dump.path
    os.makedirs(folder, exist_ok=True)
    name = f"rewrite_graph_{unit.number}_rank_{_rank()}_pid_{os.getpid()}_{g.name}_{stage}.{kind}"
    path = os.path.join(folder, "".join(c if c.isalnum() or c in "._-" else "_" for c in name))
    write = {"txt": graph_to_txt, "pbtxt": graph_to_pbtxt, "py": functools.partial(graph_to_py, source=source)}[kind]
    atomic_write_text(path, write(g))
    log.info("dumped graph %s (%s) to %s", g.name, stage, path)
    return path
