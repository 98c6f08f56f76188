"""The execution plan of a static graph (reduce-overhead mode): decided once, followed by every call.

From one observed run (`rewrite.exec.observe`) each call node gets a kind:

* ``fixed``: its value is a view of planned memory or of a constant (a reshape of a buffer, a
  permute of a weight): made once per arena, never per call;
* ``alias``: a copy elided because its input dies there: its value is its input's;
* ``out``: it writes into its planned buffer(s) with ATen's ``out=`` variant (only variants with a
  real kernel for the device; ``autogen`` ones copy, and are skipped);
* ``native``: a static kernel (`rewrite.kernels`) writes its result, into its buffer or, when the
  caller gets the result, into a tensor allocated for the call;
* ``call``: the functional ATen kernel runs per call and allocates its result (ops without an
  ``out=`` variant, results the caller keeps, anything reading per-call memory through a view);
* ``fused``: a step of a group of static-kernel steps that run as one kernel, the group's last step
  (its ``native`` root, whose ``operands`` name what the group reads; `rewrite.kernels.fusion`): it
  does not run, and its value is never made.

A storage whose owner writes into planned memory and that the caller never sees becomes a buffer
of the arena; buffers are placed by liveness (`memory.assign_offsets`), a view keeping its base
alive. What the caller gets back is never arena memory: outputs (and everything sharing their
storage) are made per call, and returned constants are copied, so the next call cannot overwrite
what an earlier call returned. Graphs that mutate anything but their inputs are not planned.

A plan is plain data (`to_dict`/`from_dict`: ints, strings, dtype names), so a compile cache can
store it next to the graph and rebuild the executable without observing again.
"""
from __future__ import annotations

import dataclasses

import torch

from ..ir import Graph, Node, is_side_effect
from ..ops import draws_random_numbers, dtype_str
from .memory import assign_offsets
from .observe import Layout, Observation

__all__ = ["ExecutionPlan", "NodePlan", "Buffer", "make_plan", "out_variant", "unplannable", "written_args",
           "mutated_inputs"]

KINDS = ("fixed", "alias", "out", "native", "call", "fused")
# Copies whose result may simply be their input when the input dies there (same layout).
_ELIDABLE_COPIES = frozenset({torch.ops.aten.clone.default})


@dataclasses.dataclass
class Buffer:
    offset: int  # bytes into the arena
    nbytes: int
    layout: Layout  # the owner's tensor in that storage


@dataclasses.dataclass
class NodePlan:
    kind: str  # one of KINDS
    buffers: list  # per output: index into ExecutionPlan.buffers, or None
    fresh: list  # per output of a native step: allocated per call (the caller keeps it)
    kernel: str | None = None  # native: the static kernel's key
    alias_of: int | None = None  # alias: index in graph.nodes of the node whose value it takes
    operands: list | None = None  # native root of a fused group: indices in graph.nodes of what its kernel reads


@dataclasses.dataclass
class ExecutionPlan:
    graph_name: str
    nodes: dict  # index in graph.nodes -> NodePlan, for call nodes
    buffers: list  # of Buffer
    arena_bytes: int
    inputs: dict  # placeholder index -> Layout the plan assumes (checked per call)
    native_layouts: dict = dataclasses.field(default_factory=dict)  # node index -> [Layout] of fresh outputs
    copy_outputs: list = dataclasses.field(default_factory=list)  # output node indices returned as copies

    def counts(self) -> dict:
        out: dict = {k: 0 for k in KINDS}
        for p in self.nodes.values():
            out[p.kind] += 1
        return out

    # -- plain data ------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "graph": self.graph_name,
            "arena_bytes": self.arena_bytes,
            "buffers": [{"offset": b.offset, "nbytes": b.nbytes, "layout": _layout_dict(b.layout)} for b in self.buffers],
            "nodes": {str(i): dataclasses.asdict(p) for i, p in self.nodes.items()},
            "inputs": {str(i): _layout_dict(l) for i, l in self.inputs.items()},
            "native_layouts": {str(i): [_layout_dict(l) for l in ls] for i, ls in self.native_layouts.items()},
            "copy_outputs": list(self.copy_outputs),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "ExecutionPlan":
        return cls(
            d["graph"], {int(i): NodePlan(**p) for i, p in d["nodes"].items()},
            [Buffer(b["offset"], b["nbytes"], _layout_from(b["layout"])) for b in d["buffers"]],
            d["arena_bytes"], {int(i): _layout_from(l) for i, l in d["inputs"].items()},
            {int(i): [_layout_from(l) for l in ls] for i, ls in d.get("native_layouts", {}).items()},
            [int(i) for i in d.get("copy_outputs", [])])


