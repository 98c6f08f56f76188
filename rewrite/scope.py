"""In-graph stream scopes: ``stream_switch``, ``wait_tensor``, ``record`` and ``wait``.

    with rewrite.scope.stream_switch("1", stream_priority=0):
        rewrite.scope.wait_tensor(b, a)   # the ops below that read b start after a is computed
        y = torch.mm(b, w)

    token = rewrite.scope.record()        # a handle to the last op issued on the current stream
    with rewrite.scope.stream_switch("2"):
        rewrite.scope.wait([token, c])    # the next op issued on stream "2" waits for both
        z = torch.relu(d)

Both are recorded in the traced graph as custom ops of the ``rewrite_stream`` namespace that
return nothing and are registered as side-effecting (``torch.fx.node.has_side_effect``), so
Dynamo traces them without a graph break and neither Dynamo's nor AOTAutograd's dead-code
elimination drops them. In eager mode they do nothing, so an annotated model still runs unchanged.

Right after IR import, `annotate_streams` turns the markers into node attributes and removes them:

* ``node.stream`` (the tag) and ``attrs["stream_priority"]`` on every node issued inside a scope;
  nodes outside any scope carry no tag and run on the default stream;
* ``node.waits`` (control edges) on each node that reads ``self`` after the ``wait_tensor`` call
  in the same scope: it starts only after every listed node is computed;
* ``wait(tensors)`` queues control edges (each tensor's producer, or the op a ``record()`` token
  stands for) on the current stream; the next op issued on that stream (even in a later scope of
  the same tag) waits for them, and the stream runs in order, so everything after it waits too
  (TorchAir's ``torchair.ops.wait`` / ``torchair.ops.record``).

Later passes treat the stream tag as part of a node's identity and keep wait edges.
"""
from __future__ import annotations

import logging

import torch
from torch.fx.node import has_side_effect

from .fx_bridge import CompileError
from .ir import Graph, Node

log = logging.getLogger("rewrite")

__all__ = ["stream_switch", "wait_tensor", "record", "wait", "annotate_streams", "StreamScopeError"]


class StreamScopeError(CompileError):
    """A stream annotation is malformed or conflicts with the configuration."""


# -- the marker ops ------------------------------------------------------------------------------


@torch.library.custom_op("rewrite_stream::scope_enter", mutates_args=())
def _scope_enter(stream_tag: str, stream_priority: int, enable_inner_parallel: bool = True) -> None:
    """Marks where a ``stream_switch`` block starts; a no-op when run."""


@torch.library.custom_op("rewrite_stream::scope_exit", mutates_args=())
def _scope_exit() -> None:
    """Marks where the innermost ``stream_switch`` block ends; a no-op when run."""


@torch.library.custom_op("rewrite_stream::wait_tensor", mutates_args=())
def _wait_tensor(self: torch.Tensor, dependency: torch.Tensor) -> None:
    """Marks that the readers of ``self`` issued after it wait for ``dependency``; a no-op when run."""


@torch.library.custom_op("rewrite_stream::record", mutates_args=())
def _record() -> torch.Tensor:
    """A token standing for the last op issued on the current stream; an empty tensor when run."""
    return torch.empty(0)


@torch.library.custom_op("rewrite_stream::wait", mutates_args=())
def _wait(tensors: list[torch.Tensor]) -> None:
    """Marks that the next op issued on the current stream waits for ``tensors``; a no-op when run."""


@_scope_enter.register_fake
def _(stream_tag, stream_priority, enable_inner_parallel=True):
    return None


@_record.register_fake
def _():
    return torch.empty(0)


@_wait.register_fake
def _(tensors):
    return None


@_scope_exit.register_fake
def _():
    return None


@_wait_tensor.register_fake
def _(self, dependency):
    return None


SCOPE_ENTER = torch.ops.rewrite_stream.scope_enter.default
SCOPE_EXIT = torch.ops.rewrite_stream.scope_exit.default
WAIT_TENSOR = torch.ops.rewrite_stream.wait_tensor.default
RECORD = torch.ops.rewrite_stream.record.default
WAIT = torch.ops.rewrite_stream.wait.default
MARKERS = (SCOPE_ENTER, SCOPE_EXIT, WAIT_TENSOR, WAIT)
for _op in MARKERS:
    has_side_effect(_op)


