"""Constant de-duplication by content (GE's Const dedup): equal constants become one node.

CSE of computations needs no pass of its own: in the e-graph two equal terms are one e-class.
Constants are compared by dtype, shape, device and their bytes (so -0.0 and 0.0, or two NaN
payloads, stay apart: merging them would change results).
"""
from __future__ import annotations

import hashlib

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ..ir import Graph

__all__ = ["constant_key", "dedup_constants"]


# tensor -> (its version counter, its key): the optimizer runs several times per graph (rounds,
# gears) and hashing real weights costs ~0.1 s per 100 MB each time. Keyed by identity, weakly.
_key_cache = WeakIdKeyDictionary()


def constant_key(value) -> tuple:
    """A hashable key equal for two constants exactly when their contents are bit-identical."""
    if not isinstance(value, torch.Tensor):
        return ("py", type(value).__name__, repr(value)) if isinstance(value, (int, float, bool, str, type(None))) else ("id", id(value))
    if value.is_sparse or value.is_quantized or value.is_nested or value.layout != torch.strided:
        return ("id", id(value))
    cached = _key_cache.get(value)
    if cached is not None and cached[0] == value._version:
        return cached[1]
    t = value.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    # clone, not contiguous(): a 1-element tensor with stride 0 counts as contiguous but cannot be viewed as bytes.
    raw = t.clone(memory_format=torch.contiguous_format).reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
    digest = hashlib.blake2b(memoryview(raw.numpy()), digest_size=16).hexdigest()
    key = ("tensor", str(value.dtype), tuple(value.shape), str(value.device), value.requires_grad, digest)
    _key_cache[value] = (value._version, key)
    return key


def dedup_constants(graph: Graph) -> int:
    """Make readers of duplicate constant tensors read the first copy. Returns how many merged."""
    first: dict[tuple, object] = {}
    replace = {}
    for n in graph.nodes:
        if n.kind == "constant" and isinstance(n.value, torch.Tensor):
            key = constant_key(n.value)
            keep = first.setdefault(key, n)
            if keep is not n:
                replace[n.id] = keep
    if not replace:
        return 0
    from ..ir import map_nodes

    swap = lambda n: replace.get(n.id, n)  # noqa: E731
    for n in graph.nodes:
        n.args = map_nodes(n.args, swap)
        n.kwargs = map_nodes(n.kwargs, swap)
    graph.nodes = [n for n in graph.nodes if n.id not in replace]
    return len(replace)
