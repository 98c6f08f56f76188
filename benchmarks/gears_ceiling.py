"""How far planned gears can go on the batch traces: each contender compiled for exactly one batch size at a time,
and what serving the traces would cost if every request ran at its own size with no padding (issue 50).

    python benchmarks/gears_ceiling.py [--sizes 1 2 4 8 16 32 64] [--rounds 15] [--no-record]
    python benchmarks/gears_ceiling.py --tokens [--rounds 5] [--no-record]

The traffic benchmark (`gears.py --traffic`) serves two batch traces of MiniLM (sequence 16, batch 1..64) with
16 planned gears, padding a request up to a gear or splitting it. Here every size has its own static graph, so
this is the best any set of gears could do: the ceiling of "planned gears" against the others on those traces.

Contenders, each behind its own code object, timed interleaved (the least of ``--rounds`` calls per size):

* ``eager``;
* ``rewrite gear``: rewrite's defaults with ``set_dim_gears`` on exactly ``--sizes`` (each size is a gear, past
  its tier-up);
* ``openvino f32``: OpenVINO's ``torch.compile`` backend, ``dynamic=False`` (one model per size), float32 (on a CPU
  with bf16 its default precision is bf16, which moves MiniLM's outputs by 2e-2);
* ``inductor frozen``: ``dynamic=False``, ``freezing`` and ``cpp_wrapper`` (Inductor's best CPU inference setting).

Columns: milliseconds per call at each size, rewrite's GFLOP/s (the model's FLOPs at that size by torch's
``FlopCounterMode``, over rewrite's time), and rewrite over the best other contender. Then, per trace: the served
half's time at each request's own size (latency interpolated linearly between the measured sizes), and the
throughput ratio of rewrite to each contender that it gives: what planned gears would reach with no padding and
no split.

``--tokens``: the same for the token traces of `gears_tokens` (sentences: MiniLM with ``input_ids`` and
``attention_mask``; prefill: a GPT-2-shaped decoder), on a grid of (batch, length) shapes: rewrite's gears on the
grid (``set_dim_gears`` on both dims of both inputs, ``"product"``), Inductor ``dynamic=True`` at its defaults and
with freezing + cpp_wrapper (the traffic benchmark's best others on these traces; OpenVINO serves them far slower
there and is left out), eager. A request's cost at its own shape is interpolated bilinearly on the grid.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import machine_line, markdown_table, record_section, save_plot  # noqa: E402
from gears import TRAFFIC_TRACES, traffic_trace  # noqa: E402
from zoo import _why  # noqa: E402

import rewrite  # noqa: E402
from rewrite import models  # noqa: E402
from rewrite.demo import with_own_code  # noqa: E402

SEQ, MAX_BATCH = 16, 64  # gears.py --traffic's sequence and largest batch (its traces depend on it)
CONTENDERS = ["eager", "rewrite gear", "openvino f32", "inductor frozen"]
OTHERS = [c for c in CONTENDERS if c != "rewrite gear"]


def build(contender: str, model, sizes: list[int], inputs: dict):
    call = with_own_code(model, contender.replace(" ", "_"))
    if contender == "eager":
        return model
    if contender == "rewrite gear":
        fn = torch.compile(call, backend=rewrite.get_backend(), fullgraph=True)
        first = inputs[sizes[-1]].clone()
        rewrite.inference.set_dim_gears(first, {0: sizes})
        with torch.no_grad():
            fn(first)
        return fn
    if contender == "openvino f32":
        import openvino.torch  # noqa: F401  (registers the backend)

        return torch.compile(call, backend="openvino", dynamic=False,
                             options={"config": {"INFERENCE_PRECISION_HINT": "f32"}})
    if contender == "inductor frozen":
        return torch.compile(call, dynamic=False, options={"freezing": True, "cpp_wrapper": True})
    raise ValueError(contender)


def least_interleaved(fns: dict, inputs: dict, rounds: int, label: str = "") -> dict:
    """{contender: {key: seconds}}: for each key of ``inputs`` (its call's arguments, a tensor or a dict of them),
    the least of ``rounds`` calls, the contenders taking turns call by call."""
    times = {c: {} for c in fns}
    with torch.no_grad():
        for key, x in inputs.items():
            samples = {c: [] for c in fns}
            for _ in range(rounds):
                for c, fn in fns.items():
                    t0 = time.perf_counter()
                    fn(**x) if isinstance(x, dict) else fn(x)
                    samples[c].append(time.perf_counter() - t0)
            for c in fns:
                times[c][key] = min(samples[c])
            print(f"  {label}{key}: " + ", ".join(f"{c} {times[c][key] * 1e3:.2f} ms" for c in fns), flush=True)
    return times


def gflop(model, x) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(x)
    return counter.get_total_flops() / 1e9


def measure(sizes: list[int], rounds: int) -> tuple[dict, dict, list[str]]:
    """{contender: {size: seconds}}, {size: GFLOP}, the contenders that could not run (with why)."""
    torch._dynamo.config.cache_size_limit = 64
    model = models.minilm().eval()
    inputs = {b: models.token_batch(b, SEQ, vocab=30522, seed=b) for b in sizes}
    with torch.no_grad():
        want = {b: model(x).last_hidden_state for b, x in inputs.items()}
    fns, failed = {}, []
    warm_calls = rewrite.CompilerConfig().exec.tier_up_calls + 2
    for c in CONTENDERS:
        try:
            fn = build(c, model, sizes, inputs)
            with torch.no_grad():
                for b in reversed(sizes):
                    for _ in range(warm_calls):
                        got = fn(inputs[b]).last_hidden_state
                    torch.testing.assert_close(got, want[b], rtol=1e-3, atol=1e-3)
        except Exception as e:  # noqa: BLE001 - a contender that fails is a line, not the end
            failed.append(f"{c}: {_why(e)}")
            continue
        fns[c] = fn
        print(f"  {c}: ready", flush=True)
    times = least_interleaved(fns, inputs, rounds, "b")
    flops = {b: gflop(model, inputs[b]) for b in sizes}
    return times, flops, failed


def at(size: int, curve: dict) -> float:
    """Seconds at ``size``: linear between the measured sizes, proportional past the last (GEMM-bound there)."""
    xs = sorted(curve)
    if size > xs[-1]:
        return curve[xs[-1]] * size / xs[-1]
    return float(np.interp(size, xs, [curve[x] for x in xs]))


def ceilings(times: dict, requests: int, max_batch: int) -> list[list]:
    rows = []
    for trace in TRAFFIC_TRACES:
        served = traffic_trace(trace, requests, max_batch)[requests // 2:]
        total = {c: sum(at(b, curve) for b in served) for c, curve in times.items()}
        mine = total.get("rewrite gear")
        cells = [f"{total[c]:.1f} s" for c in CONTENDERS if c in total]
        ratios = [f"{total[c] / mine:.2f}x" if mine else "-" for c in OTHERS if c in total]
        rows.append([trace, len(served)] + cells + ratios)
    return rows


TOKEN_GRID = {"sentences": ([1, 4, 16, 32], [16, 64, 128, 256]), "prefill": ([1, 2, 4, 8], [16, 64, 128, 256])}
TOKEN_CONTENDERS = ["eager", "rewrite gears", "inductor dynamic", "inductor dynamic frozen"]


def build_tokens(contender: str, model, batches: list[int], lengths: list[int], first: dict):
    call = with_own_code(model, contender.replace(" ", "_"))
    if contender == "eager":
        return model
    if contender == "rewrite gears":
        config = rewrite.CompilerConfig(**{"inference_config.dynamic_gears_merge_policy": "product"})
        for x in first.values():
            rewrite.inference.set_dim_gears(x, {0: batches, 1: lengths})
        return torch.compile(call, backend=rewrite.get_backend(config), fullgraph=True)
    if contender == "inductor dynamic":
        return torch.compile(call, dynamic=True, fullgraph=True)
    if contender == "inductor dynamic frozen":
        return torch.compile(call, dynamic=True, fullgraph=True, options={"freezing": True, "cpp_wrapper": True})
    raise ValueError(contender)


def measure_tokens(trace: str, rounds: int) -> tuple[dict, list[str]]:
    """{contender: {(batch, length): seconds}} on the trace's grid, and the contenders that could not run."""
    from gears_tokens import TOKEN_TRACES, load, make_request

    torch._dynamo.config.cache_size_limit = 64
    batches, lengths = TOKEN_GRID[trace]
    model = load(trace)
    vocab = TOKEN_TRACES[trace]["vocab"]
    grid = [(b, n) for b in batches for n in lengths]
    inputs = {(b, n): make_request([n] * b, vocab, seed=b * 1000 + n) for b, n in grid}
    warm_calls = rewrite.CompilerConfig().exec.tier_up_calls + 2
    fns, failed = {}, []
    for c in TOKEN_CONTENDERS:
        try:
            first = {k: t.clone() for k, t in inputs[grid[-1]].items()}  # the largest shape: where gears trace
            fn = build_tokens(c, model, batches, lengths, first)
            with torch.no_grad():
                fn(**first)
                for shp in reversed(grid):
                    for _ in range(warm_calls if c == "rewrite gears" else 2):
                        got = fn(**inputs[shp]).last_hidden_state
                    torch.testing.assert_close(got, model(**inputs[shp]).last_hidden_state, rtol=1e-3, atol=1e-3)
        except Exception as e:  # noqa: BLE001 - a contender that fails is a line, not the end
            failed.append(f"{c}: {_why(e)}")
            continue
        fns[c] = fn
        print(f"  {trace} {c}: ready", flush=True)
    return least_interleaved(fns, inputs, rounds, f"{trace} "), failed


def at_shape(b: int, n: int, curve: dict) -> float:
    """Seconds at (b, n): bilinear on the grid, clamped to its edges (a sentence of 8-15 tokens is priced as 16)."""
    bs, ns = sorted({k[0] for k in curve}), sorted({k[1] for k in curve})
    b, n = min(max(b, bs[0]), bs[-1]), min(max(n, ns[0]), ns[-1])
    per_b = [float(np.interp(n, ns, [curve[(bb, nn)] for nn in ns])) for bb in bs]
    return float(np.interp(b, bs, per_b))


def token_section(rounds: int, requests: int) -> str:
    from gears_tokens import TOKEN_TRACES, shape, token_trace

    parts = ["## The ceiling of gears on the token traces (benchmarks/gears_ceiling.py --tokens)",
             f"`python benchmarks/gears_ceiling.py --tokens --rounds {rounds}`", machine_line(),
             f"Each contender at every (batch, length) of the grid; the least of {rounds} interleaved calls, ms. "
             "rewrite's gears are the grid itself (a graph per shape); Inductor's are one symbolic graph each."]
    ceiling_rows = []
    for trace in TOKEN_GRID:
        times, failed = measure_tokens(trace, rounds)
        ran = [c for c in TOKEN_CONTENDERS if c in times]
        grid = sorted(next(iter(times.values())))
        rows = [[f"({b}, {n})"] + [f"{times[c][(b, n)] * 1e3:.1f}" for c in ran] for b, n in grid]
        parts += [f"### {trace} ({TOKEN_TRACES[trace]['model']})",
                  markdown_table(["shape"] + [f"{c} ms" for c in ran], rows)]
        if failed:
            parts.append(f"Could not run: {'; '.join(failed)}")
        served = [shape(r) for r in token_trace(trace, requests)[requests // 2:]]
        total = {c: sum(at_shape(b, n, times[c]) for b, n in served) for c in ran}
        mine = total.get("rewrite gears")
        ceiling_rows.append([trace, len(served)]
                            + [f"{total[c]:.1f} s" if c in total else "-" for c in TOKEN_CONTENDERS]
                            + [f"{total[c] / mine:.2f}x" if mine and c in total else "-"
                               for c in TOKEN_CONTENDERS if c != "rewrite gears"])
    parts += ["### Every request at its own shape (no padding beyond the tokenizer's, no split)",
              markdown_table(["trace", "served requests"] + [f"{c}, own shapes" for c in TOKEN_CONTENDERS]
                             + [f"rewrite's throughput / {c}'s" for c in TOKEN_CONTENDERS if c != "rewrite gears"],
                             ceiling_rows)]
    return "\n\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--rounds", type=int, default=None, help="calls per size (default 15, --tokens 5)")
    parser.add_argument("--requests", type=int, default=None,
                        help="requests per trace, half of them served (default 2000, --tokens 160: as the traffic "
                             "runs)")
    parser.add_argument("--no-record", action="store_true",
                        help="print only; leave RESULTS.md and the plot as they are")
    parser.add_argument("--tokens", action="store_true", help="the token traces (batch x length) instead")
    opts = parser.parse_args()
    if opts.tokens:
        body = token_section(opts.rounds or 5, opts.requests or 160)
        print(body)
        if not opts.no_record:
            record_section("gears_ceiling_tokens", body)
        return
    sizes = sorted(set(opts.sizes))
    opts.rounds = opts.rounds or 15
    times, flops, failed = measure(sizes, opts.rounds)
    ran = [c for c in CONTENDERS if c in times]
    size_rows = []
    for b in sizes:
        mine = times.get("rewrite gear", {}).get(b)
        others = [times[c][b] for c in OTHERS if c in times]
        size_rows.append([b] + [f"{times[c][b] * 1e3:.2f}" for c in ran]
                         + [f"{flops[b] / mine:.0f}" if mine else "-",
                            f"{mine / min(others):.2f}x" if mine and others else "-"])
    size_table = markdown_table(["batch"] + [f"{c} ms" for c in ran] + ["rewrite GFLOP/s", "rewrite / best other"],
                                size_rows)
    trace_table = markdown_table(["trace", "served requests"] + [f"{c}, own sizes" for c in ran]
                                 + [f"rewrite's throughput / {c}'s" for c in OTHERS if c in times],
                                 ceilings(times, opts.requests or 2000, MAX_BATCH))
    body = "\n\n".join([
        "## The ceiling of gears on the batch traces (benchmarks/gears_ceiling.py)",
        f"`python benchmarks/gears_ceiling.py --sizes {' '.join(map(str, sizes))} --rounds {opts.rounds}`",
        machine_line(),
        f"MiniLM, sequence {SEQ}; each contender compiled for exactly each size; the least of {opts.rounds} "
        "interleaved calls.",
        size_table,
        "What the served half of each batch trace (`gears.py --traffic`) costs when every request runs at its own "
        "size, with no padding and no split (latency interpolated between the measured sizes): the most planned "
        "gears could reach against each contender.",
        trace_table] + ([f"Could not run: {'; '.join(failed)}"] if failed else []))
    print(body)
    # The plot beside RESULTS.md belongs to the recorded figures: drawn only when they are recorded.
    if opts.no_record or not record_section("gears_ceiling", body + "\n\n![gears ceiling](gears_ceiling.png)"):
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for c in ran:
        ax.plot(sizes, [times[c][b] * 1e3 / b for b in sizes], marker="o", label=c)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch (sequence 16)")
    ax.set_ylabel("ms per row")
    ax.set_title("MiniLM, one static compile per size")
    ax.legend(fontsize=7)
    print("plot:", save_plot(fig, "gears_ceiling.png"))


if __name__ == "__main__":
    main()
