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
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch._dynamo.utils import counters

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import machine_line, markdown_table, record_section, save_plot  # noqa: E402

import rewrite  # noqa: E402
from rewrite import models  # noqa: E402

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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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


if __name__ == "__main__":
    main()
