"""The demo's own table (`make demo`: MiniLM, real weights, gears 1/2/4/8, seq 32) recorded in RESULTS.md.

    .venv/bin/python benchmarks/demo.py

Runs `rewrite.demo.run_demo` with its defaults, prints what it prints, and records its timing table
and the notes under it (section "demo"), with the machine's load line (`_results.record_section`).
"""
from __future__ import annotations

import contextlib
import io
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _results import machine_line, record_section  # noqa: E402
from rewrite.demo import run_demo  # noqa: E402


def main() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        run_demo()
    text = out.getvalue()
    print(text)
    table = text[text.index("milliseconds per call"):].strip()
    record_section("demo", "\n".join([
        "## The demo (`make demo`): MiniLM, real weights, each mode against eager",
        "",
        "Command: `.venv/bin/python benchmarks/demo.py` (runs `python -m rewrite demo`'s defaults)  ",
        machine_line(),
        "",
        "```",
        table,
        "```",
    ]))


if __name__ == "__main__":
    main()
