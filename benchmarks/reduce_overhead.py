"""reduce-overhead and static kernels against eager and Inductor's own gears, per batch gear.

    .venv/bin/python benchmarks/reduce_overhead.py [--models minilm gpt2 tiny] [--repeat 30] [--threads N]
                                                   [--no-subprocess]

Models: MiniLM (all-MiniLM-L6-v2, real weights) and GPT-2 (rewrite.models' small config) at sequence
32, and ``tiny``, an overhead-bound stack of 24 blocks of small ops (216 ops on [batch, 16]; run with
float32 denormals flushed for every contender, see ``flush_denormals``); batch
gears [1, 2, 4, 8, 16]. Contenders, each compiled through its own code object so Dynamo's caches do
not interfere, all timed in one process with interleaved rounds (paired medians):

* ``eager``;
* ``inductor``: Inductor with PyTorch's own gears, ``mark_dynamic(x, 0, specialize_on=[...])``;
* ``inductor frz+cpp``: the same with ``freezing=True`` and ``cpp_wrapper=True``;
* ``inductor dynamic``: one dynamic graph, ``torch.compile(dynamic=True)`` (Dynamo still makes batch 1 a
  static graph of its own); ``inductor dyn frz+cpp``: the same with freezing and cpp_wrapper (issue 44's
  question: do gears beat one dynamic graph of Inductor's);
* ``rewrite``: ``set_dim_gears`` with the default mode (max-autotune, ATen kernels);
* ``rewrite ro``: ``mode="reduce-overhead"`` (execution plan per gear);
* ``rewrite ro+sk``: reduce-overhead with static kernels.

All rewrite contenders freeze weights (``experimental_config.frozen_parameter``), as Inductor's
freezing does. A specialize_on contender that crashes at a size is recorded as failed there and
replaced, for that size, by Inductor's static compile of the same options (``dynamic=False``),
marked ``*``. The first call of every contender is at batch 1, as a server's first request often is
(in torch 2.13 specialize_on then fails on MiniLM with an InternalTorchDynamoError at that size).

Every contender gets ``exec.tier_up_calls + 2`` warm-up calls per gear before timing, so the
default mode has tiered up (see docs/tier_up.md). Compile time is the sum over gears of (first call
at that gear - its steady latency) plus (slowest warm-up call - steady latency): the tier-up's
build for ``rewrite``, about nothing for the others. In fresh
processes (skipped with ``--no-subprocess``): the time from model construction to the first result
of every gear for ``rewrite ro+sk`` with an empty build folder (cold) and with the artifact the cold
run built (warm), and the peak memory (RSS above the process after loading the model) of compiling
and running one gear (the largest) against all five gears.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from _results import cold_caches, machine_line, markdown_table, record_section, save_plot  # noqa: E402

import rewrite  # noqa: E402
from rewrite import models  # noqa: E402
from rewrite.demo import with_own_code  # noqa: E402

GEARS = [1, 2, 4, 8, 16]
FIRST = 1
SEQ = 32
# Warm-up calls per gear before timing: the default mode tiers a gear up after exec.tier_up_calls.
WARMUP = rewrite.CompilerConfig().exec.tier_up_calls + 2
CONTENDERS = ["eager", "inductor", "inductor frz+cpp", "inductor dynamic", "inductor dyn frz+cpp", "rewrite",
              "rewrite ro", "rewrite ro+sk"]
INDUCTOR_OPTIONS = {"inductor": {}, "inductor frz+cpp": {"freezing": True, "cpp_wrapper": True},
                    "inductor dynamic": {}, "inductor dyn frz+cpp": {"freezing": True, "cpp_wrapper": True}}
DYNAMIC = ("inductor dynamic", "inductor dyn frz+cpp")  # dynamic=True instead of PyTorch's gears
GEARS_VS_DYNAMIC = 0.95  # issue 44: every gear at or below 0.95x of Inductor dynamic=True


class TinyBlock(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.ln = torch.nn.LayerNorm(width)
        self.fc = torch.nn.Linear(width, width)

    def forward(self, x):
        y = self.fc(self.ln(x))
        y = torch.nn.functional.gelu(y, approximate="tanh") * torch.sigmoid(y) + y * 0.5
        return x + y.clamp(-3, 3)


class Tiny(torch.nn.Module):
    """Overhead-bound: 24 blocks of layer norm, a 16x16 linear and six pointwise ops (216 ops)."""

    def __init__(self, width: int = 16, depth: int = 24):
        super().__init__()
        self.blocks = torch.nn.ModuleList(TinyBlock(width) for _ in range(depth))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def flush_denormals(name: str) -> None:
    """Flush float32 denormals for ``tiny`` (every contender alike), leave them for the others.

    Random inputs drive tiny's sigmoid/GELU tails into denormals at some batch sizes (batch 2: eager
    216 ms with them, 5 ms flushed), and the CPU's slow path for them then swamps the per-op overhead
    this model is here to measure.
    """
    torch.set_flush_denormal(name == "tiny")


def build_model(name: str):
    if name == "tiny":
        with torch.random.fork_rng():
            torch.manual_seed(0)
            return Tiny().eval()
    return getattr(models, name)()


def make_input(name: str, batch: int) -> torch.Tensor:
    if name == "tiny":
        return torch.randn(batch, 16, generator=torch.Generator().manual_seed(batch))
    return models.token_batch(batch, SEQ, vocab=30522 if name == "minilm" else 512, seed=batch)


def output_of(name: str, out) -> torch.Tensor:
    return out if name == "tiny" else out.last_hidden_state


def rewrite_config(contender: str, build_dir: str | None) -> rewrite.CompilerConfig:
    config = rewrite.CompilerConfig()
    config.experimental_config.frozen_parameter = True
    if contender != "rewrite":
        config.mode = "reduce-overhead"
    if contender == "rewrite ro+sk":
        config.experimental_config.aclgraph._aclnn_static_shape_kernel = True
        config.experimental_config.aclgraph._aclnn_static_shape_kernel_build_dir = build_dir
    return config


class Contender:
    """One contender on one model: a callable per gear (a fallback may serve some gears)."""

    def __init__(self, name: str, model, model_name: str, build_dir: str):
        self.name, self.model, self.model_name = name, model, model_name
        self.failed: dict[int, str] = {}
        self.fallback: dict[int, object] = {}
        first = make_input(model_name, FIRST)
        if name == "eager":
            self.fn = model
            return
        tag = name.replace(" ", "_").replace("+", "_")
        if name in DYNAMIC:
            self.fn = torch.compile(with_own_code(model, tag), backend="inductor", options=INDUCTOR_OPTIONS[name],
                                    fullgraph=True, dynamic=True)
        elif name in INDUCTOR_OPTIONS:
            torch._dynamo.mark_dynamic(first, 0, specialize_on=[(lambda g: lambda s: s == g)(g) for g in GEARS])
            self.fn = torch.compile(with_own_code(model, tag), backend="inductor", options=INDUCTOR_OPTIONS[name],
                                    fullgraph=True)
        else:
            rewrite.inference.set_dim_gears(first, {0: GEARS})
            self.fn = torch.compile(with_own_code(model, tag), backend=rewrite.get_backend(rewrite_config(name, build_dir)),
                                    fullgraph=True)
        self.first = first

    def call(self, gear: int, x):
        fn = self.fallback.get(gear, self.fn)
        return fn(x)

    def static_fallback(self, gear: int, x):
        """Inductor's static compile of this size, for a size where specialize_on failed."""
        fn = torch.compile(with_own_code(self.model, f"static_{gear}_{id(self)}"), backend="inductor",
                           options=INDUCTOR_OPTIONS[self.name], fullgraph=True, dynamic=False)
        self.fallback[gear] = fn
        return fn(x)


