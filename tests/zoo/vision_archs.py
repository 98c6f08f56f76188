"""The zoo's `timm` and `diffusers` architectures (issue 51): small random configs, no download, run by the same
runner as the `transformers` zoo (tests/zoo/archs.py) through every mode and compared with eager.

Two families, each populated only when its library imports:
- ``timm``: ``timm.create_model(name, pretrained=False, ...)`` with small sizes where the variant takes them as
  keyword overrides, timm's own tiny ``test_*`` variants where they exist, or the model class itself where the
  variant fixes the argument that must shrink (mixer, gmlp, poolformer, convmixer, nest, volo, mvitv2). Images of
  32x32; 64x64 where the model's windows or subsampling need it, 96 for inception_v3 (its stem needs 75), 120 for
  crossvit (the smallest size both of its patch sizes tile). timm needs torchvision, whose wheels pair with one torch each: it runs in
  ``.venv-torch2.14`` (torch 2.14.1 + torchvision 0.29.1, ``make zoo-vision``), not in ``.venv``.
- ``diffusers``: what a Stable Diffusion pipeline runs, from tiny config dicts: ``UNet2DConditionModel`` called as
  pipelines call it (a latent, a 0-d timestep for the whole batch, the text encoder's states), the same UNet with
  one timestep per row, ``AutoencoderKL`` (encode then decode), and the text encoder (transformers'
  ``CLIPTextModel``).

Random weights that a comparison can see through. A fresh timm or diffusers model is built to start training, not
to be compared: residual branches end in a zero-initialized norm (``zero_init_last``) or a layer scale of 1e-6..1e-5
(ConvNeXt, CaiT, PoolFormer), heads start at zero (MLP-Mixer) or at 1e-3 of their scale (BEiT, EVA), and eval-mode
norms have the identity's statistics. Outputs then hang on the skip paths, some at 1e-4 of the comparison's scale
(its floor is 1), where a wrong attention or convolution would pass. So every parameter that a builder left
constant (all elements equal: norm weights and biases, layer scales, zero heads, zero biases) and every batch norm's
running statistics are drawn at random (`randomize_constant_parameters`): weights around 1, zeros around 0, variances
in [0.5, 1.5]. These are values training could reach; the code the model runs is unchanged.

A timm model is compared on its feature map and its logits (``forward_features`` then ``forward_head``, which is
what ``forward`` does): logits alone, after global pooling, would hide a wrong value at one position of the map.

``python -m tests.zoo --family timm,diffusers`` (``make zoo-vision``) runs them all; tests/test_zoo_vision.py runs a
subset in CI (``make test-torch2.14``) and all of them with ``ZOO_ALL=1``.

More than one Dynamo graph in the gears mode (every call still equals eager; the runner records the count and does
not require 1; ``python -m tests.zoo.gear_graphs --only NAME`` prints the guard): timm_beit (``1 == batch`` from
``F.scaled_dot_product_attention`` at timm's beit.py:238), timm_maxvit (``1 == batch`` from SDPA at maxxvit.py:318
with the first call at 1; ``2 <= batch <= 15`` from ``adaptive_avg_pool2d`` with the first call at 4) and timm_mvitv2
(``batch == 1`` from ``torch.einsum`` at mvitv2.py:193: three graphs with the first call at 1). Op guards of the
kind issue 27 released for transformers' swin and convnext, left for the gears work (rewrite/gears/compile.py).

Left out, with why (checked with torch.compile(backend="eager", fullgraph=True) on torch 2.14.1, timm 1.0.31,
diffusers 0.42.1):
- sequencer (sequencer2d_*): its blocks are LSTMs, which Dynamo does not trace (``Unsupported: Attempted to wrap RNN,
  GRU, or LSTM``; ``torch._dynamo.config.allow_rnn`` is experimental), so fullgraph fails.
"""
from __future__ import annotations

import torch

from .archs import Arch, VOCAB, _gen, _tf, tokens

H = 32  # embedding width of the transformer-style timm models and of the text encoder
TEXT_SEQ = 16  # text encoder tokens (pipelines pad to 77; 16 keeps the cross-attention small)
LATENT = 4  # latent channels of the VAE and the UNet
LATENT_SIZE = 16  # latent height and width the UNet is called with


