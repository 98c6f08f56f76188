"""Memory planned ahead: buffers placed in one arena by liveness, arenas pooled per compiled function.

`assign_offsets` places buffers whose lifetimes (first and last step that touches them) do not
overlap at the same bytes: greedy by size, largest first, each at the lowest offset where it
fits beside the buffers already placed that are alive at the same time (the strategy of TFLite's
arena planner; within a few percent of optimal on transformer graphs, and linear in practice).

An `ArenaPool` belongs to one compiled function and serves all its gears: only one gear runs per
call, so one arena as large as the largest gear's plan serves every gear. A call leases an arena
for its duration; two threads calling the function at once get two arenas (an arena is never
shared by concurrent calls), and the pool keeps what it created for later calls. Each arena
caches, per plan, the tensors that view it (`Arena.bindings`), so views of planned buffers are
made once per arena, not per call.
"""
from __future__ import annotations

import dataclasses
import functools
import heapq
import operator
import threading

import torch

from .. import ops
from ..ir import Graph, Node, TensorMeta, iter_metas

__all__ = ["ALIGN", "assign_offsets", "Arena", "ArenaPool", "predict_peak_bytes", "output_bytes", "PoolMemory"]

# Every buffer starts on a 64-byte boundary: a cache line, and enough for any dtype and AVX-512 loads.
ALIGN = 64


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def assign_offsets(buffers: list[tuple[int, int, int]]) -> tuple[list[int], int]:
    """Offsets for ``buffers`` given as ``(first_step, last_step, nbytes)``; returns (offsets, arena bytes).

    Two buffers get overlapping bytes only if their step ranges (inclusive) are disjoint.
    """
    order = sorted(range(len(buffers)), key=lambda i: (-buffers[i][2], buffers[i][0], i))
    offsets = [0] * len(buffers)
    placed: list[int] = []
    total = 0
    for i in order:
        first, last, nbytes = buffers[i]
        size = _align(max(nbytes, 1))
        busy = sorted((offsets[j], offsets[j] + _align(max(buffers[j][2], 1))) for j in placed
                      if not (buffers[j][1] < first or last < buffers[j][0]))
        at = 0
        for start, end in busy:
            if at + size <= start:
                break
            at = max(at, end)
        offsets[i] = at
        placed.append(i)
        total = max(total, at + size)
    return offsets, total