def run_model(name: str, repeat: int, build_dir: str) -> dict:
    torch._dynamo.reset()
    flush_denormals(name)
    model = build_model(name)
    inputs = {g: make_input(name, g) for g in GEARS}
    with torch.no_grad():
        expected = {g: output_of(name, model(inputs[g])) for g in GEARS}
    contenders: dict = {}
    first_call: dict = {c: {} for c in CONTENDERS}
    with torch.no_grad():
        for c in CONTENDERS:
            # Made just before its first call: set_dim_gears turns a torch flag on until the geared graph
            # first runs, and Inductor compiling while it is on miscompiles MiniLM (an out-of-bounds abort).
            cont = contenders[c] = Contender(c, model, name, build_dir)
            for g in [FIRST] + [g for g in GEARS if g != FIRST]:
                print(f"  {c}: first call at batch {g}", flush=True)
                x = cont.first if (g == FIRST and c != "eager") else inputs[g]
                t0 = time.perf_counter()
                try:
                    cont.call(g, x)
                except Exception as e:  # noqa: BLE001 - a crash is a result: recorded, then the static fallback
                    cont.failed[g] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
                    print(f"  {c} failed at batch {g}: {cont.failed[g]}", flush=True)
                    if c not in INDUCTOR_OPTIONS:
                        raise
                    cont.static_fallback(g, inputs[g])  # an unmarked input: the marks caused the failure
                first_call[c][g] = time.perf_counter() - t0
                got = output_of(name, cont.call(g, inputs[g]))
                torch.testing.assert_close(got, expected[g], atol=1e-4, rtol=1e-4)
        samples = {(c, g): [] for c in CONTENDERS for g in GEARS}
        slowest_warm = {(c, g): 0.0 for c in CONTENDERS for g in GEARS}
        for g in GEARS:
            for _ in range(WARMUP):  # past the default mode's tier-up, whose cost is compile time
                for c, cont in contenders.items():
                    t0 = time.perf_counter()
                    cont.call(g, inputs[g])
                    slowest_warm[(c, g)] = max(slowest_warm[(c, g)], time.perf_counter() - t0)
            for _ in range(repeat):
                for c, cont in contenders.items():  # interleaved: noise hits every contender alike
                    t0 = time.perf_counter()
                    cont.call(g, inputs[g])
                    samples[(c, g)].append(time.perf_counter() - t0)
    latency = {k: statistics.median(v) for k, v in samples.items()}
    compile_s = {c: sum(max(0.0, first_call[c][g] - latency[(c, g)]) + max(0.0, slowest_warm[(c, g)] - latency[(c, g)])
                        for g in GEARS) for c in CONTENDERS}
    return {"latency": latency, "compile_s": compile_s, "failed": {c: contenders[c].failed for c in CONTENDERS},
            "static": {c: sorted(contenders[c].fallback) for c in CONTENDERS}}


