"""No silent slow path (rewrite.ledger): each slow path is counted per compiled function, `rewrite.stats`
shows it, `rewrite.explain` prints it, and ``config.strict = True`` turns it into a `rewrite.SlowPathError`
naming the cause and the fix, raised on the call that would have taken it. One test per slow path (the
CUDA graph not captured is in tests/test_cuda.py)."""
from __future__ import annotations

import pytest
import torch

import rewrite
from rewrite.exec.hot_swap import HotSwapGear
from rewrite.ledger import Ledger


class _Rows(torch.nn.Module):
    """Rows stay independent (padding is allowed)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.lin(x)) * 2


def _compile(model, strict=False, **fields):
    config = rewrite.CompilerConfig(**fields)
    config.strict = strict
    return torch.compile(model, backend=rewrite.get_backend(config), fullgraph=True)


def _geared(fallback: str, strict: bool = False):
    model = _Rows().eval()
    compiled = _compile(model, strict, **{"inference_config.gear_fallback": fallback, "exec.tier_up_calls": 0})
    x = torch.randn(4, 8)
    rewrite.inference.set_dim_gears(x, {0: [2, 4]})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    return model, compiled


def test_pads_are_counted_with_their_padded_rows_and_strict_raises():
    model, compiled = _geared("pad")
    with torch.no_grad():
        for rows in (3, 3, 2, 4):
            x = torch.randn(rows, 8)
            torch.testing.assert_close(compiled(x), model(x))
    stats = rewrite.stats(compiled)
    assert (stats.pads, stats.padded_rows) == (2, 2)  # two calls at 3 rows, each padded by one row to gear 4
    assert stats.gears == {(4,): 2, (2,): 1}  # calls each gear served (the padded ones are counted as pads)
    assert stats.slow_paths == 2 and "pads" in str(stats)
    torch._dynamo.reset()
    model, strict = _geared("pad", strict=True)
    with pytest.raises(rewrite.SlowPathError, match=r"padded up to a larger gear.*Fix: add a gear"):
        with torch.no_grad():
            strict(torch.randn(3, 8))
    with torch.no_grad():
        strict(torch.randn(2, 8))  # a gear: no slow path
    assert rewrite.stats(strict).pads == 0


def test_dynamic_fallbacks_are_counted_and_strict_raises():
    model, compiled = _geared("dynamic")
    with torch.no_grad():
        x = torch.randn(3, 8)
        torch.testing.assert_close(compiled(x), model(x))
    assert rewrite.stats(compiled).dynamic_fallbacks == 1
    torch._dynamo.reset()
    _, strict = _geared("dynamic", strict=True)
    with pytest.raises(rewrite.SlowPathError, match="ran the dynamic"), torch.no_grad():
        strict(torch.randn(3, 8))


def test_recompiles_are_counted_with_dynamos_reason_and_strict_raises_on_the_call():
    model = _Rows().eval()
    compiled = torch.compile(model, backend=rewrite.get_backend(rewrite.CompilerConfig()), dynamic=False)
    with torch.no_grad():
        compiled(torch.randn(2, 8))
        compiled(torch.randn(3, 8))  # a second graph for the same function
    stats = rewrite.stats(compiled)
    assert stats.recompiles == 1 and "size mismatch" in stats.events[0][1], stats.events
    torch._dynamo.reset()
    strict = torch.compile(model, backend=rewrite.get_backend(rewrite.CompilerConfig(strict=True)), dynamic=False)
    with torch.no_grad():
        strict(torch.randn(2, 8))
        with pytest.raises(rewrite.SlowPathError, match="retrace.*Fix: declare the sizes"):
            strict(torch.randn(3, 8))  # the error itself, not Dynamo's BackendCompilerFailed


def test_a_graph_that_will_not_tier_up_is_counted_and_strict_raises_on_its_first_call():
    def noisy(x):
        return x + torch.rand_like(x)

    compiled = _compile(noisy)
    compiled(torch.zeros(4))
    stats = rewrite.stats(compiled)
    assert stats.tier_up_refused == 1 and "draws random numbers" in stats.events[0][1]
    torch._dynamo.reset()
    with pytest.raises(rewrite.SlowPathError, match="will not tier up.*draws random numbers"):
        _compile(noisy, strict=True)(torch.zeros(4))


def test_a_failed_tier_up_is_counted(monkeypatch):
    from rewrite.exec import program

    def broken(*args, **kwargs):
        raise RuntimeError("planner broke")

    monkeypatch.setattr(program, "make_plan", broken)
    model = _Rows().eval()
    compiled = _compile(model, **{"exec.tier_up_calls": 1})
    x = torch.randn(4, 8)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x))
    stats = rewrite.stats(compiled)
    assert stats.tier_up_refused == 1 and "planner broke" in stats.events[0][1]


def test_calls_while_a_tier_up_build_is_pending_are_counted_and_strict_raises():
    import threading

    for strict in (False, True):
        entered, release = threading.Event(), threading.Event()

        def build():
            entered.set()
            release.wait(60)
            return lambda x: x + 1

        ledger = Ledger(strict=strict)
        gear = HotSwapGear("g", lambda x: x + 1, build, cold_calls=1, note=lambda m: None, ledger=ledger)
        gear(torch.zeros(2))  # the cold call
        builder = threading.Thread(target=gear, args=(torch.zeros(2),))
        builder.start()  # the second call builds, on its own thread
        assert entered.wait(60)
        if strict:
            with pytest.raises(rewrite.SlowPathError, match="being built by another caller"):
                gear(torch.zeros(2))
        else:
            for _ in range(2):  # calls while it builds run the ATen code
                gear(torch.zeros(2))
            assert ledger.stats().tier_up_pending == 2
        release.set()
        builder.join(60)


def test_calls_with_strides_the_static_kernels_were_not_built_for_are_counted_and_strict_raises():
    """Dynamo guards strides, so through torch.compile another stride is a recompile; a loaded export or a
    cache_compile program has no guards, and its planned graph runs other strides on its plain code."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from rewrite.exec.codegen import compile_graph_to_python
    from rewrite.exec.program import PlannedProgram
    from rewrite.fx_bridge import from_fx
    from rewrite.unit import CompileUnit

    w = torch.randn(8, 8)

    def f(x):
        return (torch.relu(x @ w) * 2,)

    for strict in (False, True):
        graph = from_fx(make_fx(f)(torch.randn(4, 8)))
        unit = CompileUnit.detached("g", rewrite.CompilerConfig(strict=strict, **{"exec.tier_up_calls": 1}))
        program = PlannedProgram(unit)
        gear = program.executable(graph, compile_graph_to_python(graph), plannable=True)
        x = torch.randn(4, 8)
        for _ in range(3):  # past the tier-up onto the plan and its static kernels
            torch.testing.assert_close(gear(x)[0], f(x)[0])
        y = torch.randn(8, 4).t()  # the same shape, other strides
        if strict:
            with pytest.raises(rewrite.SlowPathError, match="strides its static kernels were not built for"):
                gear(y)
        else:
            torch.testing.assert_close(gear(y)[0], f(y)[0])
            assert unit.ledger.stats().aten_fallbacks > 0


