"""`rewrite.load`: run an exported graph with the rewrite executor, without Dynamo or the model's code.

Loading validates before it runs: the format and version of the graph file, every weight file's
size and sha256, every op name; for a multi-rank export, the manifest, the rank's graph file
checksum and the process group. Each call then checks its arguments against the traced
signature (dtypes, static sizes, the range of each size symbol) and names the input that does
not fit, instead of failing deep inside a kernel.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time

import sympy
import torch

from .. import exec as rexec
from ..config import CompilerConfig
from ..ir import Graph, SymMeta, TensorMeta
from ..report import GraphReport
from .errors import ExportError
from .format import FORMAT_VERSION, decode_graph
from .signature import InputBinder, build_result, scalar_value
from .weights import WeightReader

log = logging.getLogger("rewrite")

__all__ = ["load", "ExportedModel", "read_json", "check_header"]

MANIFEST_FORMAT = "rewrite.export.manifest"


def read_json(path: str, what: str) -> tuple[dict, bytes]:
    if not os.path.isfile(path):
        raise ExportError(f"{what} {path} is missing")
    with open(path, "rb") as f:
        raw = f.read()
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ExportError(f"{what} {path} is not valid JSON (truncated or edited?): {e}") from None
    if not isinstance(data, dict):
        raise ExportError(f"{what} {path} does not hold a JSON object")
    return data, raw


def check_header(data: dict, path: str, expected_format: str) -> None:
    fmt, version = data.get("format"), data.get("version")
    if fmt != expected_format:
        raise ExportError(f"{path} is not a {expected_format} file (format field is {fmt!r})")
    if not isinstance(version, int):
        raise ExportError(f"{path} has no integer format version (got {version!r})")
    if version > FORMAT_VERSION:
        raise ExportError(f"{path} was written in format version {version}, but this rewrite reads versions up to "
                          f"{FORMAT_VERSION}; upgrade rewrite to load it")
    if version < 1:
        raise ExportError(f"{path} has format version {version}; versions start at 1")


class ExportedModel:
    """A loaded export: call it like the model (same arguments, same shape of result)."""

    def __init__(self, program: dict, weights: WeightReader, config: CompilerConfig | None = None,
                 group_names: dict | None = None, use_gears: bool = True):
        self.program = program
        self.use_gears = use_gears
        self.config = config if config is not None else CompilerConfig()
        self.report = GraphReport(f"load:{program.get('name')}")
        with self.report.stage("decode"):
            self.graph = decode_graph(program["graph"], weights.decode_constant)
        if group_names:
            _rename_process_groups(self.graph, group_names)
        self._binder = InputBinder(program["inputs"])
        self._bindings = program["bindings"]
        placeholders = self.graph.placeholders
        if [b["placeholder"] for b in self._bindings] != [p.name for p in placeholders]:
            raise ExportError("the graph file's bindings do not match the graph's inputs "
                              f"({[b['placeholder'] for b in self._bindings]} vs {[p.name for p in placeholders]})")
        self._outputs = program["outputs"]
        self._symbols = {str(s): (s, info) for s, info in self.graph.symbols.items()}
        self._checks = self._input_checks()
        self._bound_leaves = {b["leaf"] for b in self._bindings if "leaf" in b}
        self._scalar_guards = _scalar_guards(program["inputs"], self._bound_leaves)
        with self.report.stage("build"):
            self._fn = self._build()

    # -- building ------------------------------------------------------------------------------
    def _build(self):
        def build_static(g: Graph):
            return rexec.build_executable(g, self.config, self.report)

        gears = self.program.get("gears")
        if gears and self.use_gears:
            from .. import gears as rgears

            spec = decode_gears(gears, self.graph)
            return rgears.compile_dynamic(self.graph, spec, self.config, self.report, build_static, 0)
        return build_static(self.graph)

    def _input_checks(self):
        checks = []
        for b, p in zip(self._bindings, self.graph.placeholders):
            if "leaf" in b:
                checks.append((b["leaf"], p.name, p.meta))
        return checks

    # -- calling -------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        leaves = self._binder.bind(args, kwargs)
        for leaf, (where, value) in self._scalar_guards.items():
            if leaves[leaf] != value:
                raise ExportError(f"input {where} was {value!r} when the model was exported and the graph depends "
                                  f"on it; got {leaves[leaf]!r}")
        sizes = self._check_inputs(leaves)
        inputs = [leaves[b["leaf"]] if "leaf" in b else sizes[b["symbol"]] for b in self._bindings]
        outs = self._fn(*inputs)
        return build_result(self._outputs, outs, leaves)

    def _check_inputs(self, leaves) -> dict[str, int]:
        values: dict = {}
        deferred = []
        for leaf, name, meta in self._checks:
            value = leaves[leaf]
            if isinstance(meta, TensorMeta):
                if not isinstance(value, torch.Tensor):
                    raise ExportError(f"graph input {name} expects a tensor, got {type(value).__name__}")
                if value.dtype != meta.dtype:
                    raise ExportError(f"graph input {name} ({_leaf_name(self.program, leaf)}) expects dtype "
                                      f"{meta.dtype}, got {value.dtype}")
                if value.dim() != len(meta.shape):
                    raise ExportError(f"input {_leaf_name(self.program, leaf)} must have {len(meta.shape)} "
                                      f"dimensions {list(meta.shape)}, got shape {list(value.shape)}")
                if value.device.type != meta.device.type:
                    raise ExportError(f"input {_leaf_name(self.program, leaf)} is on {value.device}, the graph was "
                                      f"exported for {meta.device}")
                for d, (want, got) in enumerate(zip(meta.shape, value.shape)):
                    self._check_dim(want, int(got), leaf, d, values, deferred)
            elif isinstance(meta, SymMeta) and isinstance(meta.expr, sympy.Symbol):
                values[meta.expr] = value
        for want, got, leaf, d in deferred:
            expected = sympy.sympify(want).subs(values)
            if expected.is_Integer and int(expected) != got:
                raise ExportError(f"input {_leaf_name(self.program, leaf)} dim {d} is {got}, but the graph needs "
                                  f"{want} = {expected}")
        for name, (sym, info) in self._symbols.items():
            if sym in values:
                v = values[sym]
                if v < info.lower or (info.upper is not None and v > info.upper):
                    raise ExportError(f"size {name} = {v} is outside the range the graph was exported for "
                                      f"[{info.lower}, {info.upper if info.upper is not None else 'inf'}]")
        return {str(s): v for s, v in values.items()}

    def _check_dim(self, want, got, leaf, d, values, deferred):
        want = sympy.sympify(want)
        if want.is_Integer:
            if int(want) != got:
                hint = "" if self.program.get("dynamic") else " (the export is static; export with dynamic=True " \
                                                              "to allow other sizes)"
                raise ExportError(f"input {_leaf_name(self.program, leaf)} dim {d} is {got}, but the graph was "
                                  f"exported with {int(want)}{hint}")
        elif isinstance(want, sympy.Symbol):
            if want in values and values[want] != got:
                raise ExportError(f"input {_leaf_name(self.program, leaf)} dim {d} is {got}, but size {want} is "
                                  f"already {values[want]} from another input; the exported graph needs them equal")
            values[want] = got
        else:
            deferred.append((want, got, leaf, d))

    def __repr__(self):
        p = self.program
        return (f"ExportedModel({p.get('name')!r}, {self.graph.num_ops()} ops, {len(p.get('weights', {}))} weights, "
                f"dynamic={p.get('dynamic')}, rank={p.get('rank')})")


def decode_gears(data: dict, graph: Graph):
    """The `GearSpec` of a graph file's ``gears`` record, with inputs indexed in ``graph``."""
    from ..gears import GearSpec
    from ..gears.spec import InputGears

    index = {p.name: i for i, p in enumerate(graph.placeholders)}
    try:
        for entry in data["inputs"]:
            if entry["placeholder"] not in index:
                raise ExportError(f"gears name input {entry['placeholder']!r}, which the graph does not have")
        inputs = tuple(InputGears(index[e["placeholder"]], e["name"], {int(d): tuple(v) for d, v in e["dims"].items()},
                                  tuple(e["shape"])) for e in data["inputs"])
        gears = tuple({(index[name], int(dim)): int(size) for name, dim, size in gear} for gear in data["gears"])
        return GearSpec(inputs, gears, data["policy"])
    except (KeyError, TypeError, ValueError) as e:
        raise ExportError(f"malformed gears record in graph file: {e!r}") from None


