"""`rewrite.explain(fn_or_module, *args, config=None)`: compile, run once, report what happened."""
from __future__ import annotations

import torch

from .backend import get_backend
from .config import CompilerConfig
from .report import CompileReport

__all__ = ["explain"]


def explain(fn_or_module, *args, config: CompilerConfig | None = None, fullgraph: bool = False, **kwargs) -> CompileReport:
    """Compile ``fn_or_module`` with `rewrite`, call it on ``args``, return the `CompileReport`.

    The report prints op counts before and after optimization (per gear), the passes and rules
    applied and the time spent per stage. ``report.result`` holds what the call returned.
    """
    backend = get_backend(config or CompilerConfig())
    compiled = torch.compile(fn_or_module, backend=backend, fullgraph=fullgraph)
    result = compiled(*args, **kwargs)
    report = backend.report
    report.result = result
    return report
