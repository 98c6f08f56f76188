"""LLM decode: tokens per second of transformers' ``generate`` with a static cache, ``model.forward`` compiled.

The recipe a user serving a small decoder on CPU follows (issue 28):

    model.forward = torch.compile(model.forward, backend=..., dynamic=False)
    model.generate(input_ids, max_new_tokens=N, do_sample=False, cache_implementation="static")

With a static cache every decode step has the same shapes, so ``forward`` compiles two static graphs
(the prompt's prefill and the one-token step) and the step graph runs N - 1 times per ``generate``.
Models: a Llama-style and a GPT-2-style causal LM (random weights, no download; sizes in `MODELS`),
batch 1, a 16-token prompt, greedy decoding. Contenders, each on its own copy of the model:

* ``eager``: the same static-cache ``generate``, nothing compiled;
* ``inductor``: ``torch.compile(model.forward, dynamic=False)``;
* ``inductor-freezing``: the same with ``options={"freezing": True}``;
* ``rewrite``: rewrite's default mode (tiers up after its first step calls);
* ``rewrite-frozen``: the default mode with ``frozen_parameter = True``;
* ``rewrite-ro-sk``: reduce-overhead with static kernels, frozen;
* ``inductor-freezing-inputs`` and ``rewrite-ro-sk-inputs``: the same two with Dynamo checking only the
  inputs on each step (``options={"guard_filter_fn": rewrite.inference.input_guards}``: the model's guards
  dropped, the opt-in of `rewrite.input_guards`); both sides get it, so the pair measures what dropping the
  model's guards saves a decode step, and the best of each side still compares like with like.

Each contender's first ``generate`` compiles (its time less eager's is the compile time) and a second
one warms up (rewrite tiers up within it); then ``--repeat`` rounds in which the contenders take turns,
one ``generate`` each, and the median gives tokens/s. Every contender's tokens are compared with
eager's (greedy: equal tokens expected; a differing count is reported, not hidden).

    .venv/bin/python benchmarks/decode.py                 # records its section of RESULTS.md
    .venv/bin/python benchmarks/decode.py --new-tokens 32 --repeat 3 --no-record
"""
from __future__ import annotations

import argparse
import copy
import functools
import logging
import os
import statistics
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from _results import cold_caches, machine_line, markdown_table, record_section, save_plot  # noqa: E402

import rewrite  # noqa: E402
from rewrite.backend import get_backend  # noqa: E402
from rewrite.demo import with_own_code  # noqa: E402

CONTENDERS = ("eager", "inductor", "inductor-freezing", "rewrite", "rewrite-frozen", "rewrite-ro-sk",
              "inductor-freezing-inputs", "rewrite-ro-sk-inputs")
INPUT_GUARDS = {"guard_filter_fn": rewrite.inference.input_guards}  # the "-inputs" contenders' torch.compile option
PROMPT = 16
BATCH = 1


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=1024, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256))


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=1024, n_embd=128, n_layer=2, n_head=4, n_positions=256))


MODELS = {"llama": _llama, "gpt2": _gpt2}


def _model(name: str):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        m = MODELS[name]().eval()
    m.generation_config.pad_token_id = m.generation_config.eos_token_id = None  # never stop early: N tokens each
    return m


def _own_forward(m, tag: str):
    """``m.forward`` behind a code object of its own (`rewrite.demo.with_own_code`): two contenders compiling the same
    ``forward`` with equal backends (Inductor freezing with and without a guard filter) would otherwise share the
    first one's graph and guards. Its signature is forward's (generate inspects it)."""
    return functools.update_wrapper(with_own_code(m.forward, f"forward_{tag}"), m.forward)


def _compiled(model, contender: str, build_dir: str):
    if contender == "eager":
        return model
    m = copy.deepcopy(model)
    tag = contender.replace("-", "_")
    guards = INPUT_GUARDS if contender.endswith("-inputs") else {}
    if contender.startswith("inductor"):
        options = {"freezing": True} if contender.startswith("inductor-freezing") else {}
        m.forward = torch.compile(_own_forward(m, tag), dynamic=False, options={**options, **guards} or None)
        return m
    config = rewrite.CompilerConfig()
    if contender in ("rewrite-frozen", "rewrite-ro-sk", "rewrite-ro-sk-inputs"):
        config.experimental_config.frozen_parameter = True
    if contender.startswith("rewrite-ro-sk"):
        os.makedirs(build_dir, mode=0o700, exist_ok=True)
        config.mode = "reduce-overhead"
        config.experimental_config.aclgraph._aclnn_static_shape_kernel = True
        config.experimental_config.aclgraph._aclnn_static_shape_kernel_build_dir = build_dir
    m.forward = torch.compile(_own_forward(m, tag), backend=get_backend(config), dynamic=False, options=guards or None)
    return m


def _generate(model, ids, new_tokens: int):
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                              cache_implementation="static")


