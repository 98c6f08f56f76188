"""Tensor parallelism on this machine: per-step latency of a sharded block on 2 gloo ranks.

    .venv/bin/python benchmarks/distributed.py [--hidden 256] [--heads 8] [--seq 64] [--batch 4] [--repeat 30] [--record]

Spawns 2 ranks (torch.multiprocessing, gloo, localhost) and shards each block with
``parallelize_module`` as examples/tensor_parallel.py does (Q/K/V and the MLP's first layer
column-wise, the attention output and the MLP's second layer row-wise: one all_reduce each). Cases:

* the GPT-2-style block of the example (attention, then MLP): each all_reduce's result is needed
  at once, so there is nothing to overlap it with;
* a parallel block (GPT-J style: x + attn(ln1(x)) + mlp(ln2(x))): the attention's all_reduce is
  independent of the MLP's compute. "rewrite" runs it on one stream, where the collectives are
  issued as early as their inputs allow (gloo reduces in the background) and waited for where read;
  "rewrite, stream" puts the attention's output projection (its all_reduce and wait included) in
  ``rewrite.scope.stream_switch("1")``, so the wait blocks a worker thread, not the caller. In the
  default mode such a graph also tiers up on one stream and keeps the faster form, measured on its
  calls (rewrite.exec.stream_choice); the script says which form rank 0 kept.

Each model is checked against the unsharded block in eager mode, called past the tier-up (and past
the choice of form), then
timed in interleaved rounds (the ranks start each step together; median per step, rank 0's clock).
Prints a table; ``--record`` writes it into benchmarks/RESULTS.md (section "Tensor parallelism").
Two ranks share this machine's cores: each rank gets half of them (torch.set_num_threads).
"""
from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import socket
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
import tensor_parallel as tp  # noqa: E402


class ParallelBlock(tp.Block):
    """x + attn(ln1(x)) + mlp(ln2(x)); ``scoped``: the attention's output projection on stream "1"."""

    def __init__(self, hidden: int, heads: int, scoped: bool = False):
        super().__init__(hidden, heads)
        self.scoped = scoped

    def forward(self, x):
        import rewrite

        b, t, _ = x.shape
        y = self.ln1(x)
        head = x.shape[-1] // self.heads
        q, k, v = (proj(y).view(b, t, -1, head).transpose(1, 2) for proj in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
        if self.scoped:
            with rewrite.scope.stream_switch("1"):
                attn = self.o(a)  # the row-wise projection and its all_reduce + wait_tensor
        else:
            attn = self.o(a)
        return x + attn + self.down(F.gelu(self.up(self.ln2(x))))


def _build(make, mesh):
    from torch.distributed.tensor.parallel import parallelize_module

    with torch.random.fork_rng():
        torch.manual_seed(0)
        reference = make().eval()
    return reference, parallelize_module(copy.deepcopy(reference), mesh, tp.tp_plan())


def _rank(rank: int, world: int, port: str, opts: dict, out: str) -> None:
    import rewrite
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=port)
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    mesh = init_device_mesh("cpu", (world,))
    hidden, heads = opts["hidden"], opts["heads"]
    x = torch.randn(opts["batch"], opts["seq"], hidden, generator=torch.Generator().manual_seed(1))

    backends = {}

    def compiled(model):
        backends[id(model)] = backend = rewrite.get_backend(rewrite.CompilerConfig())
        return torch.compile(model, backend=backend, fullgraph=True)

    cases = []
    reference, sharded = _build(lambda: tp.Block(hidden, heads), mesh)
    cases.append(("GPT-2-style block", reference, {"eager": sharded, "rewrite": compiled(sharded)}))
    reference, sharded = _build(lambda: ParallelBlock(hidden, heads), mesh)
    scoped = copy.deepcopy(sharded)
    scoped.scoped = True
    cases.append(("parallel block", reference, {"eager": sharded, "rewrite": compiled(sharded),
                                                "rewrite, stream": compiled(scoped)}))
    scoped_backend = backends[id(scoped)]
    from rewrite.exec.stream_choice import TRIALS

    warm_calls = rewrite.CompilerConfig().exec.tier_up_calls + 2 * TRIALS + 2
    rows = []
    with torch.no_grad():
        for name, ref, models in cases:
            want = ref(x)
            for label, model in models.items():
                for _ in range(warm_calls):  # past the tier-up (and a scoped graph's choice of form)
                    torch.testing.assert_close(model(x), want, atol=1e-4, rtol=1e-4)
            samples = {label: [] for label in models}
            for _ in range(opts["repeat"]):
                for label, model in models.items():  # interleaved: drift hits every model alike
                    dist.barrier()
                    t0 = time.perf_counter()
                    model(x)
                    samples[label].append(time.perf_counter() - t0)
            rows.append([name] + [statistics.median(samples[label]) * 1e3 if label in samples else None
                                  for label in ("eager", "rewrite", "rewrite, stream")])
    streams = scoped_backend.report.applied().get("streams", 1)
    assert streams == 2, f"the scoped model ran on {streams} stream(s): {scoped_backend.report}"
    kept = [n for g in scoped_backend.report.graphs for n in g.notes if "stream scopes on CPU" in n]
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"rows": rows, "kept": kept}, f)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=30, help="timed steps per model")
    parser.add_argument("--record", action="store_true", help="write the table into benchmarks/RESULTS.md")
    opts = parser.parse_args()
    if opts.heads % 2 or opts.hidden % opts.heads:
        raise SystemExit("--heads must be even (2 ranks) and divide --hidden")
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = str(s.getsockname()[1])
    out = os.path.join(tempfile.mkdtemp(prefix="bench-distributed-"), "rows.json")
    torch.multiprocessing.spawn(_rank, args=(2, port, vars(opts), out), nprocs=2, join=True)
    with open(out) as f:
        result = json.load(f)
    rows = result["rows"]

    from _results import machine_line, markdown_table, record_section

    def ms(v):
        return "-" if v is None else f"{v:.3f}"

    def ratio(a, b):
        return "-" if a is None or b is None else f"{a / b:.2f}x"

    headers = ["case", "eager ms/step", "rewrite ms/step", "rewrite, stream ms/step", "rewrite vs eager",
               "stream vs rewrite"]
    table = markdown_table(headers, [[name, ms(e), ms(r), ms(s), ratio(e, r), ratio(r, s)] for name, e, r, s in rows])
    what = (f"2 gloo ranks on this machine, hidden {opts.hidden}, {opts.heads} heads, batch {opts.batch} x "
            f"{opts.seq} tokens, median of {opts.repeat} steps")
    kept = "; ".join(result["kept"]) or "no stream-scope choice was made (no tier-up)"
    print(what)
    print(table)
    print(f"rank 0, the scoped parallel block: {kept}")
    if opts.record:
        record_section("distributed", "\n".join(["## Tensor parallelism (`benchmarks/distributed.py`)", "",
                                                 machine_line(), what, "", table, "",
                                                 f"Rank 0, the scoped parallel block: {kept}."]))


if __name__ == "__main__":
    main()
