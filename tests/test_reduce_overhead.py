"""reduce-overhead mode: execution plans per gear, one memory pool per compiled function, outputs the
caller owns, in-place input updates, concurrent callers, CUDA graphs (skipped without CUDA)."""
from __future__ import annotations

import json
import logging

import pytest
import torch

import rewrite
from conftest import requires_cuda, run_in_threads
from rewrite import models
from rewrite.exec.memory import ArenaPool, assign_offsets
from rewrite.exec.observe import observe, synthesize_inputs
from rewrite.exec.plan import ExecutionPlan, make_plan
from rewrite.exec.program import PlannedProgram

ATOL, RTOL = 5e-5, 1e-4
GEARS = [1, 2, 4]


def _config(mode: str, build_dir=None, frozen: bool = True) -> rewrite.CompilerConfig:
    config = rewrite.CompilerConfig()
    config.experimental_config.frozen_parameter = frozen
    if mode == "static kernels":
        config.mode = "reduce-overhead"
        config.experimental_config.aclgraph._aclnn_static_shape_kernel = True
        config.experimental_config.aclgraph._aclnn_static_shape_kernel_build_dir = str(build_dir)
    else:
        config.mode = mode
    return config


@pytest.fixture
def kernel_home(tmp_path, monkeypatch):
    """A private signing key and build dir for static kernels."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    build = tmp_path / "build"
    build.mkdir()
    return build


def _programs(monkeypatch) -> list:
    made = []
    original = PlannedProgram.__init__

    def init(self, unit, *args, **kwargs):
        original(self, unit, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(PlannedProgram, "__init__", init)
    return made


MODES = ["max-autotune", "reduce-overhead", "npugraph_ex", "static kernels"]
# MiniLM's default mode with gears is tested in test_gears; npugraph_ex is reduce-overhead under another name.
CASES = [(name, mode) for name in ("bert", "gpt2") for mode in MODES] + [("minilm", "reduce-overhead"),
                                                                         ("minilm", "static kernels")]


@pytest.mark.parametrize("name, mode", CASES)
def test_every_mode_matches_eager_at_every_gear(name, mode, kernel_home):
    model = getattr(models, name)()
    vocab = 30522 if name == "minilm" else 512
    backend = rewrite.get_backend(_config(mode, kernel_home))
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    first = models.token_batch(GEARS[-1], 16, vocab=vocab)
    rewrite.inference.set_dim_gears(first, {0: GEARS})
    with torch.no_grad():
        compiled(first)
        for batch in GEARS:
            ids = models.token_batch(batch, 16, vocab=vocab, seed=batch)
            expected = model(ids).last_hidden_state
            for _ in range(2):  # the second call runs on the same arena
                torch.testing.assert_close(compiled(ids).last_hidden_state, expected, atol=ATOL, rtol=RTOL)
    text = str(backend.report)
    if mode != "max-autotune":
        assert text.count("note: plan ") == len(GEARS), text
    if mode == "static kernels":
        assert "static kernels:" in text and backend.report.graphs[0].applied["static kernels"] > 0


class _Mlp(torch.nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.a = torch.nn.Linear(width, width)
        self.b = torch.nn.Linear(width, width)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.a(x))
        return self.b(h) + x, h.sum(-1)


@pytest.mark.parametrize("mode", ["reduce-overhead", "static kernels"])
def test_outputs_belong_to_the_caller_across_calls(mode, kernel_home):
    """The next call never overwrites what an earlier call returned (TorchAir's clone_output=False would)."""
    model = _Mlp().eval()
    compiled = torch.compile(model, backend=rewrite.get_backend(_config(mode, kernel_home)), fullgraph=True)
    x1, x2 = torch.randn(4, 16), torch.randn(4, 16)
    with torch.no_grad():
        out1 = compiled(x1)
        kept = [t.clone() for t in out1]
        out2 = compiled(x2)
        out3 = compiled(x1)
    for got, before in zip(out1, kept):
        torch.testing.assert_close(got, before, rtol=0, atol=0)
    for a, b, c in zip(out1, out2, out3):
        assert len({a.untyped_storage().data_ptr(), b.untyped_storage().data_ptr(),
                    c.untyped_storage().data_ptr()}) == 3
    out1[0].fill_(1e6)  # the caller may write what it owns: later calls are unaffected
    with torch.no_grad():
        torch.testing.assert_close(compiled(x2)[0], model(x2)[0])


def test_returned_folded_constant_is_a_copy():
    def f(x):
        return x + 1, torch.ones(3) * 2

    compiled = torch.compile(f, backend=rewrite.get_backend(_config("reduce-overhead")), fullgraph=True)
    _, c1 = compiled(torch.randn(3))
    c1.add_(100)
    _, c2 = compiled(torch.randn(3))
    torch.testing.assert_close(c2, torch.full((3,), 2.0))


@pytest.mark.parametrize("mode", ["reduce-overhead", "static kernels"])
def test_inputs_mutated_in_place_stay_correct(mode, kernel_home):
    def f(x, y):
        x.mul_(2)
        y.add_(x)
        return torch.relu(y) + x

    compiled = torch.compile(f, backend=rewrite.get_backend(_config(mode, kernel_home)), fullgraph=True)
    for step in range(3):
        x, y = torch.randn(8, 8), torch.randn(8, 8)
        x0, y0 = x.clone(), y.clone()
        got = compiled(x, y)
        want = f(x0, y0)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(x, x0)
        torch.testing.assert_close(y, y0)


@pytest.mark.parametrize("mode", ["reduce-overhead", "static kernels"])
def test_concurrent_callers_never_share_an_arena(mode, kernel_home, monkeypatch):
    programs = _programs(monkeypatch)
    model = _Mlp(64).eval()
    compiled = torch.compile(model, backend=rewrite.get_backend(_config(mode, kernel_home)), fullgraph=True)
    inputs = [torch.randn(32, 64) for _ in range(8)]
    with torch.no_grad():
        expected = [model(x)[0] for x in inputs]
        compiled(inputs[0])

    def worker(k: int):
        with torch.no_grad():
            for _ in range(50):
                for j in range(k, len(inputs), 4):
                    torch.testing.assert_close(compiled(inputs[j])[0], expected[j])

    run_in_threads(worker, 4)
    assert programs and programs[0].pool.created >= 1


def test_gears_share_one_pool_as_large_as_the_largest_plan(monkeypatch):
    programs = _programs(monkeypatch)
    model = _Mlp(32).eval()
    compiled = torch.compile(model, backend=rewrite.get_backend(_config("reduce-overhead")), fullgraph=True)
    x = torch.ones(8, 32)
    rewrite.inference.set_dim_gears(x, {0: [2, 4, 8]})
    with torch.no_grad():
        compiled(x)
        for rows in (8, 2, 4, 8):
            torch.testing.assert_close(compiled(torch.ones(rows, 32))[0], model(torch.ones(rows, 32))[0])
    (program,) = programs
    sizes = [g.plan.arena_bytes for g in program.gears]
    assert len(sizes) == 3 and program.pool.nbytes == max(sizes)
    assert program.pool.created == 1  # one caller at a time: one arena serves every gear
    assert program.pool.bytes_held() == max(sizes)


def test_buffers_reuse_memory_by_liveness():
    offsets, total = assign_offsets([(0, 1, 1000), (1, 2, 1000), (2, 3, 1000), (0, 3, 64)])
    assert total == 64 + 2 * 1024  # the first and third live at different times: they share bytes
    assert offsets[0] == offsets[2] != offsets[1]


def test_plan_is_plain_data_and_round_trips():
    model = _Mlp(8).eval()
    gm_graph = {}

    def grab(self, graph, unit, frozen, gear_spec):
        gm_graph["g"] = graph

    backend = rewrite.get_backend(_config("reduce-overhead"))
    backend.on_optimized = grab.__get__(backend)
    with torch.no_grad():
        torch.compile(model, backend=backend, fullgraph=True)(torch.randn(4, 8))
    graph = gm_graph["g"]
    plan = make_plan(graph, observe(graph, synthesize_inputs(graph)))
    text = json.dumps(plan.to_dict())
    again = ExecutionPlan.from_dict(json.loads(text))
    assert again == plan
    assert plan.counts()["out"] > 0 and plan.arena_bytes > 0


def test_unplanned_graphs_say_why(caplog):
    """Graphs the plan cannot take (dynamic shapes) still run, and the report says what happened."""
    def f(x):
        return torch.sin(x) * 2

    backend = rewrite.get_backend(_config("reduce-overhead"))
    compiled = torch.compile(f, backend=backend, fullgraph=True, dynamic=True)
    for rows in (5, 7):
        x = torch.randn(rows, 3)
        torch.testing.assert_close(compiled(x), f(x))
    assert "own memory management" in str(backend.report)


def test_arena_pool_leases_one_arena_per_concurrent_call():
    pool = ArenaPool()
    pool.require(256)
    a = pool.acquire()
    b = pool.acquire()
    assert a is not b and pool.created == 2
    pool.release(a)
    pool.release(b)
    pool.require(4096)  # a larger plan arrives: smaller arenas are replaced, not reused
    c = pool.acquire()
    assert c.nbytes >= 4096 and c is not a and c is not b


def test_npugraph_ex_backend_name_and_options():
    import rewrite.compat.torchair  # noqa: F401  (registers the backend name)

    model = _Mlp(8).eval()
    compiled = torch.compile(model, backend="npugraph_ex", options={"clone_input": False, "capture_limit": 4},
                             dynamic=False)
    x = torch.randn(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x)[0], model(x)[0])
    for options, message in (({"inplace_pass": "test"}, r"Value 'test' \(type: <class 'str'>\) not in optional list "
                                                          r"\[True, False\]"),
                             ({"nope": 1}, "Invalid option 'nope', allowed options: "),
                             ({"capture_limit": 0}, "out of range")):
        torch._dynamo.reset()
        with pytest.raises(Exception, match=message), torch.no_grad():
            torch.compile(model, backend="npugraph_ex", options=options)(x)


