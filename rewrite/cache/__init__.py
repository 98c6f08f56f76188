"""The compile cache: optimized graphs (and with `cache_compile`, whole programs) reused across processes.

* ``config.cache.dir`` (rewrite.cache.aot): ``torch.compile`` still runs Dynamo and AOTAutograd;
  the optimized graph and every gear's static graph come from the cache.
* ``rewrite.inference.cache_compile`` (rewrite.cache.compile): a module's method compiled once;
  a later process skips Dynamo and loads the compiled program (the export format).
* ``rewrite.load`` with ``config.cache.dir``: a geared export's per-gear graphs are reused.

Every file is read as hostile (the export loader's checks); entries are written whole (store.py);
`counters` counts hits, misses, writes, damaged entries and compiles, for tests and reports.
``python -m rewrite cache ls|info|clear`` inspects a cache folder.
"""
from .store import CacheDir, counters

__all__ = ["CacheDir", "counters", "cache_compile"]


def __getattr__(name):
    if name == "cache_compile":
        from .compile import cache_compile

        return cache_compile
    raise AttributeError(f"module 'rewrite.cache' has no attribute {name!r}")
