"""Optimization time against graph size, and what the optimizer buys: a latency table on real models.

Part 1, optimize time: synthetic graphs of N nodes repeat a block with work for every family of
the optimizer (a common subexpression, a double negation, a multiplication by one, a view to the
same shape, a constant subexpression to fold, a dead branch of ops). Real models go through the
whole backend (``rewrite.explain``), so their times are those of the optimizer inside torch.compile.

Part 2, latency (``--latency``): frozen weights, paired medians in one run (the variants take turns
call by call), static shapes: eager, Inductor's default compile, Inductor with ``freezing=True``,
rewrite with its tier-up switched off (``exec.tier_up_calls = 0``: ATen code only), rewrite with
this issue's rule families switched off by name (`ISSUE_RULES`), rewrite's default. Every variant
is called ``tier_up_calls + 2`` times before timing, so rewrite's static CPU graphs have tiered up
(planned memory, static C kernels); the slowest of those warm-up calls is reported as the
tier-up's cost. Compiles are cold (`cold_caches`): Inductor's FX graph cache is off, and its C++
kernels and rewrite's static kernels are built into fresh folders.
Models: MiniLM (real weights), BERT-base and GPT-2 (base configs, random weights), a small GPT-2
(2 layers, 64 wide: overhead-bound), ViT (small config, 32x32 images); batch 1, 4, 16, seq 32.
The predicted speed-up of the rules (the calibrated cost model's rules-off / rules-on graph cost)
is printed beside the measured one.

    .venv/bin/python benchmarks/optimizer.py                    # 1k, 10k, 50k nodes + real models
    .venv/bin/python benchmarks/optimizer.py --sizes 1000,10000 --models bert
    .venv/bin/python benchmarks/optimizer.py --sizes "" --models "" --latency   # the latency table
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import time

import sympy
import torch

from _results import cold_caches, machine_line, markdown_table, record_section, save_plot

from rewrite import models
from rewrite.config import CompilerConfig
from rewrite.explain import explain
from rewrite.ir import Graph, TensorMeta
from rewrite.optimizer import optimize
from rewrite.report import GraphReport
from rewrite.unit import CompileUnit
from rewrite.rules import default_rulesets

aten = torch.ops.aten
STAGES = ("egraph.load", "egraph.saturate", "egraph.extract")


def synthetic(n_nodes: int) -> Graph:
    """A chain of blocks of 10 nodes each, ``n_nodes`` nodes in all."""
    g = Graph(f"synthetic_{n_nodes}")
    m = TensorMeta(torch.float32, (sympy.Integer(8), sympy.Integer(16)))
    h = g.placeholder("x", m)
    one = g.constant(torch.ones(8, 16))
    while len(g.nodes) < n_nodes:
        a = g.call(aten.relu.default, (h,), meta=m)
        b = g.call(aten.relu.default, (h,), meta=m)                 # CSE with a
        n1 = g.call(aten.neg.default, (a,), meta=m)
        n2 = g.call(aten.neg.default, (n1,), meta=m)                # neg(neg(a)) -> a
        s = g.call(aten.add.Tensor, (n2, b), meta=m)
        k = g.call(aten.mul.Tensor, (one, 3.0), meta=m)             # folds to a constant
        t = g.call(aten.mul.Tensor, (s, one), meta=m)               # * ones -> itself
        v = g.call(aten.view.default, (t, [8, 16]), meta=m)         # view to the same shape
        g.call(aten.exp.default, (v,), meta=m)                      # dead: nothing reads it
        h = g.call(aten.add.Tensor, (v, k), meta=m)
    g.set_output((h,))
    return g


def run_synthetic(n: int) -> dict:
    g = synthetic(n)
    report = GraphReport(g.name)
    t0 = time.perf_counter()
    out = optimize(g, CompileUnit.detached(g.name, CompilerConfig(), report))
    total = time.perf_counter() - t0
    row = {"graph": f"synthetic {n // 1000}k", "nodes": len(g.nodes), "ops_before": g.num_ops(),
           "ops_after": out.num_ops(), "total": total, "note": "; ".join(report.notes)}
    row.update({s: report.stage_seconds.get(s, 0.0) for s in STAGES})
    return row


def run_model(name: str) -> dict:
    model = getattr(models, name)()
    if name == "vit":
        args = (torch.randn(2, 3, 32, 32),)
    else:
        args = (models.token_batch(2, 16, vocab=30522 if name == "minilm" else 512),)
    config = CompilerConfig()
    config.experimental_config.frozen_parameter = True
    with torch.no_grad():
        report = explain(model, *args, config=config)
    g = report.graphs[0]
    optimize_time = sum(v for k, v in g.stage_seconds.items() if k not in ("import", "codegen"))
    row = {"graph": name, "nodes": sum(g.ops_before.values()), "ops_before": sum(g.ops_before.values()),
           "ops_after": sum(g.ops_after.values()), "total": optimize_time,
           "note": ", ".join(f"{k} x{v}" for k, v in sorted(g.applied.items()) if k in ("fold", "cse", "prune", "dedup"))}
    row.update({s: g.stage_seconds.get(s, 0.0) for s in STAGES})
    return row


# The rule families issue 18 added, switched off by name for the "rules off" column.
ISSUE_RULES = ["gemm", "fused", "algebra.identity_chains", "shape.fresh_copies", "shape.pointwise_reshapes"]
LATENCY_MODELS = {  # name -> (builder, input maker)
    "minilm": (models.minilm, lambda b: models.token_batch(b, 32, vocab=30522)),
    "bert-base": (lambda: models.bert(layers=12, hidden=768, heads=12, vocab=30522),
                  lambda b: models.token_batch(b, 32, vocab=30522)),
    "gpt2-base": (lambda: models.gpt2(layers=12, hidden=768, heads=12, vocab=50257),
                  lambda b: models.token_batch(b, 32, vocab=50257)),
    "gpt2-small": (models.gpt2, lambda b: models.token_batch(b, 32)),
    "vit": (models.vit, lambda b: torch.randn(b, 3, 32, 32, generator=torch.Generator().manual_seed(0))),
}
VARIANTS = ("eager", "inductor", "inductor-freezing", "rewrite-no-tier-up", "rewrite-rules-off", "rewrite")
WARMUP = CompilerConfig().exec.tier_up_calls + 2  # calls before timing: the default config has tiered up


def _compiled(model, variant: str, x):
    """(callable, compile seconds, rewrite report or None) of one variant; the first call compiles."""
    if variant == "eager":
        return model, 0.0, None
    if variant.startswith("inductor"):  # options make the freezing compile a backend of its own
        fn = torch.compile(model, dynamic=False, options={"freezing": True} if variant == "inductor-freezing" else None)
        t0 = time.perf_counter()
        fn(x)
        return fn, time.perf_counter() - t0, None
    config = CompilerConfig()
    config.experimental_config.frozen_parameter = True
    if variant == "rewrite-rules-off":
        config.rules.disabled = list(ISSUE_RULES)
    if variant == "rewrite-no-tier-up":
        config.exec.tier_up_calls = 0
    backend = rewrite_backend(config)
    fn = torch.compile(model, backend=backend, dynamic=False)
    t0 = time.perf_counter()
    fn(x)
    return fn, time.perf_counter() - t0, backend.report


def _timed_rounds(fns: dict, x, rounds: int) -> dict:
    """Seconds of each variant's calls, ``rounds`` rounds in which the variants take turns."""
    times = {v: [] for v in fns}
    for _ in range(rounds):
        for v, (fn, _, _) in fns.items():
            t0 = time.perf_counter()
            fn(x)
            times[v].append(time.perf_counter() - t0)
    return times