@requires_cuda
def test_cuda_graph_per_gear_with_capture_limit(caplog):
    model = _Mlp(16).eval().cuda()
    config = _config("reduce-overhead")
    config.debug.aclgraph.static_capture_size_limit = 2
    compiled = torch.compile(model, backend=rewrite.get_backend(config), fullgraph=True)
    x = torch.randn(8, 16, device="cuda")
    rewrite.inference.set_dim_gears(x, {0: [2, 4, 8]})  # gears come from the first call's inputs
    caplog.set_level(logging.INFO, logger="rewrite")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x)[0], model(x)[0])
        for rows in (8, 8, 8, 2, 2, 2, 4, 4, 4):
            y = torch.randn(rows, 16, device="cuda")
            out = compiled(y)[0]
            torch.testing.assert_close(out, model(y)[0])
            kept = out.clone()
            compiled(torch.randn(rows, 16, device="cuda"))
            torch.testing.assert_close(out, kept)  # a replay did not overwrite what the caller holds
    assert "capture_limit" in caplog.text and "captured (2 of at most 2" in caplog.text


def test_inference_graphs_skip_aot_wrapper_only_when_it_does_nothing(monkeypatch):
    import rewrite.exec as rexec

    decided = []
    original = rexec.direct_call

    def spy(fn, example_inputs):
        out = original(fn, example_inputs)
        decided.append(out is not None)
        return out

    monkeypatch.setattr(rexec, "direct_call", spy)
    backend = rewrite.get_backend(_config("reduce-overhead"))

    def plain(x):
        return torch.tanh(x) * 2

    def aliasing(x):
        return x.view(-1), torch.tanh(x)  # an output that is a view of an input: AOT regenerates it

    x = torch.randn(3, 4)
    for fn, direct in ((plain, True), (aliasing, False)):
        decided.clear()
        compiled = torch.compile(fn, backend=backend, fullgraph=True)
        torch.testing.assert_close(compiled(x), fn(x))
        with torch.enable_grad():  # an inference graph may be called with grad on
            torch.testing.assert_close(compiled(x), fn(x))
        assert decided and all(d == direct for d in decided), (fn.__name__, decided)
    out = compiled(x)
    assert out[0]._base is x  # still a view of the input, as eager returns it