# -- where the time of one call goes -----------------------------------------------------------------------

class _Capturing(rewrite.backend.RewriteBackend):
    """The rewrite backend, keeping the callable it built and the arguments it was last called with."""

    def compile_graph(self, *args, **kwargs):
        from torch._functorch.aot_autograd import make_boxed_func

        inner = super().compile_graph(*args, **kwargs).__rewrite_fn__

        def recording(*graph_args):
            self.args = graph_args
            return inner(*graph_args)

        self.inner = inner
        boxed = make_boxed_func(recording)
        boxed.__rewrite_fn__ = recording
        return boxed


def _floor_backends() -> dict:
    """Backends whose graph returns outputs computed once: what Dynamo, and Dynamo with AOTAutograd, cost alone."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    def dynamo_only(gm, example_inputs):
        outs = gm(*example_inputs)
        return lambda *args: outs

    def fw(gm, example_inputs):
        outs = gm(*example_inputs)
        return make_boxed_func(lambda *args: outs)

    return {"Dynamo alone (graph returns cached outputs)": dynamo_only,
            "Dynamo + AOTAutograd (same)": aot_autograd(fw_compiler=fw, inference_compiler=fw,
                                                        keep_inference_input_mutations=True)}


def breakdown(name: str, gear: int, repeat: int) -> str:
    """Median per-call time of each layer at one static shape, all timed in interleaved rounds."""
    torch._dynamo.reset()
    flush_denormals(name)
    model = build_model(name)
    x = make_input(name, gear)
    calls = {"eager": lambda: model(x)}
    with torch.no_grad():
        for k, (label, be) in enumerate(_floor_backends().items()):
            fn = torch.compile(with_own_code(model, f"floor{k}"), backend=be, fullgraph=True, dynamic=False)
            calls[label] = (lambda fn=fn: fn(x))
        with tempfile.TemporaryDirectory(prefix="rewrite-bench-") as build:
            for c in ("rewrite", "rewrite ro", "rewrite ro+sk"):
                backend = _Capturing(rewrite_config(c, build))
                fn = torch.compile(with_own_code(model, "bd_" + c.replace(" ", "_").replace("+", "")), backend=backend,
                                   fullgraph=True, dynamic=False)
                fn(x)
                calls[f"{c}: whole call"] = (lambda fn=fn: fn(x))
                calls[f"{c}: compiled graph alone"] = (lambda b=backend: b.inner(*b.args))
        samples = {k: [] for k in calls}
        for f in calls.values():
            f()
        for _ in range(repeat):
            for k, f in calls.items():
                t0 = time.perf_counter()
                f()
                samples[k].append(time.perf_counter() - t0)
    return markdown_table(["layer", "us per call"], [[k, f"{statistics.median(v) * 1e6:.0f}"]
                                                     for k, v in samples.items()])


# -- fresh processes: warm start and memory ------------------------------------------------------------

_CHILD = """
import json, os, resource, sys, time, torch
sys.path.insert(0, {here!r}); sys.path.insert(0, {root!r})
torch.set_num_threads({threads})
import reduce_overhead as bench, rewrite
name, contender, gears, build = {name!r}, {contender!r}, {gears!r}, {build!r}
bench.flush_denormals(name)
model = bench.build_model(name)
rss0 = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
t0 = time.perf_counter()
first = bench.make_input(name, gears[-1])
rewrite.inference.set_dim_gears(first, {{0: gears}})
backend = rewrite.get_backend(bench.rewrite_config(contender, build))
fn = torch.compile(model, backend=backend, fullgraph=True)
with torch.no_grad():
    fn(first)
    for g in gears:
        fn(bench.make_input(name, g))
