"""In-place cache updates: ``copy_(buf, index_put(buf, i, v))`` becomes ``index_put_(buf, i, v)``.

AOTAutograd functionalizes a model's in-place writes to its own buffers: a static KV cache's
``cache.index_copy_(2, pos, k)`` arrives as an out-of-place ``index_put`` (a fresh copy of the whole
cache with the new rows in it) and, at the end of the graph, ``copy_`` of that copy back into the
buffer. Each decode step then copies every cache twice, which grows with the context: a 2048-token
cache of 8 heads x 128 in float32 is 8 MiB per layer and per K or V, against the few KiB the step
writes. Writing the rows in place is what the model asked for, and it is only the same program when
nothing else reads the buffer: so the pass applies only when the buffer (a graph input) is read by
the update and the write-back alone. Readers of the new value read the buffer, which now holds it;
the write-back (a copy of the buffer onto itself) goes. Stream scopes and waits are left alone.
"""
from __future__ import annotations

import torch

from ..ir import Graph
from .pass_type import Pass, Step

__all__ = ["REINPLACE", "reinplace_buffer_updates", "IN_PLACE"]

aten = torch.ops.aten
# functional op -> its in-place variant: same arguments, writes its first and returns it
IN_PLACE = {aten.index_put.default: aten.index_put_.default, aten.index_copy.default: aten.index_copy_.default}


def reinplace_buffer_updates(graph: Graph) -> int:
    """Rewrite each sole update of an input buffer written back with ``copy_`` in place; returns how many."""
    users = graph.users()
    outputs = {n.id for n in graph.output.inputs}
    waited = graph.waited_on()
    changed = 0
    for back in list(graph.nodes):
        if back.kind != "call" or back.target is not aten.copy_.default or len(back.args) != 2 or back.kwargs:
            continue
        buf, update = back.args
        if getattr(buf, "kind", None) != "placeholder" or getattr(update, "kind", None) != "call" \
                or update.target not in IN_PLACE or not update.args or update.args[0] is not buf:
            continue
        if {u.id for u in users.get(buf.id, ())} != {update.id, back.id} or buf.id in outputs \
                or any(n.stream is not None or n.waits or n.id in waited for n in (update, back)) \
                or update.meta != buf.meta:
            continue
        in_place = graph.call(IN_PLACE[update.target], update.args, dict(update.kwargs), meta=update.meta,
                              before=update)
        graph.replace_all_uses(update, in_place)
        graph.replace_all_uses(back, in_place)  # copy_ returned the buffer: so does the in-place update
        graph.remove(back)
        graph.remove(update)  # ``users`` stays right for every other buffer: only this one's readers changed
        changed += 1
    return changed


def _run(step: Step) -> dict:
    return {"reinplace": reinplace_buffer_updates(step.graph)}


REINPLACE = Pass("reinplace", "finish", _run,
                 "a buffer's functional update written back with copy_ becomes an in-place update")