def run_model(name: str, new_tokens: int, repeat: int, build_root: str) -> dict:
    base = _model(name)
    ids = torch.randint(4, 1024, (BATCH, PROMPT), generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    want = _generate(base, ids, new_tokens)
    eager_first = time.perf_counter() - t0
    row = {"model": name, "tokens/s": {}, "compile s": {}, "match": {}, "error": {}}
    models = {}
    for c in CONTENDERS:
        try:
            m = _compiled(base, c, os.path.join(build_root, f"{name}-{c}"))
            t0 = time.perf_counter()
            got = _generate(m, ids, new_tokens)
            row["compile s"][c] = max(0.0, time.perf_counter() - t0 - eager_first) if c != "eager" else 0.0
            _generate(m, ids, new_tokens)  # warm: rewrite's step graph tiers up in here
            row["match"][c] = f"{int((got == want).all(dim=0).sum())}/{want.shape[1]}"
            models[c] = m
        except Exception as e:  # noqa: BLE001 - one contender's failure is its result
            row["error"][c] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]
    times = {c: [] for c in models}
    for _ in range(repeat):
        for c, m in models.items():
            t0 = time.perf_counter()
            _generate(m, ids, new_tokens)
            times[c].append(time.perf_counter() - t0)
    for c, t in times.items():
        row["tokens/s"][c] = BATCH * new_tokens / statistics.median(t)
    torch._dynamo.reset()
    return row


def section(rows: list[dict], args) -> str:
    headers = ["model", *(f"{c} tok/s" for c in CONTENDERS), "rewrite / inductor", "best rewrite / best inductor",
               "ro-sk-inputs / ro-sk", "compile s (" + ", ".join(CONTENDERS[1:]) + ")", "tokens equal to eager's"]

    def tps(r, c):
        return f"{r['tokens/s'][c]:.0f}" if c in r["tokens/s"] else f"ERROR: {r['error'].get(c, '?')}".replace("|", "/")

    def ratio(r, ours, theirs):
        a = [r["tokens/s"][c] for c in ours if c in r["tokens/s"]]
        b = [r["tokens/s"][c] for c in theirs if c in r["tokens/s"]]
        return f"{max(a) / max(b):.2f}x" if a and b else "-"

    table = markdown_table(headers, [
        [r["model"], *(tps(r, c) for c in CONTENDERS), ratio(r, ["rewrite"], ["inductor"]),
         ratio(r, ["rewrite", "rewrite-frozen", "rewrite-ro-sk", "rewrite-ro-sk-inputs"],
               ["inductor", "inductor-freezing", "inductor-freezing-inputs"]),
         ratio(r, ["rewrite-ro-sk-inputs"], ["rewrite-ro-sk"]),
         ", ".join(f"{r['compile s'][c]:.1f}" if c in r["compile s"] else "-" for c in CONTENDERS[1:]),
         ", ".join(f"{c} {r['match'][c]}" for c in CONTENDERS[1:] if c in r["match"])] for r in rows])
    cmd = f".venv/bin/python benchmarks/decode.py --new-tokens {args.new_tokens} --repeat {args.repeat}"
    return "\n".join([
        "## LLM decode: static-cache `generate`, `model.forward` compiled (benchmarks/decode.py)",
        "",
        f"Command: `{cmd}`",
        "",
        machine_line(),
        f"Batch {BATCH}, a {PROMPT}-token prompt, {args.new_tokens} new tokens, greedy; tokens/s from the median of "
        f"{args.repeat} interleaved rounds (one `generate` per contender per round), after one compiling and one "
        "warm-up `generate` each. Higher is faster; the ratios are tokens/s over tokens/s. Compile: the first "
        "`generate` less eager's. 'tokens equal to eager's': positions where every row of the batch matches.",
        "",
        table,
    ])


def plot(rows: list[dict]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(CONTENDERS)
    for k, c in enumerate(CONTENDERS):
        ax.bar([i + k * width for i in range(len(rows))], [r["tokens/s"].get(c, 0) for r in rows], width, label=c)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))], [r["model"] for r in rows])
    ax.set_ylabel("tokens/s (higher is faster)")
    ax.legend(fontsize=7)
    save_plot(fig, "decode.png")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    logging.getLogger("rewrite").setLevel(logging.ERROR)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    torch._dynamo.config.cache_size_limit = 64
    cold_caches()
    build_root = tempfile.mkdtemp(prefix="decode-bench-")
    rows = []
    for name in [m for m in args.models.split(",") if m]:
        row = run_model(name, args.new_tokens, args.repeat, build_root)
        print(row, flush=True)
        rows.append(row)
    text = section(rows, args)
    print(text)
    if not args.no_record and set(args.models.split(",")) >= set(MODELS):
        plot(rows)
        record_section("decode", text)


if __name__ == "__main__":
    main()
