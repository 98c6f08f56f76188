"""`rewrite.inference`: inference-time options set on input tensors (TorchAir's spelling).

``set_dim_gears(tensor, dim_gears={dim: [sizes...]})`` declares the sizes a dimension may take;
the graph is then compiled once per gear (see `rewrite.gears`). ``cache_compile(self.method)``
compiles a module's method once and lets later processes load it without Dynamo: the workflow is
`rewrite.cached_function` (imported at the first call: it brings in the export loader), on top of
the compile cache's storage in `rewrite.cache`. ``input_guards`` is a ``guard_filter_fn`` for
``torch.compile(options=...)``: Dynamo then checks only the call's inputs, not the model, on each call
(`rewrite.input_guards`).
"""
from .gears import GearError, get_dim_gears, set_dim_gears
from .input_guards import input_guards

__all__ = ["set_dim_gears", "get_dim_gears", "GearError", "cache_compile", "input_guards"]


def cache_compile(func, *, config=None, backend=None, dynamic=True, cache_dir=None, global_rank=None, tp_rank=None,
                  pp_rank=None, custom_decompositions=None):
    """Wrap a module's bound method in the compile cache: the first call compiles and writes
    ``{cache_dir}/{model_info}/{func}``; later processes load it without Dynamo (`rewrite.cached_function`)."""
    from .cached_function import cache_compile as _cache_compile

    return _cache_compile(func, config=config, backend=backend, dynamic=dynamic, cache_dir=cache_dir,
                          global_rank=global_rank, tp_rank=tp_rank, pp_rank=pp_rank,
                          custom_decompositions=custom_decompositions)