class Arena:
    """One block of memory and the per-plan tensors that view it."""

    __slots__ = ("memory", "nbytes", "bindings")

    def __init__(self, nbytes: int, device: torch.device):
        self.nbytes = nbytes
        self.memory = torch.empty(max(_align(nbytes), ALIGN), dtype=torch.uint8, device=device)
        self.bindings: dict = {}  # plan id -> what the plan made of this arena (see planned.Binding)

    def view(self, offset: int, layout) -> torch.Tensor:
        """A tensor of ``layout`` (an observe.Layout) whose storage starts ``offset`` bytes into the arena."""
        dtype = layout.dtype
        return self.memory.view(dtype).as_strided(layout.size, layout.stride, offset // dtype.itemsize + layout.offset)


class ArenaPool:
    """The arenas of one compiled function (all its gears), leased one per concurrent call."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.nbytes = 0  # what the largest plan registered so far needs
        self._free: list[Arena] = []
        self._lock = threading.Lock()
        self.created = 0  # arenas made so far (one per level of concurrency seen)

    def require(self, nbytes: int) -> None:
        """Make every arena handed out from now on at least ``nbytes`` large."""
        with self._lock:
            self.nbytes = max(self.nbytes, nbytes)

    def acquire(self) -> Arena:
        try:
            arena = self._free.pop()  # list.pop and append are atomic: no lock on the per-call path
        except IndexError:
            arena = None
        if arena is None or arena.nbytes < self.nbytes:
            with self._lock:
                self.created += 1
            arena = Arena(self.nbytes, self.device)
        return arena

    def release(self, arena: Arena) -> None:
        if arena.nbytes >= self.nbytes:
            self._free.append(arena)

    def bytes_held(self) -> int:
        """Bytes of the arenas resting in the pool (leased ones are not counted)."""
        return sum(a.nbytes for a in list(self._free))


def _meta_bytes(meta) -> int:
    return sum(int(m.numel()) * m.dtype.itemsize for m in iter_metas(meta) if isinstance(m, TensorMeta)
               and m.is_static())


def output_bytes(graph: Graph) -> int:
    """Bytes of the tensors a static graph returns (each counted once)."""
    seen: set[int] = set()
    total = 0
    for v in graph.outputs if isinstance(graph.outputs, (list, tuple)) else [graph.outputs]:
        if isinstance(v, Node) and v.id not in seen and v.kind == "call":
            seen.add(v.id)
            total += _meta_bytes(v.meta)
    return total


def predict_peak_bytes(graph: Graph, in_pool=None) -> int:
    """The most bytes a static graph's intermediate values and outputs hold at once when its ops run
    one by one in graph order, each result freed after its last reader (views and items of a tuple
    share their base's bytes; inputs and constants are not counted). Read from the metas alone,
    before anything runs: the figure a memory pool shared by gears is predicted from. Kernels that
    fuse ops (Inductor's) keep fewer values alive, so for them it is an upper bound. ``in_pool(node)``
    says whether a value's bytes come from the pool at all (default: every value's do)."""
    last_use: dict[int, int] = {}
    for i, n in enumerate(graph.nodes):
        for v in n.inputs:
            last_use[v.id] = i
    outputs = {v.id for v in graph.output.inputs}
    owner_of: dict[int, int] = {}  # node id -> id of the node whose bytes it uses
    size: dict[int, int] = {}  # owner id -> bytes, while alive
    last_read: dict[int, int] = {}  # owner id -> the last step that reads it or a view of it
    kept: set[int] = set()  # owners an output uses: alive to the end
    frees: list[tuple[int, int]] = []  # heap of (step, owner); stale entries are skipped
    live = peak = 0
    for i, n in enumerate(graph.nodes):
        if n.kind != "call":
            continue
        base = n.args[0] if n.args and isinstance(n.args[0], Node) else None
        if base is not None and (n.target is operator.getitem or ops.returns_view(n.target)):
            owner = owner_of.get(base.id)
            if owner is None:
                continue  # a view of an input or a constant: no bytes of the graph's own
        else:
            owner = n.id
            size[owner] = _meta_bytes(n.meta) if in_pool is None or in_pool(n) else 0
            live += size[owner]
            peak = max(peak, live)
        owner_of[n.id] = owner
        if n.id in outputs:
            kept.add(owner)
        last_read[owner] = max(last_read.get(owner, i), last_use.get(n.id, i))
        heapq.heappush(frees, (last_read[owner], owner))
        while frees and frees[0][0] <= i:
            step, o = heapq.heappop(frees)
            if o in size and o not in kept and last_read[o] == step:
                live -= size.pop(o)
    return peak


@dataclasses.dataclass
class PoolMemory:
    """The memory all gears of one compiled function share, predicted from their metas before any gear is built
    and, once they are, what was allocated; `rewrite.explain` prints it as the graph's ``memory:`` line.

    ``where``: "CPU arena" (one arena as large as the largest gear's plan serves every gear; a concurrent caller
    gets an arena of its own) or "CUDA graph pool" (one pool for every gear's CUDA graph, captured largest first,
    so the smaller gears reuse what the largest freed; each gear's outputs stay in it for the next replay).
    ``largest``: the largest gear alone (its peak of live values, `predict_peak_bytes`; on CPU only the values a
    plan can place in the arena: outputs and results of ops with no ``out=`` variant are made per call);
    ``predicted``: all gears together (CPU: the largest; CUDA: the largest plus every other gear's outputs). Both are upper bounds where
    kernels fuse values away. ``allocated``: what the arena or pool holds once the gears are built (None until
    then); ``input_buffers``: CUDA's copied inputs, outside the pool, each as large as the largest gear needs."""

    where: str
    gears: int = 0
    largest: int = 0
    predicted: int = 0
    allocated: int | None = None
    input_buffers: int = 0

    @classmethod
    def predicted_for(cls, graphs: list, where: str, in_pool=None) -> "PoolMemory":
        """``in_pool(graph, node)``: whether the node's value takes memory of the pool (default: all do)."""
        peaks = [predict_peak_bytes(g, None if in_pool is None else functools.partial(in_pool, g)) for g in graphs]
        if not peaks:
            return cls(where)
        k = max(range(len(peaks)), key=peaks.__getitem__)
        predicted = peaks[k]
        if where == "CUDA graph pool":
            predicted += sum(output_bytes(g) for i, g in enumerate(graphs) if i != k)
        return cls(where, len(graphs), peaks[k], predicted)

    def __str__(self) -> str:
        mib = 1 << 20
        text = (f"{self.where} of {self.gears} gear(s): predicted {self.predicted / mib:.2f} MiB "
                f"({self.predicted / max(self.largest, 1):.2f}x the largest gear's {self.largest / mib:.2f} MiB)")
        if self.allocated is not None:
            text += f"; allocated {self.allocated / mib:.2f} MiB"
        if self.input_buffers:
            text += f"; input buffers {self.input_buffers / mib:.2f} MiB"
        return text