def test_outputs_carry_aot_dynamic_marks_without_its_wrapper():
    """AOTAutograd's wrapper marks geared outputs dynamic for later Dynamo frames; the direct call does too."""
    def f(x):
        return torch.relu(x) + 1

    marks = {}
    for mode in ("max-autotune", "reduce-overhead"):
        torch._dynamo.reset()
        compiled = torch.compile(f, backend=rewrite.get_backend(_config(mode)), fullgraph=True)
        x = torch.randn(8, 4)
        rewrite.inference.set_dim_gears(x, {0: [2, 4, 8]})
        out = compiled(x)
        torch.testing.assert_close(out, f(x))
        marks[mode] = getattr(out, "_dynamo_propagated_dynamic_indices", None)
    assert marks["reduce-overhead"] == marks["max-autotune"] == {0}


def test_a_graph_planned_at_its_first_call_updates_inputs_once():
    """A graph whose run on zeros fails is observed on the first real call, on copies of what it mutates."""
    @torch.library.custom_op("rewrite_test::checked_positive", mutates_args=())
    def checked_positive(t: torch.Tensor) -> torch.Tensor:
        if not bool((t > 0).all()):  # fails on the zeros a compile-time observation would use
            raise ValueError("expected positive values")
        return t.clone()

    checked_positive.register_fake(lambda t: torch.empty_like(t))

    def f(x, d):
        x.add_(1)
        return x * 2 / checked_positive(d).sum()

    backend = rewrite.get_backend(_config("reduce-overhead"))
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    x, d = torch.ones(4), torch.ones(3)
    x0 = x.clone()
    torch.testing.assert_close(compiled(x, d), f(x0, d))
    torch.testing.assert_close(x, x0)  # incremented once, by the call, not by the observation
    assert "note: plan " in str(backend.report)  # planned after all, at the first call


