"""What the GPU path decides and builds, checked where it does not need a GPU (CI has none):

* the policy: on CUDA, reduce-overhead's gears get Inductor's kernels without the experimental switch, and
  the default mode tiers up to Inductor's kernels (``exec.cuda_kernels``);
* the background build: one thread per process, builds in order, errors handed to the caller that
  picks the build up, a bounded number of threads whatever the number of builds;
* the hot swap: a gear serves its calls with its ATen code until its cold calls are over and its build
  (here a real Inductor compile of a CPU graph) is done, then with the hot code; a failed build keeps
  the ATen code and says why;
* the memory a shared pool is predicted to need, from the graphs' metas;
* inputs read in place: weights and tensors marked with ``torch._dynamo.mark_static_address``.

tests/test_cuda.py runs the same paths on a GPU.
"""
from __future__ import annotations

import threading

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import rewrite
from rewrite.exec import background
from rewrite.exec.hot_swap import HotSwapGear
from rewrite.exec.inductor import compile_with_inductor
from rewrite.exec.memory import output_bytes, predict_peak_bytes
from rewrite.fx_bridge import from_fx
from rewrite.policy import resolve_policy


def _graph(fn, *example):
    """The IR of ``fn``, returning a tuple as AOTAutograd's graphs do."""
    def as_tuple(*args):
        out = fn(*args)
        return out if isinstance(out, tuple) else (out,)

    return from_fx(make_fx(as_tuple)(*example))


def test_reduce_overhead_on_cuda_gets_inductor_kernels_without_the_experimental_switch():
    policy = resolve_policy(rewrite.CompilerConfig(mode="reduce-overhead"))
    assert policy.inductor_kernels_on("cuda")
    assert not policy.inductor_kernels_on("cpu")  # the CPU's static kernels stay behind their switch
    aten = resolve_policy(rewrite.CompilerConfig(mode="reduce-overhead", **{"exec.cuda_kernels": "aten"}))
    assert not aten.inductor_kernels_on("cuda")


def test_the_default_mode_tiers_up_to_inductor_kernels_on_cuda_and_static_c_kernels_on_cpu():
    policy = resolve_policy(rewrite.CompilerConfig())
    assert policy.tiers_up and not policy.inductor_kernels_on("cuda")  # the ATen code first, compiled later
    assert policy.hot_kernels_on("cuda") == "inductor"
    assert policy.hot_kernels_on("cpu") == "static-c"
    assert resolve_policy(rewrite.CompilerConfig(**{"exec.cuda_kernels": "aten"})).hot_kernels_on("cuda") == "aten"
    assert not resolve_policy(rewrite.CompilerConfig(**{"exec.tier_up_calls": 0})).tiers_up
    with pytest.raises(rewrite.ConfigError, match="cuda_kernels"):
        rewrite.CompilerConfig(**{"exec.cuda_kernels": "triton"})


def test_builds_run_on_one_thread_in_order_and_hand_errors_to_the_caller():
    before = {t.ident for t in threading.enumerate()}
    order, threads = [], set()

    def build(k):
        def run():
            order.append(k)
            threads.add(threading.current_thread().name)
            if k == 3:
                raise ValueError("build 3 failed")
            return k * 10
        return run

    futures = [background.submit(build(k)) for k in range(6)]
    assert background.wait_for_builds(timeout=60)
    assert order == list(range(6))
    assert threads == {"rewrite-build"}
    assert [f.result() for k, f in enumerate(futures) if k != 3] == [0, 10, 20, 40, 50]
    with pytest.raises(ValueError, match="build 3 failed"):
        futures[3].result()
    new = [t for t in threading.enumerate() if t.ident not in before]
    assert len(new) <= 1  # at most the one build thread, however many builds


def _mlp(x, w1, w2):
    return torch.nn.functional.gelu(x @ w1) @ w2 + 1


def _mlp_inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(4, 16, generator=g), torch.randn(16, 32, generator=g), torch.randn(32, 8, generator=g)]


def test_a_gear_serves_its_aten_code_until_its_background_build_is_ready_then_the_hot_code():
    inputs = _mlp_inputs()
    graph = _graph(_mlp, *inputs)
    want = _mlp(*inputs)
    calls = {"cold": 0, "hot": 0}
    release = threading.Event()

    def cold(*args):
        calls["cold"] += 1
        return _mlp(*args)

    def build():
        release.wait(60)  # the build takes as long as the test says
        fn = compile_with_inductor(graph)  # a real Inductor compile, as on CUDA

        def hot(*args):
            calls["hot"] += 1
            return fn(*args)[0]
        return hot

    notes: list[str] = []
    gear = HotSwapGear("g", cold, build, cold_calls=2, note=notes.append)
    assert gear.state == "cold"
    for _ in range(5):  # 2 cold calls (the build starts on the second), then 3 calls while it is not ready
        torch.testing.assert_close(gear(*inputs), want)
    assert gear.state == "building" and calls == {"cold": 5, "hot": 0} and gear.pending_calls == 3
    release.set()
    assert gear.wait(timeout=120)
    for _ in range(3):
        torch.testing.assert_close(gear(*inputs), want, rtol=1e-5, atol=1e-5)
    assert gear.state == "hot" and calls == {"cold": 5, "hot": 3}
    assert any("tiered up" in n and "3 calls ran its ATen code" in n for n in notes), notes


