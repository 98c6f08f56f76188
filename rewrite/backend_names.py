"""The backend names ``"rewrite"`` and ``"npugraph_ex"`` where rewrite is importable but not installed.

Dynamo finds backend names through installed packages' ``torch_dynamo_backends`` entry points (pyproject.toml).
A checkout on ``PYTHONPATH`` or a vendored copy has none, so there ``torch.compile(backend="rewrite")`` and
transformers' ``CompileConfig(backend="rewrite")`` failed with ``InvalidBackend`` even after ``import rewrite``
(seen on a GPU machine, 2026-12-04). Importing this module (``import rewrite`` does) registers both names there.
Where the entry points exist it does nothing and imports nothing: Dynamo loads them itself, and registering here
too would make its own load a duplicate.
"""
from __future__ import annotations

__all__ = ["register_names_of_a_checkout"]


def _rewrite_by_name(gm, example_inputs, *, mode: str | None = None, options: dict | None = None):
    """``backend="rewrite"`` as registered here: `rewrite.backend` loads on the first compile, not on import."""
    from .backend import rewrite_backend

    return rewrite_backend(gm, example_inputs, mode=mode, options=options)


def register_names_of_a_checkout() -> None:
    from importlib.metadata import entry_points

    if any(ep.name == "rewrite" and ep.value.startswith("rewrite.")
           for ep in entry_points(group="torch_dynamo_backends")):
        return
    from torch._dynamo.backends.registry import lookup_backend, register_backend  # imports Dynamo: checkouts only
    from torch._dynamo.exc import InvalidBackend

    from .compat.entry_point import npugraph_ex

    for name, fn in (("rewrite", _rewrite_by_name), ("npugraph_ex", npugraph_ex)):
        try:
            lookup_backend(name)  # registered already (rewrite.compat.torchair registers npugraph_ex on import)
        except InvalidBackend:  # the name is free
            register_backend(fn, name=name)


register_names_of_a_checkout()
