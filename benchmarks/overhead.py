"""Per-call latency and compile time: eager vs Inductor vs rewrite on MiniLM (real weights).

    python benchmarks/overhead.py [--repeat 30] [--no-inductor]

Batch 1 and 8 at sequence 32. All variants are timed in the same process, interleaved round by
round, so machine noise hits them alike; the table reports medians.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import machine_line, markdown_table, record_section, save_plot  # noqa: E402

import rewrite  # noqa: E402
from rewrite import models  # noqa: E402

SEQ = 32
BATCHES = (1, 8)


def compile_variant(name, model, ids):
    if name == "eager":
        fn = model
    elif name == "inductor":
        fn = torch.compile(model, backend="inductor", fullgraph=True, dynamic=False)
    else:
        fn = torch.compile(model, backend=rewrite.get_backend(), fullgraph=True, dynamic=False)
    t0 = time.perf_counter()
    with torch.no_grad():
        fn(ids)
    return fn, time.perf_counter() - t0


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--no-inductor", action="store_true")
    opts = parser.parse_args()
    # Honest compile times: no reuse of Inductor's on-disk cache from an earlier run.
    torch._inductor.config.fx_graph_cache = False
    torch._dynamo.config.cache_size_limit = 64
    model = models.minilm()
    variants = ["eager", "rewrite"] + ([] if opts.no_inductor else ["inductor"])
    rows, latencies, compile_times = [], {}, {}
    for batch in BATCHES:
        ids = models.token_batch(batch, SEQ, vocab=30522)
        compiled = {}
        for v in variants:
            compiled[v], compile_times[(v, batch)] = compile_variant(v, model, ids)
        with torch.no_grad():
            expected = model(ids).last_hidden_state
            for v in variants:
                torch.testing.assert_close(compiled[v](ids).last_hidden_state, expected, atol=1e-4, rtol=1e-4)
            samples = {v: [] for v in variants}
            for _ in range(3):
                for v in variants:
                    compiled[v](ids)
            for _ in range(opts.repeat):
                for v in variants:  # interleaved: noise hits every variant alike
                    t0 = time.perf_counter()
                    compiled[v](ids)
                    samples[v].append(time.perf_counter() - t0)
        for v in variants:
            latencies[(v, batch)] = statistics.median(samples[v])
    for v in variants:
        row = [v]
        for batch in BATCHES:
            ms = latencies[(v, batch)] * 1e3
            ratio = latencies[(v, batch)] / latencies[("eager", batch)]
            row.append(f"{ms:.2f} ms ({ratio:.2f}x eager)")
        row.append("-" if v == "eager" else f"{compile_times[(v, BATCHES[0])]:.1f} s")
        rows.append(row)
    headers = ["variant"] + [f"batch {b}, seq {SEQ}" for b in BATCHES] + ["compile (first call)"]
    table = markdown_table(headers, rows)
    print(table)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    width = 0.8 / len(variants)
    for i, v in enumerate(variants):
        ax.bar([j + i * width for j in range(len(BATCHES))], [latencies[(v, b)] * 1e3 for b in BATCHES], width,
               label=v)
    ax.set_xticks([j + width * (len(variants) - 1) / 2 for j in range(len(BATCHES))])
    ax.set_xticklabels([f"batch {b}" for b in BATCHES])
    ax.set_ylabel("ms per call (median)")
    ax.set_title(f"MiniLM per-call latency, seq {SEQ}")
    ax.legend()
    save_plot(fig, "overhead.png")
    record_section("overhead", f"""## Per-call overhead: MiniLM (real weights), seq {SEQ}

Command: `python benchmarks/overhead.py --repeat {opts.repeat}` ({machine_line()}).
Median of {opts.repeat} interleaved calls per variant; compile time is the first call at batch {BATCHES[0]}.
Plot: `benchmarks/overhead.png`.

{table}
""")


if __name__ == "__main__":
    main()
