"""rewrite: a graph compiler for PyTorch built on equality saturation.

    import torch, rewrite
    model = torch.compile(model, backend=rewrite.get_backend(rewrite.CompilerConfig()))

See docs/design.md for the architecture; `rewrite.explain` shows what the compiler did to a model.
"""
from __future__ import annotations

import importlib

from . import logs  # noqa: F401  (rewrite's and egglog's loggers as `import rewrite` leaves them)
from . import backend_names  # noqa: F401  (backend="rewrite" by name in a checkout that is not installed)
from .config import CompilerConfig, ConfigError
from .fx_bridge import CompileError

__all__ = [
    "get_backend",
    "CompilerConfig",
    "ConfigError",
    "CompileError",
    "GearError",
    "ExportError",
    "explain",
    "stats",
    "SlowPathError",
    "dynamo_export",
    "load",
    "inference",
    "scope",
]

# Submodules and functions loaded on first use, so `import rewrite` stays cheap: a process that only
# loads an exported graph (`rewrite.load`) never imports Dynamo.
_LAZY = {
    "get_backend": ("rewrite.backend", "get_backend"),
    "GearError": ("rewrite.gears.spec", "GearError"),
    "ExportError": ("rewrite.persist.errors", "ExportError"),
    "inference": ("rewrite.inference", None),
    "scope": ("rewrite.scope", None),
    "testing": ("rewrite.testing", None),
    "dsl": ("rewrite.dsl", None),
    "explain": ("rewrite.explain", "explain"),
    "stats": ("rewrite.explain", "stats"),
    "SlowPathError": ("rewrite.ledger", "SlowPathError"),
    "dynamo_export": ("rewrite.export", "dynamo_export"),
    "load": ("rewrite.export", "load"),
}


def __getattr__(name):
    if name in _LAZY:
        module_name, attr = _LAZY[name]
        module = importlib.import_module(module_name)
        value = module if attr is None else getattr(module, attr)
        globals()[name] = value
        # Importing rewrite.explain binds the package's `explain` to the module; the function named like its
        # module is what the package promises (rewrite.stats lives in that module too).
        for other, (other_module, other_attr) in _LAZY.items():
            if other_module == f"rewrite.{other}" and other_attr is not None and other_module == module_name:
                globals()[other] = getattr(module, other_attr)
        return value
    # Any other submodule (rewrite.backend, rewrite.ir, ...) is reachable as an attribute too.
    try:
        return importlib.import_module(f"rewrite.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"rewrite.{name}":
            raise
    raise AttributeError(f"module 'rewrite' has no attribute {name!r}")
