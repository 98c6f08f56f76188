"""The default mode's tier-up: a static CPU graph runs its ATen code for ``exec.tier_up_calls`` calls,
then gets reduce-overhead's execution plan and static kernels; anything in the way leaves it on
its ATen code (or on a plan without kernels), with a note, never an error."""
from __future__ import annotations

import pytest
import torch

import rewrite
from conftest import run_in_threads
from rewrite import models
from rewrite.kernels import compiler
from rewrite.exec.program import PlannedProgram
from rewrite.ir import Graph, meta_of_value
from rewrite.unit import CompileUnit

ATOL, RTOL = 5e-5, 1e-4


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Tier-up keeps its kernels (and the signing key) under $XDG_CACHE_HOME: a fresh one per test."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


class _Block(torch.nn.Module):
    def __init__(self, width: int = 32):
        super().__init__()
        self.a = torch.nn.Linear(width, 4 * width)
        self.b = torch.nn.Linear(4 * width, width)
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, x):
        return self.norm(self.b(torch.nn.functional.gelu(self.a(x))) + x), x.sum(-1)


def _compile(model, calls: int | None = None, frozen: bool = True):
    config = rewrite.CompilerConfig()
    config.experimental_config.frozen_parameter = frozen
    if calls is not None:
        config.exec.tier_up_calls = calls
    backend = rewrite.get_backend(config)
    return torch.compile(model, backend=backend, fullgraph=True), backend


def _notes(backend) -> list[str]:
    return [n for g in backend.report.graphs for n in g.notes]


def _tiered(backend) -> list[str]:
    return [n for n in _notes(backend) if "tiered up" in n]


def _block_calls_match_eager(tier_up_calls: int, calls: int):
    """Compile a `_Block`, call it ``calls`` times on one input, each result equal to eager's; its backend."""
    model = _Block().eval()
    compiled, backend = _compile(model, calls=tier_up_calls)
    x = torch.randn(4, 32)
    with torch.no_grad():
        for _ in range(calls):
            torch.testing.assert_close(compiled(x), model(x), atol=ATOL, rtol=RTOL)
    return backend


def test_default_mode_tiers_up_after_the_configured_calls_and_results_stay_right():
    model = _Block().eval()
    compiled, backend = _compile(model, calls=3)
    inputs = [torch.randn(8, 32) for _ in range(6)]
    held = []
    with torch.no_grad():
        for k, x in enumerate(inputs):
            out = compiled(x)
            want = model(x)
            torch.testing.assert_close(out, want, atol=ATOL, rtol=RTOL)
            held.append((out[0], want[0]))
            assert bool(_tiered(backend)) == (k >= 3), (k, _notes(backend))  # 3 plain calls, the 4th tiers up
    for got, want in held:  # the caller owns what it got: later calls wrote elsewhere
        torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)
    (note,) = _tiered(backend)
    assert "after 3 calls" in note
    if compiler.compiler_available():
        assert " 0 ops on static kernels" not in note
        assert any(n.startswith("static kernels:") for n in _notes(backend))


def test_tier_up_calls_zero_keeps_the_aten_code(monkeypatch):
    made = []
    original = PlannedProgram.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(PlannedProgram, "__init__", init)
    backend = _block_calls_match_eager(tier_up_calls=0, calls=12)
    assert not made and not _tiered(backend)


def test_tier_up_calls_is_checked_when_set():
    config = rewrite.CompilerConfig()
    with pytest.raises(rewrite.ConfigError, match="tier_up_calls"):
        config.exec.tier_up_calls = -1
    with pytest.raises(rewrite.ConfigError, match="tier_up_calls"):
        config.exec.tier_up_calls = 2.5


def test_each_gear_tiers_up_on_its_own_calls():
    model = _Block().eval()
    compiled, backend = _compile(model, calls=2)
    x = torch.randn(8, 32)
    rewrite.inference.set_dim_gears(x, {0: [2, 4, 8]})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=ATOL, rtol=RTOL)  # compiles the gears
        for rows in (8, 8, 8, 2, 2, 4, 8, 2, 2, 8):
            y = torch.randn(rows, 32)
            torch.testing.assert_close(compiled(y), model(y), atol=ATOL, rtol=RTOL)
    tiered = _tiered(backend)
    assert len(tiered) == 2, _notes(backend)  # gear 8 (6 calls) and gear 2 (4 calls); gear 4 was called once
    assert len({note.split()[1] for note in tiered}) == 2  # "graph <name> tiered up ...": two graphs


