"""Models no registry knows, found by discovery: a user's own ``PreTrainedModel`` (:class:`CustomModel`, its options
switching on fused qkv, a gated FFN, per-head gates, a norm over the FFN), the transformers and timm families without a
registered spec (:data:`FAMILIES`), and a model whose attention has a relative-position MLP (:func:`relpos_model`)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import AutoConfig, AutoModel, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPooling


class CustomConfig(PretrainedConfig):
    model_type = "hf_snapvit_test_custom"

    def __init__(self, width=32, depth=2, heads=4, ffn=48, image_size=32, patch_size=8, num_channels=3,
                 fused=False, gated=False, head_gate=False, ffn_norm=False, **kwargs):
        super().__init__(**kwargs)
        self.width, self.depth, self.num_attention_heads, self.ffn = width, depth, heads, ffn
        self.image_size, self.patch_size, self.num_channels = image_size, patch_size, num_channels
        self.fused, self.gated, self.head_gate, self.ffn_norm = fused, gated, head_gate, ffn_norm


class Mixer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n_heads, self.head_size = config.num_attention_heads, config.width // config.num_attention_heads
        if config.fused:
            self.qkv = nn.Linear(config.width, 3 * config.width)
        else:
            self.to_q, self.to_k, self.to_v = (nn.Linear(config.width, config.width) for _ in range(3))
        self.proj = nn.Linear(config.width, config.width)
        # A per-head table that no spec names: slicing heads without it cannot work.
        self.gate = nn.Parameter(torch.ones(config.num_attention_heads)) if config.head_gate else None

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, -1) if hasattr(self, "qkv") else (self.to_q(x), self.to_k(x), self.to_v(x))
        split = lambda y: y.view(b, t, -1, self.head_size).transpose(1, 2)  # noqa: E731
        out = nn.functional.scaled_dot_product_attention(split(q), split(k), split(v))
        if self.gate is not None:
            out = out * self.gate[None, :, None, None]
        return self.proj(out.transpose(1, 2).reshape(b, t, -1))


class GatedFfn(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.w_gate, self.w_in = nn.Linear(config.width, config.ffn), nn.Linear(config.width, config.ffn)
        self.w_out = nn.Linear(config.ffn, config.width)

    def forward(self, x):
        return self.w_out(nn.functional.silu(self.w_gate(x)) * self.w_in(x))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(config.width), nn.LayerNorm(config.width)
        self.mixer = Mixer(config)
        # A norm over the FFN's hidden features: its statistics change when a neuron goes, so no slice equals masking.
        norm = [nn.LayerNorm(config.ffn)] if config.ffn_norm else []
        self.ff = GatedFfn(config) if config.gated else nn.Sequential(
            nn.Linear(config.width, config.ffn), nn.GELU(), *norm, nn.Linear(config.ffn, config.width))

    def forward(self, x):
        x = x + self.mixer(self.n1(x))
        return x + self.ff(self.n2(x))


class CustomModel(PreTrainedModel):
    config_class = CustomConfig
    base_model_prefix = "custom"
    main_input_name = "pixel_values"

    def __init__(self, config):
        super().__init__(config)
        self.patchify = nn.Conv2d(config.num_channels, config.width, config.patch_size, config.patch_size)
        self.cls = nn.Parameter(torch.zeros(1, 1, config.width))
        self.trunk = nn.ModuleList(Block(config) for _ in range(config.depth))
        self.norm = nn.LayerNorm(config.width)
        self.post_init()

    def forward(self, pixel_values, **kwargs):
        x = self.patchify(pixel_values).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(len(x), -1, -1), x], 1)
        for block in self.trunk:
            x = block(x)
        x = self.norm(x)
        return BaseModelOutputWithPooling(last_hidden_state=x, pooler_output=x[:, 0])


AutoConfig.register(CustomConfig.model_type, CustomConfig, exist_ok=True)
AutoModel.register(CustomConfig, CustomModel, exist_ok=True)


_SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48)


FAMILIES = {  # transformers families without a registered spec, each ranked, saved and loaded by discovery alone
    "videomae": lambda T: T.VideoMAEModel(T.VideoMAEConfig(**_SMALL, image_size=32, patch_size=8, num_frames=4,
                                                           tubelet_size=2)),
    "vitpose": lambda T: T.VitPoseForPoseEstimation(T.VitPoseConfig(backbone_config=T.VitPoseBackboneConfig(
        **_SMALL, image_size=[32, 32], patch_size=[8, 8], out_indices=[2]))),
    "aimv2": lambda T: T.Aimv2VisionModel(T.Aimv2VisionConfig(**_SMALL, image_size=32, patch_size=8)),
    "mlcd": lambda T: T.MLCDVisionModel(T.MLCDVisionConfig(**_SMALL, image_size=32, patch_size=8)),
    "pixtral": lambda T: T.PixtralVisionModel(T.PixtralVisionConfig(**_SMALL, image_size=32, patch_size=8,
                                                                     head_dim=8)),
    "idefics3-vision": lambda T: T.Idefics3VisionTransformer(T.Idefics3VisionConfig(**_SMALL, image_size=32,
                                                                                    patch_size=8)),
    "internvl-vision": lambda T: T.InternVLVisionModel(T.InternVLVisionConfig(**_SMALL, image_size=32,
                                                                              patch_size=8)),
    # SAM whole: the image encoder is pruned inside the model with its prompt encoder and mask decoder.
    "sam": lambda T: T.SamModel(T.SamConfig(
        vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, mlp_dim=48, image_size=64,
                           patch_size=8, output_channels=16, window_size=2, global_attn_indexes=[1], num_pos_feats=8),
        prompt_encoder_config=dict(hidden_size=16, image_size=64, patch_size=8),
        mask_decoder_config=dict(hidden_size=16, num_hidden_layers=1, mlp_dim=32, num_attention_heads=2,
                                 iou_head_hidden_dim=16))),
}


TIMM = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, mlp_ratio=1.5)


def _timm(architecture: str, **model_args):
    """A timm model through transformers (``TimmWrapper*``, model_type ``timm_wrapper``), as a timm Hub checkpoint
    loads: its config names the timm architecture, its arguments and the input size."""
    def build(T):
        config = T.TimmWrapperConfig(architecture=architecture, model_args={**TIMM, **model_args},
                                     pretrained_cfg={"input_size": [3, 32, 32]}, num_labels=5)
        return T.TimmWrapperForImageClassification(config)
    return build


FAMILIES.update({  # timm's ViTs (the SnapViT paper's DeiT-III and AugReg), one model_type for them all
    "timm-augreg": _timm("vit_tiny_patch16_224"),
    "timm-deit3": _timm("deit3_small_patch16_224", init_values=1e-5),  # layer scales
    "timm-deit-distilled": _timm("deit_tiny_distilled_patch16_224"),  # class and distillation tokens
    "timm-qknorm-registers": _timm("vit_tiny_patch16_224", qk_norm=True, reg_tokens=4, global_pool="avg",
                                   fc_norm=True),
    "timm-eva02": _timm("eva02_tiny_patch14_224"),  # rotary, packed SwiGLU; every head kept
    "timm-rope": _timm("vit_small_patch16_rope_224"),  # timm's rotary ViT
})


def perturbed(model: PreTrainedModel) -> PreTrainedModel:
    """``model`` in eval mode, every weight moved off its init (zero biases would hide a wrong slice)."""
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    return model.eval()


class RelPosConfig(PretrainedConfig):
    model_type = "hf_snapvit_test_relpos"

    def __init__(self, width=32, depth=2, heads=4, ffn=48, image_size=32, patch_size=8, num_channels=3, **kwargs):
        super().__init__(**kwargs)
        self.width, self.depth, self.num_attention_heads, self.ffn = width, depth, heads, ffn
        self.image_size, self.patch_size, self.num_channels = image_size, patch_size, num_channels


class RelPosAttention(nn.Module):
    """timm's relative-position attention, merging its heads to whatever width they have (timm's own merges to the
    model width, so its heads cannot go): the bias comes from timm's ``RelPosMlp``, whose last layer has one output
    row per head and which views the bias to ``bias_shape`` (ending in the head count)."""

    def __init__(self, config):
        super().__init__()
        self.num_heads, self.head_dim = config.num_attention_heads, config.width // config.num_attention_heads
        self.qkv, self.proj = nn.Linear(config.width, 3 * config.width), nn.Linear(config.width, config.width)
        from timm.layers import RelPosMlp  # timm is part of the [test] extra

        side = config.image_size // config.patch_size
        self.rel_pos = RelPosMlp(window_size=(side, side), num_heads=self.num_heads, hidden_dim=16,
                                             prefix_tokens=1)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.rel_pos.get_bias())
        return self.proj(out.transpose(1, 2).reshape(b, n, -1))


class RelPosBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(config.width), nn.LayerNorm(config.width)
        self.attn = RelPosAttention(config)
        self.mlp = nn.Sequential(nn.Linear(config.width, config.ffn), nn.GELU(), nn.Linear(config.ffn, config.width))

    def forward(self, x):
        x = x + self.attn(self.n1(x))
        return x + self.mlp(self.n2(x))


class RelPosModel(PreTrainedModel):
    config_class = RelPosConfig
    base_model_prefix = "relpos"
    main_input_name = "pixel_values"

    def __init__(self, config):
        super().__init__(config)
        self.patchify = nn.Conv2d(config.num_channels, config.width, config.patch_size, config.patch_size)
        self.cls = nn.Parameter(torch.zeros(1, 1, config.width))
        self.blocks = nn.ModuleList(RelPosBlock(config) for _ in range(config.depth))
        self.norm = nn.LayerNorm(config.width)
        self.post_init()

    def forward(self, pixel_values, **kwargs):
        x = self.patchify(pixel_values).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(len(x), -1, -1), x], 1)
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        return BaseModelOutputWithPooling(last_hidden_state=x, pooler_output=x[:, 0])


AutoConfig.register(RelPosConfig.model_type, RelPosConfig, exist_ok=True)
AutoModel.register(RelPosConfig, RelPosModel, exist_ok=True)


def relpos_model() -> RelPosModel:
    pytest.importorskip("timm", reason="timm is part of the [test] extra")
    torch.manual_seed(0)
    return perturbed(RelPosModel(RelPosConfig()))
