"""What the GPU path decides and builds, checked where it does not need a GPU (CI has none):

* the policy: on CUDA, reduce-overhead's gears get Inductor's kernels without the experimental switch, and
  the default mode tiers up to Inductor's kernels (``exec.cuda_kernels``);
* the hot swap: a gear serves its cold calls with its ATen code, then builds (here a real Inductor compile
  of a CPU graph) on the caller's thread and serves the hot code; a caller that comes while another
  builds runs the ATen code, counted; a failed build keeps the ATen code and says why;
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


def _mlp(x, w1, w2):
    return torch.nn.functional.gelu(x @ w1) @ w2 + 1


def _mlp_inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(4, 16, generator=g), torch.randn(16, 32, generator=g), torch.randn(32, 8, generator=g)]


def test_a_gear_serves_its_aten_code_for_its_cold_calls_then_builds_on_the_callers_thread():
    """The build traces with FX, which patches ``nn.Module.__call__`` process-wide while it runs: on another
    thread it sent the caller's module calls into its tracer (every default-mode call failed on an H200)."""
    inputs = _mlp_inputs()
    graph = _graph(_mlp, *inputs)
    want = _mlp(*inputs)
    calls = {"cold": 0, "hot": 0}
    built_on = []

    def cold(*args):
        calls["cold"] += 1
        return _mlp(*args)

    def build():
        built_on.append(threading.get_ident())
        fn = compile_with_inductor(graph)  # a real Inductor compile, as on CUDA

        def hot(*args):
            calls["hot"] += 1
            return fn(*args)[0]
        return hot

    notes: list[str] = []
    gear = HotSwapGear("g", cold, build, cold_calls=2, note=notes.append)
    assert gear.state == "cold"
    for _ in range(2):
        torch.testing.assert_close(gear(*inputs), want)
    assert gear.state == "cold" and calls == {"cold": 2, "hot": 0} and built_on == []
    for _ in range(3):  # the third call builds, on this thread, and runs the hot code
        torch.testing.assert_close(gear(*inputs), want, rtol=1e-5, atol=1e-5)
    assert built_on == [threading.get_ident()]  # Inductor may start threads of its own; the build is ours
    assert gear.state == "hot" and calls == {"cold": 2, "hot": 3} and gear.pending_calls == 0
    assert any("tiered up" in n and "built on call 3" in n for n in notes), notes


def test_a_caller_that_comes_while_another_builds_runs_the_aten_code_without_waiting():
    inputs = _mlp_inputs()
    entered, release = threading.Event(), threading.Event()

    def build():
        entered.set()
        release.wait(60)
        return lambda *args: _mlp(*args) * 0 + 7  # the hot code, told apart by its result

    notes: list[str] = []
    gear = HotSwapGear("g", _mlp, build, cold_calls=1, note=notes.append)
    gear(*inputs)  # the cold call
    builder = threading.Thread(target=gear, args=inputs)
    builder.start()
    assert entered.wait(60) and gear.state == "building"
    torch.testing.assert_close(gear(*inputs), _mlp(*inputs))  # served cold meanwhile, not held up
    assert gear.pending_calls == 1
    release.set()
    builder.join(60)
    assert gear.state == "hot" and (gear(*inputs) == 7).all()
    assert any("1 calls of other threads ran its ATen code meanwhile" in n for n in notes), notes


def test_a_failed_build_keeps_the_aten_code_and_says_why():
    inputs = _mlp_inputs()

    def build():
        raise RuntimeError("no kernels for you")

    notes: list[str] = []
    gear = HotSwapGear("g", _mlp, build, cold_calls=0, note=notes.append)
    for _ in range(3):  # the first call is cold, the second builds and fails, the third runs the ATen code again
        torch.testing.assert_close(gear(*inputs), _mlp(*inputs))
    assert gear.state == "failed"
    assert len(notes) == 1 and "keeps its ATen code" in notes[0] and "no kernels for you" in notes[0]


def test_a_gear_called_once_never_builds():
    started = []
    gear = HotSwapGear("g", _mlp, lambda: started.append(1) or (lambda *a: _mlp(*a)), cold_calls=0,
                      note=lambda m: None)
    gear(*_mlp_inputs())
    assert started == [] and gear.state == "cold"  # `explain`'s one call, a one-off run: no compile
    gear(*_mlp_inputs())  # a second call builds
    assert started == [1] and gear.state == "hot"


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