# -- the user API ------------------------------------------------------------------------------


class stream_switch:  # noqa: N801 - a context manager used like a function, as in TorchAir
    """``with stream_switch(tag, priority):`` ops issued inside run on the stream named ``tag``.

    The same tag means the same stream. ``stream_priority`` is the CUDA stream priority, as for
    ``torch.cuda.Stream`` (lower is more urgent, clamped to the device's range); CPU worker
    threads have no priority and ignore it. ``enable_inner_parallel`` (TorchAir's third argument)
    says whether the scope's own ops may be split further over streams; rewrite records it on
    each node (``attrs["stream_inner_parallel"]``, shown in dumps) and never splits a tagged
    scope, so both values run the scope's ops in order on its one stream.
    """

    def __init__(self, stream_tag: str, stream_priority: int = 0, enable_inner_parallel: bool = True):
        if not isinstance(stream_tag, str) or not stream_tag:
            raise TypeError(f"stream_switch: stream_tag must be a non-empty str, got {stream_tag!r}")
        if isinstance(stream_priority, bool) or not isinstance(stream_priority, int):
            raise TypeError(f"stream_switch: stream_priority must be an int, got {stream_priority!r}")
        if not isinstance(enable_inner_parallel, bool):
            raise TypeError(f"stream_switch: enable_inner_parallel must be a bool, got {enable_inner_parallel!r}")
        self.stream_tag = stream_tag
        self.stream_priority = stream_priority
        self.enable_inner_parallel = enable_inner_parallel

    def __enter__(self):
        torch.ops.rewrite_stream.scope_enter(self.stream_tag, self.stream_priority, self.enable_inner_parallel)
        return self

    def __exit__(self, *exc):
        torch.ops.rewrite_stream.scope_exit()
        return False


def wait_tensor(self: torch.Tensor, dependency: torch.Tensor) -> torch.Tensor:
    """The ops issued after this call that read ``self`` (in the same scope) wait for ``dependency``.

    Returns ``self`` unchanged, so both ``wait_tensor(x, y)`` and ``x = wait_tensor(x, y)`` work.
    """
    if not isinstance(self, torch.Tensor) or not isinstance(dependency, torch.Tensor):
        raise TypeError("wait_tensor(self, dependency) takes two tensors, got "
                        f"{type(self).__name__} and {type(dependency).__name__}")
    torch.ops.rewrite_stream.wait_tensor(self, dependency)
    return self


def record() -> torch.Tensor:
    """A token for the last op issued on the current stream before this call (pass it to `wait`)."""
    return torch.ops.rewrite_stream.record()


def wait(tensors) -> None:
    """The next op issued on the current stream waits for each tensor's producer (or, for a
    `record` token, for the op it stands for)."""
    if tensors is None or len(tensors) == 0:
        raise ValueError("rewrite.scope.wait() requires at least one tensor input")
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"arguments of rewrite.scope.wait() must be torch.Tensor, got {type(t).__name__}")
    torch.ops.rewrite_stream.wait(list(tensors))


# -- the pass: markers -> node attributes ------------------------------------------------------


def _has_markers(graph: Graph) -> bool:
    return any(n.kind == "call" and n.target in MARKERS for n in graph.nodes)


class _PendingWait:
    __slots__ = ("marker", "reads", "dependency", "matched")

    def __init__(self, marker: Node, reads: Node, dependency: Node):
        self.marker, self.reads, self.dependency, self.matched = marker, reads, dependency, False


