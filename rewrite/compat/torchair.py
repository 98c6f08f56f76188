"""TorchAir spellings of the rewrite API, so a TorchAir script runs with

    import rewrite.compat.torchair as torchair

and its `.npu()` calls removed. Names map one to one (npu_stream_switch -> scope.stream_switch, ...).
Importing it also registers the backend name ``"npugraph_ex"`` (reduce-overhead mode with
npugraph_ex's ``options=`` names), as torch_npu does.
"""
from __future__ import annotations

import types

import torch

from .. import inference as _inference
from ..backend import RewriteBackend, get_backend
from ..config import CompilerConfig


def get_npu_backend(*, compiler_config: CompilerConfig | None = None, custom_decompositions=None):
    """TorchAir's `get_npu_backend`; custom decompositions are not supported and must be None."""
    if custom_decompositions:
        raise NotImplementedError("rewrite.compat.torchair.get_npu_backend: custom_decompositions is not supported; "
                                  "write a rewrite rule (rewrite.dsl) instead")
    return get_backend(compiler_config=compiler_config)


def dynamo_export(*args, **kwargs):
    from ..export import dynamo_export as _export

    return _export(*args, **kwargs)


def _scope_module():
    from .. import scope as _scope

    return types.SimpleNamespace(
        npu_stream_switch=_scope.stream_switch,
        npu_wait_tensor=_scope.wait_tensor,
    )


inference = types.SimpleNamespace(set_dim_gears=_inference.set_dim_gears)

# npugraph_ex's options (torchair's _process_kwargs_options): option -> (rewrite config path or None when
# rewrite needs no setting for it, allowed values). Options without a path are accepted for portability:
# rewrite already behaves as they ask or the pass they switch does not exist here (see README).
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


def _npugraph_ex_config(options: dict | None) -> CompilerConfig:
    config = CompilerConfig()
    config.mode = "npugraph_ex"
    for name, value in (options or {}).items():
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


def npugraph_ex(gm, example_inputs, options: dict | None = None):
    """``torch.compile(model, backend="npugraph_ex", options={...})``: reduce-overhead mode with
    npugraph_ex's option names (registered under that name when this module is imported)."""
    return RewriteBackend(_npugraph_ex_config(options))(gm, example_inputs)


try:
    torch._dynamo.register_backend(npugraph_ex, name="npugraph_ex")
except AssertionError:  # already registered (this module was reloaded)
    pass


def __getattr__(name):
    if name == "scope":
        value = _scope_module()
        globals()["scope"] = value
        return value
    raise AttributeError(f"module 'rewrite.compat.torchair' has no attribute {name!r}")


__all__ = ["CompilerConfig", "get_npu_backend", "dynamo_export", "inference", "scope", "npugraph_ex"]
