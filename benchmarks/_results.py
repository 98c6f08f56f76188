"""Shared helpers for benchmark scripts: timing, tables and the RESULTS.md sections.

Each benchmark owns one section of benchmarks/RESULTS.md, delimited by HTML comments, and
rewrites only that section, so scripts can be re-run independently.
"""
from __future__ import annotations

import os
import platform
import statistics
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "RESULTS.md")
OUT_DIR = os.path.join(HERE, "out")

sys.path.insert(0, os.path.dirname(HERE))
from rewrite.persist.atomic import atomic_write_text  # noqa: E402


def cold_caches() -> None:
    """Compile times are cold: Inductor's FX graph cache off and its C++ kernel cache, like rewrite's
    static-kernel cache ($XDG_CACHE_HOME/rewrite/kernels), in fresh folders of this run."""
    torch._inductor.config.fx_graph_cache = False
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-inductor-")
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="bench-xdg-")


def time_call(fn, *args, warmup: int = 3, repeat: int = 20, inner: int = 1) -> float:
    """Median seconds per call of ``fn(*args)``."""
    for _ in range(warmup):
        fn(*args)
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn(*args)
        samples.append((time.perf_counter() - t0) / inner)
    return statistics.median(samples)


def markdown_table(headers, rows) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def machine_line() -> str:
    return (f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
            f"threads {torch.get_num_threads()}, python {platform.python_version()}")


def record_section(name: str, body: str) -> None:
    """Replace (or append) the section ``name`` of RESULTS.md with ``body``."""
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    text = open(RESULTS).read() if os.path.exists(RESULTS) else "# Benchmark results\n\nLatest measured figures; each section is written by the script it names.\n"
    block = f"{begin}\n{body.strip()}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    atomic_write_text(RESULTS, text)


def save_plot(fig, filename: str) -> str:
    os.makedirs(OUT_DIR, exist_ok=True)
    path = os.path.join(HERE, filename)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path
