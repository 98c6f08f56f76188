"""Turn a captured graph into an exported program: the graph file's JSON data plus weight bytes.

Everything here happens in memory; exporter.py writes the files only once all of it succeeded.
"""
from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING

import sympy
import torch

from ..dump import graph_to_pbtxt
from ..ir import Graph, SymMeta, TensorMeta
from ..ops import is_collective
from ..persist.errors import ExportError
from ..persist.format import FORMAT_VERSION, encode_graph, encode_meta
from ..persist.weights import WeightWriter
from ..subclasses import flatten, is_subclass
from .io_spec import describe_inputs, describe_outputs

if TYPE_CHECKING:  # capture imports Dynamo, which loading an export must not need
    from .capture import Captured

__all__ = ["Program", "build_program", "module_path", "collectives_of"]

# Namespaces of the collective ops Dynamo/AOTAutograd put into graphs.


@dataclasses.dataclass
class Program:
    data: dict  # the graph file's content
    weights: WeightWriter
    graph: Graph  # the exported graph (weights as constants, only user inputs as placeholders)
    pbtxt: str


def module_path(stack_entry: str) -> str:
    """``L['self'].layers[0]._modules['attn']`` -> ``layers.0.attn`` (the model's own attribute path)."""
    path = re.sub(r"^L\['self'\]\.?", "", stack_entry)
    path = re.sub(r"\._(?:modules|parameters|buffers)\['([^']*)'\]", r".\1", "." + path)[1:] if path else path
    path = re.sub(r"\[['\"]?([^\]'\"]*)['\"]?\]", r".\1", path)
    return path.lstrip(".")


def _weight_name_from_source(source: str) -> str:
    """A readable weight name from a Dynamo source when the tensor is not a named parameter/buffer."""
    return module_path(source) or re.sub(r"[^A-Za-z0-9_.]", "_", source)


def _named_weights(model: torch.nn.Module) -> dict[int, str]:
    """id -> name of every parameter and buffer, and of the inner tensors of those that are tensor
    subclasses (a DTensor's shard is ``{name}._local_tensor``: the graph holds the shard)."""
    names: dict[int, str] = {}
    for name, t in list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False)):
        names.setdefault(id(t), name)
        if is_subclass(t):
            for inner_name, inner in flatten(t, name):
                if isinstance(inner, torch.Tensor):
                    names.setdefault(id(inner), inner_name)
    return names


def collectives_of(graph: Graph) -> list[dict]:
    """The collective ops of a graph, in order, with the process group each one uses."""
    out = []
    for n in graph.nodes:
        t = n.target
        if n.kind != "call" or not is_collective(t):
            continue
        entry = {"node": n.name, "op": n.op}
        for i, arg in enumerate(t._schema.arguments):
            value = n.args[i] if i < len(n.args) else n.kwargs.get(arg.name)
            if arg.name == "group_name":
                entry["group"] = value
            elif arg.name in ("reduce_op", "reduceOp"):
                entry["reduce_op"] = value
        meta = encode_meta(n.meta) if isinstance(n.meta, TensorMeta) else None
        if meta is not None:
            entry["dtype"], entry["shape"] = meta["dtype"], meta["shape"]
        out.append(entry)
    return out


def process_groups(collectives: list[dict]) -> dict:
    """Ranks of every process group the collectives use, looked up in this process."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    groups = {}
    for c in collectives:
        name = c.get("group")
        if name is None or name in groups:
            continue
        try:
            pg = _resolve_process_group(name)
        except Exception as e:
            raise ExportError(f"collective {c['node']} uses process group {name!r}, which cannot be resolved: {e}") from e
        groups[name] = {"ranks": dist.get_process_group_ranks(pg), "world": pg == dist.group.WORLD}
    return groups


def _freeze_tensor_input(g: Graph, placeholder, tensor: torch.Tensor) -> None:
    """A tensor input that is not one of the caller's arguments (a module attribute) becomes a weight."""
    first = next(n for n in g.nodes if n.kind != "placeholder")
    with torch._subclasses.fake_tensor.unset_fake_temporarily():
        value = tensor.detach()
    const = g.constant(value, placeholder.meta, before=first)
    const.attrs["weight_name"] = placeholder.name
    g.replace_all_uses(placeholder, const)


