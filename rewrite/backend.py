"""The torch.compile backend: Dynamo graph -> AOTAutograd core-ATen graph -> rewrite pipeline.

Pipeline of one graph (see docs/design.md, "Pipeline"):
    [post_grad_custom_pre_pass] -> from_fx -> stream scopes become node attributes -> freeze weights (optional)
    -> optimize (Python passes + e-graph, then the finishing passes of rewrite.passes) -> [post_grad_custom_post_pass]
    -> rewrite.pipeline, shared with the loader: gears (one static graph per gear, re-optimized) ->
    build_executable (codegen / Inductor / stream scheduler; the unit's execution policy, rewrite.policy:
    in reduce-overhead mode each gear gets an execution plan or a CUDA graph, in the default mode static
    CPU inference gears tier up to a plan after their first calls) -> a boxed callable that AOTAutograd and Dynamo run (inference graphs
    that need nothing of AOTAutograd's runtime wrapper skip it in every mode, see exec.direct).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import logging
import sys
import threading

import torch
import torch.fx
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from . import exec as rexec
from . import gears as rgears
from .config import CompilerConfig, ConfigError
from .frozen import FrozenGraph
from .fx_bridge import dynamo_input_names
from .gears.graphs import GearFunctions, dynamo_code, recompile_reasons
from .ir import Graph
from .ledger import Ledger
from .lifted_floats import constant_float_symbols
from .optimizer import optimize
from .pipeline import Stages, build_callable
from .policy import check_config, resolve_policy
from .report import CompileReport
from .scope import annotate_streams
from .shape.size_inputs import merge_lifted_sizes, read_sizes_from_tensors
from .subclasses import flatten_inputs
from .torch_compat import specialize_floats
from .unit import CompileUnit, Origin
from .user_passes import run_post_pass, run_pre_pass

log = logging.getLogger("rewrite")

__all__ = ["get_backend", "rewrite_backend", "torch_compile_config", "RewriteBackend", "decomposition_table"]

_graph_numbers = itertools.count()


@functools.lru_cache(maxsize=1)
def decomposition_table() -> dict:
    """Core-ATen decompositions, minus those that replace a kernel by a slower or less exact op chain.

    We execute ATen kernels directly (no code generation that would fuse the pieces again), so
    keeping fused ops such as scaled-dot-product attention is faster than their decompositions.
    Standard deviation stays one op: its decomposition ``sqrt(var)`` rounds the variance to the
    dtype first, so a row holding 3e38 gives inf where ATen's kernel (which takes the root of a
    double-precision variance) gives 1.2e38.
    """
    from torch._decomp import core_aten_decompositions

    table = dict(core_aten_decompositions())
    aten = torch.ops.aten
    for op in (aten.scaled_dot_product_attention.default,
               aten._scaled_dot_product_flash_attention_for_cpu.default,
               aten.std.default, aten.std.dim, aten.std.correction, aten.std_mean.correction, aten.std_mean.dim):
        table.pop(op, None)
    return table


def is_weight_source(name: str) -> bool:
    """Whether Dynamo's source name of a graph input names a module's parameter or buffer."""
    return "._parameters[" in name or "._buffers[" in name


class RewriteBackend:
    """A torch.compile backend. ``report`` accumulates what every compiled graph went through."""

    def __init__(self, compiler_config: CompilerConfig | None = None, *, decompositions: dict | None = None):
        if compiler_config is not None and not isinstance(compiler_config, CompilerConfig):
            raise TypeError(f"compiler_config must be a rewrite.CompilerConfig, got {type(compiler_config).__name__}")
        if decompositions is not None and not isinstance(decompositions, dict):
            raise TypeError("decompositions must be a dict {OpOverload: function} (e.g. from "
                            f"torch._decomp.get_decompositions), got {type(decompositions).__name__}")
        # AOTAutograd's decomposition table: the default one, with the user's entries added or replacing.
        self.decompositions = {**decomposition_table(), **decompositions} if decompositions else decomposition_table()
        # A private copy: changing the user's config later must not change (or skip checks of) this backend.
        self.config = copy.deepcopy(compiler_config) if compiler_config is not None else CompilerConfig()
        self.report = CompileReport()
        self.ledger = Ledger(self.config.strict)  # the slow paths of everything this backend compiled (rewrite.stats)
        self._lock = threading.Lock()
        self._gear_functions = GearFunctions(self.report)  # Dynamo graphs per geared function (report.gear_graphs)
        self._graphs_per_frame: dict = {}  # Dynamo frame key -> graphs compiled for it (a second one is a recompile)
        self._check_config(self.config)

    @staticmethod
    def _check_config(config: CompilerConfig) -> None:
        """Checks made before any compile: option combinations (`policy.check_config`), then, with static
        kernels switched on, their build folder (`kernels.check_build_folder`)."""
        check_config(config)
        if resolve_policy(config).static_kernels_asked:
            from .kernels import check_build_folder  # loaded only when static kernels are on

            check_build_folder(config)

    def __deepcopy__(self, memo):
        """The backend itself: a copy of a config that names it (transformers deep-copies its generation config,
        CompileConfig(backend=...) included) must compile through it, so its report and `rewrite.stats` stay the
        user's; its lock could not be copied anyway."""
        return self

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        names = dynamo_input_names(gm, len(example_inputs))
        # Floats from globals and attributes (dynamic=True) are traced again as numbers (rewrite.lifted_floats);
        # only Dynamo can trace again, so only while it compiles (a graph handed to the backend by hand keeps them)
        if dynamo_code() is not None:
            specialize_floats(constant_float_symbols(gm, names))
        # Sizes Dynamo lifted from tensor inputs are read from those tensors (TorchAir's size-input merge):
        # every later stage numbers the inputs the graph keeps, and the result picks them out of Dynamo's call.
        merged = merge_lifted_sizes(gm, list(example_inputs), names)
        if merged is None:
            return self.compile_dynamo_graph(gm, example_inputs)
        log.info("Dynamo graph: %d size inputs are read from the tensors that carry them",
                 len(example_inputs) - len(merged.kept))
        return merged.calling(self.compile_dynamo_graph(merged.gm, merged.example_inputs))

    def compile_dynamo_graph(self, gm: torch.fx.GraphModule, example_inputs):
        """The compiled function of Dynamo graph ``gm`` (after `merge_lifted_sizes`), called with its inputs."""
        number = next(_graph_numbers)
        gear_spec = rgears.collect_gear_specs(example_inputs, self.config, gm)
        frame = dynamo_code()  # the user's function Dynamo is compiling (None outside Dynamo)
        names = dynamo_input_names(gm, len(example_inputs))
        weights = [i for i, name in enumerate(names)
                   if is_weight_source(name) or isinstance(example_inputs[i], torch.nn.Parameter)]
        # Read in place across calls (a CUDA graph reads them where they are): the weights, and tensors the
        # model marked with torch._dynamo.mark_static_address (transformers' static KV cache). Only weights
        # are ever frozen: a marked tensor is state the model writes.
        in_place = sorted(set(weights) | set(_static_address_inputs(gm)))
        # Tensor subclasses (DTensor weights of a tensor-parallel model) reach the compiler flattened
        # by AOTAutograd: the graph's inputs are then these, and weights and gears are numbered in them.
        flat = flatten_inputs(list(example_inputs), names)
        graph_inputs = list(example_inputs)
        if flat is not None:
            graph_inputs, _, origin = flat
            weighty, steady = set(weights), set(in_place)
            weights = [k for k, i in enumerate(origin) if i in weighty and isinstance(graph_inputs[k], torch.Tensor)]
            in_place = [k for k, i in enumerate(origin) if i in steady and isinstance(graph_inputs[k], torch.Tensor)]
            gear_spec = _renumber_gears(gear_spec, origin, graph_inputs)

        # How recordings of the traffic name this graph's dims (rewrite.gears.recording).
        origin = Origin(f"{frame.name} ({frame.where})" if frame is not None else "", tuple(names) if flat is None else (),
                        not torch._dynamo.config.assume_static_by_default)

        def unit(kind: str, weights: tuple = (), same_inputs: bool = True) -> CompileUnit:
            here = origin if same_inputs else dataclasses.replace(origin, input_names=())
            with self._lock:
                return CompileUnit.for_aot_graph(number, kind, self.config, self.report, weights, here, self.ledger)

        direct: dict = {}  # the inference graph called without AOTAutograd's wrapper, where it would do nothing

        def compile_fw(aot_gm, aot_inputs, kind):
            frozen = ()
            same_inputs = _same_inputs(aot_inputs, graph_inputs)  # else AOT changed them: indices differ
            if kind == "inference" and self.config.experimental_config.frozen_parameter:
                if same_inputs:
                    frozen = {i: graph_inputs[i] for i in weights}
                else:
                    log.info("graph %d: cannot freeze weights (AOT changed the inputs); kept as inputs", number)
            fw = unit(kind, tuple(in_place) if same_inputs else (), same_inputs)
            # AOTAutograd calls compilers under its fake mode; frozen weights are real tensors that
            # passes (folding) compute with, so compile outside it.
            with torch._subclasses.fake_tensor.unset_fake_temporarily():
                compiled = self.compile_graph(aot_gm, fw.name, fw, frozen, gear_spec, aot_inputs)
            if frozen:  # a call with changed weights compiles the graph again with them (rewrite.frozen)
                compiled = _refrozen_when_changed(compiled, frozen, fw, lambda new: self.compile_graph(
                    aot_gm, fw.name, fw, new, gear_spec, aot_inputs))
            inner = getattr(compiled, "__rewrite_fn__", None)
            if kind == "inference" and same_inputs and flat is None and inner is not None:
                direct["fn"] = rexec.direct_call(inner, example_inputs)
            return compiled

        def compile_bw(aot_gm, aot_inputs):
            bw = unit("backward")
            # AOTAutograd may compile the backward eagerly, under its fake mode (a graph with unbacked sizes,
            # torch.compile(shapes_spec=...)): folding would then make fake constants. Compiled outside it, as
            # the forward is.
            with torch._subclasses.fake_tensor.unset_fake_temporarily():
                return self.compile_graph(aot_gm, bw.name, bw, (), None, aot_inputs)

        # set_dim_gears keeps a Dynamo flag on until the geared graph first runs; a compile that
        # fails never runs it.
        with rgears.size_oblivious.restored_on_failure():
            wrapped = aot_autograd(
                fw_compiler=functools.partial(compile_fw, kind="forward"),
                bw_compiler=compile_bw,
                inference_compiler=functools.partial(compile_fw, kind="inference"),
                decompositions=self.decompositions,
                keep_inference_input_mutations=True,
            )(gm, example_inputs)
        with self._lock:
            again = self._gear_functions.compiled(frame, gear_spec)
            retrace = self._recompiled(frame, again)
        if again is not None:  # a second (or later) Dynamo graph for a geared function: say why
            log.info("%s", again)
        fn = direct.get("fn") or wrapped
        if retrace is None:
            return fn
        fix = ("declare the sizes that vary (set_dim_gears, torch._dynamo.mark_dynamic(t, dim, min=, max=), "
               "torch.compile(shapes_spec=...)) so one trace serves them, or remove the branch on a size the guard names")
        # AOTAutograd and exec.direct read these on what a compiler returns
        return self.ledger.on_first_call(fn, "recompiles", retrace, fix, keep=("__rewrite_fn__", "_boxed_call"))

    def _recompiled(self, frame, geared) -> str | None:
        """Why this Dynamo graph is a recompile of ``frame`` (its second or later graph), or None. Under the lock."""
        if frame is None:
            return None
        n = self._graphs_per_frame[frame.key] = self._graphs_per_frame.get(frame.key, 0) + 1
        if n == 1:
            return None
        if geared is not None and geared.retraces:
            return f"{frame.name}: {geared.retraces[-1]}"
        reasons = recompile_reasons(frame.code)
        return f"{frame.name}: graph {n} was traced because " + (reasons[-1] if reasons else "of a reason Dynamo did not record")

    def compile_graph(self, gm: torch.fx.GraphModule, name: str, unit: CompileUnit, frozen: dict, gear_spec,
                      example_inputs=None):
        """Compile the AOT graph of ``unit`` into a callable; errors name the node and the reason.

        ``name`` is ``unit.name``, the second argument for subclasses that label the graphs they see.
        ``example_inputs`` (AOT's) are what the user's post_grad passes get (see rewrite.user_passes).
        """
        rep = unit.report
        stages = Stages.for_unit(unit)  # the compile's one Stages: every graph dump of this unit goes through it
        # config.cache.dir: the optimized graph and gear graphs of this AOT graph may be cached (rewrite.cache.aot).
        entry = cached = None
        if self.config.cache.dir is not None:
            from .cache.aot import aot_entry

            with rep.stage("cache"):
                entry = aot_entry(self.config, gm, unit, frozen, gear_spec)
                cached = entry.load()
        gear_graphs: dict = {}
        if cached is not None:
            graph, gear_graphs = cached
            rep.ops_before = entry.ops_before
            rep.note("optimized graphs from the compile cache")
        else:
            with rep.stage("import"):
                graph = run_pre_pass(gm, example_inputs, unit, name)  # config.post_grad_custom_pre_pass, then from_fx
                graph = annotate_streams(graph, self.config, rep)
                rep.count("sizes_read_from_tensors", read_sizes_from_tensors(graph))
                freeze_weights(graph, frozen)
                rep.ops_before = graph.op_counts()
            stages.dump(graph, "before")
            graph = optimize(graph, unit)
            if self.config.post_grad_custom_post_pass is not None:
                with rep.stage("post_grad_custom_post_pass"):
                    graph = annotate_streams(run_post_pass(graph, gm, example_inputs, unit), self.config, rep)
        self.on_optimized(graph, unit, frozen, gear_spec)
        rep.ops_after = graph.op_counts()
        stages.dump(graph, "after")

        # One assembly with the loader's (rewrite.pipeline): the unit's policy decides how the gears run.
        fn = build_callable(graph, stages, gear_spec, gear_graphs)
        if entry is not None and cached is None:
            with rep.stage("cache"):
                entry.store(graph, gear_graphs, rep.ops_before)
        log.info("%s", rep)
        # AOTAutograd calls compiled graphs with one list argument ("boxed"), so it can free inputs early.
        boxed = make_boxed_func(fn)
        boxed.__rewrite_fn__ = fn  # the unboxed callable, for calls that bypass AOTAutograd (exec.direct)
        return boxed

    def on_optimized(self, graph: Graph, unit: CompileUnit, frozen: dict, gear_spec) -> None:
        """Hook called with each optimized graph before it is built; rewrite.export captures graphs here."""