def _walk_leaves(spec: dict):
    """Every leaf of an input spec with its argument path: yields (path, leaf struct)."""
    def walk(struct, where):
        if isinstance(struct, list):
            for i, s in enumerate(struct):
                yield from walk(s, f"{where}[{i}]")
        elif "tuple" in struct:
            for i, s in enumerate(struct["tuple"]):
                yield from walk(s, f"{where}[{i}]")
        elif "dict" in struct:
            for k, s in struct["dict"].items():
                yield from walk(s, f"{where}[{k!r}]")
        elif "leaf" in struct:
            yield where, struct

    for name, struct in zip(spec["names"], spec["positional"]):
        yield from walk(struct, name)
    for name, struct in spec["keyword"].items():
        yield from walk(struct, name)


def _leaf_name(program: dict, leaf: int) -> str:
    """The argument path of leaf ``leaf`` (``x``, ``inputs['ids']``) for error messages."""
    return next((where for where, struct in _walk_leaves(program["inputs"]) if struct["leaf"] == leaf), f"#{leaf}")


def _scalar_guards(spec: dict, bound: set) -> dict:
    """Scalar arguments the graph does not take as inputs: Dynamo baked their value into the graph."""
    return {struct["leaf"]: (where, scalar_value(struct)) for where, struct in _walk_leaves(spec)
            if struct["type"] != "tensor" and struct["leaf"] not in bound}