def annotate_streams(graph: Graph, config=None, report=None) -> Graph:
    """Turn ``rewrite_stream`` markers into ``stream`` attributes and wait edges; drop the markers.

    Raises `StreamScopeError` when the markers are unbalanced, when one tag is given two different
    priorities, or when ``config.ge_config.enable_single_stream`` is set (the two conflict).
    """
    if not _has_markers(graph):
        return graph
    if config is not None and config.ge_config.enable_single_stream:
        raise StreamScopeError(
            f"graph {graph.name}: config.ge_config.enable_single_stream = True conflicts with the "
            "stream scopes (rewrite.scope.stream_switch / wait_tensor) in this graph; unset "
            "enable_single_stream or remove the scopes")
    scopes: list[tuple[str, int, list[_PendingWait], bool]] = []  # innermost last
    outside_waits: list[_PendingWait] = []  # waits issued on the default stream
    priorities: dict[str, int] = {}
    markers: list[Node] = []
    last_issued: dict = {}   # stream tag (None: default) -> the last op issued on it
    queued: dict = {}        # stream tag -> nodes the next op issued on it waits for (rewrite.scope.wait)
    tokens: dict = {}        # record node id -> the op it stands for (or None)
    for node in graph.nodes:
        if node.kind != "call":
            continue
        current = scopes[-1][0] if scopes else None
        if node.target is SCOPE_ENTER:
            tag, priority = node.args[0], node.args[1]
            inner = node.args[2] if len(node.args) > 2 else node.kwargs.get("enable_inner_parallel", True)
            if priorities.setdefault(tag, priority) != priority:
                raise StreamScopeError(
                    f"graph {graph.name}: stream {tag!r} is given priority {priority} at {node} but "
                    f"{priorities[tag]} earlier; one stream has one priority")
            scopes.append((tag, priority, [], inner))
            markers.append(node)
        elif node.target is RECORD:
            tokens[node.id] = last_issued.get(current)
        elif node.target is WAIT:
            for x in node.args[0]:
                target = tokens.get(x.id) if x.id in tokens else x
                if isinstance(target, Node) and target.kind == "call":
                    queued.setdefault(current, []).append(target)
            markers.append(node)
        elif node.target is SCOPE_EXIT:
            if not scopes:
                raise StreamScopeError(f"graph {graph.name}: {node} closes a stream scope that was never opened")
            _warn_unmatched(graph, scopes.pop()[2], report)
            markers.append(node)
        elif node.target is WAIT_TENSOR:
            reads, dependency = node.args[0], node.args[1]
            pending = scopes[-1][2] if scopes else outside_waits
            pending.append(_PendingWait(node, reads, dependency))
            markers.append(node)
        else:
            waits = scopes[-1][2] if scopes else outside_waits
            if scopes:
                node.stream = scopes[-1][0]
                node.attrs["stream_priority"] = scopes[-1][1]
                node.attrs["stream_inner_parallel"] = scopes[-1][3]
            for target in queued.pop(current, ()):
                if target is not node and not any(d is target for d in node.waits):
                    node.waits += (target,)
            last_issued[current] = node
            inputs = node.inputs
            for w in waits:
                if any(i is w.reads for i in inputs) and w.dependency is not node:
                    if not any(d is w.dependency for d in node.waits):
                        node.waits += (w.dependency,)
                    w.matched = True
    if scopes:
        raise StreamScopeError(f"graph {graph.name}: stream scope {scopes[-1][0]!r} is opened but never closed")
    _warn_unmatched(graph, outside_waits, report)
    drop = {m.id for m in markers}
    graph.nodes = [n for n in graph.nodes if n.id not in drop]
    # a record token read only by the wait markers is gone with them
    read = {i.id for n in graph.nodes for i in n.inputs}
    graph.nodes = [n for n in graph.nodes if not (n.id in tokens and n.id not in read)]
    tagged = sum(1 for n in graph.nodes if n.stream is not None)
    waits = sum(len(n.waits) for n in graph.nodes)
    if report is not None:
        report.count("stream_scope_nodes", tagged)
        report.count("stream_waits", waits)
    log.debug("graph %s: %d nodes on %d tagged streams, %d waits", graph.name, tagged, len(priorities), waits)
    return graph


def _warn_unmatched(graph: Graph, waits: list[_PendingWait], report) -> None:
    if graph.name.endswith("_backward"):
        return  # AOTAutograd's partitioner copies side-effecting markers into the backward graph too
    for w in waits:
        if not w.matched:
            msg = (f"graph {graph.name}: wait_tensor({w.reads}, {w.dependency}) at {w.marker} has no effect: "
                   f"no op reads {w.reads} after it in the same stream scope")
            if report is not None:
                report.note(msg, logging.WARNING)
            else:
                log.warning(msg)
