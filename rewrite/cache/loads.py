"""``rewrite.load`` with ``config.cache.dir``: a geared export's per-gear optimized graphs are reused.

Loading an export decodes its symbolic graph and, for a geared export, substitutes and optimizes
every gear. With a cache folder the optimized gear graphs are written after the first load and
read by later loads of the same graph file (key: the graph file's content, the config, the
versions), so a load only decodes and builds. Weights are referred to, not copied: the gear graphs
read the export's own weight tensors.
"""
from __future__ import annotations

import json
import logging
import os

from .aot import common_fields, gear_graphs_by_key, gear_label
from ..gears.spec import MAX_GEARS
from .graph_files import GRAPHS_FILE, check_error, decode_graphs, encode_graphs
from .key import digest, key_hash
from .store import CacheDir, count

log = logging.getLogger("rewrite")

__all__ = ["GearGraphCache"]


class GearGraphCache:
    """The gear graphs of one export's graph file, for `ExportedModel(gear_graphs=...)`."""

    def __init__(self, config, program: dict, weights, label: str):
        self.cache = CacheDir.get(config.cache.dir, named=True)
        self.fields = {**common_fields(config), "program": digest(json.dumps(program, sort_keys=True), 32)}
        self.rel = os.path.join("loads", key_hash(self.fields))
        self.label = label
        self.live = dict(weights.loaded)
        self.graphs: dict = {}
        self.hit = False

    def load(self) -> dict:
        entry = self.cache.lookup(self.rel, self.fields, f"the gears of {self.label}")
        if entry is not None:
            try:
                graphs, _ = decode_graphs(entry, "", self.live, max_graphs=MAX_GEARS)
                self.graphs = gear_graphs_by_key(graphs, GRAPHS_FILE)
                self.hit = True
                count("hits")
            except Exception as e:  # noqa: BLE001 - a damaged entry is a miss
                if not check_error(e):
                    raise
                self.cache.damaged(entry, e)
                self.graphs = {}
        return self.graphs

    @property
    def program_checked(self) -> bool:
        """Whether the export's own graph was checked by the load that wrote this entry: a hit is a
        signed entry whose key holds the program's digest, and entries are written only after a load
        checked every recorded meta of that program. Then the load may skip inferring them again."""
        return self.hit

    def store(self) -> None:
        if self.hit or not self.graphs:
            return
        try:
            files = encode_graphs({gear_label(k): g for k, g in self.graphs.items()}, self.live)
        except Exception as e:  # noqa: BLE001
            log.warning("compile cache: the gears of %s are not cached: %s: %s", self.label, type(e).__name__, e)
            return
        self.cache.write(self.rel, self.fields, files, kind="load", label=self.label)
