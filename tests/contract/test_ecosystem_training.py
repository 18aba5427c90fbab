"""Fine-tuning a sliced model with the stock tools: ``Trainer`` and PEFT LoRA, then reloading what they saved.

A sliced model is a stock transformers model whose ``config.elastic_layout`` records its widths, so ``Trainer``
trains it as any other model and ``save_model`` writes a sliced checkpoint; a LoRA adapter trained on it reloads
onto the same sliced model, loaded again from the elastic checkpoint or from a sliced one. The recipes of
``docs/deployment.md`` are these tests' calls.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import Trainer, TrainingArguments

import hf_snapvit as hs
from hf_snapvit.architectures.budget import layer_widths
from helpers import CASES, output_of, sliced_model

CASE = {c.name: c for c in CASES}
SPARSITY = 0.3
# The Linear modules of ViT, DeiT, DINOv2, CLIP and SigLIP in transformers >= 5.9 (DINOv3 and DINOv2's SwiGLU FFN
# name their FFN up_proj/down_proj instead).
LORA_TARGETS = ["q_proj", "v_proj", "fc1", "fc2"]
# peft 0.21 still reads transformers' deprecated alias; nothing of ours to fix.
PEFT_WARNING = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")


def labelled(n: int, num_labels: int, seed: int = 0) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    return [{"pixel_values": torch.randn(3, 32, 32, generator=generator),
             "labels": int(torch.randint(num_labels, (), generator=generator))} for _ in range(n)]


def probe(seed: int = 5) -> dict:
    return CASE["vit"].inputs(3, seed)


def train_two_steps(model: torch.nn.Module, folder, learning_rate: float) -> None:
    """Two Trainer steps on random labelled images, then ``trainer.save_model(folder / "fine-tuned")``."""
    arguments = TrainingArguments(output_dir=str(folder / "run"), max_steps=2, per_device_train_batch_size=4,
                                  learning_rate=learning_rate, report_to=[], use_cpu=True, save_strategy="no")
    trainer = Trainer(model=model, args=arguments, train_dataset=labelled(8, model.config.num_labels))
    trainer.train()
    trainer.save_model(str(folder / "fine-tuned"))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vit-cls", "dinov2-cls"])
def test_trainer_fine_tunes_a_sliced_model_and_its_saved_model_reloads(tiny_elastic, tmp_path, name):
    model = sliced_model(tiny_elastic(name), CASE[name], sparsity=SPARSITY)
    before = output_of(model, probe())
    train_two_steps(model, tmp_path, learning_rate=1e-3)
    model.eval()
    after = output_of(model, probe())
    assert not torch.allclose(after, before, atol=1e-4), "two steps at lr 1e-3 must change the logits"

    reloaded = hs.ElasticViTModel.from_pretrained(tmp_path / "fine-tuned")
    assert type(reloaded) is type(model)
    assert layer_widths(reloaded) == layer_widths(model)
    assert reloaded.config.elastic_layout == model.config.elastic_layout
    torch.testing.assert_close(output_of(reloaded, probe()), after, rtol=1e-5, atol=1e-6)


def lora_step(model: torch.nn.Module, classifier: bool):
    """Wrap ``model`` in a LoRA adapter and take one optimiser step; returns the PEFT model, in eval mode."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS,
                        modules_to_save=["classifier"] if classifier else None)
    peft_model = get_peft_model(model, config)
    wrapped = {name.split(".lora_A.")[0].rsplit(".", 1)[-1] for name, _ in peft_model.named_parameters()
               if ".lora_A." in name}
    assert wrapped == set(LORA_TARGETS)  # every target name exists in the model (peft only fails if none does)
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-2)
    batch = labelled(4, 5, seed=1)
    pixel_values = torch.stack([b["pixel_values"] for b in batch])
    peft_model.train()
    if classifier:
        loss = peft_model(pixel_values=pixel_values, labels=torch.tensor([b["labels"] for b in batch])).loss
    else:
        loss = peft_model(pixel_values=pixel_values).last_hidden_state.pow(2).mean()
    loss.backward()
    optimizer.step()
    return peft_model.eval()


