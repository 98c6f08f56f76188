"""rewrite on a CUDA GPU against eager and Inductor's strongest settings, at the sizes models are served at.

    python benchmarks/gpu.py --out DIR [--only static,gears,decode] [--quick]

Needs a CUDA device (CI has none); sized to finish in about 6 minutes on one H100/H200 (`--quick`: one
batch, fewer rounds, about 2 minutes). Writes ``gpu_results.md`` (the tables, with the device's name) into
``--out``; a session with a GPU copies it into benchmarks/RESULTS.md, "GPU". Every output is compared with
eager's on the GPU before anything is timed; a contender that fails is a row saying why, not the end.

Sections:

* **static**: BERT-base (12 x 768, transformers' ``BertModel``, sdpa) and a Llama-style decoder (8 x 1024,
  GQA 16/4 heads, vocab 32000) forward, fp16, sequence 128, batch 1 and 16. Contenders: eager; Inductor
  default; Inductor ``mode="reduce-overhead"``; rewrite's default mode past its tier-up (its Inductor
  build made on the call after its cold calls); rewrite reduce-overhead. Latency by CUDA events, interleaved rounds.
* **gears**: BERT-base with batch gears [1, 4, 16]: rewrite reduce-overhead and default mode with
  ``set_dim_gears``, Inductor reduce-overhead compiled per size (``dynamic=False``) and with
  ``dynamic=True``. Columns: wall time until every size is ready, latency at each size, and rewrite's
  CUDA-graph pool (predicted before capture, allocated, and the largest gear compiled alone).
* **decode**: the Llama-style decoder, prompt 32, 64 new tokens, greedy, transformers' static-cache
  ``generate``: true eager (``disable_compile=True``); ``generate``'s own compile (Inductor,
  reduce-overhead); rewrite through transformers' door (``generation_config.compile_config =
  CompileConfig(backend="rewrite")``), and the same with Dynamo checking only the inputs (a reduce-overhead
  backend object, ``mode=None, options={"guard_filter_fn": rewrite.inference.input_guards}``: torch.compile takes
  a mode or options, not both); rewrite's default mode through the same door (``mode=None``);
  ``model.forward`` compiled with rewrite reduce-overhead and ``generate``'s own compile switched off.
  Tokens per second (median of rounds); every contender's tokens compared with eager's.
"""
from __future__ import annotations

import argparse
import copy
import logging
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import rewrite  # noqa: E402
from rewrite.demo import with_own_code  # noqa: E402
from _results import markdown_table  # noqa: E402

SEQ = 128
DTYPE = torch.float16
GEARS = [1, 4, 16]
DEVICE = "cuda"
BERT = {}  # BertConfig's defaults: BERT-base
LLAMA = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
             num_key_value_heads=4, max_position_embeddings=512)


def _smoke() -> None:
    """`--smoke`: the whole script on the CPU with tiny models, to check its logic where there is no GPU."""
    global SEQ, DTYPE, DEVICE, BERT, LLAMA
    SEQ, DTYPE, DEVICE = 16, torch.float32, "cpu"
    BERT = dict(vocab_size=1000, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    LLAMA = dict(vocab_size=32000, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=128)


class _FirstOutput(torch.nn.Module):
    """A transformers model whose call returns one tensor: BERT's hidden states, a causal LM's logits (no cache)."""

    def __init__(self, model, **kwargs):
        super().__init__()
        self.model, self.kwargs = model, kwargs

    def forward(self, ids):
        out = self.model(ids, **self.kwargs)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _bert_base():
    from transformers import BertConfig, BertModel

    return _FirstOutput(BertModel(BertConfig(attn_implementation="sdpa", **BERT)))


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(attn_implementation="sdpa", **LLAMA))


MODELS = {"BERT-base (12x768)": _bert_base, "Llama-style (8x1024)": lambda: _FirstOutput(_llama(), use_cache=False)}


def _model(build):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return build().to(device=DEVICE, dtype=DTYPE).eval()


def _ids(batch: int, seq: int = SEQ, seed: int = 0) -> torch.Tensor:
    return torch.randint(4, 1000, (batch, seq), generator=torch.Generator().manual_seed(seed)).to(DEVICE)


def _backend(mode: str | None):
    config = rewrite.CompilerConfig()
    if mode:
        config.mode = mode
    return rewrite.get_backend(config)


STATIC = {
    "eager": lambda m: m,
    "inductor": lambda m: torch.compile(m, dynamic=False),
    "inductor reduce-overhead": lambda m: torch.compile(m, mode="reduce-overhead", dynamic=False),
    "rewrite": lambda m: torch.compile(m, backend=_backend(None), dynamic=False),
    "rewrite reduce-overhead": lambda m: torch.compile(m, backend=_backend("reduce-overhead"), dynamic=False),
}


