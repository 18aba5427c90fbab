"""docs/supported-models.md, produced from the registry and a discovery run rather than written by hand.

For every registered backbone and every family that discovery serves, a tiny random model is built in code, its spec
is looked up (registered) or discovered, and the spec is proven on it (``hf_snapvit.surgery.proof.prove_spec``:
reordering every unit changes nothing, and slicing to 75 % and 40 % of the units equals masking the rest). The table
says what the spec prunes, the proof's result, and what tests/contract/test_output_contract.py checks for the
family: the forwards stock transformers runs for its dense model (tests/support/output_fields.py's ``stock_gaps``, the
probe that test skips by) and the loads it compares field by field with the masked model. Task models are listed from
the registry with the encoder and features they read and their contract. ``tests/package/test_supported_models.py``
checks that the committed page is what this script writes.

    python utils/supported_models.py                 # rewrites docs/supported-models.md
    python utils/supported_models.py --check         # exit 1 if the page differs
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import textwrap
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

from hf_snapvit.architectures import discovery, ffn_inputs, get_layers, get_mlp, get_spec  # noqa: E402
from hf_snapvit.architectures.registry import _REGISTRY, _TASKS  # noqa: E402
from hf_snapvit.surgery.proof import ensure_proven, prove_spec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "supported-models.md"
S = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48)
I = dict(image_size=32, patch_size=8)
TEXT = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48)
# family -> (model class, config class, config arguments): the tiny model each row is proven on.
FAMILIES = {
    "vit": ("ViTModel", "ViTConfig", {**S, **I}),
    "deit": ("DeiTModel", "DeiTConfig", {**S, **I}),
    "dinov2": ("Dinov2Model", "Dinov2Config", {**S, **I, "mlp_ratio": 2}),
    "dinov2 (SwiGLU)": ("Dinov2Model", "Dinov2Config", {**S, **I, "mlp_ratio": 2, "use_swiglu_ffn": True}),
    "dinov2_with_registers": ("Dinov2WithRegistersModel", "Dinov2WithRegistersConfig",
                              {**S, **I, "mlp_ratio": 2, "num_register_tokens": 2}),
    "dinov3_vit": ("DINOv3ViTModel", "DINOv3ViTConfig", {**S, **I, "num_register_tokens": 1}),
    "vit_mae": ("ViTMAEModel", "ViTMAEConfig", {**S, **I, "mask_ratio": 0.0}),
    "vit_msn": ("ViTMSNModel", "ViTMSNConfig", {**S, **I}),
    "beit": ("BeitModel", "BeitConfig", {**S, **I, "use_relative_position_bias": True}),
    "data2vec-vision": ("Data2VecVisionModel", "Data2VecVisionConfig", {**S, **I, "use_relative_position_bias": True}),
    "siglip_vision_model": ("SiglipVisionModel", "SiglipVisionConfig", {**S, **I}),
    "clip_vision_model": ("CLIPVisionModel", "CLIPVisionConfig", {**S, **I}),
    "ijepa": ("IJepaModel", "IJepaConfig", {**S, **I}),
    "videomae": ("VideoMAEModel", "VideoMAEConfig", {**S, **I, "num_frames": 4, "tubelet_size": 2}),
    "vitpose": ("VitPoseForPoseEstimation", "VitPoseConfig", {"backbone_config": transformers.VitPoseBackboneConfig(
        **S, image_size=[32, 32], patch_size=[8, 8], out_indices=[2])}),
    "aimv2_vision_model": ("Aimv2VisionModel", "Aimv2VisionConfig", {**S, **I}),
    "mlcd_vision_model": ("MLCDVisionModel", "MLCDVisionConfig", {**S, **I}),
    "pixtral": ("PixtralVisionModel", "PixtralVisionConfig", {**S, **I, "head_dim": 8}),
    "idefics3_vision": ("Idefics3VisionTransformer", "Idefics3VisionConfig", {**S, **I}),
    "internvl_vision": ("InternVLVisionModel", "InternVLVisionConfig", {**S, **I}),
    "sam_vision_model": ("SamVisionModel", "SamVisionConfig", dict(hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=4, mlp_dim=48, output_channels=16, global_attn_indexes=[1],
                         window_size=2, **I)),
    "sam": ("SamModel", "SamConfig", dict(  # whole: the image encoder pruned beside the prompt encoder and decoder
        vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, mlp_dim=48, image_size=64,
                           patch_size=8, output_channels=16, window_size=2, global_attn_indexes=[1], num_pos_feats=8),
        prompt_encoder_config=dict(hidden_size=16, image_size=64, patch_size=8),
        mask_decoder_config=dict(hidden_size=16, num_hidden_layers=1, mlp_dim=32, num_attention_heads=2,
                                 iou_head_hidden_dim=16))),
    "blip_2_vision_model": ("Blip2VisionModel", "Blip2VisionConfig", {**S, **I}),
    "eomt": ("EomtForUniversalSegmentation", "EomtConfig",  # needs scipy (transformers builds EoMT's loss with it)
             {**S, **I, "num_queries": 4, "num_blocks": 1, "num_register_tokens": 2}),
    # A video tower whose config has num_frames but whose forward takes each clip's frames in its batch.
    "xclip_vision_model": ("XCLIPVisionModel", "XCLIPVisionConfig", {**S, **I, "num_frames": 2}),
    # Two attentions per block (temporal, then spatial): the block's own, the spatial one, is found.
    "timesformer": ("TimesformerModel", "TimesformerConfig", {**S, **I, "num_frames": 2}),
    "qwen2_vl_vision": ("models.qwen2_vl.modeling_qwen2_vl.Qwen2VisionTransformerPretrainedModel",
                        "Qwen2VLVisionConfig", dict(depth=2, embed_dim=32, hidden_size=48, num_heads=4, mlp_ratio=2,
                                                    spatial_merge_size=2, temporal_patch_size=2, **I)),
}
TIMM = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, mlp_ratio=1.5)


def _timm(architecture: str, **arguments) -> tuple[str, str, dict]:
    """A timm model through transformers: its config names the timm architecture, arguments and input size."""
    return ("TimmWrapperForImageClassification", "TimmWrapperConfig", dict(
        architecture=architecture, model_args={**TIMM, **arguments}, pretrained_cfg={"input_size": [3, 32, 32]},
        num_labels=5))


FAMILIES.update({  # one model_type (timm_wrapper) for every timm architecture: each row is discovered afresh
    "timm_wrapper: ViT (AugReg)": _timm("vit_tiny_patch16_224"),
    "timm_wrapper: DeiT-III (layer scales)": _timm("deit3_small_patch16_224", init_values=1e-5),
    "timm_wrapper: DeiT distilled": _timm("deit_tiny_distilled_patch16_224"),
    "timm_wrapper: ViT, registers, qk-norm": _timm("vit_tiny_patch16_224", qk_norm=True, reg_tokens=4),
    "timm_wrapper: ViT, rotary": _timm("vit_small_patch16_rope_224"),
    "timm_wrapper: EVA-02 Ti/S": _timm("eva02_tiny_patch14_224"),
    "timm_wrapper: EVA-02 B/L (FFN norm)": _timm("eva02_base_patch14_224"),
    "timm_wrapper: ViT, relative positions (MLP)": _timm("vit_relpos_small_patch16_224"),
    "timm_wrapper: ViT, relative positions, class token": _timm("vit_relpos_base_patch16_cls_224"),
    # A ResNet stem before the patch embedding: the tokens are those it leaves (wide enough that blocks dominate).
    "timm_wrapper: hybrid ViT (ResNet stem)": _timm("vit_tiny_r_s16_p8_224", embed_dim=192, mlp_ratio=4),
    "timm_wrapper: ViT 18x2 (two attentions per block)": _timm("vit_small_patch16_18x2_224"),
    "timm_wrapper: ViT xp (parallel-scaling blocks)": _timm("vit_base_patch16_xp_224"),
})


def build(family: str) -> transformers.PreTrainedModel | None:
    """The tiny seeded model of ``family``, or ``None`` where this transformers lacks the class."""
    model_name, config_name, arguments = FAMILIES[family]
    module, _, model_name = model_name.rpartition(".")  # a dotted name: a class transformers does not export
    try:
        owner = importlib.import_module(f"transformers.{module}") if module else transformers
    except ImportError:
        owner = None
    model_class, config_class = getattr(owner, model_name, None), getattr(transformers, config_name, None)
    if model_class is None or config_class is None:
        return None
    torch.manual_seed(0)
    return model_class(config_class(**arguments)).eval()


def row(family: str) -> str:
    """One table row: the family, its class, how its spec is known, what it prunes, and the proof's verdict."""
    model = build(family)
    if model is None:
        return f"| {family} | (not in this transformers) | | | |"
    name = type(model).__name__
    discovery.forget_discovered(model.config.model_type)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            spec = ensure_proven(model) if model.config.model_type not in _REGISTRY else get_spec(model)
            if model.config.model_type in _REGISTRY:
                prove_spec(model, spec)
    except Exception as error:  # noqa: BLE001 - a refusal is this row's result
        # A failed proof keeps its one reason apart from the modules it names and the fix: the reason matters here.
        message = getattr(error, "why", None) or str(error).splitlines()[0]
        kept = message.split("Keeping every head does not help: ", 1)  # why even the FFN alone cannot be sliced
        reason = (f"with every head kept, {kept[1]}" if len(kept) == 2 else message).replace("|", "/")
        return f"| {family} | `{name}` | refused | | {reason[:160]} |"
    source = "registered" if model.config.model_type in _REGISTRY else "discovered"
    mlp, variant = get_mlp(get_layers(model, spec)[0], spec)  # the layout this model has
    packed = any(blocks > 1 for _, blocks in ffn_inputs(mlp, variant))
    kind = "gated " if len(variant.in_proj) > 1 else "packed gated " if packed else ""
    ffn = f"{kind}FFN " + (f"`{spec.mlp}`" if spec.mlp else "in the block")
    tables = f", per-head tables {list(spec.head_tables)}" if spec.head_tables else ""
    fused = f" (one fused `{spec.q_proj}`)" if spec.qkv_blocks != (0, 0, 0) else ""
    heads = f"heads of `{'.'.join(filter(None, (spec.layers, '*', spec.attention)))}`{fused}"
    pruned = f"{heads if spec.prune_heads else 'every head kept (`prune_heads=False`)'}, {ffn}{tables}"
    units = "" if spec.prune_heads else " of its FFN neurons"
    return (f"| {family} | `{name}` | {source} | {pruned} | proven: sliced = masked at 75 % and 40 %{units}; "
            f"{contract(family)} |")


