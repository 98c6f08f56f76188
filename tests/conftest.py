import os
import tempfile
import threading

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The default mode's tier-up keeps static kernels (and their signing key) under $XDG_CACHE_HOME:
# the test session gets its own, so tests neither read nor fill the user's cache.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="rewrite-tests-cache-")


@pytest.fixture(autouse=True)
def _size_oblivious_flag_restored():
    """set_dim_gears turns on a torch flag until the geared graph runs; never leak it to other tests."""
    before = torch.fx.experimental._config.backed_size_oblivious
    yield
    from rewrite.gears.spec import restore_size_oblivious

    restore_size_oblivious()
    torch.fx.experimental._config.backed_size_oblivious = before


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test starts with Dynamo's caches empty, so compile counts are the test's own."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def has_cuda() -> bool:
    return torch.cuda.is_available()


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def run_in_threads(work, n: int) -> None:
    """Run ``work(k)`` for k in 0..n-1 on n threads released together; the first failure fails the test."""
    errors: list = []
    barrier = threading.Barrier(n)

    def run(k: int) -> None:
        try:
            barrier.wait()
            work(k)
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def tiny_llama():
    """A 2-layer Llama with GQA (random weights, seed 0) ready for greedy static-cache `generate`, and a 6-token
    prompt: the decoder the static-cache tests share."""
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2,
                                             max_position_embeddings=64)).eval()
    model.generation_config.pad_token_id = model.generation_config.eos_token_id = None
    return model, torch.randint(4, 128, (1, 6), generator=torch.Generator().manual_seed(0))
