"""``torch.compile(model, backend="npugraph_ex", options={...})`` without importing anything first.

pyproject.toml names `npugraph_ex` under the ``torch_dynamo_backends`` entry points, so Dynamo finds the name
in any process where rewrite is installed (as torch_npu registers it). It lives here, not in
`rewrite.compat.torchair`, because importing that module registers the name itself (for checkouts that are not
installed), and Dynamo registers what an entry point loads: loading torchair through the entry point would
register the name twice. `rewrite.backend_names` (run by ``import rewrite``) gives a checkout that is not installed
both names.
"""
from __future__ import annotations

__all__ = ["npugraph_ex"]


def npugraph_ex(gm, example_inputs, options: dict | None = None):
    """The npugraph_ex backend, loaded on its first compile (`rewrite.compat.torchair.npugraph_ex`)."""
    from .torchair import npugraph_ex as backend

    return backend(gm, example_inputs, options=options)
