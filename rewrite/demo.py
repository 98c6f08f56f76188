"""The main job (`make demo`): compile MiniLM (real weights) with batch gears and show the result.

Prints what the compiler did (op counts before/after optimization, per gear; rules applied; time
per stage), checks every gear against eager, and times eager vs rewrite at each gear.
"""
from __future__ import annotations

import statistics
import time

import torch

from . import inference, models
from .backend import get_backend
from .config import CompilerConfig


def _median_ms(fn, arg, repeat: int = 15) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(arg)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


def run_demo(batches=(1, 2, 4, 8), seq: int = 32) -> None:
    torch.manual_seed(0)
    print(f"rewrite demo: all-MiniLM-L6-v2 (real weights), batch gears {list(batches)}, sequence {seq}\n")
    model = models.minilm()
    config = CompilerConfig()
    # Inference with fixed weights: let folding and de-duplication see them as constants.
    config.experimental_config.frozen_parameter = True
    backend = get_backend(config)
    compiled = torch.compile(model, backend=backend, fullgraph=True)

    first = models.token_batch(batches[-1], seq, vocab=30522)
    inference.set_dim_gears(first, dim_gears={0: list(batches)})
    with torch.no_grad():
        t0 = time.perf_counter()
        compiled(first)
        compile_s = time.perf_counter() - t0
    print(backend.report)
    print(f"\ncompiled {len(batches)} gears in {compile_s:.1f} s (first call)\n")

    frames_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    rows = []
    with torch.no_grad():
        for b in batches:
            ids = models.token_batch(b, seq, vocab=30522, seed=b)
            expected = model(ids).last_hidden_state
            got = compiled(ids).last_hidden_state
            err = (got - expected).abs().max().item()
            if not torch.allclose(got, expected, atol=1e-4, rtol=1e-4):
                raise AssertionError(f"gear batch={b}: rewrite differs from eager by {err:.3g}")
            eager_ms = _median_ms(lambda x: model(x), ids)
            rewrite_ms = _median_ms(lambda x: compiled(x), ids)
            rows.append((b, eager_ms, rewrite_ms, err))
    recompiles = torch._dynamo.utils.counters["stats"]["unique_graphs"] - frames_before
    print(f"{'batch':>5}  {'eager ms':>9}  {'rewrite ms':>10}  {'speed-up':>8}  {'max |diff|':>10}")
    for b, e, r, err in rows:
        print(f"{b:>5}  {e:>9.2f}  {r:>10.2f}  {e / r:>7.2f}x  {err:>10.2e}")
    print(f"\nrecompiles after the first call: {recompiles}")