def time_gpu(fn, *args, rounds: int = 5, inner: int = 20) -> list[float]:
    """Seconds per call, one sample per round of ``inner`` calls between CUDA events."""
    if DEVICE == "cpu":  # --smoke
        samples = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            fn(*args)
            samples.append(time.perf_counter() - t0)
        return samples
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


def _warm(fn, args_of, sizes, calls: int = 12):
    """Calls past the tier-up (rewrite's cold calls and its build) and Inductor's CUDA-graph warm-up."""
    with torch.no_grad():
        for _ in range(calls):
            for s in sizes:
                fn(args_of(s))
        for _ in range(3):
            for s in sizes:
                fn(args_of(s))
    _sync()


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _ms(t: float) -> str:
    return f"{t * 1e3:.3f}"


def _error(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:140] if str(e) else ''}".replace("|", "/")


def bench_static(name: str, build, batches, rounds: int) -> list[list]:
    model = _model(build)
    rows = []
    for batch in batches:
        ids = _ids(batch)
        with torch.no_grad():
            want = model(ids).float()
        fns, ready, errors = {}, {}, {}
        for label, make in STATIC.items():
            t0 = time.perf_counter()
            try:
                fn = make(with_own_code(model, _tag(label, batch)))
                _warm(fn, lambda s: ids, [batch])
                with torch.no_grad():
                    got = fn(ids).float()
                torch.testing.assert_close(got, want, rtol=3e-2, atol=3e-2)
            except Exception as e:  # noqa: BLE001 - a failing contender is a row
                errors[label] = _error(e)
                print(f"  {name} b{batch} {label}: FAILED {errors[label]}", flush=True)
                continue
            ready[label] = time.perf_counter() - t0
            fns[label] = fn
            print(f"  {name} b{batch} {label}: ready in {ready[label]:.1f} s", flush=True)
        samples = {label: [] for label in fns}
        with torch.no_grad():
            for _ in range(rounds):  # interleaved
                for label, fn in fns.items():
                    samples[label] += time_gpu(fn, ids, rounds=2)
        med = {k: statistics.median(v) for k, v in samples.items()}
        eager = med.get("eager")
        cells = []
        for label in STATIC:
            if label in med:
                cells.append(f"{_ms(med[label])} ({eager / med[label]:.2f}x)" if eager else _ms(med[label]))
            else:
                cells.append("failed: " + errors.get(label, "?"))
        rows.append([name, batch] + cells)
        rows.append([name + " (ready, s)", batch] + [f"{ready[k]:.1f}" if k in ready else "-" for k in STATIC])
        print(" | ".join(str(c) for c in rows[-2]), flush=True)
    return rows


def _tag(*parts) -> str:
    """A name for a contender's own code object (`rewrite.demo.with_own_code`): each keeps its own Dynamo cache.
    A ``torch._dynamo.reset()`` between contenders would drop the earlier ones' graphs, and they would compile
    again inside the timed rounds, without what was set up before them (the gears' ``set_dim_gears``): on an
    H200 that timed rewrite's gears 4 and 16 as graphs compiled for those sizes alone, not as the gears."""
    return "".join(ch if ch.isalnum() else "_" for ch in "_".join(str(p) for p in parts))


def _pool_of(backend):
    pools = [g.memory for g in backend.report.graphs if g.memory is not None]
    return pools[0] if pools else None


class _CaptureEvents(logging.Handler):
    """Counts what rewrite's CUDA-graph code logs while the gears are timed: a capture, a gear whose in-place
    input moved, a call run uncaptured. Any of them during timing means a gear is not replaying its graph."""

    WORDS = ("captured", "moved", "uncaptured", "cannot be captured")

    def __init__(self):
        super().__init__(logging.INFO)
        self.counts: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        for word in self.WORDS:
            if word in text:
                self.counts[word] = self.counts.get(word, 0) + 1


def _why_slow(label: str, fn, events: _CaptureEvents) -> str:
    """A geared rewrite contender's slow-path counts and its capture events while timed (for the next lease)."""
    s = rewrite.stats(fn)
    return (f"{label}: while timed, capture events {events.counts or 'none'}; slow paths: uncaptured {s.uncaptured}, "
            f"tier_up_pending {s.tier_up_pending}, tier_up_refused {s.tier_up_refused}, dynamic_fallbacks "
            f"{s.dynamic_fallbacks}, recompiles {s.recompiles}, pads {s.pads}; calls per gear {s.gears}")


