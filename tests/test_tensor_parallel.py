"""Tensor-parallel models (issue 29): a GPT-2-style block sharded with ``parallelize_module`` on 2 gloo ranks.

Every multi-rank test runs a script in a subprocess (hard timeout) that spawns 2 ranks with
``torch.multiprocessing.spawn``; each rank writes each case's outcome to ``{case}.{rank}.json`` and
the tests read them (two ranks' stdout interleaves). One run of the "main" script serves several
tests (a module fixture): gears in both modes past the tier-up, the order of collectives, stream
overlap, auto_streams. Rank failures and the cache each need their own processes.

The block, its sharding plan and its inputs are the example's (examples/tensor_parallel.py).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(REPO, "examples")
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")

COMMON = r'''
import datetime, json, os, sys, threading, time, traceback
import torch, torch.distributed as dist

sys.path.insert(0, os.environ["TP_EXAMPLES"])
import tensor_parallel as tp  # the example's block, plan and inputs

OUT = sys.argv[1]


def init(rank, world, timeout_s):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = sys.argv[2]
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh("cpu", (world,))


def case(rank, name, fn):
    """Run one case; its outcome (value or error) goes to {name}.{rank}.json."""
    t0 = time.perf_counter()
    try:
        out = {"ok": True, "value": fn()}
    except Exception as e:
        out = {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-6000:]}
    out["seconds"] = time.perf_counter() - t0
    with open(os.path.join(OUT, f"{name}.{rank}.json"), "w") as f:
        json.dump(out, f)


def finish():
    # The ranks' work is written; skip C++ teardown at exit (see tests/test_export.py, MP_COMMON).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn(run, *args):
    torch.multiprocessing.spawn(run, args=(2,) + args, nprocs=2, join=True)


def collectives_fx(gm):
    from rewrite.ops import is_collective
    return [[str(n.target)] + [a for a in n.args[1:] if isinstance(a, (str, int))]
            for n in gm.graph.nodes if n.op == "call_function" and is_collective(n.target)]


def collectives_ir(graph):
    from rewrite.ops import is_collective
    return [[n.op] + [a for a in n.args[1:] if isinstance(a, (str, int))]
            for n in graph.nodes if n.kind == "call" and is_collective(n.target)]


def capturing_backend(config):
    """A backend keeping the collectives of each traced (AOT FX) graph, each optimized graph and
    each static graph built (one per gear)."""
    import rewrite

    class Capturing(rewrite.backend.RewriteBackend):
        def __init__(self, config):
            super().__init__(config)
            self.fx, self.optimized, self.built = [], [], []

        def compile_graph(self, gm, name, unit, frozen, gear_spec, example_inputs=None):
            self.fx.append(collectives_fx(gm))
            build = rewrite.exec.build_executable

            def spy(graph, *args, **kwargs):
                self.built.append({"name": graph.name, "collectives": collectives_ir(graph),
                                   "streams": {n.name: n.stream for n in graph.nodes if n.kind == "call"}})
                return build(graph, *args, **kwargs)

            rewrite.exec.build_executable = spy  # rewrite.pipeline calls it through the package
            try:
                return super().compile_graph(gm, name, unit, frozen, gear_spec, example_inputs)
            finally:
                rewrite.exec.build_executable = build

        def on_optimized(self, graph, name, frozen, gear_spec):
            self.optimized.append(collectives_ir(graph))

    return Capturing(config)


def max_diff(got, want):
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    return float((got - want).abs().max())
'''

MAIN = COMMON + r'''

STAMPS = []


@torch.library.custom_op("tp_test::stamp", mutates_args=())
def stamp(x: torch.Tensor, label: str) -> torch.Tensor:
    """Records when and on which thread it ran; a copy of x."""
    STAMPS.append((label, time.perf_counter(), threading.get_ident()))
    return x.clone()


@stamp.register_fake
def _(x, label):
    return torch.empty_like(x)


def sharded_gears(mesh, mode, first):
    """The sharded block at every gear, first called at batch ``first``, each gear past the tier-up."""
    import rewrite

    reference, sharded = tp.build(mesh)
    config = rewrite.CompilerConfig()
    if mode:
        config.mode = mode
    backend = capturing_backend(config)
    compiled = torch.compile(sharded, backend=backend, fullgraph=True)
    traced_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]  # the process's count
    x = tp.batch(first)
    rewrite.inference.set_dim_gears(x, dim_gears={0: [1, 2, 4]})
    diffs = [max_diff(compiled(x), reference(x))]
    calls = rewrite.CompilerConfig().exec.tier_up_calls + 2
    for size in (4, 1, 2):
        x = tp.batch(size, seed=10 + size)
        want = reference(x)
        diffs += [max_diff(compiled(x), want) for _ in range(calls)]
    notes = [n for g in backend.report.graphs for n in g.notes]
    return {"diffs": len(diffs), "max_diff": max(diffs), "calls_per_gear": calls,
            "unique_graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"] - traced_before,
            "tiered_up": sum("tiered up" in n for n in notes), "planned": sum(n.startswith("plan ") for n in notes),
            "gears": [list(k) for g in backend.report.graphs for k in g.gears],
            "fx": backend.fx, "optimized": backend.optimized, "built": backend.built, "notes": notes}


class TwoBiases(torch.nn.Module):
    """Two all_reduces that differ only by a bias: equal biases on rank 0 (zeros), different on rank 1.
    With frozen weights rank 0's constants are equal, so merging equal collectives would make rank 0
    issue one all_reduce where rank 1 issues two."""

    def __init__(self, rank):
        super().__init__()
        self.b1 = torch.nn.Parameter(torch.zeros(4) if rank == 0 else torch.ones(4))
        self.b2 = torch.nn.Parameter(torch.zeros(4) if rank == 0 else torch.full((4,), 2.0))
        self.w = torch.nn.Parameter(torch.full((4,), float(rank + 1)))

    def forward(self, x, y):
        c10d, group = torch.ops._c10d_functional, dist.group.WORLD.group_name
        a = c10d.wait_tensor(c10d.all_reduce(x + self.b1, "sum", group))
        b = c10d.wait_tensor(c10d.all_reduce(x + self.b2, "sum", group))
        g = c10d.wait_tensor(c10d.all_gather_into_tensor(y * 2, 2, group))
        w = c10d.wait_tensor(c10d.all_reduce(self.w * 3, "max", group))  # on a frozen weight only: never folded
        s = c10d.wait_tensor(c10d.reduce_scatter_tensor(g + 1, "sum", 2, group))
        return a * b + w, g, s


def functional_order(rank):
    import rewrite

    model = TwoBiases(rank).eval()
    config = rewrite.CompilerConfig()
    config.experimental_config.frozen_parameter = True
    backend = capturing_backend(config)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    diffs = []
    for call in range(rewrite.CompilerConfig().exec.tier_up_calls + 2):  # past the tier-up
        x, y = torch.full((4,), float(call + rank)), torch.arange(6.0).reshape(2, 3) + call
        for got, want in zip(compiled(x, y), model(x, y)):
            diffs.append(max_diff(got, want))
    notes = [n for g in backend.report.graphs for n in g.notes]
    return {"max_diff": max(diffs), "fx": backend.fx, "optimized": backend.optimized, "built": backend.built,
            "tiered_up": sum("tiered up" in n for n in notes)}


def overlap(rank, scoped):
    """An all_reduce and its wait in a stream scope; independent compute and a second all_reduce on
    the default stream. Rank 1 starts its call 0.3 s late, so rank 0's wait blocks that long."""
    import rewrite

    c10d, group = torch.ops._c10d_functional, dist.group.WORLD.group_name

    def f(a, b, w):
        if scoped:
            with rewrite.scope.stream_switch("1"):
                r = stamp(c10d.wait_tensor(c10d.all_reduce(a, "sum", group)), "after_wait")
        else:
            r = stamp(c10d.wait_tensor(c10d.all_reduce(a, "sum", group)), "after_wait")
        m = stamp(b @ w, "default_stream_compute")
        s = c10d.wait_tensor(c10d.all_reduce(m, "sum", group))  # issued after the first on every rank
        return r + s.sum()

    # Tier-up off: the worker threads run every call. (With it on, a scoped CPU graph also tiers up on one
    # stream and keeps whichever form is faster on its calls, exec.stream_choice: checked below.)
    config = rewrite.CompilerConfig()
    config.exec.tier_up_calls = 0
    backend = capturing_backend(config)
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    g = torch.Generator().manual_seed(rank)
    a, b, w = torch.randn(4, 4, generator=g), torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g)
    diffs = [max_diff(compiled(a, b, w), f(a, b, w))]
    dist.barrier()
    STAMPS.clear()
    t0 = time.perf_counter()
    if rank == 1:
        time.sleep(0.3)
    out = compiled(a, b, w)
    stamps = {label: {"at": t - t0, "caller_thread": tid == threading.get_ident()} for label, t, tid in STAMPS}
    diffs.append(max_diff(out, f(a, b, w)))
    # The default mode: one-stream calls, the tier-up, then both forms alternately until one is kept (the
    # ranks may keep different forms: both issue the collectives in one order).
    from rewrite.exec.stream_choice import TRIALS

    chooser = capturing_backend(rewrite.CompilerConfig())
    chosen = torch.compile(f, backend=chooser, fullgraph=True)
    for _ in range(rewrite.CompilerConfig().exec.tier_up_calls + 2 * TRIALS + 3):
        diffs.append(max_diff(chosen(a, b, w), f(a, b, w)))
    kept = [n for g in chooser.report.graphs for n in g.notes if "kept" in n]
    return {"max_diff": max(diffs), "stamps": stamps, "fx": backend.fx, "built": backend.built, "kept": kept}


