"""Trace a model with Dynamo through the rewrite backend and keep the optimized graph.

Export runs exactly the pipeline `torch.compile(model, backend=rewrite.get_backend(config))` runs
(import, freezing of weights, the optimizer, gears), through the backend's ``on_optimized`` hook;
it does not re-implement any of it. Tracing is whole-graph (``fullgraph=True``) and without
gradients, so AOTAutograd produces one inference graph with the weights frozen into constants.
"""
from __future__ import annotations

import copy
import dataclasses
import logging

import torch

from ..backend import RewriteBackend
from ..config import CompilerConfig
from ..fx_bridge import dynamo_input_names
from ..gears import trace_conflicts
from ..ir import Graph
from ..persist.errors import ExportError
from ..subclasses import flatten_inputs

log = logging.getLogger("rewrite")

__all__ = ["Captured", "capture"]


@dataclasses.dataclass
class Captured:
    graph: Graph  # the optimized graph, weights frozen into constants
    example_inputs: list  # the flat graph inputs Dynamo passed (real tensors, weights, ints)
    sources: list  # Dynamo's source name of each graph input, e.g. L['x'], L['self']._parameters['p1']
    frozen: dict  # graph input index -> weight tensor now held by a constant
    gear_spec: object
    graph_outputs: tuple  # what the compiled graph returned on the example call
    result: object  # what the compiled model returned on the example call


class _CaptureBackend(RewriteBackend):
    def __init__(self, config: CompilerConfig, decompositions: dict | None = None):
        super().__init__(config, decompositions=decompositions)
        self.graphs: list[dict] = []

    def compile_dynamo_graph(self, gm, example_inputs):
        sources = dynamo_input_names(gm)
        # The optimized graph's inputs are AOTAutograd's: tensor subclasses (DTensor weights) flattened.
        flat = flatten_inputs(list(example_inputs), sources)
        entry = ({"example_inputs": list(example_inputs), "sources": sources} if flat is None
                 else {"example_inputs": flat[0], "sources": flat[1]})
        self.graphs.append(entry)
        compiled = super().compile_dynamo_graph(gm, example_inputs)

        def run(*args):
            out = compiled(*args)
            entry["graph_outputs"] = tuple(out) if isinstance(out, (list, tuple)) else (out,)
            return out

        return run

    def on_optimized(self, graph, unit, frozen, gear_spec):
        if unit.kind != "inference":
            raise ExportError(f"export expected one inference graph, got {unit.name}; export runs under no_grad, so "
                              "a training graph means the model enables gradients itself")
        self.graphs[-1].update(graph=graph, frozen=dict(frozen or {}), gear_spec=_traceable_gears(graph, gear_spec))


def _traceable_gears(graph: Graph, spec):
    """The gears this trace can serve: those that contradict none of Dynamo's shape guards.

    The backend drops the other gears while compiling (Dynamo would trace them separately); a
    loaded export has no Dynamo to do that, so they are left out of the file.
    """
    if spec is None:
        return None
    placeholders = graph.placeholders
    values = [{placeholders[i].meta.shape[d]: v for (i, d), v in gear.items()} for gear in spec.gears]
    kept = []
    for gear, why in zip(spec.gears, trace_conflicts(graph, values)):
        if why:
            log.warning("export: gear %s left out of the export: %s", gear, why)
        else:
            kept.append(gear)
    return dataclasses.replace(spec, gears=tuple(kept))


def capture(model: torch.nn.Module, args: tuple, kwargs: dict, dynamic: bool, config: CompilerConfig,
            decompositions: dict | None = None) -> Captured:
    """Trace ``model(*args, **kwargs)`` into one optimized graph, or fail saying why it is not one graph.

    ``decompositions``: entries added to (or replacing) AOTAutograd's table (`RewriteBackend`).
    """
    config = copy.deepcopy(config)
    # Export freezes weights: the exported graph holds them as constants referenced by name.
    config.experimental_config.frozen_parameter = True
    backend = _CaptureBackend(config, decompositions)
    compiled = torch.compile(model, backend=backend, fullgraph=True, dynamic=dynamic)
    try:
        # Every export brings a new backend, so Dynamo adds a cache entry for the model's code each
        # time; lift the recompile limit for this trace so the ninth export of a model still works.
        with torch.no_grad(), torch._dynamo.config.patch(recompile_limit=1 << 30, accumulated_recompile_limit=1 << 30):
            result = compiled(*args, **kwargs)
    except ExportError:
        raise
    except torch._dynamo.exc.BackendCompilerFailed as e:
        inner = e.inner_exception if getattr(e, "inner_exception", None) is not None else e
        if isinstance(inner, ExportError):
            raise inner from None
        raise ExportError(f"the rewrite pipeline failed on the traced graph: {inner}") from e
    except (torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError) as e:
        raise ExportError(
            "dynamo_export needs the model to trace as one whole graph, and Dynamo could not: "
            f"{str(e).strip().splitlines()[0]}. Data-dependent control flow (if/else on tensor values) and "
            "graph breaks cannot be exported; rewrite the branch with torch.where / torch.cond or move it "
            "out of the model") from e
    if not backend.graphs:
        raise ExportError("Dynamo did not call the export backend (the model's code was already compiled and "
                          "cached); call torch._dynamo.reset() and export again")
    # Dynamo may restart its analysis after a first compile (e.g. when AOTAutograd specializes a
    # size); only graphs that were actually run on the example inputs count.
    ran = [entry for entry in backend.graphs if "graph_outputs" in entry]
    if len(ran) != 1 or "graph" not in ran[0]:
        raise ExportError(f"the model ran as {len(ran)} compiled graphs; export needs exactly one")
    entry = ran[0]
    return Captured(entry["graph"], entry["example_inputs"], entry["sources"], entry["frozen"],
                    entry["gear_spec"], entry["graph_outputs"], result)