def bench_gears(rounds: int) -> tuple[list[list], list[str]]:
    model = _model(_bert_base)
    want = {}
    with torch.no_grad():
        for b in GEARS:
            want[b] = model(_ids(b)).float()
    contenders = {}

    def geared(mode):
        def make():
            backend = _backend(mode)
            fn = torch.compile(with_own_code(model, _tag("gears", mode)), backend=backend)
            first = _ids(GEARS[-1])
            rewrite.inference.set_dim_gears(first, {0: GEARS})
            with torch.no_grad():
                fn(first)
            return fn, backend
        return make

    contenders["rewrite reduce-overhead, gears"] = geared("reduce-overhead")
    contenders["rewrite default, gears"] = geared(None)
    contenders["inductor reduce-overhead, dynamic=False (a compile per size)"] = \
        lambda: (torch.compile(with_own_code(model, "gears_static"), mode="reduce-overhead", dynamic=False), None)
    contenders["inductor reduce-overhead, dynamic=True"] = \
        lambda: (torch.compile(with_own_code(model, "gears_dynamic"), mode="reduce-overhead", dynamic=True), None)
    fns, ready, errors, pools = {}, {}, {}, {}
    for label, make in contenders.items():
        t0 = time.perf_counter()
        try:
            fn, backend = make()
            _warm(fn, lambda s: _ids(s), GEARS)
            for b in GEARS:
                with torch.no_grad():
                    torch.testing.assert_close(fn(_ids(b)).float(), want[b], rtol=3e-2, atol=3e-2)
        except Exception as e:  # noqa: BLE001
            errors[label] = _error(e)
            print(f"  gears {label}: FAILED {errors[label]}", flush=True)
            continue
        ready[label] = time.perf_counter() - t0
        fns[label] = fn
        if backend is not None:
            pools[label] = _pool_of(backend)
        print(f"  gears {label}: all sizes ready in {ready[label]:.1f} s", flush=True)
    samples = {(label, b): [] for label in fns for b in GEARS}
    inputs = {b: _ids(b) for b in GEARS}
    events = {label: _CaptureEvents() for label in fns}
    rewrite_log = logging.getLogger("rewrite")
    level = rewrite_log.level
    rewrite_log.setLevel(logging.INFO)
    try:
        with torch.no_grad():
            for _ in range(rounds):
                for label, fn in fns.items():
                    rewrite_log.addHandler(events[label])
                    try:
                        for b in GEARS:
                            samples[(label, b)] += time_gpu(fn, inputs[b], rounds=2)
                    finally:
                        rewrite_log.removeHandler(events[label])
    finally:
        rewrite_log.setLevel(level)
    rows = []
    for label in contenders:
        if label not in fns:
            rows.append([label, "failed: " + errors.get(label, "?")] + ["-"] * len(GEARS))
            continue
        rows.append([label, f"{ready[label]:.1f}"] + [_ms(statistics.median(samples[(label, b)])) for b in GEARS])
    notes = [_why_slow(label, fns[label], events[label]) for label in fns if label.startswith("rewrite")]
    # The pool of every gear against the largest gear compiled alone.
    try:
        backend = _backend("reduce-overhead")
        fn = torch.compile(with_own_code(model, "largest_alone"), backend=backend, dynamic=False)
        with torch.no_grad():
            fn(_ids(GEARS[-1]))
        alone = _pool_of(backend)
        every = pools.get("rewrite reduce-overhead, gears")
        if alone is not None and every is not None and alone.allocated:
            notes.append(f"CUDA-graph pool, gears {GEARS}: {every}; the largest gear alone: allocated "
                         f"{alone.allocated / 2**20:.1f} MiB; all gears / largest alone = "
                         f"{every.allocated / alone.allocated:.2f}x")
    except Exception as e:  # noqa: BLE001
        notes.append(f"pool of the largest gear alone: failed ({_error(e)})")
    return rows, notes


def _generate(model, ids, new_tokens: int, **kw):
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                              cache_implementation="static", **kw)