def auto_streams(mesh):
    import rewrite

    reference, sharded = tp.build(mesh)
    config = rewrite.CompilerConfig()
    config.exec.auto_streams = True
    backend = capturing_backend(config)
    compiled = torch.compile(sharded, backend=backend, fullgraph=True)
    x = tp.batch(4)
    diffs = [max_diff(compiled(x), reference(x)) for _ in range(3)]
    return {"max_diff": max(diffs), "fx": backend.fx, "built": backend.built,
            "streams": sorted({str(s) for b in backend.built for s in b["streams"].values()})}


def run(rank, world):
    mesh = init(rank, world, 60)
    with torch.no_grad():
        case(rank, "gears_default_first4", lambda: sharded_gears(mesh, None, 4))
        case(rank, "gears_reduce_overhead_first1", lambda: sharded_gears(mesh, "reduce-overhead", 1))
        case(rank, "overlap_scoped", lambda: overlap(rank, True))
        case(rank, "overlap_unscoped", lambda: overlap(rank, False))
        case(rank, "auto_streams", lambda: auto_streams(mesh))
        # last: were equal collectives merged on one rank only, the ranks would fall out of step here
        case(rank, "functional_order", lambda: functional_order(rank))
    dist.barrier()
    finish()


if __name__ == "__main__":
    spawn(run)