def test_a_failed_background_build_keeps_the_aten_code_and_says_why():
    inputs = _mlp_inputs()

    def build():
        raise RuntimeError("no kernels for you")

    notes: list[str] = []
    gear = HotSwapGear("g", _mlp, build, cold_calls=0, note=notes.append)
    gear.wait(timeout=60)
    for _ in range(2):
        torch.testing.assert_close(gear(*inputs), _mlp(*inputs))
    assert gear.state == "failed"
    assert len(notes) == 1 and "keeps its ATen code" in notes[0] and "no kernels for you" in notes[0]


def test_a_gear_called_once_never_builds():
    started = []
    gear = HotSwapGear("g", _mlp, lambda: started.append(1) or _mlp, cold_calls=8, note=lambda m: None)
    gear(*_mlp_inputs())
    assert background.wait_for_builds(timeout=60)
    assert started == [] and gear.state == "cold"  # `explain`'s one call, a one-off run: no compile
    gear(*_mlp_inputs())  # a second call: the build starts, off the caller's path
    assert background.wait_for_builds(timeout=60)
    assert started == [1] and gear.state == "building"  # the hot code is taken once the cold calls are over


def test_the_peak_of_live_values_is_predicted_from_the_metas():
    def f(x, w):
        a = x @ w  # 16 KiB, freed after relu
        b = a.relu()  # 16 KiB, an output (through the view t)
        c = b.view(-1)  # a view: no bytes of its own
        d = c * 2  # 16 KiB, an output
        return d, b.t()

    graph = _graph(f, torch.randn(64, 64), torch.randn(64, 64))
    assert predict_peak_bytes(graph) == 2 * 64 * 64 * 4  # never three 16 KiB values at once
    assert output_bytes(graph) == 2 * 64 * 64 * 4

    def chain(x):
        for _ in range(10):
            x = torch.tanh(x) * 2  # each step's inputs die at the step after
        return x

    graph = _graph(chain, torch.randn(128, 128))
    assert predict_peak_bytes(graph) == 2 * 128 * 128 * 4


def test_the_predicted_peak_is_at_least_what_a_planned_gear_allocates():
    """On the CPU a planned gear's arena is its real allocation: the prediction (ops one by one, no reuse of a
    value's bytes before it dies) is an upper bound of it, and not a loose one."""
    from rewrite import models
    from rewrite.exec.observe import observe, synthesize_inputs
    from rewrite.exec.plan import make_plan

    model = models.bert(layers=2, hidden=64, heads=4, vocab=128).eval()
    ids = models.token_batch(2, 16, vocab=128)
    gm = make_fx(lambda i: model(i).last_hidden_state)(ids)
    graph = from_fx(gm)
    plan = make_plan(graph, observe(graph, synthesize_inputs(graph)), "cpu")
    predicted = predict_peak_bytes(graph)
    assert plan.arena_bytes <= predicted <= 4 * plan.arena_bytes, (plan.arena_bytes, predicted)


class _Stateful(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8))
        self.cache = torch.zeros(4, 8)
        torch._dynamo.mark_static_address(self.cache)

    def forward(self, x):
        self.cache.copy_(x @ self.w)
        return self.cache.sum(0) + x.sum(0)


def test_weights_and_static_address_inputs_are_read_in_place():
    seen = []

    class Backend(rewrite.backend.RewriteBackend):
        def on_optimized(self, graph, unit, frozen, gear_spec):
            seen.append((graph, unit))

    model = _Stateful()
    compiled = torch.compile(model, backend=Backend(), fullgraph=True)
    x = torch.randn(4, 8)
    with torch.no_grad():
        got = compiled(x)
    want_cache = x @ model.w
    torch.testing.assert_close(model.cache, want_cache)
    torch.testing.assert_close(got, want_cache.sum(0) + x.sum(0))
    (graph, unit), = seen
    shapes = {k: tuple(p.meta.shape) for k, p in enumerate(graph.placeholders)}
    in_place = {shapes[k] for k in unit.weights}
    assert (8, 8) in in_place and (4, 8) in in_place  # the weight and the marked cache
    x_index = next(k for k, s in shapes.items() if s == (4, 8) and k not in unit.weights)
    assert x_index not in unit.weights  # the plain input is copied, never read in place