def randomize_constant_parameters(model: torch.nn.Module) -> torch.nn.Module:
    """Every constant floating parameter (all elements equal) and every batch norm's running statistics drawn at
    random from torch's generator (the Arch builder seeds it): a constant that is not 0 (norm weights, layer scales)
    becomes U(0.5, 1.5) times its sign; 0 becomes N(0, 0.1) for biases and 1-d weights, and normal with std
    fan_in**-0.5 for a zero matrix (a zero head); running variances U(0.5, 1.5), running means N(0, 0.1). See the module docstring."""
    with torch.no_grad():
        for p in model.parameters():
            if not p.is_floating_point() or p.numel() < 2 or bool(p.min() != p.max()):
                continue
            c = float(p.flatten()[0])
            if c != 0:
                p.copy_(torch.empty_like(p).uniform_(0.5, 1.5) * (1.0 if c > 0 else -1.0))
            elif p.dim() >= 2:
                p.normal_(0.0, p[0].numel() ** -0.5)
            else:
                p.normal_(0.0, 0.1)
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._NormBase) and m.track_running_stats and m.running_var is not None:
                m.running_var.uniform_(0.5, 1.5)
                m.running_mean.normal_(0.0, 0.1)
    return model


class FeaturesAndLogits(torch.nn.Module):
    """A timm model's ``forward`` split in its two documented halves, both returned: the feature map is compared
    with eager as well as the logits (see the module docstring)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        features = self.model.forward_features(x)
        return {"features": features, "logits": self.model.forward_head(features)}


def _timm(name: str, **overrides):
    """A builder: ``timm.create_model(name, pretrained=False, num_classes=10, **overrides)``, its constant parameters
    randomized, returning features and logits."""
    def build():
        import timm

        model = timm.create_model(name, pretrained=False, num_classes=10, **overrides)
        return FeaturesAndLogits(randomize_constant_parameters(model))
    return build


def _timm_class(module: str, cls: str, **kwargs):
    """A builder for a variant whose registered function fixes an argument that must shrink (it passes the argument
    itself, so an override would be given twice): the model class of ``timm.models.<module>`` with ``kwargs``."""
    def build():
        import importlib

        model_cls = getattr(importlib.import_module(f"timm.models.{module}"), cls)
        return FeaturesAndLogits(randomize_constant_parameters(model_cls(num_classes=10, **kwargs)))
    return build


def timm_image(size: int = 32):
    def make(batch, seed):
        return {"x": torch.randn(batch, 3, size, size, generator=_gen(seed))}
    return make


# Transformer-style timm models: 2 blocks, width 32, 4 heads, 8x8 patches of a 32x32 image (16 tokens).
VIT_SMALL = dict(img_size=32, patch_size=8, embed_dim=H, depth=2, num_heads=4)




def _gmlp_build():
    from timm.models.mlp_mixer import GatedMlp, MlpMixer, SpatialGatingBlock
    # gmlp_ti16_224's blocks (spatial gating units), 2 of them, width 32, 8x8 patches
    return FeaturesAndLogits(randomize_constant_parameters(MlpMixer(
        num_classes=10, img_size=32, patch_size=8, num_blocks=2, embed_dim=H, mlp_ratio=6,
        block_layer=SpatialGatingBlock, mlp_layer=GatedMlp)))


def _mvitv2_build():
    from timm.models.mvitv2 import MultiScaleVit, MultiScaleVitCfg
    # mvitv2_tiny's pooling attention, 1 block per stage, width 16 doubling per stage
    return FeaturesAndLogits(randomize_constant_parameters(MultiScaleVit(
        MultiScaleVitCfg(depths=(1, 1, 1, 1), embed_dim=16, num_heads=1), img_size=(64, 64), num_classes=10)))


def _poolformer_build():
    from timm.layers import GroupNorm1
    from timm.models.metaformer import MetaFormer
    # poolformer_s12's own settings, at 1 block per stage and narrow stages
    return FeaturesAndLogits(randomize_constant_parameters(MetaFormer(
        num_classes=10, depths=(1, 1, 1, 1), dims=(16, 32, 48, 64), downsample_norm=None, mlp_act=torch.nn.GELU,
        mlp_bias=True, norm_layers=GroupNorm1, layer_scale_init_values=1e-5, res_scale_init_values=None,
        use_mlp_head=False)))


TIMM_ARCHS: list[Arch] = [
    # -- convolutional ---------------------------------------------------------------------------------------------
    Arch("timm_resnet", "timm", _timm("resnet18", layers=[1, 1, 1, 1]), timm_image()),
    Arch("timm_resnext", "timm", _timm("resnext26ts"), timm_image()),
    Arch("timm_efficientnet", "timm", _timm("test_efficientnet"), timm_image()),
    Arch("timm_mobilenetv3", "timm", _timm("mobilenetv3_small_050"), timm_image()),
    Arch("timm_convnext", "timm", _timm("test_convnext"), timm_image()),
    Arch("timm_regnet", "timm", _timm("regnetx_002"), timm_image()),
    Arch("timm_densenet", "timm", _timm("densenet121", growth_rate=8, block_config=(2, 2, 2, 2)), timm_image()),
    Arch("timm_ghostnet", "timm", _timm("ghostnet_050"), timm_image()),
    Arch("timm_repvgg", "timm", _timm("repvgg_a0"), timm_image()),
    Arch("timm_dla", "timm", _timm("dla46_c"), timm_image()),
    Arch("timm_hrnet", "timm", _timm("hrnet_w18_small"), timm_image()),
    Arch("timm_nfnet", "timm", _timm("test_nfnet"), timm_image()),
    # -- hybrids and MetaFormers -----------------------------------------------------------------------------------
    Arch("timm_coatnet", "timm", _timm("test_coatnet", img_size=64), timm_image(64)),
    Arch("timm_maxvit", "timm", _timm("test_maxvit", img_size=64), timm_image(64)),
    Arch("timm_levit", "timm", _timm("levit_128s", img_size=64, embed_dim=(32, 48, 64), key_dim=8, num_heads=(2, 3, 4),
                                     depth=(1, 1, 1)), timm_image(64)),
    Arch("timm_poolformer", "timm", _poolformer_build, timm_image()),
    Arch("timm_edgenext", "timm", _timm("edgenext_xx_small", depths=(1, 1, 1, 1)), timm_image()),
    Arch("timm_mobilevit", "timm", _timm("mobilevit_xxs"), timm_image()),
    Arch("timm_mambaout", "timm", _timm("test_mambaout"), timm_image()),
    Arch("timm_pvt_v2", "timm", _timm("pvt_v2_b0", depths=(1, 1, 1, 1), embed_dims=(16, 32, 48, 64),
                                      num_heads=(1, 2, 3, 4)), timm_image()),
    # -- transformers and MLPs -------------------------------------------------------------------------------------
    Arch("timm_vit", "timm", _timm("vit_tiny_patch16_224", **VIT_SMALL), timm_image()),
    Arch("timm_deit", "timm", _timm("deit_tiny_distilled_patch16_224", **VIT_SMALL), timm_image()),
    Arch("timm_beit", "timm", _timm("beit_base_patch16_224", **VIT_SMALL), timm_image()),
    Arch("timm_eva", "timm", _timm("eva02_tiny_patch14_224", **VIT_SMALL), timm_image()),
    Arch("timm_cait", "timm", _timm("cait_xxs24_224", **VIT_SMALL), timm_image()),
    Arch("timm_xcit", "timm", _timm("xcit_nano_12_p8_224", img_size=32, embed_dim=H, depth=2, num_heads=4),
         timm_image()),
    Arch("timm_swin", "timm", _timm("swin_tiny_patch4_window7_224", img_size=32, patch_size=2, window_size=4,
                                    embed_dim=16, depths=(1, 1), num_heads=(2, 4)), timm_image()),
    Arch("timm_mixer", "timm", _timm_class("mlp_mixer", "MlpMixer", img_size=32, patch_size=8, num_blocks=2,
                                           embed_dim=H), timm_image()),
    # -- more families: each brings an op pattern the ones above lack ------------------------------------------
    Arch("timm_res2net", "timm", _timm("res2net50_26w_4s", layers=[1, 1, 1, 1]), timm_image()),  # split, per-split conv, cat
    Arch("timm_dpn", "timm", _timm("dpn48b", k_sec=(1, 1, 1, 1)), timm_image()),  # dual paths: slices of a concat
    # branches of 1x7 / 7x1 convolutions and pools; timm's init (truncated normal, std 0.1) grows its outputs to
    # ~1e10, which the comparison takes relative to that scale
    Arch("timm_inception_v3", "timm", _timm("inception_v3"), timm_image(96)),
    Arch("timm_rexnet", "timm", _timm("rexnet_100", width_mult=0.5), timm_image()),  # partial channel residual add
    Arch("timm_mobilenetv4", "timm", _timm("mobilenetv4_conv_small_050"), timm_image()),
    Arch("timm_ghostnetv2", "timm", _timm("ghostnetv2_100"), timm_image(64)),  # DFC attention: pool, sigmoid, upsample
    Arch("timm_hgnet", "timm", _timm("hgnetv2_b0"), timm_image()),  # learnable affine after activations
    Arch("timm_repvit", "timm", _timm("repvit_m0_9", embed_dim=(16, 32, 48, 64), depth=(1, 1, 1, 1)), timm_image()),
    Arch("timm_fastvit", "timm", _timm("fastvit_t8", layers=(1, 1, 1, 1)),
         timm_image(64)),
    Arch("timm_fasternet", "timm", _timm("fasternet_t0", embed_dim=16, depths=(1, 1, 1, 1)), timm_image()),  # partial conv
    Arch("timm_starnet", "timm", _timm("starnet_s050", depths=[1, 1, 1, 1]), timm_image()),  # element-wise "star"
    Arch("timm_inception_next", "timm", _timm("inception_next_atto", depths=(1, 1, 1, 1), dims=(16, 32, 48, 64)),
         timm_image()),  # band depthwise convs on channel splits
    Arch("timm_convmixer", "timm", _timm_class("convmixer", "ConvMixer", dim=H, depth=2, kernel_size=7, patch_size=4),
         timm_image()),
    Arch("timm_efficientvit", "timm", _timm("efficientvit_b0", depths=(1, 1, 1, 1, 1), head_widths=(64, 80)),
         timm_image(64)),  # ReLU linear attention (a division by a sum)
    Arch("timm_efficientformerv2", "timm", _timm("efficientformerv2_s0", img_size=64, depths=(1, 1, 2, 2),
                                                 embed_dims=(16, 32, 48, 64)), timm_image(64)),
    Arch("timm_swiftformer", "timm", _timm("swiftformer_xs", layers=[1, 1, 1, 1], embed_dims=[16, 32, 48, 64]),
         timm_image(64)),  # additive attention
    Arch("timm_mobilevitv2", "timm", _timm("mobilevitv2_050"), timm_image(64)),  # separable linear attention
    Arch("timm_twins", "timm", _timm("twins_svt_small", embed_dims=[16, 32, 48, 64], num_heads=[1, 2, 3, 4],
                                     depths=[1, 1, 1, 1]), timm_image(64)),  # windows of 7 on 16x16: padded
    Arch("timm_davit", "timm", _timm("davit_tiny", depths=(1, 1, 1, 1), embed_dims=(16, 32, 48, 64),
                                     num_heads=(1, 2, 3, 4)), timm_image(64)),  # channel attention, padded windows
    Arch("timm_gcvit", "timm", _timm("gcvit_xxtiny", img_size=64, embed_dim=16), timm_image(64)),  # global query
    Arch("timm_nest", "timm", _timm_class("nest", "Nest", img_size=32, patch_size=2, embed_dims=(16, 32, 64),
                                          num_heads=(1, 2, 4), depths=(1, 1, 1)), timm_image()),  # nested blocks
    Arch("timm_hiera", "timm", _timm("hiera_tiny_224", img_size=64, embed_dim=16, stages=(1, 1, 1, 1)),
         timm_image(64)),  # mask-unit attention, unroll / reroll
    Arch("timm_mvitv2", "timm", _mvitv2_build, timm_image(64)),  # pooling attention, decomposed relative positions
    Arch("timm_swinv2", "timm", _timm("swinv2_tiny_window8_256", img_size=32, patch_size=2, window_size=4, embed_dim=16,
                                      depths=(1, 1), num_heads=(2, 4)), timm_image()),  # cosine attention, log-CPB
    Arch("timm_samvit", "timm", _timm("samvit_base_patch16", img_size=64, patch_size=8, embed_dim=H, depth=2,
                                      num_heads=4, global_attn_indexes=[1], window_size=4, neck_chans=16),
         timm_image(64)),  # windowed + global attention with relative positions
    Arch("timm_convit", "timm", _timm("convit_tiny", img_size=32, patch_size=8, depth=2, local_up_to_layer=1),
         timm_image()),  # gated positional self-attention
    Arch("timm_pit", "timm", _timm("pit_ti_224", img_size=64, depth=[1, 1, 1]), timm_image(64)),  # pooled tokens
    Arch("timm_coat", "timm", _timm("coat_tiny", img_size=32, embed_dims=[H] * 4, serial_depths=[1, 1, 1, 1],
                                    parallel_depth=1), timm_image()),  # convolutional relative positions
    Arch("timm_tnt", "timm", _timm("tnt_s_patch16_224", img_size=32, patch_size=8, embed_dim=48, depth=2,
                                   num_heads_outer=4), timm_image()),  # transformer in transformer
    Arch("timm_volo", "timm", _timm_class("volo", "VOLO", layers=(1, 1, 1, 1), img_size=32, embed_dims=(H, 64, 64, 64),
                                          num_heads=(1, 2, 2, 2)), timm_image()),  # outlook attention: unfold / fold
    Arch("timm_gmlp", "timm", _gmlp_build, timm_image()),
    # two branches at two patch sizes (12 and 16 px: 120 px images, the smallest that both tile), cross-attention
    Arch("timm_crossvit", "timm", _timm("crossvit_tiny_240", img_size=120, embed_dim=[24, 48], depth=[[1, 1, 0]],
                                        num_heads=[3, 3]), timm_image(120)),
]


# -- diffusers ----------------------------------------------------------------------------------------------------

TINY_UNET = dict(sample_size=LATENT_SIZE, in_channels=LATENT, out_channels=LATENT, layers_per_block=1,
                 block_out_channels=(16, 32), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                 up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=H, attention_head_dim=8,
                 norm_num_groups=8)
TINY_VAE = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(16, 32), latent_channels=LATENT,
                layers_per_block=1, norm_num_groups=8, sample_size=32)
# Stable Diffusion 1.x's text encoder config names bos 0, pad 1, eos 2 (so it pools at the highest token id, where
# the real tokenizer puts its end-of-text token): the same here, inside the tiny vocabulary.
TINY_CLIP_TEXT = dict(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=TEXT_SEQ, projection_dim=H, bos_token_id=0,
                      pad_token_id=1, eos_token_id=2)


def _diffusers(cls: str, **config):
    def build():
        import diffusers

        return randomize_constant_parameters(getattr(diffusers, cls)(**config))
    return build


def _timestep(seed: int) -> int:
    return (seed * 37) % 1000  # a step of a 1000-step schedule, different per call


def unet_inputs(batch, seed):
    """As a pipeline calls the UNet: one 0-d timestep for the whole batch (no batch dim, so no gears on it)."""
    return {"sample": torch.randn(batch, LATENT, LATENT_SIZE, LATENT_SIZE, generator=_gen(seed)),
            "timestep": torch.tensor(_timestep(seed)),
            "encoder_hidden_states": torch.randn(batch, TEXT_SEQ, H, generator=_gen(seed + 1))}


def unet_inputs_per_row(batch, seed):
    """One timestep per row (image-to-image at mixed strengths, batched training steps): the timestep is geared too."""
    steps = torch.randint(0, 1000, (batch,), generator=_gen(seed + 2))
    return {**unet_inputs(batch, seed), "timestep": steps}


def vae_inputs(batch, seed):
    return {"sample": torch.randn(batch, 3, 32, 32, generator=_gen(seed))}


def text_inputs(batch, seed):
    return {"input_ids": tokens(batch, seed, seq=TEXT_SEQ)}


DIFFUSERS_ARCHS: list[Arch] = [
    Arch("unet2d_condition", "diffusers", _diffusers("UNet2DConditionModel", **TINY_UNET), unet_inputs),
    Arch("unet2d_condition_row_t", "diffusers", _diffusers("UNet2DConditionModel", **TINY_UNET), unet_inputs_per_row),
    Arch("autoencoder_kl", "diffusers", _diffusers("AutoencoderKL", **TINY_VAE), vae_inputs),
    Arch("clip_text_encoder", "diffusers", _tf("CLIPTextModel", "CLIPTextConfig", **TINY_CLIP_TEXT), text_inputs),
]


def _imports(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


# Only what imports here: .venv (torch 2.13, no torchvision) has neither library; .venv-torch2.14 has both.
VISION_ARCHS: list[Arch] = (TIMM_ARCHS if _imports("timm") else []) + (DIFFUSERS_ARCHS if _imports("diffusers") else [])
