"""Sliced checkpoints that the rest of the HF ecosystem can load and describe: the generated loading module and
``auto_map`` (trust_remote_code, without hf_snapvit installed), the model card written by ``save_pretrained`` and
``push_to_hub``, the sliced classes (pickle, deepcopy, PEFT), and ``device_map``."""

from __future__ import annotations

import ast
import copy
import inspect
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from huggingface_hub import ModelCard
from transformers import AutoModelForImageClassification

import hf_snapvit as hs
from hf_snapvit.elastic import remote_code
from hf_snapvit.loading import sliced
from hf_snapvit.surgery import slicing
from hf_snapvit.architectures.budget import layer_widths
from helpers import CASES, PROCESSOR, masked_copy, output_of

CASE = {c.name: c for c in CASES}
REMOTE_CASES = [name for name in ("vit-cls", "deit-cls-teacher", "dinov2", "dinov2-swiglu", "dinov3-gated",
                                   "siglip-vision", "siglip-cls", "siglip2-vision", "clip-vision", "vit-mae", "vit-msn",
                                   "beit", "beit-cls", "data2vec-vision") if name in CASE]


def _sliced(case: str, root: Path, sparsity: float = 0.4):
    """``(dense elastic model, sliced model, sliced folder)`` of a tiny random ``case`` model."""
    model = CASE[case].build()
    hs.save_elastic(model, hs.rank(model, method="magnitude"), root / f"{case}-elastic")
    dense = hs.ElasticViTModel.from_pretrained(root / f"{case}-elastic")
    model = hs.ElasticViTModel.from_pretrained(root / f"{case}-elastic", sparsity=sparsity, width_multiple=1)
    model.save_pretrained(root / f"{case}-sliced")
    return dense, model, root / f"{case}-sliced"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("remote")
    return root, {case: _sliced(case, root) for case in REMOTE_CASES}


def test_the_loading_module_is_the_packages_own_code_and_needs_only_torch_and_transformers():
    text = remote_code.remote_module_source("vit", {"AutoModel": "ViTModel"})
    for function in (slicing.slice_to_layout_, slicing.slice_model_, slicing.slice_heads_, slicing._take):
        assert inspect.getsource(function).strip() in text
    imported = {alias.name.split(".")[0] for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(ast.parse(text))
                 if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "dataclasses", "typing", "numpy", "torch", "transformers"}, imported
    assert "class ViTModel(transformers.ViTModel)" in text
    # Fields the generated spec leaves out must have defaults, or the module would not build its spec.
    import dataclasses
    from hf_snapvit.architectures import ArchitectureSpec
    missing = [f.name for f in dataclasses.fields(ArchitectureSpec) if f.name not in remote_code._STRUCTURAL_FIELDS
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    assert not missing


_LOAD_WITHOUT_PACKAGE = r"""
import json, sys
sys.modules["hf_snapvit"] = None  # as if it were not installed
try:
    import hf_snapvit
except ImportError:
    pass
else:
    raise SystemExit("hf_snapvit is importable")
import torch, transformers
jobs = json.loads(sys.argv[1])
for job in jobs:
    auto = getattr(transformers, job["auto"])
    model = auto.from_pretrained(job["path"], trust_remote_code=True).eval()
    inputs = torch.load(job["inputs"])
    with torch.no_grad():
        out = model(**inputs)
    result = {"output": out.logits if job["auto"] != "AutoModel" else out.last_hidden_state,
              "class": type(model).__module__ + "." + type(model).__name__}
    if job.get("pipeline"):
        from PIL import Image
        pipe = transformers.pipeline(job["pipeline"], model=job["path"], trust_remote_code=True)
        result["pipeline"] = pipe(Image.new("RGB", (40, 48), (120, 30, 200)), top_k=2)
    torch.save(result, job["out"])
"""


@pytest.mark.slow
def test_transformers_alone_loads_sliced_checkpoints_with_trust_remote_code(saved, tmp_path):
    root, models = saved
    jobs = []
    for case, (_, model, folder) in models.items():
        auto = remote_code.auto_classes(type(model).__mro__[2])[0]
        inputs = CASE[case].inputs(2)
        torch.save(inputs, tmp_path / f"{case}-in.pt")
        job = {"auto": auto, "path": str(folder), "inputs": str(tmp_path / f"{case}-in.pt"),
               "out": str(tmp_path / f"{case}-out.pt")}
        if case == "vit-cls":
            PROCESSOR.save_pretrained(folder)
            job["pipeline"] = "image-classification"
        jobs.append(job)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-c", _LOAD_WITHOUT_PACKAGE, json.dumps(jobs)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for case, (dense, model, folder) in models.items():
        result = torch.load(tmp_path / f"{case}-out.pt", weights_only=False)
        assert result["class"].startswith("transformers_modules.")
        inputs = CASE[case].inputs(2)
        reloaded = hs.ElasticViTModel.from_pretrained(folder)
        torch.testing.assert_close(result["output"], output_of(reloaded, inputs), atol=1e-5, rtol=0)
        heads, neurons = layer_widths(model)
        masked = masked_copy(dense, [(np.arange(h), np.arange(f)) for h, f in zip(heads, neurons)])
        torch.testing.assert_close(result["output"], output_of(masked, inputs), atol=1e-4, rtol=0)
        if case == "vit-cls":
            assert len(result["pipeline"]) == 2 and result["pipeline"][0]["label"] in model.config.id2label.values()


def test_stock_loading_without_trust_remote_code_fails_and_the_config_says_how_to_load(saved):
    _, models = saved
    folder = models["vit-cls"][2]
    with pytest.raises(Exception, match="(?i)size|shape|mismatch"):
        AutoModelForImageClassification.from_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"] == {"AutoModelForImageClassification":
                                  f"{remote_code.REMOTE_MODULE}.ViTForImageClassification"}
    assert config["architectures"] == ["ViTForImageClassification"]
    load_with = config["elastic_layout"]["load_with"]
    assert "trust_remote_code=True" in load_with["transformers"] and "ElasticViTModel" in load_with["hf_snapvit"]
    assert (folder / remote_code.REMOTE_FILE).is_file()
    # Saved under the weight names a stock checkpoint has (transformers' name conversions were applied).
    from safetensors import safe_open

    names = [safe_open(f / "model.safetensors", "pt").keys() for f in (folder, folder.parent / "vit-cls-elastic")]
    assert names[0] == names[1] and any(".attention.attention.query." in n for n in names[0])


