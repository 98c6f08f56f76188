"""The zoo's architectures: each a tiny `transformers` config with random weights (no download) and its inputs.

Sizes are chosen so a model compiles in seconds: 2 layers, hidden 32, 4 heads, vocab 128, 8 tokens,
32x32 images (or what the architecture needs), 400-sample audio. Every builder seeds torch itself, so
weights do not depend on what ran before. ``inputs(batch, seed)`` returns keyword tensors with the batch
as dim 0 (the gears mode puts gears on dim 0 of each of them).

Left out, with why (checked with torch.compile(backend="eager", fullgraph=True) on transformers 5.24):
- longformer, led: sliding-chunk attention guards on a data-dependent size (``Eq(u0, 1)``): fullgraph fails.
- switch_transformers: router code raises inside Dynamo (``Unsupported: Observed exception``).
- reformer: LSH attention branches on data (``Unsupported: Data-dependent branching``).
- dinat / nat: need the `natten` package (not installed).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch

VOCAB = 128
SEQ = 8
H = 32  # hidden size
HEADS = 4
LAYERS = 2
FF = 64  # feed-forward size


@dataclasses.dataclass(frozen=True)
class Arch:
    name: str
    family: str  # encoder | decoder | encoder-decoder | vision | audio | multimodal
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[int, int], dict]  # (batch, seed) -> keyword tensors, batch on dim 0
    # mode -> reason: a known, reported defect (the zoo still runs and compares it; the table says XFAIL)
    xfail: dict = dataclasses.field(default_factory=dict)

    def model(self) -> torch.nn.Module:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            m = self.build()
        return m.eval()


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def tokens(batch: int, seed: int, seq: int = SEQ, vocab: int = VOCAB, low: int = 4) -> torch.Tensor:
    # ids from 4 up: clear of the usual pad/bos/eos ids (0..3), so no model masks them
    return torch.randint(low, vocab, (batch, seq), generator=_gen(seed))


def ids(batch, seed):
    return {"input_ids": tokens(batch, seed)}


def ids_mask(batch, seed):
    """input_ids and an attention mask with the last 3 tokens of odd rows padded away (right padding, encoders)."""
    mask = torch.ones(batch, SEQ, dtype=torch.long)
    mask[1::2, SEQ - 3:] = 0
    return {"input_ids": tokens(batch, seed), "attention_mask": mask}


def ids_left_pad(batch, seed):
    """input_ids and an attention mask with the first 3 tokens of even rows padded away (left padding, decoders):
    a masked position's float mask holds the dtype's minimum, which kernels must keep (issue 24: MPT)."""
    mask = torch.ones(batch, SEQ, dtype=torch.long)
    mask[0::2, :3] = 0
    return {"input_ids": tokens(batch, seed), "attention_mask": mask}


def seq2seq_mask(batch, seed):
    return {**seq2seq(batch, seed), "attention_mask": ids_mask(batch, seed)["attention_mask"]}


def seq2seq(batch, seed):
    return {"input_ids": tokens(batch, seed), "decoder_input_ids": tokens(batch, seed + 1000, seq=SEQ - 2)}


def image(size: int = 32, channels: int = 3):
    def make(batch, seed):
        return {"pixel_values": torch.randn(batch, channels, size, size, generator=_gen(seed))}
    return make


def audio(samples: int = 400):
    def make(batch, seed):
        return {"input_values": torch.randn(batch, samples, generator=_gen(seed))}
    return make


def features(name: str, *shape: int):
    def make(batch, seed):
        return {name: torch.randn(batch, *shape, generator=_gen(seed))}
    return make


def image_and_noise(size: int = 32, patches: int = 16):
    """ViT-MAE draws its patch mask from ``noise``; passing it makes the mask (and eager) reproducible."""
    def make(batch, seed):
        return {**image(size)(batch, seed), "noise": torch.rand(batch, patches, generator=_gen(seed + 7))}
    return make


def text_and_image(size: int = 32):
    def make(batch, seed):
        return {"input_ids": tokens(batch, seed), "pixel_values": torch.randn(batch, 3, size, size, generator=_gen(seed))}
    return make


def _tf(model_cls: str, config_cls: str, **kw):
    """A builder: ``transformers.<model_cls>(transformers.<config_cls>(**kw))``."""
    def build():
        import transformers

        config = getattr(transformers, config_cls)(**kw)
        return getattr(transformers, model_cls)(config)
    return build


# common small settings
BERTISH = dict(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
               intermediate_size=FF, max_position_embeddings=64)
LLAMAISH = dict(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                num_key_value_heads=2, intermediate_size=FF, max_position_embeddings=64, use_cache=False)
BARTISH = dict(vocab_size=VOCAB, d_model=H, encoder_layers=LAYERS, decoder_layers=LAYERS, encoder_attention_heads=HEADS,
               decoder_attention_heads=HEADS, encoder_ffn_dim=FF, decoder_ffn_dim=FF, max_position_embeddings=64,
               use_cache=False, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
T5ISH = dict(vocab_size=VOCAB, d_model=H, d_kv=H // HEADS, d_ff=FF, num_layers=LAYERS, num_decoder_layers=LAYERS,
             num_heads=HEADS, use_cache=False)
VITISH = dict(hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FF,
              image_size=32, patch_size=8)
W2VISH = dict(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FF,
              conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 4), num_conv_pos_embeddings=16,
              num_conv_pos_embedding_groups=4, do_stable_layer_norm=False, mask_time_prob=0.0)

ARCHS: list[Arch] = [
    # -- encoders ------------------------------------------------------------------------------------------
    Arch("bert", "encoder", _tf("BertModel", "BertConfig", **BERTISH), ids_mask),
    Arch("roberta", "encoder", _tf("RobertaModel", "RobertaConfig", **BERTISH), ids_mask),
    Arch("xlm_roberta", "encoder", _tf("XLMRobertaForMaskedLM", "XLMRobertaConfig", **BERTISH), ids_mask),
    Arch("distilbert", "encoder", _tf("DistilBertModel", "DistilBertConfig", vocab_size=VOCAB, dim=H, n_layers=LAYERS,
                                      n_heads=HEADS, hidden_dim=FF, max_position_embeddings=64), ids_mask),
    Arch("albert", "encoder", _tf("AlbertModel", "AlbertConfig", embedding_size=16, **BERTISH), ids_mask),
    Arch("electra", "encoder", _tf("ElectraForPreTraining", "ElectraConfig", embedding_size=16, **BERTISH), ids_mask),
    Arch("deberta", "encoder", _tf("DebertaModel", "DebertaConfig", **BERTISH), ids_mask),
    Arch("deberta_v2", "encoder", _tf("DebertaV2Model", "DebertaV2Config", **BERTISH), ids_mask),
    Arch("mpnet", "encoder", _tf("MPNetModel", "MPNetConfig", **BERTISH), ids_mask),
    Arch("roformer", "encoder", _tf("RoFormerModel", "RoFormerConfig", embedding_size=H, **BERTISH), ids_mask),
    Arch("convbert", "encoder", _tf("ConvBertModel", "ConvBertConfig", embedding_size=H, **BERTISH), ids_mask),
    Arch("squeezebert", "encoder", _tf("SqueezeBertModel", "SqueezeBertConfig", embedding_size=H, **BERTISH), ids_mask),
    Arch("big_bird", "encoder", _tf("BigBirdModel", "BigBirdConfig", attention_type="original_full", **BERTISH),
         ids_mask),
    Arch("megatron_bert", "encoder", _tf("MegatronBertModel", "MegatronBertConfig", **BERTISH), ids_mask),
    Arch("ernie", "encoder", _tf("ErnieModel", "ErnieConfig", **BERTISH), ids_mask),
    Arch("esm", "encoder", _tf("EsmModel", "EsmConfig", pad_token_id=1, **BERTISH), ids_mask),
    Arch("modernbert", "encoder", _tf("ModernBertModel", "ModernBertConfig", vocab_size=VOCAB, hidden_size=H,
                                      num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FF,
                                      max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                      cls_token_id=1, sep_token_id=2), ids_mask),
    # -- decoders ------------------------------------------------------------------------------------------
    Arch("gpt2", "decoder", _tf("GPT2LMHeadModel", "GPT2Config", vocab_size=VOCAB, n_embd=H, n_layer=LAYERS,
                                n_head=HEADS, n_positions=64, use_cache=False), ids_left_pad),
    Arch("gpt_neo", "decoder", _tf("GPTNeoForCausalLM", "GPTNeoConfig", vocab_size=VOCAB, hidden_size=H, num_layers=LAYERS,
                                   num_heads=HEADS, attention_types=[[["global", "local"], 1]], window_size=4,
                                   max_position_embeddings=64, use_cache=False), ids_left_pad),
    Arch("gptj", "decoder", _tf("GPTJForCausalLM", "GPTJConfig", vocab_size=VOCAB, n_embd=H, n_layer=LAYERS, n_head=HEADS,
                                rotary_dim=4, n_positions=64, use_cache=False), ids_left_pad),
    Arch("opt", "decoder", _tf("OPTForCausalLM", "OPTConfig", vocab_size=VOCAB, hidden_size=H, num_hidden_layers=LAYERS,
                               num_attention_heads=HEADS, ffn_dim=FF, word_embed_proj_dim=H,
                               max_position_embeddings=64, use_cache=False), ids_left_pad),
    Arch("llama", "decoder", _tf("LlamaForCausalLM", "LlamaConfig", **LLAMAISH), ids_left_pad),
    Arch("mistral", "decoder", _tf("MistralForCausalLM", "MistralConfig", sliding_window=4, **LLAMAISH), ids_left_pad),
    Arch("qwen2", "decoder", _tf("Qwen2ForCausalLM", "Qwen2Config", **LLAMAISH), ids_left_pad),
    Arch("qwen3", "decoder", _tf("Qwen3ForCausalLM", "Qwen3Config", head_dim=8, **LLAMAISH), ids_left_pad),
    Arch("phi", "decoder", _tf("PhiForCausalLM", "PhiConfig", partial_rotary_factor=0.5, **LLAMAISH), ids_left_pad),
    Arch("phi3", "decoder", _tf("Phi3ForCausalLM", "Phi3Config", pad_token_id=0, **LLAMAISH), ids_left_pad),
    Arch("falcon", "decoder", _tf("FalconForCausalLM", "FalconConfig", vocab_size=VOCAB, hidden_size=H,
                                  num_hidden_layers=LAYERS, num_attention_heads=HEADS, new_decoder_architecture=False,
                                  multi_query=True, alibi=False, use_cache=False), ids_left_pad),
    Arch("falcon_alibi", "decoder", _tf("FalconForCausalLM", "FalconConfig", vocab_size=VOCAB, hidden_size=H,
                                        num_hidden_layers=LAYERS, num_attention_heads=HEADS, alibi=True,
                                        multi_query=False, use_cache=False), ids_left_pad),
    Arch("mpt", "decoder", _tf("MptForCausalLM", "MptConfig", vocab_size=VOCAB, d_model=H, n_layers=LAYERS, n_heads=HEADS,
                               expansion_ratio=2, max_seq_len=64, use_cache=False), ids_left_pad),
    Arch("bloom", "decoder", _tf("BloomForCausalLM", "BloomConfig", vocab_size=VOCAB, hidden_size=H, n_layer=LAYERS,
                                 n_head=HEADS, use_cache=False), ids_left_pad),
    Arch("gpt_neox", "decoder", _tf("GPTNeoXForCausalLM", "GPTNeoXConfig", vocab_size=VOCAB, hidden_size=H,
                                    num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FF,
                                    rotary_pct=0.5, max_position_embeddings=64, use_cache=False), ids_left_pad),
    Arch("gemma", "decoder", _tf("GemmaForCausalLM", "GemmaConfig", head_dim=8, **LLAMAISH), ids_left_pad),
    Arch("gemma2", "decoder", _tf("Gemma2ForCausalLM", "Gemma2Config", head_dim=8, sliding_window=4, **LLAMAISH), ids_left_pad),
    Arch("stablelm", "decoder", _tf("StableLmForCausalLM", "StableLmConfig", partial_rotary_factor=0.5, **LLAMAISH), ids_left_pad),
    Arch("codegen", "decoder", _tf("CodeGenForCausalLM", "CodeGenConfig", vocab_size=VOCAB, n_embd=H, n_layer=LAYERS,
                                   n_head=HEADS, rotary_dim=4, n_positions=64, n_ctx=64, use_cache=False), ids_left_pad),
    Arch("gpt_bigcode", "decoder", _tf("GPTBigCodeForCausalLM", "GPTBigCodeConfig", vocab_size=VOCAB, n_embd=H,
                                       n_layer=LAYERS, n_head=HEADS, n_positions=64, use_cache=False), ids_left_pad),
    Arch("olmo", "decoder", _tf("OlmoForCausalLM", "OlmoConfig", pad_token_id=0, **LLAMAISH), ids_left_pad),
    Arch("olmo2", "decoder", _tf("Olmo2ForCausalLM", "Olmo2Config", pad_token_id=0, **LLAMAISH), ids_left_pad),
    Arch("cohere", "decoder", _tf("CohereForCausalLM", "CohereConfig", pad_token_id=0, **LLAMAISH), ids_left_pad),
    Arch("starcoder2", "decoder", _tf("Starcoder2ForCausalLM", "Starcoder2Config", **LLAMAISH), ids_left_pad),
    Arch("granite", "decoder", _tf("GraniteForCausalLM", "GraniteConfig", **LLAMAISH), ids_left_pad),
    Arch("mixtral", "decoder", _tf("MixtralForCausalLM", "MixtralConfig", num_local_experts=4, num_experts_per_tok=2,
                                   **LLAMAISH), ids_left_pad),
    Arch("qwen2_moe", "decoder", _tf("Qwen2MoeForCausalLM", "Qwen2MoeConfig", num_experts=4, num_experts_per_tok=2,
                                     moe_intermediate_size=32, shared_expert_intermediate_size=32, **LLAMAISH),
         ids_left_pad),
    Arch("mamba", "decoder", _tf("MambaForCausalLM", "MambaConfig", vocab_size=VOCAB, hidden_size=H, num_hidden_layers=LAYERS,
                                 state_size=4, use_cache=False), ids),
    Arch("biogpt", "decoder", _tf("BioGptForCausalLM", "BioGptConfig", **BERTISH, use_cache=False), ids_left_pad),
    Arch("xglm", "decoder", _tf("XGLMForCausalLM", "XGLMConfig", vocab_size=VOCAB, d_model=H, num_layers=LAYERS,
                                attention_heads=HEADS, ffn_dim=FF, max_position_embeddings=64, use_cache=False), ids_left_pad),
    # -- encoder-decoders ----------------------------------------------------------------------------------
    Arch("t5", "encoder-decoder", _tf("T5Model", "T5Config", **T5ISH), seq2seq_mask),
    Arch("mt5", "encoder-decoder", _tf("MT5ForConditionalGeneration", "MT5Config", **T5ISH), seq2seq),
    Arch("bart", "encoder-decoder", _tf("BartModel", "BartConfig", **BARTISH), seq2seq_mask),
    Arch("marian", "encoder-decoder", _tf("MarianMTModel", "MarianConfig", decoder_vocab_size=VOCAB,
                                          **{**BARTISH, "pad_token_id": 3}), seq2seq),
    Arch("pegasus", "encoder-decoder", _tf("PegasusModel", "PegasusConfig", **BARTISH), seq2seq),
    Arch("mbart", "encoder-decoder", _tf("MBartForConditionalGeneration", "MBartConfig", **BARTISH), seq2seq),
    Arch("blenderbot", "encoder-decoder", _tf("BlenderbotModel", "BlenderbotConfig", **BARTISH), seq2seq),
    Arch("plbart", "encoder-decoder", _tf("PLBartModel", "PLBartConfig", **BARTISH), seq2seq),
    Arch("m2m100", "encoder-decoder", _tf("M2M100Model", "M2M100Config", **BARTISH), seq2seq),
    # -- vision --------------------------------------------------------------------------------------------
    Arch("vit", "vision", _tf("ViTModel", "ViTConfig", **VITISH), image()),
    Arch("deit", "vision", _tf("DeiTModel", "DeiTConfig", **VITISH), image()),
    Arch("beit", "vision", _tf("BeitModel", "BeitConfig", use_relative_position_bias=True, **VITISH), image()),
    Arch("data2vec_vision", "vision", _tf("Data2VecVisionModel", "Data2VecVisionConfig", **VITISH), image()),
    Arch("vit_mae", "vision", _tf("ViTMAEModel", "ViTMAEConfig", mask_ratio=0.5, **VITISH), image_and_noise()),
    Arch("dinov2", "vision", _tf("Dinov2Model", "Dinov2Config", hidden_size=H, num_hidden_layers=LAYERS,
                                 num_attention_heads=HEADS, mlp_ratio=2, image_size=32, patch_size=8), image()),
    Arch("resnet", "vision", _tf("ResNetModel", "ResNetConfig", embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                                 layer_type="basic"), image()),
    Arch("regnet", "vision", _tf("RegNetModel", "RegNetConfig", embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                                 groups_width=8), image()),
    Arch("convnext", "vision", _tf("ConvNextModel", "ConvNextConfig", hidden_sizes=[16, 32], depths=[1, 1],
                                   num_stages=2), image()),
    Arch("convnextv2", "vision", _tf("ConvNextV2Model", "ConvNextV2Config", hidden_sizes=[16, 32], depths=[1, 1],
                                     num_stages=2), image()),
    Arch("swin", "vision", _tf("SwinModel", "SwinConfig", image_size=32, patch_size=2, embed_dim=16, depths=[1, 1],
                               num_heads=[2, 4], window_size=4), image()),
    Arch("swinv2", "vision", _tf("Swinv2Model", "Swinv2Config", image_size=32, patch_size=2, embed_dim=16, depths=[1, 1],
                                 num_heads=[2, 4], window_size=4), image()),
    Arch("mobilenet_v2", "vision", _tf("MobileNetV2Model", "MobileNetV2Config", image_size=32, depth_multiplier=0.25),
         image()),
    Arch("mobilenet_v1", "vision", _tf("MobileNetV1Model", "MobileNetV1Config", image_size=32, depth_multiplier=0.25),
         image()),
    Arch("efficientnet", "vision", _tf("EfficientNetModel", "EfficientNetConfig", image_size=32, width_coefficient=0.25,
                                       depth_coefficient=0.25, hidden_dim=320), image()),
    Arch("segformer", "vision", _tf("SegformerModel", "SegformerConfig", num_encoder_blocks=2, depths=[1, 1],
                                    sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2],
                                    num_attention_heads=[1, 2], mlp_ratios=[2, 2]), image()),
    Arch("poolformer", "vision", _tf("PoolFormerModel", "PoolFormerConfig", hidden_sizes=[16, 32], depths=[1, 1],
                                     num_encoder_blocks=2, patch_sizes=[7, 3], strides=[4, 2], padding=[2, 1],
                                     mlp_ratio=2.0), image()),
    Arch("levit", "vision", _tf("LevitModel", "LevitConfig", image_size=64, hidden_sizes=[32, 48], num_attention_heads=[2, 3],
                                depths=[1, 1], key_dim=[8, 8], down_ops=[["Subsample", 8, 2, 4, 2, 2]]), image(64)),
    Arch("mobilevit", "vision", _tf("MobileViTModel", "MobileViTConfig", image_size=32, hidden_sizes=[16, 24, 32],
                                    neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 48], num_attention_heads=2), image()),
    Arch("bit", "vision", _tf("BitModel", "BitConfig", embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                              num_groups=4), image()),
    Arch("focalnet", "vision", _tf("FocalNetModel", "FocalNetConfig", image_size=32, patch_size=4, embed_dim=16,
                                   depths=[1, 1], focal_levels=[2, 2], focal_windows=[3, 3]), image()),
    # -- audio ---------------------------------------------------------------------------------------------
    Arch("whisper_encoder", "audio",
         lambda: _tf("WhisperModel", "WhisperConfig", vocab_size=VOCAB, d_model=H, encoder_layers=LAYERS,
                     decoder_layers=LAYERS, encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
                     encoder_ffn_dim=FF, decoder_ffn_dim=FF, num_mel_bins=16, max_source_positions=16,
                     max_target_positions=32, pad_token_id=0, bos_token_id=1,
                     eos_token_id=2, decoder_start_token_id=1, use_cache=False)().get_encoder(),
         features("input_features", 16, 32)),
    Arch("wav2vec2", "audio", _tf("Wav2Vec2Model", "Wav2Vec2Config", **W2VISH), audio()),
    Arch("hubert", "audio", _tf("HubertModel", "HubertConfig", **W2VISH), audio()),
    Arch("wavlm", "audio", _tf("WavLMModel", "WavLMConfig", **W2VISH), audio()),
    Arch("data2vec_audio", "audio", _tf("Data2VecAudioModel", "Data2VecAudioConfig", **W2VISH), audio()),
    Arch("ast", "audio", _tf("ASTModel", "ASTConfig", hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                             intermediate_size=FF, num_mel_bins=16, max_length=32, patch_size=8, frequency_stride=8,
                             time_stride=8), features("input_values", 32, 16)),
    Arch("speech2text", "audio", _tf("Speech2TextModel", "Speech2TextConfig", **{**BARTISH, "max_source_positions": 64,
                                                                                  "max_target_positions": 64},
                                     input_feat_per_channel=16, conv_channels=16),
         lambda batch, seed: {**features("input_features", 16, 16)(batch, seed),
                              "decoder_input_ids": tokens(batch, seed + 1000, seq=6)}),
    # -- multimodal ----------------------------------------------------------------------------------------
    Arch("clip", "multimodal", _tf("CLIPModel", "CLIPConfig",
                                   text_config=dict(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=LAYERS,
                                                    num_attention_heads=HEADS, intermediate_size=FF,
                                                    max_position_embeddings=64),
                                   vision_config=dict(hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                                      intermediate_size=FF, image_size=32, patch_size=8),
                                   projection_dim=16), text_and_image()),
    Arch("siglip", "multimodal", _tf("SiglipModel", "SiglipConfig",
                                     text_config=dict(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=LAYERS,
                                                      num_attention_heads=HEADS, intermediate_size=FF,
                                                      max_position_embeddings=64),
                                     vision_config=dict(hidden_size=H, num_hidden_layers=LAYERS,
                                                        num_attention_heads=HEADS, intermediate_size=FF, image_size=32,
                                                        patch_size=8)), text_and_image()),
]

BY_NAME = {a.name: a for a in ARCHS}
assert len(BY_NAME) == len(ARCHS), "duplicate architecture names"
