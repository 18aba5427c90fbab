"""The hostile zoo (issue 63, point 6): tiny module trees that almost look like ViTs (tests/support/zoo_cases.py), each
ranked, saved and loaded as a user would, and held to what is correct for it: a slice equal to a mask built from the
case's own ground truth (tests/support/zoo.py, never hf_snapvit's spec) at two sparsities, sliced and switchable, with
parameter and GFLOP counts that match what runs; or a refusal by an hf_snapvit error of a few lines that names the
reason, with nothing written and the caller's model untouched.

Each failure names its kind first: SILENT WRONG (loads, but outputs or counts differ from the truth), CRASH (an
error that is not hf_snapvit's), UNCLEAR (a refusal too long or not naming its reason), REFUSED (a case that must
work), ACCEPTED (a case that must be refused), CHANGED (the caller's model or a folder was touched).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
import shutil
import warnings

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import hf_snapvit as hs
from support import zoo
from hf_snapvit.architectures import discovery
from hf_snapvit.surgery import proof
from support.zoo_cases import BY_NAME, CASES, DELETE, Case

FRACTIONS = (0.35, 0.85)  # the two sparsities, as fractions of the ranking's largest
MAX_MESSAGE = 600  # characters a refusal may take ("a few lines")
MAX_LINES = 5
PARTIAL = r"stack|share|prunable|partial|part of"  # what a warning about pruning part of the model says
DENSE_FLOPS_TOLERANCE, REMOVED_FLOPS_TOLERANCE = 0.15, 0.10  # the counter omits softmax and norms


@pytest.fixture(autouse=True)
def fresh_discoveries(monkeypatch):
    """Each case is discovered from scratch, as in a new process."""
    monkeypatch.setattr(discovery, "_DISCOVERED", {}, raising=False)
    monkeypatch.setattr(proof, "_PROVEN", set(), raising=False)


@pytest.fixture(scope="session")
def saved_base(tmp_path_factory):
    """``saved_base(name)``: ``(folder, ranking, stored ranking)`` of the zoo case ``name`` saved once per session,
    the checkpoint the corrupt-spec cases copy and edit (tests must not modify it)."""
    saved = {}

    def get(name: str):
        if name not in saved:
            model = BY_NAME[name].build()
            folder = tmp_path_factory.mktemp(f"zoo-{name}")
            ranking = hs.rank(model, method="magnitude", show_progress=False)
            saved[name] = folder, ranking, hs.save_elastic(model, ranking, folder, model_card=False)
        return saved[name]

    return get


def _floats(value) -> list[torch.Tensor]:
    """Every floating tensor of an output, in order (ModelOutputs and dicts by value, tuples, lists)."""
    if isinstance(value, torch.Tensor):
        return [value.detach().float()] if value.is_floating_point() else []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _floats(item)]
    return []


def _forward(model, inputs: dict) -> list[torch.Tensor]:
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return _floats(model(**inputs))


def _differences(what: str, got: list[torch.Tensor], want: list[torch.Tensor]) -> list[str]:
    """What differs between two outputs: the number or shapes of tensors, where they are not finite, or finite values
    beyond float32 noise."""
    if [t.shape for t in got] != [t.shape for t in want]:
        return [f"SILENT WRONG: {what}: output shapes {[tuple(t.shape) for t in got]}, the mask's "
                f"{[tuple(t.shape) for t in want]}"]
    for index, (a, b) in enumerate(zip(got, want)):
        if not torch.equal(a.isnan(), b.isnan()) or not torch.equal(a.isinf() & (a > 0), b.isinf() & (b > 0)) \
                or not torch.equal(a.isinf() & (a < 0), b.isinf() & (b < 0)):
            return [f"SILENT WRONG: {what}: output {index} is non-finite elsewhere than the mask's"]
        finite = b.isfinite()
        if finite.any():
            scale = float(b[finite].abs().max())
            error = float((a[finite] - b[finite]).abs().max())
            if error > 1e-4 * max(1.0, scale):
                return [f"SILENT WRONG: {what}: output {index} differs from the mask by {error:.3g} (max |x| "
                        f"{scale:.3g})"]
    return []


def _short(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:240]}{'...' if len(text) > 240 else ''}"


def _refusal(case: Case, error: Exception, *, spec: bool = False) -> list[str]:
    """What is wrong with ``error`` as this case's refusal. The case's own model type and class names are read as a
    plain name (``my_vit``) would be: they must neither lengthen a message nor supply its keyword."""
    message = re.sub(r"hf_snapvit_zoo_\w+|Zoo\w+", "my_vit", str(error))
    if not isinstance(error, hs.SnapViTError):
        return [f"CRASH: {_short(error)}"]
    if case.expect == "works":
        return [f"REFUSED (must work): {_short(error)}"]
    problems = []
    if len(message) > MAX_MESSAGE or message.count("\n") >= MAX_LINES:
        problems.append(f"UNCLEAR: {len(message)} characters, {message.count(chr(10)) + 1} lines")
    if spec and "elastic_spec" not in message:
        problems.append("UNCLEAR: does not name elastic_spec")
    if not re.search(case.reason, message, re.IGNORECASE):
        problems.append(f"UNCLEAR: names none of {case.reason!r}")
    return [f"{p} -- {_short(error)}" for p in problems]


def _snapshot(model) -> tuple:
    state = [(name, id(t), t.detach().clone()) for name, t in model.state_dict(keep_vars=True).items()]
    return state, model.config.to_json_string(), model.training


def _changed(model, before: tuple) -> list[str]:
    state, config, training = before
    now = {name: t for name, t in model.state_dict(keep_vars=True).items()}
    if [n for n, _, _ in state] != list(now) or any(id(now[n]) != i or not torch.equal(now[n].detach(), t)
                                                    for n, i, t in state):
        return ["CHANGED: the caller's model's parameters or buffers"]
    if model.config.to_json_string() != config or model.training != training:
        return ["CHANGED: the caller's model's config or mode"]
    return []


def _digest(folder) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*")):
        digest.update(str(path.relative_to(folder)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _flops(model, inputs: dict) -> int:
    model = copy.deepcopy(model).requires_grad_(False)  # the counter's module hooks trip on parameters in the graph
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(**inputs)
    return counter.get_total_flops()


def _candidates(holders: list[list], num_layers: int) -> list[tuple[list[int], bool]]:
    """Which blocks of the ground truth a ranking of ``num_layers`` blocks can be about: every block the forward
    uses (stacks in order), or, pruned partly, one stack (``True``)."""
    total, found, start = sum(map(len, holders)), [], 0
    if num_layers == total:
        found.append((list(range(total)), False))
    for stack in holders:
        if len(holders) > 1 and len(stack) == num_layers:
            found.append((list(range(start, start + len(stack))), True))
        start += len(stack)
    return found


def _loads(folder, sparsities) -> tuple[dict, object]:
    loaded = {s: hs.ElasticViTModel.from_pretrained(folder, sparsity=s) for s in (0.0, *sparsities)}
    return loaded, hs.ElasticViTModel.from_pretrained(folder, switchable=True)


def _against_masks(case, model, blocks, ranking, stored, loaded, switchable, sparsities) -> list[str]:
    """The loaded models' outputs against the untouched model (sparsity 0) and the masked ones."""
    inputs = case.inputs(2)
    reference = {0.0: _forward(model, inputs)}
    for s in sparsities:
        reference[s] = _forward(zoo.masked(model, blocks, ranking.keep_indices(stored.keep_counts(s))), inputs)
    problems = []
    for s, sliced in loaded.items():
        problems += _run(f"sparsity {s:.3f}", lambda m=sliced: _forward(m, inputs), reference[s])
    for s in (sparsities[1], sparsities[0], 0.0):  # shrink, grow, back to dense
        def switched(s=s):
            switchable.set_budget(sparsity=s)
            return _forward(switchable, inputs)
        problems += _run(f"switchable at {s:.3f}", switched, reference[s])
    return problems


