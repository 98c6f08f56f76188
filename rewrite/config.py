"""`CompilerConfig`: every knob of the compiler, in nested sections.

Sections reject unknown attributes and values outside the allowed set at assignment time, so a
typo such as ``config.mod = "reduce-overhead"`` fails loudly instead of being silently ignored.
"""
from __future__ import annotations

import copy
import math
from typing import Any

__all__ = ["CompilerConfig", "ConfigError", "UnknownFieldError", "REDUCE_OVERHEAD_MODES", "is_reduce_overhead"]

# The mode names that mean reduce-overhead (TorchAir's npugraph_ex is reduce-overhead under another name).
REDUCE_OVERHEAD_MODES = ("reduce-overhead", "npugraph_ex")


class ConfigError(ValueError):
    """A config field was misspelt or given a value it does not allow."""


class UnknownFieldError(ConfigError, AttributeError):
    """A config field or section that does not exist was read (``config.dump_config.enable_dump = True``
    reads ``dump_config`` first). A `ConfigError`, as docs/porting_from_torchair.md promises for TorchAir-only sections,
    and an AttributeError, so ``hasattr`` and ``getattr(config, name, default)`` keep working."""


class _Choice:
    """A field whose value must be one of a fixed set."""

    def __init__(self, default, allowed):
        self.default = default
        self.allowed = tuple(allowed)

    def check(self, path: str, value):
        if value not in self.allowed:
            raise ConfigError(f"{path} = {value!r} is not allowed; choose one of {list(self.allowed)}")
        return value


class _Typed:
    """A field whose value must be an instance of the given types."""

    def __init__(self, default, *types):
        self.default = default
        self.types = types

    def check(self, path: str, value):
        if not isinstance(value, self.types) or (bool not in self.types and isinstance(value, bool) and int in self.types):
            names = " or ".join(t.__name__ for t in self.types)
            raise ConfigError(f"{path} = {value!r} has type {type(value).__name__}; expected {names}")
        return value


class _Number(_Typed):
    """An int (or, with ``integer=False``, a real number) in ``[minimum, maximum]``: never nan or inf.

    Every numeric field is one of these, so a nan timeout, a negative limit or a thread count of a
    million is a ConfigError naming the field and its range when it is assigned, not a crash or a
    hang later.
    """

    def __init__(self, default, minimum, maximum, *, integer: bool = True, unit: str = "",
                 exclusive_minimum: bool = False):
        super().__init__(default, *((int,) if integer else (int, float)))
        self.minimum, self.maximum, self.unit = minimum, maximum, unit
        self.exclusive_minimum = exclusive_minimum

    def describe(self) -> str:
        low = f"> {self.minimum}" if self.exclusive_minimum else f">= {self.minimum}"
        kind = "an int" if self.types == (int,) else "a finite number"
        return f"{kind} {low} and <= {self.maximum}{' ' + self.unit if self.unit else ''}"

    def check(self, path: str, value):
        super().check(path, value)
        too_low = value <= self.minimum if self.exclusive_minimum else value < self.minimum
        if isinstance(value, float) and not math.isfinite(value) or too_low or value > self.maximum:
            raise ConfigError(f"{path} = {value!r} is out of range; expected {self.describe()}")
        return value


