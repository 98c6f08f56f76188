"""``config.cache.dir`` for ``torch.compile(backend=rewrite.get_backend(config))``.

Dynamo still traces and AOTAutograd still produces the core-ATen graph (their guards are what
make the graph valid for a call); the backend then looks the graph up before importing it. On a
hit the optimized symbolic graph and every gear's optimized static graph come from the cache and
are only built (execution plans, kernels); nothing is optimized. On a miss they are optimized as
usual and written. The key (see key.py): the AOT graph's canonical print and input metas, the
graph kind, the config, frozen weights' checksums, the gears and merge policy, the versions, the
devices and dtypes.
"""
from __future__ import annotations

import logging
import os

import torch

from ..gears.spec import MAX_GEARS
from ..ir import Graph
from .graph_files import GRAPHS_FILE, check_error, decode_graphs, encode_graphs
from .key import config_digest, digest, key_hash, tensor_digest, versions
from .store import CacheDir, count

log = logging.getLogger("rewrite")

__all__ = ["AotEntry", "aot_entry", "gear_label", "parse_gear_label", "gear_graphs_by_key"]


def _meta_text(val) -> str:
    if isinstance(val, torch.Tensor):
        dtype = str(val.dtype).replace("torch.", "")
        shape = ",".join(str(s) for s in val.shape)
        stride = ",".join(str(s) for s in val.stride()) if val.layout == torch.strided else ""
        return f"{dtype}[{shape}]/[{stride}]@{val.device.type}"
    if isinstance(val, (list, tuple)):
        return "(" + ",".join(_meta_text(v) for v in val) + ")"
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)):
        return f"{type(val).__name__}:{val}"
    return type(val).__name__


def _arg_text(a) -> str:
    if isinstance(a, torch.fx.Node):
        return f"%{a.name}"
    if isinstance(a, (list, tuple)):
        inner = ",".join(_arg_text(x) for x in a)
        return f"[{inner}]" if isinstance(a, list) else f"({inner})"
    if isinstance(a, dict):
        return "{" + ",".join(f"{k}:{_arg_text(v)}" for k, v in a.items()) + "}"
    return repr(a)


def canonical_graph(gm: torch.fx.GraphModule) -> tuple[str, str]:
    """(graph text, input metas text): one line per node with its op, arguments and output meta.

    Node names, targets, arguments, dtypes, shapes (size symbols as Dynamo names them, stable for
    the same source), strides and devices; not stack traces or line numbers. Tensor constants the
    graph holds (get_attr) enter by checksum.
    """
    lines, inputs = [], []
    for n in gm.graph.nodes:
        meta = _meta_text(n.meta.get("val"))
        target = n.target if isinstance(n.target, str) else getattr(n.target, "__qualname__", None) or str(n.target)
        if isinstance(n.target, torch._ops.OpOverload):
            target = str(n.target)
        lines.append(f"{n.op} {n.name} {target} {_arg_text(n.args)} {_arg_text(n.kwargs)} -> {meta}")
        if n.op == "placeholder":
            inputs.append(meta)
        elif n.op == "get_attr":
            value = gm
            for part in str(n.target).split("."):
                value = getattr(value, part, None)
            if isinstance(value, torch.Tensor):
                lines.append(f"  value {tensor_digest([value])}")
    return "\n".join(lines), "; ".join(inputs)


def _gears_text(spec) -> str:
    if spec is None:
        return "none"
    inputs = "; ".join(f"input {i.index} dims {dict(sorted(i.dims.items()))}" for i in spec.inputs)
    gears = [sorted(g.items()) for g in spec.gears]
    return f"{spec.policy}: {inputs}: {gears}"


def gear_label(key: tuple) -> str:
    return "gear:" + ",".join(str(int(v)) for v in key)


def parse_gear_label(label: str) -> tuple | None:
    if not label.startswith("gear:"):
        return None
    parts = label[5:].split(",")
    if not parts or not all(p.isdigit() and len(p) < 19 for p in parts):
        raise ValueError(f"malformed gear label {label[:80]!r}")
    return tuple(int(p) for p in parts)


def gear_graphs_by_key(graphs: dict, where: str) -> dict:
    """Gear key -> graph, from decoded graphs that must all carry gear labels (``where`` names the file)."""
    out = {}
    for label, g in graphs.items():
        key = parse_gear_label(label)
        if key is None:
            raise ValueError(f"{where}: graph {label[:80]!r} is not a gear graph")
        out[key] = g
    return out


def common_fields(config) -> dict:
    return {"versions": versions(), "config": config_digest(config)[0]}


class AotEntry:
    """The cache entry of one AOT graph: where it lives, its key, and the tensors it may refer to."""

    def __init__(self, cache: CacheDir, fields: dict, label: str, live: dict):
        self.cache = cache
        self.fields = fields
        self.label = label
        self.live = live
        self.rel = os.path.join("graphs", key_hash(fields))
        self.ops_before: dict = {}

    def load(self) -> tuple[Graph, dict] | None:
        """(optimized graph, {gear key: optimized static graph}) on a hit; None on a miss (logged)."""
        entry = self.cache.lookup(self.rel, self.fields, f"graph {self.label}")
        if entry is None:
            return None
        try:
            graphs, extra = decode_graphs(entry, "", self.live, max_graphs=MAX_GEARS + 1)
            graph = graphs.pop("graph")
            gears = gear_graphs_by_key(graphs, GRAPHS_FILE)
            self.ops_before = {str(k): int(v) for k, v in dict(extra.get("ops_before", {})).items()}
        except Exception as e:  # noqa: BLE001 - a damaged entry is a miss, whatever it breaks
            if not check_error(e):
                raise
            self.cache.damaged(entry, e)
            return None
        count("hits")
        log.info("cache hit for graph %s: %s (%d gear graphs)", self.label, entry.folder, len(gears))
        return graph, gears

    def store(self, graph: Graph, gear_graphs: dict, ops_before: dict) -> None:
        graphs = {"graph": graph, **{gear_label(k): g for k, g in gear_graphs.items()}}
        try:
            files = encode_graphs(graphs, self.live, {"ops_before": ops_before})
        except Exception as e:  # noqa: BLE001 - a graph the format cannot hold is not cached, and says so
            log.warning("compile cache: graph %s is not cached: %s: %s", self.label, type(e).__name__, e)
            return
        if self.cache.write(self.rel, self.fields, files, kind="graph", label=self.label):
            log.info("compile cache: wrote graph %s to %s", self.label, self.cache.path(self.rel))


def aot_entry(config, gm: torch.fx.GraphModule, unit, frozen: dict, gear_spec) -> AotEntry:
    """The cache entry of the AOT graph ``gm`` compiled as ``unit`` (``config.cache.dir`` is set)."""
    text, inputs = canonical_graph(gm)
    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    tensors = [v for v in vals if isinstance(v, torch.Tensor)]
    live = {}
    if frozen:
        with torch._subclasses.fake_tensor.unset_fake_temporarily():
            live = {f"input{i}": t.detach() for i, t in sorted(frozen.items())}
        weights = f"{len(live)} frozen, {tensor_digest(live.values())}"
    else:
        weights = "not frozen"
    fields = {
        **common_fields(config),
        "kind": unit.kind,
        "graph": digest(text),
        "inputs": digest(inputs),
        "weights": weights,
        "gears": _gears_text(gear_spec),
        "device": ",".join(sorted({t.device.type for t in tensors})) or "none",
        "dtype": ",".join(sorted({str(t.dtype).replace("torch.", "") for t in tensors})) or "none",
    }
    return AotEntry(CacheDir.get(config.cache.dir, named=True), fields, unit.name, live)
