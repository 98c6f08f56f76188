"""`rewrite.load`: run an exported graph with the rewrite executor, without Dynamo or the model's code.

The folder may be hostile (docs/export_format.md, "Security"). Loading validates everything before
it runs anything: the format and version of the graph file, every field of it (persist/checks.py), every
op against the allow-list and its schema (persist/allowlist.py), every shape expression against the
format's grammar (persist/expr.py), the recorded shapes against shape inference, every path against the
folder, every weight file's size and sha256; for a multi-rank export, the manifest, the rank's
graph file checksum and the process group. Each call then checks its arguments against the traced
signature (dtypes, static sizes, the range of each size symbol) and names the input that does
not fit, instead of failing deep inside a kernel.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import time

import sympy
import torch

from ..pipeline import Stages, build_callable
from ..config import CompilerConfig
from ..fx_bridge import CompileError
from ..gears import GearError
from ..ir import Graph, SymMeta, TensorMeta
from ..report import GraphReport
from ..unit import CompileUnit
from ..persist.checks import (at, confined_path, describe, expect_bool, expect_file_name, expect_int, expect_list,
                              expect_object, expect_sha256, expect_shape, expect_str, fail)
from ..persist import document
from ..persist.document import check_header, read_json
from ..persist.errors import ExportError
from ..persist.format import decode_graph
from ..persist.weights import WeightReader
from .ranks import Ranks
from .io_spec import (InputBinder, build_result, check_input_spec, check_output_spec, leaf_name, scalar_value,
                        walk_leaves)

log = logging.getLogger("rewrite")

__all__ = ["load", "ExportedModel", "decode_gears"]

MANIFEST_FORMAT = "rewrite.export.manifest"
GRAPH_FORMAT = "rewrite.export"

# Top-level fields of a graph file: (required, optional); see docs/export_format.md "The graph file".
_PROGRAM_FIELDS = (("format", "version", "name", "dynamic", "inputs", "bindings", "outputs", "graph", "weights"),
                   ("producer", "rank", "world_size", "gears", "collectives", "process_groups", "module_stack", "dump",
                    "onnx"))
_MANIFEST_FIELDS = (("format", "version", "name", "world_size", "ranks", "process_groups"), ("backend", "collectives"))
MAX_WORLD_SIZE = 1 << 16


def _check_program(program: dict, where: str) -> int:
    """The graph file's top-level fields (the nested ones are checked where they are decoded)."""
    version = check_header(program, where, GRAPH_FORMAT)
    expect_object(program, where, *_PROGRAM_FIELDS)
    expect_file_name(program["name"], at(where, "name"))
    expect_bool(program["dynamic"], at(where, "dynamic"))
    expect_bool(program.get("module_stack", False), at(where, "module_stack"))
    for key in ("rank", "world_size"):
        if program.get(key) is not None:
            expect_int(program[key], at(where, key), 0, MAX_WORLD_SIZE)
    for key, value in expect_object(program.get("producer", {}), at(where, "producer")).items():
        expect_str(value, at(at(where, "producer"), key))
    for i, entry in enumerate(expect_list(program.get("collectives", []), at(where, "collectives"))):
        expect_object(entry, at(at(where, "collectives"), i))
    _check_process_groups(program.get("process_groups", {}), at(where, "process_groups"))
    if "dump" in program:
        expect_str(program["dump"], at(where, "dump"), max_len=1024)
    if "onnx" in program:
        expect_file_name(program["onnx"], at(where, "onnx"))
    return version


def _check_process_groups(groups, where: str, world_size: int = MAX_WORLD_SIZE) -> dict:
    for name, info in expect_object(groups, where).items():
        inner = at(where, name)
        expect_object(info, inner, required=("ranks", "world"))
        ranks = expect_list(info["ranks"], at(inner, "ranks"), max_len=world_size)
        for i, r in enumerate(ranks):
            expect_int(r, at(at(inner, "ranks"), i), 0, world_size - 1)
        if len(set(ranks)) != len(ranks):
            raise fail(at(inner, "ranks"), f"{ranks} names a rank twice")
        expect_bool(info["world"], at(inner, "world"))
    return groups