'''

CACHE = COMMON + r'''

def run(rank, world, phase):
    import rewrite

    mesh = init(rank, world, 60)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            reference, self.block = tp.build(mesh)
            self.unsharded = [reference]  # not a submodule: the cache's key covers the sharded block only
            self.cached = rewrite.inference.cache_compile(self.inner_forward, cache_dir=os.path.join(OUT, "cache"))

        def inner_forward(self, x):
            return self.block(x)

        def forward(self, x):
            return self.cached(x)

    def calls():
        from rewrite.cache.store import counters

        model = Model()
        diffs = []
        first = tp.batch(4)
        rewrite.inference.set_dim_gears(first, dim_gears={0: [1, 2, 4]})
        for x in (first, tp.batch(2, seed=5), tp.batch(1, seed=6), tp.batch(4, seed=7)):
            diffs.append(max_diff(model(x), model.unsharded[0](x)))
        out = {"max_diff": max(diffs), "unique_graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"],
               "frames": sum(torch._dynamo.utils.counters["frames"].values()), "cache": dict(counters)}
        if phase == "warm":
            # Weights updated in place are a miss (compiled again), never a stale program: through the DTensor
            # (its own version moves, its shard's does not) and through its shard (the other way round).
            x = tp.batch(2, seed=8)
            model.block.q.weight.mul_(1.5)
            model.unsharded[0].q.weight.mul_(1.5)
            out["after_update"] = [max_diff(model(x), model.unsharded[0](x))]
            model.block.k.weight.to_local().mul_(2.0)  # each rank its rows: the whole weight doubles
            model.unsharded[0].k.weight.mul_(2.0)
            out["after_update"].append(max_diff(model(x), model.unsharded[0](x)))
            out["cache_after_update"] = dict(counters)
        return out

    def export():  # the multi-rank export of the same sharded block (one graph file per rank)
        reference, block = tp.build(mesh)
        x = tp.batch(4)
        rewrite.inference.set_dim_gears(x, dim_gears={0: [1, 2, 4]})
        rewrite.dynamo_export(x, model=block, export_path=os.path.join(OUT, "export"), export_name="tp",
                              dynamic=True)

    def load():
        reference, _ = tp.build(mesh)
        runner = rewrite.load(os.path.join(OUT, "export"), "tp")
        diffs = [max_diff(runner(x), reference(x)) for x in (tp.batch(size, seed=size) for size in (1, 2, 4))]
        return {"max_diff": max(diffs), "frames": sum(torch._dynamo.utils.counters["frames"].values())}

    with torch.no_grad():
        case(rank, phase, calls)
        case(rank, f"{phase}_export", export if phase == "cold" else load)
    dist.barrier()
    finish()


