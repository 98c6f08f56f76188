import os
import tempfile

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