class ExportedModel:
    """A loaded export: call it like the model (same arguments, same shape of result)."""

    def __init__(self, program: dict, weights: WeightReader, config: CompilerConfig | None = None,
                 group_names: dict | None = None, use_gears: bool = True, where: str = "graph file",
                 gear_graphs: dict | None = None, check_metas: bool = True):
        """``gear_graphs`` (gear key -> optimized graph): gears found there are built without optimizing,
        and the others are added to it as they are optimized (the compile cache reads and writes it).
        ``check_metas=False`` skips inferring the recorded shapes again: only for a program whose bytes
        (or digest, in a signed key) this user's rewrite signed after checking them (a compile cache
        entry); every other check runs."""
        version = _check_program(program, where)
        self.program = program
        self.use_gears = use_gears
        self.gear_graphs = gear_graphs
        self.config = config if config is not None else CompilerConfig()
        self.report = GraphReport(f"load:{program['name']}")
        with self.report.stage("decode"):
            self.graph = decode_graph(program["graph"], weights.decode_constant, at(where, "graph"), version)
            if check_metas:
                document.check_metas(self.graph, at(where, "graph"))
            leaf_types = check_input_spec(program["inputs"], at(where, "inputs"))
            _check_bindings(program["bindings"], self.graph, leaf_types, at(where, "bindings"))
            outs = self.graph.outputs
            check_output_spec(program["outputs"], at(where, "outputs"),
                              len(outs) if isinstance(outs, (tuple, list)) else 1, len(leaf_types))
            gears = program.get("gears")
            # Gear errors name each input as the caller passes it (``input_ids``), not by Dynamo's source name.
            caller_names = {b["placeholder"]: leaf_name(program, b["leaf"]) for b in program["bindings"] if "leaf" in b}
            self._gears = decode_gears(gears, self.graph, at(where, "gears"), caller_names) if gears is not None \
                else None
        if group_names:
            _rename_process_groups(self.graph, group_names)
        self._binder = InputBinder(program["inputs"])
        self._bindings = program["bindings"]
        self._outputs = program["outputs"]
        self._symbols = {str(s): (s, info) for s, info in self.graph.symbols.items()}
        self._checks = self._input_checks()
        self._bound_leaves = {b["leaf"] for b in self._bindings if "leaf" in b}
        self._scalar_guards = _scalar_guards(program["inputs"], self._bound_leaves)
        with self.report.stage("build"):
            try:
                self._fn = self._build()
            except (CompileError, GearError) as e:
                raise ExportError(f"{at(where, 'graph')}: the graph does not compile: {e}") from e

    # -- building ------------------------------------------------------------------------------
    def _build(self):
        unit = CompileUnit.detached(self.graph.name, self.config, self.report)
        # As a compiled model (one assembly, rewrite.pipeline): reduce-overhead plans every gear now,
        # the default mode tiers up later.
        gears = self._gears if self.use_gears else None
        return build_callable(self.graph, Stages.for_unit(unit), gears, self.gear_graphs)

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
                    raise ExportError(f"graph input {name} ({leaf_name(self.program, leaf)}) expects dtype "
                                      f"{meta.dtype}, got {value.dtype}")
                if value.dim() != len(meta.shape):
                    raise ExportError(f"input {leaf_name(self.program, leaf)} must have {len(meta.shape)} "
                                      f"dimensions {list(meta.shape)}, got shape {list(value.shape)}")
                if value.device.type != meta.device.type:
                    raise ExportError(f"input {leaf_name(self.program, leaf)} is on {value.device}, the graph was "
                                      f"exported for {meta.device}")
                for d, (want, got) in enumerate(zip(meta.shape, value.shape)):
                    self._check_dim(want, int(got), leaf, d, values, deferred)
            elif isinstance(meta, SymMeta) and isinstance(meta.expr, sympy.Symbol):
                if meta.expr in values and values[meta.expr] != value:
                    raise ExportError(f"input {leaf_name(self.program, leaf)} is {value}, but size {meta.expr} is "
                                      f"{values[meta.expr]} from another input; the exported graph needs them equal")
                values[meta.expr] = value
        for want, got, leaf, d in deferred:
            expected = sympy.sympify(want).subs(values)
            if expected.is_Integer and int(expected) != got:
                raise ExportError(f"input {leaf_name(self.program, leaf)} dim {d} is {got}, but the graph needs "
                                  f"{want} = {expected}")
        for name, (sym, info) in self._symbols.items():
            if sym in values:
                v = values[sym]
                if v < info.lower or (info.upper is not None and v > info.upper):
                    raise ExportError(f"{self._size_name(sym, leaves)} is {v}, outside the range the graph was "
                                      f"exported for [{info.lower}, {info.upper if info.upper is not None else 'inf'}]"
                                      f" (size {name})")
        return {str(s): v for s, v in values.items()}

    def _size_name(self, sym, leaves) -> str:
        """Where the user gives size ``sym``: ``input x dim 0``, or the size argument itself."""
        for leaf, _, meta in self._checks:
            if isinstance(meta, TensorMeta):
                dim = next((d for d, s in enumerate(meta.shape) if s == sym), None)
                if dim is not None:
                    return f"input {leaf_name(self.program, leaf)} dim {dim}"
            elif isinstance(meta, SymMeta) and meta.expr == sym:
                return f"input {leaf_name(self.program, leaf)}"
        return f"size {sym}"

    def _check_dim(self, want, got, leaf, d, values, deferred):
        want = sympy.sympify(want)
        if want.is_Integer:
            if int(want) != got:
                hint = "" if self.program.get("dynamic") else " (the export is static; export with dynamic=True " \
                                                              "to allow other sizes)"
                raise ExportError(f"input {leaf_name(self.program, leaf)} dim {d} is {got}, but the graph was "
                                  f"exported with {int(want)}{hint}")
        elif isinstance(want, sympy.Symbol):
            if want in values and values[want] != got:
                raise ExportError(f"input {leaf_name(self.program, leaf)} dim {d} is {got}, but size {want} is "
                                  f"already {values[want]} from another input; the exported graph needs them equal")
            values[want] = got
        else:
            deferred.append((want, got, leaf, d))

    def __repr__(self):
        p = self.program
        return (f"ExportedModel({p.get('name')!r}, {self.graph.num_ops()} ops, {len(p.get('weights', {}))} weights, "
                f"dynamic={p.get('dynamic')}, rank={p.get('rank')})")