def test_no_absolute_path_is_written(saved):
    root, models = saved
    for _, _, folder in models.values():
        for file in folder.iterdir():
            text = file.read_bytes()
            assert str(root).encode() not in text and b"/work" not in text and b"/tmp" not in text, file


def test_the_card_parses_and_says_how_to_load(saved):
    _, models = saved
    _, model, folder = models["vit-cls"]
    card = ModelCard.load(folder / "README.md")
    assert {"hf-snapvit", "elastic", "pruned", "custom_code"} <= set(card.data.tags)
    assert card.data.library_name == "transformers" and card.data.pipeline_tag == "image-classification"
    assert card.data.base_model is None  # loaded from a local folder: no Hub id known
    assert f'from_pretrained("{folder.name}", trust_remote_code=True)' in card.text
    assert f'ElasticViTModel.from_pretrained("{folder.name}")' in card.text
    heads, neurons = layer_widths(model)
    assert all(f"| {i} | {h} | {f} |" in card.text for i, (h, f) in enumerate(zip(heads, neurons)))
    assert "How the ranking was made" in card.text and "`magnitude`" in card.text


def test_the_card_reports_weight_correction_when_present(saved):
    from hf_snapvit.cards.sliced import sliced_card

    config = json.loads((saved[1]["vit-cls"][2] / "config.json").read_text())
    assert "Weight correction" not in sliced_card(config, "x").text
    config["elastic_correction"] = {"num_images": 8, "mean_error_before": 0.5, "mean_error_after": 0.125}
    text = sliced_card(config, "x").text
    assert "Weight correction" in text and "8 calibration images" in text and "0.125 after" in text


def test_the_card_names_a_hub_base_model(tmp_path):
    _, model, _ = _sliced("vit", tmp_path)
    model.config._name_or_path = "my-org/vit-elastic"
    model.save_pretrained(tmp_path / "out")
    assert ModelCard.load(tmp_path / "out" / "README.md").data.base_model == "my-org/vit-elastic"