if __name__ == "__main__":
    spawn(run, sys.argv[3])
'''

FAILURES = COMMON + r'''

def run(rank, world, kind):
    import rewrite

    mesh = init(rank, world, 5 if kind == "gears" else 60)
    reference, sharded = tp.build(mesh)
    compiled = torch.compile(sharded, backend="rewrite", fullgraph=True)
    first = tp.batch(2)
    # "gears": the ranks declare different gears; batch 4 is a gear on rank 0 only
    rewrite.inference.set_dim_gears(first, dim_gears={0: [1, 2, 4] if kind != "gears" or rank == 0 else [1, 2]})
    with torch.no_grad():
        case(rank, "warm", lambda: max_diff(compiled(first), reference(first)))
        dist.barrier()

        def step():
            if kind == "raise" and rank == 1:
                raise ValueError("rank 1 fails in its own code before the model's collectives")
            return compiled(tp.batch(4))

        case(rank, kind, step)
    if rank == 1:
        if kind == "raise":
            os._exit(0)  # the failed rank ends (0: spawn would kill rank 0 at once otherwise): its connections close
        deadline = time.time() + 60  # "gears": rank 1 stays alive without calling, so rank 0 times out
        while time.time() < deadline and not os.path.exists(os.path.join(OUT, f"{kind}.0.json")):
            time.sleep(0.1)
    finish()


if __name__ == "__main__":
    spawn(run, sys.argv[3])