def _check_bindings(bindings, graph: Graph, leaf_types: list[str], where: str) -> None:
    """One binding per graph input: a leaf of the call of the matching kind, or a size read off a tensor input."""
    placeholders = graph.placeholders
    expect_list(bindings, where, length=len(placeholders))
    for i, (b, p) in enumerate(zip(bindings, placeholders)):
        inner = at(where, i)
        expect_object(b, inner, required=("placeholder",), optional=("leaf", "symbol"))
        if b["placeholder"] != p.name:
            raise fail(at(inner, "placeholder"), f"expected graph input {p.name!r}, got {describe(b['placeholder'])}")
        if ("leaf" in b) == ("symbol" in b) or not isinstance(p.meta, (TensorMeta, SymMeta)):
            raise fail(inner, "a binding takes exactly one of leaf or symbol, for an input with a tensor or size meta")
        if "leaf" in b:
            leaf = expect_int(b["leaf"], at(inner, "leaf"), 0, len(leaf_types) - 1)
            if (leaf_types[leaf] == "tensor") != isinstance(p.meta, TensorMeta):
                raise fail(at(inner, "leaf"), f"leaf {leaf} is a {leaf_types[leaf]}, graph input {p.name} takes "
                                              f"{'a tensor' if isinstance(p.meta, TensorMeta) else 'a size'}")
    leaf_bound = {p.name for b, p in zip(bindings, placeholders) if "leaf" in b}
    for i, b in enumerate(bindings):
        if "symbol" not in b:
            continue
        sym = next((s for s in graph.symbols if str(s) == b["symbol"]), None)
        info = graph.symbols.get(sym)
        source = placeholders[info.input_index] if info is not None and info.input_index is not None else None
        if source is None or source.name not in leaf_bound or source.meta.shape[info.dim] != sym:
            raise fail(at(at(where, i), "symbol"), f"{describe(b['symbol'])} is not a size symbol read off a tensor "
                                                   "input of the call (graph.symbols says where each one is read)")


def decode_gears(data, graph: Graph, where: str = "gears", caller_names: dict | None = None):
    """The `GearSpec` of a graph file's ``gears`` record, checked with the rules of `set_dim_gears`.

    ``caller_names`` ({placeholder: argument path}): what each input is called in messages."""
    from ..gears import GearSpec
    from ..gears.spec import MAX_GEARS, merge_gears

    expect_object(data, where, required=("policy", "inputs", "gears"))
    policy = data["policy"]
    if policy not in ("zip", "product"):
        raise fail(at(where, "policy"), f"expected 'zip' or 'product', got {describe(policy)}")
    inputs = _gear_inputs(data["inputs"], graph, at(where, "inputs"), caller_names or {})
    gears = [_gear(gear, inputs, at(at(where, "gears"), i))
             for i, gear in enumerate(expect_list(data["gears"], at(where, "gears"), max_len=MAX_GEARS))]
    try:
        allowed = merge_gears(list(inputs.values()), policy)
    except GearError as e:
        raise fail(where, str(e)) from None
    if not gears:
        raise fail(at(where, "gears"), "no gears are listed")
    stray = next((g for g in gears if g not in allowed), None)
    if stray is not None:
        raise fail(at(where, "gears"), f"gear {stray} is not one of the gears the inputs declare with policy {policy!r}")
    return GearSpec(tuple(inputs.values()), tuple(gears), policy)