def _bind_inputs(g: Graph, cap: Captured, input_spec: dict, leaves: list, weight_names_by_id: dict):
    """Decide, per graph input, where its value comes from; freeze weights; drop their placeholders."""
    leaf_by_id = {}
    for i, t in enumerate(leaves):
        if isinstance(t, torch.Tensor):
            leaf_by_id.setdefault(id(t), i)
    scalar_leaf_by_name = {}
    for name, struct in zip(input_spec["names"], input_spec["positional"]):
        if isinstance(struct, dict) and struct.get("type") in ("int", "float", "bool"):
            scalar_leaf_by_name[name] = struct["leaf"]
    for name, struct in input_spec["keyword"].items():
        if isinstance(struct, dict) and struct.get("type") in ("int", "float", "bool"):
            scalar_leaf_by_name[name] = struct["leaf"]

    placeholders = g.placeholders
    if len(placeholders) != len(cap.example_inputs):
        raise ExportError(f"the optimized graph has {len(placeholders)} inputs but Dynamo passed "
                          f"{len(cap.example_inputs)}; cannot tell which input is which")
    symbol_source = {s: (placeholders[info.input_index].name if info.input_index is not None else None, info.dim)
                     for s, info in g.symbols.items()}
    symbol_scalar = {s: placeholders[info.scalar_input_index].name
                     for s, info in g.symbols.items() if info.scalar_input_index is not None}
    weight_names: dict[str, str] = {}
    bindings: dict[str, dict] = {}
    drop = []
    unread = []  # sizes the graph reads from a tensor input instead (rewrite.shape.size_inputs): no argument needed
    read = {i.id for n in g.nodes for i in n.inputs}
    for i, (p, example, source) in enumerate(zip(placeholders, cap.example_inputs, cap.sources)):
        if i in cap.frozen or (isinstance(example, torch.Tensor) and id(example) not in leaf_by_id):
            if i not in cap.frozen:
                _freeze_tensor_input(g, p, example)
            weight_names[p.name] = weight_names_by_id.get(id(example)) or _weight_name_from_source(source)
            drop.append(p)
        elif isinstance(example, torch.Tensor):
            bindings[p.name] = {"placeholder": p.name, "leaf": leaf_by_id[id(example)]}
        elif isinstance(p.meta, SymMeta):
            expr = p.meta.expr
            origin = symbol_source.get(expr, (None, None))[0] if isinstance(expr, sympy.Symbol) else None
            m = re.fullmatch(r"L\['([^']+)'\]", source)
            if m and m.group(1) in scalar_leaf_by_name:  # an argument: taken from the call, checked against the dims
                bindings[p.name] = {"placeholder": p.name, "leaf": scalar_leaf_by_name[m.group(1)]}
            elif p.id not in read and all(symbol_source.get(s, (None, None))[0] is not None
                                          for s in sympy.sympify(expr).free_symbols):
                unread.append(p)  # a size Dynamo lifted from a tensor; the graph reads the tensor's dim
            elif origin is not None and origin not in {d.name for d in drop}:
                bindings[p.name] = {"placeholder": p.name, "symbol": str(expr)}
            else:
                raise ExportError(f"graph input {p.name} (Dynamo source {source}) is a size the exported model "
                                  "cannot compute from its arguments")
        elif p.id not in read:
            unread.append(p)  # an object the graph never reads: a DTensor's device mesh (its collectives name the group)
        else:
            raise ExportError(f"graph input {p.name} (Dynamo source {source}) of type {type(example).__name__} "
                              "is neither an argument of the model nor a weight")
    for p in drop:
        if any(p in n.inputs for n in g.nodes if n is not p):
            raise ExportError(f"weight input {p.name} is still read after freezing")
        g.remove(p)
    for p in unread:
        g.remove(p)
    # Symbols were located by placeholder index; re-point them at the remaining placeholders.
    index = {p.name: i for i, p in enumerate(g.placeholders)}
    for s, info in g.symbols.items():
        name, dim = symbol_source.get(s, (None, None))
        info.input_index, info.dim = (index[name], dim) if name in index else (None, None)
        info.scalar_input_index = index.get(symbol_scalar.get(s))
    return [bindings[p.name] for p in g.placeholders], weight_names


