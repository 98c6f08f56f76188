"""Export benchmark: rewrite.dynamo_export / rewrite.load against torch.export.save / torch.export.load.

On the same model and input (MiniLM, real weights, batch 2 x 16 tokens, fp32, CPU) it measures

* export time: tracing + optimizing + writing the files (rewrite), export + save (torch.export);
* load time and first-call latency in a fresh Python process (what a deployment pays), with the
  import time of that process reported separately; the median of ``--repeat`` fresh processes;
* steady-state latency of the loaded model (median of 20 calls) and the size on disk.

    .venv/bin/python benchmarks/export.py [--repeat 3]

Prints a table, writes benchmarks/export.png and the "export" section of benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks._results import machine_line, markdown_table, record_section, save_plot  # noqa: E402

REPO = os.path.dirname(HERE)

# Runs in a fresh process: import, load, first call, steady state. Prints one JSON line.
FRESH = """
import json, statistics, sys, time
t0 = time.perf_counter()
import torch
{imports}
t1 = time.perf_counter()
ids = torch.load({ids!r}, weights_only=True)
t2 = time.perf_counter()
{load}
t3 = time.perf_counter()
with torch.no_grad():
    out = run(ids)
t4 = time.perf_counter()
samples = []
with torch.no_grad():
    for _ in range(20):
        s = time.perf_counter(); run(ids); samples.append(time.perf_counter() - s)
first = out[0]
torch.save(first, {out_path!r})
print(json.dumps({{"import_s": t1 - t0, "load_s": t3 - t2, "first_call_s": t4 - t3,
                  "steady_ms": statistics.median(samples) * 1000}}))
"""

REWRITE = {
    "imports": "import rewrite",
    "load": "model = rewrite.load({path!r})\nrun = lambda ids: model(ids)",
}
TORCH_EXPORT = {
    "imports": "",
    "load": "program = torch.export.load({path!r})\nmodule = program.module()\nrun = lambda ids: module(ids)",
}


def folder_size(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files)


def fresh_process(kind: dict, path: str, ids_path: str, out_path: str) -> dict:
    code = FRESH.format(imports=kind["imports"], load=kind["load"].format(path=path), ids=ids_path,
                        out_path=out_path)
    env = dict(os.environ, PYTHONPATH=REPO, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"fresh process failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def median_of(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


class TupleOutputs(torch.nn.Module):
    """MiniLM returning a plain tuple: torch.export.load cannot rebuild transformers' ModelOutput
    without importing transformers (rewrite.load returns it as a dict), so both exporters get this."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        out = self.model(ids)
        return out["last_hidden_state"], out["pooler_output"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per variant (median)")
    args = parser.parse_args()

    import rewrite
    from rewrite.models import minilm, token_batch

    model = TupleOutputs(minilm()).eval()
    ids = token_batch(2, 16, vocab=1000)
    with torch.no_grad():
        eager = model(ids)[0]
    work = tempfile.mkdtemp(prefix="rewrite-export-bench-")
    ids_path = os.path.join(work, "ids.pt")
    torch.save(ids, ids_path)

    rewrite_dir = os.path.join(work, "rewrite_export")
    t0 = time.perf_counter()
    rewrite.dynamo_export(ids, model=model, export_path=rewrite_dir)
    rewrite_export_s = time.perf_counter() - t0

    pt2_path = os.path.join(work, "minilm.pt2")
    t0 = time.perf_counter()
    program = torch.export.export(model, (ids,), strict=False)
    torch.export.save(program, pt2_path)
    torch_export_s = time.perf_counter() - t0

    results = {}
    for label, kind, path in (("rewrite", REWRITE, rewrite_dir), ("torch.export", TORCH_EXPORT, pt2_path)):
        runs = []
        for r in range(args.repeat):
            out_path = os.path.join(work, f"out_{label}_{r}.pt")
            runs.append(fresh_process(kind, path, ids_path, out_path))
            got = torch.load(out_path, weights_only=True)
            torch.testing.assert_close(got, eager, rtol=1e-4, atol=1e-4)  # both must compute the model
        results[label] = median_of(runs)
    results["rewrite"]["export_s"] = rewrite_export_s
    results["torch.export"]["export_s"] = torch_export_s
    results["rewrite"]["size_mb"] = folder_size(rewrite_dir) / 2**20
    results["torch.export"]["size_mb"] = folder_size(pt2_path) / 2**20

    headers = ["", "export (s)", "import (s)", "load (s)", "first call (ms)", "steady call (ms)", "on disk (MiB)"]
    rows = []
    for label in ("rewrite", "torch.export"):
        r = results[label]
        rows.append([label, f"{r['export_s']:.2f}", f"{r['import_s']:.2f}", f"{r['load_s']:.3f}",
                     f"{r['first_call_s'] * 1000:.1f}", f"{r['steady_ms']:.2f}", f"{r['size_mb']:.1f}"])
    a, b = results["rewrite"], results["torch.export"]
    rows.append(["ratio rewrite / torch.export", f"{a['export_s'] / b['export_s']:.2f}",
                 f"{a['import_s'] / b['import_s']:.2f}", f"{a['load_s'] / b['load_s']:.2f}",
                 f"{a['first_call_s'] / b['first_call_s']:.2f}", f"{a['steady_ms'] / b['steady_ms']:.2f}",
                 f"{a['size_mb'] / b['size_mb']:.2f}"])
    table = markdown_table(headers, rows)
    print(table)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(13, 3.2))
    for ax, (key, title, scale) in zip(axes, [("export_s", "export (s)", 1), ("load_s", "load (s)", 1),
                                              ("first_call_s", "first call (ms)", 1000),
                                              ("steady_ms", "steady call (ms)", 1)]):
        values = [results["rewrite"][key] * scale, results["torch.export"][key] * scale]
        ax.bar(["rewrite", "torch.export"], values, color=["tab:blue", "tab:gray"])
        ax.set_title(title)
    fig.suptitle("MiniLM (2x16 tokens, fp32, CPU): export, fresh-process load and first call", y=1.06)
    save_plot(fig, "export.png")

    body = "\n".join([
        "## Export: rewrite.dynamo_export/load vs torch.export.save/load",
        "",
        "Command: `.venv/bin/python benchmarks/export.py --repeat %d`" % args.repeat,
        "",
        "MiniLM (all-MiniLM-L6-v2, real weights), input 2 x 16 tokens, fp32, CPU, static shapes. Export time "
        "includes tracing, optimizing and writing; import/load/first/steady call are measured in fresh "
        f"processes (median of {args.repeat}); both loaded models are checked against eager.",
        "",
        table,
        "",
        machine_line(),
        "",
        "![export](export.png)",
    ])
    record_section("export", body)


if __name__ == "__main__":
    main()