def _contract_families() -> dict[str, object]:
    """tests/support/families.py's families by name (the tests folder holds the contract test's helpers)."""
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    from support import families

    return {family.name: family for family in families.FAMILIES}


def contract(name: str) -> str:
    """What tests/contract/test_output_contract.py checks for the family ``name`` of tests/support/families.py: every
    output field equal to the masked model's, in the forwards stock transformers runs for the dense model, for each
    load."""
    from support import output_fields

    family = _contract_families()[name]
    model = family.build()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gaps = output_fields.stock_gaps(model, family.inputs(model))
    loads = list(LOADS) + (["remote code"] if output_fields.remote_code_gap(model) is None else [])
    return f"contract: {', '.join(k for k in output_fields.KINDS if k not in gaps)} = masked ({', '.join(loads)})"


# The loads tests/contract/test_output_contract.py compares (besides sparsity 0 = the untouched model), remote code
# aside.
LOADS = ("sliced", "switchable", "to_sliced", "re-saved")


def task_contract(model_type: str) -> str:
    """The contract of the task models of ``model_type`` that tests/support/families.py builds."""
    found = [(name, f) for name, f in _contract_families().items() if getattr(f, "model_type", None) == model_type
             and name.startswith("task ")]
    return "; ".join(f"{contract(name)} (`{name}`)" for name, _ in found) or "not in the contract test"


