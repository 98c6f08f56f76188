"""Rules on vs off, paired: does any of rewrite's speed rules make a zoo model slower? (issue 28's invariant)

The zoo benchmark (`zoo.py`) has a "rules on vs off" column, but it times eight contenders in turn on a
2-core machine, and rows whose two forms are identical (same graph, same predicted cost) differ there by
up to 7%. This script measures only that pair, so the ratio can be told from noise:

* per architecture of `zoo.ARCHS` and batch: rewrite with frozen weights (``rewrite-frozen``) and the same
  with the speed rules of `optimizer.ISSUE_RULES` disabled (``rewrite-frozen-rules-off``);
* two pairs, each on a fresh Dynamo and its own code objects: on compiled first, then off compiled first
  (the compile order alone moved the ratio by 3-8% in A/B runs here, in either direction; the geometric
  mean of the two orders cancels that);
* both past their tier-up, outputs compared with eager, then ``--rounds`` rounds in which the two take
  turns call by call; the ratio of the medians per pair;
* each row in a fresh process: run in one process after the rows before it, the same row moved by up to
  10% (t5 b1 1.08x late in a full run, 0.92x alone, twice).

A row counts as "rules slower" only when both orders put rules-on above rules-off by more than `NOISE`.

    .venv/bin/python benchmarks/rules_ab.py                        # records its section of RESULTS.md
    .venv/bin/python benchmarks/rules_ab.py --archs bert,t5 --batches 1 --no-record
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from _results import machine_line, markdown_table, record_section, save_plot  # noqa: E402
from optimizer import ISSUE_RULES, WARMUP  # noqa: E402
from zoo import ARCHS, BATCHES, _compiled, _timed_rounds  # noqa: E402

from tests.zoo import BY_NAME, compare, prepare_environment  # noqa: E402

ON, OFF = "rewrite-frozen", "rewrite-frozen-rules-off"
ROUNDS = 200
NOISE = 1.03  # rules on slower than off by more than this, in both orders: listed as slower


def _pair(arch, batch: int, first: str, rounds: int, build_dir: str) -> float:
    """Median seconds of rules-on over rules-off, ``first`` compiled first, the two taking turns call by call."""
    torch._dynamo.reset()
    inputs = arch.inputs(batch, seed=0)
    model = arch.model()
    want = model(**inputs)
    fns = {}
    for contender in (first, OFF if first == ON else ON):
        fn, _ = _compiled(model, contender, build_dir)
        for _ in range(WARMUP):
            fn(**inputs)
        ok, diff, why = compare(fn(**inputs), want)
        if not ok:
            raise AssertionError(f"{arch.name} b{batch} {contender}: differs from eager: {why}")
        fns[contender] = fn
    status = {c: ("ok", "") for c in fns}
    times = _timed_rounds(fns, inputs, rounds, status)
    if failed := {c: why for c, (state, why) in status.items() if state != "ok"}:
        raise RuntimeError(f"{arch.name} b{batch}: {failed}")
    return statistics.median(times[ON]) / statistics.median(times[OFF])


def row(name: str, batch: int, rounds: int) -> dict:
    """One architecture and batch, in this process."""
    build_dir = tempfile.mkdtemp(prefix="rules-ab-")
    with torch.no_grad():
        on_first = _pair(BY_NAME[name], batch, ON, rounds, build_dir)
        off_first = _pair(BY_NAME[name], batch, OFF, rounds, build_dir)
    return {"arch": name, "batch": batch, "on first": on_first, "off first": off_first,
            "ratio": math.sqrt(on_first * off_first)}


def rows(archs, batches, rounds: int) -> list[dict]:
    """Every row in a child process of its own (see the module's docstring)."""
    out = []
    for name in archs:
        for b in batches:
            done = subprocess.run([sys.executable, os.path.abspath(__file__), "--row", f"{name}:{b}",
                                   "--rounds", str(rounds)], capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"{name} b{b} failed:\n{done.stderr[-3000:]}")
            r = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"{name} b{b}: rules on / off {r['ratio']:.3f} (on compiled first {r['on first']:.3f}, "
                  f"off compiled first {r['off first']:.3f})", flush=True)
            out.append(r)
    return out


def slower(r: dict) -> bool:
    return r["on first"] > NOISE and r["off first"] > NOISE


def section(rs: list[dict], args) -> str:
    table = markdown_table(["architecture", "batch", "rules on / off (geomean of both orders)", "on compiled first",
                            "off compiled first"],
                           [[r["arch"], r["batch"], f"{r['ratio']:.3f}x", f"{r['on first']:.3f}x",
                             f"{r['off first']:.3f}x"] for r in rs])
    worst = max(rs, key=lambda r: r["ratio"])
    listed = [f"{r['arch']} b{r['batch']}" for r in rs if slower(r)]
    geomean = math.exp(statistics.fmean(math.log(r["ratio"]) for r in rs))
    return "\n".join([
        "## Rules on vs off, paired (benchmarks/rules_ab.py)",
        "",
        f"Command: `.venv/bin/python benchmarks/rules_ab.py --rounds {args.rounds}`",
        "",
        machine_line(),
        f"rewrite-frozen against the same with config.rules.disabled = {list(ISSUE_RULES)}, both tiered up and "
        f"compared with eager; {args.rounds} rounds of one call each, the two taking turns; each ratio is "
        "median over median. Two pairs per row, in a fresh process per row, each pair on a fresh Dynamo, one with "
        "rules-on compiled first and one with rules-off first; the first column is the geometric mean of the two. Below 1: the rules "
        "make the model faster.",
        "",
        table,
        "",
        f"- geometric mean over the rows: {geomean:.3f}x; the largest: {worst['arch']} b{worst['batch']} "
        f"{worst['ratio']:.3f}x",
        f"- rules on slower than off by more than {round((NOISE - 1) * 100)}% in both orders: "
        f"{', '.join(listed) or 'none'}",
        "",
        "Plot: benchmarks/rules_ab.png",
    ])


def plot(rs: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 3.6))
    labels = [f"{r['arch']} b{r['batch']}" for r in rs]
    ax.bar(range(len(rs)), [r["ratio"] for r in rs], color=["tab:red" if slower(r) else "tab:blue" for r in rs])
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(range(len(rs)), labels, rotation=75, fontsize=7)
    ax.set_ylabel("rules on / off latency")
    ax.set_title("rewrite's speed rules, paired on vs off (lower is faster)")
    save_plot(fig, "rules_ab.png")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archs", default=",".join(ARCHS))
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--no-record", action="store_true")
    ap.add_argument("--row", help=argparse.SUPPRESS)  # ARCH:BATCH, run by `rows` in a child process
    args = ap.parse_args()
    prepare_environment()
    import logging
    import warnings

    logging.getLogger("rewrite").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=UserWarning)
    torch._dynamo.config.cache_size_limit = 64
    if args.row:
        name, batch = args.row.split(":")
        print(json.dumps(row(name, int(batch), args.rounds)))
        return
    archs = [a for a in args.archs.split(",") if a]
    if unknown := [a for a in archs if a not in BY_NAME]:
        ap.error(f"unknown architectures {unknown}")
    rs = rows(archs, [int(b) for b in args.batches.split(",") if b], args.rounds)
    text = section(rs, args)
    print(text)
    if not args.no_record and set(archs) >= set(ARCHS):
        plot(rs)
        record_section("rules-ab", text)


if __name__ == "__main__":
    main()