def _gear_inputs(entries, graph: Graph, where: str, caller_names: dict) -> dict:
    """placeholder name -> `InputGears`: dims with a size symbol, 1..MAX_GEARS positive sizes each."""
    from ..gears.spec import MAX_GEARS, InputGears

    index = {p.name: i for i, p in enumerate(graph.placeholders) if isinstance(p.meta, TensorMeta)}
    inputs = {}
    for i, entry in enumerate(expect_list(entries, where, max_len=len(index))):
        inner = at(where, i)
        expect_object(entry, inner, required=("placeholder", "name", "dims", "shape"))
        name = entry["placeholder"]
        if not isinstance(name, str) or name not in index or name in inputs:
            raise fail(at(inner, "placeholder"), f"{describe(name)} is not a tensor input of the graph (or is "
                                                 "given twice)")
        shape = graph.placeholders[index[name]].meta.shape
        dims = {}
        for key, values in expect_object(entry["dims"], at(inner, "dims")).items():
            dim = int(key) if re.fullmatch(r"[0-9]{1,2}", key) else -1
            if not (0 <= dim < len(shape) and isinstance(shape[dim], sympy.Symbol)):
                raise fail(at(inner, "dims"), f"dim {key!r} is not a dimension with a size symbol of input {name} "
                                              f"(shape {list(shape)}); gears need a dynamic dimension")
            values = expect_list(values, at(at(inner, "dims"), key), max_len=MAX_GEARS)
            if not values:
                raise fail(at(at(inner, "dims"), key), "gears of a dim must be a non-empty list of positive ints")
            dims[dim] = tuple(expect_int(v, at(at(at(inner, "dims"), key), j), 1) for j, v in enumerate(values))
        recorded = expect_str(entry["name"], at(inner, "name"), max_len=1024)
        inputs[name] = InputGears(index[name], caller_names.get(name, recorded), dims,
                                  tuple(expect_shape(entry["shape"], at(inner, "shape"))))
    return inputs


def _gear(entry, inputs: dict, where: str) -> dict:
    """One gear ``[[placeholder, dim, size], ...]`` as ``{(input index, dim): size}``, sizes as declared."""
    from ..gears.spec import MAX_GEARS

    sizes = {}
    for j, triple in enumerate(expect_list(entry, where, max_len=MAX_GEARS)):
        name, dim, size = expect_list(triple, at(where, j), length=3)
        declared_by = inputs.get(name) if isinstance(name, str) else None
        declared = declared_by.dims.get(dim, ()) if declared_by is not None and type(dim) is int else ()
        if type(size) is not int or size not in declared:
            raise fail(at(where, j), f"{repr(triple)[:80]} is not a size declared in gears.inputs")
        sizes[(declared_by.index, dim)] = size
    return sizes


