"""Optimization time (load, saturate, extract) against graph size, and op counts before/after.

Synthetic graphs of N nodes repeat a block with work for every family of the optimizer: a common
subexpression, a double negation, a multiplication by one, a view to the same shape, a constant
subexpression to fold, and a dead branch of ops. Real models go through the whole backend
(``rewrite.explain``), so their times are those of the optimizer inside torch.compile.

    .venv/bin/python benchmarks/optimizer.py                    # 1k, 10k, 50k nodes + real models
    .venv/bin/python benchmarks/optimizer.py --sizes 1000,10000 --models bert
"""
from __future__ import annotations

import argparse
import logging
import time

import sympy
import torch

from _results import machine_line, markdown_table, record_section, save_plot

from rewrite import models
from rewrite.config import CompilerConfig
from rewrite.explain import explain
from rewrite.ir import Graph, TensorMeta
from rewrite.optimizer import optimize
from rewrite.report import GraphReport
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
    out = optimize(g, CompilerConfig(), report)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,50000", help="synthetic graph sizes (nodes)")
    ap.add_argument("--models", default="bert,gpt2,minilm,vit", help="real models from rewrite.models")
    args = ap.parse_args()
    logging.getLogger("rewrite").setLevel(logging.ERROR)
    optimize(synthetic(100), CompilerConfig(), GraphReport("warmup"))  # declare the rules once

    rows = [run_synthetic(int(n)) for n in args.sizes.split(",") if n]
    rows += [run_model(m) for m in args.models.split(",") if m]
    headers = ["graph", "nodes", "ops before", "ops after", "load s", "saturate s", "extract s", "optimize total s", "notes"]
    table = markdown_table(headers, [
        [r["graph"], r["nodes"], r["ops_before"], r["ops_after"], f"{r['egraph.load']:.3f}",
         f"{r['egraph.saturate']:.3f}", f"{r['egraph.extract']:.3f}", f"{r['total']:.3f}", r["note"]] for r in rows])
    n_rules = sum(len(rs) for rs in default_rulesets())
    print(table)
    print(f"{n_rules} rules in {len(default_rulesets())} rulesets")

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