class _Section:
    """A group of fields. Subclasses declare fields as class attributes of `_Choice`/`_Typed`/`_Section`."""

    _path = "config"

    def __init__(self, path: str | None = None):
        object.__setattr__(self, "_path", path or self._path)
        for name, spec in self._fields().items():
            if isinstance(spec, type) and issubclass(spec, _Section):
                object.__setattr__(self, name, spec(f"{self._path}.{name}"))
            else:
                object.__setattr__(self, name, copy.copy(spec.default))

    @classmethod
    def _fields(cls) -> dict[str, Any]:
        out = {}
        for klass in reversed(cls.__mro__):
            for name, spec in vars(klass).items():
                if isinstance(spec, (_Choice, _Typed)) or (isinstance(spec, type) and issubclass(spec, _Section)):
                    out[name] = spec
        return out

    def __getattr__(self, name):
        # Only called for names that are not set: an unknown field. Private and dunder names keep
        # Python's plain AttributeError (copy, pickle and hasattr probes ask for those).
        if name.startswith("_"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        raise UnknownFieldError(f"{self._path} has no field {name!r}; known fields: {sorted(self._fields())}"
                                + _TORCHAIR_ONLY.get(name, ""))

    def __setattr__(self, name, value):
        fields = self._fields()
        if name not in fields:
            raise ConfigError(
                f"{self._path} has no field {name!r}; known fields: {sorted(fields)}" + _TORCHAIR_ONLY.get(name, "")
            )
        spec = fields[name]
        if isinstance(spec, type):
            raise ConfigError(f"{self._path}.{name} is a section; set its fields instead")
        object.__setattr__(self, name, spec.check(f"{self._path}.{name}", value))

    def set_path(self, dotted: str, value) -> None:
        """Set a field by its dotted path (``"inference_config.gear_fallback"``), with the usual checks."""
        *sections, field = dotted.split(".")
        target = self
        for name in sections:
            sub = getattr(target, name, None) if name in target._fields() else None
            if not isinstance(sub, _Section):
                raise ConfigError(f"{target._path} has no section {name!r}; known fields: {sorted(target._fields())}")
            target = sub
        setattr(target, field, value)

    def as_dict(self) -> dict:
        out = {}
        for name in self._fields():
            value = getattr(self, name)
            out[name] = value.as_dict() if isinstance(value, _Section) else value
        return out

    def __repr__(self):
        return f"{type(self).__name__}({self.as_dict()})"


# TorchAir config names rewrite does not have, and why (docs/porting_from_torchair.md).
_TORCHAIR_ONLY = {
    name: f" ({name} is TorchAir's {what}, which rewrite does not have; see docs/porting_from_torchair.md)"
    for name, what in [("dump_config", "GE dump section"), ("aoe_config", "AOE tuning section"),
                       ("fusion_config", "GE fusion section"), ("clone_input", "npugraph_ex input-copy switch"),
                       ("remove_noop_ops", "npugraph_ex pass switch")]
}


class GraphDumpConfig(_Section):
    type = _Typed(None, str, type(None))
    path = _Typed("rewrite_dump", str)

    def __setattr__(self, name, value):
        if name == "type" and value is not None and value not in ("txt", "pbtxt", "py"):
            raise ConfigError(f"{self._path}.type = {value!r} is not allowed; choose one of ['txt', 'pbtxt', 'py'] or None")
        super().__setattr__(name, value)


class DebugAclgraphConfig(_Section):
    # reduce-overhead: how many distinct input shapes one compiled graph captures (CUDA graphs,
    # npugraph_ex's capture_limit); later new shapes run uncaptured, with a log line.
    static_capture_size_limit = _Number(64, 1, 2**63 - 1, unit="captured shapes")


class DebugConfig(_Section):
    graph_dump = GraphDumpConfig
    aclgraph = DebugAclgraphConfig


class _IntList(_Typed):
    """A list of positive ints (sizes), checked when assigned."""

    def __init__(self):
        super().__init__([], list, tuple)

    def check(self, path: str, value):
        super().check(path, value)
        for i, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, int) or item < 1:
                raise ConfigError(f"{path}[{i}] = {item!r}; expected a positive int (a size)")
        return sorted(set(value))


class _DeclaredGears(_Typed):
    """Sizes for declared dims: one list for every dim, or a list per gear axis, keyed by a ShapeVar's name or by
    'argument:dim' ({"batch": [1, 4, 16], "input_ids:1": [32, 128]}); checked when assigned."""

    def __init__(self):
        super().__init__([], list, tuple, dict)

    def check(self, path: str, value):
        super().check(path, value)
        if not isinstance(value, dict):
            return _IntList().check(path, value)
        out = {}
        for key, sizes in value.items():
            if not isinstance(key, str) or not key:
                raise ConfigError(f"{path}: key {key!r} is not allowed; keys are ShapeVar names or 'argument:dim' "
                                  "strings, e.g. 'batch' or 'input_ids:1'")
            out[key] = _IntList().check(f"{path}[{key!r}]", sizes)
        return out