def _scalar_guards(spec: dict, bound: set) -> dict:
    """Scalar arguments the graph does not take as inputs: Dynamo baked their value into the graph."""
    return {struct["leaf"]: (where, scalar_value(struct)) for where, struct in walk_leaves(spec)
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

    The folder may be hostile (docs/export_format.md, "Security"): everything read is checked, and
    anything that does not fit the format is an `ExportError` naming the file and field.
    """
    if not isinstance(export_path, (str, os.PathLike)):
        raise TypeError(f"export_path must be a path, got {type(export_path).__name__}")
    export_path = os.fspath(export_path)
    expect_file_name(export_name, "export_name")
    if not os.path.isdir(export_path):
        if os.path.isfile(export_path):  # load("export_file/export.json"): the folder and the name are separate
            folder, file = os.path.split(export_path)
            stem = file[:-len(".json")] if file.endswith(".json") else file
            raise ExportError(f"{export_path} is a file; rewrite.load takes the export folder and the export name: "
                              f"rewrite.load({folder or '.'!r}, export_name={stem!r})")
        raise ExportError(f"export folder {export_path} does not exist")
    t0 = time.perf_counter()
    try:
        model = _load(export_path, export_name, config, rank)
    except ExportError:
        raise
    except (LookupError, TypeError, ValueError, AttributeError, ArithmeticError, RecursionError, MemoryError,
            CompileError) as e:
        # Every field is checked on the way in; this is the last line of defence, not the design.
        log.warning("rewrite.load: unexpected %s while loading %s", type(e).__name__, export_path, exc_info=True)
        raise ExportError(f"{export_path}: the export is malformed ({type(e).__name__}: {e})") from e
    log.info("loaded %s in %.3f s: %r", export_path, time.perf_counter() - t0, model)
    return model


def _load(export_path: str, export_name: str, config, rank) -> ExportedModel:
    single_name, manifest_name = f"{export_name}.json", f"{export_name}_manifest.json"
    single = confined_path(export_path, single_name, "export_name")
    manifest_path = confined_path(export_path, manifest_name, "export_name")
    if os.path.lexists(single):
        program, weights = _read_rank_files(export_path, single, single_name, None)
        return _model(program, weights, config, None, single)
    if not os.path.lexists(manifest_path):
        found = sorted(f for f in os.listdir(export_path) if f.endswith(".json"))[:20]
        raise ExportError(f"{export_path} holds neither {single_name} nor {manifest_name} "
                          f"(json files there: {found}); pass the export_name used when exporting")
    manifest, _ = read_json(manifest_path, "manifest")
    check_header(manifest, manifest_name, MANIFEST_FORMAT)
    rank, entry = _rank_entry(manifest, manifest_name, rank)
    label = entry["graph"]
    ranks = Ranks(True, (config if config is not None else CompilerConfig()).export.rank_timeout_s)
    # this rank's own files first: a rank that fails here must not leave the others in new_group
    with ranks.bounded():
        with ranks.together(f"rewrite.load of {export_name}"):
            path = confined_path(export_path, label, at(manifest_name, "ranks"))
            program, weights = _read_rank_files(export_path, path, label, entry["graph_sha256"])
        groups = _resolve_groups(manifest)
    return _model(program, weights, config, groups, path)


def _model(program: dict, weights: WeightReader, config, groups, path: str) -> ExportedModel:
    """The loaded model; with ``config.cache.dir``, a geared export's gear graphs come from the cache."""
    where = os.path.basename(path)
    if config is None or config.cache.dir is None or program.get("gears") is None:
        return ExportedModel(program, weights, config, groups, where=where)
    from ..cache.loads import GearGraphCache

    cache = GearGraphCache(config, program, weights, path)
    gear_graphs = cache.load()
    model = ExportedModel(program, weights, config, groups, where=where, gear_graphs=gear_graphs,
                          check_metas=not cache.program_checked)
    cache.store()
    return model


def _read_rank_files(export_path: str, path: str, label: str, expected_sha: str | None):
    """One rank's graph file and weights, checked (a manifest's checksum too, when there is one)."""
    program, raw = read_json(path, "graph file")
    if expected_sha is not None and hashlib.sha256(raw).hexdigest() != expected_sha:
        raise ExportError(f"graph file {path} does not match the checksum in the manifest (altered after export)")
    _check_program(program, label)
    weights = WeightReader(export_path, program["weights"], where=at(label, "weights"))
    weights.verify_all()
    return program, weights


def _rank_entry(manifest: dict, where: str, rank: int | None):
    """This process's rank and its entry of a checked manifest."""
    import torch.distributed as dist

    expect_object(manifest, where, *_MANIFEST_FIELDS)
    world_size = expect_int(manifest["world_size"], at(where, "world_size"), 1, MAX_WORLD_SIZE)
    entries = {}
    for i, entry in enumerate(expect_list(manifest["ranks"], at(where, "ranks"), max_len=world_size)):
        inner = at(at(where, "ranks"), i)
        expect_object(entry, inner, required=("rank", "graph", "graph_sha256"), optional=("dir",))
        r = expect_int(entry["rank"], at(inner, "rank"), 0, world_size - 1)
        expect_file_name(entry["graph"], at(inner, "graph"))
        expect_sha256(entry["graph_sha256"], at(inner, "graph_sha256"))
        entries[r] = entry
    _check_process_groups(manifest["process_groups"], at(where, "process_groups"), world_size)
    if not (dist.is_available() and dist.is_initialized()):
        raise ExportError(f"{where} is a {world_size}-rank export; initialize torch.distributed with "
                          f"world_size={world_size} in each process before rewrite.load")
    if dist.get_world_size() != world_size:
        raise ExportError(f"{where} was exported for world_size={world_size}, this process group has "
                          f"{dist.get_world_size()}")
    rank = dist.get_rank() if rank is None else rank
    if rank not in entries:
        raise ExportError(f"{where} has no entry for rank {rank} (ranks: {sorted(entries)})")
    return rank, entries[rank]