def _refrozen_when_changed(compiled, frozen: dict, unit: CompileUnit, rebuild):
    """``compiled`` (boxed) checking, on each call, that its frozen weights are unchanged (`rewrite.frozen`)."""
    checked = FrozenGraph(_unboxed(compiled), frozen, lambda new: _unboxed(rebuild(new)), unit.ledger, unit.name)
    boxed = make_boxed_func(checked)
    if hasattr(compiled, "__rewrite_fn__"):  # exec.direct may call it without AOTAutograd's wrapper, as before
        boxed.__rewrite_fn__ = checked
    return boxed


def _unboxed(compiled):
    """``fn(*inputs)`` of what `compile_graph` returned (a subclass's may be any callable AOTAutograd takes)."""
    inner = getattr(compiled, "__rewrite_fn__", None)
    if inner is not None:
        return inner
    if getattr(compiled, "_boxed_call", False):
        return lambda *args: compiled(list(args))
    return compiled


def _static_address_inputs(gm: torch.fx.GraphModule) -> list[int]:
    """Indices of the Dynamo graph's inputs that were marked with ``torch._dynamo.mark_static_address``."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return [i for i, n in enumerate(placeholders)
            if (n.meta.get("tensor_dict") or {}).get("_dynamo_static_input_type")]


def _same_inputs(aot_inputs, graph_inputs) -> bool:
    """Whether AOTAutograd's graph takes ``graph_inputs`` as they are (one for one, tensors where tensors are)."""
    if len(aot_inputs) != len(graph_inputs):
        return False
    for a, g in zip(aot_inputs, graph_inputs):
        if isinstance(a, torch.Tensor) != isinstance(g, torch.Tensor):
            return False
        if isinstance(a, torch.Tensor) and (a.dtype != g.dtype or a.dim() != g.dim()):
            return False
    return True