def _run(what: str, forward, want) -> list[str]:
    try:
        got = forward()
    except Exception as error:  # noqa: BLE001 - any failure of a loaded model's forward is a defect
        return [f"CRASH: {what}, forward of the loaded model: {_short(error)}"]
    return _differences(what, got, want)


def _counts(case, model, stored, loaded, sparsities) -> list[str]:
    """Parameters and GFLOPs the layout claims against what the loaded models hold and run."""
    task = sum(p.numel() for p in model.head.parameters()) if case.options["classifier"] else 0
    problems = []
    if stored.shape.num_params() != _params(model) - task:
        problems.append(f"SILENT WRONG: the ranking counts {stored.shape.num_params()} backbone parameters, the "
                        f"model has {_params(model) - task}")
    for s in sparsities:
        counts, held = stored.keep_counts(s), _params(loaded[s])
        layout = getattr(loaded[s].config, "elastic_layout", None) or {}
        if held != counts.num_params + task or layout.get("num_params") != counts.num_params:
            problems.append(f"SILENT WRONG: at sparsity {s:.3f} the model holds {held} parameters, the layout "
                            f"claims {layout.get('num_params')} (+{task} in the task head)")
    inputs = case.inputs(1)
    if case.any_size:  # the size hf_snapvit chose for a model of any size
        side = math.isqrt(stored.shape.num_patches) * stored.shape.patch_size
        inputs = {"pixel_values": torch.randn(1, case.options["channels"], side, side)}
    counts = stored.keep_counts(sparsities[1])
    dense, sliced = _flops(model, inputs), _flops(loaded[sparsities[1]], inputs)
    claimed, claimed_sliced = stored.shape.flops(), stored.shape.flops(counts.heads, counts.neurons)
    if abs(dense - claimed) > DENSE_FLOPS_TOLERANCE * dense:
        problems.append(f"SILENT WRONG: GFLOPs: the layout claims {claimed} FLOPs dense, {dense} run")
    if abs((dense - sliced) - (claimed - claimed_sliced)) > REMOVED_FLOPS_TOLERANCE * max(claimed - claimed_sliced, 1):
        problems.append(f"SILENT WRONG: GFLOPs: slicing removes {dense - sliced} FLOPs, the layout claims "
                        f"{claimed - claimed_sliced}")
    return problems


