"""A declarative builder of tiny ``PreTrainedModel``s that almost look like ViTs
(tests/architectures/test_hostile_zoo.py).

Every structural choice of a zoo model is data (``config.zoo``, defaults in :data:`DEFAULTS`); the model reads
nothing else, so a case can hide, rename or falsify the config entries hf_snapvit reads (``image_size``,
``num_attention_heads``, ``num_frames``). Each model knows its own ground truth (:func:`unit_holders`): which
modules hold each block's heads (and one head's width) and FFN neurons, so a test masks a model without hf_snapvit's
spec (:func:`masked`). Each case gets its own ``model_type``, registered with ``AutoConfig`` and ``AutoModel``.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import AutoConfig, AutoModel, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPooling
from transformers.utils.output_capturing import capture_outputs

from support.zoo_parts import ATTENTION, BLOCK, FFN, ConvBlock, MixerBlock, ZooBlock, merge

DEFAULTS = dict(width=32, depth=2, image=32, patch=8, channels=3, cls=1, registers=0, pos=True, embed="conv",
                frames=0, stack="blocks", layout="plain", tie=None, output="model_output", classifier=0,
                buffer=False, capture=False, attn=ATTENTION, ffn=FFN, block=BLOCK, per_block=None)


class ZooConfig(PretrainedConfig):
    model_type = "hf_snapvit_zoo"

    def __init__(self, zoo: dict | None = None, **kwargs):
        super().__init__(**kwargs)
        self.zoo = zoo or {}


def _stage(z: dict, width: int, heads: int) -> dict:
    return merge(z, {"attn": {"heads": heads}, "ffn": {"width": width * 3 // 2}})


def _blocks(z: dict, width: int, tokens: int, depth: int | None = None) -> nn.ModuleList:
    per_block = z["per_block"] or [{}] * (depth or z["depth"])
    return nn.ModuleList(ZooBlock(merge(z, extra), width, tokens) for extra in per_block[:depth or z["depth"]])


def _tie(owner: nn.Module, how: str | None) -> None:
    """Share weights as the case says, undeclared (``q_declared`` is declared through ``_tied_weights_keys``)."""
    if how is None or how == "q_declared":
        return
    first, second = owner.blocks[0], owner.blocks[1]
    if how == "attn":
        second.attn = first.attn
    elif how == "ffn":
        second.mlp = first.mlp
    elif how in ("q", "o"):
        setattr(second.attn, how, getattr(first.attn, how))
    elif how == "q_param":
        second.attn.q.weight = first.attn.q.weight
    elif how == "fc1_param":
        second.mlp.fc1.weight = first.mlp.fc1.weight
    elif how == "o_ffn":  # one matrix is the attention's output projection and the FFN's
        for block in owner.blocks:
            block.mlp.fc2 = block.attn.o
    else:
        raise ValueError(how)


def build_trunk(owner: nn.Module, z: dict) -> None:
    """The embeddings, block stack(s) and final norm of a zoo model, as attributes of ``owner``."""
    d, side = z["width"], z["image"] // z["patch"]
    patches, extra = side * side * max(1, z["frames"] if z["embed"] == "clip" else 1), z["cls"] + z["registers"]
    stem = d // 2 if z["layout"] == "stages" else d
    if z["embed"] == "ids":
        owner.embed = nn.Embedding(100, d)
        patches = 12
    elif z["embed"] == "stem":  # a hybrid's convolution stem (BatchNorm and all) before the patch convolution
        owner.stem = nn.Sequential(nn.Conv2d(z["channels"], 16, 3, 2, 1), nn.BatchNorm2d(16), nn.ReLU())
        owner.embed = nn.Conv2d(16, stem, z["patch"] // 2, z["patch"] // 2)
    elif z["embed"] == "linear":  # patches flattened by hand: no convolution names the patch size
        owner.embed = nn.Linear(z["channels"] * z["patch"] ** 2, stem)
    else:
        owner.embed = nn.Conv2d(z["channels"], stem, z["patch"], z["patch"])
    if z["buffer"]:
        owner.register_buffer("pixel_scale", torch.full((1, z["channels"], 1, 1), 0.5), persistent=False)
    if extra:
        owner.cls_token = nn.Parameter(torch.randn(1, extra, d) * 0.02)
    if z["pos"]:
        owner.pos = nn.Parameter(torch.randn(1, patches + extra, stem) * 0.02)
    tokens = patches + extra
    layout = z["layout"]
    if layout == "conv_only":
        owner.blocks = nn.ModuleList(ConvBlock(d) for _ in range(z["depth"]))
    elif layout == "mixer":
        owner.blocks = nn.ModuleList(MixerBlock(d, tokens) for _ in range(z["depth"]))
    elif layout == "stages":  # hierarchical: a narrow stage, 2x2 patch merging, a wide stage
        owner.stage1 = _blocks(_stage(z, stem, 2), stem, tokens)
        owner.merge = nn.Linear(4 * stem, d)
        owner.stage2 = _blocks(z, d, tokens // 4)
    elif layout == "no_stack":
        for i, block in enumerate(_blocks(z, d, tokens)):
            owner.add_module(f"block{i}", block)
    else:
        owner.add_module(z["stack"], _blocks(z, d, tokens))
        if layout == "two_stacks":
            owner.blocks2 = _blocks(z, d, tokens)
        if layout == "unused":  # larger than the stack the forward uses, and never called
            owner.spare = _blocks(merge(z, {"ffn": {"width": 96}}), d, tokens, depth=3)
    _tie(owner, z["tie"])
    owner.norm = nn.LayerNorm(d)


def _embed(owner: nn.Module, z: dict, pixel_values=None, input_ids=None) -> torch.Tensor:
    if z["embed"] == "ids":
        x = owner.embed(input_ids)
    else:
        if z["buffer"]:
            pixel_values = pixel_values * owner.pixel_scale
        if z["embed"] == "clip":  # [B, T, C, H, W]: every frame's patches in one sequence
            b = len(pixel_values)
            x = owner.embed(pixel_values.flatten(0, 1)).flatten(2).transpose(1, 2).reshape(b, -1, z["width"])
        elif z["embed"] == "linear":
            p = z["patch"]
            x = owner.embed(F.unfold(pixel_values, p, stride=p).transpose(1, 2))
        else:
            x = owner.embed(owner.stem(pixel_values) if z["embed"] == "stem" else pixel_values)
            x = x.flatten(2).transpose(1, 2)
    if z["cls"] + z["registers"]:
        x = torch.cat([owner.cls_token.expand(len(x), -1, -1), x], 1)
    return x + owner.pos if z["pos"] else x


def run_trunk(owner: nn.Module, z: dict, **inputs) -> torch.Tensor:
    """The trunk's last hidden state (``[B, N, D]``)."""
    x = _embed(owner, z, **inputs)
    layout = z["layout"]
    if layout == "conv_only":
        side = z["image"] // z["patch"]
        x = x.transpose(1, 2).unflatten(2, (side, side))
        for block in owner.blocks:
            x = block(x)
        return owner.norm(x.flatten(2).transpose(1, 2))
    if layout == "stages":
        for block in owner.stage1:
            x = block(x)
        side = z["image"] // z["patch"]
        x = x.unflatten(1, (side // 2, 2, side // 2, 2)).permute(0, 1, 3, 2, 4, 5).flatten(3).flatten(1, 2)
        x = owner.merge(x)
        stacks = [owner.stage2]
    elif layout == "no_stack":
        stacks = [[owner.block0, owner.block1]]
    elif layout == "loop":  # the first block runs three times
        stacks = [[owner.blocks[0]] * 3 + list(owner.blocks[1:])]
    else:
        stacks = [owner.get_submodule(z["stack"])] + ([owner.blocks2] if layout == "two_stacks" else [])
    for stack in stacks:
        for block in stack:
            x = block(x)
    return owner.norm(x)


def unit_holders(model: nn.Module) -> list[list[tuple[nn.Linear, int, nn.Linear]]]:
    """The ground truth, per block stack the forward uses and per block in it: ``(the attention's output projection,
    one head's width, the FFN's output projection)``, read from the zoo options, not from hf_snapvit."""
    z = model.config.zoo
    owner = getattr(model, "backbone", model)
    if z["layout"] == "stages":
        stacks = [owner.stage1, owner.stage2]
    elif z["layout"] == "no_stack":
        stacks = [[owner.block0, owner.block1]]
    elif z["layout"] in ("conv_only", "mixer"):
        return []
    else:
        stacks = [owner.get_submodule(z["stack"])] + ([owner.blocks2] if z["layout"] == "two_stacks" else [])
    found = []
    for stack in stacks:
        rows = []
        for block in stack:
            attn, ffn = getattr(block, block.opts["attn_name"]), getattr(block, block.opts["ffn_name"])
            out = ffn[-1] if isinstance(ffn, nn.Sequential) else getattr(ffn, ffn.names[-1])
            rows.append((getattr(attn, attn.opts["names"][3]), attn.opts["hd"], out))
        found.append(rows)
    return found


def masked(model: nn.Module, blocks: list[int], keep: list[tuple]) -> nn.Module:
    """A copy of ``model`` whose dropped heads (their output-projection columns) and FFN neurons (their output
    columns) are zeroed, in the blocks ``blocks`` (indices into the concatenated :func:`unit_holders`)."""
    copied = copy.deepcopy(model)
    holders = [row for stack in unit_holders(copied) for row in stack]
    with torch.no_grad():
        for index, (heads, neurons) in zip(blocks, keep):
            o_proj, hd, ffn_out = holders[index]
            for head in set(range(o_proj.in_features // hd)) - {int(h) for h in heads}:
                o_proj.weight[:, head * hd:(head + 1) * hd] = 0
            dropped = sorted(set(range(ffn_out.in_features)) - {int(n) for n in neurons})
            ffn_out.weight[:, dropped] = 0
    return copied


def _outputs(z: dict, x: torch.Tensor, logits: torch.Tensor | None):
    pooled = x[:, 0] if z["cls"] else x.mean(1)
    kind = z["output"]
    if kind == "tuple":
        return (x, pooled)
    if kind == "list":
        return [x, pooled]
    if kind == "dict":
        return {"features": x, "pooled": pooled}
    if kind == "nested":
        return {"tokens": (x, [pooled]), "extra": {"pooled": pooled * 2}}
    if kind == "int_only":
        return {"labels": x.argmax(-1), "count": torch.tensor(x.shape[1])}
    if kind == "no_tensor":
        return {"shape": list(x.shape)}
    extra = {}
    if kind == "int_extra":
        extra["token_ids"] = x.argmax(-1)
    if kind == "inf_extra":  # an additive mask beside the features: -inf where a token may not attend
        extra["mask"] = torch.zeros(len(x), x.shape[1]).masked_fill(torch.arange(x.shape[1]) % 3 == 0, -torch.inf)
    if kind == "nan_extra":
        extra["score"] = torch.full((len(x), 1), torch.nan)
    if kind == "inf_pooled":
        pooled = pooled.clone()
        pooled[:, 0] = torch.inf
    if kind == "nan_all":
        x, pooled = x * torch.nan, pooled * torch.nan
    out = BaseModelOutputWithPooling(last_hidden_state=x, pooler_output=pooled)
    for key, value in {**extra, **({"logits": logits} if logits is not None else {})}.items():
        out[key] = value
    return out


class Trunk(nn.Module):  # the backbone of a zoo model with a task head
    def __init__(self, z: dict):
        super().__init__()
        self.zoo = z
        build_trunk(self, z)

    def forward(self, pixel_values):
        return run_trunk(self, self.zoo, pixel_values=pixel_values)


class ZooModel(PreTrainedModel):
    config_class = ZooConfig
    base_model_prefix = "backbone"
    main_input_name = "pixel_values"

    def __init__(self, config: ZooConfig):
        super().__init__(config)
        z = merge(DEFAULTS, config.zoo)
        if z["classifier"]:
            self.backbone, self.head = Trunk(z), nn.Linear(z["width"], z["classifier"])
        else:
            build_trunk(self, z)
        self.post_init()

    def forward(self, pixel_values, **kwargs):
        z = merge(DEFAULTS, self.config.zoo)
        x = self.backbone(pixel_values) if z["classifier"] else run_trunk(self, z, pixel_values=pixel_values)
        return _outputs(z, x, self.head(x[:, 0]) if z["classifier"] else None)


class ZooCaptureModel(ZooModel):  # records hidden_states through transformers' hooks, as its own models do
    _can_record_outputs = {"hidden_states": ZooBlock}

    @capture_outputs
    def forward(self, pixel_values, **kwargs):
        return super().forward(pixel_values)


class ZooTextModel(ZooModel):  # BERT-like: takes input_ids, no pixels at all
    main_input_name = "input_ids"

    def forward(self, input_ids, attention_mask=None, **kwargs):
        z = merge(DEFAULTS, self.config.zoo)
        return _outputs(z, run_trunk(self, z, input_ids=input_ids), None)


@dataclass
class Built:
    model_class: type
    config_class: type
    config_entries: dict


_CLASSES: dict[str, Built] = {}


def zoo_class(name: str, zoo: dict, config_entries: dict) -> Built:
    """The config and model classes of the zoo case ``name``: a model_type of its own, registered with the Auto
    classes (so its checkpoints load through ``AutoModel``, as a user's model would)."""
    if name not in _CLASSES:
        model_type = "hf_snapvit_zoo_" + re.sub(r"\W", "_", name)
        stem = "Zoo" + "".join(part.title() for part in re.split(r"\W|_", name))
        config_class = type(f"{stem}Config", (ZooConfig,), {"model_type": model_type, "__module__": __name__})
        base = ZooTextModel if zoo.get("embed") == "ids" else ZooCaptureModel if zoo.get("capture") else ZooModel
        attrs = {"config_class": config_class, "__module__": __name__}
        if zoo.get("tie") == "q_declared":  # declared: transformers ties (and saves) the weight once
            attrs["_tied_weights_keys"] = {"blocks.1.attn.q.weight": "blocks.0.attn.q.weight",
                                           "blocks.1.attn.q.bias": "blocks.0.attn.q.bias"}
        model_class = type(f"{stem}Model", (base,), attrs)
        globals()[config_class.__name__], globals()[model_class.__name__] = config_class, model_class
        AutoConfig.register(model_type, config_class, exist_ok=True)
        AutoModel.register(config_class, model_class, exist_ok=True)
        _CLASSES[name] = Built(model_class, config_class, config_entries)
    return _CLASSES[name]


def build(name: str, zoo: dict, config_entries: dict, seed: int = 0) -> PreTrainedModel:
    """The zoo model of case ``name``, seeded, every weight moved off its initial value (zero biases and unit norms
    would hide a misplaced unit), in eval mode."""
    built = zoo_class(name, zoo, config_entries)
    tied = {"tie_word_embeddings": True} if zoo.get("tie") == "q_declared" else {}
    config = built.config_class(zoo=merge(DEFAULTS, zoo), **tied, **config_entries)
    torch.manual_seed(seed)
    model = built.model_class(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    return model