def _renumber_gears(spec, origin: list, graph_inputs: list):
    """``spec`` with Dynamo's input numbers replaced by those of the flattened inputs (`rewrite.subclasses`):
    a geared input is a plain tensor, so it is the one flattened input its Dynamo input became."""
    if spec is None:
        return None
    new = {}
    for k, i in enumerate(origin):
        if i in new:
            new[i] = None  # a subclass: several inputs (never geared: set_dim_gears marks what the caller passes)
        else:
            new[i] = k
    for inp in spec.inputs:
        if new.get(inp.index) is None or not isinstance(graph_inputs[new[inp.index]], torch.Tensor):
            raise rgears.GearError(f"gears were declared on {inp.name}, a tensor subclass; declare them on plain "
                                   "tensors (the model's inputs)")
    renumber = {inp.index: new[inp.index] for inp in spec.inputs}
    if all(k == v for k, v in renumber.items()):
        return spec
    return dataclasses.replace(
        spec, inputs=tuple(dataclasses.replace(inp, index=renumber[inp.index]) for inp in spec.inputs),
        gears=tuple({(renumber[i], d): v for (i, d), v in gear.items()} for gear in spec.gears),
        example=None if spec.example is None else {(renumber[i], d): v for (i, d), v in spec.example.items()})


def freeze_weights(graph: Graph, frozen: dict) -> None:
    """Replace the uses of weight placeholders by constants holding the weights themselves."""
    if not frozen:
        return
    placeholders = graph.placeholders
    written = _mutated_nodes(graph)
    constants = {}
    for index, tensor in frozen.items():
        p = placeholders[index]
        if p.id in written:
            continue  # a buffer the graph updates (e.g. BatchNorm's running stats) is state, not a constant
        # AOTAutograd calls compilers under its fake mode; the real weight must not be traced by it.
        with torch._subclasses.fake_tensor.unset_fake_temporarily():
            value = tensor.detach()
        const = graph.constant(value, p.meta, before=graph.nodes[len(placeholders)])
        const.attrs["weight_name"] = p.name
        constants[p.id] = const
    graph.replace_uses(constants)