def _check_loaded(case, model, ranking, stored, folder, warned: list[str]) -> list[str]:
    """A saved case: its loads against the masks (for some reading of which blocks the ranking is about), its counts,
    and a warning where only part of the model is pruned."""
    holders = zoo.unit_holders(model)
    candidates = _candidates(holders, stored.shape.num_layers)
    if not candidates:
        return [f"SILENT WRONG: the ranking is about {stored.shape.num_layers} blocks, the forward uses stacks of "
                f"{[len(s) for s in holders]}"]
    largest = stored.max_sparsity_for(None)
    sparsities = tuple(round(f * largest, 4) for f in FRACTIONS)
    try:
        loaded, switchable = _loads(folder, sparsities)
    except Exception as error:  # noqa: BLE001 - what save_elastic writes must load
        return [f"CRASH: save_elastic wrote a checkpoint that does not load: {_short(error)}"]
    found = []
    for blocks, partial in candidates:
        problems = _against_masks(case, model, blocks, ranking, stored, loaded, switchable, sparsities)
        if partial and not any(re.search(PARTIAL, w, re.IGNORECASE) for w in warned):
            problems.append("SILENT WRONG: prunes one of several block stacks without a warning saying so")
        found.append(problems)
    problems = min(found, key=len)  # the reading of the ranking that fits the model best
    problems += _counts(case, model, stored, loaded, sparsities)
    if case.prune_heads and stored.floors()[0] >= stored.shape.num_heads:
        why = next((w for w in warned if "head" in w), "no warning")
        problems.append(f"HEADS KEPT (must prune heads): {why[:240]}")
    return problems


