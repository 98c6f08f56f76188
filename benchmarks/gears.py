"""Gear vs dynamic: one static graph per gear against one dynamic graph, on MiniLM and GPT-2.

    python benchmarks/gears.py [--models gpt2 minilm] [--scenarios batch seq] [--repeat 10] [--threads N]

Scenarios: batch gears [1, 2, 4, 8, 16] at sequence 32, and sequence gears [8, 16, 32, 64] at
batch 4. Contenders, all in one process, each starting from ``torch._dynamo.reset()``:

* ``eager``;
* ``inductor dynamic``: ``torch.compile(dynamic=True)`` (Dynamo still specializes size 1);
* ``inductor static``: ``torch.compile(dynamic=False)``, recompiling at every new shape;
* ``rewrite symbolic``: the rewrite backend on the symbolic graph, no gears (aten kernels);
* ``rewrite gears``: ``set_dim_gears`` + the rewrite backend, one static graph per gear (aten kernels);
* ``rewrite gears+inductor``: the same with ``config.exec.kernels = "inductor"``.

Compile time is the summed wall time of every call that compiled (its first call at a shape that
triggered a compile), minus that shape's steady latency; recompiles count Dynamo graphs beyond
the first. Inductor's on-disk cache is off so compile times are honest. Latency is the best of
``--repeat`` calls after warm-up (the machine is shared: noise only adds time); every contender's
output is checked against eager first.

Traffic run (``--traffic``): the question a serving user asks, "gears or dynamic?", on a stream of
requests whose batch sizes follow a skewed distribution: see `TRAFFIC_DOC` below, or
``python benchmarks/gears.py --traffic --help``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

import torch
from torch._dynamo.utils import counters

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import (OUT_DIR, cold_caches, latency_panel, machine_line, markdown_table, record_section,  # noqa: E402
                      rss_reset, save_plot, status_kb)

import rewrite  # noqa: E402
from rewrite import models  # noqa: E402
from rewrite.demo import with_own_code  # noqa: E402
from gears_tokens import TOKEN_CONTENDERS, token_traffic_main, warm_the_process  # noqa: E402

SCENARIOS = {
    "batch": dict(dim=0, gears=[1, 2, 4, 8, 16], fixed=32, label="batch (seq 32)"),
    "seq": dict(dim=1, gears=[8, 16, 32, 64], fixed=4, label="sequence (batch 4)"),
}
CONTENDERS = ["eager", "inductor dynamic", "inductor static", "rewrite symbolic", "rewrite gears",
              "rewrite gears+inductor"]
VOCAB = {"minilm": 30522, "gpt2": 512}


def shape_of(scenario: dict, gear: int) -> tuple:
    return (gear, scenario["fixed"]) if scenario["dim"] == 0 else (scenario["fixed"], gear)


def hidden(out):
    return out.last_hidden_state


def build(contender: str, model, first: torch.Tensor, scenario: dict):
    """The callable for a contender; gears are declared on ``first`` (the first call's input)."""
    dim, gears = scenario["dim"], scenario["gears"]
    if contender == "eager":
        return model
    if contender == "inductor dynamic":
        return torch.compile(model, backend="inductor", fullgraph=True, dynamic=True)
    if contender == "inductor static":
        return torch.compile(model, backend="inductor", fullgraph=True, dynamic=False)
    config = rewrite.CompilerConfig()
    if contender == "rewrite symbolic":
        # One symbolic graph for the dim, without Dynamo's 0/1 specialization (as set_dim_gears does).
        torch.fx.experimental._config.backed_size_oblivious = True
        torch._dynamo.mark_dynamic(first, dim)
    else:
        if contender == "rewrite gears+inductor":
            config.exec.kernels = "inductor"
        rewrite.inference.set_dim_gears(first, {dim: gears})
    return torch.compile(model, backend=rewrite.get_backend(config), fullgraph=True)


def best_of(fn, x, repeat: int) -> float:
    """Fastest of ``repeat`` calls after two warm-up calls: on a shared machine noise only adds time."""
    fn(x)
    fn(x)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(x)
        best = min(best, time.perf_counter() - t0)
    return best


def run_contender(contender, model, name, scenario, repeat):
    torch._dynamo.reset()
    torch.fx.experimental._config.backed_size_oblivious = False
    vocab = VOCAB[name]
    inputs = {g: models.token_batch(*shape_of(scenario, g), vocab=vocab, seed=g) for g in scenario["gears"]}
    order = [scenario["gears"][len(scenario["gears"]) // 2]] + scenario["gears"]  # first call: a middle gear
    fn = build(contender, model, inputs[order[0]], scenario)
    counters.clear()
    compile_s, latency, first_call = 0.0, {}, {}
    with torch.no_grad():
        for g in order:
            if g in first_call:
                continue
            before = counters["stats"]["unique_graphs"]
            t0 = time.perf_counter()
            out = fn(inputs[g])
            first_call[g] = (time.perf_counter() - t0, counters["stats"]["unique_graphs"] > before)
            torch.testing.assert_close(hidden(out), hidden(model(inputs[g])), rtol=2e-4, atol=2e-4)
        for g in scenario["gears"]:
            latency[g] = best_of(fn, inputs[g], repeat)
    for g, (seconds, compiled) in first_call.items():
        if compiled:
            compile_s += max(0.0, seconds - latency[g])
    graphs = counters["stats"]["unique_graphs"]
    torch.fx.experimental._config.backed_size_oblivious = False
    return dict(compile_s=compile_s, latency=latency, recompiles=max(0, graphs - 1) if contender != "eager" else 0)


def main():
    if "--traffic-serve" in sys.argv:  # one trace of the traffic run, in a process of its own
        return traffic_serve(json.loads(sys.argv[sys.argv.index("--traffic-serve") + 1]))
    if "--traffic" in sys.argv:
        return traffic_main()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traffic", action="store_true", help="the traffic run (see --traffic --help)")
    parser.add_argument("--models", nargs="+", default=["gpt2", "minilm"], choices=["minilm", "gpt2"])
    parser.add_argument("--scenarios", nargs="+", default=["batch", "seq"], choices=list(SCENARIOS))
    parser.add_argument("--contenders", nargs="+", default=CONTENDERS, choices=CONTENDERS)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's); 1 is steadier on a crowded machine")
    opts = parser.parse_args()
    if opts.threads:
        torch.set_num_threads(opts.threads)
    torch._inductor.config.fx_graph_cache = False
    torch._dynamo.config.cache_size_limit = 64
    results = {}  # (model, scenario, contender) -> dict
    done = []  # (model, scenario) measured so far; figures are recorded after each, so a long run keeps them
    for name in opts.models:
        model = getattr(models, name)()
        for sc in opts.scenarios:
            for contender in opts.contenders:
                print(f"[{name} / {sc}] {contender} ...", flush=True)
                results[(name, sc, contender)] = run_contender(contender, model, name, SCENARIOS[sc], opts.repeat)
            done.append((name, sc))
            text = report(results, done, opts.contenders)
            print(text, flush=True)
            plot(results, done, opts.contenders)
            command = "python benchmarks/gears.py " + " ".join(sys.argv[1:])
            load = "load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())
            record_section("gears", f"## Gear vs dynamic\n\n`{command.strip()}`\n\n{machine_line()}; {load} "
                                    f"at the end (latency is best-of-{opts.repeat}; a loaded machine still adds "
                                    f"noise)\n\n{text}\n\n![gears](gears.png)")


def report(results, done, contenders) -> str:
    parts = []
    for name, sc in done:
        gears = SCENARIOS[sc]["gears"]
        headers = ["contender", "compile s", "recompiles"] + [f"{g} ms" for g in gears]
        rows = []
        for c in contenders:
            r = results[(name, sc, c)]
            rows.append([c, "-" if c == "eager" else f"{r['compile_s']:.1f}", r["recompiles"]]
                        + [f"{r['latency'][g] * 1e3:.2f}" for g in gears])
        parts.append(f"### {name}, {SCENARIOS[sc]['label']} gears {gears}\n\n" + markdown_table(headers, rows))
        parts.append(verdict(results, name, sc))
    return "\n\n".join(p for p in parts if p)


def verdict(results, name, sc) -> str:
    """The issue's targets, checked against what was measured."""
    dyn = results.get((name, sc, "inductor dynamic"))
    if dyn is None:
        return ""
    lines = []
    for c in ("rewrite gears", "rewrite gears+inductor"):
        r = results.get((name, sc, c))
        if r is None:
            continue
        faster = [g for g in SCENARIOS[sc]["gears"] if r["latency"][g] < dyn["latency"][g]]
        ratio = r["compile_s"] / dyn["compile_s"] if dyn["compile_s"] else float("nan")
        lines.append(f"- {c}: faster than inductor dynamic at {len(faster)}/{len(SCENARIOS[sc]['gears'])} shapes "
                     f"{faster}; recompiles {r['recompiles']}; compile time {ratio:.2f}x inductor dynamic's "
                     f"(target <= 2x)")
    return "\n".join(lines)


def plot(results, combos, contenders):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(combos), 2, figsize=(12, 3.6 * len(combos)), squeeze=False)
    for row, (name, sc) in enumerate(combos):
        gears = SCENARIOS[sc]["gears"]
        ax = axes[row][0]
        for c in contenders:
            r = results[(name, sc, c)]
            ax.plot(gears, [r["latency"][g] * 1e3 for g in gears], marker="o", label=c)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(SCENARIOS[sc]["label"].split(" (")[0])
        ax.set_ylabel("latency ms")
        ax.set_title(f"{name}: latency per shape")
        ax.legend(fontsize=7)
        ax = axes[row][1]
        compiled = [c for c in contenders if c != "eager"]
        ax.bar(range(len(compiled)), [results[(name, sc, c)]["compile_s"] for c in compiled])
        ax.set_xticks(range(len(compiled)), [c.replace(" ", "\n", 1) for c in compiled], fontsize=7)
        ax.set_ylabel("total compile s")
        ax.set_title(f"{name}: compile time, all shapes")
    fig.tight_layout()
    print("plot:", save_plot(fig, "gears.png"))



# -- the traffic run ----------------------------------------------------------------------------------------------

TRAFFIC_DOC = """Gears vs dynamic for a serving user: a model served over a stream of requests.

    python benchmarks/gears.py --traffic [--quick] [--traces zipf recorded sentences prefill] [--model minilm] [--seq 16]
                               [--requests 4000] [--max-batch 64] [--contenders ...] [--threads N]

The traces ``sentences`` and ``prefill`` are batch x sequence traffic (an encoder serving sentences, a decoder's
prefill), run by benchmarks/gears_tokens.py (its docstring says how). On the traces ``zipf`` and ``recorded``,
each request is one batch of ``--seq`` tokens; its batch size comes from the trace:

* ``zipf``: sizes 1..max-batch drawn independently with P(k) proportional to 1/k (Zipf, exponent 1):
  a fifth of the requests are batch 1, few are large;
* ``recorded``: what a dynamic batcher logs over one day: one batch per window, its size the number of
  requests that arrived in the window (Poisson), at a rate that follows a daily curve (a mean batch of 2
  at night, 36 at the peak, raised cosine), and bursts (3% of windows, 20 windows each) in which a
  backlog drains at the maximum batch; every batch has at least one request.

The first half of a trace is the traffic the user recorded; the second half is served. Planning: the
model is compiled with rewrite and ``dynamic=True`` and run over the first half inside
``rewrite.gears.recording()``; then the static gears' own latency is measured on a power-of-two ladder up to the
largest recorded size (rewrite with those gears, each past its tier-up; `measure_latency`, median of 5; the
planner interpolates between), and ``plan_gears(rec, latency=..., max_gears=16)`` picks the gears that
minimise the expected latency with the whole budget (``--max-waste`` asks instead for the fewest gears whose
padded work is at most that share; a run with it is printed, not recorded). Contenders, all serving the second
half in one fresh process per trace (built one after another, then served interleaved: every chunk of 50
requests is served by each contender in turn, the order rotating, so the ratios are side by side and a slow
stretch of the machine falls on all alike):

* ``eager``: the model as it is (reference);
* ``planned gears``: rewrite with the planned gears, ``gear_fallback="fit"`` (a batch that is no gear is padded up
  to one or split into several gears' calls, whichever their measured latency says is cheaper; past the largest
  gear it is split, where ``"pad"`` ran the dynamic graph) and rewrite's defaults otherwise (frozen inference
  weights, tier-up);
* ``pow2 ladder``: the same with the gears 1, 2, 4, ... up to the largest size (what vLLM-style ladders capture);
* ``inductor dynamic``: ``torch.compile(dynamic=True)`` (one symbolic graph; Dynamo specializes batch 1);
* ``inductor dynamic frozen``: the same with ``freezing`` and ``cpp_wrapper`` (Inductor's best CPU inference setting);
* ``inductor per size``: ``torch.compile(dynamic=False)``, one compile per distinct batch size;
* ``openvino``: OpenVINO's ``torch.compile`` backend, one model per batch size, float32 (gears_tokens.build).

Each contender is built and then called ``exec.tier_up_calls + 2`` times at every distinct size of the
served half (compiles and tier-ups happen here, as at a server's start), and its output is checked against
eager's at each size. Columns: throughput (requests/s, and useful rows/s: requests over the sum of the
contender's own request latencies), p50/p99 latency of a request, padded rows (padded rows / rows run, over the
served requests), padded time (the share of the served half's time spent on padding, priced by the latency
measured at each size while recording: `plan_gears`' measure of work, in which a padded row of a small batch
costs more than one of a large batch), compile s (the build's wall time minus the steady latency of its calls:
compiles and tier-up), memory (the process's peak RSS while the contender was built and warmed, minus the RSS
just before: ``VmHWM`` reset through ``/proc/self/clear_refs``), and the number of Dynamo graphs it made.
``--quick`` runs a tiny model over a short trace, to check the run works: its timings mean nothing.
"""

TRAFFIC_CONTENDERS = ["eager", "planned gears", "pow2 ladder", "inductor dynamic", "inductor dynamic frozen",
                      "inductor per size", "openvino"]
TRAFFIC_TRACES = ["zipf", "recorded"]
TOKEN_TRACES = ["sentences", "prefill"]  # batch x sequence traffic: benchmarks/gears_tokens.py


def traffic_trace(name: str, n: int, max_batch: int, seed: int = 0) -> list[int]:
    """``n`` batch sizes in 1..max_batch (see TRAFFIC_DOC)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if name == "zipf":
        k = np.arange(1, max_batch + 1)
        p = 1.0 / k
        return [int(v) for v in rng.choice(k, size=n, p=p / p.sum())]
    if name == "recorded":
        t = np.arange(n)
        night, peak = 2.0 * max_batch / 64, 36.0 * max_batch / 64
        rate = night + (peak - night) * (1 - np.cos(2 * math.pi * t / n)) / 2
        sizes = rng.poisson(rate)
        burst = np.zeros(n, dtype=bool)
        for start in rng.choice(n, size=max(1, int(0.03 * n / 20)), replace=False):
            burst[start:start + 20] = True
        sizes[burst] = max_batch
        return [int(v) for v in np.clip(sizes, 1, max_batch)]
    raise ValueError(f"unknown trace {name!r}; choose from {TRAFFIC_TRACES}")


def _load(model_name: str):
    return getattr(models, model_name)()


def _vocab(model_name: str) -> int:
    return VOCAB.get(model_name, 512)


def _traffic_inputs(model_name: str, sizes, seq: int) -> dict:
    return {b: models.token_batch(b, seq, vocab=_vocab(model_name), seed=b) for b in sorted(set(sizes))}


def plan_from_recording(model_name: str, seq: int, first_half: list[int], quick: bool,
                        max_waste: float | None = None):
    """Record the first half through a dynamic=True rewrite compile; measure the static gears' latency on a
    power-of-two ladder (interpolated between); plan."""
    from rewrite.gears import measure_latency, plan_gears, power_of_two_ladder, recording

    torch._dynamo.reset()
    model = _load(model_name)
    fn = torch.compile(model, backend=rewrite.get_backend(), dynamic=True)
    inputs = _traffic_inputs(model_name, first_half, seq)
    t0 = time.perf_counter()
    with torch.no_grad():
        for b in sorted(inputs):  # compile (batch 1 and the symbolic graph) outside the recording
            fn(inputs[b])
        with recording() as rec:
            for b in first_half:
                fn(inputs[b])
        # What serves the plan is static gears, so the plan is priced by theirs (issue 50): the dynamic graph's
        # latency is another curve (Dynamo specializes batch 1, and its noise, made non-decreasing, priced batch 1
        # like 6, so a plan padded a fifth of the requests sixfold). A ladder of gears, each past its tier-up.
        torch._dynamo.reset()
        ladder = power_of_two_ladder(max(first_half))
        sized = _traffic_inputs(model_name, ladder, seq)
        geared = _build_contender("pow2 ladder", "ladder", model, ladder, sized[ladder[-1]])
        warm_calls = rewrite.CompilerConfig().exec.tier_up_calls + 2
        for b in reversed(ladder):  # the first call at the largest gear, the input the gears were set on
            for _ in range(warm_calls):
                geared(sized[b])
        latency = measure_latency(geared, sized.__getitem__, ladder, repeat=1 if quick else 5, warmup=1)
    record_s = time.perf_counter() - t0
    plan = plan_gears(rec, latency=latency, max_gears=16, max_waste=max_waste)
    torch._dynamo.reset()
    return rec, plan, record_s, latency


def _build_contender(contender: str, tag: str, model, gears, first_input):
    config = rewrite.CompilerConfig()
    call = with_own_code(model, tag)
    if contender == "eager":
        return model
    if contender in ("planned gears", "pow2 ladder"):
        config.inference_config.gear_fallback = "fit"
        fn = torch.compile(call, backend=rewrite.get_backend(config), fullgraph=True)
        rewrite.inference.set_dim_gears(first_input, {0: list(gears)})
        return fn
    if contender == "inductor dynamic":
        return torch.compile(call, backend="inductor", fullgraph=True, dynamic=True)
    if contender == "inductor dynamic frozen":  # Inductor's best CPU inference setting
        return torch.compile(call, backend="inductor", fullgraph=True, dynamic=True,
                             options={"freezing": True, "cpp_wrapper": True})
    if contender == "inductor per size":
        return torch.compile(call, backend="inductor", fullgraph=True, dynamic=False)
    if contender == "openvino":
        from gears_tokens import build as build_token_contender

        return build_token_contender("openvino", tag, model, {}, {}, "")
    raise ValueError(contender)


def traffic_serve(spec: dict) -> None:
    """Build every contender of ``spec`` in this process, one after another (compile s and memory are each
    one's own), then serve ``spec['serve']`` with all of them interleaved: the trace is cut into chunks of
    `CHUNK` requests and each chunk is served by every contender in turn, the order rotating from chunk to
    chunk, so a slow or fast stretch of the machine falls on all of them alike. Prints one JSON line per
    contender."""
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    cold_caches()
    torch._dynamo.config.cache_size_limit = 256
    if hasattr(torch._dynamo.config, "recompile_limit"):
        torch._dynamo.config.recompile_limit = 256
    serve, seq, contenders = spec["serve"], spec["seq"], spec["contenders"]
    model = _load(spec["model"])
    base = _traffic_inputs(spec["model"], serve, seq)
    with torch.no_grad():
        refs = {b: hidden(model(x)) for b, x in base.items()}
    warm_calls = rewrite.CompilerConfig().exec.tier_up_calls + 2
    order = sorted(base, reverse=True)  # the first call at the largest size (where gears trace)
    warm_the_process()
    fns, inputs, built = {}, {}, {}
    for k, (c, gears) in enumerate(contenders.items()):
        inputs[c] = {b: {key: t.clone() for key, t in x.items()} if isinstance(x, dict) else x.clone()
                     for b, x in base.items()}  # set_dim_gears marks tensors: each contender has its own
        first = inputs[c][order[0]]
        first = next(iter(first.values())) if isinstance(first, dict) else first
        rss0 = rss_reset()
        graphs0 = counters["stats"]["unique_graphs"]
        t0 = time.perf_counter()
        fns[c] = fn = _build_contender(c, str(k), model, gears, first)
        per_size = {}
        with torch.no_grad():
            for b in order:
                for _ in range(warm_calls):
                    t1 = time.perf_counter()
                    out = fn(inputs[c][b])
                    per_size.setdefault(b, []).append(time.perf_counter() - t1)
                torch.testing.assert_close(hidden(out), refs[b], rtol=2e-4, atol=2e-4)
        warm_s = time.perf_counter() - t0
        steady = sum(warm_calls * min(v) for v in per_size.values())
        peak = status_kb("VmHWM") * 1024 if rss0 is not None else None
        built[c] = dict(compile_s=0.0 if c == "eager" else max(0.0, warm_s - steady),
                        memory=None if rss0 is None else max(0, peak - rss0),
                        graphs=counters["stats"]["unique_graphs"] - graphs0)
        print(f"built {c}: {json.dumps(built[c])}", flush=True)
    latencies = {c: [] for c in contenders}
    names = list(contenders)
    with torch.no_grad():
        for j, at in enumerate(range(0, len(serve), CHUNK)):
            chunk = serve[at: at + CHUNK]
            for c in names[j % len(names):] + names[: j % len(names)]:
                fn, xs = fns[c], inputs[c]
                for b in chunk:
                    t1 = time.perf_counter()
                    fn(xs[b])
                    latencies[c].append(time.perf_counter() - t1)
    for c, gears in contenders.items():
        lat = latencies[c]
        total = sum(lat)
        run = [min(g for g in gears if g >= b) for b in serve] if gears else list(serve)
        lat_sorted = sorted(lat)
        row = dict(contender=c, gears=gears, requests=len(serve), seconds=total, throughput=len(serve) / total,
                   rows_per_s=sum(serve) / total, p50=lat_sorted[len(lat_sorted) // 2],
                   p99=lat_sorted[min(len(lat_sorted) - 1, int(0.99 * len(lat_sorted)))],
                   padded=(sum(run) - sum(serve)) / sum(run), **built[c])
        print("ROW " + json.dumps(row), flush=True)


CHUNK = 50  # requests per contender turn in the interleaved serving


def traffic_main():
    from rewrite.gears import power_of_two_ladder

    parser = argparse.ArgumentParser(description=TRAFFIC_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traffic", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a tiny model over a short trace: checks the run works")
    parser.add_argument("--traces", nargs="+", default=TRAFFIC_TRACES + TOKEN_TRACES,
                        choices=TRAFFIC_TRACES + TOKEN_TRACES)
    parser.add_argument("--model", default=None, choices=["minilm", "gpt2", "bert"])
    parser.add_argument("--seq", type=int, default=None)
    parser.add_argument("--requests", type=int, default=None, help="requests per trace (half planned, half served)")
    parser.add_argument("--max-batch", type=int, default=None)
    parser.add_argument("--contenders", nargs="+", default=TRAFFIC_CONTENDERS + TOKEN_CONTENDERS,
                        choices=sorted(set(TRAFFIC_CONTENDERS + TOKEN_CONTENDERS)),
                        help="each trace runs those of these it knows (the token traces: gears_tokens.TOKEN_CONTENDERS)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--max-waste", type=float, default=None,
                        help="plan the fewest gears whose padded work is at most this share (default: the whole "
                             "budget of 16, least expected latency); a run with it is not recorded")
    opts = parser.parse_args()
    quick = opts.quick
    model_name = opts.model or ("bert" if quick else "minilm")
    seq = opts.seq or (8 if quick else 16)
    n = opts.requests or (160 if quick else 4000)
    max_batch = opts.max_batch or (8 if quick else 64)
    if opts.threads:
        torch.set_num_threads(opts.threads)
    torch._inductor.config.fx_graph_cache = False
    tokens = [t for t in opts.traces if t in TOKEN_TRACES]
    if tokens:
        token_traffic_main(tokens, opts.requests, opts.contenders, opts.threads, quick,
                           ("python benchmarks/gears.py " + " ".join(sys.argv[1:])).strip())
    opts.contenders = [c for c in opts.contenders if c in TRAFFIC_CONTENDERS]
    results, done = {}, []
    for trace in (t for t in opts.traces if t in TRAFFIC_TRACES):
        sizes = traffic_trace(trace, n, max_batch, seed=0)
        first, second = sizes[: n // 2], sizes[n // 2:]
        print(f"[{trace}] recording {len(first)} requests through rewrite dynamic=True and planning ...", flush=True)
        rec, plan, record_s, latency = plan_from_recording(model_name, seq, first, quick, opts.max_waste)
        print(rec, flush=True)
        print(plan, flush=True)
        ladder = power_of_two_ladder(max(sizes))
        info = dict(plan=plan, ladder=ladder, record_s=record_s, first=first, second=second, latency=latency)
        contenders = {}
        for c in opts.contenders:
            gears = plan.gears if c == "planned gears" else ladder if c == "pow2 ladder" else None
            if gears is not None and max(gears) < max(second):
                gears = sorted(set(gears) | {max(second)})  # the served half reaches further than the planned one
            contenders[c] = gears
        spec = dict(contenders=contenders, model=model_name, seq=seq, serve=second, threads=opts.threads)
        print(f"[{trace}] serving with {', '.join(contenders)} interleaved ...", flush=True)
        rows = _serve_trace(spec)
        for c, r in rows.items():
            print(f"    {json.dumps({k: v for k, v in r.items() if k != 'gears'})}", flush=True)
        results[trace] = (info, rows)
        done.append(trace)
        text = traffic_report(results, done, opts.contenders, model_name, seq, n, max_batch)
        print(text, flush=True)
        unrecorded = quick or opts.max_waste is not None
        traffic_plot(results, done, opts.contenders, unrecorded)
        if unrecorded:
            print("(--quick or --max-waste: not recorded in RESULTS.md" + ("; its timings mean nothing)" if quick else ")"))
            continue
        command = "python benchmarks/gears.py " + " ".join(sys.argv[1:])
        record_section("gears_traffic", f"## Gears vs dynamic on traffic\n\n`{command.strip()}`\n\n{machine_line()}\n\n"
                                        f"{text}\n\n![gears on traffic](gears_traffic.png)")


def _serve_trace(spec: dict) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--traffic-serve", json.dumps(spec)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    rows = {}
    for line in done.stdout.splitlines():
        if line.startswith("ROW "):
            row = json.loads(line[4:])
            rows[row["contender"]] = row
    if done.returncode != 0 or set(rows) != set(spec["contenders"]):
        tail = (done.stdout + done.stderr)[-3000:]
        raise RuntimeError(f"serving the trace failed (exit {done.returncode}):\n{tail}")
    return rows


def traffic_report(results, done, contenders, model_name, seq, n, max_batch) -> str:
    parts = [f"{model_name}, sequence {seq}, {n} requests per trace (first half recorded and planned on, second "
             f"half served), batch 1..{max_batch}. Compile s: warm-up wall time minus its calls' steady latency "
             f"(compiles and tier-up). Memory: peak RSS while it was built and warmed, minus the RSS before. "
             f"Contenders in one process per trace, served interleaved in chunks of {CHUNK} requests."]
    for trace in done:
        info, rows = results[trace]
        plan = info["plan"]
        parts.append(f"### {trace} trace\n\nplanned gears {plan.gears} ({len(plan.gears)}; predicted waste "
                     f"{plan.expected_waste:.1%} of the time, {plan.padded_rows:.1%} of the rows on the recorded half; "
                     f"recording + latency measurement {info['record_s']:.1f} s); pow2 ladder {info['ladder']}")
        headers = ["contender", "gears", "req/s", "rows/s", "p50 ms", "p99 ms", "padded rows", "padded time",
                   "compile s", "peak RSS MB", "Dynamo graphs"]
        table = []
        for c in contenders:
            r = rows.get(c)
            if r is None:
                continue
            table.append([c, len(r["gears"]) if r["gears"] else "-", f"{r['throughput']:.1f}", f"{r['rows_per_s']:.0f}",
                          f"{r['p50'] * 1e3:.2f}", f"{r['p99'] * 1e3:.2f}", f"{r['padded']:.1%}",
                          _padded_time(info, r),
                          "-" if c == "eager" else f"{r['compile_s']:.1f}",
                          "-" if r["memory"] is None else f"{r['memory'] / 2**20:.0f}", r["graphs"]])
        parts.append(markdown_table(headers, table))
        parts.append(traffic_verdict(rows, info))
    return "\n\n".join(p for p in parts if p)


def _served_waste(info, row) -> float | None:
    """The share of the served half's time spent on padding with ``row``'s gears, priced by the latency measured
    at every size while recording (`plan_gears`' own measure of work: small batches cost more per row)."""
    from rewrite.gears import evaluate_gears

    if not row.get("gears"):
        return None
    if max(info["second"]) > max(info["latency"]):
        return None  # the served half reaches sizes the recorded half never measured: no price for them
    return evaluate_gears(info["second"], row["gears"], latency=info["latency"]).expected_waste


def _padded_time(info, row) -> str:
    waste = _served_waste(info, row)
    return "-" if waste is None else f"{waste:.1%}"


def traffic_verdict(rows, info) -> str:
    """The issue's target: planned gears beat the ladder in throughput and waste at most 10% of the work (time)
    where the ladder wastes more."""
    plan, ladder = rows.get("planned gears"), rows.get("pow2 ladder")
    if plan is None or ladder is None:
        return ""
    lines = [f"- planned gears vs pow2 ladder: {plan['throughput'] / ladder['throughput']:.2f}x the throughput "
             f"(target > 1), padded time {_served_waste(info, plan):.1%} vs {_served_waste(info, ladder):.1%} "
             f"(target <= 10% where the ladder wastes more), padded rows {plan['padded']:.1%} vs {ladder['padded']:.1%}"]
    for c in ("inductor dynamic", "inductor dynamic frozen", "inductor per size", "openvino"):
        r = rows.get(c)
        if r is not None:
            lines.append(f"- planned gears vs {c}: {plan['throughput'] / r['throughput']:.2f}x the throughput, "
                         f"p99 {plan['p99'] / r['p99']:.2f}x, compile {plan['compile_s']:.1f} s vs {r['compile_s']:.1f} s")
    return "\n".join(lines)


def traffic_plot(results, done, contenders, quick: bool = False):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(done), 4, figsize=(18, 3.8 * len(done)), squeeze=False)
    for row, trace in enumerate(done):
        info, rows = results[trace]
        ax = axes[row][0]
        sizes = info["second"]
        top = max(sizes)
        ax.hist(sizes, bins=range(1, top + 2), color="0.6", align="left")
        for g in info["plan"].gears:
            ax.axvline(g, color="tab:green", lw=1.2)
        for g in info["ladder"]:
            ax.axvline(g, color="tab:red", lw=1, ls="--")
        ax.set_xlabel("batch size (green: planned gears, red dashed: pow2 ladder)")
        ax.set_ylabel("requests")
        ax.set_title(f"{trace}: served traffic")
        names = [c for c in contenders if c in rows]
        xs = range(len(names))
        labels = [c.replace(" ", "\n", 1) for c in names]
        ax = axes[row][1]
        ax.bar(xs, [rows[c]["throughput"] for c in names], color="tab:blue")
        for x, c in zip(xs, names):
            if rows[c]["padded"]:
                ax.annotate(f"pad {rows[c]['padded']:.0%}", (x, rows[c]["throughput"]), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(list(xs), labels, fontsize=7)
        ax.set_ylabel("requests / s")
        ax.set_title(f"{trace}: throughput")
        latency_panel(axes[row][2], rows, names, labels, trace)
        ax = axes[row][3]
        compiled = [c for c in names if c != "eager"]
        ax.bar(range(len(compiled)), [rows[c]["compile_s"] for c in compiled], color="tab:orange")
        ax.set_xticks(range(len(compiled)), [c.replace(" ", "\n", 1) for c in compiled], fontsize=7)
        ax.set_ylabel("compile s (incl. tier-up)")
        ax.set_title(f"{trace}: compile time")
    fig.tight_layout()
    if quick:  # its timings mean nothing: kept out of the committed plots
        os.makedirs(OUT_DIR, exist_ok=True)
        path = os.path.join(OUT_DIR, "gears_traffic_quick.png")
        fig.savefig(path, dpi=110, bbox_inches="tight")
        print("plot:", path)
    else:
        print("plot:", save_plot(fig, "gears_traffic.png"))


if __name__ == "__main__":
    main()