def _mutated_nodes(graph: Graph) -> set[int]:
    """Ids of the nodes that some op of ``graph`` writes to (per its schema's alias annotations)."""
    out: set[int] = set()
    for n in graph.nodes:
        t = n.target
        if n.kind != "call" or not isinstance(t, torch._ops.OpOverload) or not t._schema.is_mutable:
            continue
        for arg_schema, value in zip(t._schema.arguments, n.args):
            if arg_schema.alias_info is not None and arg_schema.alias_info.is_write and hasattr(value, "id"):
                out.add(value.id)
        for name, value in n.kwargs.items():
            arg_schema = next((a for a in t._schema.arguments if a.name == name), None)
            if arg_schema is not None and arg_schema.alias_info is not None and arg_schema.alias_info.is_write:
                out.add(getattr(value, "id", -1))
    return out


def get_backend(compiler_config: CompilerConfig | None = None, *, config: CompilerConfig | None = None,
                decompositions: dict | None = None) -> RewriteBackend:
    """The backend to pass to ``torch.compile(model, backend=...)``.

    ``config=`` is the keyword every other function takes (``explain``, ``load``, ``cache_compile``);
    ``compiler_config=`` is TorchAir's and the design's: both are accepted, one at a time.
    """
    if compiler_config is not None and config is not None:
        raise TypeError("get_backend(): pass the config once, as config= or compiler_config= (the same thing)")
    return RewriteBackend(config if config is not None else compiler_config, decompositions=decompositions)