def _layout_dict(l: Layout) -> dict:
    return {"dtype": dtype_str(l.dtype), "size": list(l.size), "stride": list(l.stride), "offset": l.offset,
            "device": str(l.device)}


def _layout_from(d: dict) -> Layout:
    dtype = getattr(torch, d["dtype"])
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"plan: {d['dtype']!r} is not a dtype")
    return Layout(dtype, tuple(int(s) for s in d["size"]), tuple(int(s) for s in d["stride"]), int(d["offset"]),
                  torch.device(d["device"]))


# -- out= variants -------------------------------------------------------------------------------------

_OUT_CACHE: dict = {}


def out_variant(target, device_type: str = "cpu"):
    """The ``out=`` overload taking exactly ``target``'s arguments, with a real kernel on the device."""
    key = (target, device_type)
    if key in _OUT_CACHE:
        return _OUT_CACHE[key]
    found = None
    if isinstance(target, torch._ops.OpOverload) and not target._schema.is_mutable:
        args = [(a.name, str(a.type), a.kwarg_only) for a in target._schema.arguments]
        packet = target.overloadpacket
        for name in packet.overloads():
            if "out" not in name:
                continue
            cand = getattr(packet, name)
            outs = [a for a in cand._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
            rest = [(a.name, str(a.type), a.kwarg_only) for a in cand._schema.arguments if a not in outs]
            if rest == args and len(outs) == len(target._schema.returns) and torch._C._dispatch_has_kernel_for_dispatch_key(
                    cand.name(), device_type.upper()):
                found = (cand, tuple(a.name for a in outs))
                break
    _OUT_CACHE[key] = found
    return found


# -- planning ---------------------------------------------------------------------------------------------

def written_args(n: Node) -> list:
    """The arguments call node ``n`` writes to (by its schema's alias annotations)."""
    t = n.target
    if n.kind != "call" or not isinstance(t, torch._ops.OpOverload) or not t._schema.is_mutable:
        return []
    return [v for a, v in zip(t._schema.arguments, n.args) if a.alias_info is not None and a.alias_info.is_write]


def mutated_inputs(graph: Graph) -> list[int]:
    """Indices of the placeholders the graph writes to (``copy_`` of an input update and the like)."""
    index = {p.id: k for k, p in enumerate(graph.placeholders)}
    return sorted({index[v.id] for n in graph.nodes for v in written_args(n) if isinstance(v, Node) and v.id in index})


def unplannable(graph: Graph) -> str | None:
    """Why ``graph`` cannot get a plan (None when it can)."""
    inputs = {p.id for p in graph.placeholders}
    for n in graph.nodes:
        if any(not isinstance(v, Node) or v.id not in inputs for v in written_args(n)):
            return f"%{n.name} ({n.op}) writes to an intermediate value"
    return None


def _escaping(graph: Graph, obs: Observation) -> set:
    """Storages the caller receives (through any output)."""
    out = set()
    for n in graph.output.inputs:
        for f in obs.facts(n):
            if f is not None:
                out.add(f.storage)
    return out


def _readers_last(order: list, obs: Observation) -> dict:
    """Storage -> position in ``order`` of the last call node reading any tensor in it."""
    last: dict = {}
    for pos, n in enumerate(order):
        if n.kind not in ("call", "output"):
            continue
        for i in n.inputs:
            for f in obs.facts(i):
                if f is not None:
                    last[f.storage] = max(last.get(f.storage, -1), pos)
    return last


def _owns_all(n: Node, obs: Observation) -> bool:
    """Whether every tensor ``n`` returns is a storage ``n`` made (no view of an argument)."""
    facts = obs.facts(n)
    if not facts or any(f is None for f in facts):
        return False
    for k, f in enumerate(facts):
        s = obs.storages[f.storage]
        if s.origin != "call" or s.owner != n.id or s.owner_output != k:
            return False
    return len({f.storage for f in facts}) == len(facts)


def _has_subgraph(n: Node) -> bool:
    from ..ir import iter_instances

    return any(True for _ in iter_instances((n.args, n.kwargs), Graph))


def make_plan(graph: Graph, obs: Observation, device_type: str = "cpu", native=None, fuse=None) -> ExecutionPlan:
    """Plan ``graph`` from its observed run. ``native(node, obs)`` returns a static kernel key or None;
    ``fuse(graph, kernels)`` (node id -> key) the groups of steps that run as one kernel (`rewrite.kernels`)."""
    order = graph.nodes
    pos = {n.id: i for i, n in enumerate(order)}
    escaping = _escaping(graph, obs)
    last_read = _readers_last(order, obs)

    # 1. who writes into planned memory
    owner_kind: dict[int, str] = {}
    kernels: dict[int, str] = {}
    for n in order:
        if n.kind != "call" or not _owns_all(n, obs) or _has_subgraph(n) or is_side_effect(n) \
                or draws_random_numbers(n.target, n.args, n.kwargs):  # attention without dropout is planned
            continue
        key = native(n, obs) if native is not None else None
        if key is not None:
            owner_kind[n.id], kernels[n.id] = "native", key
        elif not any(f.storage in escaping for f in obs.facts(n)) and out_variant(n.target, device_type):
            owner_kind[n.id] = "out"

    def planned(storage: int) -> bool:
        s = obs.storages[storage]
        return s.origin == "call" and s.owner in owner_kind and storage not in escaping

    # 2. copies elided where their input dies: the copy's result is its input's buffer
    merged: dict[int, int] = {}  # storage -> the storage it became
    alias_of: dict[int, int] = {}  # node id -> the node id whose value it takes
    for n in order:
        if n.kind != "call" or n.target not in _ELIDABLE_COPIES or n.kwargs.get("memory_format") is not None:
            continue
        fi, fo = _single(obs.facts(n.args[0])), _single(obs.facts(n))
        if fi is None or fo is None or fi.layout != fo.layout or not planned(fi.storage) \
                or fo.storage in escaping or last_read.get(fi.storage, -1) > pos[n.id]:
            continue
        merged[fo.storage] = fi.storage
        alias_of[n.id] = n.args[0].id
        owner_kind.pop(n.id, None)
        kernels.pop(n.id, None)
        last_read[fi.storage] = max(last_read.get(fi.storage, -1), last_read.get(fo.storage, -1))

    def storage_of(f) -> int:
        return merged.get(f.storage, f.storage)

    def stays(f) -> bool:  # memory that is the same in every call of one arena
        return f is None or planned(storage_of(f)) or obs.storages[storage_of(f)].origin == "constant"

    # 3. each call node's kind; fixed values are views of constants or buffers made from fixed values
    fixed_value: set[int] = {n.id for n in order if n.kind == "constant"}
    plans: dict[int, NodePlan] = {}
    for n in order:
        if n.kind != "call":
            continue
        facts = obs.facts(n) or [None]
        width = len(facts)
        if n.id in alias_of:
            plans[pos[n.id]] = NodePlan("alias", [None], [False], alias_of=pos[alias_of[n.id]])
            if alias_of[n.id] in fixed_value:
                fixed_value.add(n.id)
        elif n.id in owner_kind:
            bufs = [None] * width  # filled in step 4
            plans[pos[n.id]] = NodePlan(owner_kind[n.id], bufs, [False] * width, kernels.get(n.id))
            if all(f is not None and planned(storage_of(f)) for f in facts):
                fixed_value.add(n.id)
        elif (not is_side_effect(n) and not _has_subgraph(n) and not draws_random_numbers(n.target, n.args, n.kwargs)
              and all(stays(f) for f in facts) and all(m.id in fixed_value for m in n.inputs)):
            plans[pos[n.id]] = NodePlan("fixed", [None] * width, [False] * width)
            fixed_value.add(n.id)
        else:
            plans[pos[n.id]] = NodePlan("call", [None] * width, [False] * width)

    # 4. groups of static-kernel steps run as one kernel where their last step (the root) ran: the others do
    # not run, and what the group reads stays alive until the root
    if fuse is not None and kernels:
        writes = [pos[n.id] for n in order if written_args(n)]  # writes to inputs (a KV cache's update)
        for group in fuse(graph, dict(kernels)):  # kernels: every native step (step 2 dropped the elided copies)
            root = pos[group.root.id]
            first = min(pos[s.id] for s in group.steps)
            if any(first < w < root for w in writes):  # the group's reads would move past a write
                continue
            for nid in group.members - {group.root.id}:
                owner_kind.pop(nid, None)
                kernels.pop(nid, None)
                width = len(plans[pos[nid]].buffers)
                plans[pos[nid]] = NodePlan("fused", [None] * width, [False] * width)
            kernels[group.root.id] = plans[root].kernel = group.key
            plans[root].operands = [pos[m.id] for m in group.inputs]
            for m in group.inputs:
                for f in obs.facts(m):
                    if f is not None:
                        for s in (f.storage, storage_of(f)):
                            last_read[s] = max(last_read.get(s, -1), root)

    # 5. buffers, placed by liveness
    storages = sorted({storage_of(f) for nid in owner_kind for f in obs.facts(order[pos[nid]])
                       if planned(storage_of(f))})
    spans = []
    for s in storages:
        fact = obs.storages[s]
        layout = obs.facts(order[pos[fact.owner]])[fact.owner_output].layout
        first = pos[fact.owner]
        spans.append((first, max(first, last_read.get(s, first)), max(fact.nbytes, layout.span()), layout))
    offsets, total = assign_offsets([(a, b, c) for a, b, c, _ in spans])
    buffers = [Buffer(off, nbytes, layout) for off, (_, _, nbytes, layout) in zip(offsets, spans)]
    index = {s: k for k, s in enumerate(storages)}
    native_layouts: dict = {}
    for nid, kind in owner_kind.items():
        facts = obs.facts(order[pos[nid]])
        plan = plans[pos[nid]]
        plan.buffers = [index.get(storage_of(f)) for f in facts]
        if kind == "native":
            plan.fresh = [b is None for b in plan.buffers]
            if any(plan.fresh):
                native_layouts[pos[nid]] = [f.layout for f in facts]

    inputs = {}
    for k, p in enumerate(graph.placeholders):
        f = _single(obs.facts(p))
        if f is not None:
            inputs[k] = f.layout
    return ExecutionPlan(graph.name, plans, buffers, total, inputs, native_layouts, _copied_outputs(graph, obs, pos))


def _copied_outputs(graph: Graph, obs: Observation, pos: dict) -> list:
    """Outputs in the memory of a folded constant: returned as copies, so no caller can change the
    constant (a frozen weight is returned as itself, as eager returns the parameter)."""
    out = []
    for n in graph.output.inputs:
        for f in obs.facts(n):
            s = None if f is None else obs.storages[f.storage]
            if s is not None and s.origin == "constant" and "weight_name" not in graph.nodes[pos[s.owner]].attrs:
                out.append(pos[n.id])
                break
    return out


def _single(facts: list):
    return facts[0] if len(facts) == 1 else None


def describe(plan: ExecutionPlan) -> str:
    c = plan.counts()
    return (f"plan {plan.graph_name}: {len(plan.buffers)} buffers in {plan.arena_bytes} bytes; "
            f"{c['fixed']} fixed, {c['out']} out=, {c['native']} static kernels, {c['call']} per-call ops"
            + (f", {c['fused']} steps fused into others" if c["fused"] else ""))

