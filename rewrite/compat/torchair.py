"""TorchAir spellings of the rewrite API, so a TorchAir script runs with

    import rewrite.compat.torchair as torchair

and its `.npu()` calls removed. Names map one to one (npu_stream_switch -> scope.stream_switch, ...).
"""
from __future__ import annotations

import types

from .. import inference as _inference
from ..backend import get_backend
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


def __getattr__(name):
    if name == "scope":
        value = _scope_module()
        globals()["scope"] = value
        return value
    raise AttributeError(f"module 'rewrite.compat.torchair' has no attribute {name!r}")


__all__ = ["CompilerConfig", "get_npu_backend", "dynamo_export", "inference", "scope"]
