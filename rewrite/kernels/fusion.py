"""Which neighbouring static-kernel steps run as one loop (pointwise fusion of the execution plan).

A ResNet block's ``batch_norm -> relu`` or ``batch_norm -> add -> relu`` were one static kernel each:
every step read its input from memory and wrote its result back, for the next step to read again.
A group of such steps becomes one kernel (`cgen.gen_fused`) that keeps the values between them in
registers, so only the group's inputs are read and only its last value is written.

A group is found from its last step (its root) backwards: a step joins when it is a pointwise op or
an inference batch norm (with the ``getitem`` taking its result) of the root's shape, and every
reader of its value is already in the group (so the value is needed nowhere else, not even as an
output of the graph). Steps that anything waits for, or that wait, stay on their own. The planner
(`rewrite.exec.plan.make_plan`) runs the root's kernel where the root ran, with the group's inputs,
and skips the other steps; it leaves apart a group whose steps lie on both sides of a write to an
input (a KV cache's update), whose reads would otherwise move past the write.
"""
from __future__ import annotations

import dataclasses
import operator

from ..ir import Graph, Node
from . import cgen
from .signature import FUSED, MAX_STEPS, tensor_operands

__all__ = ["Group", "find_groups", "fused_signature"]

@dataclasses.dataclass
class Group:
    root: Node
    steps: list  # the ops, in graph order (the root last)
    members: set  # ids of every node the fused kernel replaces: the steps and the getitems between them
    inputs: list  # the nodes it reads from outside, in the order of the fused signature's inputs
    key: str | None = None  # the fused kernel's key, once decided


def find_groups(graph: Graph, kernels: dict, signatures: dict) -> list[Group]:
    """Groups of at least two steps; ``kernels``: node id -> the node's own kernel key (its static kernel),
    ``signatures``: key -> signature."""
    users = graph.users()
    waited = {w.id for n in graph.nodes for w in n.waits}

    def op(n: Node) -> str | None:
        key = kernels.get(n.id)
        return signatures[key]["op"] if key is not None else None

    def size(n: Node) -> list | None:
        key = kernels.get(n.id)
        return signatures[key]["outputs"][0]["size"] if key is not None else None

    def fusable(n: Node) -> bool:
        return not n.waits and n.id not in waited

    def joining(m: Node, shape: list) -> list[Node]:
        """The nodes that join a group of ``shape`` for its step reading ``m`` ([] when none can)."""
        if not fusable(m):
            return []
        if op(m) in cgen.POINTWISE_OPS and size(m) == shape:
            return [m]
        if m.kind == "call" and m.target is operator.getitem and m.args[1] == 0 and isinstance(m.args[0], Node):
            bn = m.args[0]
            if op(bn) == cgen.BATCH_NORM and size(bn) == shape and fusable(bn):
                return [m, bn]
        return []

    taken: set[int] = set()
    groups = []
    for root in reversed(graph.nodes):
        if root.id in taken or op(root) not in cgen.POINTWISE_OPS or not fusable(root):
            continue
        shape = size(root)
        members, found, count = {root.id}, [root], 1
        changed = True
        while changed and count < MAX_STEPS:  # a step joins once all its readers have: look again after a join
            changed = False
            for n in found:  # grows while it is walked: a chain joins in one pass
                for m in n.inputs:
                    if m.id in members or m.id in taken or count >= MAX_STEPS:
                        continue
                    joined = joining(m, shape)
                    ids = {j.id for j in joined}
                    if joined and not ids & taken \
                            and all(u.id in members or u.id in ids for j in joined for u in users.get(j.id, [])):
                        members |= ids
                        found += joined
                        count += 1  # a batch norm and its getitem are one step
                        changed = True
        steps = [n for n in graph.nodes if n.id in members and n.id in kernels]
        if len(steps) < 2:
            continue
        inputs, seen = [], set()
        for s in steps:
            for m in tensor_operands(s):
                if m.id not in members and m.id not in seen:
                    seen.add(m.id)
                    inputs.append(m)
        taken |= members
        groups.append(Group(root, steps, members, inputs))
    return groups


def fused_signature(group: Group, kernels: dict, signatures: dict) -> dict:
    """The signature of ``group``'s fused kernel (checked by `signature.check` like any other)."""
    position = {s.id: j for j, s in enumerate(group.steps)}
    slot = {m.id: k for k, m in enumerate(group.inputs)}
    steps, layouts = [], [None] * len(group.inputs)
    for s in group.steps:
        sig = signatures[kernels[s.id]]
        sources = []
        for k, m in enumerate(tensor_operands(s)):
            if m.id in group.members:
                step = m if m.id in position else m.args[0]  # a step, or the getitem of a batch norm step's result
                sources.append(["step", position[step.id]])
            else:
                sources.append(["input", slot[m.id]])
                layouts[slot[m.id]] = sig["inputs"][k]
        steps.append({"signature": sig, "sources": sources})
    root = signatures[kernels[group.root.id]]
    return {"op": FUSED, "args": [["steps", steps]], "inputs": layouts, "outputs": [root["outputs"][0]]}
