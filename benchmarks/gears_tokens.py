"""Gears on token traffic (issue 50): requests whose batch and sequence length both vary, as an encoder serving
sentences and a decoder's prefill see them. Run through ``benchmarks/gears.py``:

    python benchmarks/gears.py --traffic --traces sentences prefill [--requests 1200] [--contenders ...]
                                         [--threads N] [--quick]

Traces (a request is ``b`` rows padded to its longest row, right padding, as a tokenizer's ``padding=True`` does;
``input_ids`` and ``attention_mask``, the mask zero on the padding):

* ``sentences``: all-MiniLM-L6-v2 (real weights); ``b`` Zipf-distributed in 1..32 (P(b) ~ 1/b), each row's length
  log-normal (median 40 tokens, sigma 0.6) clipped to 8..256;
* ``prefill``: a GPT-2-architecture decoder (6 layers, hidden 384, 6 heads, vocabulary 8192, random weights: the
  size of MiniLM), ``b`` Zipf-distributed in 1..8, prompt lengths log-normal (median 64, sigma 0.6) in 16..256.

The first half of a trace is the recorded traffic (rewrite's gears are planned on its shapes by
``rewrite.gears.plan_gear_pairs``: at most 16 (batch, sequence) pairs, plus one that holds the largest request of
the trace), the second half is served. Contenders, in one process per
trace, each a code object of its own:

* ``eager``;
* ``inductor dynamic``: ``torch.compile(dynamic=True)``, Inductor's defaults;
* ``inductor dynamic frozen``: the same with ``freezing`` and ``cpp_wrapper`` (Inductor's best CPU inference setting);
* ``inductor mark_dynamic``: ``torch._dynamo.mark_dynamic(t, dim, min=, max=)`` on both dims of both inputs, defaults;
* ``openvino``: OpenVINO's ``torch.compile`` backend (``backend="openvino"``, ``dynamic=False``: one model per
  shape seen; see `build` for why not dynamic), its defaults but float32 (``INFERENCE_PRECISION_HINT``: it
  computes in bf16 by default on a CPU that has it);
* ``rewrite dynamic``: ``torch.compile(backend="rewrite", dynamic=True)``, rewrite's defaults (frozen weights);
* ``rewrite gears``: the planned gear pairs (``set_dim_gears(t, plan.dim_gears)`` on both inputs, ``"zip"``,
  ``gear_fallback="fit"``), rewrite's defaults otherwise;
* ``rewrite gears skip``: the same with ``padded_tokens="skip"`` (each request's rows run in groups cut to their own
  length: `rewrite.gears.regroup`), its pairs planned on the recorded requests' row groups (``group_shapes``).
  Outputs at the padding it skips hold 0 (every contender is checked at the real tokens only).

Each contender is built and then serves the recorded half three times: the first two passes hold its compiles
(and recompiles, rewrite's tier-up builds, OpenVINO's per-shape work), the third is
its steady state; ``compile s`` is the first two passes' wall time minus twice the third's. ``peak RSS MB``: the process's peak RSS over build and both passes minus the RSS before. Then every
contender's output is compared with eager's at every real token of 8 served requests, and the served half is run
with the contenders interleaved (chunks of `CHUNK` requests, the order rotating). Columns: requests/s, real
tokens/s, p50/p99 latency, padded work (rewrite gears: padded elements over elements run, from
``rewrite.stats``), splits, compile s, memory, Dynamo graphs.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import torch
from torch._dynamo.utils import counters

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import (cold_caches, latency_panel, machine_line, markdown_table, record_section, rss_reset,  # noqa: E402
                      save_plot, status_kb)

import rewrite  # noqa: E402
from rewrite import models  # noqa: E402
from rewrite.demo import with_own_code  # noqa: E402

TOKEN_TRACES = {
    "sentences": dict(model="minilm", max_batch=32, median=40, lengths=(8, 256), vocab=30522),
    "prefill": dict(model="decoder", max_batch=8, median=64, lengths=(16, 256), vocab=8192),
}
TOKEN_CONTENDERS = ["eager", "inductor dynamic", "inductor dynamic frozen", "inductor mark_dynamic", "openvino",
                    "rewrite dynamic", "rewrite gears", "rewrite gears skip"]
REWRITE_GEARS = ["rewrite gears", "rewrite gears skip"]
# Each compiler at its defaults, and at its best inference setting (rewrite's defaults freeze inference weights)
AT_DEFAULTS = ["eager", "inductor dynamic", "inductor mark_dynamic", "openvino", "rewrite dynamic"]
AT_BEST = ["eager", "inductor dynamic frozen", "openvino", "rewrite dynamic"]
CHUNK = 25  # requests per contender turn in the interleaved serving
CHECKED = 8  # served requests compared with eager at every real token


def token_trace(name: str, n: int, seed: int = 0) -> list[list[int]]:
    """``n`` requests of trace ``name``: each the list of its rows' lengths (see the module's docstring)."""
    import numpy as np

    t = TOKEN_TRACES[name]
    rng = np.random.default_rng(seed)
    k = np.arange(1, t["max_batch"] + 1)
    p = 1.0 / k
    batches = rng.choice(k, size=n, p=p / p.sum())
    lo, hi = t["lengths"]
    out = []
    for b in batches:
        lengths = np.clip(np.rint(rng.lognormal(math.log(t["median"]), 0.6, size=int(b))), lo, hi)
        out.append([int(v) for v in lengths])
    return out


def shape(request: list[int]) -> tuple[int, int]:
    return len(request), max(request)


def make_request(lengths: list[int], vocab: int, seed: int) -> dict:
    """``input_ids`` and ``attention_mask`` for rows of these lengths, right-padded to the longest."""
    b, n = shape(lengths)
    ids = torch.randint(4, vocab, (b, n), generator=torch.Generator().manual_seed(seed))
    mask = (torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]).long()
    return {"input_ids": ids * mask, "attention_mask": mask}


def load(trace: str):
    if TOKEN_TRACES[trace]["model"] == "minilm":
        return models.minilm()
    from transformers import GPT2Config, GPT2Model

    cfg = GPT2Config(vocab_size=TOKEN_TRACES[trace]["vocab"], n_embd=384, n_layer=6, n_head=6, n_positions=512)
    torch.manual_seed(0)
    return GPT2Model(cfg).eval()


def build(contender: str, tag: str, model, first: dict, plan: dict, trace: str):
    """The contender's callable, its first call made on ``first`` (where its compile happens)."""
    call = with_own_code(model, tag)
    if contender == "eager":
        return model
    if contender == "inductor dynamic":
        return torch.compile(call, dynamic=True, fullgraph=True)
    if contender == "inductor dynamic frozen":
        return torch.compile(call, dynamic=True, fullgraph=True, options={"freezing": True, "cpp_wrapper": True})
    if contender == "inductor mark_dynamic":
        t = TOKEN_TRACES[trace]
        for x in first.values():
            torch._dynamo.mark_dynamic(x, 0, min=1, max=t["max_batch"])
            torch._dynamo.mark_dynamic(x, 1, min=t["lengths"][0], max=t["lengths"][1])
        return torch.compile(call, fullgraph=True)
    if contender == "openvino":
        import openvino.torch  # noqa: F401  (registers the backend)

        # dynamic=False: one OpenVINO model per shape seen. With Dynamo's automatic dynamic (or dynamic=True),
        # OpenVINO 2026.4 on torch 2.13 fails at the second shape ("AssertionError: Guard failed on the same
        # frame it was created ... name 'input1' is not defined").
        # f32: on a CPU with bf16 (AVX512_BF16, AMX) OpenVINO's default precision is bf16, which moves MiniLM's
        # outputs by 2e-2; every contender here computes in float32.
        return torch.compile(call, backend="openvino", dynamic=False,
                             options={"config": {"INFERENCE_PRECISION_HINT": "f32"}})
    if contender == "rewrite dynamic":
        return torch.compile(call, backend="rewrite", dynamic=True, fullgraph=True)
    if contender in REWRITE_GEARS:
        plan = plan["skip"] if contender == "rewrite gears skip" else plan
        config = rewrite.CompilerConfig(**{"inference_config.dynamic_gears_merge_policy": plan.get("policy", "product"),
                                           "inference_config.gear_fallback": "fit"})
        if contender == "rewrite gears skip":
            config.inference_config.padded_tokens = "skip"
        for x in first.values():
            rewrite.inference.set_dim_gears(x, {0: plan["batch"], 1: plan["sequence"]})
        return torch.compile(call, backend=rewrite.get_backend(config), fullgraph=True)
    raise ValueError(contender)


