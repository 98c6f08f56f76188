"""The memory of all gears of a function is about the memory of the largest gear alone, predicted from the
gears' metas before any gear is built and reported by `rewrite.explain` (CPU arena here; the CUDA graph
pool's test is tests/test_cuda.py::test_all_gears_share_one_pool_about_the_size_of_the_largest_gear_alone)."""
from __future__ import annotations

import torch

import rewrite
from rewrite import models

GEARS = [1, 2, 4, 8]


def _memory(gears: list[int], first: int):
    model = models.bert(layers=2, hidden=64, heads=4, vocab=128).eval()
    ids = models.token_batch(first, 16, vocab=128)
    if len(gears) > 1:
        rewrite.inference.set_dim_gears(ids, {0: gears})
    config = rewrite.CompilerConfig(mode="reduce-overhead")
    with torch.no_grad():
        report = rewrite.explain(model, ids, config=config)
    (memory,) = [g.memory for g in report.graphs if g.memory is not None]
    return memory, report


def test_all_gears_take_the_arena_of_the_largest_gear_alone_as_predicted():
    every, report = _memory(GEARS, first=2)
    torch._dynamo.reset()
    alone, _ = _memory([GEARS[-1]], first=GEARS[-1])
    assert every.where == "CPU arena" and every.gears == len(GEARS) and alone.gears == 1
    assert every.allocated is not None and every.allocated <= 1.1 * alone.allocated, (every, alone)
    # predicted before any gear was built, from the metas: an upper bound of what was allocated, and a close one
    assert every.allocated <= every.predicted <= 2 * every.allocated, every
    assert every.largest == alone.largest
    assert "memory: CPU arena of 4 gear(s): predicted" in str(report)