'''


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return str(s.getsockname()[1])


def _run_ranks(tmp_path, name: str, script: str, *args: str, timeout: int = 240, check: bool = True):
    path = tmp_path / f"{name}.py"
    path.write_text(script)
    env = dict(os.environ, PYTHONPATH=REPO, TP_EXAMPLES=EXAMPLES)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(path), str(tmp_path), _free_port(), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-8000:]}"
    return proc, time.perf_counter() - t0


def _outcome(tmp_path, case: str, rank: int, proc=None) -> dict:
    f = tmp_path / f"{case}.{rank}.json"
    assert f.exists(), f"rank {rank} wrote no outcome for {case}" + (f":\n{proc.stderr[-6000:]}" if proc else "")
    return json.loads(f.read_text())


def _issued(collectives: list) -> list:
    """The collectives that talk to other ranks (op and arguments), in order: what every rank must issue alike."""
    return [c for c in collectives if c[0] != "_c10d_functional.wait_tensor.default"]


def _same_collectives(got: list, traced: list) -> None:
    """The traced collectives, in their order, none merged, duplicated or folded away; their waits may
    come later (the rebuild issues collectives early and waits where their results are read)."""
    assert _issued(got) == _issued(traced), (got, traced)
    assert len(got) == len(traced), (got, traced)


def _ok(tmp_path, case: str) -> list:
    """Both ranks' values of ``case``, which must have succeeded on both."""
    values = []
    for rank in (0, 1):
        out = _outcome(tmp_path, case, rank)
        assert out["ok"], f"{case} failed on rank {rank}: {out['error']}\n{out['trace']}"
        values.append(out["value"])
    return values


@pytest.fixture(scope="module")
def main_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("tp_main")
    _run_ranks(tmp_path, "main", MAIN)
    return tmp_path


# -- the sharded block: every gear, past the tier-up, both modes ---------------------------------------

def _check_block(value: dict) -> None:
    assert value["max_diff"] <= 1e-4
    assert value["unique_graphs"] == 1  # one trace serves every gear
    assert sorted(value["gears"]) == [[1], [2], [4]], value["gears"]
    assert value["diffs"] == 1 + 3 * value["calls_per_gear"]


def test_sharded_block_matches_eager_at_every_gear_past_the_tier_up(main_run):
    for rank, value in enumerate(_ok(main_run, "gears_default_first4")):
        _check_block(value)
        # each gear tiers up after 8 calls, its collectives made locally in the observed run
        assert value["tiered_up"] == 3, (rank, value["notes"])


def test_sharded_block_matches_eager_in_reduce_overhead_first_called_at_batch_1(main_run):
    for value in _ok(main_run, "gears_reduce_overhead_first1"):
        _check_block(value)
        assert value["planned"] == 3, value["notes"]  # every gear planned at compile time
        assert value["tiered_up"] == 0


def test_collectives_of_the_sharded_block_keep_their_order_in_every_gear(main_run):
    for case in ("gears_default_first4", "gears_reduce_overhead_first1"):
        for value in _ok(main_run, case):
            (fx,) = value["fx"]
            assert [c[0].split(".")[1] for c in fx] == ["all_reduce", "wait_tensor"] * 2
            (optimized,) = value["optimized"]
            assert optimized == fx  # here each all_reduce's result is needed at once
            assert len(value["built"]) == 3  # one static graph per gear, each with the traced collectives
            for built in value["built"]:
                assert built["collectives"] == fx, built


# -- hand-written functional collectives: order, no merging, no folding -------------------------------------

def test_equal_collectives_are_neither_merged_nor_folded_nor_reordered(main_run):
    """Rank 0's two all_reduces read equal frozen biases (zeros), rank 1's different ones: merged on rank 0
    only, they would pair rank 0's second collective with rank 1's third."""
    values = _ok(main_run, "functional_order")
    for value in values:
        (fx,) = value["fx"]
        ops = [c[0].split(".")[1] for c in fx]
        assert ops == ["all_reduce", "wait_tensor"] * 2 + ["all_gather_into_tensor", "wait_tensor", "all_reduce",
                                                           "wait_tensor", "reduce_scatter_tensor", "wait_tensor"]
        (optimized,) = value["optimized"]
        _same_collectives(optimized, fx)
        assert [c[1:] for c in _issued(optimized)] == [["sum", "0"], ["sum", "0"], [2, "0"], ["max", "0"],
                                                       ["sum", 2, "0"]]
        (built,) = value["built"]
        _same_collectives(built["collectives"], fx)
        assert value["max_diff"] <= 1e-4
        assert value["tiered_up"] == 1  # graphs with collectives tier up too
    assert values[0]["fx"] == values[1]["fx"]


# -- a rank that fails --------------------------------------------------------------------------------------

def test_a_rank_failing_before_the_collectives_makes_the_other_fail_fast_with_a_clear_error(tmp_path):
    proc, _ = _run_ranks(tmp_path, "raise", FAILURES, "raise", check=False)
    assert _outcome(tmp_path, "warm", 0, proc)["ok"] and _outcome(tmp_path, "warm", 1, proc)["ok"]
    failed = _outcome(tmp_path, "raise", 1, proc)
    assert failed["error"].startswith("ValueError: rank 1 fails"), failed
    survivor = _outcome(tmp_path, "raise", 0, proc)
    assert not survivor["ok"]
    message = survivor["error"]
    assert message.startswith("CollectiveError: rank 0 of 2: graph "), message
    assert "failed in a collective (2 x all_reduce on group '0')" in message, message
    assert "no other rank recorded an error" in message and "init_process_group(timeout=...), here 60 s" in message
    assert "The backend said: RuntimeError: " in message  # gloo's own words, e.g. "Connection closed by peer"
    assert survivor["seconds"] < 30, survivor  # its peer's sockets closed: no need to wait for the timeout


def test_mismatched_gears_fail_on_every_rank_naming_the_rank_and_the_gear(tmp_path):
    """Batch 4 is a gear on rank 0 only. Each rank compiles alone (compiling never waits for the others), so
    the mismatch shows at the first call of that size: rank 1 raises GearError before its collectives and
    records it in the store; rank 0, blocked in its all_reduce, fails after the group's timeout (5 s) and
    names rank 1's error."""
    proc, _ = _run_ranks(tmp_path, "gears", FAILURES, "gears", check=False)
    assert _outcome(tmp_path, "warm", 0, proc)["ok"] and _outcome(tmp_path, "warm", 1, proc)["ok"]
    failed = _outcome(tmp_path, "gears", 1, proc)
    assert failed["error"].startswith("GearError: "), failed
    assert "dim 0 has size 4; allowed gears for it: [1, 2]" in failed["error"], failed
    survivor = _outcome(tmp_path, "gears", 0, proc)
    message = survivor["error"]
    assert message.startswith("CollectiveError: rank 0 of 2: graph "), message
    assert "rank 1 failed in graph" in message and "allowed gears for it: [1, 2]" in message, message
    assert "here 5 s" in message
    assert 3 < survivor["seconds"] < 40, survivor  # bounded by the process group's timeout, not gloo's 30 minutes


# -- cache_compile per rank --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cache_runs(tmp_path_factory):
    """A cold spawn (cache_compile writes, dynamo_export writes), then a warm one (both load)."""
    tmp_path = tmp_path_factory.mktemp("tp_cache")
    _run_ranks(tmp_path, "cold", CACHE, "cold")
    _run_ranks(tmp_path, "warm", CACHE, "warm")  # a new spawn: fresh processes
    return tmp_path


def test_cache_compile_writes_one_entry_per_rank_and_a_fresh_process_loads_it_without_dynamo(cache_runs):
    tmp_path = cache_runs
    cold = _ok(tmp_path, "cold")
    entries = sorted(p.relative_to(tmp_path / "cache").as_posix() for p in (tmp_path / "cache").glob("*/*/*")
                     if p.is_dir())
    assert entries == ["Model/world2global_rank0/inner_forward", "Model/world2global_rank1/inner_forward"], entries
    for value in cold:
        assert value["max_diff"] <= 1e-4 and value["unique_graphs"] == 1

    for value in _ok(tmp_path, "warm"):
        assert value["unique_graphs"] == 0 and value["frames"] == 0, value  # no Dynamo
        assert value["cache"].get("hits", 0) >= 1 and not value["cache"].get("misses"), value["cache"]
        assert value["max_diff"] <= 1e-4
        assert max(value["after_update"]) <= 1e-4
        assert value["cache_after_update"].get("misses") == 2, value["cache_after_update"]


def test_dynamo_export_of_the_sharded_block_loads_per_rank_in_fresh_processes(cache_runs):
    """The same capture as cache_compile's (DTensor weights flattened, shards frozen): one file per rank."""
    tmp_path = cache_runs
    _ok(tmp_path, "cold_export")
    names = sorted(os.listdir(tmp_path / "export"))
    assert {"tp0.json", "tp1.json", "tp_manifest.json", "rank_0", "rank_1"} <= set(names), names
    for value in _ok(tmp_path, "warm_export"):
        assert value["max_diff"] <= 1e-4 and value["frames"] == 0, value


# -- streams: a collective on a side stream overlaps with the default stream's work --------------------------

def test_a_collective_in_a_stream_scope_runs_on_a_worker_and_overlaps_with_independent_compute(main_run):
    scoped = _ok(main_run, "overlap_scoped")
    for value in scoped:
        assert value["max_diff"] <= 1e-4
        (fx,) = value["fx"]
        (built,) = value["built"]
        _same_collectives(built["collectives"], fx)
        streams = built["streams"]
        assert streams["all_reduce"] == "1" and streams["wait_tensor"] == "1", streams
        assert streams["all_reduce_1"] is None and streams["mm"] is None, streams
    for value in scoped:  # with the tier-up: a form was kept after the trials, results equal all along
        assert len(value["kept"]) == 1 and "stream scopes on CPU" in value["kept"][0], value["kept"]
    stamps = scoped[0]["stamps"]  # rank 0 waited 0.3 s for rank 1 in its wait_tensor, on the worker
    assert not stamps["after_wait"]["caller_thread"] and stamps["default_stream_compute"]["caller_thread"]
    assert stamps["after_wait"]["at"] > 0.25, stamps
    assert stamps["default_stream_compute"]["at"] < stamps["after_wait"]["at"] - 0.2, stamps  # ran meanwhile

    # One stream overlaps too, by order: collectives are issued in their order as early as their inputs
    # allow (gloo runs them in the background) and waited for where read, so the second all_reduce's input
    # is computed before the first wait blocks.
    for value in _ok(main_run, "overlap_unscoped"):
        assert value["max_diff"] <= 1e-4
        (fx,) = value["fx"]
        (built,) = value["built"]
        _same_collectives(built["collectives"], fx)
        assert set(built["streams"].values()) == {None}
    stamps = _ok(main_run, "overlap_unscoped")[0]["stamps"]
    assert stamps["after_wait"]["caller_thread"] and stamps["default_stream_compute"]["caller_thread"]
    assert stamps["default_stream_compute"]["at"] < stamps["after_wait"]["at"] - 0.2, stamps


def test_auto_streams_keeps_the_sharded_block_correct_and_its_collectives_on_the_caller_stream(main_run):
    """auto_streams prices ops by their CPU work (rewrite.cost: a collective costs a few microseconds of
    dispatch); the time a collective spends waiting for its peers is not in the model, so it has no reason to
    move one to a side stream to overlap it, and on the sharded block it does not."""
    for value in _ok(main_run, "auto_streams"):
        assert value["max_diff"] <= 1e-4
        (fx,) = value["fx"]
        for built in value["built"]:
            _same_collectives(built["collectives"], fx)
            assert all(built["streams"][name] is None for name in built["streams"]
                       if name.startswith(("all_reduce", "wait_tensor"))), built["streams"]


# -- the example, exactly as docs/tensor_parallel.md shows it ---------------------------------------------------

def test_the_example_runs_under_torchrun(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO, PET_MASTER_PORT=_free_port())  # torchrun's --master-port, from the env
    proc = subprocess.run([TORCHRUN, "--nproc-per-node", "2", "examples/tensor_parallel.py"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert "all ranks match the unsharded model at every gear" in proc.stdout, proc.stdout
    assert "eager" in proc.stdout and "rewrite" in proc.stdout and "ms/step" in proc.stdout


# -- in this process: the pieces, without other ranks ----------------------------------------------------------

def _collective_graph(streams=(None, None)):
    """x -> all_reduce -> wait -> *2, and y -> all_reduce -> wait; the group name is none this process has."""
    import torch

    from rewrite.ir import Graph, meta_of_value

    c10d = torch.ops._c10d_functional
    m = meta_of_value(torch.zeros(4))
    g = Graph("g")
    x, y = g.placeholder("x", m), g.placeholder("y", m)
    a = g.call(c10d.all_reduce.default, (x, "sum", "no-such-group"), meta=m, stream=streams[0])
    wa = g.call(c10d.wait_tensor.default, (a,), meta=m, stream=streams[0])
    mul = g.call(torch.ops.aten.mul.Tensor, (wa, 2.0), meta=m, stream=streams[0])
    b = g.call(c10d.all_reduce.default, (y, "sum", "no-such-group"), meta=m, stream=streams[1])
    wb = g.call(c10d.wait_tensor.default, (b,), meta=m, stream=streams[1])
    g.set_output((mul, wb))
    return g, (a, wa, b, wb)


def test_a_planned_run_makes_collective_results_locally_and_graphs_with_collectives_may_tier_up():
    """The observed run of a plan (reduce-overhead at compile time, the tier-up on a call's inputs) must not
    talk to other ranks: they do not make that run. It makes each result locally (the group named here does
    not even exist: a real collective would fail)."""
    import torch

    import rewrite
    from rewrite.exec.observe import observe
    from rewrite.exec.program import PlannedProgram, _seen_outside
    from rewrite.ir import is_side_effect
    from rewrite.unit import CompileUnit

    g, (a, wa, b, wb) = _collective_graph()
    obs = observe(g, [torch.ones(4), torch.ones(4)])
    assert obs.facts(wa)[0].storage == obs.facts(a)[0].storage  # wait_tensor returns its argument
    assert obs.facts(b)[0].storage != obs.facts(g.placeholders[1])[0].storage  # all_reduce: a new tensor
    assert _seen_outside(g) is None
    assert all(is_side_effect(n) for n in (a, wa, b, wb))  # never pruned, folded, merged or planned once

    config = rewrite.CompilerConfig()
    config.mode = "reduce-overhead"
    program = PlannedProgram(CompileUnit.detached("g", config))
    gear = program.executable(g, lambda *args: None, plannable=True)
    assert gear.plan is not None  # planned at compile time, without a process group
    index = {n.id: i for i, n in enumerate(g.nodes)}
    kinds = {n.name: gear.plan.nodes[index[n.id]].kind for n in (a, wa, b, wb)}
    assert kinds[a.name] == kinds[b.name] == "call", kinds  # each collective runs at every call, never once


def test_collectives_on_two_streams_are_issued_in_their_order_and_are_no_barriers():
    from rewrite.exec.streams import plan_streams

    g, (a, wa, b, wb) = _collective_graph(streams=("1", None))
    plan = plan_streams(g)
    assert a in plan.waits_before.get(b.id, ())  # the second all_reduce is issued after the first, on any thread
    mul = next(n for n in g.nodes if n.op == "aten.mul.Tensor")
    # the wait on stream "1" is no barrier: the default stream's work does not wait for it
    assert all(wa not in plan.waits_before.get(n.id, ()) for n in g.nodes if plan.stream_of.get(n.id) == 0)
    assert plan.stream_of[mul.id] == plan.stream_of[wa.id]
