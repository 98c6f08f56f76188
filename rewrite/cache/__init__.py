"""The compile cache's storage: optimized graphs (and whole programs) kept in a folder across processes.

It sits below the backend and the export loader, which use it:

* ``config.cache.dir`` (aot.py): ``torch.compile`` still runs Dynamo and AOTAutograd; the
  optimized graph and every gear's static graph come from the cache;
* ``rewrite.load`` with ``config.cache.dir`` (loads.py): a geared export's per-gear graphs are reused;
* ``rewrite.inference.cache_compile`` (the workflow in `rewrite.cached_function`, above both):
  a module's method compiled once; a later process skips Dynamo and loads the compiled program.

A cache folder is hostile (docs/export_format.md, "Compile caches"): an entry is used only when
this user's signature over all its bytes and its key verifies (store.py), then read with the file
format's checks (`rewrite.persist`); entries are written whole and only in this user's private folders; `counters` counts hits, misses, writes, damaged entries and compiles, for tests
and reports. ``python -m rewrite cache ls|info|clear`` inspects a cache folder.
"""
from .store import CacheDir, counters

__all__ = ["CacheDir", "counters"]