def _rename_process_groups(graph: Graph, names: dict) -> None:
    """Point collectives at this process's groups (group names are per process, not per export)."""
    for n in graph.nodes:
        t = n.target
        if n.kind != "call" or not isinstance(t, torch._ops.OpOverload):
            continue
        for i, arg in enumerate(t._schema.arguments):
            if arg.name != "group_name":
                continue
            if i < len(n.args):
                old = n.args[i]
                n.args = n.args[:i] + (names.get(old, old),) + n.args[i + 1:]
            elif arg.name in n.kwargs:
                n.kwargs[arg.name] = names.get(n.kwargs[arg.name], n.kwargs[arg.name])


def _resolve_groups(manifest: dict) -> dict:
    """Map the export's process-group names to this process's groups, creating subgroups in order."""
    import torch.distributed as dist

    names = {}
    for old, info in manifest.get("process_groups", {}).items():
        if info.get("world"):
            names[old] = dist.group.WORLD.group_name
        else:
            names[old] = dist.new_group(ranks=info["ranks"]).group_name
    return names


def load(export_path: str = "export_file", export_name: str = "export", *, config: CompilerConfig | None = None,
         rank: int | None = None) -> ExportedModel:
    """Load what `rewrite.dynamo_export` wrote into ``export_path``.

    A single-rank export is ``{export_name}.json``. A multi-rank export has a manifest
    ``{export_name}_manifest.json``; each process loads its own rank (``torch.distributed.get_rank()``,
    or ``rank=``) and needs an initialized process group of the exported world size.
    """
    if not isinstance(export_path, (str, os.PathLike)):
        raise TypeError(f"export_path must be a path, got {type(export_path).__name__}")
    export_path = os.fspath(export_path)
    if not os.path.isdir(export_path):
        raise ExportError(f"export folder {export_path} does not exist")
    t0 = time.perf_counter()
    single = os.path.join(export_path, f"{export_name}.json")
    manifest_path = os.path.join(export_path, f"{export_name}_manifest.json")
    group_names = None
    if os.path.isfile(single):
        path = single
        expected_sha = None
    elif os.path.isfile(manifest_path):
        manifest, _ = read_json(manifest_path, "manifest")
        check_header(manifest, manifest_path, MANIFEST_FORMAT)
        rank, entry, group_names = _rank_entry(manifest, manifest_path, rank)
        path = os.path.join(export_path, entry["graph"])
        expected_sha = entry["graph_sha256"]
    else:
        found = sorted(f for f in os.listdir(export_path) if f.endswith(".json"))
        raise ExportError(f"{export_path} holds neither {export_name}.json nor {export_name}_manifest.json "
                          f"(json files there: {found}); pass the export_name used when exporting")
    program, raw = read_json(path, "graph file")
    if expected_sha is not None and hashlib.sha256(raw).hexdigest() != expected_sha:
        raise ExportError(f"graph file {path} does not match the checksum in the manifest (altered after export)")
    check_header(program, path, "rewrite.export")
    weights = WeightReader(export_path, program.get("weights", {}))
    weights.verify_all()
    try:
        model = ExportedModel(program, weights, config, group_names)
    except KeyError as e:
        raise ExportError(f"graph file {path} is missing field {e}") from None
    log.info("loaded %s in %.3f s: %r", path, time.perf_counter() - t0, model)
    return model


def _rank_entry(manifest: dict, path: str, rank: int | None):
    import torch.distributed as dist

    world_size = manifest["world_size"]
    if not (dist.is_available() and dist.is_initialized()):
        raise ExportError(f"{path} is a {world_size}-rank export; initialize torch.distributed with "
                          f"world_size={world_size} in each process before rewrite.load")
    if dist.get_world_size() != world_size:
        raise ExportError(f"{path} was exported for world_size={world_size}, this process group has "
                          f"{dist.get_world_size()}")
    rank = dist.get_rank() if rank is None else rank
    entries = {e["rank"]: e for e in manifest["ranks"]}
    if rank not in entries:
        raise ExportError(f"{path} has no entry for rank {rank} (ranks: {sorted(entries)})")
    return rank, entries[rank], _resolve_groups(manifest)