def encode_gears(spec, traced: Graph, exported: Graph):
    """A `GearSpec` with inputs named by placeholder (the exported graph has fewer inputs than the trace)."""
    if spec is None:
        return None
    names = [p.name for p in traced.placeholders]
    kept = {p.name for p in exported.placeholders}
    for inp in spec.inputs:
        if names[inp.index] not in kept:
            raise ExportError(f"gears were declared on {inp.name}, which is not an input of the exported graph")
    return {
        "policy": spec.policy,
        "inputs": [{"placeholder": names[i.index], "name": i.name, "dims": {str(d): list(v) for d, v in i.dims.items()},
                    "shape": [int(s) for s in i.shape]} for i in spec.inputs],
        "gears": [[[names[i], d, v] for (i, d), v in gear.items()] for gear in spec.gears],
    }


def build_program(cap: Captured, model: torch.nn.Module, args: tuple, kwargs: dict, *, name: str, dynamic: bool,
                  config, folder: str, rank: int | None, world_size: int | None, weight_writer=None) -> Program:
    """``weight_writer(names, folder)`` makes the `WeightWriter` (the compile cache's refers to live weights)."""
    input_spec, leaves = describe_inputs(model, args, kwargs)
    g = cap.graph.copy()
    bindings, weight_names = _bind_inputs(g, cap, input_spec, leaves, _named_weights(model))
    # The loader checks each recorded meta against shape inference; record what inference derives
    # (Dynamo's meta may be another form of the same size that only its guards prove equal, e.g.
    # (s0**2*s1**2)//(4*s0) for s0 in TorchAir's sym-pack model).
    from ..shape import infer_graph

    infer_graph(g)
    graph_outs = g.outputs if isinstance(g.outputs, (tuple, list)) else (g.outputs,)
    symbolic = [k for k, n in enumerate(graph_outs)
                if isinstance(getattr(n, "meta", None), SymMeta) and sympy.sympify(n.meta.expr).free_symbols]
    outputs = describe_outputs(cap.result, cap.graph_outputs, leaves, symbolic)
    if len(graph_outs) != len(cap.graph_outputs):
        raise ExportError(f"the graph returns {len(graph_outs)} values but the compiled model's graph returned "
                          f"{len(cap.graph_outputs)}; cannot match outputs")

    record_stack = config.export.experimental.enable_record_nn_module_stack
    for n in g.nodes:
        stack, types = n.attrs.pop("module_stack", None), n.attrs.pop("module_types", None)
        if record_stack and stack:
            n.attrs["module_stack"] = [module_path(s) for s in stack]
            n.attrs["module_path"] = n.attrs["module_stack"][-1]
            if types and len(types) == len(stack):
                n.attrs["module_types"] = list(types)

    writer = (weight_writer or WeightWriter)(weight_names, folder)
    # weight_name / derived_from (the parameter a constant holds or was folded from) are superseded
    # by the constant's {"weight": name}.
    graph_data = encode_graph(g, writer.encode_constant, keep_attr=lambda key: key not in ("weight_name", "derived_from"))
    collectives = collectives_of(g)
    data = {
        "format": "rewrite.export",
        "version": FORMAT_VERSION,
        "producer": {"torch": torch.__version__},
        "name": name,
        "dynamic": bool(dynamic),
        "rank": rank,
        "world_size": world_size,
        "inputs": input_spec,
        "bindings": bindings,
        "outputs": outputs,
        "graph": graph_data,
        "weights": writer.records(),
        "gears": encode_gears(cap.gear_spec, cap.graph, g),
        "collectives": collectives,
        "process_groups": process_groups(collectives) if collectives else {},
        "module_stack": record_stack,
    }
    return Program(data, writer, g, _dump_text(g, writer))


class _FileConstant:
    """Stands for a weight in the readable dump: where it lives instead of its values (like GE's FileConstant)."""

    def __init__(self, record: dict):
        self.record = record

    def __repr__(self):
        r = self.record
        return f"FileConstant(file={r['file']}, dtype={r['dtype']}, shape={r['shape']}, sha256={r['sha256'][:16]}...)"


def _dump_text(g: Graph, writer: WeightWriter) -> str:
    dump = g.copy()
    records = writer.records()
    for n in dump.nodes:
        if n.kind == "constant" and n.name in writer.node_weights:
            n.attrs["value"] = _FileConstant(records[writer.node_weights[n.name]])
    return graph_to_pbtxt(dump)