class _FakeHub:
    """The upload boundary: records what would be committed."""

    def __init__(self):
        self.uploaded: dict[str, bytes] = {}

    def create_repo(self, repo_id, **kwargs):
        return type("Repo", (), {"repo_id": repo_id})()

    def create_commit(self, repo_id, operations, **kwargs):
        self.uploaded = {op.path_in_repo: Path(op.path_or_fileobj).read_bytes() for op in operations}


def test_push_to_hub_uploads_our_card_not_transformers_template(saved, monkeypatch):
    from huggingface_hub.errors import EntryNotFoundError
    import transformers.utils.hub as transformers_hub

    hub = _FakeHub()
    monkeypatch.setattr(transformers_hub, "hf_api", lambda: hub)

    load = ModelCard.load.__func__

    def load_local_only(cls, repo_id_or_path, **kwargs):  # the new Hub repo has no README.md yet
        if not Path(repo_id_or_path).is_file():
            raise EntryNotFoundError(f"{repo_id_or_path} has no README.md")
        return load(cls, repo_id_or_path, **kwargs)

    monkeypatch.setattr(ModelCard, "load", classmethod(load_local_only))
    _, model, _ = saved[1]["vit-cls"]
    model.push_to_hub("my-org/vit-sliced", tags=["mine"])
    readme = hub.uploaded["README.md"].decode()
    assert "This is the model card of a 🤗 transformers model" not in readme
    assert 'from_pretrained("my-org/vit-sliced", trust_remote_code=True)' in readme
    assert "hf-snapvit" in readme and "mine" in readme
    assert remote_code.REMOTE_FILE in hub.uploaded
    assert "auto_map" in json.loads(hub.uploaded["config.json"])


def test_save_pretrained_with_push_to_hub_uploads_our_card(saved, tmp_path, monkeypatch):
    import transformers.utils.hub as transformers_hub

    hub = _FakeHub()
    monkeypatch.setattr(transformers_hub, "hf_api", lambda: hub)
    monkeypatch.setattr(ModelCard, "load", classmethod(lambda cls, repo_id, **kwargs: ModelCard(
        "---\nlicense: mit\n---\nA card its author wrote on the Hub.\n")))
    _, model, _ = saved[1]["dinov2"]
    model.save_pretrained(tmp_path / "dino", push_to_hub=True, repo_id="me/dino-sliced")
    assert "A card its author wrote on the Hub." in hub.uploaded["README.md"].decode()  # kept, not replaced
    assert "auto_map" in json.loads(hub.uploaded["config.json"])
    assert (tmp_path / "dino" / remote_code.REMOTE_FILE).is_file()
    local = (tmp_path / "dino" / "README.md").read_text()
    assert 'AutoModel.from_pretrained("dino", trust_remote_code=True)' in local
    assert "image-feature-extraction" in local


def test_save_is_atomic_and_leaves_the_model_as_it_was(saved, tmp_path, monkeypatch):
    _, model, folder = saved[1]["vit-cls"]
    before = model.config.to_dict()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    model.save_pretrained(tmp_path / "again")
    assert model.config.to_dict() == before and "auto_map" not in before
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())

    def broken(*args):
        raise OSError("disk full")

    monkeypatch.setattr(remote_code, "remote_module_source", broken)
    with pytest.raises(OSError, match="disk full"):
        model.save_pretrained(tmp_path / "new")
    assert not (tmp_path / "new").exists()
    with pytest.raises(OSError, match="disk full"):
        model.save_pretrained(tmp_path / "again")
    assert sorted(p.name for p in (tmp_path / "again").iterdir()) == sorted(p.name for p in folder.iterdir()
                                                                             if p.name != "preprocessor_config.json")


def test_sliced_classes_keep_the_stock_identity_and_survive_pickle_and_deepcopy(saved, tmp_path):
    _, model, folder = saved[1]["vit-cls"]
    assert isinstance(model, transformers.ViTForImageClassification)
    assert type(model).__name__ == "ViTForImageClassification" and type(model) is sliced.ViTForImageClassification
    inputs = CASE["vit-cls"].inputs(2)
    expected = output_of(model, inputs)
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert type(twin) is type(model)
        torch.testing.assert_close(output_of(twin, inputs), expected)
    torch.save(model, tmp_path / "m.pt")
    torch.testing.assert_close(output_of(torch.load(tmp_path / "m.pt", weights_only=False), inputs), expected)
    # The class alone loads the folder: it builds itself at the saved widths before transformers loads weights.
    direct = sliced.ViTForImageClassification.from_pretrained(folder)
    torch.testing.assert_close(output_of(direct.eval(), inputs), expected)
    assert transformers.ViTForImageClassification.save_pretrained is not type(model).save_pretrained
    assert getattr(transformers.ViTForImageClassification, "_auto_class", None) is None