class InferenceConfig(_Section):
    # How set_dim_gears lists combine (within a tensor, then across tensors): position by position
    # ("zip", equal lengths) or every combination ("product"). At most 100 gears in total.
    dynamic_gears_merge_policy = _Choice("zip", ("zip", "product"))
    # A shape that is no gear: raise ("error"), pad up to the smallest larger gear when the graph
    # provably keeps that dimension's rows independent ("pad"), pad or split into several gears' runs, whichever
    # the gears' measured latency says is cheaper ("fit": rewrite.gears.fit), or run the symbolic graph ("dynamic").
    gear_fallback = _Choice("error", ("error", "pad", "fit", "dynamic"))
    # A request's padded tokens (the positions an attention mask zeroes at a row's end): computed, as eager does
    # ("compute"), or skipped ("skip": each call's rows run in groups cut to their own length, where the padding proof
    # shows the mask alone keeps those positions from every real one; outputs there hold 0; rewrite.gears.regroup).
    # Needs gears and gear_fallback "pad" or "fit".
    padded_tokens = _Choice("compute", ("compute", "skip"))
    # Gears for dims the user declared a range for (mark_dynamic(t, d, min=, max=), torch.compile(shapes_spec=...)):
    # these sizes, those inside each declared range (e.g. rewrite.gears.plan_gears(...).gears); [] = the default
    # ladder (the range's ends, its optimization_hint and powers of two between: rewrite.gears.declared). A dict gives
    # each gear axis its own sizes, by ShapeVar name or 'argument:dim': {"batch": [1, 4, 16], "input_ids:1": [32, 128]}.
    declared_gears = _DeclaredGears()


class ExecConfig(_Section):
    kernels = _Choice("aten", ("aten", "inductor"))
    # Put independent branches of graphs without stream scopes on streams by a cost model.
    auto_streams = _Typed(False, bool)
    # A stream that waits longer than this for another fails the call instead of hanging.
    stream_timeout_s = _Number(300.0, 0, 7 * 24 * 3600, integer=False, unit="seconds", exclusive_minimum=True)
    # CPU: intra-op threads of each side-stream worker; 0 = torch's threads / number of streams.
    stream_intra_op_threads = _Number(0, 0, 1024)
    # Default mode, CPU: a static inference graph (each gear) runs its ATen code this many calls; the call
    # after that makes it hot: it gets reduce-overhead's execution plan and static C kernels
    # (rewrite.exec.program), built once and kept in the per-user cache folder (rewrite.persist.folders). 0: never.
    tier_up_calls = _Number(8, 0, 2**31 - 1, unit="calls")
    # CUDA: the kernels a static graph (each gear) gets where the policy gives it static kernels
    # (reduce-overhead at compile time, the default mode when it tiers up): Inductor's Triton kernels
    # compiled for the gear's exact sizes ("inductor"), or its ATen code as it is ("aten"). Either way
    # the gear runs as a CUDA graph (rewrite.exec.cuda_graphs).
    cuda_kernels = _Choice("inductor", ("inductor", "aten"))


class GeConfig(_Section):
    # Run every graph on one stream; an error together with stream scopes (they conflict).
    enable_single_stream = _Typed(False, bool)


class ExportExperimentalConfig(_Section):
    enable_record_nn_module_stack = _Typed(False, bool)


class ExportConfig(_Section):
    onnx = _Typed(False, bool)
    experimental = ExportExperimentalConfig
    # Multi-rank export and load: how long a rank waits for the others to reach a point they must
    # all pass (a rank that failed before it, died or hangs makes the others fail after this long).
    rank_timeout_s = _Number(300.0, 0, 7 * 24 * 3600, integer=False, unit="seconds", exclusive_minimum=True)


class _StringList(_Typed):
    """A list of strings, checked when assigned."""

    def __init__(self):
        super().__init__([], list, tuple)

    def check(self, path: str, value):
        super().check(path, value)
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise ConfigError(f"{path}[{i}] = {item!r} is a {type(item).__name__}; expected a str")
        return list(value)


class _Callable(_Typed):
    """A callable or None."""

    def __init__(self):
        super().__init__(None, object)

    def check(self, path: str, value):
        if value is not None and not callable(value):
            raise ConfigError(f"{path} = {value!r} is a {type(value).__name__}; expected a callable or None")
        return value


