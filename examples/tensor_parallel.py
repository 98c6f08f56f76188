"""A tensor-parallel transformer block compiled with rewrite, checked against the unsharded model.

    torchrun --nproc-per-node 2 examples/tensor_parallel.py

Each rank builds the same GPT-2-style block (pre-norm causal attention + MLP, hidden 64, 4 heads;
same seed, so the same weights), shards a copy with ``parallelize_module`` on a 1-D device mesh
(Q/K/V and the MLP's first layer column-wise, the attention output and the MLP's second layer
row-wise: one all_reduce each), compiles it with ``torch.compile(backend="rewrite",
fullgraph=True)`` with batch gears 1, 2 and 4, and checks every gear against the unsharded
model in eager mode, past the tier-up. Rank 0 prints the per-step latency of the sharded block in
eager mode and compiled with rewrite. Exits non-zero on every rank when any rank's results differ.

Runs on CPU with gloo (``--backend nccl`` with CUDA devices is untested). `tests/test_tensor_parallel.py`
runs this exact command; `benchmarks/distributed.py` measures the same block.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

HIDDEN, HEADS, SEQ = 64, 4, 16
GEARS = [1, 2, 4]


class Block(nn.Module):
    """A GPT-2-style block: x + attn(ln1(x)), then + mlp(ln2(x)); plain torch."""

    def __init__(self, hidden: int = HIDDEN, heads: int = HEADS):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
        self.o = nn.Linear(hidden, hidden)
        self.up, self.down = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        b, t, _ = x.shape
        y = self.ln1(x)
        # -1: the local number of heads (a rank holds heads / world of them once sharded)
        head = x.shape[-1] // self.heads
        q, k, v = (proj(y).view(b, t, -1, head).transpose(1, 2) for proj in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


def tp_plan() -> dict:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "o": RowwiseParallel(),
            "up": ColwiseParallel(), "down": RowwiseParallel()}


def build(mesh, seed: int = 0) -> tuple[nn.Module, nn.Module]:
    """(the unsharded block, a sharded copy), both in eval mode, from the same seed on every rank."""
    from torch.distributed.tensor.parallel import parallelize_module

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        reference = Block().eval()
    sharded = parallelize_module(copy.deepcopy(reference), mesh, tp_plan())
    return reference, sharded


def batch(size: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(size, SEQ, HIDDEN, generator=torch.Generator().manual_seed(seed))


def per_step_ms(fn, x, steps: int) -> float:
    """Median milliseconds of ``fn(x)`` over ``steps`` calls, the ranks starting each call together."""
    times = []
    for _ in range(steps):
        dist.barrier()
        t0 = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2] * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per model (default 30)")
    parser.add_argument("--timeout-s", type=float, default=120.0,
                        help="the process group's timeout: how long a rank waits for a peer that failed")
    args = parser.parse_args()

    import rewrite
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    if HEADS % world:
        raise SystemExit(f"{HEADS} heads do not split over {world} ranks")
    mesh = init_device_mesh("cpu", (world,))
    reference, sharded = build(mesh)
    compiled = torch.compile(sharded, backend="rewrite", fullgraph=True)

    failures = []
    with torch.no_grad():
        first = batch(max(GEARS))
        rewrite.inference.set_dim_gears(first, dim_gears={0: GEARS})
        compiled(first)  # compiles every gear
        calls = rewrite.CompilerConfig().exec.tier_up_calls + 2  # past the tier-up
        for size in GEARS:
            x = batch(size, seed=size)
            want = reference(x)
            for call in range(calls):
                got = compiled(x)
                if not torch.allclose(got, want, atol=1e-4, rtol=1e-4):
                    failures.append(f"rank {rank}: batch {size}, call {call}: max difference "
                                    f"{(got - want).abs().max().item():.3g}")
                    break
        x = batch(max(GEARS))
        eager_ms = per_step_ms(sharded, x, args.steps)
        rewrite_ms = per_step_ms(compiled, x, args.steps)

    bad = torch.tensor([len(failures)])
    dist.all_reduce(bad)  # every rank exits with the same status
    for f in failures:
        print(f"MISMATCH {f}", file=sys.stderr, flush=True)
    if rank == 0:
        print(f"tensor-parallel block (hidden {HIDDEN}, {HEADS} heads, batch {max(GEARS)} x {SEQ}) on {world} ranks "
              f"({dist.get_backend()}), median of {args.steps} steps:")
        print(f"  {'eager':<8} {eager_ms:8.3f} ms/step")
        print(f"  {'rewrite':<8} {rewrite_ms:8.3f} ms/step  ({eager_ms / rewrite_ms:.2f}x)")
        print("all ranks match the unsharded model at every gear" if not bad.item()
              else f"{bad.item()} mismatch(es): see the MISMATCH lines")
    dist.barrier()
    dist.destroy_process_group()
    return 1 if bad.item() else 0


if __name__ == "__main__":
    sys.exit(main())