def test_a_stride_at_a_dim_of_size_one_is_no_other_layout():
    """A batch-1 row cut from a wider tensor is contiguous, but keeps its parent's stride at the batch dim: no
    address uses it, so the static kernels run it (padded_tokens="skip" cuts such rows), nothing counted."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from rewrite.exec.codegen import compile_graph_to_python
    from rewrite.exec.program import PlannedProgram
    from rewrite.fx_bridge import from_fx
    from rewrite.unit import CompileUnit

    w = torch.randn(8, 8)

    def f(x):
        return (torch.relu(x @ w) * 2,)

    graph = from_fx(make_fx(f)(torch.randn(1, 8)))
    unit = CompileUnit.detached("g", rewrite.CompilerConfig(strict=True, **{"exec.tier_up_calls": 1}))
    gear = PlannedProgram(unit).executable(graph, compile_graph_to_python(graph), plannable=True)
    x = torch.randn(1, 8)
    for _ in range(3):  # past the tier-up onto the plan and its static kernels
        gear(x)
    row = torch.randn(1, 12)[:, :8].contiguous()  # contiguous() keeps the view: its stride is (12, 1)
    assert row.stride() == (12, 1)
    torch.testing.assert_close(gear(row)[0], f(row)[0])  # strict: a fallback would raise
    assert unit.ledger.stats().aten_fallbacks == 0


def test_stats_belong_to_one_torch_compile_call_also_for_the_string_backend():
    model = _Rows().eval()
    first = torch.compile(model, backend="rewrite", dynamic=False)
    second = torch.compile(model, backend="rewrite", dynamic=False)
    with torch.no_grad():
        first(torch.randn(2, 8))
        first(torch.randn(3, 8))
        second(torch.randn(2, 8))
    assert rewrite.stats(first).recompiles == 1 and rewrite.stats(second).recompiles == 0
    with pytest.raises(TypeError, match="not rewrite's"):
        rewrite.stats(torch.compile(model, backend="eager"))
    with pytest.raises(TypeError, match="expected what torch.compile"):
        rewrite.stats(model)



def test_stats_reach_a_module_compiled_in_place_and_the_module_that_holds_it():
    """nn.Module.compile keeps torch.compile's result inside the module (what sentence-transformers users do):
    rewrite.stats finds it there, and inside a module that holds exactly one compiled module."""
    model = _Rows().eval()
    model.compile(backend="rewrite", dynamic=False)
    outer = torch.nn.Sequential(torch.nn.Identity(), model)
    with torch.no_grad():
        model(torch.randn(2, 8))
        model(torch.randn(3, 8))
    assert rewrite.stats(model).recompiles == 1
    assert rewrite.stats(outer).recompiles == 1
    holder = torch.nn.Sequential(torch.compile(_Rows().eval(), backend="rewrite"))  # a compiled child
    assert rewrite.stats(holder).recompiles == 0
    two = torch.nn.Sequential(model, torch.compile(_Rows().eval(), backend="rewrite"))
    with pytest.raises(TypeError, match="holds 2 compiled modules.*: 0, 1"):
        rewrite.stats(two)
    other = _Rows().eval()
    other.compile(backend="eager")
    with pytest.raises(TypeError, match="not rewrite's"):
        rewrite.stats(torch.nn.Sequential(other))
    with pytest.raises(TypeError, match="expected what torch.compile.*nothing in it was compiled"):
        rewrite.stats(torch.nn.Sequential(_Rows()))

def test_explain_prints_the_ledger():
    model = _Rows().eval()
    x = torch.randn(4, 8)
    rewrite.inference.set_dim_gears(x, {0: [2, 4]})
    config = rewrite.CompilerConfig(**{"inference_config.gear_fallback": "pad"})
    with torch.no_grad():
        report = rewrite.explain(model, x, config=config)
    assert report.stats is not None and report.stats.gears
    assert "slow paths: none" in str(report) and "calls per gear" in str(report)