def latency_rows(names, batches, repeat: int) -> list[dict]:
    torch._dynamo.config.cache_size_limit = 64
    cold_caches()
    rows = []
    for name in names:
        build, make = LATENCY_MODELS[name]
        model = build()
        for b in batches:
            x = make(b)
            torch._dynamo.reset()
            with torch.no_grad():
                fns = {v: _compiled(model, v, x) for v in VARIANTS}
                want = model(x)[0]
                warmup = _timed_rounds(fns, x, WARMUP)
                for v, (fn, _, _) in fns.items():  # every variant computes what eager computes, tiered up too
                    torch.testing.assert_close(fn(x)[0], want, atol=1e-3, rtol=1e-3)
                samples = _timed_rounds(fns, x, repeat)
            med = {v: statistics.median(t) for v, t in samples.items()}
            off, on = fns["rewrite-rules-off"][2], fns["rewrite"][2]
            predicted = off.graphs[0].predicted_cost[1] / on.graphs[0].predicted_cost[1]
            row = {"model": name, "batch": b, **{v: med[v] for v in VARIANTS},
                   **{f"compile {v}": fns[v][1] for v in VARIANTS if v != "eager"},
                   "tier-up": max(warmup["rewrite"]),
                   "predicted": predicted, "measured": med["rewrite-rules-off"] / med["rewrite"]}
            rows.append(row)
            print(" | ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    return rows


def rewrite_backend(config):
    from rewrite.backend import get_backend

    return get_backend(config)


def latency_section(rows: list[dict], repeat: int, load_before: str) -> str:
    headers = ["model", "batch", *(f"{v} ms" for v in VARIANTS), "rewrite / inductor",
               "compile s (inductor, freezing, rewrite + its tier-up)", "rules on vs off: predicted, measured"]
    table = markdown_table(headers, [
        [r["model"], r["batch"], *(f"{r[v] * 1e3:.3f}" for v in VARIANTS), f"{r['rewrite'] / r['inductor']:.2f}x",
         f"{r['compile inductor']:.1f}, {r['compile inductor-freezing']:.1f}, "
         f"{r['compile rewrite']:.1f} + {r['tier-up']:.1f}",
         f"{r['predicted']:.2f}x, {r['measured']:.2f}x"] for r in rows])
    at_or_below = [f"{r['model']} b{r['batch']}" for r in rows if r["rewrite"] <= r["inductor"]]
    half_compile = [f"{r['model']} b{r['batch']}" for r in rows
                    if r["compile rewrite"] + r["tier-up"] <= r["compile inductor"] / 2]
    return "\n".join([
        "## Latency: what the rules buy on real models (frozen weights, static shapes)",
        "",
        f"Command: `.venv/bin/python benchmarks/optimizer.py --sizes \"\" --models \"\" --latency --repeat {repeat}"
        f"{f' --threads {torch.get_num_threads()}' if torch.get_num_threads() != os.cpu_count() else ''}`",
        "",
        machine_line() + f"; load average before: {load_before}, after: {_load()}",
        f"Median of {repeat} calls per variant, the variants taking turns call by call. 'rewrite-rules-off': "
        f"config.rules.disabled = {ISSUE_RULES}. 'predicted': the calibrated cost model's rules-off / rules-on "
        "graph cost; 'measured': rules-off / rules-on latency. Compile time: the first call; rewrite's "
        f"is followed by its tier-up (the slowest of {WARMUP} warm-up calls, which all variants get before timing). "
        "Compiles are cold: Inductor's FX graph cache is off, its C++ kernels and rewrite's static kernels go to "
        "fresh folders of this run.",
        "",
        table,
        "",
        f"- rewrite at or below Inductor's default compile: {len(at_or_below)}/{len(rows)} rows ({', '.join(at_or_below) or 'none'})",
        f"- rewrite's compile time with its tier-up at most half of Inductor's: {len(half_compile)}/{len(rows)} rows",
        "",
        "Plot: benchmarks/optimizer_latency.png",
    ])


def latency_plot(rows: list[dict]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    labels = [f"{r['model']}\nb{r['batch']}" for r in rows]
    width = 0.8 / (len(VARIANTS) - 1)
    for k, v in enumerate(VARIANTS[1:]):
        ax.bar([i + k * width for i in range(len(rows))], [r[v] / r["eager"] for r in rows], width, label=v)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))], labels, fontsize=7)
    ax.set_ylabel("latency / eager (lower is faster)")
    ax.set_title("rewrite's rules vs Inductor (CPU, frozen weights)")
    ax.legend(fontsize=7)
    save_plot(fig, "optimizer_latency.png")


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,50000", help="synthetic graph sizes (nodes)")
    ap.add_argument("--models", default="bert,gpt2,minilm,vit", help="real models from rewrite.models")
    ap.add_argument("--latency", action="store_true", help="also the latency table (minutes: compiles with Inductor)")
    ap.add_argument("--latency-models", default=",".join(LATENCY_MODELS))
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: torch's default)")
    ap.add_argument("--no-record", action="store_true",
                    help="print the tables only: write neither RESULTS.md nor the plots")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.getLogger("rewrite").setLevel(logging.ERROR)
    if args.latency:
        load_before = _load()
        rows = latency_rows([m for m in args.latency_models.split(",") if m], [int(b) for b in args.batches.split(",")],
                            args.repeat)
        section = latency_section(rows, args.repeat, load_before)
        print(section)
        if not args.no_record:
            latency_plot(rows)
            record_section("optimizer-latency", section)
    if not args.sizes and not args.models:
        return
    optimize(synthetic(100), CompileUnit.detached("warmup", CompilerConfig(), GraphReport("warmup")))  # declare the rules once

    rows = [run_synthetic(int(n)) for n in args.sizes.split(",") if n]
    rows += [run_model(m) for m in args.models.split(",") if m]
    headers = ["graph", "nodes", "ops before", "ops after", "load s", "saturate s", "extract s", "optimize total s", "notes"]
    table = markdown_table(headers, [
        [r["graph"], r["nodes"], r["ops_before"], r["ops_after"], f"{r['egraph.load']:.3f}",
         f"{r['egraph.saturate']:.3f}", f"{r['egraph.extract']:.3f}", f"{r['total']:.3f}", r["note"]] for r in rows])
    n_rules = sum(len(rs) for rs in default_rulesets())
    print(table)
    print(f"{n_rules} rules in {len(default_rulesets())} rulesets")
    if args.no_record:
        return

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    synth = [r for r in rows if r["graph"].startswith("synthetic")]
    fig, ax = plt.subplots(figsize=(6, 4))
    for stage in STAGES:
        ax.plot([r["nodes"] for r in synth], [r[stage] for r in synth], marker="o", label=stage.split(".")[1])
    ax.plot([r["nodes"] for r in synth], [r["total"] for r in synth], marker="s", label="optimize total")
    ax.axhline(2.0, color="grey", linestyle="--", linewidth=0.8, label="2 s target (10k)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("graph nodes")
    ax.set_ylabel("seconds")
    ax.set_title("e-graph optimizer time vs graph size")
    ax.legend()
    save_plot(fig, "optimizer.png")

    record_section("optimizer", "\n".join([
        "## Optimizer (e-graph): time vs graph size, op counts",
        "",
        "Command: `.venv/bin/python benchmarks/optimizer.py`" + (f" `--sizes {args.sizes} --models {args.models}`"
                                                                  if args.sizes != "1000,10000,50000" or args.models != "bert,gpt2,minilm,vit" else ""),
        "",
        machine_line(),
        f"{n_rules} rules in {len(default_rulesets())} rulesets. Real models: whole backend with frozen weights "
        "(optimize total = every optimizer stage, including folding and shape folding).",
        "",
        table,
        "",
        "Plot: benchmarks/optimizer.png",
    ]))


if __name__ == "__main__":
    main()
