"""Issue 30, switching: a switch from another thread never lands in the middle of a forward pass, and switching
under ``no_grad``, ``autocast``, ``torch.compile`` and between optimizer steps does what docs/switching.md says."""

from __future__ import annotations

import contextlib
import copy
import pickle
import threading
from typing import Any, Callable, Iterator

import pytest
import torch

from hf_snapvit import ElasticViTModel
from hf_snapvit.architectures import get_layers
from hf_snapvit.architectures.budget import layer_widths
from hf_snapvit.errors import BudgetError
from hf_snapvit.surgery.switching import PrefixLinear
from helpers import CASES, output_of

NAMED = {c.name: c for c in CASES}
WAIT = 30.0  # seconds a test waits for another thread before it gives up (the machine may be busy)
BLOCKED = 0.5  # seconds a switch that must wait is given to (wrongly) finish


def reference(folder: Any, sparsity: float, inputs: dict) -> torch.Tensor:
    """The output of the separately sliced model at ``sparsity`` (the dense model at 0)."""
    return output_of(ElasticViTModel.from_pretrained(folder, sparsity=sparsity), inputs)


class Paused:
    """A forward pass of ``model`` in its own thread, held after its first block until :meth:`release`: the moment a
    switch from another thread would leave the blocks at two sizes."""

    def __init__(self, model: torch.nn.Module, inputs: dict, call: Callable[..., Any] | None = None) -> None:
        self.inside, self.released, self.result = threading.Event(), threading.Event(), {}
        self.hook = get_layers(model)[0].register_forward_hook(self._pause)
        self.thread = threading.Thread(target=self._run, args=(call or model, inputs), daemon=True)

    def _pause(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        if not self.inside.is_set():
            self.inside.set()
            self.released.wait(WAIT)

    def _run(self, call: Callable[..., Any], inputs: dict) -> None:
        with torch.no_grad():
            out = call(**inputs)
        self.result["out"] = getattr(out, "logits", None) if getattr(out, "logits", None) is not None \
            else out.last_hidden_state

    def release(self) -> torch.Tensor:
        """Let the forward finish; its output."""
        self.released.set()
        self.thread.join(WAIT)
        self.hook.remove()
        return self.result["out"]


@contextlib.contextmanager
def paused(model: torch.nn.Module, inputs: dict, call: Callable[..., Any] | None = None) -> Iterator[Paused]:
    """A :class:`Paused` forward, started and inside its first block on entry, always released on exit."""
    forward = Paused(model, inputs, call)
    forward.thread.start()
    assert forward.inside.wait(WAIT), "the forward pass never reached its first block"
    try:
        yield forward
    finally:
        forward.release()


def in_thread(target: Callable[[], Any]) -> tuple[threading.Thread, dict]:
    """Run ``target`` in a started thread; its return value or exception lands in the dict."""
    result: dict = {}

    def run() -> None:
        try:
            result["value"] = target()
        except BaseException as error:  # noqa: BLE001 (handed to the test thread)
            result["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


@pytest.mark.parametrize("how", ["set_budget", "budget"])
def test_a_switch_from_another_thread_waits_for_the_running_forward(how, elastic):
    inputs = NAMED["vit"].inputs(2)
    model = ElasticViTModel.from_pretrained(elastic["vit"], switchable=True, sparsity=0.1)
    before = model.elastic_budget
    if how == "set_budget":
        switch = lambda: model.set_budget(sparsity=0.5)  # noqa: E731
    else:
        def switch() -> Any:
            with model.budget(sparsity=0.5) as inner:
                return inner, output_of(model, inputs)
    with paused(model, inputs) as forward:
        switcher, switched = in_thread(switch)
        switcher.join(BLOCKED)
        assert switcher.is_alive(), f"{how} returned while a forward pass of the model was running"
        assert model.elastic_budget == before and layer_widths(model) == (list(before.heads), list(before.neurons))
        out = forward.release()
    switcher.join(WAIT)
    assert "error" not in switched, switched.get("error")
    torch.testing.assert_close(out, reference(elastic["vit"], 0.1, inputs), rtol=1e-5, atol=1e-4)
    if how == "set_budget":  # the switch took effect after the forward
        assert model.elastic_budget == switched["value"] and switched["value"].sparsity > before.sparsity
        torch.testing.assert_close(output_of(model, inputs), reference(elastic["vit"], 0.5, inputs),
                                   rtol=1e-5, atol=1e-4)
    else:  # the block ran at its own size, and the size before came back
        torch.testing.assert_close(switched["value"][1], reference(elastic["vit"], 0.5, inputs), rtol=1e-5, atol=1e-4)
        assert model.elastic_budget == before


def test_a_forward_that_starts_while_a_switch_waits_runs_after_it_at_the_new_size(elastic):
    inputs = NAMED["vit"].inputs(2)
    model = ElasticViTModel.from_pretrained(elastic["vit"], switchable=True)
    with paused(model, inputs) as first:
        switcher, _ = in_thread(lambda: model.set_budget(sparsity=0.5))
        switcher.join(BLOCKED)
        later, result = in_thread(lambda: output_of(model, inputs))
        later.join(BLOCKED)
        # Behind a waiting switch, so a stream of forwards cannot keep a switch waiting for ever.
        assert later.is_alive(), "a forward started while a switch was waiting ran before it"
        out = first.release()
    switcher.join(WAIT)
    later.join(WAIT)
    torch.testing.assert_close(out, reference(elastic["vit"], 0.0, inputs), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(result["value"], reference(elastic["vit"], 0.5, inputs), rtol=1e-5, atol=1e-4)


def test_a_budget_block_keeps_its_size_while_another_thread_switches(elastic):
    inputs = NAMED["vit"].inputs(2)
    model = ElasticViTModel.from_pretrained(elastic["vit"], switchable=True)
    entered, leave, seen = threading.Event(), threading.Event(), {}

    def block() -> None:
        with model.budget(sparsity=0.5):
            entered.set()
            leave.wait(WAIT)
            seen["inside"] = output_of(model, inputs)

    holder, _ = in_thread(block)
    assert entered.wait(WAIT)
    switcher, switched = in_thread(lambda: model.set_budget(sparsity=0.3))
    switcher.join(BLOCKED)
    try:
        assert switcher.is_alive(), "set_budget of another thread changed the size inside a budget() block"
    finally:
        leave.set()
        holder.join(WAIT)
        switcher.join(WAIT)
    torch.testing.assert_close(seen["inside"], reference(elastic["vit"], 0.5, inputs), rtol=1e-5, atol=1e-4)
    assert model.elastic_budget == switched["value"]  # applied once the block had restored its previous size
    torch.testing.assert_close(output_of(model, inputs), reference(elastic["vit"], 0.3, inputs), rtol=1e-5, atol=1e-4)


def test_forwards_of_several_threads_run_side_by_side(elastic):
    inputs = NAMED["vit"].inputs(2)
    model = ElasticViTModel.from_pretrained(elastic["vit"], switchable=True, sparsity=0.3)
    with paused(model, inputs):
        other, result = in_thread(lambda: output_of(model, inputs))
        other.join(WAIT)  # not serialised behind the paused one
        assert not other.is_alive(), "a forward waited for another thread's forward"
    torch.testing.assert_close(result["value"], reference(elastic["vit"], 0.3, inputs), rtol=1e-5, atol=1e-4)


def test_a_switch_inside_the_models_own_forward_is_refused(elastic):
    inputs = NAMED["vit"].inputs(1)
    model = ElasticViTModel.from_pretrained(elastic["vit"], switchable=True)
    before, caught = model.elastic_budget, []

    def switch_midway(module: torch.nn.Module, args: tuple, output: Any) -> None:
        try:
            model.set_budget(sparsity=0.5)
        except BudgetError as error:
            caught.append(error)

    hook = get_layers(model)[0].register_forward_hook(switch_midway)
    try:
        out = output_of(model, inputs)
    finally:
        hook.remove()
    assert len(caught) == 1 and "forward" in str(caught[0]) and "set_budget" in str(caught[0])
    assert model.elastic_budget == before
    torch.testing.assert_close(out, reference(elastic["vit"], 0.0, inputs), rtol=1e-5, atol=1e-4)


def test_copies_and_unpickled_models_have_their_own_gate(elastic):
    inputs = NAMED["vit"].inputs(1)
    model = ElasticViTModel.from_pretrained(elastic["vit"], switchable=True, sparsity=0.2)
    twin, restored = copy.deepcopy(model), pickle.loads(pickle.dumps(model))
    with paused(model, inputs):
        # Other models: nothing to wait for. The paused model itself: its switch waits.
        assert twin.set_budget(sparsity=0.5).sparsity > 0.2 and restored.set_budget(sparsity=0.4).sparsity > 0.2
        switcher, _ = in_thread(lambda: model.set_budget(sparsity=0.0))
        switcher.join(BLOCKED)
        assert switcher.is_alive()
    switcher.join(WAIT)
    for copy_, sparsity in ((twin, 0.5), (restored, 0.4)):
        torch.testing.assert_close(output_of(copy_, inputs), reference(elastic["vit"], sparsity, inputs),
                                   rtol=1e-5, atol=1e-4)
        with paused(copy_, inputs):  # a copy's gate works as well
            switcher, _ = in_thread(lambda: copy_.set_budget(sparsity=0.1))
            switcher.join(BLOCKED)
            assert switcher.is_alive()
        switcher.join(WAIT)


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_switching_inside_no_grad_and_inference_mode(mode, elastic):
    case = NAMED["vit-cls"]
    model = ElasticViTModel.from_pretrained(elastic["vit-cls"], switchable=True)
    with mode():
        model.set_budget(sparsity=0.4)
        torch.testing.assert_close(model(**case.inputs(2)).logits, reference(elastic["vit-cls"], 0.4, case.inputs(2)))
    # Only integers changed: training outside the mode still reaches the parameters.
    model.train()(**case.inputs(2)).logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad and p.ndim == 2)


def test_switching_under_cpu_bf16_autocast_equals_the_sliced_model_under_it(elastic):
    case = NAMED["vit-cls"]
    model = ElasticViTModel.from_pretrained(elastic["vit-cls"], switchable=True)
    sliced = ElasticViTModel.from_pretrained(elastic["vit-cls"], sparsity=0.4)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        model.set_budget(sparsity=0.4)
        ours, theirs = model(**case.inputs(2)).logits, sliced(**case.inputs(2)).logits
    assert ours.dtype == theirs.dtype == torch.bfloat16
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=2e-2, atol=2e-2)
    assert next(model.parameters()).dtype == torch.float32  # autocast casts on the fly, the weights stay


def _outside(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every PrefixLinear weight with its active prefix zeroed: the part a step at this size must not move."""
    parts = {}
    for name, module in model.named_modules():
        if isinstance(module, PrefixLinear):
            rest = module.weight.detach().clone()
            rest[: module.out_features, : module.in_features] = 0
            parts[name] = rest
    return parts


def test_switching_between_sgd_steps_trains_exactly_the_active_prefix(elastic):
    case = NAMED["vit-cls"]
    model = ElasticViTModel.from_pretrained(elastic["vit-cls"], switchable=True).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for sparsity in (0.5, 0.0, 0.3, 0.5):
        model.set_budget(sparsity=sparsity)
        sliced = model.to_sliced().train()  # the sliced model of this size, from the same weights
        sliced_optimizer = torch.optim.SGD(sliced.parameters(), lr=0.5)
        outside = _outside(model)
        for net, opt in ((model, optimizer), (sliced, sliced_optimizer)):
            opt.zero_grad()
            net(**case.inputs(2)).logits.pow(2).mean().backward()
            opt.step()
        after = _outside(model)
        assert all(torch.equal(after[name], outside[name]) for name in outside), "a unit outside the size moved"
        stepped = model.to_sliced().state_dict()
        for name, value in sliced.state_dict().items():
            torch.testing.assert_close(stepped[name], value, rtol=1e-5, atol=1e-6, msg=name)


def test_optimizer_state_moves_units_outside_the_current_size(elastic):
    """The limit docs/switching.md states: gradients reach only the prefix, but momentum (Adam's moments) from an
    earlier, larger size still moves the rest."""
    case = NAMED["vit-cls"]
    model = ElasticViTModel.from_pretrained(elastic["vit-cls"], switchable=True).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    for sparsity in (0.0, 0.5):
        model.set_budget(sparsity=sparsity)
        outside = _outside(model)
        optimizer.zero_grad()
        model(**case.inputs(2)).logits.pow(2).mean().backward()
        optimizer.step()
    after = _outside(model)
    assert any(not torch.equal(after[name], outside[name]) for name in outside)


def test_a_switch_between_forward_and_backward_keeps_the_forwards_gradients(elastic):
    case = NAMED["vit-cls"]
    model = ElasticViTModel.from_pretrained(elastic["vit-cls"], switchable=True).train()
    grads = []
    for switch_before_backward in (False, True):
        model.set_budget(sparsity=0.4)
        model.zero_grad()
        loss = model(**case.inputs(2)).logits.pow(2).mean()
        if switch_before_backward:
            model.set_budget(sparsity=0.0)  # the graph holds the views the forward used
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], msg=name)


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    """Clear dynamo's caches around a test (switches recompile code shared by every model of the class)."""
    torch.compiler.reset()
    yield
    torch.compiler.reset()


class _Outer(torch.nn.Module):
    """A larger module that calls the switchable one."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, pixel_values: torch.Tensor) -> Any:
        return self.inner(pixel_values=pixel_values)


@pytest.mark.parametrize("how", ["torch.compile", "model.compile", "inside a compiled module"])
def test_a_compiled_model_takes_the_gate_outside_its_graph(how, elastic, fresh_dynamo):
    inputs = NAMED["vit"].inputs(2)
    model = ElasticViTModel.from_pretrained(elastic["vit"], switchable=True)
    if how == "torch.compile":
        call = torch.compile(model, backend="aot_eager", fullgraph=True)  # fullgraph: no graph break for the gate
    elif how == "model.compile":
        model.compile(backend="aot_eager", fullgraph=True)
        call = model
    else:  # one graph break at the call of the switchable model, which then runs as torch.compile(model) does
        call = torch.compile(_Outer(model), backend="aot_eager")
    for sparsity in (0.3, 0.0):
        model.set_budget(sparsity=sparsity)
        torch.testing.assert_close(output_of(call, inputs), reference(elastic["vit"], sparsity, inputs),
                                   rtol=1e-5, atol=1e-4)
    entered, release = threading.Event(), threading.Event()

    @torch.compiler.disable
    def hold(module: torch.nn.Module, args: tuple) -> None:  # runs inside the gate, before the compiled forward
        entered.set()
        release.wait(WAIT)

    handle = model.register_forward_pre_hook(hold)
    forward, result = in_thread(lambda: output_of(call, inputs))
    switcher = None
    try:
        assert entered.wait(WAIT)
        switcher, _ = in_thread(lambda: model.set_budget(sparsity=0.3))
        switcher.join(BLOCKED)
        assert switcher.is_alive(), "set_budget did not wait for a compiled forward"
    finally:
        release.set()
        forward.join(WAIT)
        if switcher is not None:
            switcher.join(WAIT)
        handle.remove()
    torch.testing.assert_close(result["value"], reference(elastic["vit"], 0.0, inputs), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(output_of(call, inputs), reference(elastic["vit"], 0.3, inputs), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("strict", [False, True])
def test_torch_export_of_a_switchable_model_still_works(strict, elastic, fresh_dynamo):
    inputs = NAMED["vit"].inputs(2)
    model = ElasticViTModel.from_pretrained(elastic["vit"], switchable=True, sparsity=0.3)
    exported = torch.export.export(model, (), inputs, strict=strict)
    torch.testing.assert_close(exported.module()(**inputs).last_hidden_state, reference(elastic["vit"], 0.3, inputs),
                               rtol=1e-5, atol=1e-4)