@pytest.mark.slow
@PEFT_WARNING
@pytest.mark.parametrize("base", ["elastic", "sliced"])
@pytest.mark.parametrize("name", ["vit-cls", "dinov2"])
def test_a_lora_adapter_of_a_sliced_model_reloads_onto_it(tiny_elastic, tmp_path, name, base):
    from peft import PeftModel

    model = sliced_model(tiny_elastic(name), CASE[name], sparsity=SPARSITY)
    untouched = output_of(model, probe())
    # The base the adapter is reloaded onto: the elastic checkpoint at the same sparsity, or a sliced checkpoint.
    if base == "sliced":
        model.save_pretrained(tmp_path / "sliced")
        source, budget = tmp_path / "sliced", {}
    else:
        source, budget = tiny_elastic(name), {"sparsity": SPARSITY}
    layout = dict(model.config.elastic_layout)
    peft_model = lora_step(model, classifier=name.endswith("-cls"))
    adapted = output_of(peft_model, probe())
    assert not torch.allclose(adapted, untouched, atol=1e-4), "one step at lr 1e-2 must move the LoRA weights"
    peft_model.save_pretrained(tmp_path / "adapter")

    reloaded = PeftModel.from_pretrained(hs.ElasticViTModel.from_pretrained(source, **budget), tmp_path / "adapter")
    assert reloaded.get_base_model().config.elastic_layout == layout
    torch.testing.assert_close(output_of(reloaded, probe()), adapted, rtol=1e-5, atol=1e-6)
    if base == "elastic":
        # The adapter's weight shapes are the base's widths: another budget does not fit (docs/deployment.md).
        with pytest.raises(RuntimeError, match="size mismatch"):
            PeftModel.from_pretrained(hs.ElasticViTModel.from_pretrained(source, sparsity=0.5), tmp_path / "adapter")


@pytest.mark.slow
@PEFT_WARNING
def test_a_merged_lora_model_saves_as_a_sliced_checkpoint(tiny_elastic, tmp_path):
    model = sliced_model(tiny_elastic("vit-cls"), CASE["vit-cls"], sparsity=SPARSITY)
    widths, layout = layer_widths(model), dict(model.config.elastic_layout)
    peft_model = lora_step(model, classifier=True)
    adapted = output_of(peft_model, probe())
    merged = peft_model.merge_and_unload()
    # merge_and_unload keeps the sliced class (a subclass of the stock one), so the save writes a sliced checkpoint
    assert type(merged) is type(model) and isinstance(merged, type(CASE["vit-cls"].build()))
    merged.save_pretrained(tmp_path / "merged")

    reloaded = hs.ElasticViTModel.from_pretrained(tmp_path / "merged")
    assert layer_widths(reloaded) == widths and reloaded.config.elastic_layout == layout
    torch.testing.assert_close(output_of(reloaded, probe()), adapted, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_a_fine_tuned_sliced_checkpoint_reloads_and_warns_only_when_sliced_further(tiny_elastic, tmp_path):
    # Two steps at lr 1e-2 on these tiny weights (std about 0.03) move them far past the fingerprint's 25 %
    # tolerance; an elastic checkpoint with such weights would be refused, a sliced one is in rank order by
    # construction.
    model = sliced_model(tiny_elastic("vit-cls"), CASE["vit-cls"], sparsity=SPARSITY)
    train_two_steps(model, tmp_path, learning_rate=1e-2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # at its saved size: no order check, no warning
        reloaded = hs.ElasticViTModel.from_pretrained(tmp_path / "fine-tuned")
    assert layer_widths(reloaded) == layer_widths(model)
    torch.testing.assert_close(output_of(reloaded, probe()), output_of(model.eval(), probe()), rtol=1e-5, atol=1e-6)

    with pytest.warns(UserWarning, match="probably fine-tuned"):
        smaller = hs.ElasticViTModel.from_pretrained(tmp_path / "fine-tuned", sparsity=0.5)
    assert all(a <= b for a, b in zip(smaller.config.elastic_layout["intermediate_size"],
                                      reloaded.config.elastic_layout["intermediate_size"]))
    assert smaller.config.elastic_layout["sparsity"] > reloaded.config.elastic_layout["sparsity"]
