"""Tensor subclasses among a graph's inputs (DTensor, tensor parallelism), as AOTAutograd flattens them.

A model sharded with ``torch.distributed.tensor.parallel.parallelize_module`` holds its weights as
DTensors. Dynamo passes them to the backend as graph inputs, with the device mesh as one more
input; AOTAutograd then hands rewrite a graph over plain values: each traceable wrapper subclass
becomes its inner attributes in ``__tensor_flatten__`` order, recursively (a DTensor: its local
shard, then its device mesh). `flatten_inputs` repeats that flattening, so the backend can tell which
of the graph's inputs holds which weight (to freeze it, to export it, to cache it).

A DTensor is a wrapper around this rank's shard: its own ``data_ptr()`` is 0 and its ``_version``
does not move when it is updated in place; `plain_tensors` are the tensors that hold its values.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

__all__ = ["is_subclass", "flatten", "flatten_inputs", "plain_tensors", "layout_text"]


def is_subclass(value) -> bool:
    return isinstance(value, torch.Tensor) and is_traceable_wrapper_subclass(value)


def flatten(value, name: str) -> list[tuple[str, object]]:
    """``[(name, value)]``, or a subclass's inner values named ``{name}.{attr}`` (AOTAutograd's order)."""
    if not is_subclass(value):
        return [(name, value)]
    attrs, _ = value.__tensor_flatten__()
    out = []
    for attr in attrs:
        out.extend(flatten(getattr(value, attr), f"{name}.{attr}"))
    return out


def flatten_inputs(values: list, names: list) -> tuple[list, list, list] | None:
    """Graph inputs as AOTAutograd's graph takes them: (values, names, index of the Dynamo input each
    came from); None when no input is a subclass (the lists are the graph's as they are)."""
    if not any(is_subclass(v) for v in values):
        return None
    flat_values, flat_names, origin = [], [], []
    for i, (v, n) in enumerate(zip(values, names)):
        for inner_name, inner in flatten(v, n):
            flat_values.append(inner)
            flat_names.append(inner_name)
            origin.append(i)
    return flat_values, flat_names, origin


def plain_tensors(t: torch.Tensor) -> list:
    """The plain tensors that hold ``t``'s values: ``t`` itself, or a subclass's inner tensors."""
    if not is_subclass(t):
        return [t]
    return [v for _, v in flatten(t, "") if isinstance(v, torch.Tensor)]


def layout_text(t: torch.Tensor) -> str:
    """How a subclass lays its values out across ranks ('' for a plain tensor): a DTensor's placements
    and mesh, so a program built for one sharding never serves another."""
    if not is_subclass(t):
        return ""
    placements, mesh = getattr(t, "placements", None), getattr(t, "device_mesh", None)
    if placements is not None and mesh is not None:
        return f"<{type(t).__name__} {list(placements)} mesh {mesh.mesh.tolist()}>"
    return f"<{type(t).__name__}>"