def warm_the_process() -> None:
    """One toy compile with rewrite, Inductor and OpenVINO (where installed), so a process's one-time costs
    (imports, the e-graph engine, the C++ toolchain's first run) land on no contender's compile time or memory."""
    toy = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    backends = [rewrite.get_backend(), "inductor"]
    try:
        import openvino.torch  # noqa: F401

        backends.append("openvino")
    except ImportError:
        pass
    with torch.no_grad():
        for backend in backends:
            fn = torch.compile(with_own_code(toy, "warm"), backend=backend)
            for _ in range(rewrite.CompilerConfig().exec.tier_up_calls + 2):
                fn(x)
    torch._dynamo.reset()


def _pass(fn, requests) -> float:
    t0 = time.perf_counter()
    for x in requests:
        fn(**x)
    return time.perf_counter() - t0


def serve(spec: dict) -> None:
    """Build, warm and check every contender of ``spec``, then serve the second half interleaved (one process).
    Prints one ``ROW`` JSON line per contender."""
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    cold_caches()
    torch._inductor.config.fx_graph_cache = False
    # OpenVINO compiles a graph per shape seen: hundreds, and none may fall back to eager at a limit
    torch._dynamo.config.cache_size_limit = 10**5
    if hasattr(torch._dynamo.config, "recompile_limit"):
        torch._dynamo.config.recompile_limit = 10**5
    trace, contenders, plan = spec["trace"], spec["contenders"], spec["plan"]
    vocab = TOKEN_TRACES[trace]["vocab"]
    model = load(trace)
    recorded = [make_request(r, vocab, seed=i) for i, r in enumerate(spec["recorded"])]
    served = [make_request(r, vocab, seed=10**6 + i) for i, r in enumerate(spec["serve"])]
    with torch.no_grad():
        refs = [model(**x).last_hidden_state for x in served[:CHECKED]]
    warm_the_process()
    fns, built = {}, {}
    for k, c in enumerate(contenders):
        first = {key: t.clone() for key, t in recorded[0].items()}
        if c in REWRITE_GEARS:  # gears are traced at the largest gear: a full request of that shape
            gears = plan["skip"] if c == "rewrite gears skip" else plan
            first = make_request([gears["sequence"][-1]] * gears["batch"][-1], vocab, seed=-1 % 2**31)
        rss0 = rss_reset()
        graphs0 = counters["stats"]["unique_graphs"]
        with torch.no_grad():
            t0 = time.perf_counter()
            fns[c] = fn = build(c, str(k), model, first, plan, trace)
            fn(**first)
            _pass(fn, recorded)
            _pass(fn, recorded)
            warm_s = time.perf_counter() - t0
            steady = _pass(fn, recorded)  # every gear the recorded half reaches is hot by now
            for x, want in zip(served, refs):
                got = fn(**x).last_hidden_state
                real = x["attention_mask"].bool()
                torch.testing.assert_close(got[real], want[real], rtol=1e-3, atol=1e-3,
                                           msg=lambda m: f"{c} differs from eager at a real token: {m}")
        peak = status_kb("VmHWM") * 1024 if rss0 is not None else None
        built[c] = dict(compile_s=0.0 if c == "eager" else max(0.0, warm_s - 2 * steady),
                        memory=None if rss0 is None else max(0, peak - rss0),
                        graphs=counters["stats"]["unique_graphs"] - graphs0)
        print(f"built {c}: {json.dumps(built[c])}", flush=True)
    before = {c: rewrite.stats(fns[c]) for c in contenders if c.startswith("rewrite")}
    latencies = {c: [] for c in contenders}
    with torch.no_grad():
        for j, at in enumerate(range(0, len(served), CHUNK)):
            chunk = served[at: at + CHUNK]
            for c in contenders[j % len(contenders):] + contenders[: j % len(contenders)]:
                fn = fns[c]
                for x in chunk:
                    t1 = time.perf_counter()
                    fn(**x)
                    latencies[c].append(time.perf_counter() - t1)
    elements = sum(math.prod(shape(r)) for r in spec["serve"])
    tokens = sum(sum(r) for r in spec["serve"])
    for c in contenders:
        lat = sorted(latencies[c])
        total = sum(lat)
        row = dict(contender=c, requests=len(lat), seconds=total, throughput=len(lat) / total,
                   tokens_per_s=tokens / total, p50=lat[len(lat) // 2], p99=lat[min(len(lat) - 1, int(0.99 * len(lat)))],
                   padded=None, splits=None, **built[c])
        if c in before:
            s, s0 = rewrite.stats(fns[c]), before[c]
            padded = s.padded_rows - s0.padded_rows
            row.update(padded=padded / (padded + elements), splits=s.splits - s0.splits, pads=s.pads - s0.pads,
                       skipped=(s.skipped_tokens - s0.skipped_tokens) / elements)
        print("ROW " + json.dumps(row), flush=True)


def run_trace(trace: str, n: int, contenders: list, threads, quick: bool) -> tuple[dict, dict]:
    """Plan on the first half of ``trace``'s requests and serve the second in a process of its own."""
    from rewrite.gears import plan_gear_axes, plan_gear_pairs
    from rewrite.gears import group_shapes

    requests = token_trace(trace, n)
    recorded, second = requests[: n // 2], requests[n // 2:]
    shapes = [shape(r) for r in recorded]
    budget = 4 if quick else 16
    grid = plan_gear_axes(shapes, max_gears=budget)
    plan = plan_gear_pairs(shapes, max_gears=budget)
    # the served half may reach further than the recorded one: one more pair covers every request
    top = max(max(len(r) for r in requests), plan.pairs[-1][0]), max(max(max(r) for r in requests), plan.pairs[-1][1])
    pairs = sorted(set(plan.pairs) | {top})
    gears = dict(batch=[b for b, _ in pairs], sequence=[s for _, s in pairs], policy="zip")
    print(f"[{trace}] planned on {len(recorded)} requests: {plan} (a grid of as many: {grid})", flush=True)
    # padded_tokens="skip" runs groups of rows cut to their own length: its gears are planned on those groups
    skip_plan = plan_gear_pairs(group_shapes(recorded), max_gears=budget)
    skip_pairs = sorted(set(skip_plan.pairs) | {top})
    gears["skip"] = dict(batch=[b for b, _ in skip_pairs], sequence=[s for _, s in skip_pairs], policy="zip")
    print(f"[{trace}] for skipped padding, planned on the recorded requests' row groups: {skip_plan}", flush=True)
    spec = dict(trace=trace, contenders=contenders, plan=gears, recorded=recorded, serve=second, threads=threads)
    cmd = [sys.executable, os.path.abspath(__file__), "--serve", json.dumps(spec)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    rows = {}
    for line in done.stdout.splitlines():
        if line.startswith("ROW "):
            row = json.loads(line[4:])
            rows[row["contender"]] = row
        elif line.startswith("built "):
            print("   ", line, flush=True)
    if done.returncode != 0 or set(rows) != set(contenders):
        raise RuntimeError(f"serving trace {trace} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}")
    return dict(plan=plan, grid=grid, gears=gears, skip_plan=skip_plan, requests=n), rows


def report(results: dict, contenders: list) -> str:
    parts = [f"Contenders in one process per trace, served interleaved in chunks of {CHUNK} requests; the first half "
             "of each trace is recorded (gears planned on it, every contender warmed on it), the second served. "
             "Compile s: the first two passes over the recorded half (rewrite's tier-up builds included) minus twice "
             "the third. Padded: padded elements over elements run; skipped: padded positions not computed, over "
             "the served requests' elements (rewrite's ledger)."]
    for trace, (info, rows) in results.items():
        g = info["gears"]
        parts.append(f"### {trace} trace ({info['requests']} requests)\n\nplanned: {info['plan']}; served with the "
                     f"pairs {list(zip(g['batch'], g['sequence']))} (\"zip\"). A grid of as many gears "
                     f"(`plan_gear_axes`) would pad {info['grid'].expected_waste:.1%} of the predicted work. "
                     f"rewrite gears skip (`padded_tokens=\"skip\"`): planned on the recorded requests' row groups "
                     f"(`rewrite.gears.group_shapes`): {info['skip_plan']}; served with the pairs "
                     f"{list(zip(g['skip']['batch'], g['skip']['sequence']))}")
        headers = ["contender", "req/s", "tokens/s", "p50 ms", "p99 ms", "padded", "skipped", "splits", "compile s",
                   "peak RSS MB", "Dynamo graphs"]
        table = [[c, f"{r['throughput']:.1f}", f"{r['tokens_per_s']:.0f}", f"{r['p50'] * 1e3:.1f}",
                  f"{r['p99'] * 1e3:.1f}", "-" if r["padded"] is None else f"{r['padded']:.1%}",
                  f"{r['skipped']:.1%}" if r.get("skipped") else "-", "-" if r["splits"] is None else r["splits"], "-" if c == "eager" else f"{r['compile_s']:.1f}",
                  "-" if r["memory"] is None else f"{r['memory'] / 2**20:.0f}", r["graphs"]]
                 for c in contenders if (r := rows.get(c))]
        parts.append(markdown_table(headers, table))
        parts.append(verdict(rows))
    return "\n\n".join(parts)


def verdict(rows: dict) -> str:
    """The issue's target: rewrite's gears at >= 1.15x the throughput of the best other contender, at defaults and
    at every compiler's best setting, with p99 no worse than that contender's."""
    lines = []
    for name in REWRITE_GEARS:
        ours = rows.get(name)
        if ours is not None:
            lines += _verdict_of(ours, rows)
    return "\n".join(lines)


def _verdict_of(ours: dict, rows: dict) -> list:
    lines = []
    for label, group in (("at defaults", AT_DEFAULTS), ("at best settings", AT_BEST)):
        others = [rows[c] for c in group if c in rows]
        if not others:
            continue
        best = max(others, key=lambda r: r["throughput"])
        lines.append(f"- {label}: {ours['contender']} {ours['throughput'] / best['throughput']:.2f}x the throughput of "
                     f"{best['contender']} (target >= 1.15), p99 {ours['p99'] / best['p99']:.2f}x of its (target <= 1), "
                     f"compile {ours['compile_s']:.0f} s vs {best['compile_s']:.0f} s")
    return lines


def plot(results: dict, contenders: list):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 2, figsize=(13, 3.8 * len(results)), squeeze=False)
    for row, (trace, (info, rows)) in enumerate(results.items()):
        names = [c for c in contenders if c in rows]
        xs = range(len(names))
        labels = [c.replace(" ", "\n") for c in names]
        ax = axes[row][0]
        ax.bar(xs, [rows[c]["throughput"] for c in names], color=["tab:green" if c in REWRITE_GEARS else "tab:blue"
                                                                  for c in names])
        ax.set_xticks(list(xs), labels, fontsize=7)
        ax.set_ylabel("requests / s")
        ax.set_title(f"{trace}: throughput")
        latency_panel(axes[row][1], rows, names, labels, trace)
    fig.tight_layout()
    return fig


def token_traffic_main(traces: list, n: int | None, contenders: list, threads, quick: bool, command: str) -> None:
    n = n or (24 if quick else 1200)
    contenders = [c for c in TOKEN_CONTENDERS if c in contenders]
    results = {}
    for trace in traces:
        results[trace] = run_trace(trace, n, contenders, threads, quick)
        text = report(results, contenders)
        print(text, flush=True)
        if quick:
            print("(--quick: not recorded; its timings mean nothing)")
            continue
        fig = plot(results, contenders)
        print("plot:", save_plot(fig, "gears_traffic_tokens.png"))
        record_section("gears_traffic_tokens", f"## Gears on token traffic (batch x sequence)\n\n`{command}`\n\n"
                                               f"{machine_line()}\n\n{text}\n\n![gears on token traffic]"
                                               "(gears_traffic_tokens.png)")


if __name__ == "__main__" and "--serve" in sys.argv:
    serve(json.loads(sys.argv[sys.argv.index("--serve") + 1]))
