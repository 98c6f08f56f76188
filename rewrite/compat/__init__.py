"""Porting aids for scripts written against other graph compilers.

* `torchair`: TorchAir's names (``get_npu_backend``, ``CompilerConfig``'s TorchAir fields, ``npugraph_ex``);
  importing it registers the ``npugraph_ex`` backend name;
* `entry_point`: the ``npugraph_ex`` backend as pyproject.toml's ``torch_dynamo_backends`` entry point names it.
"""
from __future__ import annotations

from .entry_point import npugraph_ex

__all__ = ["npugraph_ex"]
