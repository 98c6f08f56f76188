"""rewrite on a CUDA GPU against eager and Inductor: transformer latency per mode, and stream scopes.

    python benchmarks/gpu.py [--out DIR] [--quick]

Needs a CUDA device (CI has none; RESULTS.md marks these figures as GPU figures). Per model and batch,
each contender is compiled on a fresh Dynamo with static shapes, then all are timed in interleaved
rounds (CUDA events around ``inner`` calls, median over rounds):

* eager; Inductor default; Inductor ``mode="reduce-overhead"`` (its CUDA graphs), the strongest
  Inductor setting for small-batch latency on a GPU;
* rewrite default; rewrite reduce-overhead (a CUDA graph per static graph); rewrite reduce-overhead
  with static kernels (Inductor's Triton kernels inside rewrite's plan).

Then the two-branch model (two chains of matmul+tanh, one in a ``stream_switch`` scope) with and
without its scope, on CUDA streams. Writes ``gpu_results.md`` (the table) into ``--out``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import rewrite  # noqa: E402
import rewrite.scope as scope  # noqa: E402
from rewrite import models  # noqa: E402
from _results import markdown_table  # noqa: E402

SEQ = 128
DTYPE = torch.float16


def _rewrite(mode: str | None, static_kernels: bool = False, build_dir: str | None = None):
    config = rewrite.CompilerConfig()
    config.experimental_config.frozen_parameter = True
    if mode:
        config.mode = mode
    if static_kernels:
        config.experimental_config.aclgraph._aclnn_static_shape_kernel = True
        config.experimental_config.aclgraph._aclnn_static_shape_kernel_build_dir = build_dir
    return rewrite.get_backend(config)


def contenders(build_dir: str):
    return {
        "eager": lambda m: m,
        "inductor": lambda m: torch.compile(m, dynamic=False),
        "inductor reduce-overhead": lambda m: torch.compile(m, mode="reduce-overhead", dynamic=False),
        "rewrite": lambda m: torch.compile(m, backend=_rewrite(None), dynamic=False),
        "rewrite reduce-overhead": lambda m: torch.compile(m, backend=_rewrite("reduce-overhead"), dynamic=False),
        "rewrite RO+static kernels": lambda m: torch.compile(
            m, backend=_rewrite("reduce-overhead", True, build_dir), dynamic=False),
    }


def time_gpu(fn, *args, rounds: int = 15, inner: int = 20) -> list[float]:
    """Seconds per call, one sample per round of ``inner`` calls between CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(rounds):
        start.record()
        for _ in range(inner):
            fn(*args)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / inner)
    return samples


def bench_model(name: str, build, batch: int, build_dir: str, warm_calls: int) -> dict:
    torch.manual_seed(0)
    model = build().to(device="cuda", dtype=DTYPE).eval()
    ids = models.token_batch(batch, SEQ, vocab=1024).cuda()
    with torch.no_grad():
        want = model(ids)[0]
    fns, compile_s, errors = {}, {}, {}
    for label, make in contenders(build_dir).items():
        torch._dynamo.reset()
        fn = make(model)
        t0 = time.perf_counter()
        try:
            with torch.no_grad():
                for _ in range(warm_calls):  # past rewrite's tier-up and Inductor's CUDA-graph warm-up
                    got = fn(ids)[0]
                torch.cuda.synchronize()
            torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
        except Exception as e:  # noqa: BLE001 - a failing contender is a row, not the end of the run
            errors[label] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            print(f"  {name} b{batch} {label}: FAILED {errors[label]}", flush=True)
            continue
        compile_s[label] = time.perf_counter() - t0
        fns[label] = fn
        print(f"  {name} b{batch} {label}: ready in {compile_s[label]:.1f} s", flush=True)
    samples = {label: [] for label in fns}
    with torch.no_grad():
        for _ in range(3):  # interleaved: each contender's rounds alternate with the others'
            for label, fn in fns.items():
                samples[label] += time_gpu(fn, ids, rounds=5)
    return {"samples": {k: statistics.median(v) for k, v in samples.items()}, "compile": compile_s, "errors": errors}