def bench_decode(rounds: int, new_tokens: int = 64) -> list[list]:
    from transformers import CompileConfig

    base = _model(_llama)
    base.generation_config.pad_token_id = base.generation_config.eos_token_id = None
    ids = torch.randint(4, 32000, (1, 32), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    want = _generate(base, ids, new_tokens, disable_compile=True)

    def door(backend, mode="reduce-overhead", options=None):
        def make():
            m = copy.deepcopy(base)
            m.generation_config.compile_config = CompileConfig(backend=backend, mode=mode, options=options)
            return m, {}
        return make

    def forward_compiled():
        m = copy.deepcopy(base)
        m.forward = torch.compile(m.forward, backend=_backend("reduce-overhead"), dynamic=False)
        return m, {"disable_compile": True}

    contenders = {
        "eager (disable_compile=True)": lambda: (base, {"disable_compile": True}),
        "generate's own compile (Inductor)": lambda: (copy.deepcopy(base), {}),
        "rewrite: CompileConfig(backend='rewrite')": door("rewrite"),
        # torch.compile takes a mode or options, not both: reduce-overhead is the backend's own config here
        "rewrite, model's guards dropped: CompileConfig(backend=rewrite reduce-overhead, mode=None, "
        "options=input_guards)": door(_backend("reduce-overhead"), None, {"guard_filter_fn": rewrite.inference.input_guards}),
        "rewrite default mode: CompileConfig(backend='rewrite', mode=None)": door("rewrite", None),
        "rewrite reduce-overhead: model.forward compiled": forward_compiled,
    }
    runs, ready, errors, match = {}, {}, {}, {}
    for label, make in contenders.items():
        torch._dynamo.reset()
        t0 = time.perf_counter()
        try:
            m, kw = make()
            got = _generate(m, ids, new_tokens, **kw)
            _generate(m, ids, new_tokens, **kw)
            got = _generate(m, ids, new_tokens, **kw)
        except Exception as e:  # noqa: BLE001
            errors[label] = _error(e)
            print(f"  decode {label}: FAILED {errors[label]}", flush=True)
            continue
        ready[label] = time.perf_counter() - t0
        match[label] = f"{int((got == want).all(dim=0).sum())}/{want.shape[1]}"
        runs[label] = (m, kw)
        print(f"  decode {label}: ready in {ready[label]:.1f} s, tokens equal {match[label]}", flush=True)
    times = {label: [] for label in runs}
    for _ in range(rounds):
        for label, (m, kw) in runs.items():
            _sync()
            t0 = time.perf_counter()
            _generate(m, ids, new_tokens, **kw)
            _sync()
            times[label].append(time.perf_counter() - t0)
    anchor = "generate's own compile (Inductor)"
    rows = []
    for label in contenders:
        if label not in runs:
            rows.append([label, "failed: " + errors.get(label, "?"), "-", "-", "-"])
            continue
        tps = new_tokens / statistics.median(times[label])
        ref = new_tokens / statistics.median(times[anchor]) if anchor in times else None
        rows.append([label, f"{tps:.0f}", f"{tps / ref:.2f}x" if ref else "-", f"{ready[label]:.1f}", match[label]])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"))
    parser.add_argument("--only", default="static,gears,decode", help="sections, comma-separated")
    parser.add_argument("--quick", action="store_true", help="batch 1 only, fewer rounds")
    parser.add_argument("--smoke", action="store_true", help="on the CPU with tiny models: checks the script, "
                        "times nothing worth recording")
    args = parser.parse_args()
    if args.smoke:
        _smoke()
        args.quick = True
    elif not torch.cuda.is_available():
        sys.exit("benchmarks/gpu.py needs a CUDA device (--smoke runs it on the CPU with tiny models)")
    os.makedirs(args.out, exist_ok=True)
    sections = set(args.only.split(","))
    rounds = 2 if args.quick else 5
    device = torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU (--smoke: not GPU figures)"
    import transformers

    lines = [f"GPU figures: {device}, torch {torch.__version__}, CUDA {torch.version.cuda}, transformers "
             f"{transformers.__version__}, fp16; load average {os.getloadavg()[0]:.2f} before", ""]

    def flush():
        with open(os.path.join(args.out, "gpu_results.md"), "w") as f:
            f.write("\n".join(lines) + "\n")

    if "static" in sections:
        rows = []
        for name, build in MODELS.items():
            rows += bench_static(name, build, [1] if args.quick else [1, 16], rounds)
        lines += [f"### Static shapes, sequence {SEQ}: latency in ms (speed-up over eager)", "",
                  markdown_table(["model", "batch"] + list(STATIC), rows), "",
                  "Median of interleaved rounds of 20 calls between CUDA events; the '(ready, s)' rows are the "
                  "wall time until the contender was warm (compile, tier-up, capture).", ""]
        flush()
    if "gears" in sections:
        rows, notes = bench_gears(rounds)
        lines += [f"### Gears {GEARS} on BERT-base (batch gears, sequence {SEQ})", "",
                  markdown_table(["contender", "all sizes ready, s"] + [f"b{b} ms" for b in GEARS], rows), ""]
        lines += [f"- {n}" for n in notes] + [""]
        flush()
    if "decode" in sections:
        rows = bench_decode(rounds, new_tokens=4 if args.smoke else 64)
        lines += ["### Decode: Llama-style 8x1024 (GQA 16/4, vocab 32000), prompt 32, 64 new tokens, greedy, "
                  "static cache", "",
                  markdown_table(["contender", "tokens/s", "vs generate's own compile", "ready, s",
                                  "tokens equal to eager's"], rows), ""]
        flush()
    lines.append(f"load average {os.getloadavg()[0]:.2f} after")
    flush()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