def test_loaded_exports_and_cache_compile_plan_at_load_time_in_reduce_overhead(tmp_path, monkeypatch, caplog):
    """A loaded export and cache_compile honour the mode as a compiled model does: reduce-overhead plans
    every gear when the program is built (before any call), with or without the default mode's tier-up."""
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(2, 8)
    rewrite.inference.set_dim_gears(x, dim_gears={0: [2, 4]})
    rewrite.dynamo_export(x, model=model, dynamic=True)
    for tier_up_calls in (8, 0):
        config = rewrite.CompilerConfig()
        config.mode = "reduce-overhead"
        config.exec.tier_up_calls = tier_up_calls
        runner = rewrite.load(config=config)
        assert str(runner.report).count("note: plan ") == 2, str(runner.report)  # both gears, no call yet
        for batch in (2, 4):
            xb = torch.randn(batch, 8)
            torch.testing.assert_close(runner(xb), model(xb))
    default = rewrite.load()
    assert "note: plan " not in str(default.report)  # the default mode plans at its tier-up, not at load

    class Wrapped(torch.nn.Module):
        def __init__(self, config):
            super().__init__()
            self.inner = model
            self.cached = rewrite.inference.cache_compile(self.forward_inner, config=config)

        def forward_inner(self, x):
            return self.inner(x)

    config = rewrite.CompilerConfig()
    config.mode = "reduce-overhead"
    config.exec.tier_up_calls = 0
    caplog.set_level(logging.INFO, logger="rewrite")
    Wrapped(config).cached(x)  # compiled and written
    caplog.clear()
    wrapped = Wrapped(config)  # loaded from the entry: its two gears are planned (tier_up_calls = 0: never tiered)
    with torch.no_grad():
        torch.testing.assert_close(wrapped.cached(x), model(x))
    messages = [r.getMessage() for r in caplog.records]
    assert any("loaded" in m for m in messages), messages
    assert sum(m.startswith("plan ") for m in messages) == 2, messages