def _others() -> str:
    """The contract test's families that are no row of the page (variants with another head, a user's own model)."""
    by_class: dict[str, list[str]] = {}
    for name, family in _contract_families().items():
        if name not in FAMILIES and not name.startswith("task "):
            by_class.setdefault(family.class_name, []).append(name)
    return ", ".join(f"`{cls}` ({', '.join(names)})" for cls, names in by_class.items())


def page() -> str:
    """The whole page."""
    lines = [
        "# Supported models",
        "",
        "Written by `python utils/supported_models.py` from the registry and a discovery run (do not edit by",
        "hand). Each backbone row is a tiny random model of the family, built in code, whose spec (registered, or",
        "discovered from its module tree and one forward) was proven on it: keeping every unit in another order "
        "changes",
        "nothing, and slicing to 75 % and 40 % of its heads and neurons equals masking the others",
        "([architecture.md](architecture.md#models-no-registry-knows)). A refused family names what did not match.",
        "Their `*ForImageClassification` variants and dual-tower models use the same specs.",
        "",
        "*contract* names what `tests/contract/test_output_contract.py` checks on the same tiny model, its weights perturbed:",
        "every field of the output (last hidden state, pooled output, logits, each hidden state, each attention,",
        "each tuple position) equals the dense model's with the dropped heads and neurons masked, for the forwards",
        "listed: *outputs* (the default call), *hidden states* (`output_hidden_states=True`), *attentions*",
        "(`output_attentions=True`, eager attention; a pruned block's attention maps hold its kept heads, in rank",
        "order, and are compared with the masked model's at those heads),",
        "*tuples* (`return_dict=False`), *other resolution* (1.5 times the side, with `interpolate_pos_encoding=True`",
        "where the forward takes it) and *masked patches* (`bool_masked_pos`), on the family's own inputs (video",
        "clips, patch sequences, grids). A forward is left out where stock transformers cannot run it for the dense",
        "model (the test skips it naming why). The loads: `ElasticViTModel.from_pretrained(path, sparsity=s)`",
        "(*sliced*), `switchable=True` after six switches up and down, compared at each size (*switchable*), its",
        "`to_sliced()`, the sliced checkpoint saved and loaded again (*re-saved*), and that checkpoint loaded by",
        "`transformers.AutoModel*.from_pretrained(path, trust_remote_code=True)` (*remote code*, where the class is",
        "one transformers exports); sparsity 0 equals the untouched model in every field. For a task model the",
        "fields are those of the task model's output: its predictions, and the hidden states and attentions",
        "transformers returns with them (a VLM's are its language model's, beside its tower's in `image_outputs`).",
        "",
        *textwrap.wrap(f"The contract test also checks {_others()}, with every forward stock transformers runs for "
                       "them.", 115),
        "",
        "| family | class | spec | what is pruned | verified |",
        "|---|---|---|---|---|",
        *(row(family) for family in FAMILIES),
        "",
        "## Task models",
        "",
        "Only the vision encoder is pruned; the budget counts the blocks whose outputs the task reads.",
        "",
        "| task model | encoder | encoder config | features read | verified |",
        "|---|---|---|---|---|",
        *(f"| {t} | `{task.encoder}` | `{task.encoder_config}` | {task.features} | {task_contract(t)} |"
          for t, task in sorted(_TASKS.items())),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/supported-models.md differs")
    args = parser.parse_args(argv)
    text = page()
    if args.check:
        same = PAGE.exists() and PAGE.read_text() == text
        print("docs/supported-models.md is up to date" if same else "docs/supported-models.md differs: rerun "
              "python utils/supported_models.py")
        return 0 if same else 1
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
