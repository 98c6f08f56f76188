"""Real models through torch.compile(backend="rewrite"), compared with eager."""
import pytest
import torch

import rewrite
from rewrite import models

# fp32 end to end; differences come only from kernel choice and op order.
ATOL, RTOL = 2e-5, 1e-4


def _inputs(name):
    if name == "vit":
        torch.manual_seed(0)
        return (torch.randn(2, 3, 32, 32),), {}
    if name == "t5":
        ids = models.token_batch(2, 12)
        return (), {"input_ids": ids, "decoder_input_ids": ids[:, :7]}
    vocab = 30522 if name == "minilm" else 512
    return (models.token_batch(2, 16, vocab=vocab),), {}


MODELS = ["bert", "gpt2", "t5", "vit", "minilm"]


@pytest.mark.parametrize("name", MODELS)
def test_model_fullgraph_matches_eager(name):
    model = getattr(models, name)()
    args, kwargs = _inputs(name)
    backend = rewrite.get_backend()
    with torch.no_grad():
        expected = model(*args, **kwargs).last_hidden_state
        compiled = torch.compile(model, backend=backend, fullgraph=True)
        got = compiled(*args, **kwargs).last_hidden_state
        again = compiled(*args, **kwargs).last_hidden_state
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(again, expected, atol=ATOL, rtol=RTOL)
    assert len(backend.report.graphs) == 1
    assert backend.report.ops_before > 50  # a real transformer graph, not a trivial one


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_model_with_graph_break_matches_eager(name):
    model = getattr(models, name)()
    (ids,), _ = _inputs(name)

    def run(ids):
        hidden = model(ids).last_hidden_state
        torch._dynamo.graph_break()
        return torch.nn.functional.normalize(hidden.mean(dim=1), dim=-1)

    backend = rewrite.get_backend()
    with torch.no_grad():
        expected = run(ids)
        got = torch.compile(run, backend=backend)(ids)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=RTOL)
    assert len(backend.report.graphs) == 2  # one graph each side of the break


def test_minilm_real_weights_sentence_embedding():
    """MiniLM with its shipped weights: mean-pooled embeddings match eager and are non-trivial."""
    model = models.minilm()
    ids = models.token_batch(3, 20, vocab=30522, seed=3)
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0

    def embed(ids, mask):
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
        m = mask.unsqueeze(-1).to(hidden.dtype)
        return torch.nn.functional.normalize((hidden * m).sum(1) / m.sum(1), dim=-1)

    with torch.no_grad():
        expected = embed(ids, mask)
        got = torch.compile(embed, backend="rewrite", fullgraph=True)(ids, mask)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=RTOL)
    # real weights: different sentences give clearly different embeddings
    assert (expected[0] @ expected[2]).abs() < 0.999


def test_training_step_gradients_match_eager():
    torch.manual_seed(0)

    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                                   torch.nn.Linear(32, 4))

    x, target = torch.randn(8, 16), torch.randint(0, 4, (8,))
    eager_model, compiled_model = make(), make()
    compiled = torch.compile(compiled_model, backend=rewrite.get_backend())
    results = []
    for model, fn in ((eager_model, eager_model), (compiled_model, compiled)):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for _ in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(fn(x), target)
            loss.backward()
            losses.append(loss.detach())
            grads = [p.grad.clone() for p in model.parameters()]
            opt.step()
        results.append((losses, grads, [p.detach().clone() for p in model.parameters()]))
    (l1, g1, p1), (l2, g2, p2) = results
    for a, b in zip(l1 + g1 + p1, l2 + g2 + p2):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