def test_dense_loads_keep_their_stock_class(saved):
    root, _ = saved
    dense = hs.ElasticViTModel.from_pretrained(root / "vit-cls-elastic")
    assert type(dense) is transformers.ViTForImageClassification


def _one_lora_step(model):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    peft_model = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    optimizer = torch.optim.SGD([p for p in peft_model.parameters() if p.requires_grad], lr=0.1)
    peft_model.train()
    loss = peft_model(**CASE["vit-cls"].inputs(2)).logits.square().mean()
    loss.backward()
    optimizer.step()
    return peft_model.eval()


@pytest.mark.slow
def test_lora_adapters_reload_through_auto_peft_model_and_the_recipe(saved, tmp_path):
    pytest.importorskip("peft")
    from peft import AutoPeftModel, PeftModel

    root, models = saved
    folder = models["vit-cls"][2]
    inputs = CASE["vit-cls"].inputs(2)
    # Loaded from a saved sliced folder: the adapter's base_model_name_or_path is that folder.
    trained = _one_lora_step(hs.ElasticViTModel.from_pretrained(folder))
    trained.save_pretrained(tmp_path / "adapter")
    expected = output_of(trained, inputs)
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"] \
        == str(folder)
    again = AutoPeftModel.from_pretrained(tmp_path / "adapter", import_allowlist=["hf_snapvit"]).eval()
    torch.testing.assert_close(output_of(again, inputs), expected)
    # Sliced from the dense elastic checkpoint (no sliced folder exists): the documented recipe.
    base = hs.ElasticViTModel.from_pretrained(root / "vit-cls-elastic", sparsity=0.4, width_multiple=1)
    trained = _one_lora_step(base)
    trained.save_pretrained(tmp_path / "adapter2")
    recipe = PeftModel.from_pretrained(
        hs.ElasticViTModel.from_pretrained(root / "vit-cls-elastic", sparsity=0.4, width_multiple=1),
        tmp_path / "adapter2").eval()
    torch.testing.assert_close(output_of(recipe, inputs), output_of(trained, inputs))


def test_device_map_auto_picks_the_one_device_and_strategies_are_refused(saved):
    root, _ = saved
    path = root / "vit-cls-elastic"
    model = hs.ElasticViTModel.from_pretrained(path, sparsity=0.4, device_map="auto")
    expected = torch.accelerator.current_accelerator().type if torch.accelerator.is_available() else "cpu"
    assert {p.device.type for p in model.parameters()} == {expected}
    model = hs.ElasticViTModel.from_pretrained(path, sparsity=0.4, device_map={"": "cpu"})
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    # Dicts and strategies are placed by accelerate: tests/loading/test_placement.py.


class _Images(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return {"pixel_values": CASE["vit-cls"].inputs(1)["pixel_values"][0] + i, "labels": i % 5}


@pytest.mark.slow
def test_trainer_checkpoints_of_a_sliced_model_carry_the_loading_module_and_card(saved, tmp_path):
    _, model, _ = saved[1]["vit-cls"]
    model = copy.deepcopy(model)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=1, save_steps=1,
                                          per_device_train_batch_size=2, report_to=[], use_cpu=True)
    transformers.Trainer(model=model, args=args, train_dataset=_Images()).train()
    checkpoint = tmp_path / "run" / "checkpoint-1"
    assert (checkpoint / remote_code.REMOTE_FILE).is_file() and (checkpoint / "trainer_state.json").is_file()
    assert "hf-snapvit" in ModelCard.load(checkpoint / "README.md").data.tags
    assert "auto_map" in json.loads((checkpoint / "config.json").read_text())
    reloaded = hs.ElasticViTModel.from_pretrained(checkpoint)  # (remote-code loading: tested in a subprocess)
    inputs = CASE["vit-cls"].inputs(2)
    torch.testing.assert_close(output_of(reloaded, inputs), output_of(model.eval(), inputs))