def _check_zoo_model(case: Case, model) -> None:
    """The zoo's own sanity, before hf_snapvit sees the model: it runs its forward, and its outputs depend on the units
    its ground truth names (else a slice would match any mask)."""
    inputs = case.inputs(2)
    reference = _forward(model, inputs)
    holders = [row for stack in zoo.unit_holders(model) for row in stack]
    if holders and any(t.isfinite().any() for t in reference):
        one = zoo.masked(model, list(range(len(holders))), [([0], [0])] * len(holders))
        assert _differences("zoo", _forward(one, inputs), reference), f"zoo bug: {case.name}'s units do not matter"


def _model_case(case: Case, tmp_path) -> list[str]:
    model = case.build()
    before = _snapshot(model)
    _check_zoo_model(case, model)
    folder = tmp_path / "out"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            ranking = hs.rank(model, method=case.method, show_progress=False)
            stored = hs.save_elastic(model, ranking, folder, model_card=False)
        except Exception as error:  # noqa: BLE001 - judged as this case's refusal
            problems = _refusal(case, error) + _changed(model, before)
            if any(tmp_path.iterdir()):
                problems.append(f"CHANGED: a refusal left {[p.name for p in tmp_path.iterdir()]}")
            return problems
    problems = _changed(model, before)
    problems += _check_loaded(case, model, ranking, stored, folder, [str(w.message) for w in caught])
    if case.expect == "refuse":
        problems.insert(0, f"ACCEPTED (must refuse, naming {case.reason!r}): ranked, saved and loaded")
    return problems


def _corrupt_spec(case: Case, tmp_path, saved_base) -> list[str]:
    base = BY_NAME[case.base]
    source, ranking, stored = saved_base(case.base)
    folder = tmp_path / "edited"
    shutil.copytree(source, folder)
    config = json.loads((folder / "config.json").read_text())
    edited = case.edit(copy.deepcopy(config["elastic_spec"]))
    if edited is DELETE:
        del config["elastic_spec"]
    else:
        config["elastic_spec"] = edited
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    digest = _digest(folder)
    sparsities = tuple(round(f * stored.max_sparsity_for(None), 4) for f in FRACTIONS)
    try:
        loaded, switchable = _loads(folder, sparsities)
    except Exception as error:  # noqa: BLE001 - judged as this case's refusal
        problems = _refusal(case, error, spec=True)
        return problems + (["CHANGED: the refused checkpoint's folder"] if _digest(folder) != digest else [])
    model = base.build()
    blocks = list(range(stored.shape.num_layers))
    problems = _against_masks(base, model, blocks, ranking, stored, loaded, switchable, sparsities)
    if not problems:
        problems = _counts(base, model, stored, loaded, sparsities)
    if case.expect == "refuse":
        problems.insert(0, f"ACCEPTED (must refuse, naming elastic_spec and {case.reason!r}): loaded")
    return problems


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_hostile_zoo(case: Case, tmp_path, saved_base):
    problems = _corrupt_spec(case, tmp_path, saved_base) if case.edit else _model_case(case, tmp_path)
    assert not problems, f"[{case.kind}, expected {case.expect}] " + " | ".join(problems)


def test_the_zoo_is_large_and_its_truth_is_its_own():
    """At least 100 cases, and the harness's mask is not a no-op: masking every head but one and every neuron but
    one changes a plain model's output."""
    assert len(CASES) >= 100
    case = BY_NAME["plain"]
    model = case.build()
    keep = [([0], [0])] * 2
    assert _differences("mask", _forward(zoo.masked(model, [0, 1], keep), case.inputs(2)),
                        _forward(model, case.inputs(2)))