seconds = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
built = backend.report.graphs[0].applied.get("static kernels built", 0)
print("RESULT", json.dumps({{"seconds": seconds, "peak_mb": (peak - rss0) / 2**20, "built": built}}))
"""


def child(name: str, contender: str, gears: list, build: str, threads: int) -> dict:
    code = _CHILD.format(here=HERE, root=os.path.dirname(HERE), name=name, contender=contender, gears=gears,
                         build=build, threads=threads)
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"child {name}/{contender}/{gears} failed:\n{done.stderr[-3000:]}")
    return json.loads(next(ln for ln in done.stdout.splitlines() if ln.startswith("RESULT"))[7:])


def fresh_processes(name: str, threads: int) -> dict:
    out = {}
    with tempfile.TemporaryDirectory(prefix="rewrite-bench-") as build:
        out["cold"] = child(name, "rewrite ro+sk", GEARS, build, threads)
        out["warm"] = child(name, "rewrite ro+sk", GEARS, build, threads)
    for contender in ("rewrite ro", "rewrite ro+sk"):
        with tempfile.TemporaryDirectory(prefix="rewrite-bench-") as build:
            one = child(name, contender, GEARS[-1:], build, threads)
            every = child(name, contender, GEARS, build, threads)
        out[contender] = {"one": one["peak_mb"], "all": every["peak_mb"]}
    return out


# -- report ------------------------------------------------------------------------------------------------

def table(name: str, r: dict) -> str:
    headers = ["contender", "compile s (all gears)"] + [f"batch {g} ms" for g in GEARS]
    rows = []
    for c in CONTENDERS:
        cells = []
        for g in GEARS:
            ms = r["latency"][(c, g)] * 1e3
            mark = "*" if g in r["static"][c] else ""
            cells.append(f"{ms:.3f}{mark}" + (f" (failed: {r['failed'][c][g][:60]})" if g in r["failed"][c] else ""))
        rows.append([c, "-" if c == "eager" else f"{r['compile_s'][c]:.1f}"] + cells)
    return markdown_table(headers, rows)


def verdict(name: str, r: dict) -> list[str]:
    lines = []
    best_rw = {g: min(r["latency"][(c, g)] for c in ("rewrite", "rewrite ro", "rewrite ro+sk")) for g in GEARS}
    best_ind = {g: min(r["latency"][(c, g)] for c in INDUCTOR_OPTIONS if c not in DYNAMIC) for g in GEARS}
    ratios = [best_rw[g] / best_ind[g] for g in GEARS]
    target = 0.8 if name == "tiny" else 1.0
    met = [g for g, q in zip(GEARS, ratios) if q <= target]
    lines.append(f"- {name}: rewrite's best / Inductor's best per gear: "
                 + ", ".join(f"{g}: {q:.2f}x" for g, q in zip(GEARS, ratios))
                 + f" (target <= {target}x: met at {len(met)}/{len(GEARS)} gears)")
    dynamic = {g: min(r["latency"][(c, g)] for c in DYNAMIC) for g in GEARS}
    for ours, label in (("rewrite", "rewrite's gears (default mode)"), (None, "rewrite's best gears")):
        q = [(r["latency"][(ours, g)] if ours else best_rw[g]) / dynamic[g] for g in GEARS]
        met = [g for g, v in zip(GEARS, q) if v <= GEARS_VS_DYNAMIC]
        lines.append(f"- {name}: {label} / Inductor's best dynamic=True graph per gear: "
                     + ", ".join(f"{g}: {v:.2f}x" for g, v in zip(GEARS, q))
                     + f" (target <= {GEARS_VS_DYNAMIC}x: met at {len(met)}/{len(GEARS)} gears)")
    return lines


def plot(results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4), squeeze=False)
    for ax, (name, r) in zip(axes[0], results.items()):
        for c in CONTENDERS:
            ax.plot(GEARS, [r["latency"][(c, g)] * 1e3 for g in GEARS], marker="o", label=c)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch (gear)")
        ax.set_ylabel("ms per call (median)")
        ax.set_title(name)
        ax.legend(fontsize=7)
    fig.tight_layout()
    save_plot(fig, "reduce_overhead.png")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["minilm", "gpt2", "tiny"], choices=["minilm", "gpt2", "tiny"])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--no-subprocess", action="store_true", help="skip warm-start and memory measurements")
    parser.add_argument("--breakdown", nargs=2, metavar=("MODEL", "BATCH"), action="append", default=None,
                        help="also time each layer of one call (default: gpt2 1 and tiny 4)")
    opts = parser.parse_args()
    if opts.threads:
        torch.set_num_threads(opts.threads)
    cold_caches()  # honest compile times, Inductor's and the tier-up's
    torch._dynamo.config.cache_size_limit = 64
    load_before = os.getloadavg()
    results, extra = {}, {}
    with tempfile.TemporaryDirectory(prefix="rewrite-bench-") as build:
        for name in opts.models:
            print(f"[{name}] ...", flush=True)
            results[name] = run_model(name, opts.repeat, build)
            print(table(name, results[name]), flush=True)
    profiles = {}
    for model_name, batch in opts.breakdown or [("gpt2", "1"), ("tiny", "4")]:
        print(f"[{model_name}] breakdown at batch {batch} ...", flush=True)
        profiles[(model_name, int(batch))] = breakdown(model_name, int(batch), opts.repeat * 10)
    if not opts.no_subprocess:
        for name in opts.models:
            print(f"[{name}] fresh processes ...", flush=True)
            extra[name] = fresh_processes(name, torch.get_num_threads())
    plot(results)
    load_after = os.getloadavg()
    parts = []
    for name in opts.models:
        parts.append(f"### {name}, batch gears {GEARS}" + (f", sequence {SEQ}" if name != "tiny" else "")
                     + "\n\n" + table(name, results[name]))
        parts.append("\n".join(verdict(name, results[name])))
        if name in extra:
            e = extra[name]
            parts.append(
                f"Fresh processes (rewrite ro+sk, model built to every gear's first result): cold "
                f"{e['cold']['seconds']:.1f} s ({e['cold']['built']} kernels built), warm with the artifact "
                f"{e['warm']['seconds']:.1f} s ({e['warm']['built']} built). Peak memory above the loaded model, "
                f"one gear (16) vs all five: "
                + "; ".join(f"{c} {e[c]['one']:.0f} MB vs {e[c]['all']:.0f} MB ({e[c]['all'] / e[c]['one']:.2f}x)"
                            for c in ("rewrite ro", "rewrite ro+sk")) + " (target <= 1.3x).")
    for (model_name, batch), text in profiles.items():
        parts.append(f"### Where one call's time goes: {model_name}, batch {batch} (static shape)\n\n{text}")
    command = "python benchmarks/reduce_overhead.py " + " ".join(sys.argv[1:])
    body = (f"## reduce-overhead and static kernels (CPU)\n\n`{command.strip()}`\n\n{machine_line()}; load average "
            f"{load_before[0]:.1f} before, {load_after[0]:.1f} after. Median of {opts.repeat} interleaved calls per "
            f"gear after {WARMUP} warm-up calls; `*`: specialize_on failed at that size, Inductor's static compile of "
            f"the same options shown instead. `rewrite` is the default mode: by then each gear has tiered up to "
            f"planned memory and static kernels, and its compile time includes that tier-up. Compiles are cold "
            f"(Inductor's FX graph cache off, fresh C++ and static-kernel folders).\n\n" + "\n\n".join(parts) + "\n\n![reduce-overhead](reduce_overhead.png)")
    record_section("reduce_overhead", body)
    print(body)


if __name__ == "__main__":
    main()