class TwoBranches(torch.nn.Module):
    def __init__(self, n: int, depth: int, streams: bool):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(n, n, generator=g) / n ** 0.5)
                                        for _ in range(2 * depth))
        self.depth, self.streams = depth, streams

    def forward(self, a, b):
        for i in range(self.depth):
            a = torch.tanh(a @ self.w[i])
        if self.streams:
            with scope.stream_switch("1"):
                for i in range(self.depth):
                    b = torch.tanh(b @ self.w[self.depth + i])
        else:
            for i in range(self.depth):
                b = torch.tanh(b @ self.w[self.depth + i])
        return a, b


def bench_streams(n: int, depth: int = 6) -> tuple:
    g = torch.Generator().manual_seed(1)
    a, b = (torch.randn(n, n, generator=g).to("cuda", DTYPE) for _ in range(2))
    fns = {}
    for streams in (False, True):
        torch._dynamo.reset()
        model = TwoBranches(n, depth, streams).to("cuda", DTYPE).eval()
        fn = torch.compile(model, backend=rewrite.get_backend(rewrite.CompilerConfig()), fullgraph=True)
        with torch.no_grad():
            for _ in range(12):
                out = fn(a, b)
            want = model.__class__.forward(model, a, b)
            torch.testing.assert_close(out, want, rtol=2e-2, atol=2e-2)
        fns["two streams" if streams else "one stream"] = fn
    samples = {k: [] for k in fns}
    with torch.no_grad():
        for _ in range(3):
            for k, fn in fns.items():
                samples[k] += time_gpu(fn, a, b, rounds=5)
    med = {k: statistics.median(v) for k, v in samples.items()}
    return n, med["one stream"], med["two streams"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"))
    parser.add_argument("--quick", action="store_true", help="batch 1 only, one model")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/gpu.py needs a CUDA device")
    os.makedirs(args.out, exist_ok=True)
    build_dir = tempfile.mkdtemp(prefix="rewrite-gpu-build-")  # private (0700), as static-kernel folders must be
    builds = {"BERT (4x256)": lambda: models.bert(layers=4, hidden=256, heads=4, vocab=1024),
              "GPT-2 (4x256)": lambda: models.gpt2(layers=4, hidden=256, heads=4, vocab=1024)}
    batches = [1] if args.quick else [1, 16]
    if args.quick:
        builds = dict(list(builds.items())[:1])
    device = torch.cuda.get_device_name()
    lines = [f"GPU figures: {device}, torch {torch.__version__}, CUDA {torch.version.cuda}, fp16, seq {SEQ}; "
             f"load average {os.getloadavg()[0]:.2f} before", ""]
    labels = list(contenders(build_dir))
    rows = []
    for name, build in builds.items():
        for batch in batches:
            r = bench_model(name, build, batch, build_dir, warm_calls=12)
            eager = r["samples"].get("eager")
            cells = []
            for label in labels:
                if label in r["samples"]:
                    t = r["samples"][label]
                    cells.append(f"{t * 1e3:.3f} ms ({eager / t:.2f}x)" if eager else f"{t * 1e3:.3f} ms")
                else:
                    cells.append("failed: " + r["errors"].get(label, "?"))
            rows.append([name, batch] + cells)
            print(" | ".join(str(c) for c in rows[-1]), flush=True)
            compile_row = [f"{r['compile'].get(label, float('nan')):.1f} s" for label in labels]
            rows.append([name + " (first calls, s)", batch] + compile_row)
    lines += [markdown_table(["model", "batch"] + labels, rows), "", "Latency per call (median of interleaved rounds, CUDA events), speed-up over eager in "
                      "brackets; the '(first calls, s)' rows are the wall time of the first 12 calls (compile "
                      "and warm-up).", ""]
    stream_rows = [bench_streams(n) for n in ((256, 1024) if not args.quick else (1024,))]
    lines.append(markdown_table(["two-branch model, n", "one stream", "stream scope", "ratio"],
                                [[n, f"{one * 1e3:.3f} ms", f"{two * 1e3:.3f} ms", f"{one / two:.2f}x"]
                                 for n, one, two in stream_rows]))
    lines += ["", f"load average {os.getloadavg()[0]:.2f} after"]
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(args.out, "gpu_results.md"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
