"""Compiled graphs with collectives (tensor parallelism): what a rank says when its peers fail.

A graph that holds collectives (``_c10d_functional.all_reduce`` and ``wait_tensor`` from a model
sharded with ``parallelize_module``, or functional collectives written by hand) runs on every rank
in step: a rank that fails before a collective, dies or stops calling the model leaves the others
blocked in their ``wait_tensor`` until the process group's timeout
(``init_process_group(timeout=...)``; gloo's default is 30 minutes) or until the dead rank's
sockets close. Export and load meet at bounded points of their own (`rewrite.export.ranks`); a
compiled model has no such point, so each of its calls costs nothing more and:

* when a collective of the graph fails (a timeout, a peer's closed connection), the rank raises
  `CollectiveError`: the graph, its collectives and their groups, the process group's timeout, the
  error that the other ranks recorded (below) and the backend's own message;
* when the graph fails on a rank for another reason (a `rewrite.GearError`: this rank's gears differ
  from the others', or its input has another size), the rank records the error in the default
  group's store (a side channel that needs no matching collective) before raising it, so the ranks
  blocked in the collective it never reached can name it.

An error raised by the user's own code before the call is not seen by rewrite: the others' message
then says a rank failed before the collective, died, or is not calling the model.
"""
from __future__ import annotations

import datetime
import functools
import json
import time

import torch

from .ops import is_collective, issues_collective

__all__ = ["CollectiveError", "collectives_in", "guard_collectives"]

_KEY = "rewrite/compiled_graph_failed/{rank}"
_STORE_WAIT_S = 2.0  # reading the others' records never waits longer than this (a dead rank may host the store)
_PEER_FAILURE = ("Timed out", "timed out", "Connection closed", "Connection reset", "closed by peer", "pair closure",
                 "Read error", "Write error", "Broken pipe", "NCCL", "DistBackendError")


class CollectiveError(RuntimeError):
    """A collective of a compiled graph failed on this rank: another rank failed, died or does not call."""


def collectives_in(graph) -> list:
    """The graph's collective calls other than ``wait_tensor``, as ``(op, group name)``, in order."""
    out = []
    for n in graph.nodes:
        if n.kind != "call" or not issues_collective(n.target):
            continue
        group = None
        for i, arg in enumerate(n.target._schema.arguments):
            if arg.name == "group_name":
                group = n.args[i] if i < len(n.args) else n.kwargs.get(arg.name)
        out.append((n.op, group))
    return out


def guard_collectives(fn, graph):
    """``fn`` (the callable of ``graph``), raising `CollectiveError` when one of its collectives fails;
    ``fn`` itself when the graph has no collectives."""
    if not any(n.kind == "call" and is_collective(n.target) for n in graph.nodes):
        return fn
    collectives = collectives_in(graph)
    name = graph.name

    @functools.wraps(fn)
    def guarded(*args):
        try:
            return fn(*args)
        except Exception as e:
            if not _is_peer_failure(e):
                _record(e, name)
                raise
            raise CollectiveError(_message(e, name, collectives)) from e

    return guarded


def _is_peer_failure(e: BaseException) -> bool:
    dist_error = getattr(torch.distributed, "DistError", None)
    if dist_error is not None and isinstance(e, dist_error):
        return True
    return isinstance(e, RuntimeError) and any(s in str(e) for s in _PEER_FAILURE)


def _group():
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _record(e: BaseException, graph: str) -> None:
    """Write this rank's error where the ranks blocked in its collectives can read it."""
    if not _group():
        return
    import torch.distributed as dist

    try:
        record = {"graph": graph, "error": f"{type(e).__name__}: {e}"[:1000], "time": time.strftime("%H:%M:%S")}
        dist.distributed_c10d._get_default_store().set(_KEY.format(rank=dist.get_rank()), json.dumps(record))
    except Exception:  # noqa: BLE001 - the side channel is a courtesy; the rank raises its own error anyway
        pass


def _recorded() -> dict:
    """rank -> what another rank recorded (`_record`); {} when the store cannot be read quickly."""
    import torch.distributed as dist

    out = {}
    try:
        store = dist.distributed_c10d._get_default_store()
        before = store.timeout
        store.set_timeout(datetime.timedelta(seconds=_STORE_WAIT_S))
        try:
            for r in range(dist.get_world_size()):
                key = _KEY.format(rank=r)
                if r != dist.get_rank() and store.check([key]):
                    out[r] = json.loads(store.get(key).decode("utf-8", "replace"))
        finally:
            store.set_timeout(before)
    except Exception:  # noqa: BLE001 - e.g. the rank that hosted the store is gone
        pass
    return out


def _timeout_text() -> str:
    import torch.distributed as dist

    try:
        backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
        seconds = backend.options._timeout.total_seconds()
        return f"{seconds:g} s"
    except Exception:  # noqa: BLE001 - another backend, or none
        return "its configured value"


def _message(e: BaseException, graph: str, collectives: list) -> str:
    if not _group():
        return f"graph {graph}: a collective failed ({type(e).__name__}: {str(e).splitlines()[0][:300]})"
    import torch.distributed as dist

    ops: dict = {}
    for op, group in collectives:
        ops[(op, group)] = ops.get((op, group), 0) + 1
    listed = ", ".join(f"{n} x {op.split('.')[1]} on group {group!r}" for (op, group), n in ops.items())
    recorded = _recorded()
    if recorded:
        others = "; ".join(f"rank {r} failed in graph {v.get('graph')} at {v.get('time')}: {v.get('error')}"
                           for r, v in sorted(recorded.items()))
    else:
        others = ("no other rank recorded an error in a compiled graph: one failed before its collective in its own "
                  "code, died, or is not calling the model")
    return (f"rank {dist.get_rank()} of {dist.get_world_size()}: graph {graph} failed in a collective ({listed}): "
            f"the other ranks did not take part. {others}. A rank waits at most the process group's timeout for the "
            f"others (init_process_group(timeout=...), here {_timeout_text()}). "
            f"The backend said: {type(e).__name__}: {str(e).strip().splitlines()[0][:300]}")