class _RuleSetList(_Typed):
    """A list of `rewrite.dsl.RuleSet` objects, checked when assigned."""

    def __init__(self):
        super().__init__([], list)

    def check(self, path: str, value):
        super().check(path, value)
        from .dsl import RuleSet

        for i, item in enumerate(value):
            if not isinstance(item, RuleSet):
                raise ConfigError(f"{path}[{i}] = {item!r} is a {type(item).__name__}; "
                                  "expected a rewrite.dsl.RuleSet")
        return list(value)


class RulesConfig(_Section):
    # User rulesets (rewrite.dsl.RuleSet) run after the default library.
    extra = _RuleSetList()
    # Turn the e-graph optimizer off entirely (graphs still run, unoptimized).
    enabled = _Typed(True, bool)
    # Limits for one saturation run: it stops at whichever comes first and keeps the best graph so far.
    node_limit = _Number(200_000, 1, 10**9, unit="e-nodes")
    time_limit_s = _Number(10.0, 0, 24 * 3600, integer=False, unit="seconds")
    iteration_limit = _Number(30, 1, 10**6, unit="rounds")
    # Constants larger than this many elements are not produced by folding.
    fold_size_limit = _Number(65_536, 0, 2**40, unit="elements")
    # Rules, rulesets or rule families switched off by name (`python -m rewrite rules` lists them).
    disabled = _StringList()


class AclgraphExperimentalConfig(_Section):
    # Static per-shape kernels (seed 002): record op signatures during warm-up, build one kernel
    # per signature, reuse them across runs; the build dir defaults to the running script's folder.
    _aclnn_static_shape_kernel = _Typed(False, bool)
    _aclnn_static_shape_kernel_build_dir = _Typed(None, str, type(None))


class ExperimentalConfig(_Section):
    # Treat parameters and buffers of an inference graph (one compiled under torch.no_grad, or whose weights need no
    # grad) as constants, which folding and oneDNN's packed GEMMs then use. On by default: MiniLM's static graphs take
    # 0.45x of the time with them (520 vs 1155 ms at batch 32 x 128, one thread), and a call whose weights changed since (an in-place
    # write, load_state_dict, p.data = ...) compiles the graph again with the new values, counted (rewrite.frozen).
    frozen_parameter = _Typed(True, bool)
    aclgraph = AclgraphExperimentalConfig


class CacheConfig(_Section):
    # Compile cache folder (None: off); rewrite.inference.cache_compile uses it too.
    dir = _Typed(None, str, type(None))


class CompilerConfig(_Section):
    """All options of the `rewrite` backend. Unknown fields raise `ConfigError`.

    Fields may also be given when it is made, by name or dotted path, with the same checks:
    ``CompilerConfig(mode="reduce-overhead")``, ``CompilerConfig(**{"exec.kernels": "inductor"})``.
    """

    def __init__(self, **fields):
        super().__init__()
        for path, value in fields.items():
            self.set_path(path, value)

    mode = _Choice("max-autotune", ("max-autotune", *REDUCE_OVERHEAD_MODES))
    # Every slow path (a pad, a dynamic fallback, a recompile, an uncaptured CUDA graph, a tier-up refused or
    # pending, an ATen op where a static kernel was expected) raises rewrite.SlowPathError naming the cause and
    # the fix, instead of being counted (rewrite.stats(compiled_fn) shows the counts; rewrite.ledger).
    strict = _Typed(False, bool)
    # User FX passes run on each AOT graph before / after the built-in ones (TorchAir and Inductor
    # spelling): ``fn(graph_module, example_inputs, config)``, mutating the GraphModule in place.
    post_grad_custom_pre_pass = _Callable()
    post_grad_custom_post_pass = _Callable()
    inference_config = InferenceConfig
    exec = ExecConfig
    ge_config = GeConfig
    debug = DebugConfig
    export = ExportConfig
    rules = RulesConfig
    experimental_config = ExperimentalConfig
    cache = CacheConfig


def is_reduce_overhead(config: CompilerConfig) -> bool:
    """Whether ``config.mode`` is reduce-overhead under any of its names: the one place mode names are compared."""
    return config.mode in REDUCE_OVERHEAD_MODES
