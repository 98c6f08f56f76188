"""The paths a user takes, on a CUDA device: default mode past tier-up, gears, reduce-overhead's CUDA graph
per gear, static kernels (Inductor's Triton kernels per gear), Inductor kernels, streams, export and load,
cache_compile in a fresh process, concurrent callers. Every result is compared with eager on the same device.

Skipped without CUDA (CI has none); `python -m pytest -m cuda` runs them on a machine that has one.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import rewrite
from conftest import requires_cuda, run_in_threads
from rewrite import models

pytestmark = [pytest.mark.cuda, requires_cuda]

GEARS = [1, 2, 4]
SEQ = 16
# float32 matmuls on CUDA may use other kernels (split-K, other tile orders) than eager for the same math.
TOLERANCES = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.float16: dict(rtol=1e-2, atol=1e-2)}


def _on_cuda(model, dtype=torch.float32):
    return model.to(device="cuda", dtype=dtype).eval()


def _ids(batch: int, seed: int = 0) -> torch.Tensor:
    return models.token_batch(batch, SEQ, seed=seed).cuda()


def _compile(model, config: rewrite.CompilerConfig | None = None):
    torch._dynamo.reset()
    backend = rewrite.get_backend(config or rewrite.CompilerConfig())
    return torch.compile(model, backend=backend, fullgraph=True), backend


def _hidden(out):
    if isinstance(out, dict):  # a loaded export returns a ModelOutput as a plain dict (docs/export_format.md)
        return out["last_hidden_state"]
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def _check(compiled, model, ids, dtype=torch.float32):
    with torch.no_grad():
        got, want = _hidden(compiled(ids)), _hidden(model(ids))
    torch.cuda.synchronize()
    assert got.device.type == "cuda"
    torch.testing.assert_close(got, want, **TOLERANCES[dtype])
    return got


@pytest.fixture
def private_home(tmp_path, monkeypatch):
    """A private per-user cache (signing key, kernels) and build folder for this test."""
    monkeypatch.setenv("REWRITE_CACHE_DIR", str(tmp_path / "cache"))
    build = tmp_path / "build"
    build.mkdir(mode=0o700)
    return build


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_default_mode_matches_eager_before_and_after_tier_up(name, dtype):
    model = _on_cuda(getattr(models, name)(), dtype)
    compiled, backend = _compile(model)
    for call in range(rewrite.CompilerConfig().exec.tier_up_calls + 4):
        _check(compiled, model, _ids(2, seed=call), dtype)
    assert backend.report.graphs


@pytest.mark.parametrize("first", [GEARS[0], GEARS[-1]])
def test_gears_one_dynamo_graph_whatever_the_first_call(first):
    from torch._dynamo.utils import counters

    model = _on_cuda(models.bert())
    compiled, _ = _compile(model)
    ids = _ids(first)
    rewrite.inference.set_dim_gears(ids, {0: GEARS})
    counters.clear()
    _check(compiled, model, ids)
    for batch in GEARS + GEARS:
        _check(compiled, model, _ids(batch, seed=batch))
    assert counters["stats"]["unique_graphs"] == 1


def test_reduce_overhead_cuda_graph_per_gear_outputs_belong_to_the_caller():
    model = _on_cuda(models.bert())
    config = rewrite.CompilerConfig()
    config.mode = "reduce-overhead"
    compiled, backend = _compile(model, config)
    ids = _ids(GEARS[-1])
    rewrite.inference.set_dim_gears(ids, {0: GEARS})
    _check(compiled, model, ids)
    for batch in GEARS * 3:
        out = _check(compiled, model, _ids(batch, seed=batch))
        kept = out.clone()
        with torch.no_grad():
            compiled(_ids(batch, seed=100 + batch))  # a replay must not overwrite what the caller holds
        torch.cuda.synchronize()
        torch.testing.assert_close(out, kept, rtol=0, atol=0)


def test_static_kernels_on_cuda_are_inductor_kernels_per_gear(private_home, monkeypatch):
    from rewrite.exec import inductor

    compiled_graphs = []
    original = inductor.compile_with_inductor
    monkeypatch.setattr(inductor, "compile_with_inductor", lambda g: compiled_graphs.append(g.name) or original(g))
    model = _on_cuda(models.gpt2())
    config = rewrite.CompilerConfig()
    config.mode = "reduce-overhead"
    config.experimental_config.frozen_parameter = True
    config.experimental_config.aclgraph._aclnn_static_shape_kernel = True
    config.experimental_config.aclgraph._aclnn_static_shape_kernel_build_dir = str(private_home)
    compiled, backend = _compile(model, config)
    ids = _ids(GEARS[0])
    rewrite.inference.set_dim_gears(ids, {0: GEARS})
    _check(compiled, model, ids)
    for batch in GEARS * 2:
        _check(compiled, model, _ids(batch, seed=batch))
    assert len(compiled_graphs) >= len(GEARS), compiled_graphs  # one Inductor compile per gear's static graph


def test_inductor_kernels_on_cuda():
    model = _on_cuda(models.bert())
    config = rewrite.CompilerConfig()
    config.exec.kernels = "inductor"
    compiled, _ = _compile(model, config)
    for batch in (1, 3):
        _check(compiled, model, _ids(batch, seed=batch))


class _CausalAttention(torch.nn.Module):
    """Attention under a causal mask made from sizes alone, so the compiler folds it to a constant (as a
    decoder's mask in bart, marian, pegasus): 6 keys, not a multiple of the memory-efficient kernel's alignment."""

    def forward(self, q):
        n = q.shape[-2]
        mask = torch.triu(torch.full((n, n), torch.finfo(q.dtype).min, device=q.device), 1)
        return torch.nn.functional.scaled_dot_product_attention(q, q * 0.5, q, attn_mask=mask)


@pytest.mark.parametrize("mode", ["max-autotune", "reduce-overhead"])  # max-autotune: the default mode
def test_a_folded_attention_mask_of_unaligned_width_runs(mode):
    model = _CausalAttention()
    compiled, _ = _compile(model, rewrite.CompilerConfig(mode=mode))
    for seed in range(3):
        q = torch.randn(2, 2, 6, 8, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
        _check(compiled, model, q)


class _LeftPaddedAttention(torch.nn.Module):
    """Attention written out as transformers' eager attention does (codegen): ``softmax((qk + mask) / sqrt(d))``
    with a causal and padding mask of finfo.min, so a left-padded query row has every key masked."""

    def forward(self, x, keep):
        n, d = x.shape[-2], x.shape[-1]
        causal = torch.arange(n, device=x.device)[None, :] <= torch.arange(n, device=x.device)[:, None]
        allowed = causal[None] & keep.bool()[:, None, :]
        mask = torch.where(allowed, 0.0, torch.finfo(x.dtype).min)
        weights = torch.softmax((x @ x.transpose(-1, -2) + mask) / d ** 0.5, dim=-1)
        return weights @ x


@pytest.mark.parametrize("fields", [{"exec.kernels": "inductor"},
                                    {"mode": "reduce-overhead",
                                     "experimental_config.aclgraph._aclnn_static_shape_kernel": True}])
def test_fully_masked_rows_match_eager_on_inductor_kernels(fields, private_home):
    model = _LeftPaddedAttention()
    config = rewrite.CompilerConfig(**fields)
    config.experimental_config.aclgraph._aclnn_static_shape_kernel_build_dir = str(private_home)
    compiled, _ = _compile(model, config)
    keep = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1], [1] * 8], device="cuda")
    for seed in range(3):
        x = torch.randn(2, 8, 16, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
        with torch.no_grad():
            got, want = compiled(x, keep), model(x, keep)
        assert not got.isnan().any(), "a fully masked row became NaN"
        torch.testing.assert_close(got, want, **TOLERANCES[torch.float32])


def test_auto_streams_on_cuda_match_eager():
    model = _on_cuda(models.bert())
    config = rewrite.CompilerConfig()
    config.exec.auto_streams = True
    compiled, _ = _compile(model, config)
    for call in range(30):
        _check(compiled, model, _ids(2, seed=call))


def test_export_with_default_relative_folder_loads_and_runs_on_cuda(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = _on_cuda(models.bert())
    ids = _ids(2)
    rewrite.inference.set_dim_gears(ids, {0: GEARS})
    with torch.no_grad():
        rewrite.dynamo_export(ids, model=model, dynamic=True)  # default export_path="export_file", a relative folder
    torch._dynamo.reset()
    runner = rewrite.load("export_file")
    for batch in GEARS:
        ids = _ids(batch, seed=batch)
        with torch.no_grad():
            got, want = _hidden(runner(ids)), _hidden(model(ids))
        assert got.device.type == "cuda"
        torch.testing.assert_close(got, want, **TOLERANCES[torch.float32])


CACHED_SCRIPT = textwrap.dedent("""
    import sys, torch
    import rewrite
    from rewrite import models
    from torch._dynamo.utils import counters

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = models.bert().cuda().eval()
            self.cached = rewrite.inference.cache_compile(self.inner_forward)

        def inner_forward(self, ids):
            return self.inner(ids).last_hidden_state

        def forward(self, ids):
            return self.cached(ids)

    model = Wrapped()
    ids = models.token_batch(2, 16).cuda()
    with torch.no_grad():
        got, want = model(ids), model.inner_forward(ids)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert got.device.type == "cuda"
    print("dynamo graphs", int(counters["stats"]["unique_graphs"]))
""")


def test_cache_compile_warm_start_in_a_fresh_process_skips_dynamo(tmp_path):
    script = tmp_path / "cached.py"
    script.write_text(CACHED_SCRIPT)
    env = dict(os.environ, REWRITE_CACHE_DIR=str(tmp_path / "home"),
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                           os.environ.get("PYTHONPATH", "")]))
    runs = [subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
    assert "dynamo graphs 1" in runs[0].stdout, runs[0].stdout
    assert "dynamo graphs 0" in runs[1].stdout, runs[1].stdout  # the warm start ran the cached program


def test_concurrent_callers_of_a_reduce_overhead_model_get_their_own_results():
    model = _on_cuda(models.bert())
    config = rewrite.CompilerConfig()
    config.mode = "reduce-overhead"
    compiled, _ = _compile(model, config)
    _check(compiled, model, _ids(2))

    def work(k: int) -> None:
        for i in range(10):
            _check(compiled, model, _ids(2, seed=1000 * k + i))

    run_in_threads(work, 4)
    torch.randn(4, device="cuda")  # a capture that failed under concurrent callers must not leave the RNG broken


def _past_tier_up(compiled, model, ids_of, dtype=torch.float32):
    """Call through the cold calls and the one that builds the hot code, then call again: the hot code runs."""
    for call in range(rewrite.CompilerConfig().exec.tier_up_calls + 1):
        _check(compiled, model, ids_of(call), dtype)
    for call in range(3):
        _check(compiled, model, ids_of(100 + call), dtype)


def test_the_default_mode_tiers_up_to_a_cuda_graph_of_inductor_kernels(monkeypatch):
    from rewrite.exec import inductor

    compiled_graphs = []
    original = inductor.compile_with_inductor
    monkeypatch.setattr(inductor, "compile_with_inductor", lambda g: compiled_graphs.append(g.name) or original(g))
    model = _on_cuda(models.bert(), torch.float16)
    compiled, backend = _compile(model)
    _past_tier_up(compiled, model, lambda k: _ids(2, seed=k), torch.float16)
    notes = [n for g in backend.report.graphs for n in g.notes]
    assert compiled_graphs and any("tiered up" in n for n in notes), notes
    memory = [g.memory for g in backend.report.graphs if g.memory is not None]
    assert memory and memory[0].allocated, memory  # captured: the pool holds its graph


def test_reduce_overhead_compiles_each_gear_with_inductor_without_the_experimental_switch(monkeypatch):
    from rewrite.exec import inductor

    compiled_graphs = []
    original = inductor.compile_with_inductor
    monkeypatch.setattr(inductor, "compile_with_inductor", lambda g: compiled_graphs.append(g.name) or original(g))
    model = _on_cuda(models.gpt2())
    compiled, _ = _compile(model, rewrite.CompilerConfig(mode="reduce-overhead"))
    ids = _ids(GEARS[-1])
    rewrite.inference.set_dim_gears(ids, {0: GEARS})
    _check(compiled, model, ids)
    for batch in GEARS * 2:
        _check(compiled, model, _ids(batch, seed=batch))
    assert len(compiled_graphs) >= len(GEARS), compiled_graphs


def _pool(batch_gears: list[int], model, first: int):
    """The CUDA-graph pool memory of ``model`` compiled in reduce-overhead with batch gears ``batch_gears``."""
    compiled, backend = _compile(model, rewrite.CompilerConfig(mode="reduce-overhead"))
    ids = models.token_batch(first, 64, vocab=1024).cuda()
    if len(batch_gears) > 1:
        rewrite.inference.set_dim_gears(ids, {0: batch_gears})
    with torch.no_grad():
        compiled(ids)  # the first call captures every gear, largest first
        for b in batch_gears:
            compiled(models.token_batch(b, 64, vocab=1024).cuda())
    (memory,) = [g.memory for g in backend.report.graphs if g.memory is not None]
    return memory


def test_all_gears_share_one_pool_about_the_size_of_the_largest_gear_alone():
    model = _on_cuda(models.bert(layers=2, hidden=512, heads=8, vocab=1024))
    alone = _pool([16], model, 16)
    all_gears = _pool([1, 4, 16], model, 1)  # the first call is the smallest gear: captures still go largest first
    assert all_gears.gears == 3 and alone.gears == 1
    assert all_gears.allocated <= 1.1 * alone.allocated, (all_gears, alone)
    # the prediction, made from the metas before any capture, is an upper bound of the same order
    assert 0.5 * all_gears.allocated <= all_gears.predicted <= 4 * all_gears.allocated, all_gears
    assert all_gears.predicted <= 1.1 * all_gears.largest


def test_generate_with_compile_config_backend_rewrite_gives_eager_tokens():
    from transformers import CompileConfig, LlamaConfig, LlamaForCausalLM

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             max_position_embeddings=128)).to("cuda").eval()
    model.generation_config.pad_token_id = model.generation_config.eos_token_id = None
    ids = torch.randint(4, 512, (1, 8), device="cuda", generator=torch.Generator("cuda").manual_seed(0))

    def generate(**kw):
        with torch.no_grad():
            return model.generate(ids, max_new_tokens=24, min_new_tokens=24, do_sample=False,
                                  cache_implementation="static", **kw)

    want = generate(disable_compile=True)
    torch._dynamo.reset()
    model.generation_config.compile_config = CompileConfig(backend="rewrite")  # transformers' door for a backend
    for _ in range(2):
        assert torch.equal(generate(), want)


def test_gears_past_the_capture_limit_run_uncaptured_counted_and_strict_raises():
    model = _on_cuda(models.bert())
    for strict in (False, True):
        config = rewrite.CompilerConfig(mode="reduce-overhead", strict=strict)
        config.debug.aclgraph.static_capture_size_limit = 2
        compiled, backend = _compile(model, config)
        ids = _ids(GEARS[-1])
        rewrite.inference.set_dim_gears(ids, {0: GEARS})
        _check(compiled, model, ids)  # captures the two largest gears; the smallest is past the limit
        if strict:
            with pytest.raises(rewrite.SlowPathError, match="without its CUDA graph"):
                _check(compiled, model, _ids(GEARS[0]))
        else:
            _check(compiled, model, _ids(GEARS[0]))
            assert rewrite.stats(compiled).uncaptured == 1
