"""Compile cache (issue 17): the small costs on the warm path, side by side in one process.

* the key `cache_compile` builds on every call (`_static_fields` + `_input_fields` + its JSON) for
  MiniLM, and the call of the loaded program with and without the wrapper;
* checking a geared export's weight files: one by one (`WeightReader.get` per record) against
  `WeightReader.verify_all` (a few threads), interleaved.

Prints a table; the figures go into RESULTS.md's "Compile cache" section by hand, with this command:

    .venv/bin/python benchmarks/cache_overheads.py [--repeat 300]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402

import rewrite  # noqa: E402
import rewrite.models  # noqa: E402
from benchmarks._results import machine_line, markdown_table  # noqa: E402
from rewrite.persist.checks import read_json  # noqa: E402
from rewrite.persist.weights import WeightReader  # noqa: E402


class Served(torch.nn.Module):
    def __init__(self, cache_dir: str):
        super().__init__()
        self.model = rewrite.models.minilm()
        self.cached = rewrite.inference.cache_compile(self.encode, cache_dir=cache_dir)

    def encode(self, ids):
        return self.model(ids).last_hidden_state


def per_call(work: str, repeat: int) -> list[list[str]]:
    served = Served(os.path.join(work, "cc"))
    x = rewrite.models.token_batch(1, 32, vocab=30000, seed=1)
    rewrite.inference.set_dim_gears(x, dim_gears={0: [1, 2]})
    with torch.no_grad():
        served.cached(x)
    cached = served.cached
    (program,), = cached._programs.values()

    def key():
        json.dumps({**cached._static_fields(), **cached._input_fields((x,), {})}, sort_keys=True)

    def timed(fn) -> float:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    keys, wrapped, direct = [], [], []
    with torch.no_grad():
        for _ in range(repeat):  # interleaved
            keys.append(timed(key))
            wrapped.append(timed(lambda: cached(x)))
            direct.append(timed(lambda: program(x)))
    t = time.perf_counter()
    for _ in range(repeat):  # back to back: warm CPU caches, the figure the issue-17 note compares
        key()
    loop = (time.perf_counter() - t) / repeat
    us = lambda s: f"{statistics.median(s) * 1e6:.0f}"  # noqa: E731
    return [["cache_compile key per call, between model calls (MiniLM, us)", us(keys)],
            ["cache_compile key per call, back to back (MiniLM, us)", f"{loop * 1e6:.0f}"],
            ["call through cache_compile, batch 1 (us)", us(wrapped)],
            ["call of the loaded program, batch 1 (us)", us(direct)]]


def weights(work: str, repeat: int) -> list[list[str]]:
    folder = os.path.join(work, "export")
    model = rewrite.models.minilm()
    x = rewrite.models.token_batch(2, 32, vocab=30000, seed=2)
    rewrite.dynamo_export(x, model=model, export_path=folder)
    program, _ = read_json(os.path.join(folder, "export.json"), "graph file", "export.json")
    one_by_one, threaded = [], []
    for _ in range(repeat):  # interleaved, a fresh reader each time
        reader = WeightReader(folder, program["weights"], where="weights")
        t = time.perf_counter()
        for name in reader.records:
            reader.get(name)
        one_by_one.append(time.perf_counter() - t)
        reader = WeightReader(folder, program["weights"], where="weights")
        t = time.perf_counter()
        reader.verify_all()
        threaded.append(time.perf_counter() - t)
    mb = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.endswith(".safetensors")) / 1e6
    ms = lambda s: f"{statistics.median(s) * 1e3:.0f}"  # noqa: E731
    return [[f"weight files one by one ({mb:.0f} MB, ms)", ms(one_by_one)],
            [f"weight files, verify_all on threads ({mb:.0f} MB, ms)", ms(threaded)]]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=300, help="calls per variant (weights: a tenth)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rewrite-cache-overheads-") as work:
        rows = per_call(work, args.repeat) + weights(work, max(3, args.repeat // 10))
    print(machine_line())
    print(f"medians, variants interleaved, {args.repeat} calls ({max(3, args.repeat // 10)} weight reads)")
    print(markdown_table(["what", "median"], rows))


if __name__ == "__main__":
    main()
