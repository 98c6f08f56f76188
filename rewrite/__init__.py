"""rewrite: a graph compiler for PyTorch built on equality saturation.

    import torch, rewrite
    model = torch.compile(model, backend=rewrite.get_backend(rewrite.CompilerConfig()))

See DESIGN.md for the architecture; `rewrite.explain` shows what the compiler did to a model.
"""
from __future__ import annotations

import importlib
import logging

from .config import CompilerConfig, ConfigError
from .fx_bridge import CompileError

logging.getLogger("rewrite").addHandler(logging.NullHandler())

# egglog logs every rule application at INFO (about 19,000 lines for a 2-layer MLP, 459,000 for the
# demo) under its own loggers, drowning rewrite's report at `logging.basicConfig(level=INFO)` or
# `python -m rewrite -v`. They start at WARNING unless the user has set a level on them;
# `logging.getLogger("egglog").setLevel(logging.INFO)` before the first compile (or
# `python -m rewrite -vv`) shows them again.
EGGLOG_LOGGERS = ("egglog", "egglog.egraph")
for _name in EGGLOG_LOGGERS:
    if logging.getLogger(_name).level == logging.NOTSET:
        logging.getLogger(_name).setLevel(logging.WARNING)

__all__ = [
    "get_backend",
    "CompilerConfig",
    "ConfigError",
    "CompileError",
    "GearError",
    "explain",
    "dynamo_export",
    "load",
    "inference",
    "scope",
]

# Submodules and functions loaded on first use, so `import rewrite` stays cheap: a process that only
# loads an exported graph (`rewrite.load`) never imports Dynamo.
_LAZY = {
    "GearError": ("rewrite.gears.spec", "GearError"),
    "inference": ("rewrite.inference", None),
    "scope": ("rewrite.scope", None),
    "testing": ("rewrite.testing", None),
    "dsl": ("rewrite.dsl", None),
    "explain": ("rewrite.explain", "explain"),
    "dynamo_export": ("rewrite.export", "dynamo_export"),
    "load": ("rewrite.export", "load"),
}


def get_backend(compiler_config: CompilerConfig | None = None, *, config: CompilerConfig | None = None,
                decompositions: dict | None = None):
    """The backend to pass to ``torch.compile(model, backend=...)``.

    ``config=`` is the keyword every other function takes (``explain``, ``load``, ``cache_compile``);
    ``compiler_config=`` is TorchAir's and the design's: both are accepted, one at a time.
    """
    if compiler_config is not None and config is not None:
        raise TypeError("get_backend(): pass the config once, as config= or compiler_config= (the same thing)")
    from .backend import RewriteBackend

    return RewriteBackend(config if config is not None else compiler_config, decompositions=decompositions)


def __getattr__(name):
    if name in _LAZY:
        module_name, attr = _LAZY[name]
        module = importlib.import_module(module_name)
        value = module if attr is None else getattr(module, attr)
        globals()[name] = value
        return value
    # Any other submodule (rewrite.backend, rewrite.ir, ...) is reachable as an attribute too.
    try:
        return importlib.import_module(f"rewrite.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"rewrite.{name}":
            raise
    raise AttributeError(f"module 'rewrite' has no attribute {name!r}")
