"""TorchAir spellings of the rewrite API, so a TorchAir script runs with

    import rewrite.compat.torchair as torchair

and its `.npu()` calls removed. Names map one to one (npu_stream_switch -> scope.stream_switch,
ops.wait -> scope.wait, ...); docs/porting_from_torchair.md lists every name and every
deliberate difference. Importing it also registers the backend name ``"npugraph_ex"``
(reduce-overhead mode with npugraph_ex's ``options=`` names), as torch_npu does.
"""
from __future__ import annotations

import copy
import logging
import types

import torch

from .. import inference as _inference
from ..backend import RewriteBackend, backend_of_this_compile
from ..config import CompilerConfig


class NpuBackend(RewriteBackend):
    """What `get_npu_backend` returns: a `RewriteBackend` that also takes torch.compile's ``options=``
    (npugraph_ex's option names, applied to a copy of the backend's config for that compile), as
    TorchAir's backends do."""

    def __call__(self, gm, example_inputs, *, options: dict | None = None):
        if not options:
            return super().__call__(gm, example_inputs)
        variant = copy.copy(self)  # shares the report and the lock; only the config differs
        variant.config = _apply_options(copy.deepcopy(self.config), options)
        self._check_config(variant.config)
        return RewriteBackend.__call__(variant, gm, example_inputs)


def get_npu_backend(*, compiler_config: CompilerConfig | None = None, custom_decompositions: dict | None = None):
    """TorchAir's `get_npu_backend`: ``custom_decompositions`` ({OpOverload: fn}) are added to the
    decomposition table AOTAutograd traces with (replacing a default entry for the same op)."""
    return NpuBackend(compiler_config, decompositions=custom_decompositions or None)


def dynamo_export(*args, **kwargs):
    from ..export import dynamo_export as _export

    return _export(*args, **kwargs)


def _scope_module():
    from .. import scope as _scope

    return types.SimpleNamespace(
        npu_stream_switch=_scope.stream_switch,
        npu_wait_tensor=_scope.wait_tensor,
        super_kernel=super_kernel,
        limit_core_num=limit_core_num,
        op_never_timeout=op_never_timeout,
        data_dump=data_dump,
    )


def _ops_module():
    from .. import scope as _scope

    return types.SimpleNamespace(wait=_scope.wait, record=_scope.record)


class _NpuOnlyScope:
    """A TorchAir scope whose attributes only the NPU graph engine reads (super kernels, AI-core
    limits, op timeouts, data dump): its arguments are checked as TorchAir checks them and it does
    nothing, so scripts that use it run unchanged (nested stream scopes still apply)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class super_kernel(_NpuOnlyScope):  # noqa: N801 - TorchAir's spelling
    def __init__(self, scope: str | None, options: str = ""):
        self.scope, self.options = scope, options


class limit_core_num(_NpuOnlyScope):  # noqa: N801
    def __init__(self, op_aicore_num: int, op_vectorcore_num: int):
        self.op_aicore_num, self.op_vectorcore_num = op_aicore_num, op_vectorcore_num


class op_never_timeout(_NpuOnlyScope):  # noqa: N801
    def __init__(self, enable: bool = True):
        if not isinstance(enable, bool):
            raise TypeError(f"op_never_timeout() argument 'enable' must be bool, not {type(enable).__name__}")
        self.enable = enable


class data_dump(_NpuOnlyScope):  # noqa: N801
    pass


# TorchAir's `torchair.logger` (``torchair.logger.setLevel(logging.DEBUG)``): rewrite logs to the "rewrite" logger.
logger = logging.getLogger("rewrite")

inference = types.SimpleNamespace(set_dim_gears=_inference.set_dim_gears, cache_compile=_inference.cache_compile)

# npugraph_ex's options (torchair's _process_kwargs_options): option -> (rewrite config path or None when
# rewrite needs no setting for it, allowed values). Options without a path are accepted for portability:
# rewrite already behaves as they ask or the pass they switch does not exist here (see docs/porting_from_torchair.md).
_BOOL = (True, False)
NPUGRAPH_EX_OPTIONS = {
    "capture_limit": ("debug.aclgraph.static_capture_size_limit", int),
    "static_kernel_compile": ("experimental_config.aclgraph._aclnn_static_shape_kernel", _BOOL),
    "frozen_parameter": ("experimental_config.frozen_parameter", _BOOL),
    "post_grad_custom_pre_pass": ("post_grad_custom_pre_pass", None),
    "post_grad_custom_post_pass": ("post_grad_custom_post_pass", None),
    "clone_input": (None, _BOOL),  # inputs are always copied into a CUDA graph's static buffers
    "clone_output": (None, _BOOL),  # outputs always belong to the caller (never overwritten by the next call)
    "use_graph_pool": (None, None),
    "reuse_graph_pool_in_same_fx": (None, _BOOL),  # the gears of a function always share one pool
    "remove_noop_ops": (None, _BOOL),
    "remove_cat_ops": (None, _BOOL),
    "inplace_pass": (None, _BOOL),
    "input_inplace_pass": (None, _BOOL),
    "pattern_fusion_pass": (None, _BOOL),
    "force_eager": (None, (False,)),
    "capture_error_mode": (None, (None, "global", "thread_local", "relaxed")),
}


def _apply_options(config: CompilerConfig, options: dict) -> CompilerConfig:
    """Set npugraph_ex's ``options`` on ``config`` (TorchAir's _process_kwargs_options)."""
    if not isinstance(options, dict):
        raise ValueError(f"options must be a dict of npugraph_ex options, got {type(options).__name__}; "
                         f"allowed options: {sorted(NPUGRAPH_EX_OPTIONS)}")
    for name, value in options.items():
        if name not in NPUGRAPH_EX_OPTIONS:
            raise ValueError(f"Invalid option '{name}', allowed options: {sorted(NPUGRAPH_EX_OPTIONS)}")
        path, allowed = NPUGRAPH_EX_OPTIONS[name]
        if isinstance(allowed, tuple) and (value not in allowed or type(value) not in {type(a) for a in allowed}):
            kinds = sorted({str(type(a)) for a in allowed})
            raise ValueError(f"Value '{value}' (type: {type(value)}) not in optional list {list(allowed)} "
                             f"(type: {', '.join(kinds)}).")
        if path is not None:
            config.set_path(path, value)
    return config


def npugraph_ex_config(options: dict | None) -> CompilerConfig:
    """The config of ``torch.compile(backend="npugraph_ex", options=...)``: reduce-overhead with npugraph_ex's option names."""
    config = CompilerConfig()
    config.mode = "npugraph_ex"
    return _apply_options(config, options or {})


def npugraph_ex(gm, example_inputs, options: dict | None = None):
    """``torch.compile(model, backend="npugraph_ex", options={...})``: reduce-overhead mode with
    npugraph_ex's option names (registered under that name when this module is imported)."""
    return backend_of_this_compile(lambda: npugraph_ex_config(options))(gm, example_inputs)


try:
    torch._dynamo.register_backend(npugraph_ex, name="npugraph_ex")
except AssertionError:  # already registered (this module was reloaded)
    pass


def __getattr__(name):
    if name in ("scope", "ops"):
        value = _scope_module() if name == "scope" else _ops_module()
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rewrite.compat.torchair' has no attribute {name!r}")


__all__ = ["CompilerConfig", "get_npu_backend", "logger", "NpuBackend", "dynamo_export", "inference", "scope", "ops",
           "npugraph_ex"]