def test_graphs_that_draw_random_numbers_do_not_tier_up():
    """The observed run would advance the generator: the sequence must stay eager's."""
    def noisy(x):
        return x + torch.rand_like(x)

    compiled, backend = _compile(noisy, calls=1)
    x = torch.zeros(16)
    torch.manual_seed(0)
    got = [compiled(x) for _ in range(5)]
    torch.manual_seed(0)
    want = [noisy(x) for _ in range(5)]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert not _tiered(backend)


def test_attention_without_dropout_tiers_up():
    """SDPA is tagged random because of its dropout; with dropout_p = 0 it draws nothing."""
    def attend(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    compiled, backend = _compile(attend, calls=1)
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    for _ in range(3):
        torch.testing.assert_close(compiled(q, k, v), attend(q, k, v), atol=ATOL, rtol=RTOL)
    assert _tiered(backend), _notes(backend)


def test_without_a_c_compiler_the_plan_comes_without_kernels(monkeypatch):
    monkeypatch.setattr(compiler, "compiler_available", lambda: False)
    backend = _block_calls_match_eager(tier_up_calls=1, calls=4)
    (note,) = _tiered(backend)
    assert " 0 ops on static kernels" in note
    assert any("no C compiler" in n for n in _notes(backend))


def test_an_unusable_cache_folder_leaves_a_plan_without_kernels(private_cache):
    private_cache.parent.mkdir(parents=True, exist_ok=True)
    private_cache.write_text("a file where the cache folder should be")
    backend = _block_calls_match_eager(tier_up_calls=1, calls=4)
    assert any(n.startswith("tier-up without static kernels") for n in _notes(backend)), _notes(backend)
    assert _tiered(backend)


def test_a_failed_tier_up_keeps_the_aten_code_and_says_why(monkeypatch):
    def broken(self, gears):
        if gears:  # finalize() at compile time has none: the default mode plans nothing then
            raise RuntimeError("simulated build failure")

    monkeypatch.setattr(PlannedProgram, "materialize", broken)
    backend = _block_calls_match_eager(tier_up_calls=1, calls=5)
    assert not _tiered(backend)
    failed = [n for n in _notes(backend) if "keeps its ATen code" in n]
    assert len(failed) == 1 and "simulated build failure" in failed[0]  # tried once, not on every call


def test_concurrent_callers_across_the_tier_up():
    model = _Block().eval()
    compiled, backend = _compile(model, calls=4)
    inputs = [torch.randn(16, 32) for _ in range(8)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
        compiled(inputs[0])  # one compile; the threads race only across the tier-up

    def worker(k: int):
        with torch.no_grad():
            for _ in range(10):
                for j in range(k, len(inputs), 4):
                    torch.testing.assert_close(compiled(inputs[j]), expected[j], atol=ATOL, rtol=RTOL)

    run_in_threads(worker, 4)
    assert len(_tiered(backend)) == 1


def test_in_place_input_updates_survive_the_tier_up():
    def bump(x, y):
        x.add_(1.0)
        return x * y

    compiled, backend = _compile(bump, calls=2, frozen=False)
    x, y = torch.randn(8), torch.randn(8)
    x_eager = x.clone()
    for _ in range(5):
        torch.testing.assert_close(compiled(x, y), bump(x_eager, y))
        torch.testing.assert_close(x, x_eager)  # each call added exactly once, the observed run included
    assert _tiered(backend), _notes(backend)


def test_graphs_with_effects_outside_them_do_not_tier_up():
    """Planning runs the graph once more: a side effect would happen twice. Writes to the graph's
    inputs are fine (the observed run writes copies); collectives are made locally in that run
    (tests/test_tensor_parallel.py)."""
    def graph(effect: bool):
        g = Graph("g")
        x = g.placeholder("x", meta_of_value(torch.zeros(4)))
        y = g.call(torch.ops.aten.mul.Tensor, (x, 2.0), meta=meta_of_value(torch.zeros(4)),
                   attrs={"side_effect": True} if effect else None)
        g.set_output((y,))
        return g

    program = PlannedProgram(CompileUnit.detached("g", rewrite.CompilerConfig()))
    plain = lambda x: (x * 2,)  # noqa: E731
    assert program.executable(graph(effect=True), plain, plannable=True) is plain
    assert program.executable(graph(effect=False), plain, plannable=True) is not plain


def test_gpt2_tiers_up_and_matches_eager():
    model = models.gpt2().eval()
    compiled, backend = _compile(model, calls=2)
    with torch.no_grad():
        for seed in range(4):
            tokens = models.token_batch(2, 16, seed=seed)
            got, want = compiled(tokens), model(tokens)
            torch.testing.assert_close(got[0], want[0], atol=1e-4, rtol=1e-4)
    assert _tiered(backend), _notes(backend)


def test_training_graphs_keep_their_aten_code():
    model = _Block()
    compiled, backend = _compile(model, calls=1, frozen=False)
    x = torch.randn(4, 32)
    for _ in range(4):
        model.zero_grad()
        compiled(x)[0].sum().backward()
        got = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        model(x)[0].sum().backward()
        for g, w in zip(got, (p.grad for p in model.parameters())):
            torch.testing.assert_close(g, w, atol=ATOL, rtol=RTOL)
    assert not _tiered(backend)


def test_loaded_exports_tier_up(tmp_path):
    model = _Block().eval()
    x = torch.randn(4, 32)
    rewrite.dynamo_export(x, model=model, export_path=str(tmp_path / "export"), dynamic=False)
    config = rewrite.CompilerConfig()
    config.exec.tier_up_calls = 2
    runner = rewrite.load(str(tmp_path / "export"), config=config)
    with torch.no_grad():
        for _ in range(4):
            y = torch.randn(4, 32)
            torch.testing.assert_close(runner(y), model(y), atol=ATOL, rtol=RTOL)
    assert any("tiered up after 2 calls" in n for n in runner.report.notes), runner.report.notes


def test_mpt_with_a_padding_mask_matches_eager_after_the_tier_up():
    """Issue 24: MPT (ALiBi) turns its float attention mask into bool with `.bool()`; the static kernel of
    that `_to_copy` cast with C's `(uint8_t)x`, which truncates and is undefined for -3.4e38, so the masked
    positions became unmasked after the tier-up (logits off by 0.5). Written as a user runs it."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.MptConfig(vocab_size=100, d_model=64, n_heads=4, n_layers=2, max_seq_len=32)
    model = transformers.MptForCausalLM(config).eval()
    ids = torch.randint(0, 100, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[0, :3] = 0  # left padding: the float mask holds the dtype's minimum where attention is masked
    compiled = torch.compile(model, backend="rewrite")
    with torch.no_grad():
        want = model(ids, attention_mask=mask).logits
        for call in range(10):  # 8 calls of ATen code, then the tier-up to the plan and static kernels
            got = compiled(ids, attention_mask=mask).logits
            torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL, msg=lambda m, c=call: f"call {c}: {m}")


def test_transposed_weights_of_unfrozen_linears_are_not_made_per_call(monkeypatch):
    """Without frozen weights a linear is mm(x, permute(w)): the tiered code hands the static GEMM
    the weight's own address instead of making the transposed view each call, and stays right when
    the caller changes the weights in place or passes another input layout."""
    from rewrite.exec import planned

    made = []
    real_init = planned.PlannedExecutable.__init__

    def spy(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(planned.PlannedExecutable, "__init__", spy)
    model = _Block().eval()
    compiled, backend = _compile(model, calls=1, frozen=False)
    x = torch.randn(4, 32)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x), atol=ATOL, rtol=RTOL)
        assert made and _tiered(backend)
        if compiler.compiler_available():
            elided = {n.op for p in made for i, n in enumerate(p.graph.nodes) if i in p._elided_views()}
            assert "aten.permute.default" in elided
            assert "permute" not in made[0].source
        model.a.weight.mul_(2.0)  # the weights stay the caller's: a change shows in the next call
        torch.testing.assert_close(compiled(x), model(x), atol=ATOL, rtol=RTOL)
        xt = torch.randn(32, 4).t()  # another input layout: the guarded strides send it to the plain code
        torch.testing.assert_close(compiled(xt), model(xt), atol=ATOL, rtol=RTOL)