_TORCH_MODES = {None: None, "default": None, "max-autotune": "max-autotune",
                "max-autotune-no-cudagraphs": "max-autotune", "reduce-overhead": "reduce-overhead"}


def torch_compile_config(mode: str | None = None, options: dict | None = None) -> CompilerConfig:
    """The config of ``torch.compile(backend="rewrite", mode=..., options=...)``: torch.compile's mode
    names, and ``options`` mapping dotted config paths to values."""
    config = CompilerConfig()
    if mode not in _TORCH_MODES:
        raise ConfigError(f"torch.compile(backend='rewrite', mode={mode!r}): mode must be one of "
                          f"{[m for m in _TORCH_MODES if m]}")
    if _TORCH_MODES[mode]:
        config.mode = _TORCH_MODES[mode]
    for path, value in (options or {}).items():
        config.set_path(path, value)
    return config


def rewrite_backend(gm, example_inputs, *, mode: str | None = None, options: dict | None = None):
    """Entry point for ``torch.compile(backend="rewrite", mode=..., options=...)``.

    ``mode`` takes torch.compile's mode names; ``options`` maps dotted config paths to values,
    e.g. ``{"inference_config.gear_fallback": "pad", "exec.kernels": "inductor"}``. One `RewriteBackend`
    serves every graph of one ``torch.compile`` call, as a backend passed by object does, so its report and
    slow-path counts (`rewrite.stats`) are that compiled function's.
    """
    return backend_of_this_compile(lambda: torch_compile_config(mode, options))(gm, example_inputs)


def backend_of_this_compile(make_config) -> RewriteBackend:
    """The `RewriteBackend` of the ``torch.compile`` call a backend named by string is serving (made with
    ``make_config()`` on its first graph): one per call, as a backend passed by object is, so its report and
    slow-path counts (`rewrite.stats`) belong to that compiled function. Written for torch 2.11-2.13: the
    call's ``_TorchCompileWrapper`` is ``self`` a few frames up (it calls the entry point with its options);
    where it is not found each graph gets a backend of its own, as before."""
    holder = None
    frame = sys._getframe(1)
    for _ in range(6):
        frame = frame.f_back
        if frame is None:
            break
        if type(frame.f_locals.get("self")).__name__ == "_TorchCompileWrapper":
            holder = frame.f_locals["self"]
            break
    backend = getattr(holder, "_rewrite_backend", None)
    if backend is None:
        backend = RewriteBackend(make_config())
        if holder is not None:
            holder._rewrite_backend = backend
    return backend
